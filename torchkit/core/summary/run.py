"""From command-line values to a summary: input sizes, dtype, device, building the model."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from typing import Any

from torchkit.core.errors import UsageError
from torchkit.core.models import model_inputs, resolve_model
from torchkit.core.models.builders import BUILTIN_MODELS
from torchkit.core.summary.counting import ModelSummary, summarize

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
}
_SIZE_SEPARATOR = re.compile(r"\s*[,x×]\s*|\s+")


def check_output(
    spec: str | None, output: str | os.PathLike | None, *, weights: str | None, force: bool
) -> None:
    """Check `-o` before the model is built: not the checkpoint, weights or model source it
    reads, and an existing file replaced only with `force` (`-o -` is stdout)."""
    from torchkit.core.outputs import check_output_file

    if output is not None and os.fspath(output) != "-":
        check_output_file(output, force, model_inputs(spec, weights), what="output")


def parse_input_size(text: str) -> tuple[int, ...]:
    """'3,224,224', '3x224x224', '3 224 224' or '(1, 3, 224, 224)' -> a tuple of ints."""
    cleaned = text.strip().strip("()[]")
    try:
        size = tuple(int(part) for part in _SIZE_SEPARATOR.split(cleaned))
    except ValueError:  # not a number, or an empty part as in "3,,4"
        size = ()
    if not size or any(n <= 0 for n in size):
        raise UsageError(f"invalid input size {text!r}", "give positive integers, e.g. 3,224,224")
    return size


def parse_dtype(name: str):
    import torch

    key = DTYPES.get(name.strip().lower().removeprefix("torch."))
    if key is None:
        raise UsageError(
            f"unknown dtype {name!r}", "use " + ", ".join(sorted(set(DTYPES.values())))
        )
    return getattr(torch, key)


def full_shapes(
    sizes: Sequence[Sequence[int]],
    batch_size: int | None,
    *,
    image_model: bool,
) -> list[tuple[int, ...]]:
    """Add the batch dimension. For an image model a 4-number size already has it
    (N,C,H,W); any other size is the shape of one sample and gets `batch_size` (default 1)."""
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
    return shapes


def summarize_model(
    spec: str,
    *,
    input_sizes: Sequence[Sequence[int]] = (),
    batch_size: int | None = None,
    num_classes: int | None = None,
    weights: str | None = None,
    trust: bool = False,
    dtype: str | None = None,
    device: str = "cpu",
    count_flops: bool = True,
    progress: Callable[[str], None] | None = None,
) -> ModelSummary:
    """Build (or load) the model `spec` names on `device` and summarize it."""
    from torchkit.core.device import resolve_device

    torch_dtype = parse_dtype(dtype) if dtype else None
    target = resolve_device(device)
    first = tuple(input_sizes[0]) if input_sizes else None
    sample = first[1:] if first is not None and len(first) == 4 else first
    if progress is not None:
        progress("building the model")
    image_size = in_channels = None
    if sample is not None and spec in BUILTIN_MODELS:
        _require_image_shape(sample, spec)
    if sample is not None and len(sample) == 3:
        in_channels, image_size = sample[0], sample[1:]
    loaded = resolve_model(
        spec,
        num_classes=num_classes,
        weights=weights,
        trust=trust,
        image_size=image_size,
        in_channels=in_channels,
        new_head=True,  # `--num-classes` shows the model as it would be fine-tuned
    )
    if not input_sizes:
        if loaded.sample_shape is None:
            raise UsageError(
                f"the input size of {loaded.arch} is not known", "pass --input-size, e.g. 3,224,224"
            )
        input_sizes = [loaded.sample_shape]
    shapes = full_shapes(input_sizes, batch_size, image_model=loaded.image_model)
    model: Any = loaded.model
    del loaded
    if torch_dtype is not None and torch_dtype.is_floating_point:
        model = model.to(torch_dtype)
    model = model.to(target)
    return summarize(model, shapes, dtype=torch_dtype, count_flops=count_flops, progress=progress)


def _require_image_shape(shape: Sequence[int], name: str) -> None:
    if len(shape) != 3:
        raise UsageError(
            f"{name} takes images: give the input size as C,H,W (or N,C,H,W), not "
            f"{','.join(map(str, shape))}"
        )
