"""The overlap checks' inputs of a CSV index (`core.data.sources.inputs.data_inputs`): eval checks
its -o FILE and then its --out folder against them, and each check read the whole index again
(a million rows: seconds a read). The index is read once for each version of the file."""

from __future__ import annotations

import os
from pathlib import Path

from torchkit.core.data.sources import inputs


def _write_index(path: Path, folder: str) -> None:
    path.write_text(f"path,label\n{folder}/a.png,a\n{folder}/b.png,b\n", encoding="utf-8")


def test_an_index_is_read_once_until_it_changes(tmp_path, monkeypatch):
    reads: list[Path] = []
    read = inputs._csv_paths
    monkeypatch.setattr(inputs, "_csv_paths", lambda index: reads.append(index) or read(index))
    index = tmp_path / "index.csv"
    _write_index(index, "one")
    first = inputs.data_inputs(index)
    assert inputs.data_inputs(index) == first  # eval's second check
    assert len(reads) == 1
    assert [item.path for item in first] == [index, tmp_path / "one"]

    _write_index(index, "two")  # another version (its size and times): read again
    os.utime(index, ns=(1, 1))
    assert [item.path for item in inputs.data_inputs(index)] == [index, tmp_path / "two"]
    assert len(reads) == 2


def test_an_index_written_again_in_one_tick_of_its_file_systems_clock_is_read_again(
    tmp_path, monkeypatch
):
    """A file written twice in one tick of its file system's clock (a second on many network
    and FUSE mounts, HFS+, ext3; a few milliseconds on Linux before 6.13) has one size, inode
    and times for both versions: the first version's folders were kept for the second."""
    index = tmp_path / "index.csv"
    real_stat = os.stat
    tick = 1_700_000_000 * 10**9

    def stat_in_one_tick(path, *args, **kwargs):
        info = real_stat(path, *args, **kwargs)
        if os.fspath(path) != os.fspath(index):
            return info
        times = {"st_atime_ns": tick, "st_mtime_ns": tick, "st_ctime_ns": tick}
        return os.stat_result(tuple(info), times)

    monkeypatch.setattr(os, "stat", stat_in_one_tick)
    _write_index(index, "one")
    assert [item.path for item in inputs.data_inputs(index)] == [index, tmp_path / "one"]
    _write_index(index, "two")  # in place, the same length
    assert [item.path for item in inputs.data_inputs(index)] == [index, tmp_path / "two"]


def test_a_linked_index_is_read_again_once_its_images_lie_beside_the_file_it_leads_to(tmp_path):
    """`ln -s ~/splits/train.csv flowers/`: its paths are read beside the link while its first
    path names a file there and none beside the file it leads to, and beside that file once
    one is there too (the images copied beside the index). The folders kept for that version
    of the index stayed the link's: an output could be written among the images read."""
    splits, flowers = tmp_path / "splits", tmp_path / "flowers"
    (flowers / "one").mkdir(parents=True)
    (flowers / "one" / "a.png").write_bytes(b"png")
    splits.mkdir()
    _write_index(splits / "train.csv", "one")
    link = flowers / "train.csv"
    link.symlink_to(splits / "train.csv")
    assert [item.path for item in inputs.data_inputs(link)] == [link, flowers / "one"]
    (splits / "one").mkdir()
    (splits / "one" / "a.png").write_bytes(b"png")
    assert [item.path for item in inputs.data_inputs(link)] == [link, splits / "one"]
