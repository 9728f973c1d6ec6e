"""Pickles of protocols 3 to 5 rewritten in protocol 2's opcodes for torch's weights-only
unpickler (core/models/newer_pickles.py): the same objects, nothing the rewriting lets through."""

from __future__ import annotations

import collections
import io
import pickle
import pickletools

import pytest

from torchkit.core.models.newer_pickles import as_protocol_2

PLAIN = {
    "names": ["a", "a", "b" * 300, "é\udcff"],  # repeated (memo), long, non-ASCII, a surrogate
    "numbers": (1, -2, 2**40, 2**70, 1.5, None, True, False),
    "nested": collections.OrderedDict(x=collections.OrderedDict(y=[{}])),
    "empty": ((), [], {}, b""),
    "bytes": [b"\x00\xff", b"x" * 300],
}


@pytest.mark.parametrize("protocol", [3, 4, 5])
def test_a_newer_pickle_is_the_same_objects_in_protocol_2_opcodes(protocol):
    rewritten = as_protocol_2(io.BytesIO(pickle.dumps(PLAIN, protocol=protocol)))
    assert {opcode.proto for opcode, _, _ in pickletools.genops(rewritten)} <= {0, 1, 2}
    assert pickle.loads(rewritten) == PLAIN
    # Two classes of one module: the module's name comes from the memo the second time.
    pair = (collections.OrderedDict(), collections.Counter())
    assert pickle.loads(as_protocol_2(io.BytesIO(pickle.dumps(pair, protocol=4)))) == pair


def test_the_rewriting_reads_one_pickle_and_no_further():
    """torch's legacy format keeps other pickles and its tensors' bytes after each one."""
    stream = io.BytesIO(pickle.dumps([1], protocol=4) + b"raw tensor bytes")
    assert pickle.loads(as_protocol_2(stream)) == [1]
    assert stream.read() == b"raw tensor bytes"


@pytest.mark.parametrize(
    ("stream", "message"),
    [
        # A global named by what is not two strings (a number, a list built on the stack).
        (b"\x80\x04K\x01K\x02\x93.", "STACK_GLOBAL of values that are not strings"),
        (b"\x80\x04\x8c\x01a]\x93.", "STACK_GLOBAL of values that are not strings"),
        # A name that would end protocol 2's GLOBAL line early and name another global.
        (b"\x80\x04\x8c\x05os\nxy\x8c\x06system\x93.", "names with a line break"),
        # A set's items and out-of-band buffers, which are not rewritten.
        (b"\x80\x04\x8f(K\x01\x90.", r"Unsupported operand 144 \(ADDITEMS\)"),
        (b"\x80\x05\x97.", r"Unsupported operand 151 \(NEXT_BUFFER\)"),
        (b"\x80\x04K\x01", "exhausted before seeing STOP"),
    ],
    ids=["number", "list", "line-break", "set", "buffer", "truncated"],
)
def test_what_protocol_2_cannot_say_is_refused(stream, message):
    with pytest.raises(pickle.UnpicklingError, match=message):
        as_protocol_2(io.BytesIO(stream))
