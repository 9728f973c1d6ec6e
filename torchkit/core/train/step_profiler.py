"""`train --profile-steps N`: torch.profiler over the first N optimiser steps of two epochs.

The first epoch a run trains and the one after it: the first shows what a run pays once (CUDA
loading kernels on first use, cuDNN autotuning each new shape, the allocator growing, the
decoder's set-up, the loader's workers starting), the second what every step costs once that is
done. Each profile starts before the epoch's first batch is asked for, so waiting for the loader
is in it too, and stops after its Nth optimiser update (the device synchronised first, so the
kernels of those steps are all in it). Rank 0 writes, under the run folder:

- `profile/epoch-K.txt`: the operators by self time (self CUDA time on a GPU), with a heading
  that names the epoch, the steps and their wall time;
- `profile/epoch-K.json`: the whole trace, for Perfetto (ui.perfetto.dev) or chrome://tracing;
- on a GPU, `profile/epoch-K-gpu.txt`: what the GPU did in those steps, from the trace
  (`core.train.gpu_timeline`): each stream's busy time and kernels, the training stream's idle
  gaps, and the host's waits for the device by thread.

The profiler's overhead on each profiled step is in that epoch's time (metrics.csv's
`epoch_time_s`); its set-up and the writing (seconds) are not: `train -v`'s last line names them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torchkit.core.io.files import atomic_path, atomic_write_text
from torchkit.core.io.non_utf8_names import name_native_code_opens
from torchkit.core.train.outputs import PROFILE_HEADING

log = logging.getLogger("torchkit")

PROFILE_FOLDER = "profile"
EPOCHS_PROFILED = 2
TABLE_ROWS = 40


@contextlib.contextmanager
def profiling(profiler: StepProfiler | None) -> Iterator[None]:
    """Around an epoch: `profiler` (if any) started before it, kept when the epoch ends or
    stops, dropped when it fails (a diverged or broken epoch writes no profile)."""
    if profiler is None:
        yield
        return
    profiler.start()
    try:
        yield
    except BaseException:
        profiler.abandon()
        raise
    profiler.stop()


# What turns CUDA graphs on in inductor's config (its default) while inductor is not loaded.
_INDUCTOR_CUDAGRAPHS = "TORCHINDUCTOR_CUDAGRAPHS"


@contextlib.contextmanager
def _inductor_unasked() -> Iterator[None]:
    """torch.profiler's start asks `hasattr(torch, "_inductor")`, which imports inductor (and
    torch._dynamo and sympy with it: about 3 s of CPU, each --profile-steps run) only to read
    whether inductor's config turns CUDA graphs on. While inductor is not loaded that config is
    its default, off unless $TORCHINDUCTOR_CUDAGRAPHS is 1: then, or once inductor is loaded (a
    compiled model), torch asks as ever; otherwise the question is answered "no" without the
    import, which is what the import would have read. The profile is the same."""
    import sys

    import torch

    lazy = torch.__dict__.get("__getattr__")  # torch's importer of its lazy submodules
    if (
        "torch._inductor" in sys.modules
        or os.environ.get(_INDUCTOR_CUDAGRAPHS) == "1"
        or not callable(lazy)
    ):
        yield
        return

    def without_inductor(name: str) -> Any:
        if name == "_inductor":
            raise AttributeError(f"module 'torch' has no attribute {name!r}")
        return lazy(name)

    torch.__getattr__ = without_inductor
    try:
        yield
    finally:
        torch.__getattr__ = lazy


class StepProfiler:
    """One epoch's profile: `start` before its first batch, `stepped` after each optimiser
    update (it stops itself after the Nth), `stop` when the epoch ends or stops, `abandon` when
    it fails; then `write`, outside the epoch's time (summing the operators and writing the
    trace takes seconds), writes what a stopped profile recorded."""

    def __init__(self, folder: Path, epoch: int, steps: int, device: Any) -> None:
        self.folder, self.epoch, self.steps, self.device = folder, epoch, steps, device
        self.profile: Any = None  # while profiling
        self.recorded: Any = None  # once stopped, until written
        self.updates = 0
        self.started = self.seconds = 0.0
        self.setup_seconds = 0.0  # the profiler's own start (Kineto's set-up: up to seconds)

    def start(self) -> StepProfiler:
        from torch.profiler import ProfilerActivity, profile

        # Kineto writes its start and stop to stderr in its own format (and, where there is no
        # GPU, that it found none): quiet unless the user chose a level.
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        began = time.perf_counter()
        self.profile = profile(activities=activities)
        with _inductor_unasked():
            self.profile.__enter__()
        self.started = time.perf_counter()
        self.setup_seconds = self.started - began
        return self

    @property
    def recording(self) -> bool:
        return self.profile is not None

    def stepped(self) -> None:
        if self.profile is None:
            return
        self.updates += 1
        if self.updates >= self.steps:
            self.stop()

    def stop(self) -> None:
        """Stop profiling (if still on), the device's queued kernels included."""
        profile, self.profile = self.profile, None
        if profile is None:
            return
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.seconds = time.perf_counter() - self.started
        profile.__exit__(None, None, None)
        self.recorded = profile

    def abandon(self) -> None:
        profile, self.profile = self.profile, None
        if profile is not None:
            profile.__exit__(None, None, None)

    def write(self) -> None:
        """The epoch's table and trace, if a stopped profile is waiting."""
        profile, self.recorded = self.recorded, None
        if profile is None:
            return
        self.folder.mkdir(exist_ok=True)
        base = self.folder / f"epoch-{self.epoch}"
        atomic_write_text(base.with_suffix(".txt"), self._table(profile))
        # Kineto takes a name as UTF-8 text: in a run folder whose name is not UTF-8 (a
        # TypeError before), the folder is named by its descriptor (its file's own name is)
        with (
            atomic_path(base.with_suffix(".json")) as trace,
            name_native_code_opens(trace.parent) as folder,
        ):
            profile.export_chrome_trace(os.path.join(folder, trace.name))
            if not _whole_trace(trace):
                # Kineto only logs a write that failed (a full disk): its empty or cut-off
                # trace was kept under the final name as if written, and refused a later --force
                raise OSError("torch.profiler's trace was not written whole")
        written = [f"{base.name}.txt", f"{base.name}.json"]
        idle = self._write_timeline(base, written) if self.device.type == "cuda" else ""
        log.info(
            "epoch %d: profile of its first %d steps in %s: %s%s",
            self.epoch,
            self.updates,
            self.folder,
            ", ".join(written),
            idle,
        )

    def _write_timeline(self, base: Path, written: list[str]) -> str:
        """epoch-K-gpu.txt from the trace just written (its name added to `written`); what
        the log line says of it."""
        from torchkit.core.train.gpu_timeline import render_timeline, timeline_of_file

        try:
            timeline = timeline_of_file(base.with_suffix(".json"))
        except ValueError as error:  # a trace Kineto wrote badly: the table and trace stand
            log.warning("epoch %d: the trace could not be read for the GPU's timeline: %s",
                        self.epoch, error)  # fmt: skip
            return ""
        if timeline is None:
            return ""
        heading = (
            f"{self._heading()} on {self.device}: what the GPU did (the trace's device activity)\n"
        )
        gpu = base.parent / f"{base.name}-gpu.txt"
        atomic_write_text(gpu, render_timeline(timeline, heading))
        written.append(gpu.name)
        if timeline.window_ms <= 0:
            return ""
        share = 100 * timeline.main_idle_ms / timeline.window_ms
        return (
            f"; the GPU's busiest stream sat idle {timeline.main_idle_ms:.0f} ms of "
            f"{timeline.window_ms:.0f} ({share:.0f}%)"
        )

    def _heading(self) -> str:
        return f"{PROFILE_HEADING}{self.epoch}, its first {self.updates} optimiser steps"

    def _table(self, profile: Any) -> str:
        on_gpu = self.device.type == "cuda"
        key = "self_cuda_time_total" if on_gpu else "self_cpu_time_total"
        heading = (
            f"{self._heading()} in this run (from before the first batch was asked for), "
            f"{self.seconds:.3f} s of wall time "
            f"on {self.device}; operators by {'self CUDA' if on_gpu else 'self CPU'} time, "
            f"the top {TABLE_ROWS}\n\n"
        )
        return heading + profile.key_averages().table(sort_by=key, row_limit=TABLE_ROWS) + "\n"


def _whole_trace(path: Path) -> bool:
    """Whether `path` holds a trace as `export_chrome_trace` writes one, to its end: a trace's
    start (`is_chrome_trace`), and its JSON's closing bracket last."""
    from torchkit.core.io.output_proofs import is_chrome_trace

    if not is_chrome_trace(path):
        return False
    with open(path, "rb") as handle:
        handle.seek(max(0, os.fstat(handle.fileno()).st_size - 64))
        return handle.read().rstrip().endswith((b"}", b"]"))
