"""The run folder of `torchkit train`: picked, checked and locked before any work, and every
file the run writes into it (config.json, split.csv, the checkpoints, metrics.csv, curves.png,
lr_find.*, TensorBoard).

Only rank 0 touches the folder; a refusal there is the same error on every rank. The folder is
begun when the first file is written and kept once the first checkpoint is saved: until then a
failure or a stop removes the new run and puts an earlier one (--force) back, and a run
continued in place gets its config.json back.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable, Collection, Iterable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchkit.core.data.sources import SPLIT_CSV, write_split_csv
from torchkit.core.data.sources.inputs import data_inputs
from torchkit.core.io.errors import TorchkitError, first_line, on_every_rank
from torchkit.core.io.file_outputs import check_output_file
from torchkit.core.io.files import remove_stale_temporaries
from torchkit.core.io.force import (
    force_hint,
    marker_command,
    note_starting_log,
    noting_started,
)
from torchkit.core.io.output_locks import OutputLockedError, lock_path
from torchkit.core.io.output_paths import MARKER
from torchkit.core.io.outputs import OutputFolder, reports_inside
from torchkit.core.io.overlap import InputPath, OutputOverlapError
from torchkit.core.io.shell_words import shell_word
from torchkit.core.runtime import distributed
from torchkit.core.train.checkpoint_writer import CheckpointWriter
from torchkit.core.train.checkpoints import (
    BEST,
    LAST,
    copy_best_checkpoint,
    holds_best_epoch,
    save_epoch,
    stopped_before_first_checkpoint,
)
from torchkit.core.train.curves_painter import CurvesPainter
from torchkit.core.train.outputs import (
    RUN_FILES,
    RUN_OUTPUTS,
    START_FILES,
    TensorBoardLog,
    is_run_file,
    old_run_files,
    write_config_json,
    write_curves_png,
    write_metrics_csv,
)

if TYPE_CHECKING:
    from torchkit.core.runtime.distributed import DistContext
    from torchkit.core.train.config import TrainConfig
    from torchkit.core.train.setup import RunPlan


class RunFolder:
    """One run's folder, from the checks to the end of the run. `open` checks and locks it
    (every rank learns the outcome); the writing methods run on rank 0 only."""

    def __init__(
        self,
        inputs: Iterable[InputPath] = (),
        output_file: str | os.PathLike | None = None,
        before_keep: Callable[[Any], None] | None = None,
    ) -> None:
        self.extra_inputs: list[InputPath] = list(inputs)  # read by the caller (--stats)
        self.output_file = output_file  # the caller's -o FILE, checked with the folder
        self.before_keep = before_keep  # writes -o FILE before the range test's files are kept
        self.path: Path | None = None
        self.in_place = False  # continues the resumed run in its own folder
        self.output: OutputFolder | None = None  # rank 0, from `open` to `release`
        self.taken: list[Path] = []  # default folders locked by runs started with this one
        self.old_config_json: bytes | None = None  # of a run continued in place
        self.saved_any = False  # a checkpoint of this run is on disk
        self.tensorboard: TensorBoardLog | None = None
        self.painter: CurvesPainter | None = None  # draws curves.png (`start_painter`)
        self.writer = CheckpointWriter()  # the epochs' files, written beside the next epoch

    # -- before any work ---------------------------------------------------------------------

    def open(self, ctx: DistContext, plan: RunPlan) -> tuple[Path, bool]:
        """The run folder and whether it continues the resumed run in place, checked and
        locked (once) before the data and model are loaded."""
        if self.path is None:
            self.path, self.in_place = self._open(ctx, plan)
        return self.path, self.in_place

    def _open(self, ctx: DistContext, plan: RunPlan) -> tuple[Path, bool]:
        """Check and lock the folder (rank 0) and tell every rank the outcome: a refusal on
        rank 0 is the same error on every rank."""
        outcome: tuple = ("ok", "", False)
        failure: BaseException | None = None
        if ctx.is_main:
            try:
                out, in_place = self._lock(plan)
                outcome = ("ok", str(out), in_place)
            except TorchkitError as error:
                failure = error
                outcome = ("error", type(error), error.message, error.hint)
            except Exception as error:
                failure = error
                outcome = ("error", TorchkitError, f"rank 0: {first_line(error)}", None)
        outcome = distributed.broadcast_from_main(ctx, outcome)
        if failure is not None:
            self.release(ok=False)
            raise failure
        if outcome[0] == "error":
            _, kind, message, hint = outcome
            raise on_every_rank(kind(message, hint))
        return Path(outcome[1]), bool(outcome[2])

    def _lock(self, plan: RunPlan) -> tuple[Path, bool]:
        config = plan.config
        while True:
            out, in_place = self._out_path(plan)
            inputs = self._inputs(plan, in_place)
            if in_place:
                _check_in_place_resume(plan.resumed_from, out)
                _check_run_names(out, plan.config)
            known = old_run_files(out)  # (config.json read once: up to 64 MB)
            try:
                self.output = OutputFolder(
                    out,
                    command="train",
                    force=config.force,
                    inputs=inputs,
                    known_files=known,
                    what="run folder",
                    resume=in_place,
                    # Judged only where it is told, under the lock (a killed run's leftovers
                    # gone): a run continued in place is no refusal
                    exists_hint="" if in_place else self._exists_hint_of(out, known),
                    start_files=START_FILES,
                    owned=RUN_OUTPUTS,
                    # The summary -o writes into the run folder is this run's to replace.
                    reports=[self.output_file],
                    replaced_hint="nothing more was written there: continue a run folder you "
                    "moved with --resume NEW_PLACE, or start the run again",
                )
                break
            except OutputLockedError:
                if config.out or plan.resumed_from is not None:
                    raise
                # Another run started in the same second took the default name.
                self.taken.append(out)
        if self.output_file is not None:
            _check_output_file(self.output_file, out, inputs, config.force)
        if in_place:  # a run killed while its files were written left their temporaries
            remove_stale_temporaries(out, is_run_file)
        return out, in_place

    def _exists_hint_of(self, out: Path, known: Collection[str]) -> Callable[[], str]:
        """`_exists_hint` of `out`, worked out when `OutputFolder` refuses it as "already
        exists" (never where it is empty, or replaced with --force)."""
        return lambda: _exists_hint(out, self._owned(out), known)

    def _owned(self, out: Path) -> tuple[str, ...]:
        """What --force replaces in `out`: a run's files, and the -o summary this run writes
        into it (as `OutputFolder` counts them)."""
        from torchkit.core.io.folder_contents import exact_pattern

        return (*RUN_OUTPUTS, *map(exact_pattern, reports_inside(out, [self.output_file])))

    def _out_path(self, plan: RunPlan) -> tuple[Path, bool]:
        """The run folder, and whether it continues the resumed run in place."""
        config, resumed_from = plan.config, plan.resumed_from
        if config.out:
            out = Path(config.out)
        elif resumed_from is not None:
            out = resumed_from.parent
        else:
            out = default_out(config.model, self.taken)
        in_place = resumed_from is not None and os.path.realpath(out) == os.path.realpath(
            resumed_from.parent
        )
        return out, in_place

    def _inputs(self, plan: RunPlan, in_place: bool) -> list[InputPath]:
        """What the run reads: its options' files, the --stats and --config files, and the
        checkpoint it resumes (unless it continues that run in place)."""
        inputs = option_inputs(plan.config) + self.extra_inputs
        if plan.resumed_from is not None and not in_place:
            inputs.append(InputPath(plan.resumed_from, "checkpoint to resume"))
        return inputs

    # -- writing (rank 0) --------------------------------------------------------------------

    def begin(self, config_json: dict[str, Any], splits: dict) -> Path:
        """Make the folder (an earlier run set aside with --force) and write config.json and
        split.csv, once every check has passed."""
        out = self.path = self.output.begin()
        if self.in_place and (out / "config.json").is_file():
            self.old_config_json = (out / "config.json").read_bytes()

        def started(name: str) -> Callable[[Path], None] | None:
            """Each recorded as written: a kill from here to the first checkpoint leaves a
            start that the same command starts again."""
            return None if self.in_place else noting_started(out, name)

        write_config_json(out / "config.json", config_json, check=started("config.json"))
        write_split_csv(out / SPLIT_CSV, splits, check=started(SPLIT_CSV))
        return out

    def carry_best(self, ctx: DistContext, resumed_from: Path, checkpoint: dict) -> bool:
        """A run resumed into another folder starts with the resumed run's best.pt (and one
        continued in place whose best.pt was deleted, or is not of last.pt's best epoch, gets
        it back from a checkpoint of that epoch), so the folder holds the best epoch the
        summary names: whether that epoch's weights were found (rank 0 looks; every rank
        learns the outcome)."""

        def carry() -> str | None:
            own = self.path / BEST
            if self.in_place and own.is_file() and holds_best_epoch(own, checkpoint):
                return BEST  # the run's own
            found = copy_best_checkpoint(resumed_from, checkpoint, self.path / BEST)
            return None if found is None else str(found)

        return distributed.on_main(ctx, carry) is not None

    def open_tensorboard(self, purge_step: int) -> None:
        folder = self.path / "tensorboard"
        if self.output is not None and not folder.exists():
            self.output.wrote(folder)  # its event files are written by TensorBoard's writer
        suffix = ""
        if self.output is not None and not self.in_place:
            # Its event file recorded before it is made, by a name of its own: a kill from
            # here to the first checkpoint leaves a start the same command starts again.
            suffix = f".{secrets.token_hex(6)}"
            note_starting_log(self.path, f"tensorboard/events.out.tfevents.*{suffix}")
        self.tensorboard = TensorBoardLog(folder, purge_step=purge_step, filename_suffix=suffix)

    def close_tensorboard(self) -> None:
        if self.tensorboard is not None:
            tensorboard, self.tensorboard = self.tensorboard, None
            tensorboard.close()

    @property
    def saves_in_background(self) -> bool:
        """Whether `save_epoch` writes on the writer thread: its checkpoint must then be a
        snapshot (`TrainState.checkpoint(..., snapshot=True)`)."""
        return self.writer.in_background

    def save_epoch(
        self,
        checkpoint: dict,
        history: list[dict],
        num_classes: int,
        *,
        is_best: bool,
        config: TrainConfig,
    ) -> None:
        """The checkpoints of a finished epoch (best.pt if it is the best), then metrics.csv,
        written on the writer thread once the previous epoch's are (whose error is raised
        here); the epoch's TensorBoard scalars. The first checkpoint makes the new run worth
        keeping. `wait_saved` waits for the files."""
        rows = [dict(row) for row in history]  # the run goes on appending to `history`
        save_every, keep = config.save_every, config.keep

        def write() -> None:
            save_epoch(self.path, checkpoint, is_best=is_best, save_every=save_every, keep=keep)
            self._saved()
            write_metrics_csv(self.path / "metrics.csv", rows, num_classes)

        self.writer.submit(write)
        if self.tensorboard is not None:
            self.tensorboard.epoch(rows[-1])

    def wait_saved(self) -> None:
        """Wait for the files being written in the background; raise a failed write's error."""
        self.writer.wait()

    def save_stopped(self, checkpoint: dict) -> bool:
        """last.pt of a run stopped inside an epoch, if it is worth more than what the folder
        held before: yes once the run has saved a checkpoint, when it continues a run in place,
        or when the folder held nothing; not when it would replace an earlier run (--force)
        with a first, unfinished epoch (a run killed before its first checkpoint is worth
        less). Whether it was saved (else the new run goes)."""
        self.wait_saved()  # the epoch before is on disk (or its error raised) first
        output = self.output
        worth_less = output is None or not output.has_content or output.replaces_killed_start
        if not (worth_less or output.resume or self.saved_any):
            return False
        save_epoch(self.path, checkpoint, is_best=False, save_every=0, keep=0)
        self._saved()
        return True

    def _saved(self) -> None:
        self.saved_any = True
        if self.output is not None:
            self.output.keep()  # the new run is worth keeping, the old one goes

    def start_painter(self) -> None:
        """Start the helper that draws curves.png or lr_find.png (rank 0), before the run
        imports torch."""
        self.painter = CurvesPainter.start()

    def write_curves(
        self, history: list[dict], best_epoch: int | None, *, background: bool = False
    ) -> None:
        """curves.png; with `background`, on the writer thread (the run's last one, drawn
        while best.pt is tested: `wait_saved` waits for it)."""
        path = self.path / "curves.png"
        rows = [dict(row) for row in history]
        if self.output is not None:
            self.output.wrote(path)  # drawn by the painter's process

        def write() -> None:
            if self.painter is None or not self.painter.paint(path, rows, best_epoch):
                write_curves_png(path, rows, best_epoch)

        if background:
            self.writer.submit(write)
        else:
            write()

    def write_lr_find(self, found: Any, result: Any) -> None:
        """lr_find.csv and lr_find.png of the range test: the run's only result. The caller's
        report of it (`before_keep(result)`) is written before they replace an earlier run
        (--force): a report the disk refuses leaves that run as it was."""
        from torchkit.core.train.lr_find import write_lr_find

        if self.output is not None:
            self.output.wrote(self.path / "lr_find.png")  # drawn by the painter's process
        write_lr_find(self.path, found, painter=self.painter)
        if self.before_keep is not None:
            self.before_keep(result)  # raising: `release` puts the earlier run back
        if self.output is not None:
            self.output.keep()

    # -- the end -----------------------------------------------------------------------------

    def release(self, ok: bool, error: BaseException | None = None) -> None:
        """Keep the new run or put the old one back, and unlock the folder, once the files
        being written in the background are done (a failing run reports its own error,
        `error`)."""
        if ok:
            self.wait_saved()
        else:
            self.writer.drain()
        if self.painter is not None:
            painter, self.painter = self.painter, None
            painter.close()
        if not ok:
            with contextlib.suppress(Exception):  # already failing: keep the first error
                self.close_tensorboard()
        self._restore_config_json()
        if self.output is not None:
            output, self.output = self.output, None
            output.finish(ok, error)

    def _restore_config_json(self) -> None:
        """A run continued in place that saves no checkpoint (it had nothing to train, or it
        failed before its first: it diverged, a bad image) puts the run's config.json back:
        its checkpoints are still the old options', and config.json must describe them."""
        old, self.old_config_json = self.old_config_json, None
        if old is None or self.saved_any:
            return
        from torchkit.core.io.files import atomic_write_bytes

        with contextlib.suppress(Exception):  # already failing: keep the first error
            atomic_write_bytes(self.path / "config.json", old)


def option_inputs(config: TrainConfig) -> list[InputPath]:
    """The files and folders a run's options name for it to read: the data, the model's or
    --weights' checkpoint, the --class-weights file."""
    from torchkit.core.models import model_inputs
    from torchkit.core.train.class_weights import class_weights_inputs

    return (
        data_inputs(config.data)
        + model_inputs(config.model, config.weights)
        + class_weights_inputs(config.class_weights)
    )


def _exists_hint(out: Path, owned: Collection[str], known: Collection[str]) -> str:
    """What to do about an existing run folder: one killed before its first checkpoint has
    nothing to continue, where `--resume` would only say it holds no last.pt; a folder that is
    no run (another trainer's last.pt too) has neither way on; a run that --force would refuse
    to replace (a file of the user's in it, not in `owned`; a mount point) is continued, but
    --force is not offered (`force_hint`, the rule `OutputFolder` then applies). `known`:
    `old_run_files(out)`."""
    refused = force_hint(out, "", known_files=known, command="train", owned=owned)
    if stopped_before_first_checkpoint(out):
        return "its run was stopped before its first checkpoint, so there is nothing to " + (
            f"resume; {refused}"
            if refused
            else "resume: pass --force to start it again, or choose another --out"
        )
    if refused and marker_command(out) != "train" and not known:
        return refused  # --resume finds no run's last.pt, and --force is refused
    if refused:
        return (
            f"pass --resume {shell_word(out)} to continue that run, or choose another --out; "
            f"{refused}"
        )
    return (
        f"pass --resume {shell_word(out)} to continue that run, --force to overwrite it, "
        "or choose another --out"
    )


def _check_in_place_resume(resumed_from: Path, out: Path) -> None:
    """Continuing a run from an earlier checkpoint than its last.pt would overwrite last.pt
    and the epochs after that checkpoint: that is a new run, in a new folder."""
    last = out / LAST
    if resumed_from.name == LAST or not last.is_file():
        return
    if os.path.samefile(last, resumed_from):
        return
    raise OutputOverlapError(
        f"continuing {resumed_from} in {out} would overwrite {last} and the epochs after that "
        "checkpoint",
        f"continue the run from its last checkpoint with --resume {shell_word(out)}, or start a "
        f"new run from {resumed_from} with --out NEW_FOLDER",
    )


def _check_run_names(out: Path, config: TrainConfig) -> None:
    """A run continued in place renames each file it writes (metrics.csv, the checkpoints...)
    over the one there, and writes its TensorBoard log and profile into their folders: another
    kind of entry under one of those names (a folder named metrics.csv, a file named
    tensorboard) failed the write after an epoch's training, as a general error. Refused
    before any work, named."""
    from fnmatch import fnmatchcase

    from torchkit.core.io.errors import OutputExistsError
    from torchkit.core.train.step_profiler import PROFILE_FOLDER

    files = ("config.json", SPLIT_CSV, "metrics.csv", "curves.png", LAST, BEST, "epoch-*.pt")
    folders = {"tensorboard": config.tensorboard, PROFILE_FOLDER: bool(config.profile_steps)}
    try:
        entries = list(os.scandir(out))
    except OSError:
        return  # the lock's checks have said what is wrong with the folder itself
    for entry in entries:
        path, name = out / entry.name, entry.name
        if any(fnmatchcase(name, p) for p in files) and entry.is_dir(follow_symlinks=False):
            raise OutputExistsError(
                f"{path} is a folder, where the run writes its {name} file",
                f"move it out of {shell_word(out)} or rename it, then resume again",
            )
        if folders.get(name) and not entry.is_dir():
            raise OutputExistsError(
                f"{path} is not a folder, where the run writes its {name}/ files",
                f"move it out of {shell_word(out)} or rename it, then resume again",
            )


def _check_output_file(
    path: str | os.PathLike, out: Path, inputs: list[InputPath], force: bool
) -> None:
    """-o FILE: not an input, not inside an input folder, and not one of the files the run
    writes (in the run folder, a new file such as summary.json is fine)."""
    from fnmatch import fnmatch

    target = check_output_file(path, force, inputs, what="-o")
    real_out, real = os.path.realpath(out), os.path.realpath(target)
    if real != real_out and not real.startswith(real_out.rstrip(os.sep) + os.sep):
        return
    parts = Path(os.path.relpath(real, real_out)).parts if real != real_out else ()
    if not parts:
        raise OutputOverlapError(f"-o {path} is the run folder", "give a file name for the summary")
    if parts[0] == MARKER or any(fnmatch(parts[0], name) for name in RUN_FILES):
        raise OutputOverlapError(
            f"-o {path} would overwrite the run's own {parts[0]}",
            f"write the summary elsewhere, e.g. -o {shell_word(out / 'summary.json')}",
        )


def default_out(model: str | None, taken: Collection[Path] = ()) -> Path:
    """runs/<model>-<timestamp>, with a suffix if a run started in the same second (its folder
    or its lock exists, or it is in `taken`)."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    name = str(model).replace(":", "-").replace("/", "-").replace(".", "-")
    out = Path("runs") / f"{name}-{stamp}"
    suffix = 2
    while out.exists() or lock_path(out).exists() or out in taken:
        out = Path("runs") / f"{name}-{stamp}-{suffix}"
        suffix += 1
    return out
