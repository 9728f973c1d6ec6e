"""The one rule for the top-k figures of `train` and `eval`, in every output.

A top-k figure is named for its k (`top1`, `top5`; `val_top5`, `test_top5` in train), whatever
the data: a script finds the same key or column for 3 classes as for 1,000. The k is fixed (5
unless eval's --topk says otherwise), never the number of classes; where k >= the number of
classes the figure is 1 by definition and says nothing, so tables leave it out and JSON/CSV
carry null (an empty cell) under the same name.
"""

from __future__ import annotations

DEFAULT_TOPK = 5
# `ranked_classes` sorts every score when k is at least this share of the classes (1/8): then
# the candidates are about as many as the scores; likewise when ties make that many candidates.
_CANDIDATE_SORT_FACTOR = 8


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
    class, and another top-1 accuracy, for another --topk.

    With many classes on a CPU only the candidates are sorted (sorting every score cost 0.5 ms
    an image at 5,000 classes): `topk` finds each row's k-th best score, and the m best of each
    row (m: the most scores at or above its k-th in any row) hold every score that can rank in
    the first k, whatever order `topk` gives them; their stable sort by index, then by score, is
    the full sort's first k exactly. NaN, which no comparison keeps, and rows of ties take the
    full sort."""
    classes = scores.shape[1]
    # on a GPU the full sort is fast, and the candidates' count would wait for the device
    if scores.device.type != "cpu" or k * _CANDIDATE_SORT_FACTOR >= classes or scores.isnan().any():
        return _sorted_first(scores, k)
    kth = scores.topk(k, dim=1).values[:, -1:]
    wide = int((scores >= kth).sum(dim=1).max())
    if wide * _CANDIDATE_SORT_FACTOR >= classes:  # ties everywhere (an untrained head)
        return _sorted_first(scores, k)
    values, indices = scores.topk(wide, dim=1)
    indices, by_index = indices.sort(dim=1)
    values = values.gather(1, by_index)
    return indices.gather(1, _sorted_first(values, k))


def _sorted_first(scores, k: int):
    return scores.sort(dim=1, descending=True, stable=True).indices[:, :k]
