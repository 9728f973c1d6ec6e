"""curves.png drawn by a helper process that imports matplotlib while the run starts
(`core.helper_process`): this module is its service, and `CurvesPainter` the run's side.

Importing matplotlib's figure machinery takes about a second, and a run used to pay it at its
end, before exiting: a tenth of the digits main job. The helper is started first thing (before
torch is imported), so the import runs on another core beside the run's own start-up. Whenever
it cannot answer the run draws the plot itself, as before, so a plot is never lost and its
errors (a full disk) are the ones the run reports. No helper is started where matplotlib is
already imported (the plot costs no import there).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from torchkit.core.runtime.helper_process import HelperProcess

SERVICE = "torchkit.core.train.curves_painter"


class CurvesPainter:
    """The run's side of a started helper."""

    def __init__(self, helper: HelperProcess) -> None:
        self.helper = helper

    @property
    def process(self):
        return self.helper.process

    @property
    def painted(self) -> bool:
        return self.helper.answered

    @classmethod
    def start(cls) -> CurvesPainter | None:
        """A started helper, or None where none is wanted or it cannot start."""
        if "matplotlib.figure" in sys.modules:
            return None
        return cls.spawn()

    @classmethod
    def spawn(cls) -> CurvesPainter | None:
        """A started helper, or None where it cannot start."""
        helper = HelperProcess.spawn(SERVICE)
        return None if helper is None else cls(helper)

    def paint(self, path: Path, history: list[dict], best_epoch: int | None) -> bool:
        """Whether the helper wrote curves.png at `path` (False: the caller draws it)."""
        # Absolute: the helper keeps the working directory it was started in.
        request = {"path": os.path.abspath(path), "history": history, "best_epoch": best_epoch}
        return self.helper.call(request) == "ok"

    def close(self) -> None:
        self.helper.close()

    def forget(self) -> None:
        self.helper.forget()


def prepare() -> None:
    """The helper's import: matplotlib's figure machinery."""
    from torchkit.core.train.outputs import import_plotting

    import_plotting()


def answer(request: dict[str, Any]) -> str:
    """Draw one curves.png."""
    from torchkit.core.train.outputs import write_curves_png

    write_curves_png(Path(request["path"]), request["history"], request["best_epoch"])
    return "ok"
