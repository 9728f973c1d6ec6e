"""What `eval` finds: each image's top-k predictions, and the result the reports are made of."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from torchkit.core.data.sources.samples import Samples, shown_class_names
from torchkit.core.evaluate.metrics import CONFUSED_SHOWN, ClassificationMetrics
from torchkit.core.inference.masked_loss import DatasetLoss, dataset_loss, masked_true_class
from torchkit.core.topk import DEFAULT_TOPK, reported_topk, topk_name


@dataclass
class Predictions:
    """Per-image outputs, one row per readable image, ordered by `indices` (into the Samples)."""

    indices: np.ndarray  # (N,) int64
    labels: np.ndarray  # (N,) int64 true labels
    topk_labels: np.ndarray  # (N, k) int64, best first; NO_PREDICTION (-1) where not `finite`
    topk_probs: np.ndarray  # (N, k) float32 softmax probabilities of those labels
    loss: np.ndarray  # (N,) float32 cross-entropy of each image
    # (N,) bool: the model's outputs for the image were all finite (no NaN or inf logit).
    finite: np.ndarray

    @property
    def predicted(self) -> np.ndarray:
        return self.topk_labels[:, 0]

    @property
    def confidence(self) -> np.ndarray:
        return self.topk_probs[:, 0]

    @property
    def masked(self) -> np.ndarray:
        """(N,) bool: the images whose true class the model masks with a -inf logit, left out
        of the loss as train leaves them out (`core.inference.masked_loss`)."""
        return masked_true_class(self.loss, self.finite)

    def unmasked_loss(self, masked: np.ndarray) -> np.ndarray:
        """(N,) float64 losses, 0 for the `masked` images (their sums are the loss's)."""
        return np.where(masked, 0.0, self.loss.astype(np.float64))

    def mean_loss(self) -> DatasetLoss:
        """The loss over the images not `masked` (`DatasetLoss`: None where every one is)."""
        masked = self.masked
        return dataset_loss(self.unmasked_loss(masked).sum(), len(self), masked.sum())

    def __len__(self) -> int:
        return len(self.indices)

    @classmethod
    def concatenate(cls, parts: list[Predictions], k: int) -> Predictions:
        """Join the parts and order the rows by sample index."""
        parts = [p for p in parts if len(p)] or [cls.empty(k)]
        joined = cls(
            indices=np.concatenate([p.indices for p in parts]),
            labels=np.concatenate([p.labels for p in parts]),
            topk_labels=np.concatenate([p.topk_labels for p in parts]),
            topk_probs=np.concatenate([p.topk_probs for p in parts]),
            loss=np.concatenate([p.loss for p in parts]),
            finite=np.concatenate([p.finite for p in parts]),
        )
        order = np.argsort(joined.indices, kind="stable")
        return cls(
            joined.indices[order],
            joined.labels[order],
            joined.topk_labels[order],
            joined.topk_probs[order],
            joined.loss[order],
            joined.finite[order],
        )

    @classmethod
    def empty(cls, k: int) -> Predictions:
        return cls(
            np.zeros(0, np.int64),
            np.zeros(0, np.int64),
            np.zeros((0, k), np.int64),
            np.zeros((0, k), np.float32),
            np.zeros(0, np.float32),
            np.zeros(0, bool),
        )


@dataclass
class EvalResult:
    """Everything `eval` reports (on rank 0)."""

    classes: list[str]
    metrics: ClassificationMetrics
    predictions: Predictions
    samples: Samples
    loss: float | None  # over the images whose true class is not masked (`num_masked`)
    skipped: list[str]  # "path: reason" of each unreadable image
    seconds: float  # wall time of the inference loop (data loading included)
    info: dict[str, Any]
    report_seconds: float | None = None
    written: list[str] = field(default_factory=list)
    nonfinite_batches: int = 0  # batches in which the model gave a NaN or inf output
    topk: int = DEFAULT_TOPK  # the k asked for: outputs name it `top{k}` (`core.topk`)

    @property
    def num_images(self) -> int:
        return len(self.predictions)

    @property
    def num_nonfinite(self) -> int:
        """Images for which the model gave a NaN or infinite output (their predictions and
        loss mean nothing)."""
        return int((~self.predictions.finite).sum())

    @property
    def num_masked(self) -> int:
        """Images whose true class the model masks with a -inf logit: their loss is infinite,
        left out of `loss` (the accuracies count them)."""
        return int(self.predictions.masked.sum())

    @property
    def images_per_second(self) -> float:
        return self.num_images / self.seconds if self.seconds > 0 else float("nan")

    def sample_name(self, index: int) -> str:
        """The `path` of an image: relative to the data root (`info["root"]`), or as the CSV
        index wrote it (the one path convention of every output)."""
        if self.samples.ids:
            return self.samples.ids[index]
        return self.samples.paths[index] if self.samples.paths is not None else str(index)

    @cached_property
    def _most_confused(self) -> list[list[tuple[int, int]]]:
        return self.metrics.pairs.most_confused(CONFUSED_SHOWN)  # every class's, at once

    @cached_property
    def shown_classes(self) -> list[str]:
        """Every class's name as the table, the CSV files and the plots show it
        (`shown_class_names`: `crane (#134)` for a name two classes share)."""
        return shown_class_names(self.classes)

    def shown_class(self, index: int) -> str:
        return self.shown_classes[index]

    def confused_with(self, label: int) -> list[tuple[int, int]]:
        """(class index, images) of the classes most often predicted for class `label`'s
        images, the most first (at most CONFUSED_SHOWN)."""
        return list(self._most_confused[label])

    @property
    def topk_accuracy(self) -> float | None:
        """The top-k accuracy for the k asked, None where k >= the number of classes."""
        return reported_topk(self.metrics.topk_accuracy, self.topk, len(self.classes))

    def _top_figures(self, top1: float | None, topk: float | None) -> dict[str, float | None]:
        """`top1` and `top{k}` by name; with --topk 1 the one `top1`, the top-1 accuracy (the
        top-k rule's null for k >= the classes would hide it: a 1-class model's top1)."""
        return {topk_name(1): top1, **({} if self.topk == 1 else {topk_name(self.topk): topk})}

    def per_class_columns(self) -> list[str]:
        """per_class.csv's and `--format csv`'s columns (one set of names: `label` the class
        name, `index` its index, `top1` its accuracy, `top5` its top-k, `loss` its mean, and
        where the model masks some image's true class, `masked`: their count)."""
        return [
            "label",
            "index",
            "support",
            "predicted",
            "precision",
            "recall",
            "f1",
            *dict.fromkeys([topk_name(1), topk_name(self.topk)]),  # one column if k is 1
            "loss",
            *(["masked"] if self.num_masked else []),
            *[f"confused_with_{i}" for i in range(1, CONFUSED_SHOWN + 1)],
        ]

    def per_class_records(self) -> list[dict[str, Any]]:
        """One dict per class, keyed by `per_class_columns()` but for `confused_with` (a list
        of {"class", "count"}); a class without images has no accuracy or loss (None), nor one
        whose every image's true class is masked a loss (train's rule: masked images are left
        out of it)."""
        m, p = self.metrics, self.predictions
        count = len(self.classes)
        support = np.bincount(p.labels, minlength=count)
        top_hits = (p.topk_labels[:, : self.topk] == p.labels[:, None]).any(axis=1)
        top_hits = np.bincount(p.labels, weights=top_hits, minlength=count)
        masked = p.masked
        loss_sums = np.bincount(p.labels, weights=p.unmasked_loss(masked), minlength=count)
        masked_counts = np.bincount(p.labels, weights=masked, minlength=count)
        with_masked = bool(masked.any())
        correct = m.pairs.correct()
        records = []
        for label, name in enumerate(self.classes):
            n = int(support[label])

            def mean(total: float, n: int = n) -> float | None:
                return float(total) / n if n else None

            records.append(
                {
                    "label": name,
                    "index": label,
                    "support": int(m.support[label]),
                    "predicted": int(m.predicted[label]),
                    "precision": float(m.precision[label]),
                    "recall": float(m.recall[label]),
                    "f1": float(m.f1[label]),
                    **self._top_figures(
                        mean(correct[label]),
                        reported_topk(mean(top_hits[label]), self.topk, count),
                    ),
                    "loss": dataset_loss(loss_sums[label], n, masked_counts[label]).loss,
                    **({"masked": int(masked_counts[label])} if with_masked else {}),
                    # "index" beside the name: two classes may share it (two `crane`s).
                    "confused_with": [
                        {"class": self.classes[other], "index": other, "count": number}
                        for other, number in self.confused_with(label)
                    ],
                }
            )
        return records

    def per_class_rows(self, *, with_summary: bool = False) -> list[list]:
        """per_class.csv's rows (each class and those confused with it as `shown_class` names
        them, the latter as `name:count`); `with_summary` adds the rows
        `--format csv` prints below the classes (their `index` empty): `all` (accuracy, top-k,
        loss, micro F1), then the classification-report averages `macro avg`, `weighted avg`."""
        columns = self.per_class_columns()
        rows = []
        for record in self.per_class_records():
            confused = [
                f"{self.shown_class(c['index'])}:{c['count']}" for c in record.pop("confused_with")
            ]
            confused += [None] * (CONFUSED_SHOWN - len(confused))
            record["label"] = self.shown_class(record["index"])
            rows.append([*(record[name] for name in columns[:-CONFUSED_SHOWN]), *confused])
        if with_summary:
            m, images = self.metrics, self.num_images
            with_class = images - self.num_nonfinite  # an image of non-finite outputs has none
            summaries = {
                "all": {"support": images, "predicted": with_class, "f1": m.f1_micro,
                        **self._top_figures(m.accuracy, self.topk_accuracy), "loss": self.loss,
                        "masked": self.num_masked},
                "macro avg": {"support": images, "precision": m.precision_macro,
                              "recall": m.recall_macro, "f1": m.f1_macro},
                "weighted avg": {"support": images, "precision": m.precision_weighted,
                                 "recall": m.recall_weighted, "f1": m.f1_weighted},
            }  # fmt: skip
            for name, values in summaries.items():
                rows.append([name if c == "label" else values.get(c) for c in columns])
        return rows

    def to_dict(self) -> dict[str, Any]:
        """metrics.json and `--format json`: snake_case keys, plain numbers."""
        m = self.metrics
        return {
            **self.info,
            "num_images": self.num_images,
            "num_skipped": len(self.skipped),
            "num_nonfinite": self.num_nonfinite,
            "num_masked": self.num_masked,
            "num_classes": len(self.classes),
            **self._top_figures(m.accuracy, self.topk_accuracy),
            "accuracy": m.accuracy,  # = top1, as before
            "topk": self.topk,  # the k of top{k}
            "topk_accuracy": self.topk_accuracy,  # = top{k}, as before
            "loss": self.loss,
            "precision_macro": m.precision_macro,
            "recall_macro": m.recall_macro,
            "f1_macro": m.f1_macro,
            "precision_weighted": m.precision_weighted,
            "recall_weighted": m.recall_weighted,
            "f1_weighted": m.f1_weighted,
            "f1_micro": m.f1_micro,
            "balanced_accuracy": m.balanced_accuracy,
            "macro_averaged_classes": m.averaged_classes,
            "zero_division": 0,
            "seconds": self.seconds,
            "images_per_second": self.images_per_second,
            "classes": list(self.classes),
            "per_class": self.per_class_records(),
            "skipped_files": list(self.skipped),
        }
