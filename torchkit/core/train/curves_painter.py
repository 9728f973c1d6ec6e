"""curves.png drawn by the plot helper (`core.runtime.plot_helper`), which imports matplotlib
while the run starts: `CurvesPainter` is the run's side.

Importing matplotlib's figure machinery takes about a second, and a run used to pay it at its
end, before exiting: a tenth of the digits main job. The helper is started first thing (before
torch is imported), so the import runs on another core beside the run's own start-up. Whenever
it cannot answer the run draws the plot itself, as before, so a plot is never lost and its
errors (a full disk) are the ones the run reports. No helper is started where matplotlib is
already imported (the plot costs no import there). The same helper draws `--find-lr`'s
lr_find.png.
"""

from __future__ import annotations

from pathlib import Path

from torchkit.core.runtime.plot_helper import PlotHelper


class CurvesPainter(PlotHelper):
    """The run's side of a started plot helper."""

    def paint(self, path: Path, history: list[dict], best_epoch: int | None) -> bool:
        """Whether the helper wrote curves.png at `path` (False: the caller draws it)."""
        return self.draw("curves", path, history=history, best_epoch=best_epoch)
