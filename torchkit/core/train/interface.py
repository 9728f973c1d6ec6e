"""What a caller of `run_training` gives and gets: the progress hooks (`TrainCallbacks`), what
they are told at the start (`RunInfo`) and the outcome (`TrainResult`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from torchkit.core.train.config import TrainConfig
from torchkit.core.train.loop import StepInfo
from torchkit.core.train.outputs import TOPK  # the k of every top-k figure: val_top5...


@dataclass
class RunInfo:
    """Told to `on_start` once everything is loaded, before the first step."""

    out_dir: Path
    device: str
    world_size: int
    model: str
    parameters: int
    trainable: int
    classes: list[str]
    train_size: int
    val_size: int
    test_size: int
    epochs: int
    start_epoch: int  # completed epochs (0 unless resumed)
    steps_per_epoch: int
    resumed_from: str | None
    best_val_top1: float | None  # of the resumed run so far
    config: TrainConfig
    topk: int = TOPK  # the k of the top-k figures (val_top5...), as TrainResult's
    notes: list[str] = field(default_factory=list)  # about the data (a held-out val split...)


class TrainCallbacks:
    """Hooks for a progress display; every method is optional. Called on rank 0 only, except
    `should_stop` and `stop_signal`, which every rank polls: a signal to any rank stops all."""

    def on_start(self, info: RunInfo) -> None: ...

    def on_epoch_start(self, epoch: int, epochs: int, steps: int, done: int) -> None: ...

    def on_step(self, info: StepInfo) -> None: ...

    def on_eval(self, split: str) -> None: ...

    def on_epoch_end(self, row: dict, is_best: bool) -> None: ...

    def should_stop(self) -> bool:
        """Polled after each optimiser update and between epochs: True stops the run (Ctrl-C,
        SIGTERM), saving last.pt when there is a run worth keeping. Under torchrun, the ranks
        agree on it about twice a second (`distributed.StopVote`), so the run stops at the
        same update on every rank, shortly after the request."""
        return False

    def stop_signal(self) -> int:
        """The signal that made `should_stop()` true (signal.SIGINT, signal.SIGTERM), 0 if
        none or unknown: told to every rank (`TrainResult.stop_signal`)."""
        return 0

    def on_train_end(self, stopped: bool) -> None:
        """The training loop is over (`stopped`: on `should_stop()`); the test evaluation of
        best.pt may follow. A stop asked for too late to be seen can end the run here."""


@dataclass
class TrainResult:
    out_dir: Path
    model: str
    data: str
    epochs: int  # epochs completed in total (resumed runs included)
    best_epoch: int | None
    best_val_top1: float | None
    best_val_top5: float | None  # None in outputs with 5 classes or fewer (`core.topk`)
    best_metric: str = "top1"  # what picked best.pt: val "top1" or val "loss"...
    best_by_ema: bool = False  # ...of the EMA weights (--ema) rather than the model's
    test_top1: float | None = None
    test_top5: float | None = None
    test_loss: float | None = None
    train_size: int = 0
    val_size: int = 0
    test_size: int = 0
    test_weights: str | None = None  # which checkpoint's weights the test numbers are of
    topk: int = TOPK  # the k of the *_top5 figures: always 5, as eval's default
    num_classes: int = 0
    suggested_lr: float | None = None  # --find-lr: the range test's suggestion
    lr_find_iterations: int = 0
    lr_find_diverged: bool = False
    test_ema_top1: float | None = None
    last_train_loss: float | None = None
    last_train_top1: float | None = None
    train_seconds: float = 0.0  # this invocation's training + evaluation time
    total_seconds: float = 0.0  # from the call to the return
    images_per_s: float | None = None
    stopped_early: bool = False
    interrupted: bool = False
    # The signal that stopped the run on some rank (0: none or unknown): under torchrun, rank 0
    # may stop because another rank was sent SIGTERM.
    stop_signal: int = 0
    # False when the run stopped (Ctrl-C, SIGTERM) before its first checkpoint with --force
    # over an earlier run: the new run was removed and the earlier one put back.
    kept: bool = True
    skipped_images: int = 0
    resumed_from: str | None = None
    is_main: bool = True
    world_size: int = 1
    images_per_update: int = 0  # --batch-size x world size x --accum-steps
    history: list[dict] = field(default_factory=list)
    config: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The JSON report (and `--format csv`'s row): top-k keys `*_top5` whatever the data,
        null with 5 classes or fewer, as in metrics.csv."""
        from torchkit.core.train.outputs import topk_blanked

        data = dataclasses.asdict(self)
        data["out_dir"] = str(self.out_dir)
        data.pop("is_main")
        data.pop("kept")
        data.pop("stop_signal")
        data = topk_blanked(data, self.num_classes)
        data["history"] = [topk_blanked(row, self.num_classes) for row in self.history]
        return data
