"""What a run writes besides checkpoints: config.json, metrics.csv, curves.png, TensorBoard
(and split.csv: `core.datasource.write_split_csv`).

Every file is rewritten whole and atomically after each epoch from the history kept in the
checkpoint, so a resumed run (even one killed half-way through writing) shows exactly the epochs
its checkpoint has.
"""

from __future__ import annotations

import contextlib
import math
import platform
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchkit import __version__
from torchkit.core.data.sources.record import SPLIT_CSV_COLUMNS
from torchkit.core.io.claims import reporting_write_errors
from torchkit.core.io.csv_rows import csv_text
from torchkit.core.io.files import atomic_path, atomic_write_json, atomic_write_text
from torchkit.core.io.folder_contents import proven
from torchkit.core.io.force import holds_json_record
from torchkit.core.io.non_utf8_names import holds_non_utf8, name_native_code_opens
from torchkit.core.io.output_proofs import (
    PNG_METADATA,
    any_of,
    csv_header,
    drawn_with,
    is_chrome_trace,
    is_tensorboard_events,
    text_start,
    torchkit_png,
)
from torchkit.core.topk import DEFAULT_TOPK as TOPK
from torchkit.core.topk import topk_informative, topk_name
from torchkit.core.train.checkpoint_record import is_torchkit_checkpoint_file

TOPK_SUFFIX = "_" + topk_name(TOPK)  # val_top5, val_ema_top5, best_val_top5, test_top5

LR_FIND_COLUMNS = ("lr", "loss", "smoothed_loss")  # lr_find.csv's header
METRIC_COLUMNS = (
    "epoch",
    "train_loss",
    "train_top1",
    "val_loss",
    "val_top1",
    "val_top5",
    "lr",
    "epoch_time_s",
    "images_per_s",
)
EMA_COLUMNS = ("val_ema_loss", "val_ema_top1", "val_ema_top5")
L1_COLUMN = "train_l1"  # with --l1: its penalty's mean, which train_loss leaves out
# With a model that gives an image's true class a -inf logit (it masks the class): how many
# validation images the validation losses leave out (their loss is infinite).
MASKED_COLUMNS = ("val_masked", "val_ema_masked")

# What a run folder holds (shell patterns, top-level names): a folder holding only these, and
# the config.json every run writes first, is a torchkit run even without the `.torchkit` marker
# (runs made before it existed), so --force may replace it. The last two are the temporaries of
# atomic writes that a killed run leaves.
RUN_FILES = (
    "config.json",
    "split.csv",
    "metrics.csv",
    "curves.png",
    "lr_find.csv",
    "lr_find.png",
    "last.pt",
    "best.pt",
    "epoch-[0-9][0-9][0-9]*.pt",
    "tensorboard",
    ".*.tmp",
    ".*.tmp.*",
)


# The keys of the config.json of every run, old or new.
CONFIG_KEYS = ("options", "arch", "classes", "preprocess")


def _is_run_config(path: Path) -> bool:
    return holds_json_record(path, CONFIG_KEYS)


# metrics.csv as every run wrote it: its header begins with these columns
_is_run_metrics = text_start(b"epoch,train_loss")
# How every --profile-steps table and GPU timeline begins (`step_profiler`): their proof.
PROFILE_HEADING = "torchkit train --profile-steps: epoch "


# Everything a run writes into its folder (`folder_contents` patterns): `--force` replaces a run
# folder that holds nothing else (a notes.txt of yours, an `extra/best.pt`, refused first). Its
# checkpoints, records, CSVs and plots only where torchkit can show it wrote them (names other
# trainers and loggers use too: `ProvenPattern`): a file of yours under one is refused.
_LR_FIND_CSV = csv_header(LR_FIND_COLUMNS)
_PROOFS = {
    "last.pt": is_torchkit_checkpoint_file,
    "best.pt": is_torchkit_checkpoint_file,
    "epoch-[0-9][0-9][0-9]*.pt": is_torchkit_checkpoint_file,
    "config.json": _is_run_config,
    "metrics.csv": _is_run_metrics,
    "split.csv": csv_header(SPLIT_CSV_COLUMNS),
    "lr_find.csv": _LR_FIND_CSV,
    # drawn before the Software text: curves_figure's 15x4 or 10x4 inches, lr_find's 6x4, or
    # (cropped by a matplotlibrc's savefig.bbox: tight) Matplotlib's no larger, drawn with the
    # CSV it plots (0.1 inch of padding on each side: 20 pixels)
    "curves.png": any_of(
        torchkit_png(legacy_sizes={(1500, 400), (1000, 400)}),
        drawn_with({"metrics.csv": _is_run_metrics}, at_most=(1520, 420)),
    ),
    "lr_find.png": any_of(
        torchkit_png(legacy_sizes={(600, 400)}),
        drawn_with({"lr_find.csv": _LR_FIND_CSV}, at_most=(620, 420)),
    ),
}
RUN_OUTPUTS = (
    *(
        proven(p, _PROOFS[p]) if p in _PROOFS else p
        for p in RUN_FILES
        if p != "tensorboard" and not p.startswith(".")
    ),
    proven("tensorboard/events.out.tfevents.*", is_tensorboard_events),
    # --profile-steps: `step_profiler`'s table and GPU timeline (its heading), Kineto's trace
    proven("profile/epoch-*.txt", text_start(PROFILE_HEADING.encode())),
    proven("profile/epoch-*.json", is_chrome_trace),
)


# What a run writes before its first checkpoint: a run folder holding only these (with the
# marker and temporaries), each recorded in the marker as the run's (`noting_started`), is a run
# killed before it saved anything, started again without --force (`OutputFolder`'s start_files).
START_FILES = (
    "config.json",
    "split.csv",
    proven("tensorboard/events.out.tfevents.*", is_tensorboard_events),
)


def old_run_files(folder: Path) -> tuple[str, ...]:
    """RUN_FILES where `folder` holds a run's config.json, else nothing: a folder without the
    marker is an earlier run's only by its record, never by names another trainer uses too
    (a `best.pt` and `last.pt` of its own)."""
    return RUN_FILES if holds_json_record(folder / "config.json", CONFIG_KEYS) else ()


def is_run_file(name: str) -> bool:
    """Whether `name` is one of the files a run writes at the top of its folder."""
    import fnmatch

    return any(
        fnmatch.fnmatchcase(name, pattern)
        for pattern in RUN_FILES
        if not pattern.startswith(".") and pattern != "tensorboard"
    )


def versions() -> dict[str, str]:
    import torch

    from torchkit.core.runtime.extras import installed_version

    # The installed distribution's version (as `torchkit env` reports it): importing
    # torchvision only for its version would add 2 s to runs that do not use it (digits).
    return {
        "torchkit": __version__,
        "torch": torch.__version__,
        "torchvision": installed_version("torchvision") or "",
        "python": platform.python_version(),
        "cuda": torch.version.cuda or "",
    }


def write_config_json(
    path: Path, payload: dict[str, Any], *, check: Callable[[Path], None] | None = None
) -> None:
    atomic_write_json(path, payload, check=check)


def metric_columns(history: list[dict]) -> list[str]:
    columns = list(METRIC_COLUMNS)
    if any("val_ema_top1" in row for row in history):
        columns += EMA_COLUMNS
    if any(L1_COLUMN in row for row in history):
        columns.append(L1_COLUMN)
    columns += [name for name in MASKED_COLUMNS if any(name in row for row in history)]
    return columns


def topk_blanked(row: dict, num_classes: int) -> dict:
    """A metrics row as outputs carry it: the `*_top5` values None where 5 >= the number of
    classes (`core.topk`'s rule; checkpoints keep the numbers, so every version resumes)."""
    if topk_informative(TOPK, num_classes):
        return row
    return {key: None if key.endswith(TOPK_SUFFIX) else value for key, value in row.items()}


def write_metrics_csv(path: Path, history: list[dict], num_classes: int) -> None:
    """metrics.csv: one row per epoch; `val_top5` is empty with 5 classes or fewer. Written by
    the shared CSV writer, as every CSV torchkit writes: a float as repr writes it (the
    checkpoint's history exactly, as JSON gives it), a missing value an empty field."""
    columns = metric_columns(history)
    rows = ([topk_blanked(row, num_classes).get(name) for name in columns] for row in history)
    atomic_write_text(path, csv_text([columns, *rows]))


# A loss curve whose values span more than this factor is drawn on a log axis, so one bad epoch
# (a val loss of 14 among values near 0.1) does not flatten every other point.
LOG_SCALE_ABOVE = 30.0


def write_curves_png(path: Path, history: list[dict], best_epoch: int | None = None) -> None:
    """curves.png (see `curves_figure`), written atomically."""
    figure = curves_figure(history, best_epoch)
    with atomic_path(path) as tmp:
        figure.savefig(tmp, format="png", dpi=100, metadata=PNG_METADATA)


def import_plotting() -> None:
    """Import what `curves_figure` draws with (about a second, which the plotting service,
    `core.plotting`, pays in a helper process beside the command's start)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.backends.backend_agg  # noqa: F401 - what savefig draws PNGs with
    import matplotlib.figure  # noqa: F401


def curves_figure(history: list[dict], best_epoch: int | None = None):
    """Loss, top-1 accuracy and learning rate per epoch: train and validation (and EMA when
    there is one), integer epoch ticks, a marker at the best epoch, the loss on a log axis when
    its values span orders of magnitude."""
    import_plotting()
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    epochs = [row["epoch"] for row in history]
    has_lr = any(row.get("lr") is not None for row in history)
    figure = Figure(figsize=(15 if has_lr else 10, 4))
    panels = figure.subplots(1, 3 if has_lr else 2)
    loss_ax, acc_ax = panels[0], panels[1]
    figure.subplots_adjust(left=0.06, right=0.98, bottom=0.13, top=0.9, wspace=0.25)
    series = [("train", "train_loss", "train_top1"), ("val", "val_loss", "val_top1")]
    if any("val_ema_top1" in r for r in history):
        series.append(("val EMA", "val_ema_loss", "val_ema_top1"))
    losses = []
    for label, loss_key, top1_key in series:
        loss = [_number(r.get(loss_key)) for r in history]
        losses += [v for v in loss if v is not None]
        loss_ax.plot(epochs, loss, marker=".", label=label)
        acc_ax.plot(epochs, [_number(r.get(top1_key)) for r in history], marker=".", label=label)
    positive = [v for v in losses if v > 0]
    if positive and max(positive) / min(positive) > LOG_SCALE_ABOVE:
        loss_ax.set_yscale("log")
    loss_ax.set(title="loss" + (" (log scale)" if loss_ax.get_yscale() == "log" else ""))
    acc_ax.set(title="top-1 accuracy")
    if has_lr:
        lr_ax = panels[2]
        lr_ax.plot(epochs, [_number(r.get("lr")) for r in history], marker=".", color="tab:gray")
        lr_ax.set(title="learning rate (end of epoch)")
    for axes in panels:
        axes.set_xlabel("epoch")
        axes.grid(alpha=0.3)
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        if best_epoch is not None and best_epoch in epochs:
            axes.axvline(best_epoch, color="tab:green", linestyle="--", linewidth=1, label="best")
    loss_ax.legend()
    acc_ax.legend()
    return figure


def _number(value: Any) -> float | None:
    """A float to plot; None (a gap) for missing and non-finite values."""
    if value is None or value == "":
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def check_tensorboard() -> None:
    """Fail before training when --tensorboard cannot work."""
    import importlib.util

    if importlib.util.find_spec("tensorboard") is None:
        from torchkit.core.runtime.extras import MissingExtraError, install_hint

        raise MissingExtraError(
            "--tensorboard needs the tensorboard package, which is not installed",
            install_hint("tensorboard") + ", or drop --tensorboard",
        )


def summary_writer_class():
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter


class TensorBoardLog:
    """Scalars per epoch (and the training loss per update) under OUT/tensorboard. A full or
    read-only disk is one write error naming the folder, as for the run's other files."""

    def __init__(
        self, folder: Path, purge_step: int | None = None, filename_suffix: str = ""
    ) -> None:
        """`filename_suffix`: what the event file's name ends with."""
        self.folder = folder
        _quiet_writer_thread_errors()
        # TensorBoard encodes the names it writes by as UTF-8: a folder whose name is not UTF-8
        # (a UnicodeEncodeError before) is given by its descriptor, open while the writer is.
        self._names = contextlib.ExitStack()
        with reporting_write_errors(folder):
            try:
                if holds_non_utf8(str(folder)):
                    folder.mkdir(parents=True, exist_ok=True)  # to open it (the writer makes it)
                log_dir = self._names.enter_context(name_native_code_opens(folder))
                self.writer = summary_writer_class()(
                    log_dir=log_dir, purge_step=purge_step, filename_suffix=filename_suffix
                )
            except BaseException:
                self._names.close()
                raise

    def epoch(self, row: dict) -> None:
        epoch = row["epoch"]
        with reporting_write_errors(self.folder):
            for name, value in row.items():
                if name != "epoch" and isinstance(value, (int, float)):
                    group = "val" if name.startswith("val") else "train"
                    if name in ("lr", "epoch_time_s", "images_per_s"):
                        group = "run"
                    self.writer.add_scalar(f"{group}/{name}", value, epoch)
            self.writer.flush()

    def close(self) -> None:
        with self._names, reporting_write_errors(self.folder):
            self.writer.close()


def _quiet_writer_thread_errors() -> None:
    """TensorBoard writes the event file on a thread of its own, which keeps a failed write's
    error for the writer's next call (raised there, and reported as one line) and then raises it
    again as it ends: that second one, a thread's traceback on stderr, is left out."""
    previous = threading.excepthook
    if getattr(previous, "torchkit_tensorboard", False):
        return

    def hook(args: Any) -> None:
        if type(args.thread).__module__.startswith("tensorboard."):
            return
        previous(args)

    hook.torchkit_tensorboard = True  # type: ignore[attr-defined]
    threading.excepthook = hook
