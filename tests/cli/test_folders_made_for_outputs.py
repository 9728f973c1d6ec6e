"""The folders a file output makes above itself (`-o new/sub/preds.csv`) go again when the run
writes no file there: a failed run leaves no empty folders behind. Folders that were there, or
that hold anything else by then, stay."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from output_checks import error_line
from processes import run_torchkit_in_process

from torchkit.core.io.files import atomic_path, atomic_write


def _write_with(writer: str, target: Path, fail: bool) -> None:
    if writer == "handle":
        with atomic_write(target) as handle:
            handle.write("rows\n")
            if fail:
                raise RuntimeError("the run failed")
    else:
        with atomic_path(target) as temporary:
            temporary.write_text("rows\n")
            if fail:
                raise RuntimeError("the run failed")


@pytest.mark.parametrize("writer", ["handle", "named"])
def test_a_failed_write_removes_the_folders_it_made(tmp_path, writer):
    (tmp_path / "there").mkdir()
    target = tmp_path / "there" / "new" / "sub" / "preds.csv"
    with pytest.raises(RuntimeError, match="the run failed"):
        _write_with(writer, target, fail=True)
    assert os.listdir(tmp_path / "there") == []  # `there` was there before: it stays

    _write_with(writer, target, fail=False)
    assert target.read_text() == "rows\n"


def test_a_folder_made_that_holds_something_else_by_then_stays(tmp_path):
    target = tmp_path / "new" / "sub" / "preds.csv"
    with pytest.raises(RuntimeError), atomic_write(target) as handle:
        handle.write("rows\n")
        (tmp_path / "new" / "notes.txt").write_text("mine")  # another writer's file
        raise RuntimeError("the run failed")
    assert sorted(os.listdir(tmp_path / "new")) == ["notes.txt"]  # `sub` went, `new` stays


def test_predict_that_reads_no_image_leaves_no_folder_for_its_output(tmp_path):
    images = tmp_path / "images" / "cat"
    images.mkdir(parents=True)
    (images / "1.png").write_bytes(b"not an image")
    out = tmp_path / "reports" / "today" / "preds.csv"
    result = run_torchkit_in_process(
        "predict",
        "convnet",
        "--allow-untrained",
        "--image-size",
        "12",
        tmp_path / "images",
        "-o",
        out,
    )
    assert result.returncode == 1
    assert "could be read" in error_line(result.stderr)
    assert not (tmp_path / "reports").exists()  # was left behind, empty
