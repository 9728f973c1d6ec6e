"""`torchkit train` as a library: `run_training(TrainConfig(...), callbacks) -> TrainResult`.

Modules: config (the options), loaders (data), optim (param groups, optimiser, lr schedule),
mixing (mixup/cutmix), ema, loop (train/eval passes), checkpoints, outputs (config.json,
metrics.csv, curves.png, TensorBoard), distributed (torchrun/DDP) and runner (the whole run).
Nothing here imports torch at module level.
"""

from torchkit.core.train.config import TrainConfig
from torchkit.core.train.runner import RunInfo, TrainCallbacks, TrainResult, run_training

__all__ = ["RunInfo", "TrainCallbacks", "TrainConfig", "TrainResult", "run_training"]
