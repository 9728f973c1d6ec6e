"""Models built for one image size: their layers hold it (a ViT's patch grid, MaxViT's
partition grids, a timm model's `img_size`), so that they run at that size only, or hold weights
shaped for it (position embeddings, relative position bias tables). A checkpoint of one used at
another size is rebuilt for that size, and the weights whose shapes follow the size are adapted
to it as the model's own library adapts pretrained weights (timm's checkpoint filters);
everything else loads as it is.

Known: torchvision's `VisionTransformer` and `MaxVit` (whose relative position tables follow its
partition size, not the image's: its weights fit any size it is built for) and every timm model
built with an `img_size` (ViTs, MaxViT, CoAtNet...). A model that runs at any size (a CNN) has
none of these and is left as it is.
"""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Mapping
from typing import Any

from torchkit.core.io.errors import UsageError, first_line

log = logging.getLogger("torchkit")


def size_layout(model: Any) -> tuple[tuple[str, Any], ...]:
    """What `model`'s layers hold of the image size it is built for, layer by layer: two
    builds for different sizes differ in it; empty for a model that runs at any size. The
    classes are looked up only where their module is imported already."""
    torchvision_vit = _class_of("torchvision.models.vision_transformer", "VisionTransformer")
    torchvision_maxvit = _class_of("torchvision.models.maxvit", "PartitionAttentionLayer")
    layout: list[tuple[str, Any]] = []
    for name, module in model.named_modules():
        if torchvision_vit is not None and isinstance(module, torchvision_vit):
            layout.append((name, int(module.image_size)))
        elif torchvision_maxvit is not None and isinstance(module, torchvision_maxvit):
            layout.append((name, tuple(module.grid_size)))
        elif type(module).__module__.startswith("timm."):
            size = getattr(module, "img_size", None)
            if size is not None and not getattr(module, "dynamic_img_size", False):
                layout.append((name, tuple(size) if isinstance(size, (tuple, list)) else size))
    return tuple(layout)


def patch_sizes(model: Any) -> list[tuple[int, int]]:
    """The patch size (H, W) of each timm patch embedding in `model` (a ViT's, with or without
    absolute position embeddings): an image size they do not divide drops pixels."""
    sizes = []
    for module in model.modules():
        patch = getattr(module, "patch_size", None)
        timm_embed = type(module).__module__.startswith("timm.") and (
            type(module).__name__ == "PatchEmbed"
        )
        if timm_embed and patch is not None:
            height, width = (patch, patch) if isinstance(patch, int) else patch
            sizes.append((int(height), int(width)))
    return sizes


def timm_size_adapted(
    model: Any, state: Mapping[str, Any], *, source: str, note: bool = True
) -> Mapping[str, Any]:
    """`state`, a timm model's weights for another image size than `model`'s, with each weight
    whose shape follows the size (relative position bias tables...) taken from timm's own
    checkpoint filter for `model`'s family (the function timm adapts its pretrained weights
    with when it builds a model for another img_size); every other weight is left as it is.
    A Note says which were adapted, unless `note` is False. No filter, or one that fails,
    leaves `state` as it is (the size-dependent weights are refused next, by name)."""
    own = model.state_dict()
    differ = _misfits(own, state)
    family = sys.modules.get(type(model).__module__)
    adapt = getattr(family, "checkpoint_filter_fn", None)
    if not differ or adapt is None:
        return state
    try:
        with warnings.catch_warnings():  # timm's interpolation's own torch warnings
            warnings.simplefilter("ignore", UserWarning)
            filtered = adapt(dict(state), model)
    except Exception as error:  # timm's filter: whatever it raises leaves the weights as they are
        log.debug("%s: timm's checkpoint filter failed: %s", source, first_line(error))
        return state
    adapted = dict(state)
    done = []
    for key in differ:
        value = filtered.get(key)
        if value is not None and tuple(value.shape) == tuple(own[key].shape):
            adapted[key] = value
            done.append(key)
    if done and note:
        kinds = sorted({key.rsplit(".", 1)[-1] for key in done})
        log.warning(
            "%s: %d weights that follow the image size (%s) resampled to those of %s images "
            "(timm's checkpoint filter for %s)",
            source,
            len(done),
            ", ".join(kinds),
            _built_size(model),
            type(model).__name__,
            extra={"note": True},
        )
    return adapted


def refuse_size_bound_misfits(
    model: Any, state: Mapping[str, Any], *, source: str, trained: int, wanted: tuple[int, int]
) -> None:
    """One error naming the first weight of `state` whose shape `model` (rebuilt for `wanted`
    images) does not have, and which nothing above could resample: the model cannot run at
    that size with these weights."""
    own = model.state_dict()
    for key in _misfits(own, state)[:1]:
        raise UsageError(
            f"{source} holds a model trained on {trained}x{trained} images whose {key} "
            f"follows the image size and cannot be resampled to {wanted[0]}x{wanted[1]} "
            f"images ({_shape(state[key])} -> {_shape(own[key])})",
            f"drop --image-size to run it at {trained}",
        )


def size_adapted(
    model: Any, state: Mapping[str, Any], *, source: str, note: bool = True
) -> Mapping[str, Any]:
    """`state` with every weight that follows the image size adapted to `model`'s: a ViT's
    position embeddings (`resampled_position_embeddings`), a timm model's relative position
    bias tables (`timm_size_adapted`); anything else is left to the strict load that follows."""
    from torchkit.core.models.position_embeddings import resampled_position_embeddings

    state = resampled_position_embeddings(model, state, source=source, note=note)
    return timm_size_adapted(model, state, source=source, note=note)


def _misfits(own: Mapping[str, Any], state: Mapping[str, Any]) -> list[str]:
    """The keys of `state` that `own` (a model's state dict) holds in another shape."""
    return [
        key
        for key, value in state.items()
        if key in own and tuple(getattr(value, "shape", ())) != tuple(own[key].shape)
    ]


def _built_size(model: Any) -> str:
    """The image size a timm model is built for (its `img_size`, or its patch embedding's)."""
    size = getattr(model, "img_size", None)
    if size is None:
        size = getattr(getattr(model, "patch_embed", None), "img_size", None)
    if size is None:
        return "its"
    height, width = (size, size) if isinstance(size, int) else size
    return f"{height}x{width}"


def _shape(tensor: Any) -> str:
    return "x".join(str(n) for n in tensor.shape)


def _class_of(module: str, name: str) -> type | None:
    loaded = sys.modules.get(module)
    return getattr(loaded, name, None) if loaded is not None else None
