"""What a run writes besides checkpoints: config.json, metrics.csv, curves.png, TensorBoard
(and split.csv: `core.datasource.write_split_csv`).

Every file is rewritten whole and atomically after each epoch from the history kept in the
checkpoint, so a resumed run (even one killed half-way through writing) shows exactly the epochs
its checkpoint has.
"""

from __future__ import annotations

import csv
import io
import json
import platform
from pathlib import Path
from typing import Any

from torchkit import __version__
from torchkit.core.errors import TorchkitError
from torchkit.core.files import atomic_path, atomic_write_text

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

# What a run folder holds (shell patterns, top-level names): a folder holding only these is a
# torchkit run even without the `.torchkit` marker (runs made before it existed), so --force
# may replace it. The last two are the temporaries of atomic writes that a killed run leaves.
RUN_FILES = (
    "config.json",
    "split.csv",
    "metrics.csv",
    "curves.png",
    "last.pt",
    "best.pt",
    "epoch-[0-9][0-9][0-9]*.pt",
    "tensorboard",
    ".*.tmp",
    ".*.tmp.*",
)


def versions() -> dict[str, str]:
    import torch
    import torchvision

    return {
        "torchkit": __version__,
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "python": platform.python_version(),
        "cuda": torch.version.cuda or "",
    }


def write_config_json(path: Path, payload: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(payload, indent=2, ensure_ascii=False) + "\n")


def metric_columns(history: list[dict]) -> list[str]:
    columns = list(METRIC_COLUMNS)
    if any("val_ema_top1" in row for row in history):
        columns += EMA_COLUMNS
    return columns


def write_metrics_csv(path: Path, history: list[dict]) -> None:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    columns = metric_columns(history)
    writer.writerow(columns)
    for row in history:
        writer.writerow([_csv_value(row.get(name)) for name in columns])
    atomic_write_text(path, buffer.getvalue())


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return value


def write_curves_png(path: Path, history: list[dict]) -> None:
    """Loss and top-1 accuracy per epoch, train and validation (and EMA when there is one)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    epochs = [row["epoch"] for row in history]
    figure = Figure(figsize=(10, 4))
    loss_ax, acc_ax = figure.subplots(1, 2)
    figure.subplots_adjust(left=0.07, right=0.98, bottom=0.13, top=0.9, wspace=0.2)
    loss_ax.plot(epochs, [r["train_loss"] for r in history], marker=".", label="train")
    loss_ax.plot(epochs, [r["val_loss"] for r in history], marker=".", label="val")
    acc_ax.plot(epochs, [r["train_top1"] for r in history], marker=".", label="train")
    acc_ax.plot(epochs, [r["val_top1"] for r in history], marker=".", label="val")
    if any("val_ema_top1" in r for r in history):
        loss_ax.plot(epochs, [r.get("val_ema_loss") for r in history], marker=".", label="val EMA")
        acc_ax.plot(epochs, [r.get("val_ema_top1") for r in history], marker=".", label="val EMA")
    loss_ax.set(title="loss", xlabel="epoch")
    acc_ax.set(title="top-1 accuracy", xlabel="epoch")
    for axes in (loss_ax, acc_ax):
        axes.grid(alpha=0.3)
        axes.legend()
        if len(epochs) < 15:
            axes.set_xticks(epochs)
    with atomic_path(path) as tmp:
        figure.savefig(tmp, format="png", dpi=100)


def check_tensorboard() -> None:
    """Fail before training when --tensorboard cannot work."""
    import importlib.util

    if importlib.util.find_spec("tensorboard") is None:
        raise TorchkitError(
            "--tensorboard needs the tensorboard package, which is not installed",
            "install it (pip install 'torchkit[tensorboard]' or uv sync --extra tensorboard), "
            "or drop --tensorboard",
        )


def summary_writer_class():
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter


class TensorBoardLog:
    """Scalars per epoch (and the training loss per update) under OUT/tensorboard."""

    def __init__(self, folder: Path, purge_step: int | None = None) -> None:
        self.writer = summary_writer_class()(log_dir=str(folder), purge_step=purge_step)

    def epoch(self, row: dict) -> None:
        epoch = row["epoch"]
        for name, value in row.items():
            if name != "epoch" and isinstance(value, (int, float)):
                group = "val" if name.startswith("val") else "train"
                if name in ("lr", "epoch_time_s", "images_per_s"):
                    group = "run"
                self.writer.add_scalar(f"{group}/{name}", value, epoch)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
