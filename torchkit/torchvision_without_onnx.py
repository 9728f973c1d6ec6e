"""torchvision imported without torch.onnx: about 0.3 s of every process that imports torchvision.

`torchvision.ops` registers its operators' ONNX symbolics (nms, roi_align, roi_pool) as it is
imported (`torchvision.ops._register_onnx_ops`), which imports torch.onnx and its TorchScript
exporter's opset modules, in every process that imports torchvision: train on image folders
(its transforms), extract-features (its tracer), a torchvision model's build. Only an ONNX export
reads those symbolics. So while `torchvision.ops` runs for the first time and torch.onnx is not
loaded, a stand-in answers `_register_custom_op` with a function that notes the registration
as owed; when torch.onnx is imported later in the process (export, or anything else), the real
module is imported right after it and registers them, so torch.onnx never runs without them.
Any other name asked of the stand-in imports the real module (and registers) at once. Nothing is
done once torch.onnx is loaded.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

from torchkit.import_hooks import WrappingFinder
from torchkit.stand_ins import StandInModule, StandInsWhileRunning

ONNX, OPS, REGISTER = "torch.onnx", "torchvision.ops", "torchvision.ops._register_onnx_ops"
# Names the stand-in was asked for and did not have (each imported the real module).
missing: list[str] = []
_owed = threading.Event()  # torchvision's symbolics wait for torch.onnx's import
_importing = threading.local()  # `_real`'s import runs in this thread


def install() -> None:
    """Import torchvision.ops without torch.onnx from now on in this process (module doc);
    before torchvision is first imported."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def onnx_loaded() -> bool:
    return ONNX in sys.modules


def registration_owed() -> bool:
    """Whether torchvision's ONNX symbolics wait for torch.onnx's import."""
    return _owed.is_set()


class _Finder(WrappingFinder):
    """Finds torchvision.ops, which runs with the stand-in, and torch.onnx while torchvision's
    symbolics are owed, after whose import they are registered."""

    def wants(self, name: str) -> bool:
        return (name == OPS and not onnx_loaded()) or (name == ONNX and _owed.is_set())

    def running(self, module: types.ModuleType) -> contextlib.AbstractContextManager[None]:
        return _STAND_IN.running() if module.__name__ == OPS else _registered_after()


@contextlib.contextmanager
def _registered_after() -> Iterator[None]:
    yield  # torch.onnx imported: its failed import registers nothing (it raised)
    if _owed.is_set() and not getattr(_importing, "now", False):
        _real(REGISTER)


def _register_custom_op() -> None:
    """torchvision's registration of its ONNX symbolics, at torch.onnx's import (module doc)."""
    if onnx_loaded():
        _real(REGISTER)
    else:
        _owed.set()


def _place() -> None:
    stand_in = StandInModule(REGISTER, _real, missing)
    stand_in._register_custom_op = _register_custom_op
    sys.modules[REGISTER] = stand_in


def _remove() -> None:
    if isinstance(sys.modules.get(REGISTER), StandInModule):
        del sys.modules[REGISTER]


_STAND_IN = StandInsWhileRunning(_place, _remove, onnx_loaded)


def _real(name: str) -> Any:
    """The real `torchvision.ops._register_onnx_ops`, imported now, its symbolics registered if
    they are owed (the stand-in taken out first)."""
    _STAND_IN.remove_now()
    # Its import imports torch.onnx, whose hook must not ask for this module, half made then:
    # the symbolics owed (by it, or by torchvision.ops imported first) are registered below.
    _importing.now = True
    try:
        module = importlib.import_module(name)
    finally:
        _importing.now = False
    if _owed.is_set():
        _owed.clear()
        module._register_custom_op()
    return module
