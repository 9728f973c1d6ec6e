"""curves.png and lr_find.png laid out but not rasterised, for the in-process train runs of every
test module (tests/conftest.py's `curves_laid_out`; a module marked `drawn_curves` draws them):
matplotlib's Agg took 0.15-0.2 s of CPU of a tiny run's 0.5 s, and lr_find.png's log-axis labels
about 0.4 s of a range test's."""

from __future__ import annotations

from pathlib import Path

import pytest


def lay_out_curves_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs in this process build curves.png's figure from their history with torchkit's own
    `curves_figure` (a history it cannot draw still fails the run) and write a 1x1 PNG,
    atomically, where the drawing goes. The drawn image is checked where a test reads it
    (test_curves_painter.py, test_train_core.py, the digits run in test_train_digits_target.py)."""
    from PIL import Image, PngImagePlugin

    from torchkit.core.io.files import atomic_path
    from torchkit.core.io.output_proofs import PNG_METADATA
    from torchkit.core.train import lr_find, outputs, run_folder

    # the text every PNG torchkit draws carries: --force over the run proves the file its own
    text = PngImagePlugin.PngInfo()
    for key, value in PNG_METADATA.items():
        text.add_text(key, value)

    def laid_out_only(path: Path, history: list[dict], best_epoch: int | None = None) -> None:
        outputs.curves_figure(history, best_epoch)
        with atomic_path(path) as tmp:
            Image.new("RGB", (1, 1)).save(tmp, format="PNG", pnginfo=text)

    monkeypatch.setattr(run_folder, "write_curves_png", laid_out_only)

    # lr_find.png: a run's range test draws it through `write_lr_find`, with the plot helper
    # where there is one (none here: matplotlib is imported), else itself. Given a painter that
    # lays the figure out with torchkit's own `lr_find_figure` and writes a 1x1 PNG, the run
    # writes its files as before. Calls of `write_lr_find` by name bound elsewhere (the plot
    # helper's tests) draw the picture.
    real_write_lr_find = lr_find.write_lr_find

    class LaidOutOnly:
        def draw(self, kind: str, path: Path, **values) -> bool:
            lr_find.lr_find_figure(**values)
            with atomic_path(path) as tmp:
                Image.new("RGB", (1, 1)).save(tmp, format="PNG", pnginfo=text)
            return True

    def lr_find_laid_out_only(folder: Path, result, painter=None) -> list:
        return real_write_lr_find(folder, result, painter=painter or LaidOutOnly())

    monkeypatch.setattr(lr_find, "write_lr_find", lr_find_laid_out_only)
