"""A checkpoint's plain values (epoch, arch, classes, history) without building its tensors.

`train --resume` asks whether a best.pt holds the resumed run's best epoch. Reading it with
`torch.load(..., weights_only=True, mmap=True)` still unpickles every tensor header of the
weights and the optimiser state (about 0.1 s for googlenet with SGD, more for bigger models)
only to look at a few small values. A torch.save file is a zip whose `<name>/data.pkl` record
holds the pickled structure, with tensors as references to the other records: this reads that
record alone, through an unpickler that calls nothing: the tensor rebuilders and storage types
torch.save names become an inert `Opaque`, and so do the storages (whose records must be in the
archive); dict, list and the other built-in values come out as they are, and OrderedDict. The
caller gets None (and reads the file with torch.load as before) where the file is not such a
zip, the pickle names anything else, or a value it asks for holds anything opaque: the answer
is the same either way, and nothing in the file is ever executed.
"""

from __future__ import annotations

import collections
import io
import pickle
import zipfile
from pathlib import Path
from typing import Any

PICKLE_RECORD = "data.pkl"
MAX_RECORD_BYTES = 64 * 1024 * 1024  # the structure only: far beyond any checkpoint's


class Opaque:
    """Whatever the pickle names or builds beyond plain values: accepts every call and every
    state, holds nothing, runs nothing."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Opaque:
        return object.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, value: Any) -> None:
        pass

    def extend(self, values: Any) -> None:
        pass


# What torch.save writes for tensors (and Parameters) besides plain values; any other name
# sends the file to torch.load's weights_only unpickler, which decides whether it may be read.
TENSOR_GLOBALS = {
    ("torch._utils", "_rebuild_tensor_v2"),
    ("torch._utils", "_rebuild_parameter"),
    ("torch._utils", "_rebuild_parameter_with_state"),
    ("torch.storage", "UntypedStorage"),
}


class _InertUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, records: set[str]) -> None:
        super().__init__(io.BytesIO(data))
        self.records = records  # the names of the archive's data records

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        storage = module == "torch" and name.endswith("Storage")
        if storage or (module, name) in TENSOR_GLOBALS:
            return Opaque
        raise pickle.UnpicklingError(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Opaque:
        # ('storage', type, key, location, numel): a storage whose record must be there
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise pickle.UnpicklingError("unknown persistent id")
        if f"data/{pid[2]}" not in self.records:
            raise pickle.UnpicklingError(f"no record of storage {pid[2]!r}")
        return Opaque()


def plain_values(path: Path, keys: tuple[str, ...]) -> dict[str, Any] | None:
    """The values of those of `keys` it has, of the dict torch.save wrote to `path`, or None
    where they cannot be read this way exactly (see module doc)."""
    try:
        with zipfile.ZipFile(path) as archive:
            record = _pickle_record(archive, MAX_RECORD_BYTES)
            if record is None:
                return None
            data = archive.read(record)
            prefix = record.filename.split("/")[0] + "/"
            stored = {
                info.filename.removeprefix(prefix)
                for info in archive.infolist()
                if info.filename.startswith(prefix)
            }
        saved = _InertUnpickler(data, stored).load()
        if not isinstance(saved, dict):
            return None
        values = {key: saved[key] for key in keys if key in saved}
        return None if _holds_opaque(values) else values
    except Exception:  # not a zip of torch.save's, or a pickle this reader does not take
        return None


def is_torchkit_checkpoint_file(path: Path) -> bool:
    """Whether `path` is a checkpoint torchkit wrote: torch.save's zip whose pickle names the
    keys every torchkit checkpoint has (`torchkit_version`, `format_version`). Its bytes are
    looked at, never unpickled: the pickle holds the keys and the tensors' references, not
    their data."""
    try:
        with zipfile.ZipFile(path) as archive:
            record = _pickle_record(archive, MAX_CHECKPOINT_PICKLE_BYTES)
            if record is None:
                return False
            data = archive.read(record)
    except (OSError, zipfile.BadZipFile, ValueError, RuntimeError, EOFError):
        return False
    return b"torchkit_version" in data and b"format_version" in data


MAX_CHECKPOINT_PICKLE_BYTES = 256 << 20  # keys and references: a limit no checkpoint reaches


def _pickle_record(archive: zipfile.ZipFile, limit: int) -> zipfile.ZipInfo | None:
    """torch.save's `<name>/data.pkl` record of `archive`, where it has one, of at most `limit`
    bytes unpacked (a zip bomb is not read)."""
    records = [
        info
        for info in archive.infolist()
        if info.filename.count("/") == 1 and info.filename.endswith("/" + PICKLE_RECORD)
    ]
    if len(records) != 1 or records[0].file_size > limit:
        return None
    return records[0]


def _holds_opaque(value: Any) -> bool:
    if isinstance(value, Opaque):
        return True
    if isinstance(value, dict):
        return any(_holds_opaque(k) or _holds_opaque(v) for k, v in value.items())
    if isinstance(value, list | tuple | set | frozenset):
        return any(_holds_opaque(each) for each in value)
    return False
