"""torchkit.core.evaluate.metrics against scikit-learn on the cases a real evaluation brings:
classes missing from the truth or the predictions, one class, k at least the number of classes,
unlabelled images (-1), balanced accuracy (no torch needed)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import (
    balanced_accuracy_score,
    confusion_matrix,
    precision_recall_fscore_support,
    top_k_accuracy_score,
)
from sklearn_reference import assert_metrics_match_sklearn

from torchkit.core.evaluate.metrics import compute_metrics
from torchkit.core.topk import reported_topk


# scikit-learn warns where a class is predicted that the truth lacks: the case under test
@pytest.mark.filterwarnings("ignore:y_pred contains classes not in y_true")
def test_classes_absent_from_the_truth_or_the_predictions():
    """Class 2 is predicted but has no images (precision 0, recall 0/0 -> 0), class 1 has images
    but is never predicted (precision 0/0 -> 0), class 3 is nowhere (left out of the macro
    average); balanced accuracy leaves class 2 out, the macro recall does not."""
    y_true = np.array([0, 0, 0, 1, 1, 4, 4, 4])
    y_pred = np.array([0, 2, 0, 0, 2, 4, 4, 2])
    m = compute_metrics(y_true, y_pred, y_pred[:, None], 5, 1)
    assert_metrics_match_sklearn(m, y_true, y_pred, 5)
    assert m.precision.tolist()[1:4] == [0.0, 0.0, 0.0] and m.recall[2] == 0.0
    assert m.averaged_classes == 4
    assert m.balanced_accuracy == pytest.approx((2 / 3 + 0 + 2 / 3) / 3)
    assert m.recall_macro == pytest.approx((2 / 3 + 0 + 0 + 2 / 3) / 4)


@pytest.mark.filterwarnings("ignore:y_pred contains classes not in y_true")
@pytest.mark.filterwarnings("ignore:A single label was found")
@pytest.mark.parametrize("num_classes", [1, 3])
def test_one_class_in_the_data(num_classes):
    """Every image of class 0: a one-class model, or three classes of which the test split holds
    one (the other two predicted now and then)."""
    y_true = np.zeros(6, dtype=np.int64)
    y_pred = np.array([0, 0, 0, 0, 0, 0]) if num_classes == 1 else np.array([0, 1, 0, 2, 0, 0])
    m = compute_metrics(y_true, y_pred, y_pred[:, None], num_classes, 1)
    assert_metrics_match_sklearn(m, y_true, y_pred, num_classes)
    assert m.balanced_accuracy == m.recall[0] == m.accuracy


@pytest.mark.filterwarnings("ignore:'k' \\(3\\) greater than or equal to 'n_classes'")
def test_topk_with_k_at_least_the_number_of_classes():
    """Every class is in the top k: 1 by definition, reported as null; each row ranks all C."""
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(20, 3))
    order = np.argsort(-scores, axis=1, kind="stable")  # the C columns a ranking of k=5 gives
    y_true = rng.integers(0, 3, 20)
    for k in (3, 5):
        m = compute_metrics(y_true, order[:, 0], order, 3, k)
        assert m.topk_accuracy == 1.0
        assert top_k_accuracy_score(y_true, scores, k=3, labels=[0, 1, 2]) == 1.0
        assert reported_topk(m.topk_accuracy, k, 3) is None
    m = compute_metrics(y_true, order[:, 0], order, 3, 2)
    assert m.topk_accuracy == top_k_accuracy_score(y_true, scores, k=2, labels=[0, 1, 2])


def test_tied_scores_rank_the_lower_class_first_where_sklearn_ranks_the_higher():
    """What docs/commands/eval.md says of ties: the top-1 class is the argmax, whatever k; on
    an untrained head's equal scores scikit-learn's top_k_accuracy_score gives another top-2."""
    import torch

    from torchkit.core.topk import ranked_classes

    scores, y_true = np.zeros((3, 4)), np.array([0, 1, 3])
    ranked = ranked_classes(torch.from_numpy(scores), 2).numpy()
    assert (ranked[:, 0] == scores.argmax(axis=1)).all()
    m = compute_metrics(y_true, ranked[:, 0], ranked, 4, 2)
    assert (m.accuracy, m.topk_accuracy) == (1 / 3, 2 / 3)  # classes 0 and 1 rank first
    assert top_k_accuracy_score(y_true, scores, k=2, labels=range(4)) == 1 / 3  # 3 and 2 first


def test_unlabelled_images_are_left_out_of_every_figure():
    """Images labelled -1 (no label) have no truth: every figure is that of the labelled images
    alone. The accuracies counted them as mistakes (0.5, not 1.0) and the precision of the class
    predicted for them as false positives, while the confusion matrix and the supports left them
    out: figures of two different sets of images in one report."""
    y_true = np.array([0, 1, -1, 2, -1, 2, 1, 0])
    y_pred = np.array([0, 1, 1, 2, 0, 2, 1, 0])
    topk = np.array([[0, 1], [1, 0], [1, 2], [2, 0], [0, 1], [2, 1], [1, 2], [0, 2]])
    m = compute_metrics(y_true, y_pred, topk, 3, 2)
    labelled = y_true >= 0
    assert_metrics_match_sklearn(m, y_true[labelled], y_pred[labelled], 3)
    assert m.accuracy == m.topk_accuracy == m.balanced_accuracy == 1.0
    assert m.precision.tolist() == [1.0, 1.0, 1.0]
    assert m.num_samples == int(m.support.sum()) == int(m.predicted.sum()) == 6

    none = compute_metrics(np.array([-1, -1]), np.array([0, 1]), np.array([[0], [1]]), 2, 1)
    assert none.num_samples == 0 and none.accuracy == none.balanced_accuracy == 0.0


@pytest.mark.filterwarnings("ignore:y_pred contains classes not in y_true")
@pytest.mark.parametrize("seed", [0, 1])
def test_balanced_accuracy_is_sklearns_on_imbalanced_data(seed):
    rng = np.random.default_rng(seed)
    y_true = rng.choice(6, size=200, p=[0.6, 0.2, 0.1, 0.05, 0.05, 0.0])
    y_pred = np.where(rng.random(200) < 0.7, y_true, rng.integers(0, 6, 200))
    m = compute_metrics(y_true, y_pred, y_pred[:, None], 6, 1)
    assert_metrics_match_sklearn(m, y_true, y_pred, 6)


def test_per_class_figures_follow_the_checkpoints_class_order(tmp_path):
    """A checkpoint trained on classes c, a, b scored on folders a/, b/, c/ (which sort
    otherwise): eval's rows are the checkpoint's outputs in its order, each with scikit-learn's
    figures for the images of that class, labelled by folder and predicted as predict says."""
    import json

    from checkpoints import write_convnet_checkpoint
    from image_folders import write_image_folder
    from processes import run_torchkit_in_process

    checkpoint = tmp_path / "ck.pt"
    write_convnet_checkpoint(checkpoint, in_channels=3, image_size=8, classes="cab")
    images = write_image_folder(tmp_path / "images", {"a": 4, "b": 3, "c": 2})
    scored = run_torchkit_in_process(
        "eval", checkpoint, "--data", images, "-j", "0", "--format", "json"
    )
    predicted = run_torchkit_in_process(
        "predict", checkpoint, images, "-j", "0", "--format", "json"
    )
    assert scored.returncode == predicted.returncode == 0, scored.stderr + predicted.stderr
    report = json.loads(scored.stdout)
    rows = json.loads(predicted.stdout)
    order = ["c", "a", "b"]
    y_true = [order.index(row["path"].split("/")[0]) for row in rows]
    y_pred = [row["class_index"] for row in rows]
    assert [row["class"] for row in rows] == [order[i] for i in y_pred]
    p, r, f, s = precision_recall_fscore_support(
        y_true, y_pred, labels=[0, 1, 2], average=None, zero_division=0
    )
    assert report["classes"] == order
    assert [row["label"] for row in report["per_class"]] == order
    assert [row["support"] for row in report["per_class"]] == s.tolist() == [2, 4, 3]
    assert [row["predicted"] for row in report["per_class"]] == np.bincount(
        y_pred, minlength=3
    ).tolist()
    for name, expected in (("precision", p), ("recall", r), ("f1", f)):
        got = [row[name] for row in report["per_class"]]
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    cells = confusion_matrix(y_true, y_pred, labels=[0, 1, 2])
    for true, row in enumerate(report["per_class"]):
        for other in row["confused_with"]:
            assert cells[true, order.index(other["class"])] == other["count"]
    assert report["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(y_true, y_pred))
