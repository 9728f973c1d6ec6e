"""A model as a command names it, and the one function that resolves it.

`ModelSpec` holds what the command line says about the model: MODEL (a name or a model file),
`--weights`, `--trust-checkpoint`, the head (`--num-classes`, `--classes`), `--ema`, and the
preprocessing options on top of what the model comes with (`--image-size`, `--resize-size`,
`--mean`, `--std`). `resolve_spec` turns it into a model through the one model resolver
(`resolve_model`) and applies those options, so every command gives one spec one meaning.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from torchkit.core.data.preprocessing import Preprocess
from torchkit.core.io.errors import UsageError
from torchkit.core.models.resolver import ResolvedModel, resolve_model
from torchkit.core.models.specs import is_model_file

log = logging.getLogger("torchkit")


@dataclass
class ModelSpec:
    """The model as the user named it on the command line."""

    model: str | None = None  # MODEL: a model name or a model file
    # eval's --model: the architecture of a weights file given as MODEL (`FILE --model NAME`,
    # the older spelling of `NAME --weights FILE`), or the model when MODEL is left out.
    arch: str | None = None
    weights: str | None = None
    trust_checkpoint: bool = False
    num_classes: int | None = None
    classes: list[str] | None = None
    ema: bool = False
    allow_untrained: bool = False  # run a model whose weights are random
    # What the random numbers of the build of a model whose outputs a command reports (or
    # whose weights export writes) are drawn from (random weights, a random buffer no file
    # holds): the same outputs, the same file, in every run (a pipeline check compares them).
    # extract-features' --seed; 0 elsewhere.
    build_seed: int = 0
    # Preprocessing on top of the model's own (and the size a model built here is made for).
    image_size: int | None = None
    # The C of --image-size C,N,N: refused unless it is the model's input channels.
    image_channels: int | None = None
    resize_size: int | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    stats: str | None = None  # the --stats file mean and std were read from, for their errors
    crop_mode: str | None = None
    interpolation: str | None = None
    # One sample's input (C, H, W) that sizes a model built here (convnet, ViT, timm models):
    # summary's and benchmark's --input-size.
    sample_shape: tuple[int, ...] | None = None

    def named(self) -> tuple[str, str | None]:
        """(MODEL, --weights) as the resolver takes them: `FILE --model NAME` is
        `NAME --weights FILE`, and without MODEL, --model names the model."""
        model, arch, weights = self.model, self.arch, self.weights
        if model is None:
            if arch is None:  # only eval lets MODEL be left out (for --model)
                raise UsageError(
                    "nothing to evaluate",
                    "give a MODEL: a checkpoint, or a model NAME with --weights DEFAULT|FILE",
                )
            return arch, weights
        if arch is None:
            return model, weights
        if not is_model_file(model):  # a model name given as MODEL
            if arch != model:
                raise UsageError(f"MODEL {model} contradicts --model {arch}", "drop --model")
            return model, weights
        refuse_weights_with_file(model, weights)
        return arch, model


def refuse_weights_with_file(model: str, weights: str | None) -> None:
    """eval's and predict's words for a model file given with --weights (other commands leave
    it to the resolver, which says it its own way)."""
    if weights is not None and is_model_file(model):
        raise UsageError(
            "give either a model file or --weights, not both",
            "--weights goes with a model name: NAME --weights DEFAULT or NAME --weights FILE",
        )


def resolve_spec(
    spec: ModelSpec,
    *,
    command: str,
    exported: str = "refuse",
    new_head: bool = False,
    predicting: bool = False,
    needs_training: bool = False,
    seeded: bool = False,
    every_pickled_module: bool = False,
    timm_test_size: bool = False,
) -> ResolvedModel:
    """The model `spec` names, through the one model resolver, with the preprocessing it comes
    with changed by `--image-size/--resize-size/--mean/--std/--crop-mode/--interpolation`.

    `exported` and `new_head` are `resolve_model`'s. `predicting`: the command reports the
    model's predictions (eval, predict), so random weights are refused unless
    `spec.allow_untrained`, and preprocessing the model file records that no image could go
    through is an error before any image is read. `needs_training`: the command's output means
    nothing with random weights either (extract-features): refused the same way, and its images
    go through the model's preprocessing, checked the same way. For both, the build's random
    numbers (the random weights `spec.allow_untrained` lets through) are drawn from
    `spec.build_seed`; with `seeded` too, without the refusal (export: the file keeps the
    random weights, and two runs write the same file). `every_pickled_module` and
    `timm_test_size` (benchmark) are `resolve_model`'s.
    """
    from torchkit.core.data.preprocessing import apply_overrides

    model, weights = spec.named()
    if predicting:
        refuse_weights_with_file(model, weights)
    image_size, in_channels = spec.image_size, None
    if spec.sample_shape is not None and len(spec.sample_shape) == 3:
        in_channels, image_size = spec.sample_shape[0], tuple(spec.sample_shape[1:])
    with _drawn_from(spec.build_seed if predicting or needs_training or seeded else None):
        resolved = resolve_model(
            model,
            weights=weights,
            num_classes=spec.num_classes,
            classes=spec.classes,
            trust_checkpoint=spec.trust_checkpoint,
            image_size=image_size,
            in_channels=in_channels,
            new_head=new_head,
            ema=spec.ema,
            exported=exported,
            command=command,
            require_trained=(predicting or needs_training) and not spec.allow_untrained,
            every_pickled_module=every_pickled_module,
            timm_test_size=timm_test_size,
        )
    if resolved.preprocess is not None:
        _check_image_channels(spec, resolved)
        resolved.preprocess = apply_overrides(
            resolved.preprocess,
            image_size=spec.image_size,
            resize_size=spec.resize_size,
            mean=spec.mean,
            std=spec.std,
            crop_mode=spec.crop_mode,
            interpolation=spec.interpolation,
            stats=spec.stats,
        )
    # a file torch exported without torchkit: say what its images are fed as
    exported_bare = (
        resolved.exported_format is not None and resolved.preprocess_source == "defaults"
    )
    if (predicting or needs_training) and exported_bare:
        log.warning(assumed_preprocess(model, resolved.preprocess))
    if predicting or needs_training:
        # The options were checked above: what is still unusable came with the model (a std of
        # 0 would make every image "unreadable", a mean too long a shape error mid-output).
        from_weights = weights is not None and resolved.preprocess_source == "checkpoint"
        resolved.preprocess.check(weights if from_weights else model)
    return resolved


@contextlib.contextmanager
def _drawn_from(seed: int | None) -> Iterator[None]:
    """With a seed, torch's random numbers (what a model's random weights are drawn from) start
    from it, and the caller's random state is put back afterwards. `torch.manual_seed` seeds
    every device: a `package.module:build` factory that makes its model on the GPU draws from
    the seed too. The CUDA generators are put back where CUDA has started; where it has not,
    it is not started here (seconds, on a run meant for the CPU) and its seed waits for it:
    torch keeps the last seed given before the start, so the caller's (or none) is put back
    in its place unless the build started CUDA."""
    if seed is None:
        yield
        return
    import torch

    started = torch.cuda.is_initialized()
    gpus = list(range(torch.cuda.device_count())) if started else []
    waiting = getattr(torch.cuda, "_lazy_seed_tracker", None)  # the seeds kept for the start
    callers = None if started or waiting is None else dict(vars(waiting))
    with torch.random.fork_rng(devices=gpus, device_type="cuda"):
        torch.manual_seed(seed)
        try:
            yield
        finally:
            if callers is not None and not torch.cuda.is_initialized():
                vars(waiting).update(callers)


def _check_image_channels(spec: ModelSpec, resolved: ResolvedModel) -> None:
    """Refuse --image-size C,N,N whose C is not the channels of the images the model takes (and
    is fed): train's check, with the model's channels in place of RGB."""
    from torchkit.core.input_size import check_image_channels

    if spec.image_channels is None or spec.image_size is None:
        return
    side = spec.image_size
    try:
        check_image_channels(
            f"{spec.image_channels},{side},{side}",
            resolved.preprocess.in_channels,
            f"{resolved.arch} takes",
        )
    except ValueError as error:
        raise UsageError(f"--image-size {error}") from None


def assumed_preprocess(model: str, preprocess: Preprocess) -> str:
    """The warning for an exported file that records no preprocessing (torch exported it
    without torchkit): the images go through what is said here, which its training may not
    have used, and the scores with them."""

    def listed(values: tuple[float, ...]) -> str:
        return " ".join(f"{value:g}" for value in values)

    size = preprocess.image_size
    return (
        f"{Path(model).name} records no preprocessing (torchkit export did not write it): "
        f"assuming images resized to {preprocess.resize_size}, {preprocess.crop_mode} crop "
        f"{size}x{size}, mean {listed(preprocess.mean)}, std {listed(preprocess.std)}; "
        "--resize-size, --crop-mode, --mean and --std set what it was trained with"
    )
