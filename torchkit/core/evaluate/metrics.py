"""Classification metrics from true labels, predictions and top-k predictions, in NumPy.

The definitions follow scikit-learn (the tests check every number against it):
- precision = tp / predicted, recall = tp / support, F1 = 2 tp / (support + predicted); a ratio
  whose denominator is 0 is defined as 0 (scikit-learn's `zero_division=0`), so a class with no
  images has recall 0 and a class never predicted has precision 0;
- macro averages are taken over the classes that occur among the true labels or the predictions
  (scikit-learn's default `labels=None`): a class with no images that the model never predicts
  does not drag the averages down;
- weighted averages weight each class by its support; micro F1 pools all decisions (for
  single-label classification it equals the accuracy).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CONFUSED_SHOWN = 5


@dataclass
class ClassificationMetrics:
    """Every number `eval` reports, computed from integer labels."""

    num_samples: int
    confusion: np.ndarray  # (C, C) int64: rows true, columns predicted
    support: np.ndarray  # (C,) images per true class
    predicted: np.ndarray  # (C,) predictions per class
    precision: np.ndarray  # (C,)
    recall: np.ndarray  # (C,)
    f1: np.ndarray  # (C,)
    accuracy: float
    topk: int
    topk_accuracy: float
    precision_macro: float
    recall_macro: float
    f1_macro: float
    precision_weighted: float
    recall_weighted: float
    f1_weighted: float
    f1_micro: float
    averaged_classes: int  # how many classes the macro averages are taken over


def confusion_matrix(y_true: np.ndarray, y_pred: np.ndarray, num_classes: int) -> np.ndarray:
    """C[i, j] = number of images of class i predicted as class j."""
    y_true = np.asarray(y_true, dtype=np.int64)
    y_pred = np.asarray(y_pred, dtype=np.int64)
    flat = np.bincount(y_true * num_classes + y_pred, minlength=num_classes * num_classes)
    return flat.reshape(num_classes, num_classes)


def _divide(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator, 0 where the denominator is 0 (scikit-learn's zero_division=0)."""
    numerator = np.asarray(numerator, dtype=np.float64)
    denominator = np.asarray(denominator, dtype=np.float64)
    out = np.zeros(np.broadcast(numerator, denominator).shape, dtype=np.float64)
    np.divide(numerator, denominator, out=out, where=denominator != 0)
    return out


def per_class_scores(confusion: np.ndarray) -> tuple[np.ndarray, ...]:
    """(precision, recall, f1, support, predicted) for every class of a confusion matrix."""
    tp = np.diag(confusion).astype(np.int64)
    support = confusion.sum(axis=1)
    predicted = confusion.sum(axis=0)
    precision = _divide(tp, predicted)
    recall = _divide(tp, support)
    f1 = _divide(2 * tp, support + predicted)
    return precision, recall, f1, support, predicted


def topk_accuracy(y_true: np.ndarray, topk_labels: np.ndarray, k: int) -> float:
    """Fraction of images whose true class is among the first `k` columns of `topk_labels`."""
    y_true = np.asarray(y_true, dtype=np.int64)
    if len(y_true) == 0:
        return 0.0
    hits = (np.asarray(topk_labels)[:, :k] == y_true[:, None]).any(axis=1)
    return float(hits.mean())


def most_confused(confusion: np.ndarray, label: int, n: int = CONFUSED_SHOWN) -> list[tuple]:
    """The classes images of `label` are most often mistaken for: [(other, count), ...], largest
    count first (ties: lower label first), the class itself and zero counts left out."""
    row = confusion[label]
    others = [(int(j), int(row[j])) for j in range(len(row)) if j != label and row[j] > 0]
    others.sort(key=lambda pair: (-pair[1], pair[0]))
    return others[:n]


def compute_metrics(
    y_true: np.ndarray, y_pred: np.ndarray, topk_labels: np.ndarray, num_classes: int, k: int
) -> ClassificationMetrics:
    """All metrics for single-label classification into `num_classes` classes.

    `topk_labels` is (N, >=k): each row the predicted classes by decreasing score.
    """
    y_true = np.asarray(y_true, dtype=np.int64)
    y_pred = np.asarray(y_pred, dtype=np.int64)
    cm = confusion_matrix(y_true, y_pred, num_classes)
    precision, recall, f1, support, predicted = per_class_scores(cm)
    present = (support > 0) | (predicted > 0)
    averaged = int(present.sum())

    def macro(values: np.ndarray) -> float:
        return float(values[present].mean()) if averaged else 0.0

    def weighted(values: np.ndarray) -> float:
        total = support.sum()
        return float(np.average(values, weights=support)) if total else 0.0

    tp_total = int(np.trace(cm))
    # Pooled over all decisions; with one label per image it equals the accuracy.
    micro_f1 = float(_divide(2 * tp_total, predicted.sum() + support.sum()))
    n = len(y_true)
    return ClassificationMetrics(
        num_samples=n,
        confusion=cm,
        support=support,
        predicted=predicted,
        precision=precision,
        recall=recall,
        f1=f1,
        accuracy=float(tp_total / n) if n else 0.0,
        topk=k,
        topk_accuracy=topk_accuracy(y_true, topk_labels, k),
        precision_macro=macro(precision),
        recall_macro=macro(recall),
        f1_macro=macro(f1),
        precision_weighted=weighted(precision),
        recall_weighted=weighted(recall),
        f1_weighted=weighted(f1),
        f1_micro=micro_f1,
        averaged_classes=averaged,
    )
