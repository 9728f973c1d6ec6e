"""torchvision imported without torch._dynamo: about 2 s of every process that uses torchvision.

`import torchvision` imports torch._dynamo (and with it inductor and sympy) for two names, in
processes that never compile. `torchvision.ops.roi_align` imports `is_compile_supported` from
`torch._dynamo.utils`, and calls it only when torchvision's C++ operators are missing or a GPU runs
deterministic. `torchvision.tv_tensors` decorates `wrap` with `torch.compiler.disable`, which asks
`torch._dynamo.disable`. So while a torchvision module runs for the first time, stand-ins for
those two modules answer those names:
- `is_compile_supported` imports the real one when it is called;
- `disable(fn)` gives a function that calls `fn` itself while dynamo is not loaded (nothing is
  being compiled then), and dynamo's disabled version of `fn` once it is.
Any other name asked of a stand-in imports the real dynamo and answers from it, so a torchvision
that needs more only loses the saving. The stand-ins leave sys.modules when the module's import
ends, and `torch.compile` later in the process imports the real dynamo as usual. Nothing is done
once dynamo is loaded. (The same saving for torch.optim: `core.runtime.dynamo_free`; and for
DistributedDataParallel, which asks `get_optimize_ddp_mode`: `core.train.ddp.wrap_ddp`.)

timm's modules run with the stand-ins too: timm decorates model methods with
`torch.compiler.disable` as its model modules are imported (`timm.layers.disable_compiler`, in
timm.models.naflexvit and others), which loaded dynamo in every process that names a timm model,
even `train --print-config`, which only reads a tag's pretrained config from timm's registry
(about half of `import timm`'s time).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
import types
from collections.abc import Callable
from typing import Any

from torchkit.import_hooks import WrappingFinder
from torchkit.stand_ins import StandInModule, StandInsWhileRunning

DYNAMO, DYNAMO_UTILS = "torch._dynamo", "torch._dynamo.utils"
# Names the stand-ins were asked for and did not have (each made the real dynamo load).
missing: list[str] = []


def install() -> None:
    """Import torchvision's modules without torch._dynamo from now on in this process (module
    doc); before torchvision is first imported."""
    if DYNAMO in sys.modules or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Finder())


# The packages whose modules are imported with the stand-ins (module doc).
PACKAGES = ("torchvision", "timm")


class _Finder(WrappingFinder):
    """Finds torchvision's and timm's modules as the other finders do; each runs with the
    stand-ins."""

    def wants(self, name: str) -> bool:
        ours = name.partition(".")[0] in PACKAGES
        return ours and not dynamo_loaded()  # once it is loaded, nothing to save

    def running(self, module: types.ModuleType) -> contextlib.AbstractContextManager[None]:
        return without_dynamo()


def without_dynamo() -> contextlib.AbstractContextManager[None]:
    """Run a block with the stand-ins in place, unless dynamo is loaded: a torchvision module's
    import, or torch code whose functions wrapped in `torch._disable_dynamo` (the
    `__torch_dispatch__` of every TorchDispatchMode, torch._refs' references) would import
    dynamo on their first call (summary's FLOP count: `disable` below defers it)."""
    return _STAND_INS.running()


def _placed() -> bool:
    return isinstance(sys.modules.get(DYNAMO), StandInModule)


def _place() -> None:
    package, utils = (
        StandInModule(DYNAMO, _real, missing),
        StandInModule(DYNAMO_UTILS, _real, missing),
    )
    package.__dict__.update(__path__=[], disable=disable, utils=utils)
    utils.is_compile_supported = is_compile_supported
    utils.get_optimize_ddp_mode = get_optimize_ddp_mode
    sys.modules[DYNAMO], sys.modules[DYNAMO_UTILS] = package, utils


def _remove() -> None:
    for name in (DYNAMO_UTILS, DYNAMO):
        if isinstance(sys.modules.get(name), StandInModule):
            del sys.modules[name]
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(torch.__dict__.get("_dynamo"), StandInModule):
        del torch._dynamo


_STAND_INS = StandInsWhileRunning(_place, _remove, lambda: dynamo_loaded())  # dynamo's


def _real(name: str) -> types.ModuleType:
    """The real dynamo module `name`, imported now (the stand-ins taken out first)."""
    _STAND_INS.remove_now()
    return importlib.import_module(name)


def is_compile_supported(device_type: Any) -> Any:
    """torch._dynamo.utils.is_compile_supported, imported when called."""
    return _real(DYNAMO_UTILS).is_compile_supported(device_type)


def get_optimize_ddp_mode() -> str:
    """torch._dynamo.utils.get_optimize_ddp_mode while dynamo is not loaded: the mode of its
    config's default (`optimize_ddp = True`), which nothing can have changed without loading
    it. DDP's constructor asks it (the C++ reducer, not the one compiled DDP runs)."""
    return "ddp_optimizer"


def disable(fn: Callable | None = None, recursive: bool = True, **options: Any) -> Any:
    """torch._dynamo.disable, deferred: `fn` as it is while dynamo is not loaded, dynamo's
    disabled `fn` once it is (made once)."""
    if fn is None:
        return functools.partial(disable, recursive=recursive, **options)
    disabled: list[Callable] = []

    @functools.wraps(fn)
    def called(*args: Any, **kwargs: Any) -> Any:
        if not dynamo_loaded():
            return fn(*args, **kwargs)
        if not disabled:
            disabled.append(sys.modules[DYNAMO].disable(fn, recursive, **options))
        return disabled[0](*args, **kwargs)

    return called


def dynamo_loaded() -> bool:
    """Whether the real torch._dynamo is loaded in this process."""
    return DYNAMO in sys.modules and not _placed()
