"""The exported formats: names, file extensions, runtimes, and `sniff_format` (what a file is,
from its name or its archive's entries). Imports nothing but the standard library."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

ONNX = "onnx"
TORCHSCRIPT = "torchscript"
EXPORTED_PROGRAM = "exported-program"
FORMATS = (ONNX, TORCHSCRIPT, EXPORTED_PROGRAM)

# The extension that names each format; the first one is the format's usual name.
EXTENSIONS: dict[str, tuple[str, ...]] = {
    ONNX: (".onnx",),
    TORCHSCRIPT: (".ts", ".pt"),
    EXPORTED_PROGRAM: (".pt2",),
}
RUNTIMES = {
    ONNX: "onnxruntime",
    TORCHSCRIPT: "torch.jit.load",
    EXPORTED_PROGRAM: "torch.export.load",
}


def all_extensions() -> list[str]:
    return [ext for exts in EXTENSIONS.values() for ext in exts]


def format_of_extension(path: str | os.PathLike) -> str | None:
    suffix = Path(path).suffix.lower()
    for name, extensions in EXTENSIONS.items():
        if suffix in extensions:
            return name
    return None


# The entries at the top of torch.export.save's archive in older torch (2.4's), whose archives
# have no folder and no `archive_format`: the program and its `version` (what torch.export.load
# itself looks for in such a file)
_FLAT_EXPORTED_PROGRAM = ("serialized_exported_program.json", "version")


def _archive_names(source: Path) -> list[str] | None:
    try:
        with zipfile.ZipFile(source) as archive:
            return archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return None


def sniff_format(path: str | os.PathLike) -> str | None:
    """The format of an exported file, from its extension (.onnx, unless the file is a zip
    archive or a pickle: a PyTorch file of that name, read as what it holds) or its zip
    archive's entries (TorchScript holds `code/`; torch.export's `archive_format` in a folder,
    or, written by an older torch such as 2.4, `serialized_exported_program.json` and
    `version` at the top); None for anything else (a checkpoint, a state dict, a file that is
    not there)."""
    source = Path(path)
    if not source.is_file():
        return None
    names = _archive_names(source)
    if source.suffix.lower() == ".onnx" and names is None and not _a_pickle(source):
        return ONNX  # a zip archive or a pickle is a PyTorch file, whatever its name says
    if names is None:
        return None
    entries = {name.split("/", 1)[1] for name in names if "/" in name}
    if "archive_format" in entries or in_older_torch_layout(names):
        return EXPORTED_PROGRAM
    if "constants.pkl" in entries or any(name.startswith("code/") for name in entries):
        return TORCHSCRIPT
    return None


def _a_pickle(source: Path) -> bool:
    """Whether `source` starts as a pickle of protocol 2 or later does (torch.save's format
    before zip archives); no ONNX model does (its first field is never number 16)."""
    try:
        with open(source, "rb") as handle:
            first = handle.read(2)
    except OSError:
        return False
    return len(first) == 2 and first[0] == 0x80 and 2 <= first[1] <= 5


def in_older_torch_layout(source: str | os.PathLike | list[str]) -> bool:
    """Whether a torch.export archive (a path, or its entries' names) is in older torch's
    layout (2.4's: its entries at the top), which later torch no longer reads."""
    names = source if isinstance(source, list) else _archive_names(Path(source))
    return names is not None and all(name in names for name in _FLAT_EXPORTED_PROGRAM)
