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
import pickletools
import re
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchkit.core.io.pickle_records import MAX_STRUCTURE_BYTES, pickle_record

MAX_RECORD_BYTES = MAX_STRUCTURE_BYTES


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
            record = pickle_record(archive, MAX_RECORD_BYTES)
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
    """Whether `path` is a checkpoint torchkit wrote: torch.save's zip (one `NAME/` folder of
    records: `data.pkl` stored uncompressed, a `version` of digits, a `byteorder` where the
    torch version writes one, the `data/KEY` record of each storage the pickle refers to)
    whose pickle is a dict with `format_version` (an int) and `torchkit_version` (a str)
    among its own keys. The pickle's opcodes are read (`pickletools.genops`), never
    unpickled: nothing it names is called or imported. A zip that only holds those words
    somewhere (a hand-made `best.pt`) is not one."""
    try:
        with zipfile.ZipFile(path) as archive:
            record = pickle_record(archive, MAX_CHECKPOINT_PICKLE_BYTES)
            # torch.save stores its records as they are: a compressed pickle is not its (and
            # 32 KB of one unpacked to 32 MB of opcodes, 8 s of reading them)
            if record is None or record.compress_type != zipfile.ZIP_STORED:
                return False
            prefix = record.filename.split("/")[0] + "/"
            names = {info.filename for info in archive.infolist()}
            if any(not name.startswith(prefix) for name in names):
                return False
            if not _is_record(archive, names, prefix + "version", _VERSION_RECORD, required=True):
                return False
            if not _is_record(archive, names, prefix + "byteorder", _BYTEORDER_RECORD):
                return False
            data = archive.read(record)
    except (OSError, zipfile.BadZipFile, ValueError, RuntimeError, EOFError):
        return False
    stored = {name.removeprefix(prefix) for name in names}
    try:
        saved, storages = _pickle_shape(data)
    except (ValueError, KeyError, IndexError, TypeError):  # genops' errors, a broken stack
        return False
    return (
        isinstance(saved, _Dict)
        and isinstance(saved.get("format_version"), int)
        and not isinstance(saved.get("format_version"), bool)
        and isinstance(saved.get("torchkit_version"), str)
        and all(f"data/{key}" in stored for key in storages)
    )


MAX_CHECKPOINT_PICKLE_BYTES = 256 << 20  # keys and references: a limit no checkpoint reaches
_VERSION_RECORD = re.compile(rb"[0-9]+\n?")
_BYTEORDER_RECORD = re.compile(rb"little|big")


def _is_record(
    archive: zipfile.ZipFile, names: set[str], name: str, content: re.Pattern, *, required=False
) -> bool:
    """Whether the small record `name` is there (where `required`) and reads as `content`."""
    if name not in names:
        return not required
    info = archive.getinfo(name)
    return info.file_size <= 16 and content.fullmatch(archive.read(info)) is not None


class _Dict:
    """A dict of the pickle read by `_pickle_shape`: its string keys' values (others dropped)."""

    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items: dict[str, Any] = {}

    def set(self, key: Any, value: Any) -> None:
        if isinstance(key, str):
            self.items[key] = value

    def get(self, key: str) -> Any:
        return self.items.get(key)


class _Other:
    """Anything else the pickle builds (a tensor, an OrderedDict, a global): not looked into."""

    __slots__ = ()


_OTHER = _Other()
# Opcodes that push one plain value: their argument (genops') is the value.
_VALUE_OPCODES = frozenset(
    [
        "INT",
        "BININT",
        "BININT1",
        "BININT2",
        "LONG",
        "LONG1",
        "LONG4",
        "STRING",
        "BINSTRING",
        "SHORT_BINSTRING",
        "BINBYTES",
        "SHORT_BINBYTES",
        "BINBYTES8",
        "BYTEARRAY8",
        "UNICODE",
        "SHORT_BINUNICODE",
        "BINUNICODE",
        "BINUNICODE8",
        "FLOAT",
        "BINFLOAT",
    ]
)
_CONSTANTS = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False}


def _pickle_shape(data: bytes) -> tuple[Any, list[str]]:
    """The value a pickle builds, in outline: plain values as they are, lists and tuples of
    them, dicts as `_Dict`, anything built by a call or named by a global as `_Other`; and the
    keys of the storages its persistent ids name (`('storage', type, key, location, numel)`).
    Only the opcodes are read; a pickle that does not end at its STOP, or uses an opcode
    torch.save does not write, raises ValueError."""
    outline = _Outline()
    for opcode, arg, position in pickletools.genops(data):
        name = opcode.name
        if name == "STOP":
            if position + 1 != len(data) or len(outline.stack) != 1 or outline.marks:
                raise ValueError("not one whole pickle")
            return outline.stack[0], outline.storages
        step = _OUTLINE_STEPS.get(name)
        if step is None:  # PERSID, INST, OBJ, EXT*, ...: not what torch.save writes
            raise ValueError(f"opcode {name}")
        step(outline, name, arg)
    raise ValueError("no STOP")


class _Outline:
    """The machine `_pickle_shape` runs: its stack, marks and memo, and the storages named."""

    def __init__(self) -> None:
        self.stack: list[Any] = []
        self.marks: list[int] = []
        self.memo: dict[int, Any] = {}
        self.storages: list[str] = []

    def since_mark(self) -> list[Any]:
        start = self.marks.pop()
        items = self.stack[start:]
        del self.stack[start:]
        return items

    # One method per family of opcodes, each taking the opcode's name and argument.

    def push_value(self, name: str, arg: Any) -> None:
        self.stack.append(arg)

    def push_constant(self, name: str, arg: Any) -> None:
        self.stack.append(_CONSTANTS[name])

    def memo_put(self, name: str, arg: Any) -> None:
        self.memo[arg] = self.stack[-1]

    def memoize(self, name: str, arg: Any) -> None:
        self.memo[len(self.memo)] = self.stack[-1]

    def memo_get(self, name: str, arg: Any) -> None:
        self.stack.append(self.memo[arg])

    def mark(self, name: str, arg: Any) -> None:
        self.marks.append(len(self.stack))

    def empty_dict(self, name: str, arg: Any) -> None:
        self.stack.append(_Dict())

    def empty_sequence(self, name: str, arg: Any) -> None:
        self.stack.append([] if name != "EMPTY_TUPLE" else ())

    def sequence_since_mark(self, name: str, arg: Any) -> None:
        items = self.since_mark()
        self.stack.append(tuple(items) if name == "TUPLE" else items)

    def small_tuple(self, name: str, arg: Any) -> None:
        size = int(name[-1])
        items = tuple(self.stack[-size:])
        del self.stack[-size:]
        self.stack.append(items)

    def dict_since_mark(self, name: str, arg: Any) -> None:
        items = self.since_mark()
        made = _Dict()
        for key, value in zip(items[::2], items[1::2], strict=True):
            made.set(key, value)
        self.stack.append(made)

    def set_item(self, name: str, arg: Any) -> None:
        value, key = self.stack.pop(), self.stack.pop()
        _set_items(self.stack[-1], [key, value])

    def set_items(self, name: str, arg: Any) -> None:
        _set_items_after(self.stack, self.since_mark())

    def append(self, name: str, arg: Any) -> None:
        self.stack.pop()
        _require_list(self.stack[-1])

    def appends(self, name: str, arg: Any) -> None:
        self.since_mark()
        _require_list(self.stack[-1])

    def global_(self, name: str, arg: Any) -> None:
        if name == "STACK_GLOBAL":
            del self.stack[-2:]
        self.stack.append(_OTHER)

    def call(self, name: str, arg: Any) -> None:
        """REDUCE and NEWOBJ take a callable and its arguments, NEWOBJ_EX also keywords."""
        del self.stack[-3 if name == "NEWOBJ_EX" else -2 :]
        self.stack.append(_OTHER)

    def build(self, name: str, arg: Any) -> None:
        self.stack.pop()
        if not isinstance(self.stack[-1], _Other):
            raise ValueError("BUILD of a plain value")

    def persistent_id(self, name: str, arg: Any) -> None:
        pid = self.stack.pop()
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise ValueError("a persistent id torch.save does not write")
        self.storages.append(str(pid[2]))
        self.stack.append(_OTHER)

    def pop(self, name: str, arg: Any) -> None:
        self.stack.pop()

    def pop_mark(self, name: str, arg: Any) -> None:
        self.since_mark()

    def dup(self, name: str, arg: Any) -> None:
        self.stack.append(self.stack[-1])

    def framing(self, name: str, arg: Any) -> None:
        pass


# The opcodes torch.save writes (STOP aside, which `_pickle_shape` reads itself), each with
# its step of `_Outline`.
_OUTLINE_STEPS: dict[str, Callable[[_Outline, str, Any], None]] = {
    **dict.fromkeys(_VALUE_OPCODES, _Outline.push_value),
    **dict.fromkeys(_CONSTANTS, _Outline.push_constant),
    **dict.fromkeys(("BINPUT", "LONG_BINPUT", "PUT"), _Outline.memo_put),
    "MEMOIZE": _Outline.memoize,
    **dict.fromkeys(("BINGET", "LONG_BINGET", "GET"), _Outline.memo_get),
    "MARK": _Outline.mark,
    "EMPTY_DICT": _Outline.empty_dict,
    **dict.fromkeys(("EMPTY_LIST", "EMPTY_TUPLE", "EMPTY_SET"), _Outline.empty_sequence),
    **dict.fromkeys(("TUPLE", "LIST", "FROZENSET"), _Outline.sequence_since_mark),
    **dict.fromkeys(("TUPLE1", "TUPLE2", "TUPLE3"), _Outline.small_tuple),
    "DICT": _Outline.dict_since_mark,
    "SETITEM": _Outline.set_item,
    "SETITEMS": _Outline.set_items,
    "APPEND": _Outline.append,
    **dict.fromkeys(("APPENDS", "ADDITEMS"), _Outline.appends),
    **dict.fromkeys(("GLOBAL", "STACK_GLOBAL"), _Outline.global_),
    **dict.fromkeys(("REDUCE", "NEWOBJ", "NEWOBJ_EX"), _Outline.call),
    "BUILD": _Outline.build,
    "BINPERSID": _Outline.persistent_id,
    "POP": _Outline.pop,
    "POP_MARK": _Outline.pop_mark,
    "DUP": _Outline.dup,
    **dict.fromkeys(("PROTO", "FRAME"), _Outline.framing),
}


def _set_items_after(stack: list[Any], items: list[Any]) -> None:
    if len(items) % 2:
        raise ValueError("a key without a value")
    _set_items(stack[-1], items)


def _set_items(target: Any, items: list[Any]) -> None:
    """SETITEM(S) into `target`: a dict of the pickle's own, or one built by a call."""
    if isinstance(target, _Dict):
        for key, value in zip(items[::2], items[1::2], strict=True):
            target.set(key, value)
    elif not isinstance(target, _Other):
        raise ValueError("items set into a plain value")


def _require_list(target: Any) -> None:
    if not isinstance(target, list | _Other):
        raise ValueError("items appended to something else")


def _holds_opaque(value: Any) -> bool:
    if isinstance(value, Opaque):
        return True
    if isinstance(value, dict):
        return any(_holds_opaque(k) or _holds_opaque(v) for k, v in value.items())
    if isinstance(value, list | tuple | set | frozenset):
        return any(_holds_opaque(each) for each in value)
    return False
