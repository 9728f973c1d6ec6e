"""curves.png laid out but not rasterised, for the in-process train runs of every test module
(tests/conftest.py's `curves_laid_out`; a module marked `drawn_curves` draws it): matplotlib's
Agg took 0.15-0.2 s of CPU of a tiny run's 0.5 s."""

from __future__ import annotations

from pathlib import Path

import pytest


def lay_out_curves_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs in this process build curves.png's figure from their history with torchkit's own
    `curves_figure` (a history it cannot draw still fails the run) and write a 1x1 PNG,
    atomically, where the drawing goes. The drawn image is checked where a test reads it
    (test_curves_painter.py, test_train_core.py, the digits run in test_train_digits_target.py)."""
    from PIL import Image

    from torchkit.core.io.files import atomic_path
    from torchkit.core.train import outputs, run_folder

    def laid_out_only(path: Path, history: list[dict], best_epoch: int | None = None) -> None:
        outputs.curves_figure(history, best_epoch)
        with atomic_path(path) as tmp:
            Image.new("RGB", (1, 1)).save(tmp, format="PNG")

    monkeypatch.setattr(run_folder, "write_curves_png", laid_out_only)
