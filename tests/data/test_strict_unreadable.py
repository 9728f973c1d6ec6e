"""--strict's error for an unreadable image is one line in every command that reads images: the
same words, the same hint, and the file named by the path the user reaches it by from the
working folder (not by its place in the data folder in some commands only)."""

from __future__ import annotations

from pathlib import Path

from checkpoints import write_convnet_checkpoint
from image_folders import write_image_folder
from output_checks import error_line
from processes import run_torchkit_in_process

SAID = (
    "Error: unreadable image data/b/empty.png: {reason} (fix or remove it, or {off} to skip "
    "unreadable images)"
)
PIL_SAYS = "cannot identify image file 'data/b/empty.png' (an empty file)"


def test_every_command_says_the_same_of_an_unreadable_image_under_strict(tmp_path: Path):
    write_image_folder(tmp_path / "data", {"a": 3, "b": 3})
    (tmp_path / "data" / "b" / "empty.png").write_bytes(b"")
    write_convnet_checkpoint(tmp_path / "m.pt", in_channels=3, image_size=8, classes="ab")
    before = sorted(path.name for path in (tmp_path / "data").rglob("*"))
    commands = {
        "train": [
            "train", "--data", "data", "--model", "nets:TinyNet", "--image-size", "8",
            "--val-split", "0.34", "--epochs", "1", "--out", "run",
        ],
        "eval": ["eval", "m.pt", "--data", "data"],
        "predict": ["predict", "m.pt", "data", "--output", "p.csv"],
        "extract-features": ["extract-features", "m.pt", "--data", "data", "--out", "f"],
        "convert shards": ["convert", "shards", "data", "shards"],
    }  # fmt: skip
    for name, args in commands.items():
        result = run_torchkit_in_process(*args, "--strict", "-j", "0", cwd=tmp_path)
        assert result.returncode == 1, (name, result.stderr)
        off = "pass --no-strict" if name == "train" else "leave out --strict"
        assert error_line(result.stderr) == SAID.format(reason=PIL_SAYS, off=off), name
    # dataset-stats reads each file itself, and says why in its own words
    stats = run_torchkit_in_process("dataset-stats", "data", "--strict", "-j", "0", cwd=tmp_path)
    assert stats.returncode == 1, stats.stderr
    assert error_line(stats.stderr) == SAID.format(reason="empty file", off="leave out --strict")
    assert sorted(path.name for path in (tmp_path / "data").rglob("*")) == before
