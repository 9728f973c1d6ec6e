"""Peak memory of a benchmark step, and what `--memory-limit` means.

- CUDA: `torch.cuda.max_memory_allocated` since `reset_peak_memory_stats` (the tensors the
  caching allocator handed out at the peak: weights, activations, gradients, optimizer state;
  the allocator's cache and the CUDA context are not included).
- MPS: the highest `torch.mps.current_allocated_memory` (the tensors on the GPU, as CUDA's
  figure) sampled by a thread every millisecond from `start()` to `stop()`: MPS keeps no peak
  to read, so a peak shorter than a sample can be missed (the figure errs low).
- CPU: the growth of the process's resident set (RSS) over the run: the peak (Linux `VmHWM`,
  reset through `/proc/self/clear_refs` before the run) less the RSS before it. Memory freed
  but kept by the C allocator is handed back first (`malloc_trim`), so a run that follows a
  bigger one is not flattered by reusing its pages. Where the peak cannot be reset (not
  Linux, or a kernel that refuses it), a thread samples the RSS every millisecond instead.
  The weights, loaded before the run, are not part of the growth; on the first run of a
  process, one-time allocations (oneDNN's kernels and caches) are.

`--memory-limit` is a size as every size option reads it (`2GB` is 2*10^9 bytes, `512MiB` and
`512M` 512*2^20, `1e9` bytes: core/io/sizes.py) or a percentage: of the memory
available when the run starts on the CPU (`MemAvailable`, or what a container's cgroup memory
limit leaves where that is less: runtime/memory.py), of the GPU's total memory on CUDA.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torchkit.core.io.errors import UsageError
from torchkit.core.io.sizes import parse_size
from torchkit.core.runtime.memory import available_memory, proc_kib

CPU_DEFAULT_LIMIT = "50%"  # of the memory available at the start: room for the OS and others


@dataclass(frozen=True)
class MemoryLimit:
    """`--memory-limit`: a number of bytes, or a fraction of the device's memory."""

    text: str
    bytes: int | None = None
    fraction: float | None = None

    def resolve(self, device: Any) -> int:
        """The limit in bytes on `device` (a torch.device)."""
        if self.bytes is not None:
            return self.bytes
        return int(self.fraction * device_memory(device))


def parse_memory_limit(text: str) -> MemoryLimit:
    """A size ('2GB', '512MiB', '1.5G', '1000000' bytes: `parse_size`) or '50%'."""
    cleaned = text.strip()
    if cleaned.endswith("%"):
        try:  # ASCII digits only, as every number in an option value
            percent = float(cleaned[:-1]) if cleaned.isascii() else -1.0
        except ValueError:
            percent = -1.0
        if not 0 < percent <= 100:
            raise UsageError(f"--memory-limit {text!r} is not a percentage in (0, 100]", "e.g. 50%")
        return MemoryLimit(cleaned, fraction=percent / 100)
    try:
        size = parse_size(cleaned, "--memory-limit")
    except UsageError as error:
        raise UsageError(error.message, f"{error.hint}, or a percentage such as 50%") from None
    return MemoryLimit(cleaned, bytes=size)


def device_memory(device: Any) -> int:
    """What a percentage limit is a percentage of: the GPU's total memory, or the memory
    available to a CPU process now."""
    if device.type == "cuda":
        import torch

        return int(torch.cuda.get_device_properties(device).total_memory)
    available = available_memory()
    if available is None:
        raise UsageError(
            "cannot tell how much memory this machine has", "give --memory-limit as a size"
        )
    return available


def check_search_measures(device: Any) -> None:
    """Refuse `--find-batch-size` where no trial's peak can be measured: every trial would
    count as fitting, and the search double up to `--max-batch-size` unchecked. On MPS the
    probe reads the CPU's RSS, not the GPU's memory; where /proc is missing (macOS) it reads
    nothing. `getrusage`'s `ru_maxrss` is no substitute: a peak over the process's life that
    cannot be reset, it says nothing of a trial that stays below an earlier one, and without
    the RSS now there is no baseline to take the growth from."""
    if device.type == "cuda":
        return
    if device.type == "mps":
        why = "on mps the peak is only sampled, and a missed peak would pass as fitting"
    elif rss_bytes() is None:
        why = "this system does not tell a process its resident memory (no /proc)"
    else:
        return
    raise UsageError(
        f"--find-batch-size cannot measure peak memory here: {why}",
        "compare batch sizes with --batch-size 1,8,32, or search on a CUDA GPU",
    )


def rss_bytes() -> int | None:
    """The resident set size of this process now (Linux), else None."""
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _reset_rss_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux 4.0+). False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")
    except OSError:
        return False
    return proc_kib("/proc/self/status", "VmHWM:") is not None


def release_free_memory() -> None:
    """Collect garbage and hand the C allocator's free pages back to the OS (glibc)."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


_TRIM: list[Any] = []


def _malloc_trim():
    if not _TRIM:
        function = None
        if sys.platform.startswith("linux"):
            with contextlib.suppress(OSError, AttributeError):
                function = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        _TRIM.append(function)
    return _TRIM[0]


class _Sampler:
    """The highest reading of `read` (bytes; None counts as 0), sampled from a thread every
    `interval` s: the RSS where VmHWM cannot be reset, the memory allocated on MPS."""

    def __init__(self, read: Callable[[], int | None], interval: float = 0.001) -> None:
        self.read, self.interval = read, interval
        self.peak = read() or 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.wait(self.interval):
            self.peak = max(self.peak, self.read() or 0)

    def stop(self) -> int:
        self.stopping.set()
        self.thread.join()
        return max(self.peak, self.read() or 0)


MEMORY_KINDS = {"cuda": "cuda_max_allocated", "mps": "mps_allocated_sampled"}  # else the CPU's


class MemoryProbe:
    """Peak memory of what runs between `start()` and `stop()` on `device`."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.kind = MEMORY_KINDS.get(device.type, "cpu_rss_growth")
        self._baseline: int | None = None
        self._sampler: _Sampler | None = None
        self._hwm = False

    def start(self) -> None:
        if self.device.type == "cuda":
            import torch

            gc.collect()
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        if self.device.type == "mps":
            import torch

            gc.collect()
            torch.mps.synchronize()
            torch.mps.empty_cache()
            self._sampler = _Sampler(torch.mps.current_allocated_memory)
            return
        release_free_memory()
        self._baseline = rss_bytes()
        if self._baseline is None:
            return  # no way to read the RSS here: the peak is reported as unknown
        self._hwm = _reset_rss_peak()
        if not self._hwm:
            self._sampler = _Sampler(rss_bytes)

    def stop(self) -> int | None:
        """Peak bytes since `start()` (None where it cannot be measured)."""
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)
            return int(torch.cuda.max_memory_allocated(self.device))
        if self.device.type == "mps" and self._sampler is not None:
            import torch

            torch.mps.synchronize()  # the steps queued are done: their memory is counted
            peak = self._sampler.stop()
            self._sampler = None
            return peak
        if self._baseline is None:
            return None
        if self._sampler is not None:
            peak = self._sampler.stop()
            self._sampler = None
        else:
            peak = proc_kib("/proc/self/status", "VmHWM:") or 0
        return max(0, peak - self._baseline)

    def cancel(self) -> None:
        """Stop sampling without a result (the run failed)."""
        if self._sampler is not None:
            self._sampler.stop()
            self._sampler = None
