"""The state of a run once it is set up (`setup.prepare_state`): what it trains with, and what
changes as it goes (the history, the best epoch, the sums of the epoch in progress)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from torchkit.core.data.preprocessing import Preprocess
from torchkit.core.models.usercode import imported_from, is_callable_spec
from torchkit.core.train.checkpoints import build_checkpoint
from torchkit.core.train.config import TrainConfig
from torchkit.core.train.epoch_starts import EpochStarts
from torchkit.core.train.loaders import Loaders, TrainData
from torchkit.core.train.loop import EpochProgress, StepContext, UnreadableImages


class Amp(NamedTuple):
    """--amp: the autocast context factory, the GradScaler (float16 only) and the dtype's name
    ("float32" without --amp)."""

    autocast: Callable[[], Any]
    scaler: Any
    dtype: str


@dataclass
class TrainState:
    config: TrainConfig  # the run's options, `--decode auto` resolved
    data: TrainData
    classes: list[str]
    class_weights: list[float] | None
    arch: str
    preprocess: Preprocess
    model: Any  # the plain nn.Module (step_ctx.model is what forward() is called on)
    parameters: int
    loaders: Loaders
    epoch_starts: EpochStarts  # the train loader's epochs, the first perhaps started early
    drop_last: bool  # the train loader leaves out each epoch's last partial batch
    amp: Amp
    groups: list  # the optimiser's parameter groups
    optimizer: Any
    schedule: Any  # optim.LRSchedule
    ema: Any  # ema.ModelEMA or None
    step_ctx: StepContext
    unreadable: UnreadableImages
    resumed_from: Path | None = None
    start_epoch: int = 0  # epochs completed before this invocation
    best_metric: float | None = None
    best_epoch: int | None = None
    history: list[dict] = field(default_factory=list)  # metrics.csv's rows
    # The splits ("validation", "test") whose masked true classes were warned of: once a run.
    masked_warned: set[str] = field(default_factory=set)
    progress: EpochProgress = field(default_factory=EpochProgress)  # of the epoch in progress
    resume_rng: Any = None  # this rank's random state inside the resumed epoch (None: seed)
    resumed_stopped_early: bool = False  # the saved run stopped before its own --epochs
    # Where prepare_state's time went, (what, seconds) in order (`train -v`'s last line).
    setup_split: list[tuple[str, float]] = field(default_factory=list)

    @property
    def steps_per_epoch(self) -> int:
        return len(self.loaders.train)

    @property
    def resumed_name(self) -> str | None:
        return str(self.resumed_from) if self.resumed_from else None

    @property
    def watched(self) -> str:
        """The prefix of the validation columns that pick best.pt: the EMA weights' when --ema
        is on (as timm does: the average is the model one keeps), the model's otherwise."""
        return "val_ema_" if self.config.ema else "val_"

    def watched_value(self, row: dict, name: str) -> float | None:
        """`name` ("top1", "top5", "loss") of the watched weights in a metrics row (a run
        resumed with --ema turned on has earlier rows without the EMA columns)."""
        return row.get(self.watched + name, row.get(f"val_{name}"))

    def best_by_ema(self) -> bool:
        """Whether the best epoch was ranked by its EMA weights' metrics: with --ema, unless
        its row has none (a run resumed with --ema turned on ranked its earlier epochs, and
        reports their figures, by the model's own)."""
        if not self.config.ema:
            return False
        row = next((r for r in self.history if r["epoch"] == self.best_epoch), None)
        return row is None or "val_ema_loss" in row

    def best_value(self, name: str) -> float | None:
        """`name` of the watched weights at the best epoch."""
        for row in self.history:
            if row["epoch"] == self.best_epoch:
                return self.watched_value(row, name)
        return None

    def patience_spent(self, epochs_done: int) -> bool:
        """--early-stop's rule: its N epochs have gone by without a better val metric."""
        early_stop, best = self.config.early_stop, self.best_epoch
        return bool(early_stop) and best is not None and epochs_done - best >= early_stop

    def is_best(self, row: dict) -> bool:
        """Better on --best-metric (higher top-1, or lower loss); a tie goes to the other one
        (small validation sets often tie on top-1)."""
        if self.best_epoch is None:
            return True
        best = next(r for r in self.history if r["epoch"] == self.best_epoch)

        def key(values: dict) -> tuple[float, float]:
            loss = self.watched_value(values, "loss")
            top1 = self.watched_value(values, "top1")
            return (-loss, top1) if self.config.best_metric == "loss" else (top1, -loss)

        return key(row) > key(best)

    def checkpoint(
        self,
        epochs_done: int,
        epoch_progress: dict | None,
        world_size: int,
        rank_states: list | None = None,
        *,
        snapshot: bool = False,
    ) -> dict:
        """A checkpoint of the run (rank 0). `rank_states`: every rank's random state and
        epoch sums, in rank order, for a stop inside an epoch (see `resume.rank_progress`).
        `snapshot`: nothing in it changes as training goes on (see `build_checkpoint`)."""
        checkpoint = build_checkpoint(
            arch=self.arch,
            classes=self.classes,
            model_state=self.model.state_dict(),
            optimizer=self.optimizer,
            schedule=self.schedule,
            scaler=self.amp.scaler,
            ema=self.ema,
            epoch=epochs_done,
            global_step=self.schedule.updates,
            best_metric=self.best_metric,
            best_epoch=self.best_epoch,
            config=self.config.to_dict(),
            preprocess=self.preprocess.to_dict(),
            history=self.history,
            epoch_progress=epoch_progress,
            snapshot=snapshot,
        )
        checkpoint["world_size"] = world_size
        checkpoint["drop_last"] = self.drop_last  # a resumed run batches its epochs alike
        checkpoint["data"] = self.data.record  # what eval --split val needs to find them
        # The folder of a working directory's model code: a resumed run looks there first
        code_folder = imported_from(self.arch) if is_callable_spec(self.arch) else None
        if code_folder is not None:
            checkpoint["model_code_folder"] = code_folder
        if rank_states is not None:
            checkpoint["rank_states"] = rank_states
        return checkpoint
