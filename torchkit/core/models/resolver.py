"""`resolve_model`: the one way every command turns MODEL [--weights W] into a model.

A spec is a torchvision name, `convnet`, `package.module:Callable`, a timm model `timm/NAME`
(the optional extra), or a model file (a torchkit checkpoint, or a pickled module under
`trust_checkpoint`). `--weights` goes with a name: torchvision's `DEFAULT`/`IMAGENET1K_V1`...,
timm's `DEFAULT` or a timm pretrained tag, or a file (torchkit checkpoint, state dict with or
without `module.`/`_orig_mod.`, `.safetensors`) whose classifier sizes the head.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from torchkit.core.data.preprocessing import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    Preprocess,
    resize_for_crop,
)
from torchkit.core.io.errors import CheckpointError, UsageError
from torchkit.core.io.files import require_input
from torchkit.core.io.shell_words import shell_word
from torchkit.core.models.builders import (
    BUILTIN_MODELS,
    IMAGE_SIZE_KWARGS,
    TRANSFORM_INPUT_MEAN_STD,
    TRANSFORM_INPUT_MODELS,
    build_model,
    is_callable_spec,
    is_checkpoint_path,
    is_timm_spec,
    is_torchvision_transform_input_file,
    model_from_checkpoint,
    require_torchvision_name,
    torchvision_pretrained,
    torchvision_random,
    torchvision_weights_enum,
)
from torchkit.core.models.exported.formats import ONNX, TORCHSCRIPT, sniff_format
from torchkit.core.models.exported.loading import load_exported
from torchkit.core.models.heads import (
    class_layers,
    find_head,
    in_features,
    out_features,
    refuse_unholdable_head,
    replace_head,
)
from torchkit.core.models.lazy import has_lazy_weights, materialize_lazy_layers
from torchkit.core.models.size_bound import size_adapted, size_layout
from torchkit.core.models.specs import is_model_file
from torchkit.core.models.stored_classes import stored_class_names
from torchkit.core.models.timm_models import (
    base_name,
    built_timm_model,
    imagenet_classes,
    size_pair,
    timm_config_sizes,
    timm_preprocess,
    timm_pretrained,
    timm_sample_shape,
)
from torchkit.core.models.transform_input import preprocess_as_trained
from torchkit.core.models.usercode import call_model_factory, in_float32
from torchkit.core.models.weights import (
    holds_weights_only,
    load_weights_file,
    pickled_module,
    pickled_modules,
    read_model_file,
    weights_only_error,
)

log = logging.getLogger("torchkit")

DEFAULT_IMAGE_SIZE = 224
CONVNET_IMAGE_SIZE = 28  # the built-in `convnet` is MNIST-sized


@dataclass
class ResolvedModel:
    """A model ready to use, with what is known about it."""

    model: Any
    arch: str
    source: str  # torchvision | timm | built-in | callable | torchkit checkpoint | pickled model
    classes: list[str] | None = None
    preprocess: Preprocess | None = None
    preprocess_source: str = "defaults"  # checkpoint | torchvision | timm | defaults
    sample_shape: tuple[int, ...] | None = None  # one sample's input (C, H, W), when known
    image_model: bool = True  # True when the model takes N,C,H,W images
    checkpoint: Mapping[str, Any] | None = None  # the torchkit checkpoint it came from
    spec: str = ""
    weights: str | None = None
    # What the weights came from: torchkit checkpoint | state dict | torchvision weights |
    # timm weights | pickled model | exported (FORMAT); None for random weights.
    weights_source: str | None = None
    exported_format: str | None = None  # onnx | torchscript | exported-program
    exported_batch_size: int | None = None  # an exported file's fixed batch (--static-batch)
    # Outputs when the model has no classifier layer to read them from (an exported file).
    known_outputs: int | None = None
    exported_data: Mapping[str, Any] | None = None  # an exported file's training data record
    # Which of the two sizes of a timm model's pretrained config (`test` or `train`) the sample
    # is, where the config has a test size beside the train size and neither an image size nor
    # a weights file sized the model: what benchmark says it timed (resolve_model's
    # timm_test_size). None otherwise.
    timm_size: str | None = None
    # Every module of a pickled dict by key (`{'model': net, 'model_ema': ema}`, `model` the
    # first): what convert-syncbn lists and converts, without unpickling the file again.
    pickled_modules: Mapping[Any, Any] | None = None
    # The whole unpickled file, kept beside them: where convert-syncbn looks for the layers its
    # conversion cannot reach (in a set, a plain object), which converting refuses.
    pickled_file: Any = None
    # (its classifier layers' names, their outputs, the new outputs) where `num_classes` put a
    # new head in place of the weights' (`new_head`): the model is no longer the weights'.
    replaced_head: tuple[str, int, int] | None = None

    @property
    def data_record(self) -> Mapping[str, Any] | None:
        """The data its training run read and the split it held out (the checkpoint's `data`,
        or that of the checkpoint an exported file was made from)."""
        if self.checkpoint:
            return self.checkpoint.get("data")
        return self.exported_data

    @property
    def num_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    @property
    def num_outputs(self) -> int | None:
        """Outputs of the classifier layer; None for a model without one."""
        try:
            return out_features(find_head(self.model)[1])
        except UsageError:
            return self.known_outputs

    @property
    def details(self) -> dict[str, Any]:
        """The training facts a torchkit checkpoint records (epoch, step, best metric...)."""
        checkpoint = self.checkpoint or {}
        return {
            key: checkpoint[key]
            for key in ("epoch", "global_step", "best_metric", "torchkit_version")
            if isinstance(checkpoint.get(key), (int, float, str))
        }


def resolve_model(
    spec: str,
    *,
    weights: str | None = None,
    num_classes: int | None = None,
    classes: Sequence[str] | None = None,
    trust_checkpoint: bool = False,
    image_size: int | Sequence[int] | None = None,
    in_channels: int | None = None,
    new_head: bool = False,
    ema: bool = False,
    exported: str = "refuse",
    command: str = "this command",
    require_trained: bool = False,
    ahead: ReadAhead | None = None,
    every_pickled_module: bool = False,
    timm_test_size: bool = False,
) -> ResolvedModel:
    """Build or load the model `spec` names.

    `num_classes` (or `len(classes)`) sizes the head of a model built without weights; with
    weights the head is the one they have (a fine-tuned 2-class file gives 2 outputs).
    `image_size` (an int or H, W) and `in_channels` size the models whose layers depend on them
    (`convnet`, ViT, MaxViT) when they are built with random weights, and timm models however
    they are built. `trust_checkpoint` allows pickles in every file loaded (MODEL and
    `weights`).

    When weights fix the number of outputs and `num_classes` differs, `new_head` swaps in a
    fresh head of that size (fine-tuning, as `train` does); without it that is an error, since
    a command that uses the weights' predictions would otherwise score a random head. `ema`
    takes a torchkit checkpoint's EMA weights instead of the model's.

    A file `torchkit export` wrote (ONNX, TorchScript, torch.export) is taken as `exported`
    says: "runtime" (a module that runs it in its own runtime on the CPU: predict, eval),
    "module" (TorchScript as the ScriptModule it holds, others refused: summary, benchmark),
    or "refuse" (one error that names `command`). TorchScript and torch.export run code from
    the file, so they need `trust_checkpoint`, as do pickles and the `package.module:Callable` a
    checkpoint names. `require_trained` refuses a model whose weights are random (no weights
    file, no pretrained weights): predict, eval and extract-features. `ahead`: the model file
    (MODEL, or `weights`) as the caller already read it, not read again.
    `every_pickled_module`: a pickled dict's modules are kept by key in `pickled_modules`
    (convert-syncbn lists and converts each); else only the first is kept.
    `timm_test_size`: a timm model takes its pretrained config's test size (`test_input_size`)
    without timm's weights too, as timm's benchmark.py does (benchmark), unless `image_size` is
    given, a weights file records the size, or the model is built for one size
    (`fixed_input_size`); timm's own weights always take it, as timm's validate.py does, and
    a model without them takes the train size otherwise (train fine-tunes at it).
    A torchkit checkpoint as MODEL whose model is built for another size than `image_size` (a
    ViT, a MaxViT, a timm model built with an img_size) is rebuilt for it, the weights that
    follow the size adapted (a ViT's position embeddings resampled: a Note says what), as for
    `NAME --weights FILE`; train fine-tunes it so.
    """
    if exported not in EXPORTED_USES:
        raise ValueError(f"exported must be one of {EXPORTED_USES}, not {exported!r}")
    weights = weights or None
    # The options that asked for the head's width, as a refusal names them (export and summary
    # take no --classes, predict no --num-classes).
    asked_by = [o for o, given in (("--num-classes", num_classes), ("--classes", classes)) if given]
    if classes and num_classes is None:
        num_classes = len(classes)
    if num_classes is not None:
        refuse_unholdable_head(
            num_classes, lambda: _head_inputs(spec, image_size=image_size, in_channels=in_channels)
        )
    if is_model_file(spec):
        if weights is not None:
            raise UsageError(
                "--weights goes with a model name; MODEL is already a checkpoint file",
                "drop --weights, or name the architecture as MODEL",
            )
        fmt = exported_format_of(spec)
        if fmt is not None:
            if ema:
                raise UsageError(
                    f"--ema needs a torchkit checkpoint; {spec} is not one", "drop --ema"
                )
            resolved = _from_exported(
                spec,
                fmt,
                trust_checkpoint=trust_checkpoint,
                use=exported,
                command=command,
                size=size_pair(image_size),
                channels=in_channels,
                require_trained=require_trained,
            )
        else:
            resolved = _from_file(
                spec,
                trust_checkpoint=trust_checkpoint,
                ema=ema,
                command=command,
                loaded=ahead.content_if_read(spec, trust_checkpoint) if ahead else None,
                every_pickled_module=every_pickled_module,
                image_size=image_size,
            )
    else:
        # The head follows the weights when there are any; num_classes is applied below.
        build_classes = num_classes if weights is None else None
        # Read once: what sizes the model (convnet, ViT, timm) is what is then loaded into it.
        if ahead is None or not ahead.reads(weights, trust_checkpoint):
            ahead = ReadAhead(weights, trust_checkpoint) if weights is not None else None
        if is_callable_spec(spec):
            if weights is not None and image_size is None and _records_arch(ahead, spec):
                image_size = _weights_input(ahead)[0]  # a factory that takes it: as trained
            resolved = _from_callable(spec, build_classes, image_size)
        elif spec in BUILTIN_MODELS:
            if weights is not None and (image_size is None or in_channels is None):
                # convnet's classifier is sized for its input: build it as the file's was
                recorded_size, recorded_channels = _weights_input(ahead)
                image_size = image_size or recorded_size
                in_channels = in_channels or recorded_channels
            resolved = _from_convnet(
                spec, build_classes, image_size, in_channels, weights_follow=weights is not None
            )
        elif is_timm_spec(spec):
            resolved = _from_timm(
                spec,
                build_classes,
                weights,
                image_size,
                in_channels,
                ahead,
                test_size=timm_test_size,
            )
        else:
            resolved = _from_torchvision(spec, build_classes, weights, image_size, ahead)
        if resolved.source == "callable":  # before a head, weights or optimizer use them
            _size_lazy_layers(resolved, image_size, in_channels, ahead)
        if weights is not None and resolved.weights_source is None:
            _load_file_weights(
                resolved,
                weights,
                trust_checkpoint,
                ema=ema,
                command=command,
                loaded=ahead.content_if_read(weights, trust_checkpoint) if ahead else None,
            )
        elif ema:
            raise UsageError("--ema needs a torchkit checkpoint", "drop --ema")
    if require_trained and resolved.weights_source is None:
        raise untrained_error(spec, resolved.source)
    _apply_num_classes(resolved, num_classes, new_head, asked_by)
    if classes:
        _refuse_moved_classes(resolved, classes, weights or spec)
        resolved.classes = [str(c) for c in classes]
    resolved.spec, resolved.weights = spec, weights
    return resolved


EXPORTED_USES = ("refuse", "runtime", "module")
EXPORTED_TITLES = {
    "onnx": "an ONNX model",
    "torchscript": "a TorchScript archive",
    "exported-program": "a torch.export archive",
}


def exported_format_of(path: str) -> str | None:
    """onnx, torchscript or exported-program for a file `torchkit export` writes; else None."""
    return sniff_format(path)


def untrained_error(spec: str, source: str) -> UsageError:
    """A model whose weights no file or library gave: its answers would be noise."""
    if source == "callable":
        return UsageError(
            f"{spec} is built by your code with no --weights file, so torchkit cannot tell "
            "whether its weights are trained",
            f"pass --weights FILE, or --allow-untrained if {spec} loads trained weights itself",
        )
    weights = _weights_to_give(spec if source == "built-in" else None)
    return UsageError(
        f"{spec} has random weights (no --weights given): its answers would be noise",
        f"pass a checkpoint as MODEL or --weights {weights}; --allow-untrained to run it anyway",
    )


def _weights_to_give(arch: str | None) -> str:
    """What --weights takes for `arch`: DEFAULT names torchvision's and timm's weights, and the
    built-in convnet has none to load."""
    return "FILE" if arch in BUILTIN_MODELS else "DEFAULT|FILE"


# Why random weights do no harm to what each command that takes them makes (the note it gives).
UNTRAINED_FINE = {
    "summary": "fine for a summary (shapes and counts do not depend on them)",
    "benchmark": "fine for a benchmark (speeds do not depend on them)",
    "export": "the file holds them too: fine for trying a runtime, not for predictions",
}


def has_random_weights(resolved: ResolvedModel) -> bool:
    """Weights no file or library gave, for sure (a model built by code may load its own)."""
    return resolved.weights_source is None and resolved.source != "callable"


def replaced_head_warning(resolved: ResolvedModel) -> str | None:
    """What a command whose figures describe the model (summary, benchmark) says where
    `--num-classes` replaced the head the weights have (`replaced_head`); None where it did not:
    the figures are no longer those of the model the weights describe."""
    if resolved.replaced_head is None:
        return None
    names, old, new = resolved.replaced_head
    named = resolved.weights or resolved.spec
    if resolved.weights and not os.path.exists(resolved.weights):  # DEFAULT, a timm tag
        named = f"{resolved.spec}'s {resolved.weights} weights"
    return (
        f"--num-classes {new} replaced the head of {named} ({names}: {old:,} outputs) with a new, "
        f"randomly initialised one of {new:,} outputs: the figures are for that model, not for "
        "the one the weights describe (drop --num-classes for theirs)"
    )


def untrained_note(spec: str, command: str) -> str:
    """The note of a command whose output does not need trained weights (summary, benchmark,
    export) for a model `has_random_weights`; the commands that need them refuse it
    (`untrained_error`)."""
    return f"{spec} has random weights (no --weights given): {UNTRAINED_FINE[command]}"


def _from_exported(
    path: str,
    fmt: str,
    *,
    trust_checkpoint: bool,
    use: str,
    command: str,
    size: tuple[int, int] | None = None,
    channels: int | None = None,
    require_trained: bool = False,
) -> ResolvedModel:
    """A file `torchkit export` wrote, with the classes and preprocessing stored in it; `size`
    and `channels` asked for must be the ones it records. `require_trained` refuses a file
    exported from random weights, as the model it was exported from is refused."""
    title = EXPORTED_TITLES[fmt]
    if use == "refuse" or (use == "module" and fmt != TORCHSCRIPT):
        raise UsageError(
            f"{path} is {title}, which {command} cannot take",
            "give the torchkit checkpoint it was exported from",
        )
    if fmt != ONNX and not trust_checkpoint:
        hint = "pass --trust-checkpoint to load it, only if you trust where it came from"
        if use != "module":  # summary and benchmark refuse ONNX files: no alternative there
            hint += "; ONNX files need no trust"
        raise CheckpointError(f"{path} is {title}, whose code runs when it is loaded", hint)
    exported = load_exported(path, fmt)
    exported.refuse_other_size(size, channels)
    arch = exported.arch
    # torchkit records the weights' source, null for random ones (built by name, no --weights);
    # a model built by code may load its own, and a file torch wrote records nothing
    recorded = exported.metadata
    random = "weights" in recorded and recorded["weights"] is None
    if require_trained and random and arch is not None and not is_callable_spec(arch):
        raise UsageError(
            f"{path} holds random weights (exported from {arch} without --weights): its "
            "answers would be noise",
            f"export a trained checkpoint, or {arch} with --weights {_weights_to_give(arch)}; "
            "--allow-untrained to run it anyway",
        )
    shape = exported.input_shape
    preprocess = exported.preprocess
    if preprocess is None:  # not written by torchkit: ImageNet-style, sized from its input
        channels = shape[0] if shape else 3
        preprocess = plain_preprocess(channels, shape[-1] if shape else DEFAULT_IMAGE_SIZE)
    if use == "runtime":
        from torchkit.core.models.exported.classifier import ExportedClassifier

        model = ExportedClassifier(exported)
    else:
        model = exported.module
    classes = exported.classes
    return ResolvedModel(
        model,
        str(exported.arch or fmt),
        f"exported ({fmt})",
        classes=classes,
        preprocess=preprocess,
        preprocess_source="exported file" if exported.preprocess is not None else "defaults",
        sample_shape=shape,  # None when the file does not say (not written by torchkit)
        weights_source=f"exported ({fmt})",
        exported_format=fmt,
        exported_batch_size=exported.batch_size,
        known_outputs=len(classes) if classes else exported.num_outputs,
        exported_data=exported.data,
    )


def _apply_num_classes(
    resolved: ResolvedModel,
    num_classes: int | None,
    new_head: bool,
    asked_by: Sequence[str] = ("--num-classes", "--classes"),
) -> None:
    """Make the head `num_classes` wide: a fresh one under `new_head`, else refuse a mismatch
    with the weights (a random head would be scored as if it were trained), naming the options
    `asked_by` (`--num-classes`, `--classes`) that asked for it."""
    if num_classes is None:
        return
    outputs = resolved.num_outputs
    if outputs is None or outputs == num_classes:
        if resolved.classes is not None and len(resolved.classes) != num_classes:
            resolved.classes = None
        return
    if resolved.weights_source is not None and not new_head:
        options = list(asked_by) or ["--num-classes"]
        hint = f"drop {' and '.join(options)}"
        if options == ["--classes"]:
            hint += f", or give {outputs} class names, one per output of the weights"
        raise UsageError(
            f"{num_classes} classes asked for ({'/'.join(options)}), but the "
            f"{resolved.weights_source} has {outputs} outputs",
            hint,
        )
    refuse_unholdable_head(
        num_classes, lambda: [in_features(layer) for _, layer in class_layers(resolved.model)]
    )
    if resolved.weights_source is not None:
        names = ", ".join(name for name, _ in class_layers(resolved.model))
        resolved.replaced_head = (names, outputs, num_classes)
    replace_head(resolved.model, num_classes)
    resolved.classes = None  # the weights' class names belong to the old head


def _refuse_moved_classes(resolved: ResolvedModel, classes: Sequence[str], named_by: str) -> None:
    """UsageError when `--classes` puts a class the model's weights name (a torchkit checkpoint,
    an exported file, torchvision's weights) at another output: the outputs would be renamed
    silently and every image scored against the wrong class. New names (WordNet IDs for
    torchvision's `tench`, `goldfish`...) rename the outputs, as documented."""
    from torchkit.core.data.sources.samples import class_index, find_class, nfc

    names = resolved.classes
    if not names or len(names) != len(classes):
        return
    recorded = class_index(names)
    for output, name in enumerate(classes):
        found = find_class(recorded, str(name))
        # Compared at its own output first: a name the weights list twice (ImageNet's two
        # `crane`s) is found at its first place.
        if found is not None and found != output and nfc(names[output]) != nfc(str(name)):
            order = ", ".join(names[:10]) + (" ..." if len(names) > 10 else "")
            raise UsageError(
                f"--classes names {str(name)!r} as output {output}, but {named_by} names it "
                f"as output {found}",
                f"drop --classes to use the names the model records, in its order: {order}",
            )


def _head_inputs(
    spec: str, *, image_size: int | Sequence[int] | None, in_channels: int | None
) -> list[int] | None:
    """The input width of each classifier layer (`class_layers`) of the architecture `spec`
    names, built on the meta device (no memory, no weights); None for a model file, or a
    model not built so."""
    if is_model_file(spec):
        return None
    import torch

    try:
        with torch.device("meta"):
            if is_callable_spec(spec):
                built = _from_callable(spec, 2, image_size)
            elif spec in BUILTIN_MODELS:
                built = _from_convnet(spec, 2, image_size, in_channels)
            elif is_timm_spec(spec):
                built = _from_timm(spec, 2, None, image_size, in_channels, None)
            else:
                built = _from_torchvision(spec, 2, None, image_size)
        return [in_features(layer) for _, layer in class_layers(built.model)]
    except Exception:  # noqa: BLE001 - the real build says what is wrong with the spec
        return None


def _size(image_size: int | Sequence[int] | None, default: int) -> tuple[int, int]:
    return size_pair(image_size) or (default, default)


def _from_file(
    path: str,
    *,
    trust_checkpoint: bool,
    ema: bool,
    command: str | None = None,
    loaded: Any = None,
    every_pickled_module: bool = False,
    image_size: int | Sequence[int] | None = None,
) -> ResolvedModel:
    """A model file as MODEL: a torchkit checkpoint's model rebuilt (a ViT for `image_size`
    when that is not the size it records), or a pickled module."""
    from torchkit.core.models.checkpoint import is_torchkit_checkpoint

    if loaded is None:  # else what was read of it ahead (train's defaults)
        loaded = read_model_file(path, trust_checkpoint=trust_checkpoint)
    if is_torchkit_checkpoint(loaded):
        model = model_from_checkpoint(
            loaded,
            trust_checkpoint=trust_checkpoint,
            source=path,
            image_size=image_size,
            note_resampling=not ema,  # one note: that of the EMA weights, which are used
        )
        if ema:
            _load_ema(model, loaded, path)
        preprocess = preprocess_as_trained(loaded, path, command=command)
        side = preprocess.image_size
        sample = (preprocess.in_channels, side, side)
        wanted = size_pair(image_size)
        if wanted is not None and wanted != sample[1:] and size_layout(model):
            sample = (preprocess.in_channels, *wanted)  # rebuilt for image_size (a ViT...)
        return ResolvedModel(
            model,
            str(loaded["arch"]),
            "torchkit checkpoint",
            classes=_checkpoint_classes(loaded, path),
            preprocess=preprocess,
            preprocess_source="checkpoint" if loaded.get("preprocess") else "defaults",
            sample_shape=sample,
            checkpoint=loaded,
            weights_source="torchkit checkpoint",
        )
    if ema:
        raise UsageError(f"--ema needs a torchkit checkpoint; {path} is not one", "drop --ema")
    module = pickled_module(loaded)
    if module is not None:
        return ResolvedModel(
            in_float32(module),
            type(module).__name__,
            "pickled model",
            preprocess=plain_preprocess(stem_channels(module)),
            image_model=False,
            weights_source="pickled model",
            # Kept only for a caller that asks (convert-syncbn): the others would hold every
            # module of the dict (an EMA copy too) for the whole run.
            pickled_modules=pickled_modules(loaded) if every_pickled_module else None,
            pickled_file=loaded if every_pickled_module else None,
        )
    if holds_weights_only(loaded):
        raise weights_only_error(path)
    raise CheckpointError(
        f"{path} is neither a torchkit checkpoint nor a pickled model",
        "name the architecture as MODEL and pass the weights as --weights PATH",
    )


def _from_callable(
    spec: str, num_classes: int | None, image_size: int | Sequence[int] | None = None
) -> ResolvedModel:
    """`package.module:Callable`. Without num_classes the factory is called with no arguments,
    so models without a classifier head (feature extractors, two-input networks) work too; one
    that takes `image_size` gets the size asked for (a ViT's position embeddings follow it)."""
    model, _ = call_model_factory(spec, num_classes=num_classes, image_size=image_size)
    preprocess = plain_preprocess(stem_channels(model))
    return ResolvedModel(model, spec, "callable", preprocess=preprocess, image_model=False)


def _from_convnet(
    name: str,
    num_classes: int | None,
    image_size: int | Sequence[int] | None,
    in_channels: int | None,
    *,
    weights_follow: bool = False,
) -> ResolvedModel:
    height, side = _size(image_size, CONVNET_IMAGE_SIZE)
    channels = in_channels or 3
    preprocess = plain_preprocess(channels, side)
    # With a weights file, loaded into it strictly: built without random init.
    model = build_model(
        name,
        num_classes or 10,
        image_size=(height, side),
        in_channels=channels,
        weights_follow=weights_follow,
    )
    return ResolvedModel(
        model, name, "built-in", preprocess=preprocess, sample_shape=(channels, height, side)
    )


def _size_lazy_layers(
    resolved: ResolvedModel,
    image_size: int | Sequence[int] | None,
    in_channels: int | None,
    ahead: ReadAhead | None,
) -> None:
    """The lazy layers (LazyLinear, LazyConv2d...) of a model the user's code built, sized for
    the input the command feeds: the size and channels asked for, else those a weights file
    records, else the default size and the model's first convolution's channels (3 for a
    lazy one). Its preprocessing then takes the channels its first layer got."""
    if not has_lazy_weights(resolved.model):
        return
    recorded_size, recorded_channels = _weights_input(ahead)
    side = _size(image_size or recorded_size, DEFAULT_IMAGE_SIZE)
    channels = in_channels or recorded_channels or stem_channels(resolved.model) or 3
    materialize_lazy_layers(resolved.model, (channels, *side), resolved.arch)
    resolved.preprocess = plain_preprocess(stem_channels(resolved.model))


def _stem_channels_of(state: Mapping[str, Any]) -> int | None:
    for key, value in state.items():
        if key.endswith("weight") and getattr(value, "ndim", 0) == 4:
            return int(value.shape[1])
    return None


def _from_torchvision(
    name: str,
    num_classes: int | None,
    weights: str | None,
    image_size: int | Sequence[int] | None,
    ahead: ReadAhead | None = None,
) -> ResolvedModel:
    """A torchvision model with random weights, torchvision's own, or a file's (loaded after
    this returns). ViT and MaxViT are built for `image_size`, else for the size a torchkit
    checkpoint as the file records (their position embeddings depend on it)."""
    require_torchvision_name(name)
    enum = torchvision_weights_enum(name)
    if weights is not None and not os.path.exists(weights) and not is_checkpoint_path(weights):
        if image_size is not None and name.startswith(tuple(IMAGE_SIZE_KWARGS)):
            # Before the download: a size a ViT or MaxViT cannot be built for was refused only
            # once its weights had been fetched (offline: the download error instead).
            import torch

            with torch.device("meta"):
                torchvision_random(name, num_classes or 1000, image_size, weights_follow=True)
        return _torchvision_pretrained(name, weights, enum)
    if weights is not None and image_size is None and name.startswith(tuple(IMAGE_SIZE_KWARGS)):
        image_size = _weights_input(ahead)[0]
    size = _size(image_size, DEFAULT_IMAGE_SIZE)
    # With a weights file the head is sized from the file afterwards (fit_head_to).
    model = torchvision_random(
        name,
        (num_classes or 1000) if weights is None else 1000,
        size,
        weights_follow=weights is not None,
    )
    resolved = ResolvedModel(
        model,
        name,
        "torchvision",
        preprocess=_preprocess_of(enum.DEFAULT) if enum is not None else plain_preprocess(3),
        preprocess_source="torchvision" if enum is not None else "defaults",
        sample_shape=(3, *size),
    )
    return resolved


def _from_timm(
    spec: str,
    num_classes: int | None,
    weights: str | None,
    image_size: int | Sequence[int] | None,
    in_channels: int | None,
    ahead: ReadAhead | None,
    *,
    test_size: bool = False,
) -> ResolvedModel:
    """`timm/NAME[.TAG]`: random weights (offline), timm's pretrained ones (`DEFAULT` or a
    tag), or a file's, loaded after this returns. A torchkit checkpoint as the file says the
    image size and channels the model was built for (a ViT's position embeddings).
    `test_size`: resolve_model's `timm_test_size`."""
    pretrained = weights is not None and not os.path.exists(weights)
    pretrained = pretrained and not is_checkpoint_path(weights)
    if weights is not None and not pretrained and (image_size is None or in_channels is None):
        recorded_size, recorded_channels = _weights_input(ahead)
        image_size = image_size or recorded_size
        in_channels = in_channels or recorded_channels
    if pretrained:
        model = timm_pretrained(spec, weights, image_size=image_size, in_channels=in_channels)
    else:
        model = built_timm_model(  # a weights file, loaded strictly: no random init
            spec,
            weights is not None,
            num_classes=num_classes,
            image_size=image_size,
            in_channels=in_channels,
        )
    # timm's own weights are scored as timm's validate.py scores them: at their test size (train
    # fine-tunes at the train size: it takes its defaults from timm_weights_preprocess).
    # Without them, at the test size only where asked (benchmark) and no size is known yet.
    sizes = timm_config_sizes(model) if image_size is None else None
    if sizes is not None and sizes.test is None:
        sizes = None  # one size: nothing to choose
    test_size = pretrained or (test_size and sizes is not None and sizes.test_runs)
    preprocess = timm_preprocess(
        model, image_size=image_size, in_channels=in_channels, test_size=test_size
    )
    return ResolvedModel(
        model,
        spec,
        "timm",
        classes=imagenet_classes(model) if pretrained else None,
        preprocess=preprocess,
        preprocess_source="timm",
        sample_shape=timm_sample_shape(preprocess, image_size),
        weights_source="timm weights" if pretrained else None,
        timm_size=None if sizes is None else "test" if test_size else "train",
    )


class ReadAhead:
    """A model file read at most once per command: what sizes the model or says its
    preprocessing (train's defaults) is what is then loaded (a trusted pickle's code runs once).
    """

    def __init__(self, path: str, trust_checkpoint: bool) -> None:
        self.path, self.trust_checkpoint = path, trust_checkpoint
        self._read, self._content = False, None

    def content(self) -> Any:
        """What the file holds, read on the first call; None where it cannot be read (reported
        when it is loaded)."""
        if not self._read:
            self._content = _read_if_readable(self.path, self.trust_checkpoint)
            self._read = True
        return self._content

    def release(self) -> None:
        """Let go of what was read (a later load reads the file again)."""
        self._read, self._content = False, None

    def reads(self, path: str | None, trust_checkpoint: bool) -> bool:
        """Whether this is `path` as `trust_checkpoint` loads it."""
        return (path, trust_checkpoint) == (self.path, self.trust_checkpoint)

    def content_if_read(self, path: str | None, trust_checkpoint: bool) -> Any:
        """What was read of `path` as `trust_checkpoint` loads it; None if nothing was."""
        return self._content if self.reads(path, trust_checkpoint) else None


def _records_arch(ahead: ReadAhead | None, spec: str) -> bool:
    """Whether the weights file is a torchkit checkpoint of `spec` (one of another
    architecture is refused as such when it is loaded, not built for at its size)."""
    loaded = ahead.content() if ahead is not None else None
    return isinstance(loaded, Mapping) and loaded.get("arch") == spec


def _weights_input(ahead: ReadAhead | None) -> tuple[int | None, int | None]:
    """(image size, input channels) of the weights file: those a torchkit checkpoint's
    preprocessing records, else (None, the stem's channels); Nones when unknown."""
    from torchkit.core.models.checkpoint import extract_state_dict

    loaded = ahead.content() if ahead is not None else None
    if loaded is None:
        return None, None
    path = ahead.path
    try:
        preprocess = _preprocess_recorded_in(loaded, path)
        if preprocess is not None:
            return preprocess.image_size, preprocess.in_channels
        return None, _stem_channels_of(extract_state_dict(loaded))
    except (CheckpointError, UsageError):
        return None, None  # reported properly when the weights are loaded


def recorded_preprocess(
    path: str, *, trust_checkpoint: bool = False, ahead: ReadAhead | None = None
) -> Preprocess | None:
    """The preprocessing a torchkit checkpoint at `path` records (what its weights were trained
    on); None for anything else, or a file that cannot be read (reported when it is loaded).
    `ahead`, if it is `path`'s, reads it (once, for the load that follows)."""
    if ahead is not None and ahead.reads(path, trust_checkpoint):
        loaded = ahead.content()
    else:
        loaded = _read_if_readable(path, trust_checkpoint)
    try:
        return None if loaded is None else _preprocess_recorded_in(loaded, path)
    except (CheckpointError, UsageError):
        return None


def _read_if_readable(path: str, trust_checkpoint: bool) -> Any:
    """What the model file at `path` holds, read ahead of the load that reports what is wrong
    with it: None where it is not a file or cannot be read."""
    if not os.path.isfile(path):
        return None
    try:
        return read_model_file(path, trust_checkpoint=trust_checkpoint)
    except (CheckpointError, UsageError):
        return None


def _preprocess_recorded_in(loaded: Any, path: str) -> Preprocess | None:
    from torchkit.core.models.checkpoint import is_torchkit_checkpoint

    if is_torchkit_checkpoint(loaded) and loaded.get("preprocess"):
        return preprocess_as_trained(loaded, path)
    return None


def _torchvision_pretrained(name: str, weights: str, enum):
    """torchvision's own weights (DEFAULT, IMAGENET1K_V1...): downloaded once, then cached."""
    try:
        chosen = enum.verify(weights) if enum is not None else None
    except (KeyError, ValueError):
        chosen = None
    if chosen is None:
        names = ", ".join(["DEFAULT", *(w.name for w in enum)]) if enum else "none"
        raise UsageError(
            f"unknown weights {weights!r} for {name}",
            f"torchvision has: {names}; or pass --weights PATH to a file",
        )
    model = torchvision_pretrained(name, weights)
    categories = [str(c) for c in chosen.meta.get("categories") or []]
    preprocess = _preprocess_of(chosen)
    if name in TRANSFORM_INPUT_MODELS:  # built without transform_input: fed as it feeds
        preprocess = _transform_input_preprocess(preprocess)
    return ResolvedModel(
        model,
        name,
        "torchvision",
        classes=categories or None,
        preprocess=preprocess,
        preprocess_source="torchvision",
        sample_shape=(3, preprocess.image_size, preprocess.image_size),
        weights_source="torchvision weights",
    )


def _load_file_weights(
    resolved: ResolvedModel,
    path: str,
    trust_checkpoint: bool,
    *,
    ema: bool,
    command: str | None = None,
    loaded: Any = None,
) -> None:
    """Load a weights file into `resolved.model` (its head sized from the file), taking the
    classes and preprocessing of a torchkit checkpoint along; `loaded`: what was already read
    from it, if anything."""
    from torchkit.core.models.checkpoint import is_torchkit_checkpoint

    if not os.path.exists(path) and not is_checkpoint_path(path):
        raise UsageError(
            f"--weights {path}: there is no such file",
            "weight names such as DEFAULT exist only for torchvision and timm models; give a PATH",
        )
    # A folder is a file's error, as for MODEL: a training run's gets its checkpoint named.
    require_input(path, what="checkpoint", kind="file")
    fmt = exported_format_of(path)
    if fmt is not None:
        raise UsageError(
            f"--weights {path} is {EXPORTED_TITLES[fmt]}, not a weights file",
            f"pass {path} alone as MODEL where a command takes exported files, as predict and "
            "eval do, or give the checkpoint it was exported from",
        )
    if loaded is None:
        loaded = read_model_file(path, trust_checkpoint=trust_checkpoint)
    torchkit_file = is_torchkit_checkpoint(loaded)
    if torchkit_file and not _same_architecture(str(loaded.get("arch")), resolved.arch):
        raise UsageError(
            f"{path} holds a {loaded.get('arch')}, not a {resolved.arch}",
            f"drop the model name and pass {path} alone, or name {loaded.get('arch')}",
        )
    file_ema_key = None if torchkit_file else _ema_key(loaded)
    ema_key = file_ema_key if ema else None
    if ema and not torchkit_file and ema_key is None:
        raise UsageError(
            f"--ema needs EMA weights; {path} has none (it is neither a torchkit checkpoint "
            f"nor a checkpoint with {' or '.join(OTHER_EMA_KEYS)})",
            "drop --ema",
        )
    used = None if file_ema_key is None else _weights_used(path, loaded, file_ema_key, ema, command)
    if ema_key is not None:  # AveragedModel's counter (torchvision's scripts) is no weight
        loaded = {key: value for key, value in loaded[ema_key].items() if key != "n_averaged"}
    load_weights_file(resolved.model, path, loaded=loaded)
    if ema and torchkit_file:
        _load_ema(resolved.model, loaded, path)
    resolved.weights_source = "torchkit checkpoint" if torchkit_file else "state dict"
    if ema_key is not None:  # which weights of the file were used
        resolved.weights_source = f"state dict ({ema_key})"
    if used is not None:  # a file of two sets of weights: which one this is
        log.warning(used, extra=NOTE)
    if not torchkit_file and resolved.source == "torchvision":
        _as_torchvision_builds(resolved, path)
    if torchkit_file:
        resolved.checkpoint = loaded
        resolved.classes = _checkpoint_classes(loaded, path)
        if loaded.get("preprocess"):
            resolved.preprocess = preprocess_as_trained(loaded, path, command=command)
            resolved.preprocess_source = "checkpoint"
            side = resolved.preprocess.image_size
            resolved.sample_shape = (resolved.preprocess.in_channels, side, side)


# Where other training scripts keep their EMA weights beside the model's: timm's train.py
# (`state_dict` and `state_dict_ema`), DeiT's and others' (`model` and `model_ema`).
OTHER_EMA_KEYS = ("state_dict_ema", "model_ema")


# The commands whose --ema takes a file's EMA weights (train's --ema keeps its own EMA).
EMA_COMMANDS = ("eval", "predict", "export", "extract-features")
NOTE = {"note": True}  # a log record the CLI shows as a Note, by default


def _weights_used(path: str, loaded: Any, ema_key: str, ema: bool, command: str | None) -> str:
    """Which of the two sets of weights a training checkpoint not torchkit's holds (timm's
    `state_dict` and `state_dict_ema`) were loaded, and how to take the other."""
    from torchkit.core.models.checkpoint import MODEL_WEIGHT_KEYS

    model_key = next((key for key in MODEL_WEIGHT_KEYS if key in loaded and key != ema_key), None)
    if ema:
        return f"{path}: loaded its EMA weights ({ema_key})" + (
            f", not the model's ({model_key})" if model_key else ""
        )
    if model_key is None:  # the EMA copy alone: extract_state_dict's last resort
        return f"{path} holds only EMA weights ({ema_key}): loaded those"
    if command in EMA_COMMANDS:
        other = f"--ema loads {ema_key}"
    elif command == "train":
        other = (
            f"to fine-tune the EMA weights, keep them alone with `torchkit convert checkpoint "
            f"{shell_word(path)} EMA.pt --key {ema_key}` and pass EMA.pt as --weights"
        )
    else:
        command_line = f"torchkit convert checkpoint {shell_word(path)} EMA.pt --key {ema_key}"
        other = f"`{command_line}` keeps those alone"
    return (
        f"{path} holds the model's weights ({model_key}) and their EMA ({ema_key}): loaded "
        f"{model_key}; {other}"
    )


def _ema_key(loaded: Any) -> str | None:
    """The key of a checkpoint not torchkit's that holds EMA weights, if it has one."""
    if not isinstance(loaded, Mapping):
        return None
    return next((key for key in OTHER_EMA_KEYS if isinstance(loaded.get(key), Mapping)), None)


def _as_torchvision_builds(resolved: ResolvedModel, path: str) -> None:
    """torchvision's own googlenet or inception_v3 file, fed as torchvision's model with these
    weights is (`transform_input`): images normalised to mean 0.5, std 0.5, which is what its
    re-normalisation of ImageNet-normalised images gives. A model that re-normalises is not
    built instead, since a torchkit checkpoint (train from the file) could not rebuild it."""
    if is_torchvision_transform_input_file(resolved.arch, path):
        resolved.preprocess = _transform_input_preprocess(resolved.preprocess)
        resolved.weights_source = "torchvision weights"


def _transform_input_preprocess(preprocess: Preprocess) -> Preprocess:
    mean_std = TRANSFORM_INPUT_MEAN_STD
    return replace(preprocess, mean=mean_std, std=mean_std)


def _same_architecture(recorded: str, named: str) -> bool:
    """A checkpoint's `arch` is the architecture MODEL names; timm's pretrained tags
    (`timm/resnet18.a1_in1k`) name weights, not another architecture."""
    if is_timm_spec(recorded) and is_timm_spec(named):
        return base_name(recorded) == base_name(named)
    return recorded == named


def plain_preprocess(in_channels: int, image_size: int = DEFAULT_IMAGE_SIZE) -> Preprocess:
    """ImageNet-style preprocessing for a model that does not say how it was trained: resize
    to size/0.875 (torchvision's 256/224), centre-crop, ImageNet statistics (their channel
    average for models that are not RGB)."""
    if in_channels == 3:
        mean, std = IMAGENET_MEAN, IMAGENET_STD
    else:
        mean = (sum(IMAGENET_MEAN) / 3,) * in_channels
        std = (sum(IMAGENET_STD) / 3,) * in_channels
    return Preprocess(
        image_size=image_size,
        resize_size=resize_for_crop(image_size),
        mean=mean,
        std=std,
        in_channels=in_channels,
    )


def stem_channels(model) -> int:
    """Input channels of a model: those of its first convolution (3 when it has none)."""
    from torch import nn

    for module in model.modules():
        if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            return int(module.in_channels)
    return 3


def _preprocess_of(weights_enum_member) -> Preprocess:
    """torchvision's eval transform for these weights, as a Preprocess."""
    transform = weights_enum_member.transforms()
    return Preprocess(
        image_size=int(transform.crop_size[0]),
        resize_size=int(transform.resize_size[0]),
        mean=tuple(float(v) for v in transform.mean),
        std=tuple(float(v) for v in transform.std),
        in_channels=3,
        interpolation=transform.interpolation.value,
    )


def _checkpoint_classes(checkpoint: Mapping[str, Any], path: str) -> list[str] | None:
    where = f"checkpoint {path}"
    names = stored_class_names(checkpoint.get("classes"), where, CheckpointError) or []
    if names and len(names) != int(checkpoint.get("num_classes", len(names))):
        raise CheckpointError(
            f"checkpoint {path} names {len(names)} classes but has "
            f"{checkpoint.get('num_classes')} outputs"
        )
    return names or None


def _load_ema(model, checkpoint: Mapping[str, Any], path: str) -> None:
    """The EMA weights `train --ema` stored beside the model's."""
    from torchkit.core.models.checkpoint import load_weights_into, strip_module_prefix

    if checkpoint.get("model_ema") is None:
        raise CheckpointError(f"checkpoint {path} holds no EMA weights", "drop --ema")
    source = f"the EMA weights of {path}"
    state = strip_module_prefix(checkpoint["model_ema"], what=source)
    state.pop("n_averaged", None)  # torch.optim.swa_utils.AveragedModel's counter
    state = size_adapted(model, state, source=source)
    load_weights_into(model, state, source=source)
