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
