"""torchkit.core.evaluate.metrics against scikit-learn (no torch needed)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import (
    confusion_matrix,
    f1_score,
    precision_recall_fscore_support,
    top_k_accuracy_score,
)

from torchkit.core.evaluate.metrics import compute_metrics, most_confused


def _case(seed: int, n: int = 300, num_classes: int = 7):
    """Random labels and scores; class 5 never occurs in the truth, class 6 nowhere at all."""
    rng = np.random.default_rng(seed)
    y_true = rng.choice([0, 1, 2, 3, 4], size=n, p=[0.4, 0.3, 0.15, 0.1, 0.05])
    scores = rng.normal(size=(n, num_classes))
    scores[np.arange(n), y_true] += 1.5  # better than chance, with mistakes
    scores[:, 6] = -10.0
    order = np.argsort(-scores, axis=1, kind="stable")
    return y_true, scores, order


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_metric_matches_sklearn(seed):
    y_true, scores, order = _case(seed)
    num_classes, k = scores.shape[1], 3
    y_pred = order[:, 0]
    assert (y_pred == 5).any(), "the case should predict a class that has no images"
    m = compute_metrics(y_true, y_pred, order[:, :k], num_classes, k)

    labels = list(range(num_classes))
    np.testing.assert_array_equal(m.confusion, confusion_matrix(y_true, y_pred, labels=labels))
    p, r, f, s = precision_recall_fscore_support(
        y_true, y_pred, labels=labels, average=None, zero_division=0
    )
    np.testing.assert_allclose(m.precision, p, rtol=0, atol=1e-12)
    np.testing.assert_allclose(m.recall, r, rtol=0, atol=1e-12)
    np.testing.assert_allclose(m.f1, f, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(m.support, s)
    assert m.support[5] == 0 and m.recall[5] == 0.0 and m.precision[5] == 0.0
    for average in ("macro", "weighted"):
        p, r, f, _ = precision_recall_fscore_support(
            y_true, y_pred, average=average, zero_division=0
        )
        assert getattr(m, f"precision_{average}") == pytest.approx(p, abs=1e-12)
        assert getattr(m, f"recall_{average}") == pytest.approx(r, abs=1e-12)
        assert getattr(m, f"f1_{average}") == pytest.approx(f, abs=1e-12)
    # Class 6 has no images and is never predicted: left out of the macro average, like sklearn.
    assert m.averaged_classes == 6
    assert m.f1_micro == pytest.approx(f1_score(y_true, y_pred, average="micro"), abs=1e-12)
    assert m.accuracy == pytest.approx(np.mean(y_true == y_pred), abs=1e-12)
    assert m.topk_accuracy == pytest.approx(
        top_k_accuracy_score(y_true, scores, k=k, labels=labels), abs=1e-12
    )


def test_most_confused_skips_the_class_itself_and_zero_counts():
    cm = np.array([[5, 2, 0, 2], [1, 3, 0, 0], [0, 0, 0, 0], [0, 4, 1, 9]])
    assert most_confused(cm, 0) == [(1, 2), (3, 2)]  # ties: lower label first
    assert most_confused(cm, 2) == []
    assert most_confused(cm, 3, n=1) == [(1, 4)]


def test_empty_and_perfect_cases():
    m = compute_metrics(np.array([0, 1, 1]), np.array([0, 1, 1]), np.array([[0], [1], [1]]), 3, 1)
    assert (m.accuracy, m.f1_macro, m.f1_weighted, m.topk_accuracy) == (1.0, 1.0, 1.0, 1.0)
    assert m.support.tolist() == [1, 2, 0]
