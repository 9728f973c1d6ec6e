"""The one rule for the top-k figures of `train` and `eval`, in every output.

A top-k figure is named for its k (`top1`, `top5`; `val_top5`, `test_top5` in train), whatever
the data: a script finds the same key or column for 3 classes as for 1,000. The k is fixed (5
unless eval's --topk says otherwise), never the number of classes; where k >= the number of
classes the figure is 1 by definition and says nothing, so tables leave it out and JSON/CSV
carry null (an empty cell) under the same name.
"""

from __future__ import annotations

DEFAULT_TOPK = 5


def topk_name(k: int) -> str:
    return f"top{k}"


def topk_informative(k: int, num_classes: int) -> bool:
    """Whether a top-k accuracy tells anything: not with k classes or fewer."""
    return k < num_classes


def reported_topk(value: float | None, k: int, num_classes: int) -> float | None:
    """The value outputs carry: None where k >= the number of classes."""
    return value if topk_informative(k, num_classes) else None


def ranked_classes(scores, k: int):
    """The `k` best classes of each row of `scores` (an (N, C) tensor), best first; among equal
    scores the lower index first, so the first column is `scores.argmax(1)` whatever k is.

    torch's `topk` orders equal scores by its algorithm, which changes with k and the device: a
    model with tied logits (an untrained head, bfloat16 autocast) would get another predicted
    class, and another top-1 accuracy, for another --topk."""
    return scores.sort(dim=1, descending=True, stable=True).indices[:, :k]
