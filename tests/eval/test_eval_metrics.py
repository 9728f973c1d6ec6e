"""torchkit.core.evaluate.metrics against scikit-learn and against the NumPy oracle in
metrics_oracle.py (no torch needed)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import sklearn
from metrics_oracle import oracle_metrics
from sklearn.metrics import (
    top_k_accuracy_score,
)
from sklearn_reference import assert_metrics_match_sklearn

from torchkit.core.evaluate.metrics import ConfusionPairs, compute_metrics


def _case(seed: int, n: int = 300, num_classes: int = 7):
    """Random labels and scores; class 5 never occurs in the truth, class 6 nowhere at all."""
    rng = np.random.default_rng(seed)
    y_true = rng.choice([0, 1, 2, 3, 4], size=n, p=[0.4, 0.3, 0.15, 0.1, 0.05])
    scores = rng.normal(size=(n, num_classes))
    scores[np.arange(n), y_true] += 1.5  # better than chance, with mistakes
    scores[:, 6] = -10.0
    order = np.argsort(-scores, axis=1, kind="stable")
    return y_true, scores, order


# scikit-learn warns where a class is predicted that the truth lacks (class 5): the case
@pytest.mark.filterwarnings("ignore:y_pred contains classes not in y_true")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_metric_matches_sklearn(seed):
    y_true, scores, order = _case(seed)
    num_classes, k = scores.shape[1], 3
    y_pred = order[:, 0]
    assert (y_pred == 5).any(), "the case should predict a class that has no images"
    m = compute_metrics(y_true, y_pred, order[:, :k], num_classes, k)

    assert_metrics_match_sklearn(m, y_true, y_pred, num_classes)
    assert m.support[5] == 0 and m.recall[5] == 0.0 and m.precision[5] == 0.0
    # Class 6 has no images and is never predicted: left out of the macro average, like sklearn.
    assert m.averaged_classes == 6
    assert m.topk_accuracy == pytest.approx(
        top_k_accuracy_score(y_true, scores, k=k, labels=list(range(num_classes))), abs=1e-12
    )


def test_most_confused_skips_the_class_itself_and_zero_counts():
    cm = np.array([[5, 2, 0, 2], [1, 3, 0, 0], [0, 0, 0, 0], [0, 4, 1, 9]])
    true, predicted = np.nonzero(cm)
    pairs = ConfusionPairs.counted(
        np.repeat(true, cm[true, predicted]), np.repeat(predicted, cm[true, predicted]), 4
    )
    np.testing.assert_array_equal(pairs.dense(), cm)
    found = pairs.most_confused()
    assert found[0] == [(1, 2), (3, 2)]  # ties: lower label first
    assert found[2] == []
    assert pairs.most_confused(n=1)[3] == [(1, 4)]


def test_empty_and_perfect_cases():
    m = compute_metrics(np.array([0, 1, 1]), np.array([0, 1, 1]), np.array([[0], [1], [1]]), 3, 1)
    assert (m.accuracy, m.f1_macro, m.f1_weighted, m.topk_accuracy) == (1.0, 1.0, 1.0, 1.0)
    assert m.support.tolist() == [1, 2, 0]


# scikit-learn computes F1 from the counts, as the oracle does, since 1.4; before, from precision
# and recall, which can differ in the last bit.
FLOATS_BITWISE = tuple(int(part) for part in sklearn.__version__.split(".")[:2]) >= (1, 4)


def _oracle_cases():
    """(name, y_true, y_pred, num_classes): random and edge-case labels and predictions."""
    rng = np.random.default_rng(7)
    for seed in range(4):
        num_classes = int(rng.integers(2, 30))
        n = int(rng.integers(1, 500))
        y_true = rng.integers(0, num_classes, n)
        y_pred = np.where(rng.random(n) < 0.6, y_true, rng.integers(0, num_classes, n))
        yield f"random-{seed}", y_true, y_pred, num_classes
    y_true = np.array([0, 0, 1, 1, 1, 2, 3, 3])
    yield "a class never predicted", y_true, np.array([0, 1, 1, 1, 0, 1, 3, 0]), 4
    yield "a class with no images", y_true, np.array([0, 4, 1, 1, 4, 2, 3, 3]), 5
    yield "a class nowhere", y_true, np.array([0, 0, 1, 2, 1, 2, 3, 1]), 6
    yield "one class", np.zeros(5, int), np.zeros(5, int), 1
    yield "one class present of three", np.full(4, 2), np.full(4, 2), 3
    yield "every prediction wrong", np.array([0, 1, 2, 0]), np.array([1, 2, 0, 2]), 3
    yield "one image", np.array([1]), np.array([0]), 2
    yield "no images", np.array([], int), np.array([], int), 3


@pytest.mark.filterwarnings("error")  # no warning from scikit-learn, one class included
@pytest.mark.parametrize(
    ("y_true", "y_pred", "num_classes"),
    [case[1:] for case in _oracle_cases()],
    ids=[case[0] for case in _oracle_cases()],
)
def test_every_field_equals_the_numpy_oracle(y_true, y_pred, num_classes):
    topk = np.stack([y_pred, (y_pred + 1) % num_classes], axis=1)[:, : min(2, num_classes)]
    m = compute_metrics(y_true, y_pred, topk, num_classes, topk.shape[1])
    oracle = oracle_metrics(y_true, y_pred, num_classes)
    for name, expected in oracle.items():
        got = getattr(m, name)
        if isinstance(expected, np.ndarray):
            assert got.dtype == expected.dtype and got.shape == expected.shape, name
            if FLOATS_BITWISE or expected.dtype.kind == "i":
                np.testing.assert_array_equal(got, expected, err_msg=name)
            else:
                np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12, err_msg=name)
        else:
            assert type(got) is type(expected), name
            assert got == (expected if FLOATS_BITWISE else pytest.approx(expected, abs=1e-12)), name
    hits = [label in row for label, row in zip(y_true, topk, strict=True)]
    assert m.topk_accuracy == (float(np.mean(hits)) if hits else 0.0)
    assert m.num_samples == len(y_true) and m.topk == topk.shape[1]


def test_no_images_give_zero_counts_and_scores():
    m = compute_metrics(np.array([], int), np.array([], int), np.zeros((0, 2), int), 3, 2)
    assert m.confusion.shape == (3, 3) and not m.confusion.any()
    assert m.support.tolist() == m.predicted.tolist() == [0, 0, 0]
    assert m.precision.tolist() == m.recall.tolist() == m.f1.tolist() == [0.0] * 3
    assert (m.accuracy, m.topk_accuracy, m.f1_macro, m.f1_weighted, m.f1_micro) == (0.0,) * 5
    assert m.averaged_classes == 0


def test_importing_the_metrics_does_not_import_sklearn():
    code = (
        "import sys, torchkit.core.evaluate.metrics; "
        "print(sorted({n.split('.')[0] for n in sys.modules} & {'sklearn', 'scipy', 'pandas'}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
