"""One forward pass of a classifier over a batch, as `eval` and `predict` both score it.

The same rule in both commands makes `predict`'s classes exactly `eval`'s: without TTA the
ranking uses the raw logits (the class is `logits.argmax()`) and the probabilities are their
softmax, exactly `torch.softmax(logits)` (the exponent of the log-softmax differs from it by an
ulp in one row of eight); with flip TTA the softmax probabilities of the image and its mirror
are averaged in log space (stably), which both ranks the classes and gives their probabilities.

A -inf logit masks a class (a model that rules classes out): its probability is 0, it ranks
last, and the image is scored as any other. An image is unusable only where some output is NaN
or +inf, or every output is -inf (no class left): those are counted and warned about.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torchkit.core.io.errors import InputError
from torchkit.core.models.image_size import first_batch_error

TTA_MODES = ("none", "flip")


@dataclass
class BatchScores:
    logits: Any  # (N, C) float32 outputs of the images as given
    log_probs: Any  # (N, C) log-softmax, averaged over the TTA views
    probs: Any  # (N, C) softmax of the logits; with TTA, exp(log_probs), in the ranking's order
    scores: Any  # (N, C) what ranks the classes: logits without TTA, log_probs with it
    # (N,) bool on the CPU: every view of the image has scorable outputs (`scorable_rows`)
    finite: Any


def score_batch(
    model,
    images,
    device,
    *,
    tta: str = "none",
    amp: bool = False,
    amp_dtype=None,
    first: bool = False,
    trained: tuple[int, ...] | None = None,
) -> BatchScores:
    """Score `images` (already on `device`, in the memory format wanted). `first`: the first
    batch of a run, where a failure means the model does not take this input size (`trained`:
    the input a checkpoint's model was trained on, which the error then names)."""
    import torch
    import torch.nn.functional as F

    if amp_dtype is None:
        amp_dtype = torch.bfloat16 if device.type == "cpu" else torch.float16
    count = len(images)
    views = torch.cat([images, images.flip(3)]) if tta == "flip" else images
    outputs = forward(model, views, device, amp_dtype, amp, first=first, trained=trained)
    finite = scorable_rows(outputs).view(-1, count).all(dim=0)
    log_probs = F.log_softmax(outputs, dim=1)
    if tta == "flip":
        log_probs = torch.logsumexp(log_probs.view(2, count, -1), dim=0) - math.log(2)
        scores, probs = log_probs, log_probs.exp()
    else:
        scores, probs = outputs, F.softmax(outputs, dim=1)
    return BatchScores(outputs[:count], log_probs, probs, scores, finite.cpu())


def scorable_rows(outputs):
    """(N,) bool: each row of (N, C) logits holds no NaN or +inf and some logit above -inf. A
    -inf logit alone is a masked class, not a failure: softmax gives it 0 and the rest add up
    to 1; a row of -inf only has no softmax (NaN)."""
    return (outputs < math.inf).all(dim=1) & (outputs > -math.inf).any(dim=1)


def forward(
    model,
    images,
    device,
    autocast_dtype,
    amp: bool,
    *,
    first: bool,
    trained: tuple[int, ...] | None = None,
):
    """The model's outputs in float32. A model that fails on the very first batch does not take
    this input size: one line (`first_batch_error`), naming the smallest size it takes when the
    images are too small for it. The first batch's outputs are checked to be logits."""
    import torch

    try:
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=amp):
            outputs = model(images)
    except torch.OutOfMemoryError:
        raise
    except RuntimeError as error:
        if not first:
            raise
        raise first_batch_error(model, "the model", images, error, trained=trained) from error
    if first:
        check_logits(outputs, len(images))
    return outputs.float()


def check_logits(outputs: Any, count: int) -> None:
    """Scoring ranks (N, C) logits, one row of class scores per image: any other output (a
    segmentation map, a tuple, a dict, one number per image, no class at all) is refused in one
    line naming it, before its shape reaches the ranking."""
    import torch

    if isinstance(outputs, torch.Tensor):
        # (N, 0): no class to rank, which top-k would index past
        if outputs.ndim == 2 and outputs.shape[0] == count and outputs.shape[1] > 0:
            return
        what = f"a tensor of shape {tuple(outputs.shape)}"
    elif isinstance(outputs, dict):
        what = f"a dict (keys: {', '.join(map(str, outputs))})"
    elif isinstance(outputs, (tuple, list)):
        what = f"a {type(outputs).__name__} of {len(outputs)}"
    else:
        what = f"a {type(outputs).__name__}"
    raise InputError(
        f"the model returns {what} for a batch of {count} images, not the ({count}, classes) "
        "logits of a classifier",
        "eval and predict score classifiers: give a model whose forward returns its logits "
        "alone, or wrap it in a module that picks them",
    )
