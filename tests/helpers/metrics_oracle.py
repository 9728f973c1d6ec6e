"""The classification metrics written out in NumPy: an oracle independent of scikit-learn.

torchkit computes its metrics with `sklearn.metrics`; this module is the hand-written version
torchkit used before, kept so that the tests compare two implementations of the same definitions
(those of torchkit.core.evaluate.metrics' docstring) rather than scikit-learn against itself.
"""

from __future__ import annotations

import numpy as np


def confusion_matrix(y_true: np.ndarray, y_pred: np.ndarray, num_classes: int) -> np.ndarray:
    """C[i, j] = number of images of class i predicted as class j."""
    y_true = np.asarray(y_true, dtype=np.int64)
    y_pred = np.asarray(y_pred, dtype=np.int64)
    flat = np.bincount(y_true * num_classes + y_pred, minlength=num_classes * num_classes)
    return flat.reshape(num_classes, num_classes)


def divide(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator, 0 where the denominator is 0 (zero_division=0)."""
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
    precision = divide(tp, predicted)
    recall = divide(tp, support)
    f1 = divide(2 * tp, support + predicted)
    return precision, recall, f1, support, predicted


def oracle_metrics(y_true: np.ndarray, y_pred: np.ndarray, num_classes: int) -> dict:
    """Every number of ClassificationMetrics that comes from the labels and predictions alone
    (not the top-k accuracy), by field name."""
    y_true = np.asarray(y_true, dtype=np.int64)
    y_pred = np.asarray(y_pred, dtype=np.int64)
    cm = confusion_matrix(y_true, y_pred, num_classes)
    precision, recall, f1, support, predicted = per_class_scores(cm)
    present = (support > 0) | (predicted > 0)
    averaged = int(present.sum())

    def macro(values: np.ndarray) -> float:
        return float(values[present].mean()) if averaged else 0.0

    def weighted(values: np.ndarray) -> float:
        return float(np.average(values, weights=support)) if support.sum() else 0.0

    tp_total = int(np.trace(cm))
    n = len(y_true)
    return {
        "num_samples": n,
        "confusion": cm,
        "support": support,
        "predicted": predicted,
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "accuracy": float(tp_total / n) if n else 0.0,
        "precision_macro": macro(precision),
        "recall_macro": macro(recall),
        "f1_macro": macro(f1),
        "precision_weighted": weighted(precision),
        "recall_weighted": weighted(recall),
        "f1_weighted": weighted(f1),
        # Pooled over all decisions; with one label per image it equals the accuracy.
        "f1_micro": float(divide(2 * tp_total, predicted.sum() + support.sum())),
        "averaged_classes": averaged,
    }
