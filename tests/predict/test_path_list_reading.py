"""Paths on stdin (`-`) as `core.io.path_lists` reads them from a pipe or file."""

from __future__ import annotations

import os

import pytest

from torchkit.core.io.errors import UsageError
from torchkit.core.io.path_lists import NulSeparated, PathStream


def test_a_long_line_separated_list_with_null_is_refused_before_its_end(tmp_path):
    # `find | predict m.pt - --null`: refused only once the whole list had come, each read
    # joined again to all before it (0.1 s at 100,000 lines, 1.3 s at 400,000, quadratic);
    # now as soon as more than any path could hold has come without a NUL.
    listed = tmp_path / "list.txt"
    listed.write_bytes(b"".join(b"/data/images/img_%08d.png\n" % i for i in range(100_000)))
    with open(listed, "rb") as stdin:
        with pytest.raises(UsageError, match="separated by line breaks, not NUL bytes"):
            PathStream(NulSeparated(stdin), "image")
        taken = os.lseek(stdin.fileno(), 0, os.SEEK_CUR)
    assert taken < listed.stat().st_size / 2


def test_paths_split_across_reads_are_read_whole(tmp_path):
    # A path whose start and end come in two reads (and a long one over many): joined once.
    names = [b"a" * 70_000 + b"\nb.png", b"c.png", b"d" * 200_000]
    listed = tmp_path / "list.bin"
    listed.write_bytes(b"\0".join(names))
    with open(listed, "rb") as stdin:
        stream = PathStream(NulSeparated(stdin), "image")
        assert stream.take(5) + stream.take(5) == [os.fsdecode(name) for name in names]
    lines = tmp_path / "list.txt"
    lines.write_bytes(b"x" * 150_000 + b"\r\ny.png\n")
    with open(lines, "rb") as stdin:
        stream = PathStream(stdin, "image")
        assert stream.take(5) + stream.take(5) == ["x" * 150_000, "y.png"]
