"""Building an architecture by name: a torchvision classifier, the built-in `convnet`,
`package.module:Callable`, or a timm model (`timm/NAME`), with random weights, the library's
pretrained ones, or a file's; and the model a torchkit checkpoint names, rebuilt
(`model_from_checkpoint`)."""

from __future__ import annotations

import difflib
import hashlib
import logging
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from torchkit.core.data.preprocessing import Preprocess
from torchkit.core.io.errors import InputError, OfflineError, TorchkitError, UsageError
from torchkit.core.io.files import require_input
from torchkit.core.models.convnet import convnet_class
from torchkit.core.models.heads import fit_auxiliary_heads_to, replace_head
from torchkit.core.models.hub_cache import (
    http_status_error,
    hub_checkpoints_dir,
    refuse_damaged_cached_file,
    require_downloadable,
    weights_cache_error,
)
from torchkit.core.models.lazy import materialize_lazy_layers
from torchkit.core.models.model_files import MODEL_FILE_SUFFIXES
from torchkit.core.models.position_embeddings import (
    patch_multiple_hint,
    position_grids,
)
from torchkit.core.models.random_init import built_for_loading
from torchkit.core.models.size_bound import (
    UnrunnableSizeError,
    patch_sizes,
    refuse_size_bound_misfits,
    size_adapted,
    size_layout,
)
from torchkit.core.models.timm_models import (
    TIMM_PREFIX,
    built_timm_model,
    size_pair,
    timm_pretrained,
)
from torchkit.core.models.usercode import (
    call_model_factory,
    code_of_the_run_in,
    is_callable_spec,
    model_code_folder,
)
from torchkit.core.models.weights import (
    checkpoint_arch,
    load_weights_file,
    require_trusted_arch,
)

log = logging.getLogger("torchkit")

BUILTIN_MODELS = ("convnet",)
# torchvision builders whose position embeddings fix the image size at construction.
IMAGE_SIZE_KWARGS = {"vit_": "image_size", "maxvit_": "input_size"}
# Builders that print a FutureWarning ("the default weight initialization ... will be changed")
# unless told which initialisation to use: the one they use now (truncated normal), said.
INIT_KWARGS = {"googlenet": {"init_weights": True}, "inception_v3": {"init_weights": True}}
# The same builders when every weight is overwritten right after, strictly (a checkpoint, a
# weights file): their truncated-normal initialisation, half the build's time, is skipped; each
# layer keeps PyTorch's own (cheap) initialisation, so no weight is ever left unset.
LOADED_INIT_KWARGS = {name: {"init_weights": False} for name in INIT_KWARGS}


def list_models() -> list[str]:
    """Names `--model` accepts besides `module:Callable` and checkpoint paths."""
    import torchvision

    return sorted([*BUILTIN_MODELS, *torchvision.models.list_models(module=torchvision.models)])


def suggest(name: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=3, cutoff=0.5)
    if close:
        return "did you mean " + ", ".join(close) + "?"
    return "run `torchkit summary --list` for the model names"


def is_checkpoint_path(name: str) -> bool:
    if is_timm_spec(name):
        return False
    return os.sep in name or name.endswith(MODEL_FILE_SUFFIXES) or Path(name).is_file()


def is_timm_spec(spec: str) -> bool:
    """`timm/NAME` or `timm/NAME.TAG`: a timm model, unless that path exists (an existing file
    or folder wins) or it ends like a model file (`timm/x.pt` is a path that is missing)."""
    rest = spec[len(TIMM_PREFIX) :]
    return (
        spec.startswith(TIMM_PREFIX)
        and "/" not in rest
        and os.sep not in rest
        and not rest.endswith(MODEL_FILE_SUFFIXES)
        and not os.path.exists(spec)
    )


def build_model(
    name: str,
    num_classes: int,
    *,
    weights: str | None = None,
    image_size: int | tuple[int, int] = 224,
    in_channels: int = 3,
    trust_checkpoint: bool = False,
    weights_follow: bool = False,
):
    """Build `name` with a head of `num_classes` outputs.

    `weights` is None (random init), a torchvision weights name such as "DEFAULT" (needs the
    internet or a warm cache), or a path to a state dict / checkpoint. With pretrained weights the
    model is built with the head the weights have, loaded, then the head is replaced.
    `weights_follow`: the caller loads every weight right after, strictly. Whenever every weight
    is loaded strictly (that, or a weights file), the random initialisers that only cost time
    are skipped (built_for_loading); never for `package.module:Callable`, the user's code.
    """
    if name in BUILTIN_MODELS:
        # Sized for (H, W): summary's input of another shape, -i 3,32,48
        size = size_pair(image_size)
        model = built_for_loading(
            lambda: convnet_class()(num_classes, in_channels, size), weights_follow or bool(weights)
        )
        if weights not in (None, ""):
            load_weights_file(
                model, weights, num_classes=num_classes, trust_checkpoint=trust_checkpoint
            )
        return model
    if is_callable_spec(name):
        # the size it was trained at, for a factory that takes it (a ViT's position embeddings)
        model, took_classes = call_model_factory(
            name, num_classes=num_classes, image_size=image_size
        )
        # lazy layers (LazyLinear...) sized for the images it takes, before the head and load
        side = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        materialize_lazy_layers(model, (in_channels, *side), name)
        if not took_classes:
            replace_head(model, num_classes)
        if weights:
            load_weights_file(
                model, weights, num_classes=num_classes, trust_checkpoint=trust_checkpoint
            )
        return model
    if is_timm_spec(name):
        return _build_timm(
            name, num_classes, weights, image_size, in_channels, trust_checkpoint, weights_follow
        )
    require_torchvision_name(name)
    if weights is None or weights == "":
        return torchvision_random(name, num_classes, image_size, weights_follow=weights_follow)
    if not os.path.exists(weights):
        if is_checkpoint_path(weights):
            raise InputError(f"weights file not found: {weights}", "check the path")
        model = torchvision_pretrained(name, weights)
        replace_head(model, num_classes)
        return model
    import torchvision

    model = built_for_loading(
        lambda: torchvision.models.get_model(name, weights=None, **LOADED_INIT_KWARGS.get(name, {}))
    )
    load_weights_file(model, weights, num_classes=num_classes, trust_checkpoint=trust_checkpoint)
    return model


def model_from_checkpoint(
    checkpoint: Mapping[str, Any],
    *,
    trust_checkpoint: bool = False,
    source: str = "the checkpoint",
    image_size: int | tuple[int, int] | None = None,
    note_resampling: bool = True,
):
    """Rebuild the model a torchkit checkpoint was trained with and load its weights. An `arch`
    that names code (`package.module:Callable`) is imported only with `trust_checkpoint`: a file
    never chooses what runs without the user's say.

    `image_size` (N or (H, W)) other than the size the checkpoint records: a model built for
    one size (a ViT, a MaxViT, a timm model built with an img_size) is built for it instead,
    and the weights that follow the size adapted (a ViT's position embeddings resampled to its
    patch grid...: a Note says so, unless `note_resampling` is False: the EMA weights loaded
    next say it; with none to adapt, a Note says the model was rebuilt); a size its patches do
    not divide is refused before it is built. Any other model is built for the recorded size.

    Model code is looked for first in the working directory its run found it in (the folder
    the checkpoint records), as `train --resume` does: every command that loads the
    checkpoint finds it there, from any folder.
    """
    arch, num_classes = checkpoint_arch(checkpoint, source)
    require_trusted_arch(arch, source, trust_checkpoint)  # before any folder is searched
    with code_of_the_run_in(model_code_folder(checkpoint), source):
        return _model_from_checkpoint(
            checkpoint,
            arch,
            num_classes,
            trust_checkpoint=trust_checkpoint,
            source=source,
            image_size=image_size,
            note_resampling=note_resampling,
        )


def _model_from_checkpoint(
    checkpoint: Mapping[str, Any],
    arch: str,
    num_classes: int,
    *,
    trust_checkpoint: bool,
    source: str,
    image_size: int | tuple[int, int] | None,
    note_resampling: bool,
):
    from torchkit.core.models.checkpoint import extract_state_dict, load_weights_into

    preprocess = Preprocess.from_dict(checkpoint.get("preprocess"), source)

    def built_for(size: int | tuple[int, int]):
        return build_model(
            arch,
            num_classes,
            image_size=size,
            in_channels=preprocess.in_channels,
            trust_checkpoint=trust_checkpoint,
            weights_follow=True,
        )

    wanted = size_pair(image_size)
    recorded = (preprocess.image_size, preprocess.image_size)
    if wanted is not None and not _records_image_size(checkpoint):
        # No size recorded (a checkpoint made by hand, or its preprocess lost): built for the
        # size asked for, as the hint of weights that do not fit says, not for the default 224
        # (a convnet's classifier, sized for its images, then never fitted its weights).
        recorded = wanted
    model = built_for(recorded if recorded[0] != recorded[1] else recorded[0])
    state = extract_state_dict(checkpoint)
    if wanted is not None and wanted != recorded and size_layout(model):
        model = _rebuilt_for(
            model, wanted, built_for, arch=arch, source=source, trained=preprocess.image_size
        )
        adapted = size_adapted(model, state, source=source, note=note_resampling)
        refuse_size_bound_misfits(
            model, adapted, source=source, trained=preprocess.image_size, wanted=wanted
        )
        if adapted is state:  # nothing resampled, so nothing said yet: the rebuild is
            log.warning(
                "%s: %s rebuilt for %dx%d images (trained on %dx%d), its weights loaded as "
                "they are (none of them follows the image size)",
                source,
                arch,
                *wanted,
                preprocess.image_size,
                preprocess.image_size,
                extra={"note": True},
            )
        state = adapted
    fit_auxiliary_heads_to(model, state)  # googlenet's: a run from its pretrained weights has none
    load_weights_into(model, state, source=f"the {arch} checkpoint")
    return model


def _records_image_size(checkpoint: Mapping[str, Any]) -> bool:
    """Whether a torchkit checkpoint records the image size its model was built for."""
    recorded = checkpoint.get("preprocess")
    return isinstance(recorded, Mapping) and "image_size" in recorded


def _rebuilt_for(
    model: Any,
    size: tuple[int, int],
    built_for: Callable[[tuple[int, int]], Any],
    *,
    arch: str,
    source: str,
    trained: int,
) -> Any:
    """The checkpoint's model (`model`, built for the `trained` size it records: a ViT, a
    MaxViT, a timm model built with an img_size) built again for `size` images; a ViT is
    refused before the build when its patches do not divide `size` (the model would drop the
    pixels past the last whole patch), and any model after it when the builder did not take
    the size (a `package.module:Callable` without an `image_size` parameter)."""
    grids = list(position_grids(model))
    shown = f"{size[0]}x{size[1]}"
    kind = "ViT" if grids else "model"
    held = f"{source} holds a {kind} trained on {trained}x{trained} images"
    if size[0] != size[1] and any(grid.square_only for grid in grids):
        raise UsageError(
            f"{held}, which takes square images only, not {shown}",
            "give an input size whose height and width are the same",
        )
    resampled = ": its position embeddings cannot be resampled to them" if grids else ""
    for patch in [grid.patch for grid in grids] or patch_sizes(model):
        for side, patch_side in zip(size, patch, strict=True):
            if side % patch_side:
                raise UsageError(
                    f"{held}, and {shown} images do not divide into its {patch_side} px "
                    f"patches{resampled}",
                    patch_multiple_hint(side, patch_side),
                )
    try:
        rebuilt = built_for(size)
    except UnrunnableSizeError as error:  # built, but it cannot run there (timm's CoAtNet)
        raise UsageError(
            f"{held}, and {error.message}",
            f"{error.hint}, or drop --image-size to run it at {trained}",
        ) from error
    except TorchkitError as error:  # a size its layers cannot be built for (MaxViT's partitions)
        raise UsageError(
            f"{held}, and cannot be built for {shown} images: {error.message}",
            f"drop --image-size to run it at {trained}, or choose another size",
        ) from error
    rebuilt_grids = [grid.image for grid in position_grids(rebuilt)]
    if rebuilt_grids != [size] * len(grids) or size_layout(rebuilt) == size_layout(model):
        raise UsageError(
            f"{source} holds a {kind} trained on {trained}x{trained} images, and {arch} builds "
            f"none for {shown} images (it takes no image_size)",
            f"drop --image-size to run it at {trained}, or give {arch} an image_size parameter",
        )
    return rebuilt


def _build_timm(
    spec: str,
    num_classes: int,
    weights: str | None,
    image_size: int | tuple[int, int],
    in_channels: int,
    trust_checkpoint: bool,
    weights_follow: bool = False,
):
    """A timm model built as `resolve_model` builds it for the same image size and channels
    (so a checkpoint's weights fit the model rebuilt from its `arch`)."""
    if not weights:
        return built_timm_model(
            spec,
            weights_follow,
            num_classes=num_classes,
            image_size=image_size,
            in_channels=in_channels,
        )
    if not os.path.exists(weights):
        if is_checkpoint_path(weights):
            raise InputError(f"weights file not found: {weights}", "check the path")
        model = timm_pretrained(spec, weights, image_size=image_size, in_channels=in_channels)
        replace_head(model, num_classes)
        return model
    model = built_timm_model(spec, True, image_size=image_size, in_channels=in_channels)
    load_weights_file(model, weights, num_classes=num_classes, trust_checkpoint=trust_checkpoint)
    return model


def require_torchvision_name(name: str) -> None:
    import torchvision

    available = torchvision.models.list_models(module=torchvision.models)
    if name not in available:
        if os.path.isdir(name):  # a folder is no model name: its checkpoint, or none, named
            require_input(name, what="checkpoint", kind="file")
        hint = suggest(name, [*BUILTIN_MODELS, *available])
        if _timm_has(name):
            hint = f"timm has it: {TIMM_PREFIX}{name}"
        raise UsageError(f"unknown model {name!r}", hint)


def _timm_has(name: str) -> bool:
    """Whether `name` is a timm model (timm looked at only when it is installed)."""
    import importlib.util

    if importlib.util.find_spec("timm") is None:
        return False
    import timm

    return name in timm.list_models()


def torchvision_random(
    name: str,
    num_classes: int,
    image_size: int | tuple[int, int] = 224,
    *,
    weights_follow: bool = False,
):
    """A randomly initialised torchvision model; ViT and MaxViT are built for `image_size`.
    `weights_follow`: every weight is loaded right after, strictly, so the random initialisation
    is skipped (built_for_loading; googlenet's and inception_v3's own: LOADED_INIT_KWARGS)."""
    import torchvision

    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    kwarg = next((kw for prefix, kw in IMAGE_SIZE_KWARGS.items() if name.startswith(prefix)), None)
    extra = dict((LOADED_INIT_KWARGS if weights_follow else INIT_KWARGS).get(name, {}))
    if kwarg == "image_size":
        if size[0] != size[1]:
            raise UsageError(f"{name} takes square images, not {size[0]}x{size[1]}")
        extra["image_size"] = size[0]
    elif kwarg == "input_size" and size != (224, 224):
        extra["input_size"] = size
    try:
        return built_for_loading(
            lambda: torchvision.models.get_model(
                name, weights=None, num_classes=num_classes, **extra
            ),
            weights_follow,
        )
    except (ValueError, AssertionError) as error:
        if kwarg is None or not extra:
            raise
        reason = " ".join(str(error).split())  # MaxViT's spans two lines
        hint = None
        patch = name.rsplit("_", 1)[-1]
        if kwarg == "image_size" and patch.isdigit():  # vit_b_16: 16 px patches
            hint = patch_multiple_hint(size[0], int(patch))
        raise UsageError(
            f"cannot build {name} for {size[0]}x{size[1]} images: {reason}", hint
        ) from error


def torchvision_pretrained(name: str, weights: str):
    """torchvision's `name` with its `weights` (downloaded once, then read from the cache).

    torch.hub writes `Downloading: "https://..." to ~/.cache/...` with `sys.stdout.write`: that
    line goes to stderr here, so that stdout carries only a command's result (`--format json`
    stays parseable the first time the weights are needed, not only later). It is written only
    once the download can start: offline, one error line and nothing before it
    (`require_downloadable`)."""
    import contextlib
    import sys
    import urllib.error

    import torchvision

    enum = torchvision_weights_enum(name)
    try:
        chosen = enum.verify(weights) if enum is not None else None
    except (KeyError, ValueError):
        chosen = None  # torchvision's own error below says which names it has
    if chosen is not None:
        require_downloadable(chosen.url, f"the {weights} weights of {name}")
    try:
        try:
            # torchvision's builder loads every weight strictly right after building: the
            # random initialisation it would draw first only costs time (built_for_loading).
            with contextlib.redirect_stdout(sys.stderr):
                model = built_for_loading(
                    lambda: torchvision.models.get_model(name, weights=weights)
                )
        except Exception:  # a cached file that fails to load: damaged, or the error below
            if chosen is not None:
                refuse_damaged_cached_file(chosen.url, f"the {weights} weights of {name}")
            raise
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as error:
        cache_error = weights_cache_error(error)
        if cache_error is not None:
            raise cache_error from error
        if isinstance(error, FileNotFoundError):
            raise
        if isinstance(error, urllib.error.HTTPError):  # the server answered: online already
            url = chosen.url if chosen is not None else error.url
            raise http_status_error(error, url, f"the {weights} weights of {name}") from error
        raise OfflineError(
            f"cannot download the {weights} weights of {name}: {error}",
            f"connect to the internet once so they are cached in {hub_checkpoints_dir()}, "
            "or pass --weights PATH to a local file",
        ) from error
    except ValueError as error:
        raise UsageError(f"unknown weights {weights!r} for {name}: {error}") from error
    if name in TRANSFORM_INPUT_MODELS:
        # Fed mean/std 0.5 instead (see TRANSFORM_INPUT_MODELS): the model every later command
        # rebuilds from a checkpoint of it (transform_input off) is then the model trained.
        model.transform_input = False
    return model


# torchvision builds googlenet and inception_v3 with `transform_input=True` for its own weights
# (and only for them): they take images normalised to mean 0.5, std 0.5, which the model makes
# of ImageNet-normalised ones. The weights file alone does not say so. torchkit builds them
# without it and normalises to mean 0.5, std 0.5 itself (the same input, and a preprocessing a
# checkpoint records), whether the weights are named (DEFAULT) or torchvision's file.
TRANSFORM_INPUT_MODELS = ("googlenet", "inception_v3")
TRANSFORM_INPUT_MEAN_STD = (0.5, 0.5, 0.5)


def takes_transform_input_mean_std(name: str, weights: str | None) -> bool:
    """Whether `name` with `weights` is googlenet or inception_v3 with torchvision's weights,
    named (DEFAULT, IMAGENET1K_V1) or its own file: normalised to TRANSFORM_INPUT_MEAN_STD."""
    if name not in TRANSFORM_INPUT_MODELS or not weights:
        return False
    if os.path.isfile(weights):
        try:
            return is_torchvision_transform_input_file(name, weights)
        except OSError:
            return False  # an unreadable file is reported when the weights are loaded
    return not os.path.exists(weights) and not is_checkpoint_path(weights)


def is_torchvision_transform_input_file(name: str, path: str) -> bool:
    """Whether `path` is torchvision's own weights file of googlenet or inception_v3, under any
    name: its sha256 starts with the hex digits of the name torch.hub downloads it under
    (`googlenet-1378be20.pth`), as torch.hub checks it."""
    if name not in TRANSFORM_INPUT_MODELS:
        return False
    enum = torchvision_weights_enum(name)
    prefixes = [m.group(1) for w in enum or () if (m := re.search(r"-([0-9a-f]{8,})\.", w.url))]
    if not prefixes:
        return False
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest().startswith(tuple(prefixes))


def torchvision_weights_enum(name: str):
    import torchvision

    try:
        return torchvision.models.get_model_weights(name)
    except (ValueError, KeyError):
        return None
