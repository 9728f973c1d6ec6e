"""CIFAR's python batches as the real files hold them: Python 2's cPickle protocol, and the
rows' plane order."""

from __future__ import annotations

import struct

import numpy as np


def py2_pickle(obj) -> bytes:
    """Protocol 2 as Python 2's cPickle wrote the real CIFAR batches: str as (SHORT_)BINSTRING,
    arrays through numpy.core.multiarray._reconstruct with the raw bytes in a string."""
    out = bytearray(b"\x80\x02")

    def string(data: bytes) -> None:
        if len(data) < 256:
            out.extend(b"U" + bytes([len(data)]) + data)
        else:
            out.extend(b"T" + struct.pack("<i", len(data)) + data)

    def integer(value: int) -> None:
        if 0 <= value < 256:
            out.extend(b"K" + bytes([value]))
        else:
            out.extend(b"J" + struct.pack("<i", value))

    def emit(o) -> None:
        if isinstance(o, dict):
            out.extend(b"}(")
            for key, value in o.items():
                emit(key)
                emit(value)
            out.extend(b"u")
        elif isinstance(o, list):
            out.extend(b"](")
            for value in o:
                emit(value)
            out.extend(b"e")
        elif isinstance(o, bytes):
            string(o)
        elif isinstance(o, int):
            integer(o)
        elif isinstance(o, np.ndarray):
            out.extend(
                b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85U\x01b\x87R"
            )
            out.extend(b"(K\x01(")
            for dim in o.shape:
                integer(dim)
            out.extend(b"tcnumpy\ndtype\nU\x02u1K\x00K\x01\x87R")
            out.extend(b"(K\x03U\x01|NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb\x89")
            string(o.tobytes())
            out.extend(b"tb")
        else:
            raise TypeError(type(o))

    emit(obj)
    return bytes(out + b".")


def cifar_rows(images: np.ndarray) -> np.ndarray:
    """(N, 32, 32, 3) -> (N, 3072): the red plane row-major, then green, then blue (the format
    description on the CIFAR page)."""
    planes = [images[..., c].reshape(len(images), -1) for c in range(3)]
    return np.concatenate(planes, axis=1)
