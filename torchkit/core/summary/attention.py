"""The attention matrices a forward pass makes: queries x keys for each head and sample, a
tensor that is no layer's output (it lives and dies inside an attention call, or inside a
module's own forward), yet is often the largest thing a transformer holds (vit_b_16 at 224 px:
12 heads x 197 x 197 floats, 1.9 MB an image in every block, where a block's output is 0.6 MB).

Counted during summary's forward pass (`summarize`), one matrix per attention call, by how it
is computed, because that decides whether a real run holds it:

- `explicit`: the softmax of a product of two activations (neither a parameter), through any
  pointwise steps between them (a scale, a mask, a bias): attention written by hand
  (`(q @ k.transpose(-2, -1)) * scale`, then softmax), or nn.MultiheadAttention asked for its
  weights without dropout. Every run makes it, and training keeps it for the backward pass.
- `sdpa`: `F.scaled_dot_product_attention` called by the model. Its fused CPU kernel tiles
  the product and never holds the matrix (measured: a benchmark's peak did not grow with it,
  in either mode); its math path and the exporters' tracers hold it.
- `mha`: nn.MultiheadAttention without weights (`need_weights=False`, torchvision's ViT) where
  it takes its inference fast path (eval, no grad, `batch_first`, self-attention, an even
  number of heads...: `_takes_fast_path`), which makes the matrix; training goes through the
  fused kernel, which does not. Where it cannot take that path (`batch_first=False`, queries
  that are not the keys) every run goes through F.scaled_dot_product_attention: `sdpa`.
- `dropout`: the same off its fast path with dropout (nn.TransformerEncoderLayer's default
  0.1): inference holds no matrix (nn.MultiheadAttention drops out in training only), but the
  fused CPU kernel takes no dropout, so training runs the math path and keeps it for the
  backward pass, three times over (the softmax, dropout's mask of floats, and their product:
  `DROPOUT_KEPT`; measured, 4 blocks of 64 channels, 4 heads, 1,024 tokens, -b 8: a training
  peak of 1.87 GB, 0.07-0.13 GB without dropout, 3.15x a block's matrix for each block past
  the first).
- `mha-dropout`: nn.MultiheadAttention without weights on its inference fast path, with
  dropout: inference holds the fast path's one matrix, training (never on the fast path) keeps
  `DROPOUT_KEPT` of each, as `dropout`.
- `explicit-dropout`: nn.MultiheadAttention asked for its weights (its default), with dropout:
  every run makes the matrix, inference holds one, training keeps `DROPOUT_KEPT` of each (the
  softmax, dropout's mask, their product; measured, 64 channels, 4 heads, 1,024 tokens, -b 8:
  3.38 matrices kept after the forward pass with dropout 0.1, 1.38 without).
- `sdpa-dropout`: F.scaled_dot_product_attention called with `dropout_p > 0` (by the model
  itself, not through nn.MultiheadAttention): it drops out in whatever mode it is called so,
  through the math path, which holds the softmax, the mask and their product at once in
  inference too (measured: 797 MB for a 268 MB matrix, 2.97x) and keeps them in training
  (1.83 GB, the figures above, 67 MB with dropout_p=0). Models that pass `dropout_p` in
  training only (timm's) show it in a training-mode pass only (benchmark's train check makes
  one); their eval pass shows `sdpa`.

What a run holds of each kind: `INFERENCE_HELD` (one call's at a time: the largest counts,
`held_in_inference`) and `TRAINING_KEPT` (every call's: `kept_in_training`).

On the meta device `F.scaled_dot_product_attention` runs its math path (a product, then a
softmax), which the same rule finds; on a real device the fused operations are counted from
their query and key shapes.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

EXPLICIT, SDPA, MHA, DROPOUT = "explicit", "sdpa", "mha", "dropout"
MHA_DROPOUT, SDPA_DROPOUT, EXPLICIT_DROPOUT = "mha-dropout", "sdpa-dropout", "explicit-dropout"
# The copies of a matrix that dropout's math path holds (the softmax, dropout's mask of floats,
# their product): at once in inference, kept for the backward pass in training (see the module)
DROPOUT_KEPT = 3
# What an inference pass holds of one call's matrix, and what training keeps of each, by kind
INFERENCE_HELD = {
    EXPLICIT: 1,
    EXPLICIT_DROPOUT: 1,
    MHA: 1,
    MHA_DROPOUT: 1,
    SDPA: 0,
    DROPOUT: 0,
    SDPA_DROPOUT: DROPOUT_KEPT,
}
TRAINING_KEPT = {
    EXPLICIT: 1,
    EXPLICIT_DROPOUT: DROPOUT_KEPT,
    MHA: 0,
    MHA_DROPOUT: DROPOUT_KEPT,
    SDPA: 0,
    DROPOUT: DROPOUT_KEPT,
    SDPA_DROPOUT: DROPOUT_KEPT,
}
# The words export's and benchmark's memory refusals name them by
ATTENTION_MATRICES = "attention matrices"
LARGEST_ATTENTION_MATRIX = "largest attention matrix"


@dataclass(frozen=True)
class AttentionMatrix:
    """One attention call's matrix: its bytes and how it was computed (see the module)."""

    bytes: int
    kind: str


@dataclass(frozen=True)
class AttentionMatrices:
    """The matrices of one forward pass, in call order."""

    matrices: tuple[AttentionMatrix, ...] = ()

    def total(self, *kinds: str) -> int:
        """Bytes of every matrix (of `kinds`, when given): what a pass that keeps them holds."""
        return sum(m.bytes for m in self.matrices if not kinds or m.kind in kinds)

    def largest(self, *kinds: str) -> int:
        """Bytes of the largest matrix (of `kinds`): what a pass that frees each holds."""
        return max((m.bytes for m in self.matrices if not kinds or m.kind in kinds), default=0)

    def held_in_inference(self) -> int:
        """Bytes an inference pass holds of them at once: the largest call's, as many times as
        its kind holds it (`INFERENCE_HELD`; each call's are freed before the next)."""
        return max((INFERENCE_HELD[m.kind] * m.bytes for m in self.matrices), default=0)

    def kept_in_training(self) -> int:
        """Bytes a training pass keeps of them for the backward pass (`TRAINING_KEPT`)."""
        return sum(TRAINING_KEPT[m.kind] * m.bytes for m in self.matrices)

    def per_sample(self, batch: int) -> AttentionMatrices:
        """The matrices of a pass at `batch`, made per sample (they grow with the batch)."""
        if batch == 1:
            return self
        return AttentionMatrices(
            tuple(AttentionMatrix(m.bytes // batch, m.kind) for m in self.matrices)
        )


# How many products of activations are followed at once on their way to a softmax: a few
# (query-key products of heads computed one by one); a longer chain is no attention.
_FOLLOWED = 8


class AttentionCounter:
    """Finds the matrices during a forward pass: `calls()` around it (a function mode that
    tells which attention function is running), `dispatched()` for each operation the
    summary's dispatch mode sees, `found()` after it."""

    def __init__(self, storage_key: Any, model: Any) -> None:
        self._key = storage_key  # tensor -> the storage it lives in (views share it)
        self._model = model
        self._parameters: set[int] | None = None  # the storages of the model's parameters
        self._matrices: list[AttentionMatrix] = []
        # the kind of each F.scaled_dot_product_attention call in progress (`_sdpa_kind`)
        self._sdpa: list[str] = []
        self._mha: list[str] = []  # the kind of each nn.MultiheadAttention call in progress
        # whether the nn.MultiheadAttention call about to run would take its inference fast
        # path (`module_called`; its F.multi_head_attention_forward call takes it up)
        self._fast_path = False
        # score matrices on their way to a softmax, oldest first: storage -> the tensor (held,
        # so that its storage is not freed and its address given to another tensor while
        # followed; once a softmax takes one, its address may come back as a new score's)
        self._scores: dict[int, Any] = {}

    def found(self) -> AttentionMatrices:
        self._scores.clear()
        return AttentionMatrices(tuple(self._matrices))

    def _kind(self) -> str:
        if self._mha:
            return self._mha[-1]
        return self._sdpa[-1] if self._sdpa else EXPLICIT

    def module_called(self, module: Any, args: tuple, kwargs: dict) -> None:
        """Before each module's call (summary's pre-hook): note whether an
        nn.MultiheadAttention call would take its inference fast path in a real run."""
        from torch import nn

        if isinstance(module, nn.MultiheadAttention):
            self._fast_path = _takes_fast_path(module, args, kwargs)

    @contextlib.contextmanager
    def calls(self) -> Iterator[None]:
        import torch.nn.functional as F
        from torch.overrides import TorchFunctionMode

        counter = self

        class AttentionCalls(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if func is F.scaled_dot_product_attention:
                    dropout = kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0)
                    counter._sdpa.append(SDPA_DROPOUT if dropout > 0 else SDPA)
                    try:
                        return func(*args, **kwargs)
                    finally:
                        counter._sdpa.pop()
                if func is F.multi_head_attention_forward:
                    weights = kwargs.get("need_weights", args[15] if len(args) > 15 else True)
                    dropout = kwargs.get("dropout_p", args[10] if len(args) > 10 else 0.0)
                    fast_path, counter._fast_path = counter._fast_path, False
                    counter._mha.append(_mha_kind(weights, fast_path, dropout > 0))
                    try:
                        return func(*args, **kwargs)
                    finally:
                        counter._mha.pop()
                return func(*args, **kwargs)

        with AttentionCalls():
            yield

    def dispatched(self, func: Any, args: tuple, result: Any) -> None:
        """Follow one operation: a product of two activations starts a score matrix, a
        pointwise step carries it on, a softmax of one is an attention matrix; a fused
        attention operation is one from its shapes."""
        import torch

        key_of = self._key
        if func in _operations(_FUSED):
            query, key = args[0], args[1]
            rows = math.prod(query.shape[:-1])  # (batch, heads, ..., queries)
            self._matrices.append(
                AttentionMatrix(rows * key.shape[-2] * query.element_size(), self._kind())
            )
            return
        if not isinstance(result, torch.Tensor):
            return
        aten = torch.ops.aten
        if func in _operations(_SOFTMAXES):
            if self._scores.pop(key_of(args[0]), None) is not None:
                size = result.numel() * result.element_size()
                self._matrices.append(AttentionMatrix(size, self._kind()))
            return
        if func in (aten.bmm.default, aten.mm.default, aten.baddbmm.default):
            left, right = (args[1], args[2]) if func is aten.baddbmm.default else args[:2]
            if self._parameters is None:
                self._parameters = {key_of(p) for p in self._model.parameters()}
            parameters = self._parameters
            if key_of(left) in parameters or key_of(right) in parameters:
                return
            self._follow(key_of(result), result)
            return
        if not self._scores or torch.Tag.pointwise not in getattr(func, "tags", ()):
            return
        for arg in args:
            if isinstance(arg, torch.Tensor) and key_of(arg) in self._scores:
                if arg.numel() == result.numel():
                    self._follow(key_of(result), result)
                return

    def _follow(self, key: int, tensor: Any) -> None:
        if key in self._scores:
            return
        self._scores[key] = tensor
        while len(self._scores) > _FOLLOWED:  # the oldest goes
            del self._scores[next(iter(self._scores))]


def _mha_kind(weights: bool, fast_path: bool, dropout: bool) -> str:
    """The kind of an nn.MultiheadAttention call's matrix (see the module): which of
    inference (the fast path, or weights) and training (weights, or dropout) holds it."""
    if weights:
        return EXPLICIT_DROPOUT if dropout else EXPLICIT
    if dropout:
        return MHA_DROPOUT if fast_path else DROPOUT
    return MHA if fast_path else SDPA


def _takes_fast_path(module: Any, args: tuple, kwargs: dict) -> bool:
    """Whether nn.MultiheadAttention's forward, in eval mode without grad, calls
    torch._native_multi_head_attention for these arguments (its conditions that do not depend
    on the device or on autograd, which summary's pass turns off)."""
    import torch

    names = ("query", "key", "value", "key_padding_mask", "need_weights", "attn_mask")
    given = dict(zip(names, args, strict=False)) | kwargs
    query, key, value = (given.get(name) for name in names[:3])
    masks = (given.get("attn_mask"), given.get("key_padding_mask"))
    return bool(
        isinstance(query, torch.Tensor)
        and query.dim() == 3
        and query is key
        and key is value
        and module.batch_first
        and module.num_heads % 2 == 0
        and module._qkv_same_embed_dim
        and module.in_proj_bias is not None
        and module.bias_k is None
        and module.bias_v is None
        and not module.add_zero_attn
        and not any(m is not None and torch.is_floating_point(m) for m in masks)
    )


# The operations by name (a torch that lacks one has none to see: torch 2.4 has no
# _safe_softmax, which later ones' scaled_dot_product_attention runs on the meta device).
_SOFTMAXES = ("_softmax", "_safe_softmax")
_FUSED = (
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_fused_attention_overrideable",
)
_FOUND: dict[tuple[str, ...], frozenset] = {}


def _operations(names: tuple[str, ...]) -> frozenset:
    """The default overloads of the aten operations `names` this torch has."""
    if names not in _FOUND:
        import torch

        found = (getattr(torch.ops.aten, name, None) for name in names)
        _FOUND[names] = frozenset(op.default for op in found if op is not None)
    return _FOUND[names]
