"""Building a model whose every weight is loaded right after, strictly (a checkpoint, a weights
file): its random initialisation, most of a large model's build time (vgg16 ~1.2 s of ~1.5 s on
one thread), is skipped. Only the random initialisers are skipped; the deterministic ones
(zeros, ones, constants, eye, dirac, fill_, zero_) still run, so a buffer a constructor computes
and no state dict holds (a non-persistent one) is what it always is."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

# torch.nn.init's random initialisers (torchvision calls them as `nn.init.NAME`, torch's layers as
# `init.NAME`: looked up on the module at each call) ...
RANDOM_INIT_FUNCTIONS = (
    "uniform_",
    "normal_",
    "trunc_normal_",
    "kaiming_uniform_",
    "kaiming_normal_",
    "xavier_uniform_",
    "xavier_normal_",
    "orthogonal_",
    "sparse_",
)
# ... and the Tensor methods they, and builders directly (ViT's position embedding,
# `torch.empty(...).normal_(std=0.02)`), draw with: timm's own truncated normal among them.
RANDOM_TENSOR_METHODS = ("uniform_", "normal_")


def _unchanged(tensor, *args, **kwargs):
    return tensor


@contextlib.contextmanager
def random_init_skipped(active: bool = True) -> Iterator[None]:
    """While the model is built, torch's random initialisers leave tensors as they are (memory
    not yet written): only for a model whose every parameter and persistent buffer a strict
    load overwrites before it is used. Process-wide while it lasts, so only around a build."""
    if not active:
        yield
        return
    import torch

    targets = [(torch.nn.init, name) for name in RANDOM_INIT_FUNCTIONS]
    targets += [(torch.Tensor, name) for name in RANDOM_TENSOR_METHODS]
    # What each owner itself held (Tensor's methods live on its C base: nothing to put back).
    saved = [(owner, name, vars(owner).get(name)) for owner, name in targets]
    try:
        for owner, name in targets:
            setattr(owner, name, _unchanged)
        yield
    finally:
        for owner, name, original in saved:
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
