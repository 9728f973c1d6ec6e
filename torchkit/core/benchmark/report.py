"""What `torchkit benchmark` reports, and appending its rows to a CSV file (`-o FILE --append`)
that earlier runs wrote, to compare machines and settings over time."""

from __future__ import annotations

import contextlib
import csv
import io
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from torchkit.core.benchmark.search import BatchSearch
from torchkit.core.io.csv_rows import CsvWriter
from torchkit.core.io.errors import OutputExistsError, first_line
from torchkit.core.io.file_outputs import check_output_file
from torchkit.core.io.open_outputs import closed, opened
from torchkit.core.io.output_locks import FolderLock, OutputLockedError
from torchkit.core.io.special_files import is_special_file
from torchkit.deferred_signals import signals_deferred

MB = 1_000_000  # as `summary` counts megabytes


@dataclass
class BenchmarkRow:
    """One configuration (mode, batch size): one row of the table, CSV and JSON `results`."""

    model: str
    mode: str  # infer or train
    batch_size: int
    input_size: str  # one sample, C x H x W: "3x224x224"
    device: str  # cpu, cuda:0...
    device_name: str  # the CPU model or the GPU's name
    dtype: str  # what the model computes in: the autocast dtype under --amp, else the weights'
    amp: bool
    channels_last: bool
    compile: bool
    threads: int  # torch.get_num_threads()
    warmup: int  # untimed steps
    iters: int  # timed steps
    timed_s: float  # wall time of the timed steps
    images_per_s: float  # batch_size * iters / timed_s
    latency_median_ms: float  # per batch (one step)
    latency_p90_ms: float
    peak_memory_mb: float | None  # memory_kind says what it measures; None where unknown
    memory_kind: str  # cuda_max_allocated, mps_allocated_sampled or cpu_rss_growth
    mult_adds_per_image: int  # of the forward pass, from `summary`'s counter
    flops_per_image: int | None  # of the forward pass (FlopCounterMode)
    step_flops_per_image: int | None  # what one step computes: forward, or 3x forward to train
    tflops: float | None  # achieved: step_flops_per_image * images_per_s / 1e12
    torch_version: str
    timestamp: str  # UTC, ISO 8601
    # MODEL as given (resnet18, runs/best.pt, pkg.mod:Fn), with " --weights W" if given; last,
    # so that the columns of earlier versions keep their places.
    spec: str


COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(BenchmarkRow))
# Columns newer than files that earlier versions wrote: a file without them still takes rows
# (--append), without those values.
ADDED_COLUMNS: tuple[str, ...] = ("spec",)


STOPPED_HOW = ("interrupted", "terminated", "failed")  # Ctrl-C, SIGTERM, an error


@dataclass
class BenchmarkResult:
    model: str
    source: str  # what the model spec named: torchvision, built-in, callable, checkpoint...
    input_size: list[int]
    device: str
    device_name: str
    threads: int
    torch_version: str
    params: int
    mult_adds_per_image: int
    flops_per_image: int | None
    settings: dict[str, Any]
    results: list[BenchmarkRow] = field(default_factory=list)
    batch_size_search: list[BatchSearch] = field(default_factory=list)
    # False for a run stopped before every configuration was timed: the results are those
    # timed before it stopped, `stopped` says how (STOPPED_HOW) and `error` what failed.
    complete: bool = True
    stopped: str | None = None
    error: str | None = None

    @property
    def planned(self) -> int:
        """How many configurations the run was to time (one per mode with a search)."""
        per_mode = 1 if self.settings["find_batch_size"] else len(self.settings["batch_sizes"])
        return len(self.settings["modes"]) * per_mode

    def mark_stopped(self, how: str, error: str | None = None) -> None:
        """Record that the run stopped here (`how`: one of STOPPED_HOW)."""
        if how not in STOPPED_HOW:
            raise ValueError(f"unknown way to stop: {how!r}")
        self.complete, self.stopped, self.error = False, how, error

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["results"] = [asdict(row) for row in self.results]
        data["batch_size_search"] = [search.to_dict() for search in self.batch_size_search]
        return data

    def rows(self) -> list[list[Any]]:
        """The rows as lists in COLUMNS order (for CSV)."""
        return [[getattr(row, name) for name in COLUMNS] for row in self.results]


def utc_timestamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# -- appending to a CSV ------------------------------------------------------------------------


def _header(text: str) -> list[str] | None:
    """The column names of CSV text (None for an empty file)."""
    text = text.lstrip("\ufeff")
    if not text.strip():
        return None
    return next(csv.reader(io.StringIO(text)))


def _read_existing(path: Path) -> str | None:
    """The file's text, or None when there is no file to append to (missing or special)."""
    if is_special_file(path) or not path.exists():
        return None
    try:
        with open(path, encoding="utf-8", newline="") as handle:
            return handle.read()
    except UnicodeDecodeError as error:
        raise OutputExistsError(
            f"cannot append to {path}: it is not a UTF-8 CSV file ({first_line(error)})",
            "give a CSV file that torchkit benchmark wrote, or a new file",
        ) from None
    except OSError as error:
        raise OutputExistsError(f"cannot read {path}: {error.strerror or error}") from None


def check_append_target(path: str | os.PathLike, columns: list[str] | tuple[str, ...]) -> list[str]:
    """Before any work: the CSV file `path` (when it exists and is not empty) has exactly
    `columns` (in any order), or an error naming the difference; an older file may lack the
    ADDED_COLUMNS. Returns the columns the rows will be written without."""
    target = Path(os.path.realpath(path))
    _refuse_hard_links(target)
    text = _read_existing(target)
    if text is None:
        return []
    return _require_same_columns(target, _header(text), list(columns))


def _refuse_hard_links(path: Path) -> None:
    """A file with other hard links is refused: the rows are added by replacing the file whole
    (never half written), which would leave its other names with the old rows, where `>>` adds
    them under every name."""
    if is_special_file(path):
        return
    try:
        links = os.stat(path).st_nlink
    except OSError:
        return  # none yet (or unreadable: said when it is read)
    if links > 1:
        raise OutputExistsError(
            f"cannot append to {path}: it has {links} hard links, and --append replaces the "
            "file whole (so that it is never half written), which would leave the other names "
            "with the old rows",
            "write to a new file with -o NEW.csv",
        )


def _require_same_columns(path: Path, found: list[str] | None, wanted: list[str]) -> list[str]:
    """The ADDED_COLUMNS that `found` lacks (left out of the rows), or an error when the
    columns differ otherwise."""
    if found is None:
        return []
    if len(set(found)) != len(found):
        raise OutputExistsError(
            f"cannot append to {path}: its header names a column twice",
            "give a CSV file that torchkit benchmark wrote, or a new file",
        )
    left_out = [c for c in wanted if c not in found and c in ADDED_COLUMNS]
    missing = [c for c in wanted if c not in found and c not in ADDED_COLUMNS]
    extra = [c for c in found if c not in wanted]
    if missing or extra:
        parts = []
        if missing:
            parts.append("missing " + ", ".join(missing))
        if extra:
            parts.append("not written by this version: " + ", ".join(extra))
        raise OutputExistsError(
            f"cannot append to {path}: its columns differ ({'; '.join(parts)})",
            "write to a new file with -o NEW.csv, or compare with the torchkit that wrote it",
        )
    return left_out


def append_csv(path: str | os.PathLike, csv_text: str, *, wait_s: float = 60.0) -> list[str]:
    """Append the rows of `csv_text` (a header line, then rows) to the CSV file `path`, in the
    file's column order, or write `csv_text` as it is where there is no file yet (or an empty
    one, or a special file such as /dev/stdout). Returns the columns left out of the rows: the
    ADDED_COLUMNS a file from an earlier version does not have.

    The file is replaced as a whole (a new file renamed into place), so it is never left half
    written (a file with other hard links, whose other names would keep the old rows, is
    refused); a second process appending at the same time waits for the first (a lock beside
    the file, up to `wait_s` seconds) instead of losing its rows."""
    from torchkit.core.io.files import atomic_write_text

    target = Path(path)
    if is_special_file(target):
        atomic_write_text(target, csv_text)
        return []
    target = Path(os.path.realpath(target))  # a symlink's file is appended to, not replaced
    with _locked(target, wait_s):
        # What is there now, read under the lock, is what the write replaces (another
        # process may have appended since the command checked its -o).
        check_output_file(target, force=True)
        _refuse_hard_links(target)
        existing = _read_existing(target)
        found = _header(existing) if existing is not None else None
        if found is None:
            atomic_write_text(target, csv_text)
            return []
        new_rows = list(csv.DictReader(io.StringIO(csv_text)))
        left_out = _require_same_columns(target, found, _header(csv_text) or [])
        newline = "\r\n" if "\r\n" in existing.split("\n", 1)[0] + "\n" else "\n"
        buffer = io.StringIO()
        writer = CsvWriter(buffer, lineterminator=newline)
        for row in new_rows:  # an empty field read back is a missing value, written as one
            writer.writerow([row[name] or None for name in found])
        joiner = "" if existing.endswith(("\n", "\r")) else newline
        atomic_write_text(target, existing + joiner + buffer.getvalue())
    return left_out


class _AppendLock:
    """The lock beside a CSV file while rows are added to it. Open (`open_outputs`) before its
    lock file is made until released: a stop where `_locked`'s clean-up is not in place (as
    the lock is taken, or as the block ends) still releases it at the end of the command."""

    def __init__(self) -> None:
        self.lock: FolderLock | None = None
        self._token: int | None = opened(self)

    def take(self, target: Path) -> None:
        # Signals deferred: the lock file is made and listed here, or neither.
        with signals_deferred():
            self.lock = FolderLock(target, "output")

    def release(self) -> None:
        if self.lock is not None:  # forgotten once released: a stop in between redoes it
            self.lock.release()
            self.lock = None
        closed(self._token)

    def close_unfinished(self, error: BaseException | None) -> None:
        self.release()


@contextlib.contextmanager
def _locked(target: Path, wait_s: float) -> Iterator[None]:
    held = _AppendLock()
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                held.take(target)
                break
            except OutputLockedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield
    finally:
        held.release()
