"""`torch.utils.flop_counter` imported without triton: 0.35-0.5 s of CPU of every summary.

flop_counter imports `triton.runtime.jit` at module level only to have `JITFunction` for one
isinstance check (register_flop_formula's of its targets), which loads triton's compiler and
libtriton. No object is a JITFunction before triton is loaded, so while flop_counter's module
runs, its own `from triton.runtime.jit import JITFunction` is answered with a class whose
isinstance and issubclass checks answer from the real JITFunction once triton is loaded and
are False before. Only that one import statement of flop_counter's is answered so (an
`__import__` that hands every other import to the one it replaced, taken out when the import
ends): the stand-in never enters sys.modules, and no other code, in this thread or another,
ever sees it. Nothing is done once flop_counter or triton is loaded, or where triton is not
installed (flop_counter's own fallback then runs as it is).
"""

from __future__ import annotations

import builtins
import importlib
import importlib.util
import sys
import threading
import types
from typing import Any

FLOP_COUNTER = "torch.utils.flop_counter"
TRITON, TRITON_JIT = "triton", "triton.runtime.jit"


def import_flop_counter() -> types.ModuleType:
    """`torch.utils.flop_counter`, imported (if it is not yet) without triton (module doc)."""
    loaded = sys.modules.get(FLOP_COUNTER)
    if loaded is not None:
        return loaded
    if TRITON in sys.modules or importlib.util.find_spec(TRITON) is None:
        return importlib.import_module(FLOP_COUNTER)
    _install()
    try:
        return importlib.import_module(FLOP_COUNTER)
    finally:
        _uninstall()


class _JITFunctionType(type):
    """Answers isinstance and issubclass from triton's JITFunction once it is loaded."""

    def __instancecheck__(cls, instance: Any) -> bool:
        real = _real_jit_function()
        return real is not None and isinstance(instance, real)

    def __subclasscheck__(cls, subclass: type) -> bool:
        real = _real_jit_function()
        return real is not None and issubclass(subclass, real)


class JITFunction(metaclass=_JITFunctionType):
    """flop_counter's `_JITFunction`: no object is an instance before triton is loaded, and
    triton's JITFunctions are after."""


def _real_jit_function() -> type | None:
    module = sys.modules.get(TRITON_JIT)
    return getattr(module, "JITFunction", None) if module is not None else None


_STAND_IN = types.ModuleType(TRITON_JIT, "flop_counter's view of triton.runtime.jit")
_STAND_IN.JITFunction = JITFunction  # type: ignore[attr-defined]

# Guards the count and builtins.__import__, never an import.
_lock = threading.Lock()
_depth = 0  # imports of flop_counter under way with the hook in place (threads)
_hook: Any = None  # the hook in place, while _depth > 0
_replaced: Any = None  # the __import__ it replaced


def _hook_over(replaced: Any) -> Any:
    """An __import__ that answers flop_counter's import of triton.runtime.jit with the stand-in
    and hands every other import to `replaced`."""

    def hooked_import(
        name: str,
        globals: dict[str, Any] | None = None,  # noqa: A002 (__import__'s own names)
        locals: Any = None,  # noqa: A002
        fromlist: Any = (),
        level: int = 0,
    ) -> Any:
        if (
            name == TRITON_JIT
            and level == 0
            and fromlist
            and globals is not None
            and globals.get("__name__") == FLOP_COUNTER
        ):
            return _STAND_IN
        return replaced(name, globals, locals, fromlist, level)

    return hooked_import


def _install() -> None:
    global _depth, _hook, _replaced
    with _lock:
        if _depth == 0:
            _replaced = builtins.__import__
            _hook = builtins.__import__ = _hook_over(_replaced)
        _depth += 1


def _uninstall() -> None:
    global _depth
    with _lock:
        _depth -= 1
        # An __import__ placed over the hook meanwhile stays (it hands imports on through the
        # hook, which keeps handing them on): only the hook's own placement is undone.
        if _depth == 0 and builtins.__import__ is _hook:
            builtins.__import__ = _replaced
