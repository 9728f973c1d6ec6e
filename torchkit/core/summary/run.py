"""From command-line values to a summary: input sizes, dtype, device, building the model."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torchkit.core.input_size import MAX_NUMEL, check_numel, parse_input_size, square_sample
from torchkit.core.io.errors import TorchkitError, UsageError, first_line, short_repr
from torchkit.core.io.sizes import gigabytes_text
from torchkit.core.models import ModelSpec, model_inputs, resolve_spec
from torchkit.core.models.builders import BUILTIN_MODELS, is_timm_spec, list_models
from torchkit.core.models.image_size import ImageSizeError
from torchkit.core.models.resolver import (
    has_random_weights,
    replaced_head_warning,
    untrained_note,
)
from torchkit.core.runtime.plain_shapes import plain_shapes
from torchkit.core.summary.counting import (
    INPUT_HINT,
    SCRIPT_NOTE,
    InputSpec,
    MetaPassFailed,
    ModelSummary,
    is_script_module,
    model_device,
    summarize,
    summarize_tree,
)
from torchkit.torchvision_without_dynamo import without_dynamo

log = logging.getLogger("torchkit")

DTYPES = {
    "float32": "float32",
    "float": "float32",
    "fp32": "float32",
    "float16": "float16",
    "half": "float16",
    "fp16": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float64": "float64",
    "double": "float64",
    "int64": "int64",
    "long": "int64",
    "int32": "int32",
    "int": "int32",
    "uint8": "uint8",
    "bool": "bool",
}


def check_output(
    spec: str | None, output: str | os.PathLike | None, *, weights: str | None, force: bool
) -> None:
    """Check `-o` before the model is built: not the checkpoint, weights or model source it
    reads, an existing file replaced only with `force`, and a folder that takes the file
    (`-o -` is stdout)."""
    from torchkit.core.io.file_outputs import check_output_file

    if output is not None and os.fspath(output) != "-":
        check_output_file(output, force, model_inputs(spec, weights), what="output")


@dataclass(frozen=True)
class InputArg:
    """One `-i [NAME=]SHAPE[:DTYPE]` as given: the shape without the batch dimension (unless
    --no-batch-dim), the keyword it is passed as (None: positional), the dtype's name."""

    size: tuple[int, ...]
    name: str | None = None
    dtype: str | None = None


def parse_input(text: str) -> InputArg:
    """`[NAME=]SHAPE[:DTYPE]`: '3,224,224', 'input_ids=1,128:long', 't=():long', 'mask=128:bool'.
    SHAPE '()' (or 'scalar') has no dimensions."""
    name = dtype = None
    rest = text.strip()
    if "=" in rest:
        name, rest = (part.strip() for part in rest.split("=", 1))
        if not name.isidentifier():
            raise UsageError(
                f"invalid input name {name!r} in {text!r}",
                "name a keyword argument of forward, e.g. input_ids=1,128:long",
            )
    if ":" in rest:
        rest, dtype = (part.strip() for part in rest.rsplit(":", 1))
        parse_dtype(dtype)  # an unknown dtype is an error now, before the model is built
    if rest.replace(" ", "") in ("()", "[]", "scalar"):
        return InputArg((), name, dtype)
    return InputArg(parse_input_size(rest, text), name, dtype)


def parse_dtype(name: str):
    key = DTYPES.get(name.strip().lower().removeprefix("torch."))
    if key is None:
        raise UsageError(
            f"unknown dtype {name!r}", "use " + ", ".join(sorted(set(DTYPES.values())))
        )
    import torch

    return getattr(torch, key)


def full_shapes(
    sizes: Sequence[Sequence[int]],
    batch_size: int | None,
    *,
    image_model: bool,
    no_batch_dim: bool = False,
) -> list[tuple[int, ...]]:
    """Add the batch dimension. For an image model a 4-number size already has it
    (N,C,H,W); any other size is the shape of one sample and gets `batch_size` (default 1).
    With `no_batch_dim` every size is the full shape, as given."""
    if no_batch_dim:
        if batch_size is not None:
            raise UsageError(
                "--batch-size contradicts --no-batch-dim",
                "give the batch in each --input-size, or drop --no-batch-dim",
            )
        return [tuple(size) for size in sizes]
    shapes = []
    for size in sizes:
        if image_model and len(size) == 4:
            if batch_size is not None and batch_size != size[0]:
                raise UsageError(
                    f"--batch-size {batch_size} contradicts the input size "
                    f"{','.join(map(str, size))}",
                    "give C,H,W with --batch-size, or N,C,H,W alone",
                )
            shapes.append(tuple(size))
        elif image_model and len(size) != 3:
            raise UsageError(
                f"an image model takes C,H,W or N,C,H,W, not {','.join(map(str, size))}"
            )
        else:
            shapes.append((batch_size or 1, *size))
    for shape in shapes:
        if batch_size is not None and math.prod(shape) > MAX_NUMEL:
            # It named an input size the user never gave, and hinted at 3,224,224.
            raise UsageError(
                f"--batch-size {short_repr(batch_size)} of inputs "
                f"{','.join(map(str, shape[1:]))} is more values than a tensor can hold",
                "give a smaller --batch-size",
            )
        check_numel(shape, ",".join(map(str, shape)))
    return shapes


def summarize_model(
    spec: str,
    *,
    input_sizes: Sequence[Sequence[int] | InputArg] = (),
    image_size: int | None = None,
    batch_size: int | None = None,
    num_classes: int | None = None,
    weights: str | None = None,
    trust_checkpoint: bool = False,
    dtype: str | None = None,
    device: str = "cpu",
    count_flops: bool = True,
    no_batch_dim: bool = False,
    params_only: bool = False,
    train_mode: bool = False,
    progress: Callable[[str], None] | None = None,
    notify: Callable[[str], None] | None = None,
    warn: Callable[[str], None] | None = None,
) -> ModelSummary:
    """Build (or load) the model `spec` names on `device` and summarize it: with a forward pass
    on the inputs `input_sizes` describe (or the size the model is known to take), or from the
    module tree alone (`params_only`, and when no input size is given or known). `notify` hears
    that the model has random weights (a note, not part of the summary); `warn`, that
    `num_classes` replaced the head its weights have. `image_size` N is
    the input C,N,N with the channels the model takes (`--image-size`, another spelling of
    `--input-size`)."""
    from torchkit.core.runtime.device import resolve_device

    args = [size if isinstance(size, InputArg) else InputArg(tuple(size)) for size in input_sizes]
    if image_size is not None and args:
        raise UsageError("--image-size and --input-size both give the input", "give one")
    if params_only and (args or image_size is not None):
        raise UsageError("--params-only runs no forward pass", "drop --input-size")
    if params_only and train_mode:
        raise UsageError("--params-only runs no forward pass", "drop --train-mode")
    if params_only and (batch_size is not None or no_batch_dim):
        option = "--batch-size" if batch_size is not None else "--no-batch-dim"
        raise UsageError("--params-only runs no forward pass", f"drop {option}")
    torch_dtype = parse_dtype(dtype) if dtype else None
    target = resolve_device(device)
    first = next((arg.size for arg in args if arg.name is None), None)
    batched = first is not None and (no_batch_dim or len(first) == 4)
    sample = first[1:] if batched else first
    if progress is not None:
        progress("building the model")
    if sample is not None and spec in BUILTIN_MODELS:
        _require_image_shape(sample, spec, first if no_batch_dim else None)
    named = ModelSpec(
        model=spec,
        weights=weights,
        trust_checkpoint=trust_checkpoint,
        num_classes=num_classes,
        sample_shape=None if sample is None else tuple(sample),
        image_size=image_size,
    )
    summary_options = dict(
        args=args,
        image_size=image_size,
        batch_size=batch_size,
        torch_dtype=torch_dtype,
        target=target,
        count_flops=count_flops,
        no_batch_dim=no_batch_dim,
        params_only=params_only,
        train_mode=train_mode,
        progress=progress,
    )
    loaded = _built_on_meta(named) if weights is None and _named_architecture(spec) else None
    noted = loaded is not None
    if loaded is not None:
        _note_random_weights(loaded, spec, notify)
        try:
            return _summarize_loaded(loaded, **summary_options)
        except MetaPassFailed as error:
            log.info("%s does not run on the meta device (%s): building it for real", spec, error)
    with _sized_by_input(spec, sample):
        loaded = _resolve(named)
    replaced = replaced_head_warning(loaded)
    if warn is not None and replaced is not None:
        warn(replaced)
    if not noted:
        _note_random_weights(loaded, spec, notify)
    return _summarize_loaded(loaded, **summary_options)


def _resolve(named: ModelSpec) -> Any:
    return resolve_spec(
        named,
        command="summary",
        exported="module",
        new_head=True,  # `--num-classes` shows the model as it would be fine-tuned
    )


def _named_architecture(spec: str) -> bool:
    """convnet, a torchvision classification model's name or `timm/NAME`: built by code
    torchkit knows, which a random build (no --weights) lets run on the meta device (a file or
    a run folder is loaded; a user's `package.module:Callable` is built once, the normal way)."""
    if os.path.exists(spec):
        return False
    return spec in BUILTIN_MODELS or is_timm_spec(spec) or spec in list_models()


def _built_on_meta(named: ModelSpec) -> Any:
    """The randomly initialised model `named` names built on the meta device: the summary
    needs its shapes, not its values, and a big model (vit_h_14: 632M parameters, 2.5 GB and
    most of a minute to initialise) costs nothing there. None when its builder reads tensor
    values (RegNet's widths) or fails there for any other reason: it is then built for real,
    which gives the real error."""
    import torch

    try:
        # On the meta device the random draws (and what else a builder runs there) run torch's
        # Python references, which would import torch._dynamo and sympy (about 4 s of CPU).
        with torch.device("meta"), without_dynamo(), plain_shapes():
            return _resolve(named)
    except TorchkitError:
        raise
    except Exception as error:  # noqa: BLE001 - any failure means: build it for real
        log.info("%s cannot be built on the meta device (%s)", named.model, first_line(error))
        return None


def _note_random_weights(loaded: Any, spec: str, notify: Callable[[str], None] | None) -> None:
    if notify is not None and has_random_weights(loaded):
        notify(untrained_note(spec, "summary"))


def _summarize_loaded(
    loaded: Any,
    *,
    args: list[InputArg],
    image_size: int | None,
    batch_size: int | None,
    torch_dtype: Any,
    target: Any,
    count_flops: bool,
    no_batch_dim: bool,
    params_only: bool,
    train_mode: bool,
    progress: Callable[[str], None] | None,
) -> ModelSummary:
    """The summary of the model `loaded` holds, on `target` (a model built on the meta device
    stays there: its forward pass runs there and nowhere else, and the summary names `target`)."""
    from torchkit.core.runtime.threads import compute_threads, torch_threads

    notes = []
    sized_by_input = bool(args) and image_size is None  # -i, which --image-size contradicts
    if image_size is not None:
        args = [InputArg(square_sample(loaded.sample_shape, image_size))]
        no_batch_dim = False
    elif not args and not params_only:
        if loaded.sample_shape is not None:
            args = [InputArg(tuple(loaded.sample_shape))]
            no_batch_dim = False  # the known size is one sample's
        else:
            notes.append(
                f"the input size of {loaded.arch} is not known: parameters only; mult-adds, "
                "FLOPs and activation memory need --input-size (-i), e.g. -i 3,224,224"
            )
    model: Any = loaded.model
    image_model = loaded.image_model
    on_meta = model_device(model).type == "meta"
    if torch_dtype is not None and torch_dtype.is_floating_point:
        model = model.to(torch_dtype)
    if not on_meta:
        model = model.to(target)
    if not args:
        if train_mode:
            raise UsageError("--train-mode needs a forward pass", "give --input-size, -i for short")
        if is_script_module(model):
            notes.insert(0, SCRIPT_NOTE)
        result = summarize_tree(model, notes=notes)
    else:
        if loaded.exported_batch_size is not None and not no_batch_dim:
            batch_size = _fixed_batch(loaded, args, batch_size)
        shapes = full_shapes(
            [arg.size for arg in args],
            batch_size,
            image_model=image_model,
            no_batch_dim=no_batch_dim,
        )
        specs = [
            InputSpec(shape, parse_dtype(arg.dtype) if arg.dtype else None, arg.name)
            for shape, arg in zip(shapes, args, strict=True)
        ]
        with torch_threads(compute_threads()):
            try:
                result = summarize(
                    model,
                    specs,
                    dtype=torch_dtype,
                    count_flops=count_flops,
                    train_mode=train_mode,
                    progress=progress,
                    run_for_real=not on_meta,
                )
            except ImageSizeError as error:
                if not sized_by_input:
                    raise
                # --no-batch-dim: -i gives the batch first, and the hint gives it too
                batch = args[0].size[0] if no_batch_dim and len(args[0].size) == 4 else None
                raise error.for_input_size(batch) from error.__cause__
            except UsageError as error:
                _name_the_recorded_input(error, loaded, specs)
                raise
    if on_meta:
        result.device = _device_name(target)
    return result


def _name_the_recorded_input(error: UsageError, loaded: Any, specs: list[InputSpec]) -> None:
    """A torchkit checkpoint's model that fails on another input than the one it records (the
    convnet, whose classifier is sized for its images: 'mat1 and mat2 shapes cannot be
    multiplied'): the hint names the recorded input, where it was only to check --input-size."""
    recorded = loaded.sample_shape
    if error.hint != INPUT_HINT or loaded.checkpoint is None or recorded is None:
        return
    if len(specs) != 1 or len(specs[0].shape) != 4 or tuple(specs[0].shape[1:]) == recorded:
        return
    shape = ",".join(map(str, recorded))
    error.hint = (
        f"{loaded.spec or loaded.arch}'s {loaded.arch} was trained on {shape} inputs: give -i "
        f"{shape}, or leave out --input-size for them"
    )


def _fixed_batch(loaded: Any, args: list[InputArg], batch_size: int | None) -> int:
    """The batch an exported file of a fixed batch (`export --static-batch -b N`) is counted
    at: N, which it runs only (as benchmark); another --batch-size, or an N,C,H,W input of
    another N, is refused naming N (it failed in the model: 'expected a batch of N, got 1')."""
    fixed = loaded.exported_batch_size
    given = [batch_size] if batch_size is not None else []
    given += [arg.size[0] for arg in args if arg.name is None and len(arg.size) == 4]
    others = [size for size in given if size != fixed]
    if others:
        raise UsageError(
            f"{loaded.spec or loaded.arch} takes batches of {fixed} only (exported with "
            f"--static-batch), not {others[0]}",
            f"give --batch-size {fixed} or none, or export it without --static-batch",
        )
    return fixed


def _device_name(device: Any) -> str:
    """What a model moved to `device` reports as its device (`cuda` -> `cuda:0`, `mps:0`)."""
    import torch

    if device.type == "cpu" or device.index is not None:
        return str(device)
    index = torch.cuda.current_device() if device.type == "cuda" else 0
    return f"{device.type}:{index}"


@contextlib.contextmanager
def _sized_by_input(spec: str, sample: Sequence[int] | None):
    """Building a model sized by the input (convnet's classifier grows with the image) that
    needs more memory than there is: a usage error naming the input size, not a traceback."""
    import torch

    try:
        yield
    except (MemoryError, RuntimeError) as error:
        oom = isinstance(error, (MemoryError, torch.OutOfMemoryError)) or (
            "can't allocate memory" in str(error)
        )
        if sample is None or not oom:
            raise
        wanted = re.search(r"allocate (\d+) bytes", str(error))
        amount = f" ({gigabytes_text(int(wanted.group(1)))} at once)" if wanted else ""
        raise UsageError(
            f"{spec} built for an input of size {','.join(map(str, sample))} needs more memory "
            f"than there is{amount}",
            "give a smaller --input-size",
        ) from error


def _require_image_shape(
    shape: Sequence[int], name: str, unbatched: Sequence[int] | None = None
) -> None:
    """`shape`, one sample of the input, is C,H,W; `unbatched` is the whole --input-size under
    --no-batch-dim, which names it (3,32,32 is no image there: its sample is 32,32)."""
    if len(shape) != 3 and unbatched is not None:
        raise UsageError(
            f"{name} takes images, and with --no-batch-dim the input size is N,C,H,W, not "
            f"{','.join(map(str, unbatched)) or '() (no dimensions)'}",
            "give the batch first, such as 1,3,28,28, or drop --no-batch-dim",
        )
    if len(shape) != 3:
        raise UsageError(
            f"{name} takes images: give the input size as C,H,W (or N,C,H,W), not "
            f"{','.join(map(str, shape)) or '() (no dimensions)'}"
        )
