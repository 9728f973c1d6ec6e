"""Import hooks that find a module as the other finders do and run it through a wrapper: the
light torchvision import (`torchvision_without_dynamo`) and signals held back while torch is
first imported (`deferred_signals`)."""

from __future__ import annotations

import contextlib
import importlib.abc
import sys
import threading
import types
from typing import Any


class WrappingFinder(importlib.abc.MetaPathFinder):
    """Finds the modules `wants` names with the finders after it on sys.meta_path and hands
    their loader to `WrappingLoader`, which runs each module within `running(module)`."""

    def __init__(self) -> None:
        # Another wrapping finder asks every finder too, this one included: a finder already
        # asking (in this thread) answers None, or the two would ask each other forever.
        self._asking = threading.local()

    def wants(self, name: str) -> bool:
        raise NotImplementedError

    def running(self, module: types.ModuleType) -> contextlib.AbstractContextManager[None]:
        raise NotImplementedError

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if getattr(self._asking, "now", False) or not self.wants(name):
            return None
        self._asking.now = True
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = WrappingLoader(spec.loader, self.running)
                    return spec
            return None
        finally:
            self._asking.now = False


class WrappingLoader(importlib.abc.Loader):
    """The real loader, its module run within `running(module)`."""

    def __init__(self, real: Any, running: Any) -> None:
        self.real = real
        self.running = running

    def create_module(self, spec: Any) -> Any:
        return self.real.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        # The module keeps the real loader (importlib.resources, reloads).
        module.__loader__ = self.real
        if module.__spec__ is not None:
            module.__spec__.loader = self.real
        with self.running(module):
            self.real.exec_module(module)
