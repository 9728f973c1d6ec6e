"""Training checkpoints: what goes in, where they go, and reading one back to resume.

OUT/last.pt after every epoch (and on Ctrl-C or SIGTERM), OUT/best.pt when the validation metric
improves, OUT/epoch-NNN.pt every --save-every epochs (the newest --keep of them kept). Each is
written to a temporary file and renamed, and last.pt is written last: it is the commit point of
an epoch. A write that fails (a full disk) is a `cannot write` error; the previous files stay.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torchkit import __version__
from torchkit.core.io.errors import CheckpointError
from torchkit.core.io.force import marker_command
from torchkit.core.io.output_paths import REPLACED_SUFFIX, leftovers, remove_tree, shown
from torchkit.core.io.shell_words import shell_word
from torchkit.core.models.checkpoint import (
    FORMAT_VERSION,
    copy_checkpoint,
    is_torchkit_checkpoint,
    load_checkpoint,
    on_cpu,
    save_checkpoint_as,
)

LAST, BEST = "last.pt", "best.pt"
PERIODIC = re.compile(r"^epoch-(\d+)\.pt$")
# Keys a checkpoint needs to continue a run (best.pt and epoch-NNN.pt have them too).
RESUME_KEYS = ("model", "optimizer", "scheduler", "epoch", "config", "classes", "arch")


def build_checkpoint(
    *,
    arch: str,
    classes: list[str],
    model_state: Mapping[str, Any],
    optimizer: Any,
    schedule: Any,
    scaler: Any,
    ema: Any,
    epoch: int,
    global_step: int,
    best_metric: float | None,
    best_epoch: int | None,
    config: dict,
    preprocess: dict,
    history: list[dict],
    epoch_progress: dict | None = None,
    snapshot: bool = False,
) -> dict:
    """A torchkit checkpoint: CPU tensors and plain values only, so that it loads with
    `torch.load(weights_only=True)` on any machine, with a GPU or without.

    `epoch` counts completed epochs; `epoch_progress` is set when the run stopped inside the
    next epoch (Ctrl-C): how far it got, so --resume continues from there. With `snapshot`,
    CPU tensors are copied too (on a CPU run they are the live weights and optimiser state):
    the checkpoint stays as it is while training goes on, for a write in the background.
    """
    from torchkit.core.runtime.seeding import capture_rng_state

    checkpoint = {
        "format_version": FORMAT_VERSION,
        "torchkit_version": __version__,
        "arch": arch,
        "num_classes": len(classes),
        "classes": list(classes),
        "model": dict(model_state),
        "optimizer": optimizer.state_dict(),
        "scheduler": schedule.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None else None,
        "epoch": int(epoch),
        "global_step": int(global_step),
        "best_metric": best_metric,
        "best_epoch": best_epoch,
        "rng_state": capture_rng_state(),
        "config": config,
        "preprocess": preprocess,
        "history": [dict(row) for row in history],
        "epoch_progress": epoch_progress,
    }
    if ema is not None:
        checkpoint["model_ema"] = ema.state_dict()
        checkpoint["ema_updates"] = int(ema.updates)
    return on_cpu(checkpoint, copy=snapshot)


def periodic_name(epoch: int) -> str:
    return f"epoch-{epoch:03d}.pt"


def save_epoch(
    folder: Path,
    checkpoint: dict,
    *,
    is_best: bool,
    save_every: int,
    keep: int,
) -> list[Path]:
    """Write best.pt (if improved), epoch-NNN.pt (if due), then last.pt; prune old periodic
    ones. Returns the files written."""
    epoch = checkpoint["epoch"]
    written = [folder / BEST] if is_best else []
    if save_every and epoch % save_every == 0:
        written.append(folder / periodic_name(epoch))
    written.append(folder / LAST)
    # best.pt before last.pt, as last.pt names its epoch as the best only once best.pt holds it.
    save_checkpoint_as(checkpoint, written)
    if keep:
        prune_periodic(folder, keep)
    return written


def prune_periodic(folder: Path, keep: int) -> list[Path]:
    """Delete all but the `keep` newest epoch-NNN.pt files."""
    found = sorted((int(m.group(1)), p) for p in folder.iterdir() if (m := PERIODIC.match(p.name)))
    removed = [path for _, path in found[: max(0, len(found) - keep)]]
    for path in removed:
        remove_tree(path, ignore_errors=False)
    return removed


def stopped_before_first_checkpoint(folder: Path) -> bool:
    """Whether `folder` is a run train began (its marker names train, or config.json, which
    comes first, is there) that holds neither last.pt nor best.pt: one killed before its first
    checkpoint, with nothing to resume. (Killed before config.json, it was told to give "the
    run folder of an earlier `torchkit train`", which it was.)"""
    began = (folder / "config.json").is_file() or marker_command(folder) == "train"
    return began and not any(os.path.lexists(folder / name) for name in (LAST, BEST))


def resume_path(spec: str, *, put_back: bool = False) -> Path:
    """--resume DIR (its last.pt) or FILE. With `put_back`, where that checkpoint is missing,
    an earlier run of DIR (FILE's folder) that a `--force` run killed before its first
    checkpoint had set aside is put back first, as the next run on the folder puts it back
    (`put_back_earlier_run`), and is the run resumed."""
    path = Path(spec)
    folder = path if path.is_dir() else path.parent  # (FILE: the run folder it would be in)
    target = path / LAST if folder == path else path
    if not os.path.lexists(target) and folder.is_dir():
        tried = put_back and bool(leftovers(folder, REPLACED_SUFFIX))
        if tried:
            put_back_earlier_run(folder)
        _refuse_set_aside(path, folder, target, tried=tried)
    if path.is_dir():
        candidate = path / LAST
        if stopped_before_first_checkpoint(path):
            raise CheckpointError(
                f"no {LAST} in {path}: its run was stopped before its first checkpoint",
                "start it again: the command that started it, without --resume",
            )
        if not candidate.is_file():
            best = path / BEST
            # A folder of its name (`mkdir last.pt`) is named: "no last.pt" reads as wrong.
            missing = f"{candidate} is a folder, not a checkpoint" if candidate.is_dir() else ""
            missing = missing or f"no {LAST} in {path}"
            if best.is_file():  # a run whose last.pt is gone: its best epoch can still go on
                raise CheckpointError(
                    missing,
                    f"to go on from {BEST}'s epoch, pass --resume {shell_word(best)} --out NEW; to "
                    f"fine-tune from its weights, start a run with --weights {shell_word(best)} "
                    "--out NEW",
                )
            raise CheckpointError(missing, "give the run folder of an earlier `torchkit train`")
        return candidate
    if not path.exists():
        raise CheckpointError(f"checkpoint to resume not found: {path}", "check --resume")
    return path


def _refuse_set_aside(path: Path, folder: Path, target: Path, *, tried: bool) -> None:
    """--resume `path` (`folder` or a file in it), `target` the checkpoint it names, where
    `target` is missing and an earlier run of `folder` is set aside beside it (by a run that
    replaced it, --force, and was killed before its first checkpoint): the refusal says where
    the earlier run is kept and what puts it back (`tried`: putting it back was tried, and
    files put in `folder` since kept it where it is, as a warning said)."""
    earlier = leftovers(folder, REPLACED_SUFFIX)
    if not earlier or os.path.lexists(target):
        return
    missing = f"no {LAST} in {path}" if path == folder else f"{path} is not there"
    hint = (
        f"torchkit train --resume {shell_word(path)}, run in one process without "
        "--print-config, puts it back and continues it"
    )
    if tried:
        hint = f"move the other files out of {shell_word(folder)}, then resume again to put it back"
    raise CheckpointError(
        f"{missing}: the run that replaced its earlier run (--force) was stopped before its "
        f"first checkpoint; the earlier run is kept at {shown(earlier[-1])}",
        f"{hint}; to start the new run again, run the command that started it",
    )


def put_back_earlier_run(folder: Path) -> None:
    """Put back the earlier run that a `train --force` killed before its first checkpoint set
    aside beside `folder` (removing what the killed run wrote), under the folder's lock, as any
    next run on the folder does first (`recover_leftovers`); what was done is warned of."""
    import logging

    from torchkit.core.io.output_locks import FolderLock
    from torchkit.core.io.outputs import recover_leftovers

    if not leftovers(folder, REPLACED_SUFFIX):
        return
    lock = FolderLock(folder, "run folder")
    try:
        notes = recover_leftovers(folder)
    finally:
        lock.release()
    for note in notes:
        logging.getLogger("torchkit").warning(note)


def load_for_resume(spec: str, *, put_back: bool = False) -> tuple[Path, dict]:
    path = resume_path(spec, put_back=put_back)
    try:
        checkpoint = load_checkpoint(path)
    except CheckpointError as error:
        if "--trust-checkpoint" not in (error.hint or ""):
            raise
        # A run's own checkpoints hold tensors and plain values only: trust would not help.
        raise CheckpointError(
            error.message,
            "--resume continues a `torchkit train` run, whose checkpoints need no trust; "
            "use --model ARCH --weights FILE --trust-checkpoint to start a new run from other "
            "weights",
        ) from error
    if not is_torchkit_checkpoint(checkpoint):
        raise CheckpointError(
            f"{path} is not a torchkit training checkpoint",
            "--resume continues a `torchkit train` run; use --model ARCH --weights FILE for "
            "other weights",
        )
    missing = [key for key in RESUME_KEYS if key not in checkpoint]
    if missing:
        arch = checkpoint.get("arch")  # --weights alone would load them into convnet
        model = shell_word(arch) if isinstance(arch, str) and arch else "ARCH"
        raise CheckpointError(
            f"{path} cannot continue a run: it has no {', '.join(missing)}",
            f"use it with --model {model} --weights {shell_word(str(path))} to start a new run "
            "from its weights",
        )
    _check_resume_fields(path, checkpoint)
    return path, checkpoint


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_resume_fields(path: Path, checkpoint: Mapping[str, Any]) -> None:
    """Refuse a checkpoint whose place in its run is damaged (an epoch of -5 or 'two', a
    history that is no list of rows, a schedule without its count of updates, an epoch in
    progress of unknown fields), naming the field, where the resume ended in Python's own
    words of what failed with it (`Error: StopIteration`, `Error: KeyError: 'updates'`)."""
    from torchkit.core.train.loop import EpochProgress

    def refuse(field: str, value: Any, what: str) -> CheckpointError:
        shown_value = repr(value)
        if len(shown_value) > 60:
            shown_value = f"{shown_value[:57]}..."
        return CheckpointError(
            f"{path} cannot continue a run: its {field} {shown_value} is not {what}",
            "the file is damaged or not torchkit's; resume an earlier checkpoint of the run "
            "instead, an epoch-NNN.pt, with --out NEW",
        )

    if not _whole(checkpoint["epoch"]):
        raise refuse("epoch", checkpoint["epoch"], "a whole number of epochs done")
    for field in ("global_step", "best_epoch", "ema_updates"):
        value = checkpoint.get(field)
        if value is not None and not _whole(value):
            raise refuse(field, value, "a whole number, 0 or more")
    history = checkpoint.get("history", [])
    if not isinstance(history, list) or not all(
        isinstance(row, Mapping) and "epoch" in row for row in history
    ):
        raise refuse("history", history, "a list of rows of metrics.csv")
    for field, what in (
        ("model_ema", "a state dict of EMA weights"),
        ("rng_state", "a random state"),
    ):
        value = checkpoint.get(field)
        if value is not None and not isinstance(value, Mapping):
            raise refuse(field, value, what)
    schedule = checkpoint["scheduler"]
    if not isinstance(schedule, Mapping) or not _whole(schedule.get("updates")):
        raise refuse("scheduler", schedule, "a schedule with its count of updates")
    progress = checkpoint.get("epoch_progress")
    try:
        if progress is not None and not isinstance(progress, Mapping):
            raise TypeError
        EpochProgress.from_dict(progress)
    except (TypeError, ValueError):
        raise refuse("epoch_progress", progress, "the place of an epoch in progress") from None


def best_checkpoint_for(resumed: Path, checkpoint: dict) -> Path | None:
    """The file beside `resumed` that holds the weights of `checkpoint`'s best epoch, for a run
    resumed into another folder to carry its best.pt over: the folder's best.pt or
    epoch-NNN.pt of that epoch if it belongs to the same run (its history up to that epoch is
    the checkpoint's), else `resumed` itself when it was saved at the end of the best epoch.
    None when there is no best epoch yet, or its weights are nowhere to be found."""
    best_epoch = checkpoint.get("best_epoch")
    if best_epoch is None:
        return None
    for candidate in (resumed.parent / BEST, resumed.parent / periodic_name(best_epoch)):
        if candidate.is_file() and holds_best_epoch(candidate, checkpoint):
            return candidate
    if checkpoint.get("epoch") == best_epoch and not checkpoint.get("epoch_progress"):
        return resumed
    return None


# What `holds_best_epoch` compares.
BEST_EPOCH_KEYS = ("epoch", "epoch_progress", "arch", "classes", "history")


def holds_best_epoch(path: Path, checkpoint: dict) -> bool:
    """Whether the file `path` is a checkpoint saved at the end of `checkpoint`'s best epoch by
    the same run (its history up to that epoch is the checkpoint's). A run's own best.pt may
    not be: a kill or a full disk between the writes of an epoch's best.pt and last.pt leaves
    best.pt one epoch ahead of last.pt, on a branch the resumed run does not follow."""
    from torchkit.core.train.checkpoint_record import plain_values

    best_epoch = checkpoint.get("best_epoch")
    # Its few plain values without building its tensors; the whole file where that cannot be.
    saved = plain_values(path, BEST_EPOCH_KEYS)
    if saved is None:
        import torch

        try:
            saved = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception:  # unreadable or not a checkpoint: not the one we want
            return False
    history = [dict(row) for row in checkpoint.get("history", [])][:best_epoch]
    return (
        isinstance(saved, dict)
        and saved.get("epoch") == best_epoch
        and not saved.get("epoch_progress")
        and saved.get("arch") == checkpoint.get("arch")
        and list(saved.get("classes", [])) == list(checkpoint.get("classes", []))
        and [dict(row) for row in saved.get("history", [])][:best_epoch] == history
    )


def copy_best_checkpoint(resumed: Path, checkpoint: dict, target: Path) -> Path | None:
    """Copy to `target` the file that holds the weights of `checkpoint`'s best epoch
    (`best_checkpoint_for`); the file copied, or None. The copy is checked again: the resumed
    run may still be training and replace that file (its last.pt, its best.pt) after the
    checkpoint was read, and a copy of a later epoch is removed, never kept as the best."""
    found = best_checkpoint_for(resumed, checkpoint)
    if found is None:
        return None
    copy_checkpoint(found, target)
    if holds_best_epoch(target, checkpoint):
        return found
    remove_tree(target, ignore_errors=False)
    return None
