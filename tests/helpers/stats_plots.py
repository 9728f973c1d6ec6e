"""dataset-stats --plot written but not drawn, for tests whose check is where the plot goes and
what the report says, not the image: matplotlib's constrained layout and Agg took about 0.6 s of
CPU a plot. The drawn plot is checked in stats/test_dataset_stats.py."""

from __future__ import annotations

import io
from pathlib import Path

import pytest


def write_stats_plot_undrawn(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Runs in this process write a 1x1 PNG, atomically, where dataset-stats' plot goes, with the
    values it would have drawn checked for their shape; returns those values, one dict a plot."""
    from PIL import Image

    from torchkit.core.io.files import atomic_write_bytes
    from torchkit.core.stats import plot

    asked: list[dict] = []

    def written_undrawn(
        path: Path, names: list[str], counts: list[int], images: int, sizes, classes: int
    ):
        assert len(names) == len(counts) and images == len(sizes)
        asked.append({"names": names, "counts": counts, "images": images, "classes": classes})
        image = io.BytesIO()
        Image.new("RGB", (1, 1)).save(image, format="PNG")
        atomic_write_bytes(path, image.getvalue())

    monkeypatch.setattr(plot, "draw_dataset_stats", written_undrawn)
    return asked
