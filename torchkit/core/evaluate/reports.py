"""The files `eval --out DIR` writes: metrics.json, per_class.csv, confusion_matrix.csv,
predictions.csv, confusion_matrix.png and errors.png (above DENSE_CONFUSION_MAX_CLASSES classes
confusion_pairs.csv instead of the matrix's CSV and PNG); each one atomically."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from torchkit.core.io.claims import reporting_write_errors
from torchkit.core.io.csv_rows import csv_text, write_csv_file
from torchkit.core.io.files import atomic_path, atomic_write_json, atomic_write_text, drawable
from torchkit.core.io.output_proofs import PNG_METADATA

if TYPE_CHECKING:
    from torchkit.core.evaluate.metrics import ConfusionPairs
    from torchkit.core.evaluate.results import EvalResult
    from torchkit.core.runtime.plot_helper import PlotHelper

log = logging.getLogger("torchkit")

CONFUSION_CORNER = "true \\ predicted"  # confusion_matrix.csv's first header cell
CONFUSION_PAIRS_COLUMNS = ["true", "predicted", "count"]  # confusion_pairs.csv's header
# The most classes whose confusion matrix is written whole (confusion_matrix.csv and .png): C x C
# cells, 8 MB of CSV and a 2-pixel cell at 2,000 classes, 800 MB and 3.2 GB of counts at 20,000.
# Above it, confusion_pairs.csv lists the non-zero cells.
DENSE_CONFUSION_MAX_CLASSES = 2000
REPORT_FILES = (
    "metrics.json",
    "per_class.csv",
    "confusion_matrix.csv",
    "confusion_pairs.csv",
    "predictions.csv",
    "confusion_matrix.png",
    "errors.png",
)


def write_reports(
    result: EvalResult,
    out_dir: str | os.PathLike,
    *,
    normalize: bool = False,
    max_errors_shown: int = 25,
    painter: PlotHelper | None = None,
) -> list[Path]:
    """Write every report into `out_dir`, each file atomically. The checks (--force, inputs)
    are the caller's: `evaluate` hands over the folder of a `core.outputs.OutputFolder`.
    `painter`: a started plot helper that draws the PNGs (else, or where it cannot, they are
    drawn here)."""
    folder = Path(out_dir)
    with reporting_write_errors(folder):
        folder.mkdir(parents=True, exist_ok=True)
    classes = result.shown_classes  # `crane (#134)` for a name two classes share
    dense = len(classes) <= DENSE_CONFUSION_MAX_CLASSES
    left_out = (
        ["confusion_pairs.csv"] if dense else ["confusion_matrix.csv", "confusion_matrix.png"]
    )
    paths = {name: folder / name for name in REPORT_FILES if name not in left_out}
    atomic_write_json(paths["metrics.json"], json_safe(result.to_dict()))
    atomic_write_text(
        paths["per_class.csv"], _csv_text(result.per_class_columns(), result.per_class_rows())
    )
    if dense:
        cm = result.metrics.confusion
        atomic_write_text(paths["confusion_matrix.csv"], confusion_csv_text(cm, classes))
    else:
        pairs = confusion_pairs_rows(result.metrics.pairs, classes)
        write_csv_file(paths["confusion_pairs.csv"], pairs, header=CONFUSION_PAIRS_COLUMNS)
        log.warning(
            "%d classes: confusion_pairs.csv lists the confusion matrix's non-zero cells "
            "(true,predicted,count); confusion_matrix.csv and .png are written up to %d classes",
            len(classes),
            DENSE_CONFUSION_MAX_CLASSES,
        )
    # A row per image: streamed to the file, never its whole text (200 MB at 1M images, top 5).
    predictions = prediction_rows(result)
    write_csv_file(paths["predictions.csv"], predictions, header=prediction_columns(result))
    if dense:
        plot_confusion_matrix(
            cm, classes, paths["confusion_matrix.png"], normalize=normalize, painter=painter
        )
    plot_errors(result, paths["errors.png"], max_shown=max_errors_shown, painter=painter)
    return list(paths.values())


def json_safe(value: Any) -> Any:
    """Plain JSON: NaN and infinities become null, NumPy scalars Python numbers."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _csv_text(columns: list[str], rows) -> str:
    return csv_text([columns, *rows])


def confusion_csv_text(cm: np.ndarray, classes: list[str]) -> str:
    """confusion_matrix.csv: a header `true \\ predicted,CLASS...`, then per true class its name
    and its counts per predicted class. Written with the csv module: pandas would add a second
    of import to eval, which no longer imports it (scikit-learn runs in a helper process)."""
    rows = ([name, *counts] for name, counts in zip(classes, cm.tolist(), strict=True))
    return _csv_text([CONFUSION_CORNER, *classes], rows)


def confusion_pairs_rows(pairs: ConfusionPairs, classes: list[str]) -> Iterator[tuple]:
    """confusion_pairs.csv's rows (its header: CONFUSION_PAIRS_COLUMNS, `true,predicted,count`):
    one per non-zero cell of the confusion matrix (true and predicted class names), by true
    class, then predicted class (in label order)."""
    names = np.asarray(classes, dtype=object)
    return zip(
        names[pairs.true].tolist(),
        names[pairs.predicted].tolist(),
        pairs.count.tolist(),
        strict=True,
    )


def prediction_columns(result: EvalResult) -> list[str]:
    """The vocabulary of every output that names images (predict's rows too): `label` the true
    class name (`shown_class_names`' `crane (#134)` for a name two classes share), `class` the
    predicted one, `class_index` its index, `probability` its
    probability, `class_K`/`probability_K` the K-th most probable (K up to the top-k used)."""
    columns = [
        "path",
        "label",
        "label_index",
        "class",
        "class_index",
        "probability",
        "correct",
        "loss",
    ]
    for rank in range(1, result.predictions.topk_labels.shape[1] + 1):
        columns += [f"class_{rank}", f"probability_{rank}"]
    return columns


def prediction_rows(result: EvalResult):
    """One row per image; probabilities with 9 significant digits (float32 round-trips), as
    predict writes them."""
    p = result.predictions
    classes = result.shown_classes
    for i in range(len(p)):
        true, predicted = int(p.labels[i]), int(p.predicted[i])
        if not p.finite[i]:  # no prediction (-1): outputs not finite (predict's rule)
            name = result.sample_name(int(p.indices[i]))
            empty = [None] * (2 * p.topk_labels.shape[1])
            yield [name, classes[true], true, None, None, None, None, f"{p.loss[i]:.9g}", *empty]
            continue
        row = [
            result.sample_name(int(p.indices[i])),
            classes[true],
            true,
            classes[predicted],
            predicted,
            f"{p.confidence[i]:.9g}",
            int(true == predicted),
            f"{p.loss[i]:.9g}",
        ]
        for index, prob in zip(p.topk_labels[i], p.topk_probs[i], strict=True):
            row += [classes[int(index)], f"{prob:.9g}"]
        yield row


def _short(name: str, limit: int = 24) -> str:
    name = drawable(name)
    return name if len(name) <= limit else name[: limit - 1] + "\u2026"


def plot_confusion_matrix(
    cm: np.ndarray,
    classes: list[str],
    path: str | os.PathLike,
    *,
    normalize: bool = False,
    painter: PlotHelper | None = None,
) -> None:
    """confusion_matrix.png (`draw_confusion_matrix`), by the plot helper `painter` where it
    answers."""
    values = {"cm": np.asarray(cm), "classes": list(classes), "normalize": normalize}
    if painter is None or not painter.draw("confusion_matrix", path, **values):
        draw_confusion_matrix(path, **values)


def draw_confusion_matrix(
    path: str | os.PathLike, cm: np.ndarray, classes: list[str], normalize: bool = False
) -> None:
    """A heatmap that stays readable with many classes: each class gets at least 0.22 inch
    (22 pixels, room for a 7-point name), counts are written in the cells up to 30 classes,
    and above 150 classes only every n-th name is shown.

    The layout is computed here in inches rather than by matplotlib's constrained layout,
    which draws the figure several times (seconds for 100 classes)."""
    from matplotlib.figure import Figure

    n = len(classes)
    values = cm.astype(np.float64)
    if normalize:
        totals = values.sum(axis=1, keepdims=True)
        values = np.divide(values, totals, out=np.zeros_like(values), where=totals > 0)
    step = max(1, math.ceil(n / 150))
    ticks = np.arange(0, n, step)
    names = [_short(classes[i]) for i in ticks]
    font = float(np.clip(13.0 - n / 12.0, 7.0, 10.0))
    side = float(np.clip(0.22 * len(ticks), 4.0, 40.0))  # the matrix, in inches
    label_room = max(len(name) for name in names) * font * 0.62 / 72 + 0.5
    left, bottom, top, right = label_room, label_room, 0.5, 1.3
    width, height = left + side + right, bottom + side + top
    fig = Figure(figsize=(width, height), dpi=100)
    ax = fig.add_axes((left / width, bottom / height, side / width, side / height))
    cax = fig.add_axes(((left + side + 0.25) / width, bottom / height, 0.2 / width, side / height))
    image = ax.imshow(
        values,
        cmap="Blues",
        interpolation="nearest",
        vmin=0.0,
        vmax=1.0 if normalize else None,
        aspect="auto",
    )
    fig.colorbar(image, cax=cax, label="fraction of the row" if normalize else "images")
    ax.set_xticks(ticks, names, rotation=90, fontsize=font)
    ax.set_yticks(ticks, names, fontsize=font)
    ax.set_xlabel("Predicted class")
    ax.set_ylabel("True class")
    kind = "normalised per true class" if normalize else "image counts"
    ax.set_title(f"Confusion matrix ({kind}, {int(cm.sum())} images)")
    if n <= 30:
        threshold = values.max() / 2 if values.max() > 0 else 1.0
        for i in range(n):
            for j in range(n):
                if cm[i, j] == 0:
                    continue
                text = f"{values[i, j]:.2f}" if normalize else str(int(cm[i, j]))
                ax.text(
                    j,
                    i,
                    text,
                    ha="center",
                    va="center",
                    fontsize=font * 0.9,
                    color="white" if values[i, j] > threshold else "black",
                )
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", metadata=PNG_METADATA)


ERROR_TILE = 128  # pixels per image in errors.png
_TITLE, _PAD, _HEADER = 52, 10, 32  # three lines above each image: file, true, predicted


def _tile(result: EvalResult, index: int) -> np.ndarray:
    """The image as an RGB tile of ERROR_TILE x ERROR_TILE pixels (scaled to fit, centred;
    small images such as 8x8 digits are enlarged with nearest-neighbour to stay crisp)."""
    from PIL import Image

    from torchkit.core.data.image_files import load_image, unreadable_image_errors

    tile = np.full((ERROR_TILE, ERROR_TILE, 3), 235, dtype=np.uint8)
    samples = result.samples
    try:
        if samples.images is not None:
            image = Image.fromarray(np.asarray(samples.images[index])).convert("RGB")
        else:
            image = load_image(samples.paths[index], "RGB")  # 16-bit scaled, FIFOs never opened
    except unreadable_image_errors():
        return tile
    scale = ERROR_TILE / max(image.size)
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    method = Image.Resampling.NEAREST if scale > 1 else Image.Resampling.LANCZOS
    pixels = np.asarray(image.resize(size, method))
    top, left = (ERROR_TILE - size[1]) // 2, (ERROR_TILE - size[0]) // 2
    tile[top : top + size[1], left : left + size[0]] = pixels
    return tile


def plot_errors(
    result: EvalResult,
    path: str | os.PathLike,
    *,
    max_shown: int = 25,
    painter: PlotHelper | None = None,
) -> None:
    """A grid of the most confident mistakes, each titled with its file name, its true and its
    predicted class; drawn by the plot helper `painter` where it answers.

    The images are pasted into one canvas and the titles drawn as figure text: a grid of
    matplotlib axes would cost seconds for 25 images."""
    canvas, texts = errors_layout(result, max_shown)
    if painter is None or not painter.draw("errors", path, canvas=canvas, texts=texts):
        draw_errors(path, canvas, texts)


def errors_layout(result: EvalResult, max_shown: int = 25) -> tuple[np.ndarray, list[dict]]:
    """errors.png's pixels (the images pasted into a white canvas) and its titles: keyword
    arguments of `Figure.text`, positions in figure fractions."""
    p = result.predictions
    wrong = np.flatnonzero(p.predicted != p.labels)
    order = wrong[np.argsort(-p.confidence[wrong], kind="stable")][:max_shown]
    cols = max(1, min(5, len(order)))
    rows = max(1, math.ceil(len(order) / cols))
    width = max(cols * (ERROR_TILE + _PAD) + _PAD, 360)
    height = _HEADER + rows * (_TITLE + ERROR_TILE + _PAD) + _PAD
    canvas = np.full((height, width, 3), 255, dtype=np.uint8)
    if len(order) == 0:
        heading = f"No mistakes among {len(p)} images"
    else:
        heading = f"The {len(order)} most confident of {len(wrong)} mistakes"
    texts = [_text(0.5, 1 - 8 / height, heading, va="top", fontsize=11)]
    for n, row in enumerate(order):
        r, c = divmod(n, cols)
        left = _PAD + c * (ERROR_TILE + _PAD)
        top = _HEADER + r * (_TITLE + ERROR_TILE + _PAD) + _TITLE
        canvas[top : top + ERROR_TILE, left : left + ERROR_TILE] = _tile(
            result, int(p.indices[row])
        )
        x = (left + ERROR_TILE / 2) / width
        true = _short(result.shown_class(int(p.labels[row])), 18)
        if p.finite[row]:
            predicted = f"{_short(result.shown_class(int(p.predicted[row])), 18)} "
            predicted += f"({p.confidence[row]:.2f})"
        else:  # no prediction (-1): no class to name
            predicted = "none (not finite)"
        name = _short(os.path.basename(result.sample_name(int(p.indices[row]))), 22)
        texts += [
            _text(x, 1 - (top - 37) / height, name, fontsize=7),
            _text(x, 1 - (top - 20) / height, f"true: {true}", fontsize=8),
            _text(
                x,
                1 - (top - 3) / height,
                f"pred: {predicted}",
                fontsize=8,
                color="#b00020",
            ),
        ]
    return canvas, texts


def _text(x: float, y: float, text: str, *, va: str = "bottom", **style: Any) -> dict[str, Any]:
    return {"x": float(x), "y": float(y), "s": text, "ha": "center", "va": va, **style}


def draw_errors(path: str | os.PathLike, canvas: np.ndarray, texts: list[dict]) -> None:
    """errors.png of `errors_layout`'s canvas and titles, one figure pixel per canvas pixel."""
    from matplotlib.figure import Figure

    height, width = canvas.shape[:2]
    fig = Figure(figsize=(width / 100, height / 100), dpi=100)
    for text in texts:
        fig.text(**text)
    fig.figimage(canvas, 0, 0, zorder=0)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100, metadata=PNG_METADATA)
