"""Models with lazy layers (`torch.nn.LazyLinear`, `LazyConv2d`, `LazyBatchNorm2d`...), whose
weights get their shapes from the first input they see: until then they hold no weights an
optimizer, DDP, an EMA copy, a summary, an export or a `load_state_dict` could use ("Attempted
to use an uninitialized parameter"). The resolver sizes them as soon as the user's code has
built the model, with one forward pass of an input of the shape the command will feed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torchkit.core.io.errors import UsageError, first_line
from torchkit.core.models.image_size import image_size_refusal


def has_lazy_weights(model: Any) -> bool:
    """Whether a layer of `model` still waits for its first input to size its weights."""
    from torch.nn.modules.lazy import LazyModuleMixin

    return any(
        isinstance(module, LazyModuleMixin) and module.has_uninitialized_params()
        for module in model.modules()
    )


def materialize_lazy_layers(model: Any, sample_shape: Sequence[int], name: str) -> bool:
    """Size the lazy layers of `model` (if it has any) for one sample of `sample_shape`
    (C, H, W): one forward pass of a single image of zeros, in eval mode (BatchNorm's running
    statistics untouched, dropout off) and without gradients, on the device the model is on
    (the meta device costs nothing). Returns whether it had lazy layers. A forward that fails
    (an input size the model cannot take) is one UsageError naming `name` and the size (and
    the smallest side it takes, where images too small are why)."""
    if not has_lazy_weights(model):
        return False
    import torch

    parameter = next(iter(model.parameters()), None)
    device = parameter.device if parameter is not None else torch.device("cpu")
    shape = tuple(int(n) for n in sample_shape)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(torch.zeros((1, *shape), device=device))
    except Exception as error:  # the user's forward: whatever it raises is told in one line
        refusal = image_size_refusal(model, name, (1, *shape), error)
        if refusal is not None:  # images too small for it: the smallest side it takes named
            raise refusal from error
        size = "x".join(map(str, shape))
        raise UsageError(
            f"{name} has lazy layers that could not be sized by a {size} (CxHxW) input: "
            f"{first_line(error, with_type=True)}",
            "give the image size (and channels) it takes: --image-size, or --input-size",
        ) from error
    finally:
        model.train(was_training)
    if has_lazy_weights(model):  # a lazy layer the forward never reached
        raise UsageError(
            f"{name} has lazy layers its forward pass did not size (they got no input)",
            "give them their sizes in the model's code (nn.Linear instead of nn.LazyLinear...)",
        )
    return True
