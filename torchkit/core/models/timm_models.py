"""timm models, torchkit's optional `timm` extra: `timm/NAME` (or `timm/NAME.TAG`, a timm
pretrained tag) built offline with random weights, or with timm's pretrained weights from the
Hugging Face Hub (downloaded once, then read from the cache).

timm is imported only when a timm spec is built, never when the package is merely looked at."""

from __future__ import annotations

import contextlib
import difflib
import functools
import math
import os
import sys
import urllib.error
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from torchkit.core.data.preprocessing import CROP_MODES, INTERPOLATIONS, Preprocess
from torchkit.core.io.errors import InputError, OfflineError, UsageError, first_line
from torchkit.core.models.hub_cache import (
    NOT_THERE_STATUSES,
    http_status_error,
    hub_checkpoints_dir,
    refuse_damaged_cached_file,
    require_downloadable,
)
from torchkit.core.models.random_init import built_for_loading, skipped_weight_init
from torchkit.core.models.size_bound import refuse_unrunnable_size

TIMM_PREFIX = "timm/"
DEFAULT_WEIGHTS = "DEFAULT"


def import_timm():
    """The timm package, or a one-line error saying how to install the extra."""
    from torchkit.core.runtime.extras import import_extra

    timm = import_extra("timm", "timm", "a timm/ model")
    import_extra("timm.data", "timm", "a timm/ model")
    return timm


def timm_name(spec: str) -> str:
    """`NAME[.TAG]` of the spec `timm/NAME[.TAG]`."""
    return spec[len(TIMM_PREFIX) :] if spec.startswith(TIMM_PREFIX) else spec


def base_name(spec: str) -> str:
    """The architecture of a timm spec, without its pretrained tag (`timm/resnet18`)."""
    return TIMM_PREFIX + timm_name(spec).partition(".")[0]


def require_timm_name(spec: str) -> str:
    """The `NAME[.TAG]` of a timm spec, checked against timm's registry: an unknown name or tag
    is a UsageError with the close matches."""
    timm = import_timm()
    name = timm_name(spec)
    arch, _, tag = name.partition(".")
    if not arch:
        raise UsageError("timm/ needs a model name after it", "for example timm/resnet18")
    if not _timm_lists(timm, arch):
        raise UsageError(f"unknown timm model {arch!r}", suggest_timm(arch, timm.list_models()))
    if tag and f"{arch}.{tag}" not in _pretrained_tags(arch):
        raise UsageError(
            f"timm has no tag {tag!r} for {arch}", "its tags: " + _tag_list(arch, with_random=True)
        )
    return name


# The names `timm.list_models()` gave, as last listed: it filters and sorts all ~1,400 names
# at each call (about 10 ms), and a command checks its spec several times.
_listed_names: frozenset[str] = frozenset()


def _timm_lists(timm: Any, arch: str) -> bool:
    """Whether `timm.list_models()` lists `arch`; a name not listed last time is looked for in
    a new listing (a model registered since is found)."""
    global _listed_names
    if arch not in _listed_names:
        _listed_names = frozenset(timm.list_models())
    return arch in _listed_names


def suggest_timm(name: str, names: Sequence[str]) -> str:
    """Close matches among timm's model names, as specs (`timm/resnet18`)."""
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    if not close:
        close = [candidate for candidate in names if name.lower() in candidate][:3]
    if close:
        return "did you mean " + ", ".join(TIMM_PREFIX + c for c in close) + "?"
    return "`timm.list_models()` gives the names timm knows"


def create_timm_model(
    spec: str,
    *,
    num_classes: int | None = None,
    image_size: int | Sequence[int] | None = None,
    in_channels: int | None = None,
    pretrained: bool = False,
):
    """`timm.create_model` for `timm/NAME[.TAG]`: `num_classes` outputs (timm's default, the
    pretrained head's, when None), `in_channels` input channels, and for the models whose
    layers depend on the image size (ViTs' position embeddings) `image_size`."""
    timm = import_timm()
    name = require_timm_name(spec)
    kwargs: dict[str, Any] = {}
    if num_classes is not None:
        kwargs["num_classes"] = num_classes
    if in_channels is not None:
        kwargs["in_chans"] = in_channels
    size = size_pair(image_size)
    if size is not None:
        kwargs["img_size"] = size[0] if size[0] == size[1] else size
    try:
        try:
            model = timm.create_model(name, pretrained=pretrained, **kwargs)
        except TypeError as error:
            # Most convolutional networks take any size and have no `img_size` argument.
            if "img_size" not in str(error):
                raise
            del kwargs["img_size"]
            model = timm.create_model(name, pretrained=pretrained, **kwargs)
    except (ValueError, AssertionError) as error:
        if size is None:
            raise
        raise UsageError(
            f"cannot build {spec} for {size[0]}x{size[1]} images: {first_line(error)}",
            "choose another --image-size",
        ) from error
    if size is not None:  # timm builds some for sizes they cannot run at (CoAtNet at 48 px)
        channels = in_channels or int(getattr(model, "in_chans", 3))
        refuse_unrunnable_size(
            model, spec, size, channels, functools.partial(_built_on_meta, name, kwargs)
        )
    return model


def _check_size_before_download(
    spec: str, image_size: int | Sequence[int] | None, in_channels: int | None
) -> None:
    """`create_timm_model`'s size refusals (a size timm cannot build the model for, or builds
    it for but it cannot run at), judged on a build on the meta device without weights nor
    random initialisation: no memory, no download. Nothing to judge without an --image-size."""
    if size_pair(image_size) is None:
        return
    import torch

    with torch.device("meta"), skipped_weight_init():
        create_timm_model(spec, image_size=image_size, in_channels=in_channels)


def _built_on_meta(name: str, kwargs: dict[str, Any], side: int):
    """timm's `name` built as `kwargs` say for `side` px images, on the meta device (no memory),
    without pretrained weights, and without torch's random initialisers: a meta tensor holds no
    values, and on it they run torch's Python references (about half of a CoAtNet's build)."""
    import timm
    import torch

    with torch.device("meta"), skipped_weight_init():
        return timm.create_model(name, pretrained=False, **{**kwargs, "img_size": side})


def built_timm_model(
    spec: str,
    loaded: bool,
    *,
    num_classes: int | None = None,
    image_size: int | Sequence[int] | None = None,
    in_channels: int | None = None,
):
    """`create_timm_model`, without the random init a strict load overwrites right after
    (`loaded`: built_for_loading). timm is imported first, so that its own truncated normal,
    most of a ViT's or ConvNeXt's build, is skipped too."""
    import_timm()
    return built_for_loading(
        lambda: create_timm_model(
            spec, num_classes=num_classes, image_size=image_size, in_channels=in_channels
        ),
        loaded,
    )


def timm_pretrained(
    spec: str,
    weights: str,
    *,
    image_size: int | Sequence[int] | None = None,
    in_channels: int | None = None,
):
    """timm's pretrained `spec` for `--weights DEFAULT` (the spec's tag, else timm's default
    one) or `--weights TAG`, with the head the weights have. Downloads go through the Hugging
    Face cache; anything a library prints goes to stderr, so that stdout carries only a
    command's result."""
    name = require_timm_name(spec)
    arch, _, spec_tag = name.partition(".")
    if weights != DEFAULT_WEIGHTS:
        if spec_tag and weights != spec_tag:
            raise UsageError(
                f"--weights {weights} contradicts the tag of {spec}",
                f"use --weights {DEFAULT_WEIGHTS} for the tag {spec_tag}",
            )
        if f"{arch}.{weights}" not in _pretrained_tags(arch):
            raise UsageError(
                f"unknown weights {weights!r} for {base_name(spec)}",
                f"timm has: {DEFAULT_WEIGHTS}, {_tag_list(arch)}; or pass --weights PATH",
            )
        name = f"{arch}.{weights}"
    if not _has_weights(name):
        raise UsageError(
            f"timm has no pretrained weights for {TIMM_PREFIX}{name}",
            "drop --weights to train it from random weights, or pass --weights PATH",
        )
    # The size is judged before any download: a size the model cannot be built for or run at
    # was refused only once its weights had been fetched (or, offline, not at all).
    _check_size_before_download(TIMM_PREFIX + name, image_size, in_channels)
    url = _torch_hub_url(name)
    if url is not None:  # not on the Hugging Face Hub: torch.hub's cache, checked first
        require_downloadable(url, f"the pretrained weights of {TIMM_PREFIX}{name}")
    try:
        try:
            with contextlib.redirect_stdout(sys.stderr), _cache_only_when_the_hub_is_unreachable():
                return create_timm_model(
                    TIMM_PREFIX + name,
                    image_size=image_size,
                    in_channels=in_channels,
                    pretrained=True,
                )
        except Exception:  # a cached file that fails to load: damaged, or the error below
            if url is not None:
                refuse_damaged_cached_file(url, f"the pretrained weights of {TIMM_PREFIX}{name}")
            raise
    except (OSError, ConnectionError, TimeoutError) as error:
        what = f"the pretrained weights of {TIMM_PREFIX}{name}"
        if url is not None and isinstance(error, urllib.error.HTTPError):
            raise http_status_error(error, url, what) from error  # the server answered
        answer = _hub_answer(error)
        if answer is not None:  # the Hub answered, with an error status: online already
            status, address = answer
            if status in NOT_THERE_STATUSES:
                raise InputError(
                    f"cannot download {what}: the Hub has no file at {address} (HTTP {status})",
                    "pass --weights PATH to a local file",
                ) from error
            raise OfflineError(
                f"cannot download {what}: the Hub refused {address} (HTTP {status})",
                "try again later, or pass --weights PATH to a local file",
            ) from error
        # Where they would be cached: HF_HOME, HF_HUB_CACHE or XDG_CACHE_HOME move it.
        cache = hf_hub_cache_dir() if url is None else hub_checkpoints_dir()
        raise OfflineError(
            f"cannot download {what}: " + _download_failure(error),
            f"connect to the internet once so they are cached in {cache}, or "
            "pass --weights PATH to a local file",
        ) from error


def _torch_hub_url(name: str) -> str | None:
    """The URL timm downloads the weights of `NAME.TAG` from through torch.hub (and its
    cache), as timm chooses: weights not on the Hugging Face Hub (or without huggingface_hub);
    None for the Hub's, or weights in a file."""
    import importlib.util

    from timm.models import get_pretrained_cfg

    config = get_pretrained_cfg(name)
    if config is None or config.file or config.state_dict or config.source == "local-dir":
        return None
    if config.hf_hub_id and importlib.util.find_spec("huggingface_hub") is not None:
        return None
    return config.url or None


@dataclass(frozen=True)
class ConfigSizes:
    """The input sizes (H, W) a timm model's pretrained config names: `train` its `input_size`,
    `test` its `test_input_size` where it has one other than the train size (resnet50.a1_in1k:
    224 and 288), and `fixed` its `fixed_input_size` (a ViT, built for one size)."""

    train: tuple[int, int]
    test: tuple[int, int] | None
    fixed: bool

    @property
    def test_runs(self) -> bool:
        """The test size is one the model, built without a size, runs at: there is one and the
        model is not built for its train size alone."""
        return self.test is not None and not self.fixed


def timm_config_sizes(model) -> ConfigSizes | None:
    """`ConfigSizes` of the pretrained config timm attaches to `model` (its tag's, or the
    default tag's for a model built without weights); None without an input size."""
    config = getattr(model, "pretrained_cfg", None) or {}
    train = _config_size(config.get("input_size"))
    if train is None:
        return None
    test = _config_size(config.get("test_input_size"))
    return ConfigSizes(
        train=train,
        test=test if test != train else None,
        fixed=bool(config.get("fixed_input_size")),
    )


def _config_size(value: Any) -> tuple[int, int] | None:
    """(H, W) of a config's (C, H, W) size; None when it has none."""
    if not value or len(value) != 3:
        return None
    return (int(value[1]), int(value[2]))


def timm_preprocess(
    model,
    *,
    image_size: int | Sequence[int] | None = None,
    in_channels: int | None = None,
    test_size: bool = False,
) -> Preprocess:
    """The eval preprocessing of the model's `pretrained_cfg` (timm's `resolve_data_config`):
    input size, resize to size / crop_pct, mean, std, interpolation, crop mode (center, squash
    or border); `image_size` replaces the input size (the crop ratio is kept). `test_size`
    takes the config's test input size and crop ratio where it has them (`test_input_size`,
    `test_crop_pct`: resnet50.a1_in1k is trained at 224 and tested at 288, uncropped), as
    timm's validate.py, inference.py and benchmark.py do by default for any model."""
    from timm.data import resolve_data_config

    config = resolve_data_config({}, model=model, use_test_size=test_size)
    return _preprocess_of(config, image_size, in_channels)


def _preprocess_of(
    config: dict[str, Any],
    image_size: int | Sequence[int] | None = None,
    in_channels: int | None = None,
) -> Preprocess:
    """`Preprocess` of a data config `resolve_data_config` gives (see `timm_preprocess`)."""
    size = size_pair(image_size)
    side = size[0] if size is not None else int(config["input_size"][1])
    channels = in_channels or int(config["input_size"][0])
    mean, std = tuple(config["mean"]), tuple(config["std"])
    if len(mean) != channels:  # a grayscale or multispectral stem: the RGB average per channel
        mean = (sum(mean) / len(mean),) * channels
        std = (sum(std) / len(std),) * channels
    interpolation = str(config.get("interpolation") or "bilinear")
    crop_pct = float(config.get("crop_pct") or 1.0)
    return Preprocess(
        image_size=side,
        resize_size=int(math.floor(side / crop_pct)),  # timm's own eval transform
        mean=tuple(float(v) for v in mean),
        std=tuple(float(v) for v in std),
        in_channels=channels,
        interpolation=interpolation if interpolation in INTERPOLATIONS else "bilinear",
        crop_mode=_crop_mode(config.get("crop_mode")),
    )


def timm_weights_preprocess(spec: str, weights: str | None = None) -> Preprocess | None:
    """The eval preprocessing of the pretrained config of `timm/NAME[.TAG]` with `--weights
    TAG` (another value or none: the spec's tag, else timm's default one) at its train size
    (`input_size`, `crop_pct`): what the weights were trained on, and what train trains and
    validates that model on, with or without them, as timm's train.py does. Never the test
    size that `timm_preprocess(..., test_size=True)` gives the pretrained weights themselves
    (resnet50.a1_in1k: 224 px crops of 235 px images here, 288 px uncropped there). Read from
    timm's registry: no model built, nothing downloaded. None where timm registers no
    config."""
    from timm.data import resolve_data_config
    from timm.models import get_pretrained_cfg

    config = get_pretrained_cfg(_tag_name(spec, weights))
    if config is None:
        return None
    return _preprocess_of(resolve_data_config({}, pretrained_cfg=config.to_dict()))


def _tag_name(spec: str, weights: str | None) -> str:
    """`NAME.TAG` of the pretrained config of `timm/NAME[.TAG]` with `--weights TAG`: the
    spec's tag, else the TAG, else `NAME` (timm's default tag)."""
    name = require_timm_name(spec)
    arch, _, tag = name.partition(".")
    if weights and not tag and f"{arch}.{weights}" in _pretrained_tags(arch):
        name = f"{arch}.{weights}"
    return name


def _crop_mode(value: Any) -> str:
    """timm's crop_mode as torchkit records it: `center` when unset or one torchkit lacks."""
    mode = str(value or "center")
    return mode if mode in CROP_MODES else "center"


def timm_sample_shape(preprocess: Preprocess, image_size: int | Sequence[int] | None):
    """One sample's (C, H, W): `image_size` when given (H and W may differ), else the
    preprocessing's square size."""
    size = size_pair(image_size) or (preprocess.image_size, preprocess.image_size)
    return (preprocess.in_channels, *size)


def imagenet_classes(model) -> list[str] | None:
    """The class names of a pretrained timm head, when they are ImageNet's (timm ships them):
    the first name of each synset, as torchvision's categories (`tench`, `goldfish`...)."""
    from timm.data import infer_imagenet_subset

    subset = infer_imagenet_subset(model)
    if subset is None:
        return None
    names = imagenet_subset_names(subset)
    outputs = getattr(model, "num_classes", None)
    return names if outputs == len(names) else None


def imagenet_subset_names(subset: str) -> list[str]:
    """The first name of each class timm describes for its ImageNet `subset` (`tench` of
    `tench, Tinca tinca`; `crane` for the bird and the machine alike), in the subset's order:
    every name torchkit gives ImageNet classes of a timm model is one of these."""
    from timm.data import ImageNetInfo

    return [d.split(",")[0].strip() for d in ImageNetInfo(subset).label_descriptions()]


def _pretrained_tags(arch: str) -> list[str]:
    """`arch.tag` for every tag timm registers for `arch` (with or without weights)."""
    from timm.models import get_arch_pretrained_cfgs

    return list(get_arch_pretrained_cfgs(arch))


def _has_weights(name: str) -> bool:
    from timm.models import get_pretrained_cfg

    config = get_pretrained_cfg(name)
    return config is not None and bool(config.hf_hub_id or config.url or config.file)


def _tag_list(arch: str, *, with_random: bool = False) -> str:
    tags = [
        tag.partition(".")[2] for tag in _pretrained_tags(arch) if with_random or _has_weights(tag)
    ]
    return ", ".join(tags) if tags else "none"


# How long the one probe of the Hub waits for an answer before taking it for unreachable.
HUB_PROBE_TIMEOUT_S = 5.0


@contextlib.contextmanager
def _cache_only_when_the_hub_is_unreachable() -> Iterator[None]:
    """Hugging Face's client retries a refused connection with back-off, about 23 s per file
    (49 s for timm's two files) before it looks in its cache: one probe of the Hub first, with
    a short timeout, and offline mode (the cache only, at once) while the weights are loaded
    if it gets no answer."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or _hub_answers(constants.ENDPOINT):
        yield
        return
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = False


def _hub_answers(endpoint: str) -> bool:
    """Whether the Hub answers at all (any HTTP status), through its client's own session
    (proxies and certificates as configured), without retries."""
    from huggingface_hub import get_session

    try:
        get_session().head(endpoint, timeout=HUB_PROBE_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - whatever the transport raises: no answer
        return False
    return True


def hf_hub_cache_dir() -> str:
    """The folder the Hugging Face Hub's client caches downloads in (`HF_HUB_CACHE`, else
    `HF_HOME/hub`, else under `XDG_CACHE_HOME` or `~/.cache/huggingface`), as it reads them."""
    try:
        from huggingface_hub import constants
    except ImportError:
        return os.path.join(os.path.expanduser("~"), ".cache", "huggingface", "hub")
    return os.path.abspath(os.path.expanduser(constants.HF_HUB_CACHE))


def _hub_answer(error: BaseException) -> tuple[int, str] | None:
    """(HTTP status, URL) of the error answer the Hub gave behind `error` (huggingface_hub's
    HfHubHTTPError, raised as it is or behind its LocalEntryNotFoundError, which it also raises
    for a Hub it cannot reach); None where the Hub gave no answer."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        try:
            response = getattr(cause, "response", None)
        except Exception:  # noqa: BLE001 - httpx raises where an error has no response
            response = None
        status = getattr(response, "status_code", None)
        if isinstance(status, int) and status >= 400:
            return status, str(getattr(response, "url", "") or "") or "the Hub"
        cause = cause.__cause__ or cause.__context__
    return None


def _download_failure(error: BaseException) -> str:
    """Why the weights could not be had, in a few words (the Hub's messages run long)."""
    if isinstance(error, FileNotFoundError):  # huggingface_hub's LocalEntryNotFoundError
        return "they are not in the cache and the Hub cannot be reached"
    return first_line(error)


def size_pair(image_size: int | Sequence[int] | None) -> tuple[int, int] | None:
    """(H, W) of an `--image-size` given as N, (N,) or (H, W); None when not given."""
    if image_size is None:
        return None
    if isinstance(image_size, int):
        return (image_size, image_size)
    size = tuple(int(n) for n in image_size)
    return (size[0], size[0]) if len(size) == 1 else (size[0], size[1])
