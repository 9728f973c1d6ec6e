"""Output names as long as a file name may be (255 bytes): the temporary written beside the
output, and the files beside an output folder (its lock, its hidden partial and set-aside
folders), fit in a file name too, and the clean-up after a killed writer still finds them."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import pytest
from processes import run_torchkit_in_process

from torchkit.core.io.files import atomic_path, atomic_write
from torchkit.core.io.temporaries import temporary_stem, temporary_stems
from torchkit.core.io.write_errors import is_write_error, write_error

# 255 bytes with its extension; 245 bytes of two-byte letters; 242, the first that failed.
LONG_NAMES = ["b" * 250 + ".json", "é" * 120 + ".json", "c" * 238 + ".csv"]


def _hidden(folder: Path) -> list[str]:
    return sorted(name for name in os.listdir(folder) if name.startswith("."))


def _dead(temporary: str) -> str:
    """The name a killed writer's temporary of the same file had: another random part."""
    return re.sub(r"\.[a-z0-9_]{8}\.tmp(?=(\.[^.]+)?$)", ".dead0000.tmp", temporary)


@pytest.mark.parametrize("name", LONG_NAMES)
@pytest.mark.parametrize("writer", ["atomic_write", "atomic_path"])
def test_a_long_name_is_written_and_a_killed_writers_temporary_of_it_removed(
    tmp_path, name, writer
):
    """Before, the temporary `.NAME.XXXXXXXX.tmp` (14 bytes more than NAME) could not be made:
    "cannot write NAME: File name too long". Its shortened name reads back as one of NAME's
    temporaries, and only NAME's: a killed writer's goes at the next write, another long
    name's with the same first 240 bytes stays."""
    seen = []

    def write(path: Path, text: str) -> None:
        if writer == "atomic_write":
            with atomic_write(path, "w", encoding="utf-8") as handle:
                handle.write(text)
                seen.extend(_hidden(path.parent))
        else:
            with atomic_path(path) as temporary:
                temporary.write_text(text, encoding="utf-8")
                seen.extend(_hidden(path.parent))

    first, again = tmp_path / "first", tmp_path / "again"
    twin = name[:-6] + "x" + name[-5:]  # the same head, another name
    write(first / twin, "twin\n")
    write(first / name, "first\n")
    twins_temporary, temporary = seen
    assert len(os.fsencode(temporary)) <= 255
    assert temporary_stem(temporary) in temporary_stems(name)
    assert temporary_stem(temporary) not in temporary_stems(twin)
    # a permission error naming the temporary is the output's, not an input's
    denied = PermissionError(errno.EACCES, "Permission denied", str(first / temporary))
    assert is_write_error(denied, first / name)
    assert (first / name).read_text(encoding="utf-8") == "first\n" and _hidden(first) == []
    # Killed writers' temporaries (nobody holds their flock), there before this process
    # writes into the folder: the target's and its twin's.
    again.mkdir()
    for left in (temporary, twins_temporary):
        (again / _dead(left)).write_text("half")
    write(again / name, "again\n")
    assert (again / name).read_text(encoding="utf-8") == "again\n"
    assert _hidden(again) == [_dead(twins_temporary)]


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    import cv2
    import numpy as np

    path = tmp_path_factory.mktemp("clip") / "clip.avi"
    video = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10, (32, 24))
    for index in range(6):
        video.write(np.full((24, 32, 3), index * 40, np.uint8))
    video.release()
    return path


def test_a_report_named_with_250_bytes_is_written(tmp_path, clip):
    report = tmp_path / ("b" * 245 + ".json")
    result = run_torchkit_in_process("video-info", clip, "--format", "json", "-o", report)
    assert result.returncode == 0, result.stderr
    assert '"frames": 6' in report.read_text(encoding="utf-8")
    assert os.listdir(tmp_path) == [report.name]


def test_a_folder_output_s_file_and_the_folder_itself_named_with_250_bytes(tmp_path, clip):
    from PIL import Image

    images = tmp_path / "images"
    images.mkdir()
    stem = "c" * 246
    Image.new("RGB", (4, 4), (10, 20, 30)).save(images / f"{stem}.png")
    arrays = tmp_path / "arrays"
    result = run_torchkit_in_process("convert", "tensor", images, arrays, "--to", "npy", "-j", "0")
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(arrays)) == [".torchkit", f"{stem}.npy"]
    # A folder of 250 bytes: its lock and hidden folders beside it are shortened too.
    frames = tmp_path / "f" / ("d" * 250)
    for segments in ("2", "3"):  # the second replaces the first (--force)
        result = run_torchkit_in_process(
            "video-info", clip, "--segments", segments, "--extract-frames", frames, "--force"
        )
        assert result.returncode == 0, result.stderr
        assert len(os.listdir(frames)) == int(segments) + 1  # and the marker
        assert os.listdir(frames.parent) == [frames.name]


def test_a_name_too_long_is_not_told_to_free_some_space(tmp_path):
    target = tmp_path / ("x" * 300)
    error = write_error(target, OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG)))
    assert error.message == f"cannot write {target}: File name too long"
    assert "space" not in error.hint and "255 bytes a name" in error.hint
    full = write_error(target, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    assert full.hint.startswith("free some space")
