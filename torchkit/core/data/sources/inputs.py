"""The inputs behind a `--data`/IMAGES argument, which no command's outputs may overwrite or
land inside: the data folder, or a CSV index and the folders of the images it names."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from torchkit.core.io.errors import TorchkitError
from torchkit.core.io.overlap import InputPath, check_overlap, folders_of_files


def data_inputs(data: str | os.PathLike | None, what: str = "data") -> list[InputPath]:
    """The inputs behind a `--data`/IMAGES argument: a folder (its whole tree, and the linked
    folders in it that the readers enter), a CSV index (the file, and the folders of the images
    it names) or a single file; nothing for `digits`."""
    from torchkit.core.data.sources.discovery import list_folders

    if data is None or os.fspath(data) == "digits":
        return []
    source = Path(data)
    try:
        is_dir, is_file = source.is_dir(), source.is_file()
    except OSError:  # no file's name: a `::` list of (presigned) URLs longer than a path may be
        is_dir = is_file = False
    if is_dir:
        # An output in a folder read through a link (`ROOT/cat/more -> /elsewhere/more`) would
        # land in the data, and the next read of ROOT would take what was written for data.
        linked = list_folders([source], links_only=True).entered
        return [InputPath(source, f"{what} folder")] + [
            InputPath(Path(path), f"linked {what} folder") for path in linked
        ]
    if not is_file:
        return _named_shards(os.fspath(data), what)
    inputs = [InputPath(source, f"{what} file")]
    if source.suffix.lower() == ".csv":
        inputs += _csv_image_folders(source)
    return inputs


def _named_shards(spec: str, what: str) -> list[InputPath]:
    """The local shards a brace pattern or `::` list names (`train-{0000..0127}.tar`): the
    spec is no path, yet an output may not be one of its shards nor hold them. Nothing where
    it names none (the reader says what is wrong with it); a URL names no file here."""
    from torchkit.core.data.sources.http_shards import is_url
    from torchkit.core.data.sources.shards import expand_braces, is_shard_pattern
    from torchkit.core.io.redaction import list_parts

    if not is_shard_pattern(spec):
        return []
    try:
        names = [name for part in list_parts(spec) for name in expand_braces(part)]
    except TorchkitError:
        return []
    return [
        InputPath(Path(name), f"{what} shard")
        for name in names
        if not is_url(name) and os.path.isfile(name)
    ]


def listed_inputs(paths: Iterable[str]) -> list[InputPath]:
    """The inputs behind IMAGES `-`: the files listed on stdin, each as itself. An output may
    not be one nor hold one, but may lie beside them (`ls *.png | ... - feats`), as beside
    image files given as arguments: each is checked before it is read, and the output is put
    in place only after the last has been."""
    return [InputPath(Path(path), "image listed on stdin") for path in paths]


def listed_check(output: str | os.PathLike, what: str) -> Callable[[list[str]], None]:
    """The check of the images listed on stdin as they are read (`-` streamed, where they
    cannot all be checked before the work): `output` is none of them and holds none. One
    `lstat` a path: a regular file (not a link) lies in `output` exactly where the other
    regular files of its folder do, so the overlap check is made for the first of each folder
    only; a link, a folder, a missing path or a name ending in `.`/`..` is checked itself."""
    import stat

    clean: set[str] = set()  # folders whose regular files lie outside `output`

    def check(paths: list[str]) -> None:
        for path in paths:
            folder, name = os.path.split(path)
            try:
                regular = stat.S_ISREG(os.lstat(path).st_mode)
            except (OSError, ValueError):  # missing, or no name: checked as it is named
                regular = False
            if regular and name not in (".", ".."):
                if folder in clean:
                    continue
                check_overlap(output, what, listed_inputs([path]))
                clean.add(folder)
            else:
                check_overlap(output, what, listed_inputs([path]))

    return check


# The last CSV index's image folders, by its path and contents (`_index_version`): a command
# checks its outputs against its inputs more than once (eval's -o FILE, then --out), and each
# check read a million-row index whole again (1.5-5 s a read). Beside them, the folder its
# relative paths were joined to and the first of them, which decides that folder (`_base`).
_index_folders: dict[tuple, tuple[str | None, str, list[InputPath]]] = {}


def _index_version(index: Path) -> tuple | None:
    """What tells one version of the file `index` from another (None where it cannot be read):
    its real path and a digest of its bytes (a read of the file: ~0.1 s at a million rows). Its
    size and times did not: a file written again in the same tick of its file system's clock
    (a second on many network and FUSE mounts, HFS+, ext3; a few milliseconds on Linux before
    6.13) with other folders of the same length kept the first version's folders."""
    from torchkit.core.data.hashing import file_digest

    try:
        digest = file_digest(index)  # a regular file's only: a FIFO's data is not eaten here
    except OSError:
        return None
    return os.path.realpath(index), digest


def _csv_image_folders(index: Path) -> list[InputPath]:
    """The folders of the files a CSV index names (`folders_of_files`), read once for each
    version of the index and folder its paths are relative to; none where it cannot be read
    (the command's own reader reports what is wrong with it)."""
    version = _index_version(index)
    cached = _index_folders.get((version, str(index)))
    # A symbolic link to the index reads its paths beside the link or beside the file it leads
    # to, by where its first path names a file (`index_folder`): one made there since (images
    # copied beside the index) moves every image, in the same version of the index.
    if cached is not None and _base(index, cached[0]) == cached[1]:
        return list(cached[2])
    paths, first, base = _csv_paths(index)
    found = folders_of_files(paths, f"images of {index}")
    _index_folders.clear()  # one index kept: a few folders, never the paths
    # Kept only where the file was not written again while it was read.
    if version is not None and _index_version(index) == version:
        _index_folders[version, str(index)] = (first, base, found)
    return list(found)


def _base(index: Path, first: str | None) -> str:
    """The folder the relative paths of `index` are joined to, whose first is `first`."""
    from torchkit.core.data.sources.csv_index import index_folder

    return str(index_folder(index, [] if first is None else [first]))


def _csv_paths(index: Path) -> tuple[list[str], str | None, str]:
    """The files a CSV index names, its first relative path and the folder they are joined to
    (`_base`); no files where it cannot be read (the command's own reader reports what is
    wrong with it)."""
    from torchkit.core.data.sources.csv_index import (
        absolute_paths,
        first_relative_path,
        read_index_rows,
    )

    try:
        rows = read_index_rows(index, labelled=False)
    except (OSError, TorchkitError):
        return [], None, _base(index, None)
    first = first_relative_path(rows.paths)
    return absolute_paths(rows), first, _base(index, first)
