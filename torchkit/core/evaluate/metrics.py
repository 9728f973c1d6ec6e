"""Classification metrics from true labels, predictions and top-k predictions.

scikit-learn's `sklearn.metrics` computes the per-class scores and their averages (the confusion
matrix, as its non-zero cells, and the top-k accuracy are counted here, in one pass over the
images). It is imported when metrics are computed, not with this module: with scipy and pandas,
it takes a second or more to import. The definitions are scikit-learn's:
- precision = tp / predicted, recall = tp / support, F1 = 2 tp / (support + predicted); a ratio
  whose denominator is 0 is defined as 0 (scikit-learn's `zero_division=0`), so a class with no
  images has recall 0 and a class never predicted has precision 0;
- macro averages are taken over the classes that occur among the true labels or the predictions
  (scikit-learn's default `labels=None`): a class with no images that the model never predicts
  does not drag the averages down;
- weighted averages weight each class by its support; micro F1 pools all decisions (for
  single-label classification it equals the accuracy, but for images without a prediction);
- balanced accuracy is the mean recall over the classes that have images (scikit-learn's
  `balanced_accuracy_score`): unlike the macro recall, a class the model predicts but the data
  lacks does not count.
An image without a prediction (-1, `NO_PREDICTION`: the model's outputs for it were not finite)
is a miss in every figure: never correct in the accuracies, counted in its true class's support
and not in its recall's hits, in no class's predictions (no precision gains or loses from it)
and in no cell of the confusion matrix, as scikit-learn leaves out of `confusion_matrix(labels=
range(C))` a prediction outside the labels; -1 is never counted as a class.
An image whose true label is not a class (-1: unlabelled) has no truth to be scored against: it
is left out of every figure, as scikit-learn's `confusion_matrix(labels=range(C))` leaves it out
of the matrix (scikit-learn's accuracy would count it as a mistake, and its precision as a false
positive of the class predicted). No images at all (which scikit-learn refuses) give zero counts
and scores.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

CONFUSED_SHOWN = 5
NO_PREDICTION = -1  # the predicted label of an image of non-finite outputs: no class


@dataclass
class ClassificationMetrics:
    """Every number `eval` reports, computed from integer labels."""

    num_samples: int
    pairs: ConfusionPairs  # the confusion matrix's non-zero cells
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
    balanced_accuracy: float  # mean recall over the classes with images

    @property
    def confusion(self) -> np.ndarray:
        """The dense (C, C) int64 confusion matrix (rows true, columns predicted), made on
        demand: C x C cells (3.2 GB at 20,000 classes), so eval builds it only for the reports
        of up to `DENSE_CONFUSION_MAX_CLASSES` classes."""
        return self.pairs.dense()


def topk_accuracy(y_true: np.ndarray, topk_labels: np.ndarray, k: int) -> float:
    """Fraction of images whose true class is among the first `k` columns of `topk_labels`.

    Counted here: scikit-learn's `top_k_accuracy_score` wants every class's score, eval keeps the
    top k labels."""
    y_true = np.asarray(y_true, dtype=np.int64)
    if len(y_true) == 0:
        return 0.0
    hits = (np.asarray(topk_labels)[:, :k] == y_true[:, None]).any(axis=1)
    return float(hits.mean())


def balanced_accuracy(correct: np.ndarray, support: np.ndarray) -> float:
    """The mean recall over the classes with images (`correct` of `support` each): scikit-learn's
    `balanced_accuracy_score`; 0 without images."""
    present = support > 0
    if not present.any():
        return 0.0
    return float(np.mean(correct[present] / support[present]))


def _known(y_true: np.ndarray, y_pred: np.ndarray, num_classes: int) -> np.ndarray:
    """Which pairs have both labels in range(num_classes)."""
    return (y_true >= 0) & (y_true < num_classes) & (y_pred >= 0) & (y_pred < num_classes)


@dataclass
class ConfusionPairs:
    """The confusion matrix as its non-zero cells: `count[i]` images of class `true[i]` were
    predicted as `predicted[i]`, sorted by true class, then predicted class. Its size follows the
    images (at most one pair each), never the square of the classes; only `dense` builds C x C."""

    num_classes: int
    true: np.ndarray  # (P,) int64
    predicted: np.ndarray  # (P,) int64
    count: np.ndarray  # (P,) int64, each > 0

    @classmethod
    def counted(cls, y_true: np.ndarray, y_pred: np.ndarray, num_classes: int) -> ConfusionPairs:
        """The pairs of scikit-learn's `confusion_matrix(labels=range(C))`: labels outside
        range(C) are left out, as it leaves them out."""
        y_true = np.asarray(y_true, dtype=np.int64)
        y_pred = np.asarray(y_pred, dtype=np.int64)
        known = _known(y_true, y_pred, num_classes)
        cells, count = np.unique(y_true[known] * num_classes + y_pred[known], return_counts=True)
        return cls(num_classes, cells // num_classes, cells % num_classes, count.astype(np.int64))

    def __eq__(self, other: object) -> bool:  # the same cells (dataclass's == compares arrays)
        if not isinstance(other, ConfusionPairs):
            return NotImplemented
        return self.num_classes == other.num_classes and all(
            np.array_equal(getattr(self, name), getattr(other, name))
            for name in ("true", "predicted", "count")
        )

    def dense(self) -> np.ndarray:
        """The (C, C) int64 matrix, rows true, columns predicted."""
        cm = np.zeros((self.num_classes, self.num_classes), dtype=np.int64)
        cm[self.true, self.predicted] = self.count
        return cm

    def _per_class(self, labels: np.ndarray, count: np.ndarray) -> np.ndarray:
        totals = np.zeros(self.num_classes, dtype=np.int64)
        np.add.at(totals, labels, count)
        return totals

    def support(self) -> np.ndarray:
        """(C,) images per true class (the row sums)."""
        return self._per_class(self.true, self.count)

    def predictions(self) -> np.ndarray:
        """(C,) predictions per class (the column sums)."""
        return self._per_class(self.predicted, self.count)

    def correct(self) -> np.ndarray:
        """(C,) images of each class predicted as it (the diagonal)."""
        same = self.true == self.predicted
        return self._per_class(self.true[same], self.count[same])

    def most_confused(self, n: int = CONFUSED_SHOWN) -> list[list[tuple[int, int]]]:
        """Per class, the classes its images are most often mistaken for: [(other, count), ...],
        at most `n`, largest count first (ties: lower label first), the class itself left out;
        one sort of the pairs, never a look at every class of every row."""
        wrong = self.true != self.predicted
        true, predicted, count = self.true[wrong], self.predicted[wrong], self.count[wrong]
        order = np.lexsort((predicted, -count, true))
        true, predicted, count = true[order], predicted[order], count[order]
        rank = np.arange(len(true)) - np.searchsorted(true, true, side="left")
        shown = rank < n
        found: list[list[tuple[int, int]]] = [[] for _ in range(self.num_classes)]
        for label, other, number in zip(
            true[shown].tolist(), predicted[shown].tolist(), count[shown].tolist(), strict=True
        ):
            found[label].append((other, number))
        return found


def compute_metrics(
    y_true: np.ndarray,
    y_pred: np.ndarray,
    topk_labels: np.ndarray,
    num_classes: int,
    k: int,
    *,
    scorer: Any = None,
) -> ClassificationMetrics:
    """All metrics for single-label classification into `num_classes` classes.

    `topk_labels` is (N, >=k): each row the predicted classes by decreasing score. `scorer`: a
    started helper process serving this module (`start_scorer`), which has imported
    scikit-learn while eval ran; without one, or when it gives no answer, the scores are
    computed here.
    """
    y_true = np.asarray(y_true, dtype=np.int64)
    y_pred = np.asarray(y_pred, dtype=np.int64)
    labelled = (y_true >= 0) & (y_true < num_classes)
    if not labelled.all():  # unlabelled images: no figure can score them
        y_true, y_pred = y_true[labelled], y_pred[labelled]
        topk_labels = np.asarray(topk_labels)[labelled]
    if len(y_true) == 0:
        return _no_images(num_classes, k)
    request = {"y_true": y_true.tolist(), "y_pred": y_pred.tolist(), "num_classes": num_classes}
    scores = scorer.call(request) if scorer is not None else None
    if scores is None:
        scores = answer(request)
    pairs = ConfusionPairs.counted(y_true, y_pred, num_classes)
    # Not the matrix's row sums: an image without a prediction is in no cell, yet of its class.
    support = np.bincount(y_true, minlength=num_classes).astype(np.int64)
    macro, weighted = scores["macro"], scores["weighted"]
    return ClassificationMetrics(
        num_samples=len(y_true),
        pairs=pairs,
        support=support,
        predicted=pairs.predictions(),
        precision=np.asarray(scores["precision"], dtype=np.float64),
        recall=np.asarray(scores["recall"], dtype=np.float64),
        f1=np.asarray(scores["f1"], dtype=np.float64),
        accuracy=float(scores["accuracy"]),
        topk=k,
        topk_accuracy=topk_accuracy(y_true, topk_labels, k),
        precision_macro=macro[0],
        recall_macro=macro[1],
        f1_macro=macro[2],
        precision_weighted=weighted[0],
        recall_weighted=weighted[1],
        f1_weighted=weighted[2],
        f1_micro=float(scores["f1_micro"]),
        averaged_classes=int(scores["averaged_classes"]),
        balanced_accuracy=balanced_accuracy(pairs.correct(), support),
    )


# scikit-learn's part, as a helper process serves it (core.helper_process): plain values in and
# out, so that the helper's answer and this process's own are the same numbers.
SERVICE = "torchkit.core.evaluate.metrics"


def start_scorer(plots: bool = False) -> Any:
    """A helper process that imports scikit-learn now, beside eval's own start-up, and scores
    its predictions at the end (`compute_metrics(scorer=...)`); None where scikit-learn is
    imported already or no helper can start. Close it with `.close()`. With `plots` it also
    serves the plotting service (`plot_helper.PlotHelper.sharing`): one helper process, not a
    second one competing with it and eval for two cores."""
    import sys

    if "sklearn.metrics" in sys.modules:
        return None
    from torchkit.core.runtime import plot_helper
    from torchkit.core.runtime.helper_process import HelperProcess

    more = (plot_helper.SERVICE,) if plots and plot_helper.wanted() else ()
    return HelperProcess.spawn(SERVICE, *more)


def prepare() -> None:
    """The helper's import: scikit-learn's metrics (with scipy, about 1.5 s)."""
    import sklearn.metrics  # noqa: F401


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """scikit-learn's per-class scores and averages of `request`'s labels."""
    from sklearn.metrics import accuracy_score, precision_recall_fscore_support

    y_true = np.asarray(request["y_true"], dtype=np.int64)
    y_pred = np.asarray(request["y_pred"], dtype=np.int64)
    every_class = np.arange(request["num_classes"])

    def scores(labels: np.ndarray, average: str | None) -> tuple:
        return precision_recall_fscore_support(
            y_true, y_pred, labels=labels, average=average, zero_division=0
        )[:3]

    # Counted, not taken from scikit-learn's support (a float for a class with no images). No
    # confusion matrix is built or sent here: C x C values as Python lists cost seconds and GBs
    # at thousands of classes; the caller counts its pairs (`ConfusionPairs`).
    # Each side on its own: an image without a prediction (-1) is still of its true class.
    count = len(every_class)
    support = np.bincount(y_true[(y_true >= 0) & (y_true < count)], minlength=count)
    predicted = np.bincount(y_pred[(y_pred >= 0) & (y_pred < count)], minlength=count)
    precision, recall, f1 = scores(every_class, None)
    # The classes scikit-learn's default labels=None averages over, named so they can be counted.
    present = np.flatnonzero((support > 0) | (predicted > 0))
    return {
        "precision": np.asarray(precision, dtype=np.float64).tolist(),
        "recall": np.asarray(recall, dtype=np.float64).tolist(),
        "f1": np.asarray(f1, dtype=np.float64).tolist(),
        "accuracy": float(accuracy_score(y_true, y_pred)),
        "macro": [float(value) for value in scores(present, "macro")],
        # Over every class: those with no images weigh 0, and the sum runs as it always has.
        "weighted": [float(value) for value in scores(every_class, "weighted")],
        "f1_micro": float(scores(present, "micro")[2]),
        "averaged_classes": len(present),
    }


def _no_images(num_classes: int, k: int) -> ClassificationMetrics:
    """The metrics of an empty evaluation: every count and score 0."""
    counts = np.zeros(num_classes, dtype=np.int64)
    scores = np.zeros(num_classes, dtype=np.float64)
    return ClassificationMetrics(
        num_samples=0,
        pairs=ConfusionPairs.counted(np.zeros(0), np.zeros(0), num_classes),
        support=counts,
        predicted=counts.copy(),
        precision=scores,
        recall=scores.copy(),
        f1=scores.copy(),
        accuracy=0.0,
        topk=k,
        topk_accuracy=0.0,
        precision_macro=0.0,
        recall_macro=0.0,
        f1_macro=0.0,
        precision_weighted=0.0,
        recall_weighted=0.0,
        f1_weighted=0.0,
        f1_micro=0.0,
        averaged_classes=0,
        balanced_accuracy=0.0,
    )
