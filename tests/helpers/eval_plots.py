"""eval's confusion_matrix.png and errors.png laid out but not rasterised, for tests whose
in-process `eval --out` runs check everything but the pictures: matplotlib's Agg took 0.3-0.45 s
of CPU per run for the two PNGs of 5 classes (run_curves.py does the same for train's
curves.png)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


def lay_out_eval_plots_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs in this process build both figures with torchkit's own drawing functions (every
    artist made: a value they cannot draw still fails the run) and write a 1x1 PNG where the
    picture goes, through the functions' own atomic write. The drawn images are checked where a
    test reads them (eval/test_eval.py's report, eval/test_eval_scorer.py,
    cli/test_plot_helper.py)."""
    from torchkit.core.evaluate import reports

    for name in ("draw_confusion_matrix", "draw_errors"):
        monkeypatch.setattr(reports, name, _laid_out_only(getattr(reports, name)))


def _laid_out_only(draw: Callable[..., None]) -> Callable[..., None]:
    from matplotlib.figure import Figure
    from PIL import Image, PngImagePlugin

    def one_pixel_png(figure: Figure, path: Any, *args: Any, **kwargs: Any) -> None:
        text = PngImagePlugin.PngInfo()  # the metadata savefig was given (torchkit's Software)
        for key, value in (kwargs.get("metadata") or {}).items():
            text.add_text(key, value)
        Image.new("RGB", (1, 1)).save(path, format="PNG", pnginfo=text)

    def laid_out(*args: Any, **kwargs: Any) -> None:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(Figure, "savefig", one_pixel_png)
            draw(*args, **kwargs)

    return laid_out
