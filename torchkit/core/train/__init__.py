"""`torchkit train` as a library: `run_training(TrainConfig(...), callbacks) -> TrainResult`.

Modules: config (the options), loaders (data), optim (param groups, optimiser, lr schedule),
mixing (mixup/cutmix), ema, loop (train/eval passes), checkpoints, outputs (config.json,
metrics.csv, curves.png, TensorBoard), ddp (DDP training under torchrun; the process group is
`torchkit.core.runtime.distributed`), setup, state and resume (a run's state, new or resumed),
run_folder (the output folder), epochs (the epoch loop) and runner (the whole run).
Nothing here imports torch at module level.
"""

from typing import Any

from torchkit.core.train.config import TrainConfig

_FROM_RUNNER = ("RunInfo", "TrainCallbacks", "TrainResult", "run_training")


def __getattr__(name: str) -> Any:
    # The CLI imports TrainConfig for its defaults on every start (even `--help`): the runner
    # and everything it imports load only when a run is wanted.
    if name in _FROM_RUNNER:
        from torchkit.core.train import runner

        return getattr(runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["RunInfo", "TrainCallbacks", "TrainConfig", "TrainResult", "run_training"]
