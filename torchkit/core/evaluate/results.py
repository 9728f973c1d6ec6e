"""What `eval` finds: each image's top-k predictions, and the result the reports are made of."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from torchkit.core.datasource.samples import Samples
from torchkit.core.evaluate.metrics import ClassificationMetrics, most_confused


@dataclass
class Predictions:
    """Per-image outputs, one row per readable image, ordered by `indices` (into the Samples)."""

    indices: np.ndarray  # (N,) int64
    labels: np.ndarray  # (N,) int64 true labels
    topk_labels: np.ndarray  # (N, k) int64, best first
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
    loss: float
    skipped: list[str]  # "path: reason" of each unreadable image
    seconds: float  # wall time of the inference loop (data loading included)
    info: dict[str, Any]
    report_seconds: float | None = None
    written: list[str] = field(default_factory=list)
    nonfinite_batches: int = 0  # batches in which the model gave a NaN or inf output

    @property
    def num_images(self) -> int:
        return len(self.predictions)

    @property
    def num_nonfinite(self) -> int:
        """Images for which the model gave a NaN or infinite output (their predictions and
        loss mean nothing)."""
        return int((~self.predictions.finite).sum())

    @property
    def images_per_second(self) -> float:
        return self.num_images / self.seconds if self.seconds > 0 else float("nan")

    def sample_name(self, index: int) -> str:
        """The `path` of an image: relative to the data root (`info["root"]`), or as the CSV
        index wrote it (the one path convention of every output)."""
        if self.samples.ids:
            return self.samples.ids[index]
        return self.samples.paths[index] if self.samples.paths is not None else str(index)

    def confused_with(self, label: int) -> list[tuple[str, int]]:
        return [(self.classes[j], n) for j, n in most_confused(self.metrics.confusion, label)]

    def to_dict(self) -> dict[str, Any]:
        """metrics.json and `--format json`: snake_case keys, plain numbers."""
        m = self.metrics
        return {
            **self.info,
            "num_images": self.num_images,
            "num_skipped": len(self.skipped),
            "num_nonfinite": self.num_nonfinite,
            "num_classes": len(self.classes),
            "accuracy": m.accuracy,
            "topk": m.topk,
            "topk_accuracy": m.topk_accuracy,
            "loss": self.loss,
            "precision_macro": m.precision_macro,
            "recall_macro": m.recall_macro,
            "f1_macro": m.f1_macro,
            "precision_weighted": m.precision_weighted,
            "recall_weighted": m.recall_weighted,
            "f1_weighted": m.f1_weighted,
            "f1_micro": m.f1_micro,
            "macro_averaged_classes": m.averaged_classes,
            "zero_division": 0,
            "seconds": self.seconds,
            "images_per_second": self.images_per_second,
            "classes": list(self.classes),
            "per_class": [
                {
                    "class": name,
                    "label": label,
                    "support": int(m.support[label]),
                    "predicted": int(m.predicted[label]),
                    "precision": float(m.precision[label]),
                    "recall": float(m.recall[label]),
                    "f1": float(m.f1[label]),
                    "confused_with": [
                        {"class": other, "count": count}
                        for other, count in self.confused_with(label)
                    ],
                }
                for label, name in enumerate(self.classes)
            ],
            "skipped_files": list(self.skipped),
        }
