"""Checkpoint averaging (timm's `avg_checkpoints.py`): the mean of the weights of several
checkpoints of one model, a cheap accuracy gain from the last or best few epochs.

Floating-point tensors are averaged in float64 (complex ones in complex128) and cast back to
their dtype (the widest one where the checkpoints differ: float16 and float32 give float32); a
tensor that is floating point in one checkpoint and integer (or complex, or boolean) in another
is refused. Integer tensors (BatchNorm's `num_batches_tracked`) are taken from the last
checkpoint. Keys and shapes must match exactly, and torchkit checkpoints' class names (in
order). A checkpoint holding a NaN or infinite value (a
diverged epoch) is refused, naming the file and the tensor: its average is NaN too;
`allow_nonfinite` averages it anyway.
From torchkit checkpoints the result is a torchkit checkpoint (the last one's
architecture, classes and preprocessing, without optimiser state: it evaluates, predicts and
exports like any other, but does not resume); from plain state dicts, a plain state dict.
A .safetensors destination holds the averaged state dict alone (as `convert checkpoint`
writes one).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torchkit.core.io.errors import CheckpointError, UsageError

log = logging.getLogger("torchkit")

# What an averaged checkpoint keeps of the last input: what eval, predict and export read.
KEPT_KEYS = (
    "format_version",
    "torchkit_version",
    "arch",
    "num_classes",
    "classes",
    "preprocess",
    "config",
    "data",
    "epoch",
)


def is_averaged(tensor: Any) -> bool:
    """Whether `tensor` is averaged: floating point or complex (integers and booleans are
    counts and flags, taken from the last checkpoint)."""
    return tensor.is_floating_point() or tensor.is_complex()


def tensor_kind(tensor: Any) -> str:
    """What `tensor` holds: "complex", "floating point", "boolean" or "integer" values; the
    checkpoints averaged must agree on it for every key."""
    if tensor.is_complex():
        return "complex"
    if tensor.is_floating_point():
        return "floating point"
    return "boolean" if str(tensor.dtype) == "torch.bool" else "integer"


def first_nonfinite(state: Mapping[str, Any]) -> str | None:
    """The key of the first averaged tensor of `state` holding a NaN or an infinity."""
    import torch

    for key, tensor in state.items():
        floating = isinstance(tensor, torch.Tensor) and is_averaged(tensor)
        if floating and not bool(torch.isfinite(tensor).all()):
            return str(key)
    return None


def average_state_dicts(
    states: Sequence[Mapping[str, Any]], names: Sequence[str], *, allow_nonfinite: bool = False
) -> dict:
    """The element-wise mean of `states` (see the module doc)."""
    import torch

    if len(states) < 2:
        raise UsageError("averaging needs at least two checkpoints")
    if not allow_nonfinite:
        for state, name in zip(states, names, strict=True):
            key = first_nonfinite(state)
            if key is not None:
                raise CheckpointError(
                    f"{name} holds a non-finite value (NaN or infinite) in {key!r}: its average "
                    "would not be finite either",
                    "leave out checkpoints of a diverged run, or pass --allow-nonfinite",
                )
    first_keys = list(states[0])
    for state, name in zip(states[1:], names[1:], strict=True):
        if list(state) != first_keys and set(state) != set(first_keys):
            extra = sorted(set(state) - set(first_keys)) or sorted(set(first_keys) - set(state))
            raise CheckpointError(
                f"{name} does not hold the same model as {names[0]}: key {extra[0]!r} differs",
                "average checkpoints of one training run, or of one architecture",
            )
    averaged = {}
    last = states[-1]
    for key in first_keys:
        tensors = [state[key] for state in states]
        shapes = {tuple(t.shape) for t in tensors}
        if len(shapes) > 1:
            raise CheckpointError(
                f"{key} has different shapes in the checkpoints: "
                + ", ".join("x".join(map(str, s)) or "scalar" for s in sorted(shapes)),
                "average checkpoints of one model",
            )
        kinds = {tensor_kind(t) for t in tensors}
        if len(kinds) > 1:
            raise CheckpointError(
                f"{key} has different kinds of values in the checkpoints: "
                + ", ".join(
                    f"{name}: {str(t.dtype).removeprefix('torch.')}"
                    for name, t in zip(names, tensors, strict=True)
                ),
                "average checkpoints of one model, saved with one dtype",
            )
        if is_averaged(tensors[0]):
            wide = torch.complex128 if tensors[0].is_complex() else torch.float64
            total = torch.zeros(tensors[0].shape, dtype=wide)
            for tensor in tensors:
                total += tensor.to(wide)
            # Mixed precisions (float16 in one file, float32 in another) keep the widest.
            dtype = tensors[0].dtype
            for tensor in tensors[1:]:
                dtype = torch.promote_types(dtype, tensor.dtype)
            averaged[key] = (total / len(tensors)).to(dtype)
        else:
            averaged[key] = last[key].clone()
    return averaged


def average_checkpoints(
    paths: Sequence[str | os.PathLike],
    *,
    allow_nonfinite: bool = False,
    trust_checkpoint: bool = False,
) -> dict:
    """Load `paths` (weights only unless `trust_checkpoint`) and average them (non-finite
    values refused unless `allow_nonfinite`)."""
    from torchkit.core.models.checkpoint import extract_state_dict, is_torchkit_checkpoint
    from torchkit.core.models.weights import read_model_file

    if len(paths) < 2:
        raise UsageError("averaging needs at least two checkpoints", "give two or more")
    # One file under two names, through a symlink or a hard link (`cp -l`, a best.pt linked to
    # its epoch's file): counted twice, it weighed twice in the mean.
    files: dict[Any, str | os.PathLike] = {}
    for path in paths:
        identity = _file_identity(path)
        if identity in files:
            first = files[identity]
            named = (
                path if os.fspath(first) == os.fspath(path) else f"{first} and {path} are one file"
            )
            raise UsageError(
                f"a checkpoint is given twice: {named}", "each one counts once in the mean"
            )
        files[identity] = path
    loaded = [read_model_file(path, trust_checkpoint=trust_checkpoint) for path in paths]
    torchkit = [is_torchkit_checkpoint(item) for item in loaded]
    if any(torchkit) and not all(torchkit):
        raise CheckpointError(
            "torchkit checkpoints and plain state dicts are mixed",
            "average files of one kind",
        )
    names = [str(p) for p in paths]
    states = []
    for name, item in zip(names, loaded, strict=True):
        try:
            states.append(extract_state_dict(item))
        except CheckpointError as error:  # which of the checkpoints it is
            raise CheckpointError(f"{name}: {error.message}", error.hint) from error
    if all(torchkit):
        archs = {str(item.get("arch")) for item in loaded}
        if len(archs) > 1:
            raise CheckpointError(
                f"the checkpoints hold different architectures: {', '.join(sorted(archs))}"
            )
        _refuse_other_classes(loaded, names)
    averaged = average_state_dicts(states, names, allow_nonfinite=allow_nonfinite)
    if not all(torchkit):
        return averaged
    result = {key: loaded[-1][key] for key in KEPT_KEYS if key in loaded[-1]}
    result["model"] = averaged
    result["averaged_from"] = [Path(p).name for p in paths]
    return result


def _file_identity(path: str | os.PathLike) -> Any:
    """What tells one file from another, whatever its name: its device and inode (its real path
    where it cannot be read, said by the loader)."""
    try:
        info = os.stat(path)
    except OSError:
        return os.path.realpath(path)
    return (info.st_dev, info.st_ino)


def _refuse_other_classes(loaded: Sequence[Mapping[str, Any]], names: Sequence[str]) -> None:
    """CheckpointError where two torchkit checkpoints name their outputs otherwise (another
    order, other classes): of one shape, their weights averaged output by output mix classes,
    a model that names its outputs by the last one's classes without a word."""
    from torchkit.core.models.stored_classes import stored_class_names

    first = stored_class_names(loaded[0].get("classes"), f"checkpoint {names[0]}", CheckpointError)
    for item, name in zip(loaded[1:], names[1:], strict=True):
        classes = stored_class_names(item.get("classes"), f"checkpoint {name}", CheckpointError)
        if classes != first:
            raise CheckpointError(
                f"checkpoints {names[0]} and {name} name their outputs otherwise "
                f"({_difference(first, classes)}): averaged, outputs would mix classes",
                "average checkpoints of one run, or of runs on the same classes in one order",
            )


def _difference(first: list[str] | None, other: list[str] | None) -> str:
    """Where two lists of class names differ first, for the error line."""
    if first is None or other is None:
        return "one records no class names"
    if len(first) != len(other):
        return f"{len(first)} and {len(other)} classes"
    index = next(i for i, (a, b) in enumerate(zip(first, other, strict=True)) if a != b)
    return f"output {index} is {first[index]!r} in one, {other[index]!r} in the other"


def write_average(
    sources: Sequence[str | os.PathLike],
    destination: str | os.PathLike,
    *,
    force: bool = False,
    allow_nonfinite: bool = False,
    trust_checkpoint: bool = False,
    to: str | None = None,
) -> dict[str, Any]:
    """Average `sources` into `destination` (checked before any work: not one of the sources,
    --force to replace; written atomically; nothing written when a source holds a NaN or an
    infinity, unless `allow_nonfinite`; `to`: "pt" for a name without an extension, such as
    /dev/stdout). Returns the report."""
    from torchkit.core.convert.checkpoint import (
        OUTPUT_EXTENSIONS,
        output_extension,
        write_safetensors,
    )
    from torchkit.core.io.claims import reporting_write_errors
    from torchkit.core.io.file_outputs import check_output_file
    from torchkit.core.io.files import require_input
    from torchkit.core.io.overlap import InputPath
    from torchkit.core.models.checkpoint import save_checkpoint

    checked = [require_input(path, what="checkpoint", kind="file") for path in sources]
    target = Path(destination)
    extension = output_extension(
        target, to, OUTPUT_EXTENSIONS, ".safetensors for the weights alone, or .pt"
    )
    check_output_file(target, force, [InputPath.of(path, "checkpoint") for path in checked])
    averaged = average_checkpoints(
        checked, allow_nonfinite=allow_nonfinite, trust_checkpoint=trust_checkpoint
    )
    state = averaged.get("model", averaged)
    if extension == ".safetensors":  # the weights alone, as a single conversion writes them
        if "model" in averaged:
            log.warning(
                f"{target.name} holds the averaged weights only: the checkpoints' classes and "
                "preprocessing are left out (write .pt to keep them)"
            )
        state = {name: tensor.contiguous() for name, tensor in state.items()}
        write_safetensors(state, target)
        kind = "state dict"
    else:
        with reporting_write_errors(target):
            save_checkpoint(averaged, target)
        kind = "torchkit checkpoint" if "model" in averaged else "state dict"
    return {
        "sources": [str(path) for path in checked],
        "destination": str(target),
        "kind": kind,
        "checkpoints": len(checked),
        "tensors": len(state),
        "values": sum(int(t.numel()) for t in state.values()),
        "averaged_tensors": sum(1 for t in state.values() if is_averaged(t)),
    }
