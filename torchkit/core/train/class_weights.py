"""`--class-weights none|balanced|FILE`: per-class weights of the training loss.

`balanced` is scikit-learn's rule, n / (k * n_c) for n training images in k classes, n_c of class
c: every class then weighs as much in the loss as a class of average size. A FILE gives them
by hand: JSON (a list in label order, or `{"class": weight}`), or text with one `weight` per line
in label order (no blank line between two), or `class,weight` / `class weight` lines. The
validation loss stays unweighted, so it compares across settings.
"""

from __future__ import annotations

import functools
import json
import math
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torchkit.core.io.errors import InputError, UsageError
from torchkit.core.io.files import read_text
from torchkit.core.io.option_lists import is_plain_number_text
from torchkit.core.io.ordered_lines import ordered_lines
from torchkit.core.io.overlap import InputPath

NONE, BALANCED = "none", "balanced"


def class_weights_inputs(spec: str | None) -> list[InputPath]:
    """The file `--class-weights FILE` reads, which no output of the run may replace; none for
    `none` and `balanced`."""
    if spec is None or spec in (NONE, BALANCED):
        return []
    return [InputPath.of(spec, "--class-weights file")]


def balanced_weights(counts: Sequence[int]) -> list[float]:
    """n / (k * n_c) for each class of `counts`, k counting the classes with training images
    (scikit-learn's rule over the labels there are). A class without any, which train keeps
    where the data's class names list it, weighs 1, a class of average size's weight: no
    image's loss is weighed by it, only label smoothing's share of it."""
    total, classes = sum(counts), sum(1 for count in counts if count)
    return [total / (classes * count) if count else 1.0 for count in counts]


def class_weights(spec: str, classes: Sequence[str], counts: Sequence[int]) -> list[float] | None:
    """The weights `spec` gives for `classes` (with `counts` training images each); None for
    `none`."""
    if spec == NONE:
        return None
    if spec == BALANCED:
        return balanced_weights(counts)
    weights = _from_file(Path(spec), list(classes))
    for name, weight in zip(classes, weights, strict=True):
        # The loss weighs in float32: a weight beyond its range (3.4e38) is infinite there.
        finite = math.isfinite(weight) and _fits_float32(weight)
        if not finite or weight < 0:
            why = "negative" if finite else "not a finite float32 number"
            raise UsageError(
                f"--class-weights {spec}: the weight of class {name!r}, {weight!r}, is {why}",
                "weights must be finite, not negative, and not all zero",
            )
    if not any(weights):
        raise UsageError(
            f"--class-weights {spec}: weights must be finite, not negative, and not all zero"
        )
    return weights


def _fits_float32(value: float) -> bool:
    """Whether `value` rounds to a finite float32 (Python before 3.12 refuses to pack one
    that does not; later ones pack it as infinity)."""
    try:
        return math.isfinite(struct.unpack("f", struct.pack("f", value))[0])
    except OverflowError:
        return False


# Weights up to this are used as given; larger ones are scaled down (`training_loss`).
_LARGEST_AS_GIVEN = 2.0**16


def _scaled_down(weights: Sequence[float]) -> list[float]:
    """`weights` divided by a power of two that brings the largest below 1, where it is
    above `_LARGEST_AS_GIVEN`: a weighted mean is the same for weights all scaled alike, and
    float arithmetic scales by a power of two exactly, but the sums over a batch and over an
    epoch of large weights (1e38) overflow float32 (the run stopped as diverged at its first
    step)."""
    largest = max(weights, default=0.0)
    if largest <= _LARGEST_AS_GIVEN:
        return list(weights)
    shift = math.frexp(largest)[1]
    return [math.ldexp(weight, -shift) for weight in weights]


def training_loss(weights: Sequence[float] | None, label_smoothing: float, device: Any) -> Any:
    """The training criterion: cross-entropy with `label_smoothing`; with `weights`, their
    weighted mean over the batch, as torch's, except that a batch whose images all weigh 0 (of
    classes given weight 0) adds 0: torch's 0 / 0 there is NaN, which stopped the run as
    diverged. Its `weight` tensor, which the epoch's sums read too, is `weights` scaled down
    where they are large (`_scaled_down`)."""
    import torch

    if weights is None:
        return torch.nn.CrossEntropyLoss(label_smoothing=label_smoothing)
    weight = torch.tensor(_scaled_down(weights), device=device)
    return _class_weighted_loss()(weight=weight, label_smoothing=label_smoothing)


@functools.cache
def _class_weighted_loss() -> type:
    import torch
    import torch.nn.functional as F

    class ClassWeightedCrossEntropy(torch.nn.CrossEntropyLoss):
        def forward(self, outputs, labels):
            losses = F.cross_entropy(
                outputs,
                labels,
                weight=self.weight,
                reduction="none",
                label_smoothing=self.label_smoothing,
            )
            # No host sync (a CUDA graph records this): both sides computed, one kept.
            total = self.weight[labels].sum()
            safe = torch.where(total > 0, total, torch.ones_like(total))
            return torch.where(total > 0, losses.sum() / safe, losses.sum() * 0)

    return ClassWeightedCrossEntropy


def _from_file(path: Path, classes: list[str]) -> list[float]:
    if not path.is_file():
        raise UsageError(
            f"--class-weights {path}: not none, balanced or a file", "give none, balanced or FILE"
        )
    text = read_text(path, "utf-8-sig")
    if path.suffix.lower() == ".json":
        from torchkit.core.train.config_file import load_json

        data = load_json(text, path, what="class")  # a class given twice is an InputError
        if isinstance(data, dict):
            return _by_name({str(k): v for k, v in data.items()}, classes, path)
        if isinstance(data, list):
            return _in_order(data, classes, path)
        raise InputError(f"{path}: a list of weights or a {{class: weight}} object expected")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    pairs = [line.replace(",", " ").split() for line in lines]
    if all(len(pair) == 1 for pair in pairs):
        # In label order: a blank line between two weights would shift every later one.
        ordered_lines(text, str(path), "weights")
        return _in_order([pair[0] for pair in pairs], classes, path)
    if all(len(pair) == 2 for pair in pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise InputError(
                    f"class {name!r} is given twice in {path}",
                    "give each class once: which value was meant is not clear",
                )
            seen.add(name)
        return _by_name(dict(pairs), classes, path)
    raise InputError(f"{path}: one `weight` or one `class,weight` per line expected")


def _number(value, path: Path) -> float:
    if isinstance(value, bool):  # JSON's true and false: float() made them 1 and 0
        raise InputError(f"{path}: {json.dumps(value)} is not a number")
    if isinstance(value, str) and not is_plain_number_text(value):  # `1_0` read as 10
        raise InputError(
            f"{path}: {value!r} is not a number", "write weights in ASCII digits, without _"
        )
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InputError(f"{path}: {value!r} is not a number") from None


def _in_order(values: list, classes: list[str], path: Path) -> list[float]:
    if len(values) != len(classes):
        raise InputError(
            f"{path} gives {len(values)} weights for {len(classes)} classes",
            "one weight per class, in label order: " + ", ".join(classes[:10]),
        )
    return [_number(value, path) for value in values]


def _by_name(values: dict, classes: list[str], path: Path) -> list[float]:
    known = set(classes)  # a set: a list scanned per name took about a minute at 100,000 classes
    unknown = [name for name in values if name not in known]
    missing = [name for name in classes if name not in values]
    if unknown or missing:
        what = f"unknown class {unknown[0]!r}" if unknown else f"no weight for {missing[0]!r}"
        raise InputError(f"{path}: {what}", "the classes are: " + ", ".join(classes[:10]))
    return [_number(values[name], path) for name in classes]
