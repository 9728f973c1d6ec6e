"""The one refusal of an image size a model cannot run at (a network too deep or too strided for
small images fails deep inside with torch's shape error): every command that runs a model names
the smallest square side it takes. The search runs on a meta-device copy (no compute, the model
itself never called) and only after the model has failed, so a run that works pays nothing."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torchkit.core.io.errors import InputError, TorchkitError, UsageError, first_line

# The largest side the search tries: a model the meta device cannot run at it either fails on
# small images for another reason (a classifier sized for one input, the wrong channels), or
# cannot run on the meta device at all, and is not judged here.
LARGEST_SIDE_TRIED = 256


class ImageSizeError(UsageError):
    """A model that cannot run at the images' size; the hint names the smallest it takes, as
    --image-size, or (`for_input_size`) as the -i C,H,W of a command whose input came from -i,
    which --image-size would contradict (summary, benchmark, convert-syncbn)."""

    smallest: int | None = None
    channels: int = 3
    more: str = ""  # what the hint says after the size

    def for_input_size(self, batch: int | None = None) -> ImageSizeError:
        """The refusal hinting -i C,N,N, or with `batch` (summary's --no-batch-dim, whose -i
        gives the batch first) -i B,C,N,N."""
        if self.smallest is None:
            return self
        side, channels = self.smallest, self.channels
        size = f"{channels},{side},{side}" if batch is None else f"{batch},{channels},{side},{side}"
        refusal = ImageSizeError(self.message, _smallest_hint(side, f"-i {size}") + self.more)
        refusal.smallest, refusal.channels, refusal.more = side, channels, self.more
        return refusal


def _smallest_hint(smallest: int, size: str) -> str:
    return f"the smallest it takes is {smallest}: use {size} or larger"


def image_size_refusal(
    model: Any,
    name: str,
    shape: Sequence[int],
    error: BaseException,
    *,
    dtype: Any = None,
    doing: str = "run on",
    training: bool = False,
) -> ImageSizeError | None:
    """The one-line refusal for `model` (called `name`), which failed (`error`) on a batch of
    `shape` (N, C, H, W; `dtype`, float32 when None), naming the smallest side it takes (in
    training mode with `training`: GoogLeNet's and Inception's auxiliary heads take larger
    images, at the batch of `shape`); None when that is not why it failed, or the batch is not
    one of square images."""
    import torch

    if not isinstance(error, RuntimeError) or isinstance(error, torch.OutOfMemoryError):
        return None
    if len(shape) != 4 or shape[-1] != shape[-2]:
        return None
    given, channels, _, side = (int(n) for n in shape)
    # In training mode at a batch of 2 at least: BatchNorm there needs more than one value per
    # channel, which a batch of one 1x1 map (Inception's auxiliary head) lacks at any size.
    batch = max(given, 2) if training else 1
    runs = meta_runner(model, channels, dtype=dtype, training=training, batch=batch)
    smallest = smallest_running_side(runs, side, training=training)
    if smallest is None:
        return None
    more = ""
    if batch > given and not runs(smallest, given):  # else the batch's refusal would come next
        more = (
            ", with --batch-size 2 or more; BatchNorm in training mode needs more than one "
            "value per channel"
        )
    refusal = ImageSizeError(
        f"{name} cannot {doing} {side}x{side} images: {first_line(error)}",
        _smallest_hint(smallest, f"--image-size {smallest}") + more,
    )
    refusal.smallest, refusal.channels, refusal.more = smallest, channels, more
    return refusal


def one_value_per_channel(error: BaseException) -> bool:
    """BatchNorm's refusal to train on a single value per channel: a batch of 1 whose feature
    map is 1x1 there (resnet18 at 32 px, Inception's auxiliary head at any size), which a
    larger batch trains on."""
    return "Expected more than 1 value per channel when training" in str(error)


def first_batch_error(
    model: Any,
    name: str,
    images: Any,
    error: BaseException,
    *,
    trained: tuple[int, ...] | None = None,
) -> TorchkitError:
    """What a model's RuntimeError on its first batch of `images` (N, C, H, W) is reported as:
    the refusal above when the images are too small for it, else that it fails at this size (a
    fixed-size network, a classifier sized for the images it was trained on, given another
    --image-size). `trained`: the input a checkpoint's model was trained on
    (`trained_input`), which the hint then names."""
    refusal = image_size_refusal(model, name, images.shape, error, dtype=images.dtype)
    if refusal is not None:
        return refusal
    size = "x".join(map(str, images.shape[-2:]))
    return InputError(
        f"{name} fails on {size} images: {first_line(error)}",
        trained_size_hint(trained, images.shape)
        or "check --image-size: it must be a size this model accepts",
    )


def trained_input(resolved: Any) -> tuple[int, ...] | None:
    """The input (C, H, W) a torchkit checkpoint's model (a resolved model spec) was trained on,
    where it is square, as --image-size gives it; None for any other model, whose size no file
    records."""
    shape = resolved.sample_shape
    if resolved.checkpoint is None or shape is None or len(shape) != 3 or shape[1] != shape[2]:
        return None
    return tuple(int(n) for n in shape)


def trained_size_hint(
    trained: tuple[int, ...] | None, shape: Sequence[int], *, input_size: bool = False
) -> str | None:
    """For a model that fails on inputs of `shape` (..., C, H, W) other than the `trained` one
    (`trained_input`): the size to give, as --image-size, or as -i where the input was given
    so (`input_size`); None where there is none to name."""
    if trained is None or tuple(int(n) for n in shape[-3:]) == tuple(trained):
        return None
    if input_size:
        given = ",".join(map(str, trained))
        return f"it was trained on {given} inputs: give -i {given}, or leave out --input-size"
    side = trained[1]
    return f"it was trained on {side}x{side} images: give --image-size {side}, or leave it out"


def smallest_side(
    model: Any,
    channels: int,
    side: int,
    *,
    dtype: Any = None,
    training: bool = False,
    batch: int = 1,
) -> int | None:
    """The smallest square side above `side` at which `model` (in eval mode, or training mode
    with `training`, on batches of `batch`) runs, when it does not run at `side` but does at
    `LARGEST_SIDE_TRIED` (twice that in training mode); None otherwise (it runs at `side`, fails
    at every size, or cannot be copied to the meta device)."""
    runs = meta_runner(model, channels, dtype=dtype, training=training, batch=batch)
    return smallest_running_side(runs, side, training=training)


def smallest_running_side(
    runs: Callable[..., bool] | None, side: int, *, training: bool = False
) -> int | None:
    """`smallest_side`, asked of a `meta_runner`'s function `runs` (made for `training`), for
    a caller that asks it other questions too: the model is copied once."""
    if runs is None:
        return None
    # Training mode runs auxiliary heads built for the size the model was made for (Inception
    # v3's 299 px): tried up to twice as far.
    largest = 2 * LARGEST_SIDE_TRIED if training else LARGEST_SIDE_TRIED
    if side >= largest or runs(side) or not runs(largest):
        return None
    low, high = side, largest  # fails at low, runs at high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if runs(middle) else (middle, high)
    return high


def meta_runner(
    model: Any, channels: int, *, dtype: Any = None, training: bool = False, batch: int = 1
) -> Callable[..., bool] | None:
    """A function of a square side that says whether `model` (a meta-device copy in eval mode,
    or training mode with `training`: no compute) runs on `batch` images of that side, or on
    as many as its second argument says (one copy asked of both); None when the model cannot
    be copied to the meta device (and is not judged). Copy and passes run as summary's do
    (`plain_shapes`, `without_dynamo`): the meta kernels would import sympy, and torch._refs'
    references torch._dynamo, 2-5 s of a command's start; the answers are the same for plain
    sizes."""
    import torch

    from torchkit.core.runtime.plain_shapes import plain_shapes
    from torchkit.torchvision_without_dynamo import without_dynamo

    # Inference mode (eval, predict) would make the copy's parameters inference tensors.
    with torch.inference_mode(False), without_dynamo(), plain_shapes():
        try:
            copy = meta_copy(model).train(training)
        except Exception:  # noqa: BLE001 - a model that cannot be copied is not judged here
            return None

    def runs(n: int, images: int = batch) -> bool:
        with torch.inference_mode(False), torch.no_grad(), without_dynamo(), plain_shapes():
            try:
                copy(torch.empty(images, channels, n, n, device="meta", dtype=dtype))
            except Exception:  # noqa: BLE001 - whatever the reason, not this side
                return False
        return True

    return runs


def meta_copy(model: Any) -> Any:
    """A copy of `model` whose parameters, buffers and tensor attributes live on the meta
    device: same structure, same shapes, dtypes and requires_grad flags, no memory and no
    compute. Tied parameters stay tied (one meta tensor per original tensor)."""
    import copy

    import torch

    memo: dict[int, Any] = {}
    groups = _process_group_type()
    for module in model.modules():
        for value in (
            *module._parameters.values(),
            *module._buffers.values(),
            *vars(module).values(),
        ):
            if isinstance(value, torch.Tensor) and id(value) not in memo:
                memo[id(value)] = _to_meta(value)
            elif groups is not None and isinstance(value, groups):
                # A SyncBatchNorm's process group cannot be copied ("cannot pickle
                # ProcessGroup"): the copy shares it, as it computes nothing with it.
                memo[id(value)] = value
    return copy.deepcopy(model, memo)


def _process_group_type() -> type | None:
    """torch.distributed's ProcessGroup; None where torch is built without distributed."""
    import torch

    if not torch.distributed.is_available():
        return None
    from torch.distributed import ProcessGroup

    return ProcessGroup


def _to_meta(tensor: Any) -> Any:
    import torch
    from torch.nn.parameter import UninitializedBuffer, UninitializedParameter

    # A lazy module's placeholders stay placeholders: the copy materialises them on meta.
    if isinstance(tensor, UninitializedParameter):
        return UninitializedParameter(tensor.requires_grad, device="meta", dtype=tensor.dtype)
    if isinstance(tensor, UninitializedBuffer):
        return UninitializedBuffer(tensor.requires_grad, device="meta", dtype=tensor.dtype)
    # A meta tensor's empty_like runs torch's Python reference, whose stride helpers import
    # sympy (2-5 s of CPU); clone's meta kernel is C++ and lays the copy out the same way.
    meta = tensor.detach().clone() if tensor.is_meta else torch.empty_like(tensor, device="meta")
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(meta, requires_grad=tensor.requires_grad)
    return meta
