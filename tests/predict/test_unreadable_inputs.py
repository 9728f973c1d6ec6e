"""The one rule of the commands that read many images (docs/conventions.md): unreadable ones
are counted in a warning and the run succeeds while some image was read; when none could be,
it fails with one `Error: none of the N images in DATA could be read` line and exit 1."""

from __future__ import annotations

import pytest
import torch
from image_folders import write_image_folder
from output_checks import error_line

from torchkit.cli import app
from torchkit.core.data.preprocessing import Preprocess
from torchkit.core.models.checkpoint import FORMAT_VERSION, save_checkpoint
from torchkit.core.models.convnet import convnet_class

RUN = ["--device", "cpu", "-j", "0"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("model") / "model.pt"
    preprocess = Preprocess(image_size=8, resize_size=8, mean=(0.5,) * 3, std=(0.25,) * 3)
    save_checkpoint(
        {
            "format_version": FORMAT_VERSION,
            "arch": "convnet",
            "num_classes": 2,
            "classes": ["a", "b"],
            "model": convnet_class()(2, 3, 8).state_dict(),
            "preprocess": preprocess.to_dict(),
        },
        path,
    )
    return path


def images(tmp_path, bad: int):
    """Three images in classes a and b, the first `bad` of them unreadable."""
    root = write_image_folder(tmp_path / "imgs", {"a": 2, "b": 1}, size=8)
    for path in sorted(root.rglob("*.png"))[:bad]:
        path.write_bytes(b"not a png")
    return root


def commands(checkpoint, data, tmp_path) -> dict[str, tuple[list[str], object]]:
    """Each command's arguments, and the output it writes (left unmade by a failure)."""
    report, feats, stats = tmp_path / "p.csv", tmp_path / "feats", tmp_path / "s.json"
    return {
        "predict": (["predict", str(checkpoint), str(data), *RUN, "-o", str(report)], report),
        "extract-features": (
            ["extract-features", str(checkpoint), str(data), str(feats), *RUN, "-l", "logits"],
            feats,
        ),
        "eval": (["eval", str(checkpoint), "--data", str(data), *RUN, "-o", str(report)], report),
        "dataset-stats": (["dataset-stats", str(data), "-j", "0", "-o", str(stats)], stats),
    }


WARNINGS = {  # what each counts when some images are unreadable
    "predict": "Warning: 1 unreadable image(s), rows with an error",
    "extract-features": "Warning: skipped 1 unreadable image(s)",
    "eval": "Warning: skipped 1 unreadable image(s)",
    "dataset-stats": "Warning: skipped 1 unreadable file(s)",
}


# eval's reports take seconds: its some-read cases are tested in tests/eval
CASES = [(c, b) for c in WARNINGS for b in (0, 1, 3) if c != "eval" or b == 3]


@pytest.mark.parametrize(("command", "bad"), CASES, ids=[f"{c}-{b}-bad-of-3" for c, b in CASES])
def test_unreadable_images_exit_0_while_some_are_read_and_1_when_none_are(
    runner, checkpoint, tmp_path, command, bad
):
    data = images(tmp_path, bad)
    args, output = commands(checkpoint, data, tmp_path)[command]
    result = runner.invoke(app, args)
    if bad == 3:
        assert result.exit_code == 1, result.stderr
        # one wording, naming the data (predict's named no source)
        files = "image files" if command == "dataset-stats" else "images"
        assert error_line(result.stderr).startswith(
            f"Error: none of the 3 {files} in {data} could be read"
        )
        assert not output.exists()
        return
    assert result.exit_code == 0, result.stderr
    assert output.exists()
    assert "Error" not in result.stderr
    assert (WARNINGS[command] in result.stderr) == (bad == 1), result.stderr


@pytest.mark.parametrize("fmt", ["json", "table"])
def test_predict_gives_the_error_rows_whole_when_none_is_read(runner, checkpoint, tmp_path, fmt):
    """Exit 1 after the error rows on stdout: JSON's list was left open (`[` and the rows, no
    `]`: no JSON at all) and the table was not shown."""
    import json

    data = images(tmp_path, 3)
    result = runner.invoke(app, ["predict", str(checkpoint), str(data), *RUN, "--format", fmt])
    assert result.exit_code == 1, result.stderr
    assert error_line(result.stderr).startswith("Error: none of the 3 images")
    names = ["a/a_0.png", "a/a_1.png", "b/b_0.png"]
    if fmt == "json":
        rows = json.loads(result.stdout)
        assert [(row["path"], row["error"], row["class"]) for row in rows] == [
            (name, "not an image PIL can read", None) for name in names
        ]
    else:
        assert all(name in result.stdout for name in names), result.stdout
        assert result.stdout.count("not an image PIL can read") == 3


def test_predict_strict_leaves_a_whole_json_list(runner, checkpoint, tmp_path):
    """--strict stops at the first unreadable image: the rows before it, none here, as JSON."""
    import json

    data = images(tmp_path, 1)
    args = ["predict", str(checkpoint), str(data), *RUN, "--format", "json", "--strict"]
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.stderr
    assert "not an image PIL can read" in error_line(result.stderr)
    assert json.loads(result.stdout) == []


def test_predict_error_column_of_a_name_holding_a_colon(runner, checkpoint, tmp_path):
    """The `error` column is the reason alone: of `x: y.png` it read `y.png: not an image PIL
    can read`, the message cut at the colon of the name."""
    import csv
    import io

    data = images(tmp_path, 0)
    (data / "a" / "x: y.png").write_bytes(b"not a png")
    result = runner.invoke(app, ["predict", str(checkpoint), str(data), *RUN, "--format", "csv"])
    assert result.exit_code == 0, result.stderr
    errors = {row["path"]: row["error"] for row in csv.DictReader(io.StringIO(result.stdout))}
    assert errors["a/x: y.png"] == "not an image PIL can read"
    assert errors["a/a_0.png"] == ""


def test_predict_an_image_argument_that_is_no_regular_file(runner, checkpoint, tmp_path):
    """A dangling link or a FIFO named as an image is an image, as on stdin: they were read as
    data ("dataset not found: x.png", "neither a folder nor a CSV index")."""
    import csv
    import io
    import os

    good = images(tmp_path, 0) / "a" / "a_0.png"
    (tmp_path / "gone.png").symlink_to(tmp_path / "nowhere.png")
    os.mkfifo(tmp_path / "pipe.png")
    args = ["predict", str(checkpoint), *RUN, "--format", "csv"]
    result = runner.invoke(app, [*args, str(tmp_path / "gone.png")])
    assert result.exit_code == 1
    assert error_line(result.stderr) == f"Error: image not found: {tmp_path / 'gone.png'}"
    result = runner.invoke(app, [*args, str(tmp_path / "pipe.png"), str(good)])
    assert result.exit_code == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [row["error"] for row in rows] == ["not a regular file (a FIFO)", ""]
