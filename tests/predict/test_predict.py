"""`torchkit predict`: rows in input order for folders, files, CSVs and stdin; the classes eval
predicts; unreadable images; formats; outputs checked and written atomically; torchrun."""

from __future__ import annotations

import csv
import io
import json
import multiprocessing
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from checkpoints import add_ema_weights, ema_refusals
from disks import fill_disk
from eval_plots import lay_out_eval_plots_only
from gloo_ranks import forks_noted, run_ranks, stderr_of, watching_forks
from output_checks import error_line
from PIL import Image
from processes import (
    PipeLines,
    run_torchkit_in_process,
    start_torchkit_process,
    working_directory,
)

from torchkit.cli import app
from torchkit.core.data.preprocessing import Preprocess
from torchkit.core.data.transforms import eval_transform
from torchkit.core.inference.options import InferenceOptions
from torchkit.core.models import model_from_checkpoint
from torchkit.core.models.checkpoint import FORMAT_VERSION, load_checkpoint, save_checkpoint
from torchkit.core.models.convnet import convnet_class

CLASSES = ["cat", "dog", "fox"]
PREPROCESS = Preprocess(image_size=12, resize_size=12, mean=(0.5,) * 3, std=(0.25,) * 3)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("predict")
    torch.manual_seed(0)
    model = convnet_class()(3, 3, 12).eval()
    ckpt = root / "model.pt"
    save_checkpoint(
        {
            "format_version": FORMAT_VERSION,
            "arch": "convnet",
            "num_classes": 3,
            "classes": CLASSES,
            "model": model.state_dict(),
            "preprocess": PREPROCESS.to_dict(),
        },
        ckpt,
    )
    rng = np.random.default_rng(0)
    flat = root / "flat"
    (flat / "sub").mkdir(parents=True)
    names = ["b.png", "a.png", "sub/c.png", "d.png", "e.png", "f.png", "g.png"]
    for name in names:
        Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)).save(flat / name)
    labelled = root / "labelled"
    for split in ("train", "test"):
        for name in CLASSES:
            (labelled / split / name).mkdir(parents=True)
            for i in range(2):
                pixels = rng.integers(0, 256, (14, 14, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(labelled / split / name / f"{i}.png")
    return {"root": root, "ckpt": ckpt, "flat": flat, "labelled": labelled, "model": model}


def invoke(runner, *args, input: str | bytes | None = None):
    # On the CPU, as the hand-written references compute (a later --device wins).
    return runner.invoke(app, ["predict", "--device", "cpu", *map(str, args)], input=input)


def read_csv(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def reference(model, paths: list[Path]) -> torch.Tensor:
    """The logits of a hand-written loop: Preprocess -> transform -> model."""
    transform = eval_transform(PREPROCESS)
    x = torch.stack([transform(Image.open(p).convert("RGB")) for p in paths])
    with torch.no_grad():
        return model(x)


def test_a_flat_folder_gives_one_row_per_image_with_the_models_classes(runner, world):
    result = invoke(runner, world["ckpt"], world["flat"], "--format", "csv", "-j", "0", "-k", "2")
    assert result.exit_code == 0, result.stderr
    rows = read_csv(result.stdout)
    assert list(rows[0]) == [
        "path", "label", "class", "class_index", "probability",
        "class_1", "probability_1", "class_2", "probability_2", "error",
    ]  # fmt: skip
    paths = [row["path"] for row in rows]
    assert paths == ["a.png", "b.png", "d.png", "e.png", "f.png", "g.png", "sub/c.png"]
    logits = reference(world["model"], [world["flat"] / p for p in paths])
    probs = logits.softmax(1)
    for row, expected, p in zip(rows, logits.argmax(1).tolist(), probs, strict=True):
        assert int(row["class_index"]) == expected and row["class"] == CLASSES[expected]
        assert row["label"] == ""  # a flat folder: the true class is not known
        assert float(row["probability"]) == pytest.approx(float(p.max()), abs=1e-6)
        second = int(p.argsort(descending=True)[1])
        assert row["class_2"] == CLASSES[second]
        assert float(row["probability_2"]) == pytest.approx(float(p[second]), abs=1e-6)
        assert row["error"] == ""
    assert "predicted 7 of 7 images" in result.stderr


def test_stdin_paths_keep_their_order_and_a_missing_one_is_an_error_row(runner, world):
    order = ["sub/c.png", "a.png", "gone.png", "b.png"]
    lines = "".join(f"{world['flat'] / p}\n" for p in order)
    result = invoke(runner, world["ckpt"], "-", "--format", "jsonl", "-j", "0", input=lines)
    assert result.exit_code == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [row["path"] for row in rows] == [str(world["flat"] / p) for p in order]
    assert rows[2]["class"] is None and rows[2]["probability"] is None
    assert rows[2]["error"] == "file not found"
    good = [row for row in rows if row["error"] is None]
    assert all(
        isinstance(r["probability"], float) and isinstance(r["class_index"], int) for r in good
    )
    assert "1 unreadable image(s)" in result.stderr


def test_stdin_rows_come_out_while_the_list_is_still_being_written(world):
    """`find ... | predict m.pt -` read the whole list before the first row: a row per path
    as it comes, with a loader worker forked before most paths were read."""
    flat = world["flat"]
    process = start_torchkit_process(
        "predict", "--device", "cpu", str(world["ckpt"]), "-", "--format", "csv", "-j", "1",
        stdin=subprocess.PIPE,
    )  # fmt: skip
    try:
        rows = PipeLines(process.stdout)
        for at, name in enumerate(["b.png", "gone.png"]):
            process.stdin.write(f"{flat / name}\n")
            process.stdin.flush()
            if at == 0:
                assert rows.next().startswith("path,")
            assert str(flat / name) in rows.next()  # its row, the list still open
        process.stdin.write(f"{flat / 'a.png'}\n")
        process.stdin.close()
        assert process.wait(timeout=60) == 0, process.stderr.read()
    finally:
        process.kill()
    last = rows.rest()
    assert len(last) == 1 and str(flat / "a.png") in last[0]
    assert "predicted 2 of 3 images" in process.stderr.read()


def test_stdin_json_rows_are_whole_lines_as_their_batch_is_done(world):
    """`find ... | predict m.pt - --format json`: a row's line ended only with the `,` written
    before the next batch's first row, so a reader of the lines got each row a batch late.
    Each row is now a line of its own as its batch is done (the comma that parts it from the
    row before at its start), and the whole is one JSON list."""
    flat = world["flat"]
    process = start_torchkit_process(
        "predict", "--device", "cpu", str(world["ckpt"]), "-", "--format", "json", "-j", "0",
        stdin=subprocess.PIPE,
    )  # fmt: skip
    try:
        lines = PipeLines(process.stdout)
        process.stdin.write(f"{flat / 'b.png'}\n")
        process.stdin.flush()
        assert lines.next() == "[\n"
        first = lines.next()  # the list on stdin still open
        assert json.loads(first)["path"] == str(flat / "b.png")
        process.stdin.write(f"{flat / 'a.png'}\n")
        process.stdin.flush()
        second = lines.next()
        assert second.startswith(",") and json.loads(second[1:])["path"] == str(flat / "a.png")
        process.stdin.close()
        assert process.wait(timeout=60) == 0, process.stderr.read()
    finally:
        process.kill()
    rows = json.loads("".join(["[\n", first, second, *lines.rest()]))
    assert [row["path"] for row in rows] == [str(flat / "b.png"), str(flat / "a.png")]


def test_stdin_lists_with_a_bom_crlf_and_names_that_are_not_utf8_name_their_files(
    runner, world, tmp_path
):
    """A list saved as "UTF-8 with BOM" lost its first image (an error row) and a file name that
    is not UTF-8 stopped the command under a strict UTF-8 locale (UnicodeDecodeError)."""
    odd = os.fsdecode(bytes(tmp_path) + b"/bad\xff.png")
    shutil.copy(world["flat"] / "b.png", odd)
    first = bytes(world["flat"] / "a.png")
    listed = b"\xef\xbb\xbf" + first + b"\r\n" + os.fsencode(odd) + b"\n"
    result = invoke(runner, world["ckpt"], "-", "--format", "jsonl", "-j", "0", input=listed)
    assert result.exit_code == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [row["path"] for row in rows] == [str(world["flat"] / "a.png"), odd]
    assert [row["error"] for row in rows] == [None, None]


def test_a_nul_separated_list_names_any_file_exactly(runner, world, tmp_path):
    """`find -print0 | predict m.pt - --null`: a name ending in a carriage return (lost with
    the line end), holding a line break or spaces around it is one path as piped (without
    --null, `\r\n` ends a line of a list saved on Windows: the test above)."""
    from torchkit.core.io.path_lists import NulSeparated, PathStream

    names = ["cr\r", "line\nbreak.png", " spaced .png", " "]
    for name in names:
        shutil.copy(world["flat"] / "a.png", tmp_path / name)
    piped = b"".join(bytes(tmp_path / name) + b"\0" for name in names)
    result = invoke(
        runner, world["ckpt"], "-", "--null", "--format", "json", "-j", "0", input=piped
    )
    assert result.exit_code == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [row["path"] for row in rows] == [str(tmp_path / name) for name in names]
    assert [row["error"] for row in rows] == [None] * 4
    # with other IMAGES the list is read first, then handed on as it is
    both = invoke(runner, world["ckpt"], "-", world["flat"] / "sub", "--null", "--format", "json",
                  "-j", "0", input=piped)  # fmt: skip
    assert [row["path"] for row in json.loads(both.stdout)][:4] == [row["path"] for row in rows]
    read, write = os.pipe()  # a pipe, read as its bytes come (the last NUL may be left out)
    os.write(write, piped[:-1])
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        stream = PathStream(NulSeparated(pipe), "image")
        assert stream.take(10) == [str(tmp_path / name) for name in names]
    refused = invoke(runner, world["ckpt"], world["flat"], "--null")
    assert refused.exit_code == 2 and "--null applies to the paths piped for -" in refused.stderr


def test_a_nul_separated_list_without_null_is_a_usage_error(runner, world):
    """`find -print0 | predict m.pt -` without --null: the whole list was one path, one
    unreadable row ("embedded null byte") and exit 0. Refused at once from a pipe too, not
    after the whole list is held as one growing line."""
    from torchkit.core.io.errors import UsageError
    from torchkit.core.io.path_lists import PathStream

    piped = b"".join(bytes(world["flat"] / name) + b"\0" for name in ("a.png", "b.png"))
    result = invoke(runner, world["ckpt"], "-", "--format", "csv", "-j", "0", input=piped)
    assert result.exit_code == 2, result.stderr
    assert "separated by NUL bytes" in error_line(result.stderr) and "--null" in result.stderr
    assert result.stdout == ""
    read, write = os.pipe()  # the list has not ended: the first NUL is enough
    os.set_blocking(read, False)  # waiting for its end would fail, not hang
    try:
        os.write(write, piped)
        with os.fdopen(read, "rb") as pipe, pytest.raises(UsageError, match="--null"):
            PathStream(pipe, "image")
    finally:
        os.close(write)


def test_a_line_separated_list_with_null_is_a_usage_error(runner, world):
    """`find | predict m.pt - --null`: the whole list, line breaks and all, was one path, one
    unreadable row on stdout and 'none of the 1 images could be read'. Refused before any row,
    as the opposite slip is; a NUL-separated list (a name may hold a line break) still reads."""
    from torchkit.core.io.errors import UsageError
    from torchkit.core.io.path_lists import NulSeparated, PathStream

    listed = "".join(f"{world['flat'] / name}\n" for name in ("a.png", "b.png"))
    result = invoke(runner, world["ckpt"], "-", "--null", "--format", "csv", "-j", "0",
                    input=listed)  # fmt: skip
    assert result.exit_code == 2, result.stderr
    line = error_line(result.stderr)
    assert "separated by line breaks, not NUL bytes" in line and "drop --null" in line
    assert result.stdout == ""
    read, write = os.pipe()  # from a pipe: refused at the list's end, before any path is taken
    os.write(write, listed.encode())
    os.close(write)
    with os.fdopen(read, "rb") as pipe, pytest.raises(UsageError, match="drop --null"):
        PathStream(NulSeparated(pipe), "image")


def test_files_and_folders_together_name_every_image_unambiguously(runner, world):
    flat = world["flat"]
    result = invoke(
        runner, world["ckpt"], flat / "a.png", flat / "sub", "--format", "json", "-j", "0"
    )
    assert result.exit_code == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [row["path"] for row in rows] == [str(flat / "a.png"), str(flat / "sub" / "c.png")]


def test_predictions_are_evals_predicted_classes(runner, world, tmp_path, monkeypatch):
    lay_out_eval_plots_only(monkeypatch)  # the PNGs' pictures are not this test's (eval_plots)
    data = world["labelled"]
    report = tmp_path / "report"
    evaluated = runner.invoke(
        app,
        ["eval", str(world["ckpt"]), "--data", str(data), "--out", str(report), "-j", "0"]
        + ["--device", "cpu"],  # as invoke's predict: the same classes, to the last near-tie
    )
    assert evaluated.exit_code == 0, evaluated.stderr
    with open(report / "predictions.csv", newline="") as handle:
        expected = {row["path"]: row["class"] for row in csv.DictReader(handle)}
    common = ("--split", "test", "--format", "csv", "-j", "0")
    for tta in ("none", "flip"):
        result = (
            invoke(runner, world["ckpt"], data, *common, "--tta", "flip")
            if tta == "flip"
            else invoke(runner, world["ckpt"], data, *common)
        )
        assert result.exit_code == 0, result.stderr
        rows = read_csv(result.stdout)
        assert {row["split"] for row in rows} == {"test"} and len(rows) == 6
        if tta == "none":
            got = {row["path"]: row["class"] for row in rows}
            assert {Path(p).as_posix().split("test/", 1)[-1] for p in got} == {
                Path(p).as_posix().split("test/", 1)[-1] for p in expected
            }
            by_name = {p.split("test/", 1)[-1]: c for p, c in got.items()}
            assert all(by_name[p.split("test/", 1)[-1]] == c for p, c in expected.items())


def test_tied_logits_predict_the_first_class_whatever_the_topk(runner, world, tmp_path):
    # torch's topk orders equal scores differently for another k (on CPU: class 8 first with
    # k=1, class 5 with k=6): the predicted class changed with --topk.
    from checkpoints import write_tied_convnet_checkpoint

    ckpt = tmp_path / "tied.pt"
    write_tied_convnet_checkpoint(ckpt, image_size=8, classes="abcdefghij")
    image = world["flat"] / "a.png"
    for k in ("1", "6"):
        result = invoke(runner, ckpt, image, "--format", "csv", "-k", k, "-j", "0")
        assert result.exit_code == 0, result.stderr
        row = read_csv(result.stdout)[0]
        assert (row["class"], row["class_index"]) == ("a", "0")  # logits.argmax()
        if k == "6":
            assert [row[f"class_{rank}"] for rank in range(1, 7)] == list("abcdef")


def test_split_data_predicts_every_split_with_a_split_column(runner, world):
    result = invoke(runner, world["ckpt"], world["labelled"], "--format", "csv", "-j", "0")
    assert result.exit_code == 0, result.stderr
    rows = read_csv(result.stdout)
    assert [row["split"] for row in rows] == ["train"] * 6 + ["test"] * 6
    assert rows[0]["path"].startswith("train/")


def test_several_labelled_inputs_keep_each_images_label(runner, world, tmp_path):
    """With two labelled inputs (a split root and a CSV index) the `label` column was empty,
    where one labelled input fills it; an image file given beside them has no label."""
    index = tmp_path / "index.csv"
    flat = world["flat"]
    index.write_text(f"path,label\n{flat / 'a.png'},zebra\n{flat / 'b.png'},{CLASSES[1]}\n")
    result = invoke(
        runner, world["ckpt"], world["labelled"], index, flat / "d.png", "--format", "csv",
        "-j", "0",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    rows = read_csv(result.stdout)
    labels = [row["label"] for row in rows]
    assert labels == [name for name in CLASSES for _ in range(2)] * 2 + ["zebra", CLASSES[1], ""]


def test_split_where_there_is_none_is_a_usage_error(runner, world):
    result = invoke(runner, world["ckpt"], world["flat"], "--split", "val")
    assert result.exit_code == 2 and result.stderr.startswith("Error: ")
    assert "Traceback" not in result.stderr
    files = invoke(runner, world["ckpt"], world["flat"] / "a.png", "--split", "val")
    assert files.exit_code == 2 and "image files, which have no splits" in files.stderr


def test_unreadable_images_error_rows_skip_errors_and_strict(runner, world, tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    Image.new("RGB", (12, 12)).save(folder / "good.png")
    (folder / "broken.png").write_bytes(b"not a png")
    # -j 0 where the worker is not the subject: only --strict's run (-j 1) checks it ends
    rows = read_csv(invoke(runner, world["ckpt"], folder, "--format", "csv", "-j", "0").stdout)
    assert [(r["path"], r["class"] == "", r["error"] != "") for r in rows] == [
        ("broken.png", True, True),
        ("good.png", False, False),
    ]
    skipped = invoke(runner, world["ckpt"], folder, "--format", "csv", "--skip-errors", "-j", "0")
    assert [r["path"] for r in read_csv(skipped.stdout)] == ["good.png"]
    assert "left out (--skip-errors)" in skipped.stderr
    out = tmp_path / "p.csv"
    strict = invoke(
        runner, world["ckpt"], folder, "--strict", "-o", out, "--format", "csv", "-j", "1"
    )
    assert strict.exit_code == 1
    assert multiprocessing.active_children() == []  # the DataLoader worker is gone
    assert strict.stderr.startswith("Error: unreadable image") and "broken.png" in strict.stderr
    assert not out.exists() and not list(tmp_path.glob(".p.csv*"))  # nothing half-written


def test_logits_are_the_raw_outputs(runner, world):
    result = invoke(runner, world["ckpt"], world["flat"], "--logits", "--format", "json", "-j", "0")
    rows = json.loads(result.stdout)
    logits = reference(world["model"], [world["flat"] / row["path"] for row in rows])
    got = torch.tensor([[row[f"logit_{i}"] for i in range(3)] for row in rows])
    torch.testing.assert_close(got, logits, rtol=0, atol=1e-5)


def test_output_file_rules(runner, world, tmp_path):
    out = tmp_path / "predictions.csv"
    out.write_text("mine\n")
    refused = invoke(runner, world["ckpt"], world["flat"], "-o", out)
    assert refused.exit_code == 1 and "already exists" in refused.stderr
    assert out.read_text() == "mine\n"
    inside = invoke(runner, world["ckpt"], world["flat"], "-o", world["flat"] / "p.csv")
    assert inside.exit_code == 1 and "inside" in inside.stderr
    assert not (world["flat"] / "p.csv").exists()
    written = invoke(
        runner, world["ckpt"], world["flat"], "-o", out, "--force", "--format", "csv", "-j", "0"
    )
    assert written.exit_code == 0, written.stderr
    assert len(read_csv(out.read_text())) == 7


def test_force_on_a_full_disk_leaves_the_earlier_predictions(runner, world, small_tmpfs):
    """`-o FILE --force` is predict's only output: on a full disk the rows are written aside
    and never renamed over the earlier file, which is as it was, with nothing beside it."""
    disk = small_tmpfs(64)
    out = disk / "predictions.csv"
    out.write_text("path,class\nold.png,cat\n")
    fill_disk(disk)
    done = invoke(
        runner, world["ckpt"], world["flat"], "-o", out, "--force", "--format", "csv", "-j", "0"
    )
    assert done.exit_code == 1, done.stderr
    line = error_line(done.stderr)
    assert line.startswith(f"Error: cannot write {out}: No space left on device"), line
    assert out.read_text() == "path,class\nold.png,cat\n"
    assert sorted(os.listdir(disk)) == ["filler", "predictions.csv"]


def test_output_file_may_not_be_an_image_listed_on_stdin_but_may_lie_beside_them(
    runner, world, tmp_path
):
    # The images piped for `-` are inputs as much as those on the command line: -o --force
    # replaced a listed image with the predictions. A file beside them was refused too (`ls
    # *.png | predict m.pt - -o p.csv`), where `predict m.pt *.png -o p.csv` was not.
    photos = tmp_path / "photos"
    photos.mkdir()
    image = photos / "a.png"
    image.write_bytes((world["flat"] / "a.png").read_bytes())
    before = image.read_bytes()
    (photos / "link.png").symlink_to("a.png")
    os.link(image, photos / "hard.png")
    for others in ([], [world["flat"] / "b.png"]):  # read as piped; read whole first
        out = photos / "p.csv"
        beside = invoke(
            runner, world["ckpt"], "-", *others, "-o", out, "-j", "0", input=f"{image}\n"
        )
        assert beside.exit_code == 0, beside.stderr
        assert [row["path"] for row in read_csv(out.read_text())][0] == str(image)
        out.unlink()
        for target in ("a.png", "link.png", "hard.png"):
            refused = invoke(
                runner, world["ckpt"], "-", *others, "-o", image, "--force", "-j", "0",
                input=f"{photos / target}\n",
            )  # fmt: skip
            assert refused.exit_code == 1, refused.stderr
            line = error_line(refused.stderr)
            assert line == (
                f"Error: output {image} is the image listed on stdin {photos / target} "
                "(choose another output)"
            ), line
        assert image.read_bytes() == before
    assert sorted(p.name for p in photos.iterdir()) == ["a.png", "hard.png", "link.png"]


def test_the_output_listed_late_stops_the_run_before_it_is_written(runner, world, tmp_path):
    # The list on stdin is read as it comes: the images listed after the first batch are
    # checked against -o as they come, before the file is put in place.
    photos = tmp_path / "photos"
    photos.mkdir()
    out = photos / "p.csv"
    out.write_text("mine\n")
    (photos / "p.png").symlink_to("p.csv")
    listed = "".join(f"{path}\n" for path in (world["flat"] / "a.png", world["flat"] / "b.png"))
    listed += f"{photos / 'p.png'}\n"
    refused = invoke(
        runner, world["ckpt"], "-", "-o", out, "--force", "-b", "1", "-j", "0", input=listed
    )
    assert refused.exit_code == 1, refused.stderr
    assert "is the image listed on stdin" in error_line(refused.stderr)
    assert out.read_text() == "mine\n"
    assert sorted(p.name for p in photos.iterdir()) == ["p.csv", "p.png"]


def test_a_model_name_with_weights_and_classes(runner, world, tmp_path):
    weights = tmp_path / "sd.pt"
    torch.save(load_checkpoint(world["ckpt"])["model"], weights)
    result = invoke(
        runner, "convnet", world["flat"] / "a.png", "--weights", weights, "--classes",
        "x,y,z", "--image-size", 12, "--resize-size", 12, "--mean", "0.5", "--std", "0.25",
        "--format", "json", "-j", "0",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    row = json.loads(result.stdout)[0]
    expected = int(reference(world["model"], [world["flat"] / "a.png"]).argmax())
    assert row["class"] == "xyz"[expected] and row["class_index"] == expected
    model = model_from_checkpoint(load_checkpoint(world["ckpt"]))
    assert sum(p.numel() for p in model.parameters()) > 0


def test_topk_in_json_says_which_of_two_classes_of_one_name_ranked(runner, world, tmp_path):
    """--classes x,x,z: JSON's class_index_K tells the two x apart, as CSV's `x (#0)` does."""
    weights = tmp_path / "sd.pt"
    torch.save(load_checkpoint(world["ckpt"])["model"], weights)
    args = ["convnet", world["flat"] / "a.png", "--weights", weights, "--classes", "x,x,z"]
    args += ["--image-size", 12, "--topk", 3, "-j", "0"]
    as_json = invoke(runner, *args, "--format", "json")
    as_csv = invoke(runner, *args, "--format", "csv")
    assert as_json.exit_code == 0 and as_csv.exit_code == 0, as_json.stderr
    row, shown = json.loads(as_json.stdout)[0], read_csv(as_csv.stdout)[0]
    ranked = [row[f"class_index_{rank}"] for rank in (1, 2, 3)]
    assert sorted(ranked) == [0, 1, 2] and ranked[0] == row["class_index"]
    for rank, index in enumerate(ranked, 1):
        assert row[f"class_{rank}"] == "xxz"[index]
        assert shown[f"class_{rank}"] == ("z" if index == 2 else f"x (#{index})")
    assert not any(key.startswith("class_index_") for key in shown)


def test_a_repeated_name_in_a_long_classes_file_is_read_at_once(tmp_path):
    # Each name was counted over the whole list (quadratic: minutes at 100,000 names); a name
    # given twice exactly names two outputs, as ImageNet's two "crane"s do.
    import time

    from torchkit.core.evaluate.source import parse_class_names

    names = tmp_path / "classes.txt"
    names.write_text("".join(f"class{i}\n" for i in range(50_000)) + "class7\n")
    start = time.process_time()  # CPU time: other processes' load does not stretch it
    read = parse_class_names(str(names))
    assert time.process_time() - start < 5  # about 0.1 s
    assert len(read) == 50_001 and read[7] == read[-1] == "class7"


def test_classes_longer_than_a_file_name_are_a_list_of_names(runner, world, tmp_path):
    # Over 255 characters (1,000 ImageNet names are about 10,000): no file can have that name,
    # and asking whether it is one is an OSError (ENAMETOOLONG), not "no".
    weights = tmp_path / "sd.pt"
    torch.save(load_checkpoint(world["ckpt"])["model"], weights)
    result = invoke(
        runner, "convnet", world["flat"] / "a.png", "--weights", weights, "--classes",
        "x" * 300 + ",y,z", "--image-size", 12, "--format", "json", "-j", "0",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)[0]["class"] in ("x" * 300, "y", "z")


def test_classes_from_a_pipe_are_read_as_a_file():
    # `--classes <(cut -d, -f1 names.csv)` passes /dev/fd/N, a pipe: it was one class named
    # "/dev/fd/63" ("1 classes asked for, but the checkpoint has 2 outputs").
    from torchkit.core.evaluate.source import parse_class_names

    read, write = os.pipe()
    os.write(write, b"x\ny\n")
    os.close(write)
    try:
        assert parse_class_names(f"/dev/fd/{read}") == ["x", "y"]
    finally:
        os.close(read)


def test_a_classes_path_that_cannot_be_read_is_one_error_line(runner, world, tmp_path):
    # A socket (or a file without read permission): was "Error: OSError: [Errno 6] ...".
    import socket

    # bound by a relative name: an absolute one may pass the 108 bytes a socket's may have
    with working_directory(tmp_path), socket.socket(socket.AF_UNIX) as server:
        server.bind("classes.sock")
        args = [world["ckpt"], world["flat"], "--classes", "classes.sock", "-j", "0"]
        result = invoke(runner, *args)
    assert result.exit_code == 1
    assert error_line(result.stderr) == (
        "Error: cannot read --classes file classes.sock: No such device or address (give a "
        "text file with one class name per line, or names like a,b,c)"
    )


@pytest.mark.parametrize("spec", ["clases.txt", "names/classes"])
def test_a_classes_file_that_is_not_there_is_said_so(runner, world, spec):
    # It was one class named after the file ("1 classes asked for, but ... has 3 outputs").
    result = invoke(runner, world["ckpt"], world["flat"], "--classes", spec, "-j", "0")
    assert result.exit_code == 1
    assert error_line(result.stderr) == (
        f"Error: --classes file not found: {spec} (check the path, or give the class names "
        "themselves, like a,b,c)"
    )


def test_ema_predicts_with_the_checkpoints_ema_weights(runner, world, tmp_path):
    torch.manual_seed(1)
    ema_model = convnet_class()(3, 3, 12).eval()
    ckpt = tmp_path / "ema.pt"
    shutil.copyfile(world["ckpt"], ckpt)
    add_ema_weights(ckpt, ema_model)
    args = [world["flat"], "--logits", "--format", "json", "-j", "0"]
    result = invoke(runner, ckpt, *args, "--ema")
    assert result.exit_code == 0, result.stderr
    rows = json.loads(result.stdout)
    paths = [world["flat"] / row["path"] for row in rows]
    logits = torch.tensor([[row[f"logit_{i}"] for i in range(3)] for row in rows])
    torch.testing.assert_close(logits, reference(ema_model, paths), rtol=0, atol=1e-5)
    probabilities = reference(ema_model, paths).softmax(1).max(1).values
    got = torch.tensor([row["probability"] for row in rows])
    torch.testing.assert_close(got, probabilities, rtol=0, atol=1e-6)
    plain = json.loads(invoke(runner, ckpt, *args).stdout)  # the model's own weights
    assert [row["probability"] for row in plain] != [row["probability"] for row in rows]
    raw = torch.tensor([[row[f"logit_{i}"] for i in range(3)] for row in plain])
    torch.testing.assert_close(raw, reference(world["model"], paths), rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "case", ["no EMA weights", "a model name", "a state dict", "an exported file"]
)
def test_ema_refuses_what_eval_refuses_with_evals_error(runner, world, tmp_path, case):
    model = ema_refusals(tmp_path, world["ckpt"])[case]
    result = invoke(runner, *model, world["flat"], "--ema")
    evaluated = runner.invoke(app, ["eval", *model, "--data", str(world["labelled"]), "--ema"])
    assert result.exit_code == evaluated.exit_code == (1 if case == "no EMA weights" else 2)
    assert error_line(result.stderr) == error_line(evaluated.stderr)
    assert "--ema" in error_line(result.stderr) and result.stdout == ""


def test_two_ddp_processes_give_the_same_rows(world, runner, tmp_path):
    # A folder and `-`: torchrun's ranks share one stdin, which only one of them could read
    # (the others stopped with "no image paths on stdin"); rank 0 reads it for all, through
    # the process group, whose threads start after each rank's loader worker is forked.
    listed = "".join(f"{world['flat'] / name}\n" for name in ("g.png", "a.png", "gone.png"))
    single = invoke(
        runner, world["ckpt"], world["flat"], "-", "--format", "csv", "-b", "2", "-j", "0",
        input=listed,
    )  # fmt: skip
    read, write = os.pipe()
    os.write(write, listed.encode())
    os.close(write)
    try:
        ranks = run_ranks(
            "predict", world["ckpt"], world["flat"], "-", "--format", "csv", "--batch-size", "2",
            "--workers", "1", "-o", tmp_path / "ddp.csv", "--device", "cpu", timeout=300,
            stdin=read, env=watching_forks(tmp_path / "watch"),
        )  # fmt: skip
    finally:
        os.close(read)
    assert [done.returncode for done in ranks] == [0, 0], stderr_of(ranks)
    for rank in (0, 1):  # its worker, forked with the main thread alone (Linux: /proc)
        forks = forks_noted(tmp_path / "watch", rank)
        assert len(forks) == (1 if os.path.isdir("/proc/self/task") else 0), forks
        assert all(len(threads) == 1 for threads in forks), forks
    assert ranks[1].stdout == ""  # rank 0 writes the rows
    ddp = read_csv((tmp_path / "ddp.csv").read_text())
    expected = read_csv(single.stdout)
    assert len(ddp) == 10  # 7 images in the folder, 3 listed: batches of 2 on 2 ranks
    assert [r["path"] for r in ddp] == [r["path"] for r in expected]
    assert [r["class"] for r in ddp] == [r["class"] for r in expected]
    for got, want in zip(ddp, expected, strict=True):
        if want["error"]:  # gone.png
            assert got["error"] == want["error"] and got["probability"] == ""
            continue
        assert float(got["probability"]) == pytest.approx(float(want["probability"]), abs=1e-6)


@pytest.fixture(scope="module")
def exported(world, tmp_path_factory) -> dict[str, Path]:
    """`world`'s checkpoint exported (and verified) once to each of ONNX and TorchScript, for
    the tests that only read the files: {suffix: path}."""
    folder = tmp_path_factory.mktemp("exported")
    files = {suffix: folder / f"model{suffix}" for suffix in (".onnx", ".ts")}
    for path in files.values():
        made = run_torchkit_in_process("export", world["ckpt"], path)
        assert made.returncode == 0, made.stderr
    return files


@pytest.mark.parametrize("suffix", [".onnx", ".ts"])
def test_an_exported_model_predicts_the_same_classes(runner, world, exported, suffix):
    expected = invoke(runner, world["ckpt"], world["flat"], "--format", "csv", "-j", "0")
    expected = read_csv(expected.stdout)
    args = [exported[suffix], world["flat"], "--format", "csv", "-j", "0"]
    if suffix == ".ts":  # TorchScript runs code from the file: trusted only
        refused = invoke(runner, *args)
        assert refused.exit_code == 1 and "--trust-checkpoint" in refused.stderr
        args.append("--trust-checkpoint")
    result = invoke(runner, *args)
    assert result.exit_code == 0, result.stderr
    rows = read_csv(result.stdout)
    assert [r["path"] for r in rows] == [r["path"] for r in expected]
    assert [r["class"] for r in rows] == [r["class"] for r in expected]  # classes from the file
    for got, want in zip(rows, expected, strict=True):
        assert float(got["probability"]) == pytest.approx(float(want["probability"]), abs=1e-4)


def test_amp_or_channels_last_on_an_onnx_model_is_refused_not_recorded_as_applied(
    runner, world, exported
):
    """onnxruntime runs outside torch's autocast: eval --amp recorded amp: true, bf16 while its
    numbers were the float32 run's; and it takes plain arrays: --channels-last was silently
    ignored. TorchScript runs under autocast, as a torch module, and keeps both."""
    onnx_file, script = exported[".onnx"], exported[".ts"]
    for option in ("--amp", "--channels-last"):
        for command, data in (
            ("predict", [str(world["flat"])]),
            ("eval", ["--data", str(world["labelled"]), "--split", "test"]),
        ):
            args = [command, str(onnx_file), *data, option, "--format", "csv", "-j", "0"]
            result = runner.invoke(app, [*args, "--device", "cpu"])
            assert result.exit_code == 2, result.stderr
            assert result.stdout == ""
            assert f"{option} has no effect on an ONNX model" in error_line(result.stderr)
        kept = invoke(runner, script, world["flat"], option, "--trust-checkpoint", "-j", "0")
        assert kept.exit_code == 0, kept.stderr


def test_csv_is_the_json_rows_formatted_with_repr_floats_and_empty_fields(runner, world, tmp_path):
    """The CSV writer takes lists, not dicts: every field is where its column says, floats
    are written as repr writes them, and an unreadable image's row has empty class fields."""
    folder = tmp_path / "imgs"
    shutil.copytree(world["flat"], folder)
    (folder / "broken.png").write_bytes(b"not a png")
    args = [world["ckpt"], folder, "-k", "2", "--logits", "-j", "0"]
    as_csv = invoke(runner, *args, "--format", "csv")
    as_json = invoke(runner, *args, "--format", "json")
    assert as_csv.exit_code == 0 and as_json.exit_code == 0, as_csv.stderr
    rows = json.loads(as_json.stdout)
    # JSON alone adds label_index and class_index_K (CSV shows a name two classes share as
    # `crane (#2)`).
    columns = [c for c in rows[0] if c != "label_index" and not c.startswith("class_index_")]
    assert [c for c in rows[0] if c.startswith("class_")] == [
        "class_index", "class_1", "class_index_1", "class_2", "class_index_2",
    ]  # fmt: skip
    assert list(rows[0])[:3] == ["path", "label", "label_index"]
    assert columns[-1] == "error"
    assert columns[:5] == ["path", "label", "class", "class_index", "probability"]
    # A flat folder: the true label is not known, null in JSON (as an unreadable image's class)
    assert all(row["label"] is None for row in rows)
    expected = ",".join(columns) + "\n"
    for row in rows:
        fields = ["" if row[c] is None else repr(row[c]) if isinstance(row[c], float) else
                  str(row[c]) for c in columns]  # fmt: skip
        expected += ",".join(fields) + "\n"
    assert as_csv.stdout == expected
    broken = next(line for line in as_csv.stdout.splitlines() if line.startswith("broken.png"))
    assert broken.count(",") == len(columns) - 1 and broken.split(",")[1:-1] == [""] * (
        len(columns) - 2
    )


@pytest.mark.parametrize("fmt", ["csv", "json", "jsonl", "table", "file"])
def test_topk_above_the_classes_is_clipped_as_eval_clips_it_in_every_format(
    runner, world, tmp_path, fmt
):
    """--topk 3 with fewer classes gives class_1..class_C (as eval's predictions.csv), and a
    1-class model still gets class_1: the columns a script asked for never vanish."""
    from checkpoints import write_convnet_checkpoint

    write_convnet_checkpoint(tmp_path / "one.pt", in_channels=3, image_size=12, classes="a")
    out = tmp_path / "rows.csv"
    args = ["-o", out] if fmt == "file" else ["--format", fmt]
    one = [tmp_path / "one.pt", world["flat"] / "a.png", "--topk", "3", "-j", "0"]
    result = invoke(runner, *one, *args)
    assert result.exit_code == 0, result.stderr
    assert "--topk 3 is more than the 1 class; using 1" in result.stderr
    text = out.read_text() if fmt == "file" else result.stdout
    if fmt in ("json", "jsonl"):
        row = json.loads(text)[0] if fmt == "json" else json.loads(text.splitlines()[0])
    elif fmt == "table":
        assert "class_1" in text and "probability_1" in text and "class_2" not in text
        return
    else:
        row = read_csv(text)[0]
    in_json = ["class_index_1"] if fmt in ("json", "jsonl") else []  # the index beside the name
    assert [key for key in row if key.startswith(("class_", "probability_"))] == [
        "class_index", "class_1", *in_json, "probability_1",
    ]  # fmt: skip
    assert row["class_1"] == row["class"] == "a"
    assert float(row["probability_1"]) == 1.0


def test_the_table_on_a_narrow_terminal_keeps_every_class_name(
    runner, world, tmp_path, monkeypatch
):
    """--topk 5 is 16 columns: on a 60-column terminal rich squeezed them under one wide (CJK)
    character and dropped every class name; the table is printed wider instead."""
    from checkpoints import write_convnet_checkpoint
    from rich.console import Console

    from torchkit.cli import console

    write_convnet_checkpoint(
        tmp_path / "cjk.pt", in_channels=3, image_size=12, classes="猫犬狐鳥魚"
    )
    terminal = io.StringIO()
    monkeypatch.setattr(
        console, "stdout", Console(file=terminal, force_terminal=True, width=60, soft_wrap=True)
    )
    result = invoke(runner, tmp_path / "cjk.pt", world["flat"] / "a.png", "--topk", "5", "-j", "0")
    assert result.exit_code == 0, result.stderr
    shown = terminal.getvalue()
    # class_1..class_5 name each class once; `class` repeats class_1.
    assert all(name in shown for name in "猫犬狐鳥魚") and sum(map(shown.count, "猫犬狐鳥魚")) == 6


def test_a_checkpoint_is_loaded_without_drawing_random_weights(world):
    """predict builds a checkpoint's model without random init (its weights replace them):
    no random numbers are drawn, and the model is exactly the normally built one."""
    from torchkit.core.models import ModelSpec
    from torchkit.core.predict import PredictRequest, PredictRun

    torch.manual_seed(0)
    state = torch.get_rng_state()
    request = PredictRequest(
        spec=ModelSpec(str(world["ckpt"])),
        images=[str(world["flat"])],
        run=InferenceOptions(device="cpu"),
    )
    run = PredictRun(request)
    run.setup()
    assert torch.equal(torch.get_rng_state(), state)  # a normal build draws ~50k numbers
    built = model_from_checkpoint(load_checkpoint(world["ckpt"]))  # nor does any command's
    assert torch.equal(torch.get_rng_state(), state)
    convnet_class()(2, 3, 8)  # as a model built with random weights does
    assert not torch.equal(torch.get_rng_state(), state)
    ours, theirs = run.resolved.model.state_dict(), built.state_dict()
    assert list(ours) == list(theirs)
    assert all(torch.equal(ours[key], theirs[key]) for key in theirs)
    run.close()


def test_a_row_with_values_outside_the_header_is_an_error_not_dropped():
    from torchkit.core.io.errors import InputError
    from torchkit.core.predict.run import _aligned

    header = ["path", "label", "class", "class_index", "probability", "logit_0", "error"]
    keys = ["path", "label", "class", "class_index", "probability", "logit_0", "logit_1", "error"]
    with pytest.raises(InputError, match="logit_1"):
        _aligned(keys, ["a.png", "", "x", 0, 0.5, 1.0, 2.0, ""], header)
    fewer = ["path", "label", "class", "class_index", "probability", "error"]
    assert _aligned(fewer, ["a.png", "", "x", 0, 0.5, ""], header) == [
        "a.png", "", "x", 0, 0.5, None, "",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("nothere.jpg", "image not found: {path} (check the path)"),
        (
            "nothere",
            "IMAGES not found: {path} (give image files, folders, CSV indexes, digits or - for "
            "stdin)",
        ),
    ],
)
def test_a_missing_image_or_folder_is_named_as_such(runner, world, tmp_path, name, message):
    """Issue #31: `predict run/best.pt nothere.jpg` said "dataset not found"."""
    path = tmp_path / name
    result = invoke(runner, world["ckpt"], path)
    assert result.exit_code == 1 and result.stdout == ""
    assert message.format(path=path) in error_line(result.stderr)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("s3://bucket/d/a.jpg", "torchkit reads files and http(s) URLs, not s3:// URLs"),
        ("pipe:curl -s https://host/a.tar", "is a webdataset pipe: command"),
    ],
)
def test_a_url_torchkit_does_not_fetch_is_said_so_not_missing(runner, world, name, message):
    """Was "image not found: s3://bucket/d/a.jpg (check the path)"."""
    result = invoke(runner, world["ckpt"], name)
    assert result.exit_code == 1 and result.stdout == ""
    line = error_line(result.stderr)
    assert message in line and "not found" not in line, line


def test_the_note_on_outputs_named_by_index_counts_in_words():
    """'the 1 class of DATA is not its 1000 outputs' (was '1 classes ... are'); plural and
    singular both ways."""
    from torchkit.core.inference.class_names import output_names_from_data

    names, note = output_names_from_data(["a", "b", "c"], 1, "D")
    assert names == ["0"] and "; the 3 classes of D are not its 1 output (pass" in note
    names, note = output_names_from_data(["a"], 1000, "D")
    assert len(names) == 1000 and "; the 1 class of D is not its 1000 outputs (pass" in note
