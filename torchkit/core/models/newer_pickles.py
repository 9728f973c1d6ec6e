"""torch.save files pickled with protocol 3, 4 or 5 (`pickle_protocol=4`), read as safely as
`torch.load(..., weights_only=True)` reads protocol 2.

torch's weights-only unpickler knows the opcodes of protocol 2 only: a file of protocol 4 fails
on its first FRAME ("Unsupported operand 149"), one of protocol 3 on its first bytes. Protocols
3 to 5 add no way to build anything: only compacter spellings of what protocol 2 says (frames,
an implicit memo index, a class named by two strings on the stack, short strings, bytes). Each
pickle is therefore rewritten in protocol 2's opcodes as it is read (bytes as protocol 2 writes
them, through `_codecs.encode`), and that stream is what torch's own weights-only unpickler
reads, with its allow-list, its checks and the safe classes allowed to it: a global it refuses
in protocol 2 it refuses here, and nothing outside the allow-list is imported or called. An
opcode not rewritten (a set's items, out-of-band buffers) is refused, as the weights-only
unpickler refuses what it does not know.
"""

from __future__ import annotations

import io
import os
import pickle
import pickletools
import struct
import types
from typing import Any, BinaryIO

# Opcodes the weights-only unpickler reads, passed on byte for byte.
_PASSED = frozenset(
    [
        "NEWOBJ", "REDUCE", "BUILD", "APPEND", "APPENDS", "SETITEM", "SETITEMS", "MARK",
        "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "NONE", "NEWFALSE", "NEWTRUE", "EMPTY_TUPLE",
        "EMPTY_LIST", "EMPTY_DICT", "EMPTY_SET", "BININT", "BININT1", "BININT2", "BINFLOAT",
        "SHORT_BINSTRING", "BINPERSID", "LONG1", "BINGET", "LONG_BINGET", "GLOBAL",
    ]
)  # fmt: skip
_STRINGS = frozenset(["SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8"])
_BYTES = frozenset(["SHORT_BINBYTES", "BINBYTES", "BINBYTES8"])
_MEMO_PUTS = frozenset(["MEMOIZE", "BINPUT", "LONG_BINPUT"])
_MEMO_GETS = frozenset(["BINGET", "LONG_BINGET"])


class _RecordedReads:
    """A file whose bytes read are kept until taken: the bytes of the opcode just parsed."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file
        self._taken = bytearray()

    def read(self, size: int = -1) -> bytes:
        data = self._file.read(size)
        self._taken += data
        return data

    def readline(self) -> bytes:
        line = self._file.readline()
        self._taken += line
        return line

    def take(self) -> bytes:
        data = bytes(self._taken)
        self._taken.clear()
        return data


def _unicode(text: str) -> bytes:
    data = text.encode("utf-8", "surrogatepass")
    return pickle.BINUNICODE + struct.pack("<I", len(data)) + data


def as_protocol_2(file: BinaryIO) -> bytes:
    """The next pickle of `file`, read up to its STOP and no further (torch's legacy format
    keeps its tensors' bytes after it), in protocol 2's opcodes.

    Strings are held back until it is known whether a STACK_GLOBAL takes them (as protocol 2's
    GLOBAL names its module and class inline); strings kept in the memo are resolved here and
    written again where they are fetched. Raises pickle.UnpicklingError for an opcode protocol
    2 cannot say, as the weights-only unpickler does."""
    recorded = _RecordedReads(file)
    written = bytearray()
    pending: list[str] = []  # strings pushed, not yet written: maybe a global's names
    memo_strings: dict[int, str] = {}
    memo_indexes: set[int] = set()

    def write_pending(strings: list[str]) -> None:
        for text in strings:
            written.extend(_unicode(text))

    try:
        for opcode, argument, _ in pickletools.genops(recorded):
            raw = recorded.take()
            name = opcode.name
            if name == "PROTO":
                written.extend(pickle.PROTO + b"\x02")
            elif name == "FRAME":
                continue
            elif name in _STRINGS:
                pending.append(argument)
            elif name in _MEMO_GETS and argument in memo_strings:
                pending.append(memo_strings[argument])
            elif name in _MEMO_PUTS:
                index = len(memo_indexes) if name == "MEMOIZE" else argument
                memo_indexes.add(index)
                if pending:  # the string on top of the stack
                    memo_strings[index] = pending[-1]
                else:
                    memo_strings.pop(index, None)
                    written.extend(pickle.LONG_BINPUT + struct.pack("<I", index))
            elif name == "STACK_GLOBAL":
                if len(pending) < 2:
                    raise pickle.UnpicklingError("STACK_GLOBAL of values that are not strings")
                module, qualname = pending[-2:]
                if "\n" in module or "\n" in qualname:
                    raise pickle.UnpicklingError("STACK_GLOBAL of names with a line break")
                write_pending(pending[:-2])
                pending.clear()
                global_names = f"{module}\n{qualname}\n".encode("utf-8", "surrogatepass")
                written.extend(pickle.GLOBAL + global_names)
            elif name in _BYTES:  # as protocol 2 says bytes: _codecs.encode(text, "latin1")
                write_pending(pending)
                pending.clear()
                written.extend(pickle.GLOBAL + b"_codecs\nencode\n")
                written.extend(_unicode(argument.decode("latin1")) + _unicode("latin1"))
                written.extend(pickle.TUPLE2 + pickle.REDUCE)
            elif name in _PASSED:
                write_pending(pending)
                pending.clear()
                written.extend(raw)
            elif name == "STOP":
                write_pending(pending)
                written.extend(pickle.STOP)
                return bytes(written)
            else:
                raise pickle.UnpicklingError(f"Unsupported operand {ord(opcode.code)} ({name})")
    except ValueError as error:  # genops: an unknown opcode, or the file ends before STOP
        raise pickle.UnpicklingError(str(error)) from None
    raise EOFError


def _weights_only_unpickler() -> type:
    from torch import _weights_only_unpickler

    class NewerProtocolUnpickler(_weights_only_unpickler.Unpickler):
        """torch's weights-only unpickler, reading the next pickle of `file` as protocol 2."""

        def __init__(self, file: BinaryIO, **kwargs: Any) -> None:
            super().__init__(io.BytesIO(as_protocol_2(file)), **kwargs)

    return NewerProtocolUnpickler


def _pickle_module() -> types.ModuleType:
    """What torch.load's `pickle_module` must offer: a `__name__`, `Unpickler` and `load`."""
    module = types.ModuleType(f"{__name__}.protocol_2")
    module.Unpickler = _weights_only_unpickler()
    module.load = lambda file, **kwargs: module.Unpickler(file, **kwargs).load()
    return module


def load_newer_protocol(file: Any) -> Any:
    """torch.load of a torch.save file of pickle protocol 3, 4 or 5 (zip or legacy format), on
    the CPU, through the weights-only unpickler (`as_protocol_2`). Sparse tensors are checked as
    a weights-only load checks them (their indices within their size), which torch.load does
    only when told to where it is given its pickle module."""
    import torch

    # TORCH_FORCE_WEIGHTS_ONLY_LOAD=1 asks for weights-only loads, which this is; torch would
    # refuse it ("Can not safely load weights when explicit pickle_module is specified").
    forced = os.environ.pop(_FORCE_WEIGHTS_ONLY, None)
    try:
        with torch.sparse.check_sparse_tensor_invariants():
            module = _pickle_module()
            return torch.load(file, map_location="cpu", weights_only=False, pickle_module=module)
    finally:
        if forced is not None:
            os.environ[_FORCE_WEIGHTS_ONLY] = forced


_FORCE_WEIGHTS_ONLY = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
