"""Every figure of torchkit's classification metrics checked against scikit-learn's on the same
labels (the tests' one such comparison)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import (
    accuracy_score,
    balanced_accuracy_score,
    confusion_matrix,
    f1_score,
    precision_recall_fscore_support,
)


def assert_metrics_match_sklearn(m, y_true, y_pred, num_classes):
    """Every figure of `m` equals scikit-learn's on these labels (all of them labelled)."""
    labels = list(range(num_classes))
    np.testing.assert_array_equal(m.confusion, confusion_matrix(y_true, y_pred, labels=labels))
    p, r, f, s = precision_recall_fscore_support(
        y_true, y_pred, labels=labels, average=None, zero_division=0
    )
    np.testing.assert_allclose(m.precision, p, rtol=0, atol=1e-12)
    np.testing.assert_allclose(m.recall, r, rtol=0, atol=1e-12)
    np.testing.assert_allclose(m.f1, f, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(m.support, s)
    np.testing.assert_array_equal(m.predicted, np.bincount(y_pred, minlength=num_classes))
    for average in ("macro", "weighted"):
        p, r, f, _ = precision_recall_fscore_support(
            y_true, y_pred, average=average, zero_division=0
        )
        assert getattr(m, f"precision_{average}") == pytest.approx(p, abs=1e-12)
        assert getattr(m, f"recall_{average}") == pytest.approx(r, abs=1e-12)
        assert getattr(m, f"f1_{average}") == pytest.approx(f, abs=1e-12)
    assert m.accuracy == pytest.approx(accuracy_score(y_true, y_pred), abs=1e-12)
    assert m.f1_micro == pytest.approx(f1_score(y_true, y_pred, average="micro"), abs=1e-12)
    assert m.balanced_accuracy == pytest.approx(balanced_accuracy_score(y_true, y_pred), abs=1e-12)
    assert m.num_samples == len(y_true)
