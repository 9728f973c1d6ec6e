"""A ViT's weights for one image size loaded into the model built for another: the position
embeddings (one per patch of the weights' grid, after the class and other prefix tokens) are
resampled to the model's grid, as torchvision's reference scripts (`interpolate_embeddings`)
and timm (`resample_abs_pos_embed`, on load) do; every other weight is the same at any size.

Known layouts: torchvision's `VisionTransformer` (`encoder.pos_embedding`, one class token,
bicubic with aligned corners) and timm's `VisionTransformer` and its subclasses (`pos_embed`,
its prefix tokens unless `no_embed_class`, bicubic with antialiasing).
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from torchkit.core.io.errors import UsageError

log = logging.getLogger("torchkit")


@dataclass(frozen=True)
class PositionGrid:
    """Where one ViT of a model keeps its position embeddings, and the grid it is built for."""

    key: str  # in the model's state dict
    prefix_tokens: int  # class (and distillation, register) tokens before the patches
    grid: tuple[int, int]  # patches per column and row at the size the model is built for
    patch: tuple[int, int]  # pixels per patch
    image: tuple[int, int]  # the image size the model is built for
    align_corners: bool
    antialias: bool
    square_only: bool = False  # torchvision's: built for one side, its grid is square


def resampled_position_embeddings(
    model: Any, state: Mapping[str, Any], *, source: str, note: bool = True
) -> Mapping[str, Any]:
    """`state` with each ViT position embedding of another patch grid than `model`'s
    resampled to it (a note says from which grid to which, unless `note` is False); anything
    else is left to the strict load that follows. An image size the patches do not divide is
    refused."""
    resampled: dict[str, Any] | None = None
    for layout in position_grids(model):
        theirs = state.get(layout.key)
        old = _old_grid(theirs, layout, model)
        if old is None or old == layout.grid:
            continue
        _refuse_partial_patches(layout, source)
        if resampled is None:
            resampled = dict(state)
        resampled[layout.key] = resample(theirs, layout.grid, layout=layout, old_grid=old)
        if not note:
            continue
        log.warning(
            "%s: position embeddings resampled from %s to %s (the weights' patch grid to that "
            "of %s images in %s px patches)",
            source,
            _shown(old),
            _shown(layout.grid),
            _shown(layout.image),
            _shown_side(layout.patch),
            extra={"note": True},
        )
    return state if resampled is None else resampled


def resample(
    embeddings: Any,
    grid: tuple[int, int],
    *,
    layout: PositionGrid,
    old_grid: tuple[int, int],
) -> Any:
    """(1, prefix + old H*W, D) position embeddings as (1, prefix + H*W, D) for `grid`: the
    prefix tokens kept, the patches' embeddings interpolated as an image of D channels."""
    import torch
    import torch.nn.functional as F

    prefix, patches = embeddings[:, : layout.prefix_tokens], embeddings[:, layout.prefix_tokens :]
    dim = patches.shape[-1]
    image = patches.float().reshape(1, *old_grid, dim).permute(0, 3, 1, 2)
    image = F.interpolate(
        image,
        size=grid,
        mode="bicubic",
        align_corners=layout.align_corners,
        antialias=layout.antialias,
    )
    patches = image.permute(0, 2, 3, 1).reshape(1, grid[0] * grid[1], dim).to(embeddings.dtype)
    return torch.cat([prefix, patches], dim=1)


def position_grids(model: Any) -> Iterator[PositionGrid]:
    """The position embeddings of each ViT in `model` whose layout is known. The classes are
    looked up only where their module is imported already: no model of theirs otherwise."""
    torchvision_vit = _class_of("torchvision.models.vision_transformer", "VisionTransformer")
    timm_vit = _class_of("timm.models.vision_transformer", "VisionTransformer")
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        if torchvision_vit is not None and isinstance(module, torchvision_vit):
            side, patch = int(module.image_size), int(module.patch_size)
            yield PositionGrid(
                f"{prefix}encoder.pos_embedding",
                prefix_tokens=1,
                grid=(side // patch, side // patch),
                patch=(patch, patch),
                image=(side, side),
                align_corners=True,  # torchvision's interpolate_embeddings
                antialias=False,
                square_only=True,
            )
        elif timm_vit is not None and isinstance(module, timm_vit):
            embed = getattr(module, "patch_embed", None)
            if getattr(module, "pos_embed", None) is None or embed is None:
                continue  # no absolute position embeddings to resample
            grid = getattr(embed, "grid_size", None)
            if grid is None:  # dynamic image size: timm resamples them in forward
                continue
            no_embed_class = bool(getattr(module, "no_embed_class", False))
            yield PositionGrid(
                f"{prefix}pos_embed",
                prefix_tokens=0 if no_embed_class else int(getattr(module, "num_prefix_tokens", 1)),
                grid=(int(grid[0]), int(grid[1])),
                patch=_pair(embed.patch_size),
                image=_pair(embed.img_size),
                align_corners=False,  # timm's resample_abs_pos_embed, as its checkpoints load
                antialias=True,
            )


def _old_grid(theirs: Any, layout: PositionGrid, model: Any) -> tuple[int, int] | None:
    """The square patch grid of the weights' embeddings; None where they already fit the model
    (as many as its own: loaded as they are, as timm does) or are not position embeddings of
    this ViT's width on a square grid (the strict load reports what is wrong)."""
    own = model.state_dict().get(layout.key)
    shape = tuple(getattr(theirs, "shape", ()))
    if own is None or len(shape) != 3 or shape[0] != 1 or shape[-1] != own.shape[-1]:
        return None
    if shape == tuple(own.shape):  # a non-square grid of a square count (4x9) is not 6x6
        return None
    side = math.isqrt(max(shape[1] - layout.prefix_tokens, 0))
    if side < 1 or side * side != shape[1] - layout.prefix_tokens:
        return None
    return side, side


def _refuse_partial_patches(layout: PositionGrid, source: str) -> None:
    """A side the patches do not divide: the model would drop the pixels past the last whole
    patch, and the resampled grid would not be the image's."""
    if all(side % patch == 0 for side, patch in zip(layout.image, layout.patch, strict=True)):
        return
    raise UsageError(
        f"the weights in {source} are for another image size, and {_shown(layout.image)} "
        f"images do not divide into {_shown_side(layout.patch)} px patches: their position "
        "embeddings cannot be resampled",
        patch_multiple_hint(layout.image[0], layout.patch[0]),
    )


def patch_multiple_hint(side: int, patch: int) -> str:
    """The hint for a ViT asked for `side` px images that its `patch` px patches do not
    divide: the multiples of `patch` either side of it."""
    low = max(patch, side // patch * patch)
    return f"use an --image-size that is a multiple of {patch}, such as {low} or {low + patch}"


def _class_of(module: str, name: str) -> type | None:
    loaded = sys.modules.get(module)
    return getattr(loaded, name, None) if loaded is not None else None


def _pair(value: Any) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    first, second = value
    return int(first), int(second)


def _shown(pair: tuple[int, int]) -> str:
    return f"{pair[0]}x{pair[1]}"


def _shown_side(pair: tuple[int, int]) -> str:
    return str(pair[0]) if pair[0] == pair[1] else _shown(pair)
