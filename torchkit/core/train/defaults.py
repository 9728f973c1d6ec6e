"""The defaults of `torchkit train`'s options that are tables rather than one value: the ones
chosen from the data (`validation.resolve_defaults` fills them), each decaying scheduler's factor,
and the values of options that recorded runs predate.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The default decay factor of each scheduler that decays by a factor.
DEFAULT_GAMMA = {"step": 0.1, "multistep": 0.1, "exponential": 0.95, "plateau": 0.1}

# Defaults that depend on the data (see `resolve_defaults`).
DIGITS_DEFAULTS: dict[str, Any] = {
    "model": "convnet",
    # The 8x8 digits upsampled 1.5x: the convnet's two 3x3 convolutions need room. The size,
    # batch size and epochs were chosen over seeds 0-7 (README, Performance): 12 px with
    # batches of 32 for 25 epochs is at least as accurate as 16 px, 64, 20 epochs, and faster.
    "image_size": 12,
    "batch_size": 32,
    "epochs": 25,
    "channels_last": True,  # about 15% faster convolutions on CPUs for this convnet
    "flip": False,  # mirrored digits are other symbols
    "crop_scale": (0.85, 1.0),  # RandomResizedCrop's 8% would cut most of the stroke away
    # 180 validation images: top-1 moves in steps of 0.56% and saturates within a few epochs,
    # so it would keep an early, lucky checkpoint; the continuous val loss keeps improving.
    "best_metric": "loss",
    # ...and the val loss of one model's weights still jumps from epoch to epoch at 180 images:
    # the weight average is steadier, so it picks best.pt (measured over 8 seeds: test errors
    # of best.pt 1-2 of 179 with it, up to 3 without).
    "ema": True,
    # One CPU thread: the convnet's operations take microseconds, and two threads meet at a
    # barrier after each. Alone on 2 cores two threads are 20% faster; beside any other busy
    # process one of them waits for the scheduler at every barrier, and a 5 ms step took
    # 50-300 ms (2-core, docs/performance.md). One thread also computes the same numbers on
    # every machine, whatever its core count.
    "threads": 1,
}
FOLDER_DEFAULTS: dict[str, Any] = {
    "model": "resnet18",
    "image_size": 224,
    "batch_size": 64,
    "epochs": 20,
    "channels_last": False,
    "flip": True,
    "crop_scale": (0.08, 1.0),
    "best_metric": "top1",
    "ema": False,
    # None: the cores the loader workers leave free (core.runtime.threads), as eval and predict
    "threads": None,
}


def data_default_help(name: str) -> str:
    """'Default: X for digits, Y for image folders.' of an option whose default depends on the
    data, for its help text."""

    def shown(value: Any) -> str:
        if isinstance(value, bool):
            return "on" if value else "off"
        if isinstance(value, tuple):
            return ",".join(f"{v:g}" for v in value)
        return str(value)

    digits, folders = shown(DIGITS_DEFAULTS[name]), shown(FOLDER_DEFAULTS[name])
    return f"Default: {digits} for digits, {folders} for image folders."


# Options added after runs were already being recorded, with the value those runs trained with
# where it is not today's default: a recorded run's options (a checkpoint's, a config.json's)
# without the key get this value, so resuming or replaying an old run repeats it exactly.
BEFORE_THE_OPTION_EXISTED: dict[str, Any] = {"decode": "exact", "threads": 0, "crop_mode": "center"}


def with_pre_option_values(recorded: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded run's options, with the values of options it predates filled in."""
    return {**BEFORE_THE_OPTION_EXISTED, **recorded}
