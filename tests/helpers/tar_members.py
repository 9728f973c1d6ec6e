"""Tar archives of given members, in their order, and what `open_data` reads of them, for the
tests of `.tar` image folders and shards (data/test_names_and_links.py,
data/test_one_file_two_names.py, data/test_tar_read_as_unpacked.py)."""

from __future__ import annotations

import functools
import io
import shutil
import subprocess
import tarfile
from pathlib import Path

from torchkit.core.data.sources import open_data

_SPECIAL_TYPES = {"fifo": tarfile.FIFOTYPE, "char": tarfile.CHRTYPE, "block": tarfile.BLKTYPE}


def tar_of_members(
    path: Path,
    members: list[tuple[str, bytes | str | None]],
    *,
    format: int = tarfile.DEFAULT_FORMAT,
    pax_headers: dict[str, str] | None = None,
) -> Path:
    """A tar at `path` of `members` in their order: (name, bytes) a file, (name, "->TARGET") a
    symbolic link, (name, "=>TARGET") a hard link, (name, None) a folder, (name, "|fifo"),
    (name, "|char") and (name, "|block") a FIFO, a character and a block device. `pax_headers`:
    a pax global header first (Python's `tarfile` then lists the tar, not torchkit's own
    reading of plain headers)."""
    with tarfile.open(path, "w", format=format, pax_headers=pax_headers) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif isinstance(data, str) and data.startswith("|"):
                info.type = _SPECIAL_TYPES[data[1:]]
                tar.addfile(info)
            elif isinstance(data, str):
                kind = tarfile.LNKTYPE if data.startswith("=>") else tarfile.SYMTYPE
                info.type, info.linkname = kind, data[2:]
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


@functools.cache
def has_gnu_tar() -> bool:
    """Whether the `tar` on the PATH is GNU tar (the reference the tests compare with)."""
    found = shutil.which("tar") and subprocess.run(
        ["tar", "--version"], capture_output=True, text=True
    )
    return bool(found) and "GNU tar" in found.stdout


def opened_with_warnings(archive: Path, caplog) -> tuple:
    """(`open_data` of `archive`, the messages of the warnings it gave)."""
    with caplog.at_level("WARNING", logger="torchkit"):
        source = open_data(str(archive))
    return source, [record.getMessage() for record in caplog.records]


def images_read(source) -> dict[str, bytes]:
    """{id: its bytes} of `source`'s images, in its order."""
    return {
        name: path.read_bytes()
        for name, path in zip(source.whole.ids, source.whole.paths, strict=True)
    }


def bytes_or_none(source) -> dict[str, bytes | None]:
    """{id: its bytes, or None where it cannot be read (a link to nothing)} of `source`'s
    images, in its order."""
    images = {}
    for name, path in zip(source.whole.ids, source.whole.paths, strict=True):
        try:
            images[name] = path.read_bytes()
        except OSError:
            images[name] = None
    return images


def bytes_or_errors(source) -> dict[str, bytes | str]:
    """{id: its bytes, or the text of the error reading it gives} of `source`'s images, in
    its order."""
    images: dict[str, bytes | str] = {}
    for name, path in zip(source.whole.ids, source.whole.paths, strict=True):
        try:
            images[name] = path.read_bytes()
        except OSError as error:
            images[name] = str(error)
    return images


def readable_and_not(source) -> tuple[dict[str, bytes], list[str]]:
    """({id: its bytes} of the images read, [the ids that cannot be read]) of `source`."""
    images = bytes_or_none(source)
    read = {name: data for name, data in images.items() if data is not None}
    return read, [name for name, data in images.items() if data is None]
