"""eval's figures count an image of non-finite outputs as a miss, as its row of predictions.csv
(no class) reads: every number equals scikit-learn's computed from predictions.csv with the
empty predicted class read as -1. The model is named on the command line as
`test_eval_nonfinite_metrics:ColourNanNet` (this module, imported by pytest)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from eval_plots import lay_out_eval_plots_only
from PIL import Image
from processes import run_torchkit_in_process
from sklearn.metrics import (
    accuracy_score,
    balanced_accuracy_score,
    confusion_matrix,
    precision_recall_fscore_support,
)
from torch import nn

HERE = Path(__file__).stem
COLOURS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255), "white": (255,) * 3}
# Per class, the colours of its images: red, green and blue are classes a, b and c to the net,
# a white image gets NaN outputs (two of class a: the old metrics, reading NaN's ranking as
# class a, counted them correct).
IMAGES = {
    "a": ["red", "red", "white", "white"],
    "b": ["green", "red", "white"],
    "c": ["blue", "green"],
}


class ColourNanNet(nn.Module):
    """Three classes: an image's logits are its normalised channel means (a red image is class
    a), NaN for an image brighter than the mean in every channel (a white one)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x.mean(dim=(2, 3)) * self.scale
        white = (out > 0).all(dim=1)
        return torch.where(white[:, None], torch.full_like(out, float("nan")), out)


def _class_index(name: str, classes: list[str]) -> int:
    return classes.index(name) if name else -1  # an empty class: no prediction


@pytest.mark.filterwarnings("ignore:y_pred contains classes not in y_true")  # the -1s
def test_metrics_count_a_non_finite_image_as_a_miss(tmp_path, monkeypatch):
    from torchkit.core.evaluate import reports

    lay_out_eval_plots_only(monkeypatch)  # the PNGs' pictures are not this test's
    drawn = []  # errors.png's titles
    laid_out = reports.draw_errors
    monkeypatch.setattr(
        reports, "draw_errors", lambda *args, **kw: drawn.append(args[2]) or laid_out(*args, **kw)
    )
    for label, colours in IMAGES.items():
        (tmp_path / "data" / label).mkdir(parents=True)
        for n, colour in enumerate(colours):
            path = tmp_path / "data" / label / f"{n}.png"
            Image.new("RGB", (8, 8), COLOURS[colour]).save(path)
    out = tmp_path / "report"
    done = run_torchkit_in_process(
        "eval", f"{HERE}:ColourNanNet", "--allow-untrained", "--data", tmp_path / "data",
        "--image-size", "8", "-j", "0", "--topk", "2", "--out", out, "--device", "cpu",
        "--format", "csv",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "not finite (NaN or inf) for 3 of 9 image(s)" in done.stderr  # the warning stays
    metrics = json.loads((out / "metrics.json").read_text())
    classes = metrics["classes"]
    assert classes == ["a", "b", "c"] and metrics["num_nonfinite"] == 3
    with open(out / "predictions.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    y_true = np.array([int(row["label_index"]) for row in rows])
    y_pred = np.array([_class_index(row["class"], classes) for row in rows])
    top2 = np.array([[_class_index(row[f"class_{k}"], classes) for k in (1, 2)] for row in rows])
    assert (y_pred == -1).sum() == 3 and len(rows) == 9

    labels = [0, 1, 2]
    assert metrics["top1"] == pytest.approx(accuracy_score(y_true, y_pred))
    assert metrics["top1"] == pytest.approx(4 / 9)  # red, red, green, blue: no white one
    assert metrics["top2"] == pytest.approx((top2 == y_true[:, None]).any(axis=1).mean())
    assert metrics["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(y_true, y_pred))
    for average in ("macro", "weighted"):
        figures = precision_recall_fscore_support(
            y_true, y_pred, labels=labels, average=average, zero_division=0
        )[:3]
        reported = [metrics[f"{name}_{average}"] for name in ("precision", "recall", "f1")]
        assert reported == pytest.approx(figures)
    micro = precision_recall_fscore_support(
        y_true, y_pred, labels=labels, average="micro", zero_division=0
    )[2]
    assert metrics["f1_micro"] == pytest.approx(micro)
    precision, recall, f1, support = precision_recall_fscore_support(
        y_true, y_pred, labels=labels, average=None, zero_division=0
    )
    per_class = metrics["per_class"]
    assert [c["precision"] for c in per_class] == pytest.approx(precision)
    assert [c["recall"] for c in per_class] == pytest.approx(recall)
    assert [c["top1"] for c in per_class] == pytest.approx(recall)
    assert [c["f1"] for c in per_class] == pytest.approx(f1)
    assert [c["support"] for c in per_class] == support.tolist()  # the NaN images counted
    assert [c["predicted"] for c in per_class] == np.bincount(y_pred[y_pred >= 0]).tolist()
    hits = (top2 == y_true[:, None]).any(axis=1)
    assert [c["top2"] for c in per_class] == pytest.approx(
        [hits[y_true == label].mean() for label in labels]
    )
    with open(out / "confusion_matrix.csv", newline="") as file:
        matrix = [[int(cell) for cell in row[1:]] for row in list(csv.reader(file))[1:]]
    assert matrix == confusion_matrix(y_true, y_pred, labels=labels).tolist()
    # --format csv's `all` row: the images with a class predicted, micro F1 over them.
    (every,) = [row for row in csv.DictReader(io.StringIO(done.stdout)) if row["label"] == "all"]
    assert int(every["support"]) == 9 and int(every["predicted"]) == 6
    assert float(every["f1"]) == pytest.approx(micro)
    # errors.png: the 3 images without a class among the 5 mistakes, named as none.
    (titles,) = drawn
    shown = [text["s"] for text in titles if text["s"].startswith("pred: ")]
    assert len(shown) == 5 and shown.count("pred: none (not finite)") == 3
