"""A restricted unpickler for data files such as the CIFAR python batches.

`pickle.load` runs whatever callable a file names, so a crafted "dataset" can execute code. This
unpickler resolves only the few globals that plain containers and NumPy arrays need; anything
else (os.system, builtins.eval, arbitrary classes) is refused before it is called.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

from torchkit.core.io.errors import InputError


class RefusedPickleError(pickle.UnpicklingError):
    """The pickle names a global that is not on the allow-list."""


def _latin1_encode(text: str, encoding: str = "latin1") -> bytes:
    """`_codecs.encode`, which Python 3 pickles (protocol < 3) use for bytes, limited to latin1:
    other codecs (zlib, bz2, ...) are not needed for data and could inflate a small file."""
    if encoding.replace("-", "").replace("_", "").lower() not in ("latin1", "iso88591"):
        raise RefusedPickleError(f"the pickle asks for the codec {encoding!r}")
    return text.encode("latin1")


def _checked_array_type() -> type:
    """The ndarray subclass the pickles' arrays are built as: NumPy trusts an array's pickled
    state, so an object array whose state lists fewer items than its shape crashes the process
    (segmentation fault), and an empty array may be given any shape (gigabytes from a few
    bytes). Only arrays of plain values, as large as the data the pickle holds, are built."""
    import numpy as np

    class CheckedArray(np.ndarray):
        def __setstate__(self, state: Any) -> None:
            dtype = state[2] if isinstance(state, tuple) and len(state) == 5 else None
            if not isinstance(dtype, np.dtype) or dtype.hasobject:
                raise RefusedPickleError("it builds an array of Python objects")
            super().__setstate__(state)
            if self.dtype.hasobject:
                raise RefusedPickleError("it builds an array of Python objects")

    return CheckedArray


def _allowed_globals() -> dict[tuple[str, str], Any]:
    import numpy as np

    try:  # NumPy 2
        from numpy._core import multiarray, numeric
    except ImportError:  # NumPy 1 (pyproject allows 1.24)
        from numpy.core import multiarray, numeric

    checked_array = _checked_array_type()

    def reconstruct(subtype: Any, shape: Any, dtype: Any) -> Any:
        # NumPy pickles an array as an empty one, then its state (shape, dtype and data).
        if subtype is not checked_array or tuple(shape) != (0,):
            raise RefusedPickleError("it builds an array without its data")
        return multiarray._reconstruct(subtype, shape, dtype)

    allowed: dict[tuple[str, str], Any] = {
        ("numpy", "ndarray"): checked_array,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): _latin1_encode,
    }
    # Python 2 / NumPy 1 pickles (the real CIFAR files) say numpy.core, NumPy 2 says numpy._core.
    for package in ("numpy.core", "numpy._core"):
        allowed[(f"{package}.multiarray", "_reconstruct")] = reconstruct
        allowed[(f"{package}.multiarray", "scalar")] = multiarray.scalar
        allowed[(f"{package}.numeric", "_frombuffer")] = numeric._frombuffer
    return allowed


class RestrictedUnpickler(pickle.Unpickler):
    """Builds only dicts, lists, tuples, strings, bytes, numbers and NumPy arrays/scalars."""

    def __init__(self, file, **kwargs) -> None:
        super().__init__(file, **kwargs)
        self._allowed = _allowed_globals()

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._allowed[(module, name)]
        except KeyError:
            raise RefusedPickleError(f"it tries to build {module}.{name}") from None

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedPickleError("it refers to persistent objects")


def restricted_loads(data: bytes, *, source: str = "pickle") -> Any:
    """Unpickle `data` (Python 2 strings read as latin1, as NumPy needs for its arrays).

    Raises InputError naming `source` when the pickle is refused, truncated or corrupt.
    """
    try:
        return RestrictedUnpickler(io.BytesIO(data), encoding="latin1").load()
    except RefusedPickleError as error:
        raise InputError(
            f"refused to unpickle {source}: {error}",
            "it holds more than the dicts, lists, bytes and arrays of a dataset; "
            "it may be malicious",
        ) from None
    except (
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        TypeError,
        IndexError,
        KeyError,
        AttributeError,
    ) as error:
        raise InputError(
            f"cannot unpickle {source}: {error or type(error).__name__}",
            "the file is truncated or corrupt",
        ) from None
