"""What `eval` evaluates: a model with its class names and preprocessing, and a set of images.

The model comes from a torchkit checkpoint (architecture, classes and preprocessing inside), a
plain state dict with `--model`/`--num-classes`, a pickled `nn.Module` (trusted loading only), or
torchvision's pretrained weights (`--model NAME --weights DEFAULT`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchkit.core.checkpoint import (
    extract_state_dict,
    is_torchkit_checkpoint,
    load_weights_into,
    strip_module_prefix,
)
from torchkit.core.data import (
    DIGITS,
    IMAGENET_MEAN,
    IMAGENET_STD,
    SPLIT_NAMES,
    Preprocess,
    Samples,
    digits_splits,
    discover_image_folder,
    read_csv_index,
)
from torchkit.core.errors import CheckpointError, InputError, UsageError
from torchkit.core.files import require_input

# Mode PIL converts images to for a given channel count.
IMAGE_MODES = {1: "L", 3: "RGB", 4: "RGBA"}


@dataclass
class ModelSpec:
    """The model as the user named it on the command line."""

    checkpoint: str | None = None
    model: str | None = None
    num_classes: int | None = None
    weights: str | None = None
    classes: list[str] | None = None
    image_size: int | None = None
    resize_size: int | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    trust_checkpoint: bool = False
    ema: bool = False


# Sources without preprocessing of their own: ImageNet's, at --image-size.
PLAIN_ORIGINS = ("state dict", "pickled model")


@dataclass
class ModelSource:
    """A model that is known but not built yet: the number of classes of a plain state dict may
    come from the data, which is read after the checkpoint."""

    arch: str
    origin: str  # "torchkit checkpoint", "state dict", "pickled model", "torchvision weights"
    classes: list[str] | None
    num_classes: int | None
    preprocess: Preprocess
    build: Callable[[int], Any]  # num_classes -> nn.Module with the weights loaded
    details: dict = field(default_factory=dict)


def parse_class_names(spec: str) -> list[str]:
    """`--classes`: a text file with one name per line, or names separated by commas."""
    path = Path(spec)
    if path.is_file():
        names = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
        names = [name for name in names if name]
    else:
        names = [name.strip() for name in spec.split(",") if name.strip()]
    if not names:
        raise UsageError(f"no class names in --classes {spec!r}")
    if len(set(names)) != len(names):
        duplicates = sorted({name for name in names if names.count(name) > 1})
        raise UsageError(f"--classes names {', '.join(duplicates[:5])} more than once")
    return names


def open_model_source(spec: ModelSpec) -> ModelSource:
    """Read the checkpoint (or torchvision's weight metadata) named by `spec`, with the
    preprocessing it comes with, changed by `--image-size/--resize-size/--mean/--std`."""
    from torchkit.core.preprocessing import apply_overrides

    source = _open_model_source(spec)
    source.preprocess = apply_overrides(
        source.preprocess,
        # Plain weights already took --image-size as their input size (resize at 256/224).
        image_size=None if source.origin in PLAIN_ORIGINS else spec.image_size,
        resize_size=spec.resize_size,
        mean=spec.mean,
        std=spec.std,
    )
    return source


def _open_model_source(spec: ModelSpec) -> ModelSource:
    checkpoint = spec.checkpoint
    if spec.weights and checkpoint:
        raise UsageError(
            "give either a CHECKPOINT or --weights, not both",
            "--weights is for --model NAME --weights DEFAULT or a weights file",
        )
    if spec.weights:
        from torchkit.core.models import is_checkpoint_path

        if is_checkpoint_path(spec.weights):
            checkpoint = spec.weights
        else:
            return _torchvision_source(spec)
    if not checkpoint:
        raise UsageError(
            "nothing to evaluate", "give a CHECKPOINT, or --model NAME --weights DEFAULT"
        )
    obj = _load(checkpoint, spec.trust_checkpoint)
    if is_torchkit_checkpoint(obj):
        return _torchkit_source(obj, spec, checkpoint)
    module = _as_module(obj)
    if module is not None:
        return _module_source(module, spec, checkpoint)
    return _state_dict_source(obj, spec, checkpoint)


def _load(path: str, trust: bool) -> Any:
    """The file's contents, read as every command reads model files (a trusted pickle imports
    its classes with the working directory importable and their prints sent to stderr)."""
    from torchkit.core.models.weights import read_model_file

    return read_model_file(path, trust=trust)


def _as_module(obj: Any):
    from torchkit.core.models import pickled_module

    return pickled_module(obj)


def _check_num_classes(spec: ModelSpec, found: int, where: str) -> None:
    if spec.num_classes is not None and spec.num_classes != found:
        raise UsageError(
            f"--num-classes {spec.num_classes} contradicts {where}, which has {found} classes",
            "drop --num-classes",
        )
    if spec.classes is not None and len(spec.classes) != found:
        raise UsageError(
            f"--classes names {len(spec.classes)} classes but {where} has {found}",
            "give one name per model output, in label order",
        )


def _torchkit_source(checkpoint: Mapping, spec: ModelSpec, path: str) -> ModelSource:
    from torchkit.core.models import model_from_checkpoint

    arch = str(checkpoint.get("arch", ""))
    if spec.model and spec.model != arch:
        raise UsageError(
            f"--model {spec.model} contradicts the checkpoint, which holds a {arch}",
            "drop --model: a torchkit checkpoint names its architecture",
        )
    try:
        num_classes = int(checkpoint["num_classes"])
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"checkpoint {path} lacks a valid num_classes") from error
    stored = [str(name) for name in (checkpoint.get("classes") or [])]
    if stored and len(stored) != num_classes:
        raise CheckpointError(
            f"checkpoint {path} names {len(stored)} classes but has {num_classes} outputs"
        )
    _check_num_classes(spec, num_classes, "the checkpoint")
    classes = spec.classes or stored or None
    if spec.ema and checkpoint.get("model_ema") is None:
        raise CheckpointError(f"checkpoint {path} holds no EMA weights", "drop --ema")

    def build(_: int):
        model = model_from_checkpoint(dict(checkpoint))
        if spec.ema:
            state = strip_module_prefix(checkpoint["model_ema"])
            state.pop("n_averaged", None)  # torch.optim.swa_utils.AveragedModel's counter
            load_weights_into(model, state, source=f"the EMA weights of {path}")
        return model

    details = {
        key: checkpoint.get(key)
        for key in ("epoch", "global_step", "best_metric", "torchkit_version")
        if isinstance(checkpoint.get(key), (int, float, str))
    }
    return ModelSource(
        arch=arch,
        origin="torchkit checkpoint",
        classes=classes,
        num_classes=num_classes,
        preprocess=Preprocess.from_dict(checkpoint.get("preprocess")),
        build=build,
        details=details,
    )


def default_preprocess(image_size: int | None, in_channels: int) -> Preprocess:
    """ImageNet-style preprocessing for weights that do not say how they were trained:
    resize to size/0.875 (torchvision's 224/256 ratio), centre-crop, ImageNet statistics
    (their channel average for one-channel models)."""
    size = image_size or 224
    if in_channels == 3:
        mean, std = IMAGENET_MEAN, IMAGENET_STD
    else:
        mean = (sum(IMAGENET_MEAN) / 3,) * in_channels
        std = (sum(IMAGENET_STD) / 3,) * in_channels
    return Preprocess(
        image_size=size,
        resize_size=int(round(size / 0.875)),
        mean=mean,
        std=std,
        in_channels=in_channels,
    )


def _first_conv_channels(state: Mapping[str, Any]) -> int:
    """Input channels of a network: dim 1 of its first 4-D weight (the stem convolution)."""
    for key, value in state.items():
        if key.endswith("weight") and getattr(value, "ndim", 0) == 4:
            return int(value.shape[1])
    return 3


def _state_dict_source(obj: Any, spec: ModelSpec, path: str) -> ModelSource:
    from torchkit.core.models import build_model

    state = extract_state_dict(obj)
    if not spec.model:
        raise UsageError(
            f"{path} holds plain weights, not a torchkit checkpoint",
            "pass --model NAME (and --num-classes N) to say which network they belong to",
        )
    in_channels = _first_conv_channels(state)
    preprocess = default_preprocess(spec.image_size, in_channels)

    def build(num_classes: int):
        model = build_model(
            spec.model, num_classes, image_size=preprocess.image_size, in_channels=in_channels
        )
        load_weights_into(model, state, source=path)
        return model

    return ModelSource(
        arch=spec.model,
        origin="state dict",
        classes=spec.classes,
        num_classes=spec.num_classes or (len(spec.classes) if spec.classes else None),
        preprocess=preprocess,
        build=build,
    )


def _module_source(module, spec: ModelSpec, path: str) -> ModelSource:
    from torchkit.core.models import find_head

    try:
        _, head = find_head(module)
        outputs = head.out_features if hasattr(head, "out_features") else head.out_channels
    except UsageError:
        outputs = None
    if outputs is not None:
        _check_num_classes(spec, outputs, "the pickled model")
    state = module.state_dict()
    preprocess = default_preprocess(spec.image_size, _first_conv_channels(state))
    return ModelSource(
        arch=spec.model or type(module).__name__,
        origin="pickled model",
        classes=spec.classes,
        num_classes=outputs or spec.num_classes,
        preprocess=preprocess,
        build=lambda _: module,
    )


def _torchvision_source(spec: ModelSpec) -> ModelSource:
    import torchvision

    from torchkit.core.models import build_model, suggest

    if not spec.model:
        raise UsageError(f"--weights {spec.weights} needs --model NAME", "e.g. --model resnet18")
    try:
        enum = torchvision.models.get_model_weights(spec.model)
    except (ValueError, KeyError) as error:
        choices = torchvision.models.list_models(module=torchvision.models)
        raise UsageError(
            f"{spec.model!r} is not a torchvision model with pretrained weights",
            suggest(spec.model, choices),
        ) from error
    name = spec.weights.split(".")[-1]
    if name not in enum.__members__:
        raise UsageError(
            f"unknown weights {spec.weights!r} for {spec.model}",
            "choose from " + ", ".join(["DEFAULT", *enum.__members__]),
        )
    weights = enum[name]
    categories = list(weights.meta.get("categories") or [])
    _check_num_classes(spec, len(categories), f"{spec.model} {weights}")
    transform = weights.transforms()
    preprocess = Preprocess(
        image_size=int(_first(transform.crop_size)),
        resize_size=int(_first(transform.resize_size)),
        mean=tuple(transform.mean),
        std=tuple(transform.std),
        in_channels=3,
        interpolation=transform.interpolation.value,
    )
    return ModelSource(
        arch=spec.model,
        origin="torchvision weights",
        classes=spec.classes or categories,
        num_classes=len(categories),
        preprocess=preprocess,
        build=lambda n: build_model(spec.model, n, weights=name),
        details={"weights": str(weights)},
    )


def _first(value) -> Any:
    return value[0] if isinstance(value, (list, tuple)) else value


def load_eval_samples(
    data: str, *, split: str | None = None, classes: Sequence[str] | None = None
) -> Samples:
    """The images `--data` names, labelled in the order of `classes` (matched by name).

    `digits` (its held-out test split unless `--split` says otherwise); a dataset root with a
    `test/` (or `--split`) folder; an image folder ROOT/<class>/<image>; or a CSV index.
    """
    if data == DIGITS:
        parts = digits_splits()
        chosen = split or "test"
        if chosen not in parts:
            raise UsageError(f"digits has no split {chosen!r}", "use train, val or test")
        return _relabel(parts[chosen], classes)
    source = require_input(data, what="dataset")
    if source.is_dir():
        present = [name for name in SPLIT_NAMES if (source / name).is_dir()]
        if split is not None:
            if not (source / split).is_dir():
                raise InputError(
                    f"{source} has no {split}/ folder",
                    f"it has {', '.join(present)}" if present else "drop --split",
                )
            source = source / split
        elif present:
            if "test" not in present:
                raise InputError(
                    f"{source} has {', '.join(p + '/' for p in present)} but no test/",
                    "pass --split val to evaluate on the validation set",
                )
            source = source / "test"
        return discover_image_folder(source, classes=classes)
    if source.suffix.lower() == ".csv":
        return read_csv_index(source, classes=classes)
    raise InputError(
        f"{source} is neither an image folder nor a CSV index", "give a folder, a .csv or digits"
    )


def _relabel(samples: Samples, classes: Sequence[str] | None) -> Samples:
    """Map an in-memory set's labels onto `classes` by class name."""
    if classes is None or list(classes) == samples.classes:
        return samples
    index_of = {name: i for i, name in enumerate(classes)}
    unknown = [name for name in samples.classes if name not in index_of]
    if unknown:
        raise InputError(
            f"class(es) {', '.join(unknown[:5])} of {samples.source} are not among the model's "
            f"{len(classes)} classes",
            "the classes are: " + ", ".join(list(classes)[:10]),
        )
    mapping = [index_of[name] for name in samples.classes]
    return Samples(
        classes=list(classes),
        labels=[mapping[label] for label in samples.labels],
        paths=samples.paths,
        images=samples.images,
        source=samples.source,
        ids=samples.ids,
    )
