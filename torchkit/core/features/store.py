"""The OUT folder of extract-features: one array file per layer, `index.csv` and `meta.json`.

While a run goes on, each layer's rows are written batch by batch at their place in a `.npy` in
`OUT/.partial/` (`pwrite`: the pages go through the page cache and are not this process's memory,
so neither a dataset bigger than RAM nor a wide layer grows the process), and `progress.json`
there records how far it got once those rows are on disk. A crash or Ctrl-C leaves a state
`--resume` continues from.
The unreadable images' errors are appended to `errors.jsonl` there as they come, and the record
counts how many of them (and how many bytes of it) it holds: the record, written every few
seconds, stays the same size however many images failed (rewriting every error each time made
a run with many unreadable images take time that grew with the square of their number).
`finish()` moves the arrays into OUT (npy) or streams them into `.pt` / `.safetensors` files, then
writes `index.csv` and `meta.json`: an OUT with `meta.json` and no `.partial/` is complete.

A store `streamed` from stdin (`-`, a list whose length is known only at its end) appends each
layer's rows to a `.npy` whose header says 0 rows, and the lines of `index.csv` to
`.partial/index.csv`, as batches come; `finish()` writes the final row count into the header
(NumPy pads it for any count), so the files are those of a listed run. It has no progress record
(stdin cannot be read again: nothing to resume) and keeps OUT only once it is complete.

OUT itself is a `core.outputs.OutputFolder`: checked against the inputs and locked before any
work, made (and an old OUT replaced with --force set aside) only when the first rows are about
to be written, and kept once rows are on disk; a run stopped before that leaves the old OUT.
The arrays are reserved on disk when they are created, so a full disk is an error before the first
row (and a write error later is one too).
"""

from __future__ import annotations

import contextlib
import errno
import io
import itertools
import json
import logging
import os
import re
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchkit.core.io.claims import reporting_write_errors
from torchkit.core.io.csv_rows import csv_text, write_csv_file
from torchkit.core.io.errors import InputError, UsageError
from torchkit.core.io.files import (
    NAME_ERRORS,
    atomic_path,
    atomic_write,
    atomic_write_json,
    folds_case,
    torch_save,
)
from torchkit.core.io.force import is_torchkit_folder
from torchkit.core.io.names import distinct_names
from torchkit.core.io.non_utf8_names import json_text
from torchkit.core.io.output_paths import remove_tree
from torchkit.core.io.outputs import OutputFolder
from torchkit.core.io.records import open_regular_file, read_record_json
from torchkit.core.io.write_errors import write_error

log = logging.getLogger("torchkit")

PARTIAL_DIR = ".partial"
PROGRESS_FILE = "progress.json"
ERRORS_FILE = "errors.jsonl"  # in .partial: [image index, why] a line, appended at each commit
META_FILE = "meta.json"
INDEX_FILE = "index.csv"
FILE_FORMATS = ("npy", "pt", "safetensors")
DTYPES = ("float32", "float16")
_SAFETENSORS_DTYPES = {"float32": "F32", "float16": "F16"}
_CHUNK_BYTES = 64 * 2**20  # streaming copies never hold more than this in memory


@dataclass
class Progress:
    """How far a run got: a prefix of the image list, and what it wrote."""

    done: int = 0  # images processed, in index order
    rows: int = 0  # rows written to every array (unreadable images get none)
    errors: dict[int, str] = field(default_factory=dict)  # image index -> why it was skipped
    layers: dict[str, dict] = field(default_factory=dict)  # name -> file, shape, dtype, ...
    nonfinite: int = 0  # rows with a NaN or inf value in some layer
    nonfinite_first: str | None = None  # the image of the first of them
    errors_logged: int = 0  # how many of `errors` (the first, in order) are in ERRORS_FILE
    errors_bytes: int = 0  # ERRORS_FILE's length once they are

    def to_json(
        self, fingerprint: str, total: int, data: dict | None = None, weights: str | None = None
    ) -> dict:
        return {
            "fingerprint": fingerprint,
            "total": total,
            **({"images_location": data} if data else {}),
            **({"weights_digest": weights} if weights else {}),
            "done": self.done,
            "rows": self.rows,
            "errors_logged": self.errors_logged,
            "errors_bytes": self.errors_bytes,
            "layers": self.layers,
            "nonfinite": self.nonfinite,
            "nonfinite_first": self.nonfinite_first,
        }

    @classmethod
    def from_json(cls, data: dict, partial: Path | None = None) -> Progress:
        """The record of `partial/PROGRESS_FILE`, its errors read from `partial/ERRORS_FILE`
        (an older torchkit's record holds them itself)."""
        progress = cls(
            done=int(data["done"]),
            rows=int(data["rows"]),
            errors={int(k): str(v) for k, v in data.get("errors", {}).items()},
            layers=dict(data.get("layers", {})),
            nonfinite=int(data.get("nonfinite", 0)),
            nonfinite_first=data.get("nonfinite_first"),
        )
        logged, length = int(data.get("errors_logged", 0)), int(data.get("errors_bytes", 0))
        if logged:
            progress.errors = _read_errors(Path(partial or ".") / ERRORS_FILE, logged, length)
            progress.errors_logged, progress.errors_bytes = logged, length
        return progress


# The hint of a run's record that cannot be read: given as it is only where --force would
# replace OUT (`_start_over_told`).
START_OVER = "pass --force to start over"


@contextlib.contextmanager
def _start_over_told(output: OutputFolder) -> Iterator[None]:
    """A record of OUT that cannot be read (START_OVER) says what stops --force too where it
    would be refused (a file of yours in OUT): never a hint that leads to a second refusal."""
    try:
        yield
    except InputError as error:
        if error.hint != START_OVER:
            raise
        hint = output.force_hint(START_OVER)
        if hint == START_OVER:  # --force would replace OUT: said as it is
            raise
        raise InputError(error.message, hint) from error


def read_json(path: Path) -> dict:
    try:
        return read_record_json(path)  # a FIFO under its name: an error, never a wait
    except (OSError, ValueError) as error:
        raise InputError(f"cannot read {path}: {error}", START_OVER) from error


class FeatureStore:
    """Memory-mapped arrays in OUT/.partial, the progress record, and the final layout."""

    def __init__(
        self,
        output: OutputFolder,
        fingerprint: str,
        total: int,
        progress: Progress,
        *,
        streamed: bool = False,
        data: dict | None = None,
        weights: str | None = None,
    ) -> None:
        self.output = output
        self.data = data  # where the images are (`data_location`), recorded for --resume
        self.weights = weights  # the model's weights (`weights_digest`), recorded for --resume
        self.streamed = streamed
        self.skipped = 0  # streamed: the images whose error line is written (errors are not kept)
        self._appended: dict[str, Any] = {}  # streamed: open files, by layer (and the index)
        self.out = output.final
        self.partial = self.out / PARTIAL_DIR
        self.fingerprint = fingerprint
        self.total = total
        self.progress = progress
        self._arrays: dict[str, _RowsFile] = {}  # by layer, open for writing rows
        self._begun = False  # OUT made (an old one set aside): there is something to record
        # OUT/.partial holds rows of this command line on record, which --resume continues: a
        # resumed run's, or this run's once a record counts rows (not an old OUT put back).
        self.rows_kept = False

    @classmethod
    def open(
        cls,
        output: OutputFolder,
        fingerprint: str,
        total: int,
        data: dict | None = None,
        weights: str | None = None,
    ) -> tuple[FeatureStore | None, dict | None]:
        """(store, None) to work in, or (None, meta) when `--resume` finds OUT already complete.

        `output` was opened with `resume=True` only when --resume found something in OUT: then
        OUT is continued if it was started with the same fingerprint (same model, layers,
        options and image names) on the same images (`data`, the folder their names are
        relative to, however it is spelled) with the same weights (`weights`, their digest: a
        checkpoint rewritten at the same path holds other weights). Otherwise nothing is written
        until the first rows are.
        """
        folder = output.final
        partial, meta_path = folder / PARTIAL_DIR, folder / META_FILE
        if output.resume and output.has_content:
            progress_path = partial / PROGRESS_FILE
            with _start_over_told(output):
                state = read_json(progress_path) if progress_path.is_file() else None
            if state is not None and _records_work(state):
                _check_fingerprint(state.get("fingerprint"), fingerprint, output, "an interrupted")
                _check_data(state.get("images_location"), data, output, "an interrupted")
                _check_weights(state.get("weights_digest"), weights, output, "an interrupted")
                with _start_over_told(output):
                    progress = Progress.from_json(state, partial)
                store = cls(output, fingerprint, total, progress, data=data, weights=weights)
                store.rows_kept = True
                store._begin()
                return store, None
            if meta_path.is_file():
                with _start_over_told(output):
                    meta = read_json(meta_path)
                _check_fingerprint(meta.get("fingerprint"), fingerprint, output, "a finished")
                _check_data(meta.get("images_location"), data, output, "a finished")
                _check_weights(meta.get("weights_digest"), weights, output, "a finished")
                if partial.is_dir():
                    output.begin()
                    remove_tree(partial)
                return None, meta
            if not partial.is_dir():
                # --force replaces only torchkit's own folders: name it only where it would.
                hint = (
                    output.force_hint("give another OUT, or pass --force to replace it")
                    if is_torchkit_folder(Path(folder))
                    else "give another OUT: this folder was not written by torchkit"
                )
                raise InputError(
                    f"nothing to resume in {folder}: it holds no extract-features run", hint
                )
            output.begin()
            remove_tree(partial, ignore_errors=False)  # stopped before its first batch was recorded
        return cls(output, fingerprint, total, Progress(), data=data, weights=weights), None

    def _begin(self) -> None:
        """Make OUT (setting an old one aside with --force) and OUT/.partial."""
        self.output.begin()
        self._begun = True
        with reporting_write_errors(self.out):
            if not self.partial.is_dir():
                self.output.wrote(self.partial)  # the arrays in it are memory-mapped files
            self.partial.mkdir(parents=True, exist_ok=True)

    @classmethod
    def open_streamed(cls, output: OutputFolder, weights: str | None = None) -> FeatureStore:
        """A store for paths read from stdin as they come: rows appended, nothing resumed
        (`weights` recorded in meta.json as a listed run's are)."""
        return cls(output, "", 0, Progress(), streamed=True, weights=weights)

    @property
    def allocated(self) -> bool:
        return bool(self.progress.layers)

    def allocate(self, layers: dict[str, dict]) -> None:
        """Create one (total, *shape) array per layer. `layers[name]` has `shape` (per row),
        `dtype` and anything else worth recording; a file name is added."""
        self._begin()
        with reporting_write_errors(self.out):
            fold = folds_case(self.partial)  # `Conv1.npy` and `conv1.npy` one file there
            stems = distinct_names(map(_file_stem, layers), separator="_", fold_case=fold)
            for (name, info), stem in zip(layers.items(), stems, strict=True):
                self.progress.layers[name] = {**info, "file": stem}
        # On record before they are made: every array in .partial is named, with its row shape
        # and dtype, by the run's record (`is_recorded_array`), which --force goes by.
        self._write_record()
        with reporting_write_errors(self.out):
            for name, info in self.progress.layers.items():
                path = self._partial_array(info["file"])
                if self.streamed:
                    self._appended[name] = _npy_for_appending(path, info)
                    continue
                rows = _RowsFile.create(path, info, self.total)
                self._arrays[name] = rows
                reserve_space(path, self.out, zero_fill_from=rows.data_start)

    def _partial_array(self, stem: str) -> Path:
        return self.partial / f"{stem}.npy"

    def _array(self, name: str) -> _RowsFile:
        if name not in self._arrays:
            info = self.progress.layers[name]
            path = self._partial_array(info["file"])
            try:
                self._arrays[name] = _RowsFile.reopen(path, info, self.total)
            except (OSError, ValueError) as error:
                with _start_over_told(self.output):
                    raise InputError(
                        f"cannot reopen {path} to resume: {error}", START_OVER
                    ) from error
            reserve_space(path, self.out)  # a file from an older run may still have holes
        return self._arrays[name]

    def write(self, row: int, arrays: dict[str, Any]) -> None:
        if self.streamed:  # rows in order: appended as raw C-order bytes after the header
            import numpy as np

            with reporting_write_errors(self.out):
                for name, values in arrays.items():
                    dtype = self.progress.layers[name]["dtype"]
                    handle = self._appended[name]
                    handle.write(np.ascontiguousarray(values, dtype=dtype).data)
                    handle.flush()  # on disk as it comes: a reader sees whole batches
            return
        with reporting_write_errors(self.out):
            for name, values in arrays.items():
                self._array(name).write(row, values)

    def append_index(self, columns: list[str], lines: Iterable[list]) -> None:
        """Streamed: the index.csv lines of a batch, after its header (written first)."""
        self._begin()
        with reporting_write_errors(self.out):
            handle = self._appended.get(INDEX_FILE)
            if handle is None:
                path = self.partial / INDEX_FILE
                # A name that is not UTF-8 is written as its own bytes, as in a listed run's
                handle = open(path, "w", encoding="utf-8", errors=NAME_ERRORS, newline="")  # noqa: SIM115
                self._appended[INDEX_FILE] = handle
                lines = [columns, *lines]
            handle.write(csv_text(lines))
            handle.flush()

    def commit(self) -> None:
        """Flush the arrays, then record the progress (in that order, so that what the record
        claims is on disk). Once rows are recorded, OUT is kept: an old OUT replaced with
        --force is discarded, and a run stopped from now on can be resumed."""
        if not self._begun:
            return  # nothing written yet: nothing to record, and the old OUT is untouched
        if self.streamed:  # no record to resume from; OUT is kept once it is complete
            with reporting_write_errors(self.out):
                for handle in self._appended.values():
                    handle.flush()
            return
        with reporting_write_errors(self.out):
            for array in self._arrays.values():
                array.sync()
            self._log_new_errors()
        self._write_record()
        if self.progress.rows > 0:
            self.output.keep()
            self.rows_kept = True

    def _write_record(self) -> None:
        """PROGRESS_FILE: how far the run got (a streamed run's: only its arrays, as it has
        nothing to resume)."""
        record = self.progress.to_json(self.fingerprint, self.total, self.data, self.weights)
        if self.streamed:
            record["streamed"] = True
        atomic_write_json(self.partial / PROGRESS_FILE, record, indent=None)

    def _log_new_errors(self) -> None:
        """Append the errors found since the last commit to ERRORS_FILE, durable before the
        record that counts them is written: a commit writes only what is new."""
        state = self.progress
        new = itertools.islice(state.errors.items(), state.errors_logged, None)
        text = "".join(json_text([index, why]) + "\n" for index, why in new)
        if not text:
            return
        with open(self.partial / ERRORS_FILE, "ab") as handle:
            # Bytes past the recorded end are a stopped commit's, never counted: dropped.
            handle.truncate(state.errors_bytes)
            handle.seek(state.errors_bytes)
            handle.write(text.encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
            state.errors_bytes = handle.tell()
        state.errors_logged = len(state.errors)

    def finish(
        self, file_format: str, index_columns: list[str], index_rows: Iterable[list], meta: dict
    ) -> dict[str, Path]:
        """Put every layer's file in OUT, then index.csv (its rows streamed from `index_rows`)
        and meta.json; returns the files."""
        with reporting_write_errors(self.out), _start_over_told(self.output):
            return self._finish(file_format, index_columns, index_rows, meta)

    def _finish(
        self, file_format: str, index_columns: list[str], index_rows: Iterable[list], meta: dict
    ) -> dict[str, Path]:
        rows = self.progress.rows
        self.close()
        files = {}
        for name, info in self.progress.layers.items():
            source = self._partial_array(info["file"])
            target = self.out / f"{info['file']}.{file_format}"
            files[name] = target
            if not source.exists() and target.exists():
                continue  # moved by a run that stopped while finishing
            _set_rows(source, rows)
            if file_format == "npy":
                # On record before the rename (as every other file): a failure or kill before
                # OUT is kept removes it with the rest of the run.
                self.output.wrote(target)
                os.replace(source, target)
            elif file_format == "pt":
                _write_pt(source, target)
            else:
                _write_safetensors(source, target, name)
        if self.streamed:
            self.output.wrote(self.out / INDEX_FILE)
            os.replace(self.partial / INDEX_FILE, self.out / INDEX_FILE)
        else:
            write_csv_file(self.out / INDEX_FILE, index_rows, header=index_columns)
        atomic_write_json(self.out / META_FILE, meta)
        remove_tree(self.partial)
        return files

    def close(self) -> None:
        """Close the arrays' files: at the end, and after an error (an int file descriptor is
        never closed by the garbage collector, so each failed run in one process kept its own)."""
        for handle in self._appended.values():
            handle.close()
        self._appended.clear()
        for array in self._arrays.values():
            array.close()
        self._arrays.clear()


@dataclass
class _RowsFile:
    """A layer's `.npy` in `.partial`, open for writing rows at their place (`pwrite`). A
    memory map of it (before) kept every page written resident in this process: its resident
    set grew by the whole N x D array (8 GB for a million rows of 2,048 float32 features),
    which a job's memory limit counts, though the kernel could drop those pages."""

    fd: int
    data_start: int  # the header's length
    row_bytes: int
    dtype: Any  # numpy's
    shape: tuple[int, ...]  # the whole array's

    @classmethod
    def create(cls, path: Path, info: dict, total: int) -> _RowsFile:
        """A new .npy of `total` rows of `info`'s shape and dtype (as `open_memmap` makes it:
        the same header, the data as a hole to be reserved)."""
        import numpy as np
        from numpy.lib import format as npy

        dtype, shape = np.dtype(info["dtype"]), (total, *info["shape"])
        with open(path, "wb") as handle:
            header = {"descr": npy.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
            npy.write_array_header_1_0(handle, header)
            data_start = handle.tell()
            handle.truncate(data_start + _row_bytes(shape, dtype) * total)
        return cls._opened(path, data_start, dtype, shape)

    @classmethod
    def reopen(cls, path: Path, info: dict, total: int) -> _RowsFile:
        """An interrupted run's .npy of `total` rows of `info`'s shape and dtype (ValueError if
        it is not that, or shorter)."""
        import numpy as np

        expected = (total, *info["shape"])
        shape, dtype, data_start = _npy_layout(path)
        if shape != expected or dtype != np.dtype(info["dtype"]):
            raise ValueError(f"it holds {shape} {dtype}, not {expected} {info['dtype']}")
        size, needed = path.stat().st_size, data_start + _row_bytes(shape, dtype) * total
        if size < needed:
            raise ValueError(f"it holds {size} bytes, not {needed}")
        return cls._opened(path, data_start, dtype, shape)

    @classmethod
    def _opened(cls, path: Path, data_start: int, dtype, shape) -> _RowsFile:
        fd = os.open(path, os.O_RDWR | getattr(os, "O_BINARY", 0))
        return cls(fd, data_start, _row_bytes(shape, dtype), dtype, shape)

    def write(self, row: int, values) -> None:
        """`values` (rows of this array's row shape) as rows `row`, `row + 1`, ..."""
        import numpy as np

        data = np.ascontiguousarray(values, dtype=self.dtype)
        if data.shape[1:] != self.shape[1:] or row + len(data) > self.shape[0]:
            raise ValueError(f"rows {data.shape} at {row} do not fit an array of {self.shape}")
        view = memoryview(data.reshape(-1).view(np.uint8))
        offset = self.data_start + row * self.row_bytes
        while view:
            written = os.pwrite(self.fd, view, offset)
            view, offset = view[written:], offset + written

    def sync(self) -> None:
        """The rows written so far on disk (what a progress record may then claim)."""
        getattr(os, "fdatasync", os.fsync)(self.fd)

    def close(self) -> None:
        os.close(self.fd)


def _row_bytes(shape: tuple[int, ...], dtype) -> int:
    size = dtype.itemsize
    for dimension in shape[1:]:
        size *= dimension
    return size


def _npy_layout(path: Path) -> tuple[tuple[int, ...], Any, int]:
    """(shape, dtype, where the data starts) of a C-order .npy (ValueError for another)."""
    from numpy.lib import format as npy

    with open_regular_file(path) as handle:
        version = npy.read_magic(handle)
        read_header = npy.read_array_header_2_0 if version >= (2, 0) else npy.read_array_header_1_0
        shape, fortran, dtype = read_header(handle)
        if fortran:
            raise ValueError("it is in Fortran order")
        return tuple(shape), dtype, handle.tell()


def known_files(folder: Path) -> tuple[str, ...]:
    """The names an extract-features run wrote into `folder`, by its own records (meta.json or
    .partial/progress.json), so that --force may replace an OUT written before the `.torchkit`
    marker existed; nothing when the folder holds no such record."""
    for path in (folder / META_FILE, folder / PARTIAL_DIR / PROGRESS_FILE):
        try:
            record = read_record_json(path)
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or "fingerprint" not in record:
            continue
        layers = record.get("layers") or []
        if isinstance(layers, list):  # meta.json: [{"file": "stem.npy", ...}, ...]
            files = [str(layer.get("file", "")).rsplit(".", 1)[0] for layer in _dicts(layers)]
        elif isinstance(layers, dict):  # progress.json: {name: {"file": "stem", ...}}
            files = [str(info.get("file", "")) for info in _dicts(layers.values())]
        else:
            files = []
        # Only names `_file_stem` makes: no glob characters, no paths.
        stems = [stem for stem in files if re.fullmatch(r"[A-Za-z0-9._-]+", stem)]
        names = [f"{stem}.{ext}" for stem in stems for ext in FILE_FORMATS]
        temporaries = [f".{name}.*.tmp" for name in (INDEX_FILE, META_FILE, *names)]
        temporaries += [f".{stem}.*.tmp.{ext}" for stem in stems for ext in FILE_FORMATS]
        return (PARTIAL_DIR, INDEX_FILE, META_FILE, *names, *temporaries)
    return ()


def _records_work(state: dict) -> bool:
    """Whether a progress record counts images done, to resume from: not one written as the
    arrays were made (none done yet), nor a streamed run's (nothing to resume)."""
    return not state.get("streamed") and (state.get("done"), state.get("rows")) != (0, 0)


def is_recorded_array(path: Path) -> bool:
    """Whether `path` (OUT/.partial/STEM.npy) is an array of the run whose record is beside
    it: the record names a layer's file STEM, and the array has that layer's dtype and row
    shape (any number of rows: the run's total, the rows kept, or a streamed run's count).
    Any other .npy there (yours) is not the run's."""
    try:
        record = read_record_json(path.parent / PROGRESS_FILE)
        layers = record["layers"] if isinstance(record, dict) else None
        if not isinstance(layers, dict) or path.suffix != ".npy":
            return False
        infos = [i for i in _dicts(layers.values()) if i.get("file") == path.name[: -len(".npy")]]
        if len(infos) != 1:
            return False
        import numpy as np

        shape, dtype, _ = _npy_layout(path)
        info = infos[0]
        return dtype == np.dtype(info["dtype"]) and list(shape[1:]) == list(info["shape"])
    except (OSError, ValueError, TypeError, KeyError, SyntaxError):
        return False


def _dicts(items) -> list[dict]:
    return [item for item in items if isinstance(item, dict)]


def reserve_space(path: Path, out: Path, *, zero_fill_from: int | None = None) -> None:
    """Allocate the whole file on disk now (`posix_fallocate`), so that a full disk is an
    `OutputWriteError` here and not a SIGBUS when a page of its memory map is first written.
    Where the file system cannot (EOPNOTSUPP, EINVAL), a new file is filled with zeros from
    `zero_fill_from` (its data, all zeros so far); otherwise the run goes on unreserved."""
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return
        try:
            os.posix_fallocate(fd, 0, size)
            return
        except AttributeError:  # no posix_fallocate (macOS)
            pass
        except OSError as error:
            if error.errno not in _NO_FALLOCATE:
                raise write_error(out, error) from error
        if zero_fill_from is None:
            log.debug("cannot reserve %s on this file system; writing it unreserved", path)
            return
        zeros = bytes(min(_CHUNK_BYTES, 2**20))
        offset = zero_fill_from
        try:
            while offset < size:
                offset += os.pwrite(fd, zeros[: min(len(zeros), size - offset)], offset)
            os.fsync(fd)
        except OSError as error:
            raise write_error(out, error) from error
    finally:
        os.close(fd)


_NO_FALLOCATE = {
    code
    for code in (
        getattr(errno, "EOPNOTSUPP", None),
        getattr(errno, "ENOTSUP", None),
        errno.EINVAL,
        getattr(errno, "ENOSYS", None),
    )
    if code is not None
}


def data_location(root: str) -> dict | None:
    """Where the images whose names are relative to `root` are, whatever spelling names it
    (`./a/`, an absolute path, a link to it): its real path and its (device, inode). None
    where the root is no local folder (digits, URLs, image files as typed)."""
    if not root:
        return None
    try:
        info = os.stat(root)
    except (OSError, ValueError):
        return None
    return {"path": os.path.realpath(root), "id": [info.st_dev, info.st_ino]}


def _read_errors(path: Path, count: int, length: int) -> dict[int, str]:
    """The `count` errors an interrupted run recorded: the first `length` bytes of its
    ERRORS_FILE (what a commit stopped part-way appended after them is not counted)."""
    try:
        with open_regular_file(path) as handle:
            data = handle.read(length)
        lines = data.decode("utf-8").splitlines()
        if len(data) != length or len(lines) != count:
            raise ValueError(f"it holds {len(lines)} of the {count} errors its record counts")
        return {int(index): str(why) for index, why in map(json.loads, lines)}
    except (OSError, ValueError, TypeError) as error:
        raise InputError(f"cannot read {path}: {error}", START_OVER) from error


def _or_start_over(output: OutputFolder, way: str) -> str:
    """The hint of a refused --resume: `way`, or --force to start over, where --force would
    replace OUT; else what stops --force too (a file of yours in OUT), never a second refusal."""
    refused = output.force_hint("")
    return f"{way}; {refused}" if refused else f"{way}, or pass --force to start over"


def _check_data(
    recorded: dict | None, current: dict | None, output: OutputFolder, what: str
) -> None:
    """A run is resumed only on the images it was started with: the same names in another
    folder are other images, whose rows would be mixed with the first folder's."""
    if not recorded or not current:  # recorded since this check was added; local folders only
        return
    if recorded.get("path") == current["path"] or recorded.get("id") == current["id"]:
        return
    raise UsageError(
        f"{output.final} holds {what} extraction of the images in {recorded.get('path')}, "
        f"not {current['path']}",
        _or_start_over(output, "resume with the IMAGES it was started with"),
    )


def _check_weights(
    recorded: str | None, current: str | None, output: OutputFolder, what: str
) -> None:
    """A run is resumed only with the weights it was started with: the same command line may
    name other weights (a checkpoint that training rewrote since), whose rows would be mixed
    with the first weights' (or, of a finished run, given as theirs)."""
    if not recorded or not current:  # recorded since this check was added
        return
    if recorded != current:
        refused = output.force_hint("")
        raise UsageError(
            f"{output.final} holds {what} extraction with other weights than the model's now "
            "(its file was rewritten since)",
            f"give another OUT; {refused}"
            if refused
            else "pass --force to start over with these weights, or give another OUT",
        )


def _check_fingerprint(found: str | None, expected: str, output: OutputFolder, what: str) -> None:
    if found != expected:
        raise UsageError(
            f"{output.final} holds {what} extraction with another model, layers, options, "
            "images or labels",
            _or_start_over(output, "resume with the same command line"),
        )


def _file_stem(name: str) -> str:
    """The file name (without extension) of layer `name`'s array before `distinct_names` makes
    it differ from another layer's (`_2`, `_3`...): its name in file-name-safe characters."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".") or "layer"


def _npy_for_appending(path: Path, info: dict):
    """A new .npy of 0 rows of `info`'s shape and dtype, open for appending rows (`_set_rows`
    writes their count into the header at the end)."""
    import numpy as np
    from numpy.lib import format as npy

    handle = open(path, "wb")  # noqa: SIM115 (closed by the store)
    header = {"descr": npy.dtype_to_descr(np.dtype(info["dtype"])), "fortran_order": False}
    npy.write_array_header_1_0(handle, {**header, "shape": (0, *info["shape"])})
    return handle


def _set_rows(path: Path, rows: int) -> None:
    """Give a .npy `rows` rows in place: cut a memory-mapped array to the rows used (unreadable
    images left some unused), or count the rows appended after a 0-row header (streamed).

    NumPy pads .npy headers so the first dimension can change without moving the data, so this
    rewrites the header and truncates; a header that does not fit is handled by copying."""
    import numpy as np
    from numpy.lib import format as npy

    with open(path, "r+b") as handle:
        version = npy.read_magic(handle)
        read_header = npy.read_array_header_2_0 if version >= (2, 0) else npy.read_array_header_1_0
        shape, fortran, dtype = read_header(handle)
        if shape[0] == rows:
            return
        data_start = handle.tell()
        header = io.BytesIO()
        write_header = (
            npy.write_array_header_2_0 if version >= (2, 0) else npy.write_array_header_1_0
        )
        new_shape = (rows, *shape[1:])
        write_header(
            header,
            {"descr": npy.dtype_to_descr(dtype), "fortran_order": fortran, "shape": new_shape},
        )
        if len(header.getvalue()) == data_start:  # always for a 0-row header: padded for any count
            row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
            handle.seek(0)
            handle.write(header.getvalue())
            handle.truncate(data_start + rows * row_bytes)
            return
    source = np.load(path, mmap_mode="r")
    with atomic_path(path) as tmp:
        copy = npy.open_memmap(tmp, mode="w+", dtype=source.dtype, shape=new_shape)
        reserve_space(tmp, path.parent, zero_fill_from=copy.offset)
        for start, stop in _chunks(source, rows):
            copy[start:stop] = source[start:stop]
        copy.flush()
        del copy
    del source


def _chunks(array, rows: int):
    row_bytes = max(1, array[:1].nbytes)
    step = max(1, _CHUNK_BYTES // row_bytes)
    for start in range(0, rows, step):
        yield start, min(rows, start + step)


def _write_pt(source: Path, target: Path) -> None:
    """A .pt holding one tensor, as torch.save writes it: a zip of torch's records (its pickle,
    written by torch's own `_save`), each stored uncompressed where torch aligns it, the rows
    copied into `data/0` chunk by chunk from the file. torch.load reads it (weights_only=True,
    mmap=True) as it reads torch.save's. torch.save itself read the rows through a memory map
    of the file, whose pages all stayed in the process: its resident set grew by the whole
    array at the end of a run (2 GB for a million rows of 512 float32 features)."""
    import warnings
    import zipfile

    import numpy as np
    import torch

    shape, dtype, data_start = _npy_layout(source)
    nbytes = _row_bytes(shape, dtype) * shape[0]
    # Cut short, its memory map would fail with NumPy's words alone: said as `_copy_bytes` does.
    _require_bytes(source, data_start + nbytes)
    # The tensor torch pickles, its rows never read through this map (none to map: an array).
    array = np.load(source, mmap_mode="c") if nbytes else np.empty(shape, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # from_numpy on a memory map
        tensor = torch.from_numpy(array)
    records = _torch_records(tensor, nbytes)
    if records is None:  # a torch whose `_save` this does not know: torch.save, holding the rows
        with atomic_path(target) as tmp:
            torch_save(tensor, tmp)
    else:
        del tensor, array
        with open(source, "rb") as data, atomic_write(target, "wb") as handle:
            archive = zipfile.ZipFile(handle, "w", zipfile.ZIP_STORED)
            # As torch's writer aligns them: newer torch records the alignment (its setting).
            alignment = int(dict((n, v) for n, v, _ in records).get(".storage_alignment") or 64)
            try:
                for name, value, size in records:
                    info = _aligned_record(f"archive/{name}", handle.tell(), size, alignment)
                    with archive.open(info, "w") as member:
                        if value is not None:
                            member.write(value)
                        else:
                            data.seek(data_start)
                            _copy_bytes(data, member, size, source)
            except BaseException:
                # No end record after an error (a full disk): atomic_write removes the file.
                # Closed (or collected), the archive would write one into it, or a closed file.
                archive.fp = None
                raise
            archive.close()
    remove_tree(source, ignore_errors=False)  # the scratch array, once the file is in place


def _torch_records(tensor, nbytes: int) -> list[tuple[str, bytes | None, int]] | None:
    """The records torch.save writes for `tensor` (name, bytes, size): its small ones in its
    order, then `version` (which torch's zip writer adds), then its one storage, its bytes None
    (the caller copies them). The storage comes last, where torch writes it before `version`:
    zipfile gives a record past 2 GiB a zip64 offset, which torch 2.4's reader refuses in a
    file under 4 GiB ("invalid header or archive is corrupted"); first, every small record's
    offset is small. None where this torch's `torch.serialization._save` (private: the same
    arguments in torch 2.4 and 2.15) does not record them so."""
    import pickle

    import torch

    class Recorder:
        def __init__(self) -> None:
            self.records: list[tuple[str, bytes | None, int]] = []

        def write_record(self, name: str, value, size: int) -> None:
            if isinstance(value, str):
                value = value.encode("utf-8")
            if isinstance(value, bytes | bytearray):
                self.records.append((name, bytes(value[:size]), size))
            else:  # a storage: recorded by size, never read here
                self.records.append((name, None, size))

    recorder = Recorder()
    save = getattr(torch.serialization, "_save", None)
    protocol = getattr(torch.serialization, "DEFAULT_PROTOCOL", 2)
    try:
        save(tensor, recorder, pickle, protocol, False)  # type: ignore[misc]
    except Exception as error:  # noqa: BLE001 (private: whatever it raises, torch.save is the way)
        log.debug("torch.serialization._save cannot be used to write a .pt: %r", error)
        return None
    storages = [record for record in recorder.records if record[1] is None]
    names = [name for name, _, _ in recorder.records]
    if storages != [("data/0", None, nbytes)] or "data.pkl" not in names:
        log.debug("torch.serialization._save wrote other records: %s", names)
        return None
    small = [record for record in recorder.records if record[1] is not None]
    return [*small, ("version", b"3\n", 2), *storages]


def _aligned_record(name: str, offset: int, size: int, alignment: int):
    """The ZipInfo of a stored record whose local header is at `offset`, padded (as torch's
    writer pads, an extra field `FB` of `Z`s) so that its data starts at a multiple of
    `alignment` (a storage loaded with mmap=True starts aligned)."""
    import zipfile

    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_STORED
    info.file_size = size
    # zipfile adds a 20-byte zip64 field to the local header of a record this large.
    zip64 = 20 if size * 1.05 > zipfile.ZIP64_LIMIT else 0
    start = offset + 30 + len(name.encode("utf-8")) + 4 + zip64
    padding = -start % alignment
    info.extra = b"FB" + struct.pack("<H", padding) + b"Z" * padding
    return info


def _require_bytes(source: Path, size: int) -> None:
    """The scratch array `source` holds `size` bytes, as its header says (InputError if not)."""
    short = size - source.stat().st_size
    if short > 0:
        raise _cut_short(source, short)


def _cut_short(source: Path, missing: int) -> InputError:
    """The error of the scratch array `source` ending `missing` bytes before its rows do, told
    as --force would take it (`finish`)."""
    return InputError(
        f"cannot read {source}: it ends {missing} bytes before its rows do", START_OVER
    )


def _copy_bytes(data, target, size: int, source: Path, convert=None, unit: int = 1) -> None:
    """`size` bytes from `data` (at its position) to `target`, a chunk at a time, read into one
    buffer (a new bytes object a chunk held two chunks at once); each chunk, whole values of
    `unit` bytes, written as `convert` gives it where given."""
    buffer = memoryview(bytearray(min(_CHUNK_BYTES - _CHUNK_BYTES % unit, size)))
    left = size
    while left:
        count = data.readinto(buffer[: min(len(buffer), left)])
        if not count:
            raise _cut_short(source, left)
        left -= count
        target.write(buffer[:count] if convert is None else convert(buffer[:count]))


def _write_safetensors(source: Path, target: Path, key: str) -> None:
    """A .safetensors holding one tensor named `key`, written chunk by chunk: the format is a
    JSON header (padded to 8 bytes) after its little-endian u64 length, then the raw data. The
    data is read from the file, not a memory map of it (whose pages, all of them read, stayed in
    the process: its resident set grew by the whole array at the end of a run)."""
    import numpy as np

    shape, dtype, data_start = _npy_layout(source)
    nbytes = _row_bytes(shape, dtype) * shape[0]
    header = {
        key: {
            "dtype": _SAFETENSORS_DTYPES[dtype.name],
            "shape": list(shape),
            "data_offsets": [0, nbytes],
        },
        "__metadata__": {"format": "torchkit extract-features"},
    }
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    little = dtype.newbyteorder("<")  # safetensors' byte order: values swapped where not
    swap = None if dtype == little else lambda values: np.frombuffer(values, dtype).astype(little)
    with open(source, "rb") as data, atomic_write(target, "wb") as handle:
        handle.write(struct.pack("<Q", len(raw)))
        handle.write(raw)
        data.seek(data_start)
        _copy_bytes(data, handle, nbytes, source, convert=swap, unit=dtype.itemsize)
    remove_tree(source, ignore_errors=False)  # the scratch array, once the file is in place
