"""Input sizes as the command line gives them, under either name every command takes.

`--input-size` is one sample's shape (summary, benchmark, convert-syncbn: `3,224,224`);
`--image-size` is the side of the square crop a command that reads images makes (`224`). Each
command accepts both names: a shape given where a side is taken names its side by its last two
numbers (equal: torchkit crops squares), a side given where a shape is taken is the model's
channels by that side by that side.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torchkit.core.io.errors import UsageError, short_repr
from torchkit.core.io.option_lists import number_items

# torch counts a tensor's elements in a signed 64-bit integer: no tensor holds more.
MAX_NUMEL = 2**63 - 1


def parse_input_size(text: str, given: str | None = None) -> tuple[int, ...]:
    """'3,224,224', '3x224x224', '3 224 224' or '(1, 3, 224, 224)' -> a tuple of ints
    (`given`: the text as the user wrote it, for the error message)."""
    cleaned = text.strip().strip("()[]")
    text = given if given is not None else text
    try:
        size = tuple(number_items(cleaned, "--input-size", int, separators=",x×", spaces=True))
    except (UsageError, ValueError):  # an empty part as in "3,,4", or not a number
        size = ()
    if not size or any(n <= 0 for n in size):
        raise UsageError(
            f"invalid input size {short_repr(text)}", "give positive integers, e.g. 3,224,224"
        )
    check_numel(size, text)  # before anything (a model built for it, say) is sized by it
    return size


class InputTooLarge(UsageError):
    """A shape of more elements than a tensor holds (`check_numel`)."""


def check_numel(shape: Sequence[int], given: object) -> None:
    """Refuse a shape (`given`: as the user wrote it) with more elements than a tensor holds."""
    numel = math.prod(shape)
    if numel > MAX_NUMEL:
        raise InputTooLarge(
            f"input size {given!r} is too large: {numel:,} values, more than a tensor can hold",
            "give the size of a real input, e.g. 3,224,224",
        )


def parse_image_side(text: str | None, option: str = "--image-size") -> int | None:
    """The crop side `--image-size`/`--input-size` gives: `224`, or a shape whose last two
    numbers are equal (`224,224`, `3,224,224`); None when not given. A ValueError says what
    is wrong with the value (the caller names the option)."""
    if text is None:
        return None
    try:
        size = parse_input_size(text)
    except InputTooLarge:  # it said "not a positive size" of 99999999999999999999
        raise ValueError(
            f"{short_repr(text)} is more pixels than a tensor can hold (give N, or C,N,N)"
        ) from None
    except UsageError:
        raise ValueError(f"{short_repr(text)} is not a positive size (give N, or C,N,N)") from None
    if len(size) > 1 and size[-1] != size[-2]:
        raise ValueError(
            f"{short_repr(text)} is not square: {option} is the side of a square crop "
            "(give N, or C,N,N)"
        )
    if len(size) > 4:
        raise ValueError(f"{short_repr(text)} has {len(size)} dimensions (give N, or C,N,N)")
    return size[-1]


# The channels of the images `train` feeds its model: always RGB.
TRAIN_CHANNELS = 3


def image_shape_channels(text: str | None) -> int | None:
    """The C of an `--image-size`/`--input-size` given as a shape C,N,N; None for N, N,N or
    nothing given."""
    if text is None:
        return None
    size = parse_input_size(text)
    return size[-3] if len(size) >= 3 else None


def check_image_channels(text: str | None, channels: int, fed: str) -> None:
    """Refuse (ValueError) an `--image-size`/`--input-size` C,N,N whose C is not `channels`,
    those of the images `fed` ("train feeds its model", "resnet18 takes") names: the crop side
    alone would be used, the C dropped unread."""
    given = image_shape_channels(text)
    if given is not None and given != channels:
        raise ValueError(
            f"{short_repr(text)} is a {given}-channel shape, and {fed} {channels}-channel"
            f"{' (RGB)' if channels == 3 else ''} images (give N, or {channels},N,N)"
        )


def parse_rgb_image_side(text: str | None, option: str = "--image-size") -> int | None:
    """`parse_image_side` for `train`, which feeds its model 3-channel (RGB) images: a shape
    whose channels are not 3 (`1,28,28`) is refused, where they were dropped unread."""
    side = parse_image_side(text, option)
    if side is not None:
        check_image_channels(text, TRAIN_CHANNELS, "train feeds its model")
    return side


def square_sample(known: Sequence[int] | None, side: int) -> tuple[int, int, int]:
    """One sample of `side` x `side` with the channels of the sample the model is known to take
    (`known`, C,H,W), 3 when it is not known."""
    channels = int(known[0]) if known is not None and len(known) == 3 else 3
    return (channels, side, side)
