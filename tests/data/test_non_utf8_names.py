"""File and class names that are not UTF-8 (Linux allows any bytes but "/" and NUL; Python holds
them as lone surrogates, b"bad\\xff.png" -> "bad\\udcff.png"): every file torchkit writes names
them by their own bytes (CSV, tables) or by a JSON escape ("\\udcff", valid UTF-8 JSON), the same
as stdout does, and every CSV torchkit reads (an index, split.csv, classes.txt) reads them back to
the same path, which opens the same file."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from checkpoints import write_convnet_checkpoint
from image_folders import write_image_folder
from output_checks import error_line
from processes import run_torchkit_in_process
from suite_paths import REPO

BAD_CLASS = os.fsdecode(b"bad\xffcls")  # a class folder whose name is not UTF-8
BAD_FILE = os.fsdecode(b"bad\xff.png")  # an image whose name is not UTF-8, in cat/
TINY = ["--model", "nets:TinyNet", "--image-size", "8", "--device", "cpu", "--seed", "0"]
MODEL = ["--device", "cpu"]
IN_PROCESS = ["-j", "0"]  # no worker processes: where they are not what a check is about


def ok(*args: object):
    done = run_torchkit_in_process(*args)
    assert done.returncode == 0, done.stderr
    return done


def csv_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV torchkit wrote; it holds the names' own bytes, not their escapes."""
    data = path.read_bytes()
    assert b"\xff" in data and b"\\udcff" not in data
    return list(csv.DictReader(io.StringIO(data.decode("utf-8", "surrogateescape"))))


def json_file(path: Path):
    """A JSON file torchkit wrote: valid UTF-8, the names as escapes."""
    text = path.read_bytes().decode("utf-8")  # strict: valid UTF-8
    assert "\\udcff" in text
    return json.loads(text)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """cat/ (with bad\\xff.png), dog/ and bad\\xffcls/: 3 tiny images each."""
    root = tmp_path_factory.mktemp("names") / "data"
    try:
        (root / BAD_CLASS).mkdir(parents=True)
    except OSError:
        pytest.skip("this file system refuses names that are not UTF-8")
    write_image_folder(root, {"cat": 3, "dog": 3, BAD_CLASS: 3})
    (root / "cat" / "cat_0.png").rename(root / "cat" / BAD_FILE)
    return root


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """A convnet checkpoint for 8x8 images of the classes `data` has (in label order)."""
    path = tmp_path_factory.mktemp("model") / "model.pt"
    write_convnet_checkpoint(path, in_channels=3, image_size=8, classes=[BAD_CLASS, "cat", "dog"])
    return path


@pytest.mark.parametrize("mode", ["manifest", "copy", "symlink"])
def test_split_writes_the_names_and_reads_them_back(data, tmp_path, mode):
    out = tmp_path / "split"
    ok("split", data, out, "--mode", mode, "--ratio", "0.5,0.5", "--format", "json")
    rows = csv_rows(out / "split.csv")
    assert {Path(row["source"]).name for row in rows} >= {BAD_FILE, f"{BAD_CLASS}_1.png"}
    assert {row["label"] for row in rows} == {"cat", "dog", BAD_CLASS}
    assert all((out / row["path"]).is_file() for row in rows)  # relative to OUT
    # --force reads the earlier split.csv to know what it may replace
    ok("split", data, out, "--mode", mode, "--ratio", "0.5,0.5", "--format", "json", "--force")
    assert csv_rows(out / "split.csv") == rows


def test_dataset_stats_output_files_hold_what_stdout_does(data, tmp_path, monkeypatch):
    # The names through the scan's worker processes once (default --workers); the other runs
    # read in this process (each pool forks the test process: a tenth of a second a worker).
    target = tmp_path / "stats.json"
    ok("dataset-stats", data, "-o", target)
    found = json_file(target)
    assert BAD_CLASS in [c["name"] for c in found["classes"]]
    # JSON is escaped on stdout too: the same bytes
    assert ok("dataset-stats", data, "--format", "json", *IN_PROCESS).stdout == target.read_text()
    ok("dataset-stats", data, "-o", tmp_path / "stats.csv", *IN_PROCESS)
    ok("dataset-stats", data, "-o", tmp_path / "stats.txt", *IN_PROCESS)
    assert b"bad\xffcls" in (tmp_path / "stats.txt").read_bytes()
    # CSV and tables carry the bytes on stdout whatever the locale: Python's stdout is strict
    # but in the C locale, and `main` (the program's entry point, not the app the in-process
    # runner calls, whose stdout cannot write such bytes) makes it write them. `main` runs here
    # as the program runs it, with a file's text stream as stdout: CSV under the C locale's
    # error handler, the table under a strict one (as PYTHONIOENCODING=utf-8 makes it).
    from torchkit.cli import main

    for fmt, errors, shown in (("csv", "surrogateescape", "shown.csv"),
                               ("table", "strict", "shown.txt")):  # fmt: skip
        with (
            monkeypatch.context() as patched,
            open(tmp_path / shown, "w", encoding="utf-8", errors=errors) as stdout,
        ):
            patched.setattr(sys, "stdout", stdout)
            patched.setattr(sys, "stderr", sys.stderr)  # main makes it best-effort: put back
            # argv[0] not "torchkit": main ends a process it runs as (os._exit), not a caller
            patched.setattr(sys, "argv", ["python -m torchkit", "dataset-stats", str(data),
                                          "--format", fmt, *IN_PROCESS])  # fmt: skip
            with pytest.raises(SystemExit) as ended:
                main()
            assert ended.value.code in (0, None)
    assert (tmp_path / "shown.csv").read_bytes() == (tmp_path / "stats.csv").read_bytes()
    assert (tmp_path / "shown.txt").read_bytes() == (tmp_path / "stats.txt").read_bytes()


def test_video_info_output_files_name_the_video(tmp_path):
    import cv2
    import numpy as np

    made = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(made), cv2.VideoWriter_fourcc(*"MJPG"), 10, (16, 16))
    for value in range(0, 200, 40):
        writer.write(np.full((16, 16, 3), value, np.uint8))
    writer.release()
    videos = tmp_path / "videos"
    videos.mkdir()
    clip = videos / os.fsdecode(b"clip\xff.avi")
    made.rename(clip)
    ok("video-info", videos, "-o", tmp_path / "info.json")
    assert json_file(tmp_path / "info.json")[0]["path"] == str(clip)
    ok("video-info", videos, "-o", tmp_path / "info.csv")
    assert [row["path"] for row in csv_rows(tmp_path / "info.csv")] == [str(clip)]


def test_convert_shards_keeps_a_class_name_that_is_not_utf8(data, tmp_path):
    out = tmp_path / "shards"
    ok("convert", "shards", data, out, *IN_PROCESS)
    assert b"bad\xffcls\n" in (out / "classes.txt").read_bytes()
    classes = json.loads(ok("dataset-stats", out, "--format", "json", *IN_PROCESS).stdout)[
        "classes"
    ]
    assert {c["name"]: c["images"] for c in classes} == {"cat": 3, "dog": 3, BAD_CLASS: 3}


def test_train_reads_class_weights_naming_such_classes_and_records_the_split_and_classes(
    data, tmp_path, monkeypatch
):
    weights = tmp_path / "weights.csv"  # --class-weights FILE reads such names too
    weights.write_bytes(b"bad\xffcls,2\ncat,1\ndog,1\n")
    run = tmp_path / "run"
    ok("train", "--data", data, *TINY, "--val-split", "0.34", "--epochs", "1", "--batch-size", 4,
       "--workers", 0, "--class-weights", weights, "--out", run, "-q",
       "--format", "json")  # fmt: skip
    rows = csv_rows(run / "split.csv")
    assert all((data / row["path"]).is_file() for row in rows)  # relative to the data root
    assert {row["label"] for row in rows} == {"cat", "dog", BAD_CLASS}
    assert json_file(run / "config.json")["classes"] == sorted(["cat", "dog", BAD_CLASS])


def test_predict_output_files_name_the_images_and_classes_of_a_class_name_file(
    data, model, tmp_path
):
    names = tmp_path / "classes.txt"  # --classes FILE (predict, eval) reads such names too
    names.write_bytes(b"bad\xffcls\ncat\ndog\n")  # what convert shards writes
    ok("predict", model, data, *MODEL, "--classes", names, "-o", tmp_path / "predictions.csv")
    rows = csv_rows(tmp_path / "predictions.csv")
    assert {row["class"] for row in rows} <= {"cat", "dog", BAD_CLASS}
    paths = [row["path"] for row in rows]
    assert BAD_FILE in {Path(p).name for p in paths}
    assert all((data / p).is_file() for p in paths)
    ok("predict", model, data, *MODEL, *IN_PROCESS, "-o", tmp_path / "predictions.txt")
    assert b"bad\xff.png" in (tmp_path / "predictions.txt").read_bytes()
    ok("predict", model, data, *MODEL, *IN_PROCESS, "-o", tmp_path / "predictions.json")
    found = json.loads((tmp_path / "predictions.json").read_bytes())
    assert [row["path"] for row in found] == paths


def test_eval_reports_and_features_name_the_class_and_files(data, model, tmp_path):
    ok("eval", model, "--data", data, *MODEL, "--workers", 0, "--out", tmp_path / "ev",
       "--format", "json")  # fmt: skip
    per_class = csv_rows(tmp_path / "ev" / "per_class.csv")
    assert BAD_CLASS in [row["label"] for row in per_class]
    assert (tmp_path / "ev" / "confusion_matrix.png").is_file()  # the name drawn as U+FFFD
    features = tmp_path / "features"
    ok("extract-features", model, data, features, *MODEL, *IN_PROCESS)
    paths = [row["path"] for row in csv_rows(features / "index.csv")]
    assert len(paths) == 9 and all((data / p).is_file() for p in paths)


def test_a_csv_index_with_such_names_is_read_by_eval_and_predict(data, model, tmp_path):
    index = tmp_path / "index.csv"  # as split and train write one: the names' own bytes
    images = sorted(path for path in data.rglob("*.png"))
    lines = [b"%s,%s" % (os.fsencode(path), os.fsencode(path.parent.name)) for path in images]
    index.write_bytes(b"path,label\n" + b"\n".join(lines) + b"\n")
    evaluated = json.loads(ok("eval", model, "--data", index, *MODEL, "--workers", 0,
                              "--format", "json").stdout)  # fmt: skip
    assert evaluated["num_images"] == 9
    ok("predict", model, index, *MODEL, *IN_PROCESS, "-o", tmp_path / "predictions.csv")
    paths = [row["path"] for row in csv_rows(tmp_path / "predictions.csv")]
    assert sorted(paths) == sorted(row["path"] for row in csv_rows(index))
    # Bytes that are not UTF-8 in a row whose path names no file with them: text in another
    # encoding (Latin-1 from Excel), refused as before
    latin1 = tmp_path / "latin1.csv"
    latin1.write_bytes(f"path,label\n{data}/dog/dog_0.png,caf\xe9\n".encode("latin-1"))
    done = run_torchkit_in_process("dataset-stats", latin1)
    assert done.returncode == 1 and "is not UTF-8 text" in done.stderr
    assert error_line(done.stderr) == (
        f"Error: {latin1} is not UTF-8 text (save it as CSV UTF-8, with or without BOM)"
    )


def test_convert_tensor_writes_a_16_bit_image_to_such_a_name(tmp_path):
    """16-bit colour images are encoded by OpenCV, which crashed the process (SIGSEGV) when
    given a file name that is not UTF-8 (a process of its own: the old code took the
    interpreter down). numpy and OpenCV only, no torch: the core function, not the CLI."""
    import numpy as np

    pixels = (np.arange(48, dtype=np.uint16) * 1300).reshape(4, 4, 3)
    np.save(tmp_path / "src.npy", pixels)
    target = tmp_path / os.fsdecode(b"out\xff.png")
    script = (
        "import sys\n"
        "from torchkit.core.convert.tensor import convert_tensor\n"
        "convert_tensor(sys.argv[1], sys.argv[2])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "src.npy"), str(target)],
        capture_output=True,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    import cv2

    written = cv2.imdecode(np.fromfile(target, np.uint8), cv2.IMREAD_UNCHANGED)
    assert np.array_equal(written[..., ::-1], pixels)
