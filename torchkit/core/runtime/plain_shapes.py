"""summary's passes without sympy: 2-3 s of CPU of every summary (and benchmark's FLOP count).

The meta kernels and torch._refs' references that a forward pass on the meta device (or under
a dispatch mode), or a model's build there, runs ask `torch.fx.experimental.symbolic_shapes`
for a few functions on every call (`torch._check` for `expect_true`, the convolution's meta
kernel for `guard_or_false`, broadcasting for `is_nested_int`...), and importing that module
imports sympy; torch's type promotion (`elementwise_dtypes`) imports sympy itself, to ask
`isinstance(x, sympy.Basic)` of each argument. Those functions need sympy only for symbolic
sizes (SymInt, SymBool, SymFloat: torch.compile, torch.export), which a summary never makes:
given plain ints and bools, each one checks the value's type and answers with the value itself.
And no object is an instance of a sympy class before sympy is loaded. So while a pass runs
(`plain_shapes`), stand-ins answer those names: the functions take plain values themselves and
hand a symbolic one to the real function, imported then; the stand-in sympy's `Basic` is a
class of its own. Any other name, or a sympy submodule, imports the real modules and answers
from them, so torch code that needs more only loses the saving. The stand-ins leave
sys.modules when the outermost pass ends, and nothing is done once sympy is loaded.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.abc
import importlib.util
import operator
import sys
import types
from typing import Any

from torchkit.stand_ins import StandInModule, StandInsWhileRunning

SYMBOLIC_SHAPES, SYMPY = "torch.fx.experimental.symbolic_shapes", "sympy"
_PARENT, _, _LEAF = SYMBOLIC_SHAPES.rpartition(".")
# Names the stand-ins were asked for and did not have (each made the real modules load).
missing: list[str] = []


def plain_shapes() -> contextlib.AbstractContextManager[None]:
    """Run a block with the stand-ins for `torch.fx.experimental.symbolic_shapes` and sympy in
    place, unless sympy is loaded (module doc)."""
    return _STAND_INS.running()


def sympy_loaded() -> bool:
    """Whether the real sympy is loaded in this process (the real symbolic_shapes imports it)."""
    return SYMPY in sys.modules and not isinstance(sys.modules[SYMPY], StandInModule)


class _Basic:
    """The stand-in's `sympy.Basic`: torch's type promotion asks `isinstance(x, sympy.Basic)`
    of every argument, and no object is an instance of sympy's classes before sympy is loaded,
    as none is of this one."""


class _SympySubmodules(importlib.abc.MetaPathFinder):
    """`import sympy.NAME` while the stand-in is sympy: the real sympy is imported first (it
    imports most of its submodules itself: those are answered as they are, not run twice)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if not name.startswith(SYMPY + "."):
            return None
        _real(SYMPY)
        loaded = sys.modules.get(name)
        if loaded is None:
            return None  # the other finders find it, in the real sympy's folder
        # The import machinery loads a module a finder's own imports loaded from that module's
        # __spec__: for a while, one whose loader gives the module as it is.
        loaded.__spec__ = importlib.util.spec_from_loader(name, _AlreadyLoaded(loaded))
        return loaded.__spec__


class _AlreadyLoaded(importlib.abc.Loader):
    """Gives the module the real sympy's import has just loaded, as it is."""

    def __init__(self, module: types.ModuleType) -> None:
        self.module, self.spec = module, module.__spec__

    def create_module(self, spec: Any) -> types.ModuleType:
        return self.module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__ = self.spec  # its own again


_finder = _SympySubmodules()


def _place() -> None:
    shapes = StandInModule(SYMBOLIC_SHAPES, _real, missing)
    for function in _PLAIN_FUNCTIONS:
        setattr(shapes, function.__name__, function)
    sympy = StandInModule(SYMPY, _real, missing)
    sympy.Basic = _Basic
    # `import sympy.core` asks the package's folders first, then the finders.
    found = importlib.util.find_spec(SYMPY)
    sympy.__path__ = list(found.submodule_search_locations or []) if found else []
    sys.modules[SYMBOLIC_SHAPES], sys.modules[SYMPY] = shapes, sympy
    sys.meta_path.insert(0, _finder)
    parent = sys.modules.get(_PARENT)
    if parent is not None:  # `import torch.fx.experimental.symbolic_shapes` then `torch.fx...`
        setattr(parent, _LEAF, shapes)


def _remove() -> None:
    for name in (SYMBOLIC_SHAPES, SYMPY):
        if isinstance(sys.modules.get(name), StandInModule):
            del sys.modules[name]
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    parent = sys.modules.get(_PARENT)
    if parent is not None and isinstance(parent.__dict__.get(_LEAF), StandInModule):
        delattr(parent, _LEAF)


_STAND_INS = StandInsWhileRunning(_place, _remove, lambda: sympy_loaded())


def _real(name: str = SYMBOLIC_SHAPES) -> types.ModuleType:
    """The real module `name`, imported now (both stand-ins taken out first: the real
    symbolic_shapes imports sympy)."""
    _STAND_INS.remove_now()
    return importlib.import_module(name)


def _symbolic(*values: Any) -> bool:
    """Whether any value (or any item of a list or tuple among them) is a symbolic size."""
    import torch
    from torch.fx.experimental.sym_node import SymNode

    for value in values:
        if isinstance(value, (list, tuple)):
            if _symbolic(*value):
                return True
        elif isinstance(value, (torch.SymInt, torch.SymBool, torch.SymFloat, SymNode)):
            return True
    return False


def _bool(value: Any) -> bool:
    """A plain bool as it is; anything else is the error the real functions raise."""
    if type(value) is not bool:
        raise AssertionError(f"Expected bool, got {value!r}")
    return value


def expect_true(a: Any, skip: int = 0) -> bool:
    if _symbolic(a):
        # the real one reads its caller's frame: this one is a frame further up
        return _real().expect_true(a, skip + 1)
    return _bool(a)


def _plain_or_real(name: str):
    """A function of one truth value: the value itself when it is a plain bool."""

    def function(a: Any) -> bool:
        return getattr(_real(), name)(a) if _symbolic(a) else _bool(a)

    function.__name__ = function.__qualname__ = name
    return function


guard_or_false = _plain_or_real("guard_or_false")
guard_or_true = _plain_or_real("guard_or_true")
guard_bool = _plain_or_real("guard_bool")
guard_size_oblivious = _plain_or_real("guard_size_oblivious")
statically_known_true = _plain_or_real("statically_known_true")


def sym_eq(x: Any, y: Any) -> Any:
    """==, item by item for lists and tuples."""
    if _symbolic(x, y):
        return _real().sym_eq(x, y)
    if isinstance(x, (tuple, list)) and isinstance(y, (tuple, list)):
        if len(x) != len(y):
            return False
        # every pair compared (and checked), as the real one does
        return all([sym_eq(a, b) for a, b in zip(x, y, strict=True)])  # noqa: C419
    if isinstance(x, int) and isinstance(y, int):
        return x == y
    raise AssertionError(f"unexpected sym_eq between {type(x)} {type(y)}")


def sym_and(x: Any, *others: Any) -> Any:
    if _symbolic(x, *others):
        return _real().sym_and(x, *others)
    return functools.reduce(operator.and_, others, x)


def sym_or(x: Any, *others: Any) -> Any:
    if _symbolic(x, *others):
        return _real().sym_or(x, *others)
    return functools.reduce(operator.or_, others, x)


def is_nested_int(s: Any) -> bool:
    """Nested ints are symbolic: a plain number never is one."""
    return _real().is_nested_int(s) if _symbolic(s) else False


def has_guarding_hint(a: Any) -> bool:
    """A plain value is its own hint."""
    return _real().has_guarding_hint(a) if _symbolic(a) else True


def guarding_hint_or_throw(a: Any) -> Any:
    if _symbolic(a):
        return _real().guarding_hint_or_throw(a)
    if type(a) is not bool and type(a) is not int:
        raise AssertionError(f"Expected int, got {type(a)}")
    return a


_PLAIN_FUNCTIONS = (
    expect_true,
    guard_or_false,
    guard_or_true,
    guard_bool,
    guard_size_oblivious,
    statically_known_true,
    sym_eq,
    sym_and,
    sym_or,
    is_nested_int,
    has_guarding_hint,
    guarding_hint_or_throw,
)
