"""Tar archives of given members, in their order, for the tests of `.tar` image folders and
shards (data/test_names_and_links.py, data/test_tar_read_as_unpacked.py)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path


def tar_of_members(
    path: Path,
    members: list[tuple[str, bytes | str | None]],
    *,
    format: int = tarfile.DEFAULT_FORMAT,
) -> Path:
    """A tar at `path` of `members` in their order: (name, bytes) a file, (name, "->TARGET") a
    symbolic link, (name, "=>TARGET") a hard link, (name, None) a folder."""
    with tarfile.open(path, "w", format=format) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif isinstance(data, str):
                kind = tarfile.LNKTYPE if data.startswith("=>") else tarfile.SYMTYPE
                info.type, info.linkname = kind, data[2:]
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path
