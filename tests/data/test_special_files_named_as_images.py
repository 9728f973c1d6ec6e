"""A FIFO, socket or device named like an image in a folder (`mkfifo cat/x.png`), or a link to
one, is an unreadable image, as an image link to nothing is: listed, never opened (opening a
FIFO blocks), skipped with a warning and counted, fatal with --strict; `split` leaves it out
with a warning naming it. Folder readers passed over it without a word."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from image_folders import write_image_folder
from output_checks import error_line
from processes import run_torchkit_in_process

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")


@pytest.fixture
def data(tmp_path: Path) -> Path:
    root = write_image_folder(tmp_path / "data", {"cat": 2, "dog": 2})
    os.mkfifo(root / "cat" / "x.png")
    os.mkfifo(tmp_path / "elsewhere.png")
    (root / "dog" / "y.jpg").symlink_to(tmp_path / "elsewhere.png")
    return root


def test_an_image_folder_lists_them_as_images(data):
    from torchkit.core.data.sources import open_data

    read = open_data(data)
    assert read.whole.ids == [
        "cat/cat_0.png", "cat/cat_1.png", "cat/x.png", "dog/dog_0.png", "dog/dog_1.png",
        "dog/y.jpg",
    ]  # fmt: skip
    assert read.whole.labels == [0, 0, 0, 1, 1, 1]


def test_a_flat_folder_lists_a_socket_too(tmp_path):
    from torchkit.core.data.sources import open_data

    root = tmp_path / "flat"
    root.mkdir()
    write_image_folder(tmp_path / "made", {"a": 1})
    (tmp_path / "made" / "a" / "a_0.png").rename(root / "a.png")
    os.mkfifo(root / "b.png")
    with socket.socket(socket.AF_UNIX) as listening:
        try:
            listening.bind(str(root / "c.png"))
        except OSError:  # a path too long for a socket's address
            pytest.skip("no socket here")
        read = open_data(root, allow_unlabelled=True)
    assert read.whole.ids == ["a.png", "b.png", "c.png"]


def test_dataset_stats_counts_them_and_strict_refuses(data):
    report = run_torchkit_in_process("dataset-stats", data, "--format", "json")
    assert report.returncode == 0, report.stderr
    found = json.loads(report.stdout)
    assert (found["images"], found["unreadable_count"]) == (4, 2)
    assert found["unreadable"] == [
        {"path": "cat/x.png", "error": "not a regular file (a FIFO)"},
        {"path": "dog/y.jpg", "error": "not a regular file (a FIFO)"},
    ]
    strict = run_torchkit_in_process("dataset-stats", data, "--strict")
    assert strict.returncode == 1 and "cat/x.png" in error_line(strict.stderr)


def test_split_leaves_them_out_naming_them(data, tmp_path):
    out = tmp_path / "out"
    split = run_torchkit_in_process("split", data, out)
    assert split.returncode == 0, split.stderr
    assert (
        "Warning: 2 image name(s) are no regular file (a FIFO, socket or device) and are left "
        "out: cat/x.png, dog/y.jpg"
    ) in split.stderr
    assert "point nowhere" not in split.stderr
    assert len((out / "split.csv").read_text().splitlines()) == 1 + 4
