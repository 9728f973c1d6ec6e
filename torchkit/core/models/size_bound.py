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
from collections.abc import Callable, Mapping
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


class UnrunnableSizeError(UsageError):
    """A model its library builds for an image size it cannot run at (timm's CoAtNet at 48 px);
    the hint names sizes it runs at."""


def refuse_unrunnable_size(
    model: Any,
    name: str,
    size: tuple[int, int],
    channels: int,
    built_on_meta: Callable[[int], Any],
) -> None:
    """One error, before any image is read, where `model` (built for `size` images: a timm
    model built with an img_size) does not run at that size: timm builds a CoAtNet for 48 px,
    but its stages size their attention for feature maps rounded up (2x2 where its pooling
    gives 1x1), and the first batch failed deep inside. Judged on a meta-device copy (no
    compute), only where a side is not a multiple of the model's total stride (sizes such
    models are made for), and only where the model `built_on_meta` for a square side runs at
    a multiple near it (those the hint names): a model the meta device cannot run is not
    judged."""
    if not size_layout(model):
        return
    stride = _total_stride(model)
    if stride is not None and all(side % stride == 0 for side in size):
        return
    patches = patch_sizes(model)
    if any(side % across for patch in patches for side, across in zip(size, patch, strict=True)):
        return  # a ViT's patches that do not divide the size: refused in their own words
    from torchkit.core.models.image_size import meta_copy

    try:
        copy = meta_copy(model).eval()
    except Exception:  # noqa: BLE001 - a model that cannot be copied is not judged here
        return
    failure = _meta_failure(copy, channels, size)
    if failure is None:
        return
    step = stride or 32
    low = max(step, max(size) // step * step)
    works = [side for side in (low, low + step) if _runs_as_built(built_on_meta, channels, side)]
    if not works:  # it fails on the meta device at multiples of its stride too: not judged
        return
    raise UnrunnableSizeError(
        f"{name} cannot run on {size[0]}x{size[1]} images, although it is built for them: "
        f"{first_line(failure)}",
        f"use an --image-size that is a multiple of {step}, such as "
        + " or ".join(map(str, works)),
    )


def _runs_as_built(built_on_meta: Callable[[int], Any], channels: int, side: int) -> bool:
    """Whether the model built (on the meta device) for `side` px images runs on them."""
    try:
        model = built_on_meta(side).eval()
    except Exception:  # noqa: BLE001 - a size it cannot be built for does not run
        return False
    return _meta_failure(model, channels, (side, side)) is None


def _meta_failure(copy: Any, channels: int, size: tuple[int, int]) -> Exception | None:
    """What a forward pass of `copy` (on the meta device) raises on one image of `size`."""
    import torch

    with torch.inference_mode(False), torch.no_grad():
        try:
            copy(torch.empty(1, channels, *size, device="meta"))
        except Exception as error:  # noqa: BLE001 - whatever the reason, not this size
            return error
    return None


def _total_stride(model: Any) -> int | None:
    """How many pixels a timm model's last feature map steps per position (its last
    `feature_info` reduction: 32 for CoAtNet and MaxViT, the patch size for a ViT); None where
    it does not say."""
    info = getattr(model, "feature_info", None)
    try:
        reduction = int(info[-1]["reduction"])
    except (TypeError, LookupError, ValueError):
        return None
    return reduction if reduction > 0 else None


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
