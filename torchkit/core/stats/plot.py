"""dataset-stats' plot (class histogram and image sizes) and the checks of every output path."""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchkit.core.data.sources.inputs import data_inputs
from torchkit.core.data.sources.required import require_data
from torchkit.core.io.errors import UsageError
from torchkit.core.io.file_outputs import check_output_file
from torchkit.core.io.files import atomic_write_bytes, drawable
from torchkit.core.io.overlap import InputPath, check_distinct_outputs
from torchkit.core.io.special_files import is_special_file
from torchkit.core.stats.report import DatasetStats

if TYPE_CHECKING:
    from torchkit.core.runtime.plot_helper import PlotHelper

PLOT_FORMATS = (".png", ".pdf", ".svg", ".jpg", ".jpeg")


def check_outputs(
    source: str | os.PathLike,
    output: str | os.PathLike | None = None,
    plot: str | os.PathLike | None = None,
    *,
    force: bool = False,
    leakage_csv: str | os.PathLike | None = None,
) -> None:
    """Check the report (`-o`), the plot and the leakage CSV before the long pass over the
    images, not after it: none may be the dataset's index, lie inside its folders, or be
    another; an existing file is replaced only with `force`. A missing dataset is said first."""
    require_data(source)
    inputs = data_inputs(source)
    report = output if output is not None and os.fspath(output) != "-" else None  # `-o -`
    if report is not None:
        check_output_file(report, force, inputs, what="output")
    if plot is not None:
        check_plot_output(plot, force, inputs)
    if leakage_csv is not None:
        check_output_file(leakage_csv, force, inputs, what="leakage CSV")
    check_distinct_outputs((report, "output (-o)"), (plot, "plot"), (leakage_csv, "leakage CSV"))


def plot_format(path: str | os.PathLike) -> str:
    """The image format the plot is saved in: from the name, or PNG for a special file
    without one (`--plot /dev/stdout`, a FIFO)."""
    target = Path(path)
    suffix = target.suffix.lower()
    if suffix not in PLOT_FORMATS:
        if is_special_file(target):
            return "png"
        raise UsageError(
            f"cannot tell the plot format from {target.name!r}",
            "end the name in " + ", ".join(PLOT_FORMATS),
        )
    return suffix.lstrip(".")


def check_plot_output(
    path: str | os.PathLike, force: bool, inputs: Sequence[InputPath] = ()
) -> Path:
    """Refuse a plot path that is an input, exists (without `force`) or has a format we cannot
    write, before the long pass over the images rather than after it."""
    plot_format(path)
    return check_output_file(path, force, inputs, what="plot")


def plot_dataset_stats(
    stats: DatasetStats,
    path: str | os.PathLike,
    *,
    force: bool,
    painter: PlotHelper | None = None,
) -> Path:
    """Class histogram and image-size scatter (`draw_dataset_stats`), saved (atomically) as an
    image at `path`; drawn by the plot helper `painter` where it answers."""
    import numpy as np

    target = check_plot_output(path, force, data_inputs(stats.root))
    sizes = np.asarray(stats.sizes, dtype=np.int64).reshape(-1, 3)[:, :2]
    values: dict[str, Any] = {
        "names": [drawable(c.shown or "(unlabelled)") for c in stats.classes],
        "counts": [c.images for c in stats.classes],
        "images": stats.images,
        "sizes": sizes,
        "classes": stats.num_classes,  # the bar of unlabelled images beside classes is none
    }
    if painter is None or not painter.draw("dataset_stats", target, **values):
        draw_dataset_stats(target, **values)
    return target


def draw_dataset_stats(
    path: str | os.PathLike,
    names: list[str],
    counts: list[int],
    images: int,
    sizes,
    classes: int | None = None,
) -> None:
    """The class histogram (`counts` images per class of `names`, `images` in all, `classes` of
    them classes: the report's count, the bar of unlabelled images none, all where None) and the
    scatter of `sizes` (an N x 2 array of widths and heights), written at `path` in the format
    its name says."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(12, 5), layout="constrained")
    FigureCanvasAgg(figure)
    bars, scatter = figure.subplots(1, 2, width_ratios=(3, 2))
    bars.bar(range(len(names)), counts, color="tab:blue")
    if len(names) <= 60:  # beyond that the labels are an unreadable smear
        bars.set_xticks(range(len(names)), names, rotation=90 if len(names) > 8 else 0)
    bars.set_xlabel(f"class ({len(names) if classes is None else classes})")
    bars.set_ylabel("images")
    bars.set_title(f"Images per class ({images} images)")
    bars.yaxis.set_major_locator(MaxNLocator(integer=True))
    if len(sizes):
        widths, heights = sizes[:, 0], sizes[:, 1]
        scatter.scatter(widths, heights, s=18, alpha=0.5, color="tab:orange", linewidths=0)
        scatter.set_xlim(left=0, right=int(widths.max()) * 1.05)
        scatter.set_ylim(bottom=0, top=int(heights.max()) * 1.05)
    scatter.set_xlabel("width (px)")
    scatter.set_ylabel("height (px)")
    scatter.set_title("Image sizes")
    # Drawn in memory, then written in one go: savefig seeks, which a FIFO or /dev/stdout
    # cannot, and the file (or the special file) gets the whole image or nothing.
    image = io.BytesIO()
    figure.savefig(image, format=plot_format(path), dpi=100)
    atomic_write_bytes(path, image.getvalue())
