"""The GPU's JPEG decoder readied while a run sets up (`--decode device` on CUDA).

A process's first `decode_jpeg(..., device="cuda")` creates nvJPEG's handles and buffers and
loads the decode and resize kernels: on the H200 the decode thread spent 2.41 s decoding in
resnet50's first epoch against 1.31 s in a steady one, and the first batch came 1.57 s into the
epoch. Running that first decode (`device_decode.ready_decoder`) in a thread of its own, started
once the data is known, does the work while the main thread builds the model, the optimiser and
the run folder. The first real decode waits for the warm-up (`wait_for_decoder_warm_up`), so
torchkit never uses the decoder from two threads at once, and a warm-up that fails changes
nothing: the run's own decode meets the same error and reports it as it always has.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

_warm_up: threading.Thread | None = None
# A plain lock, not a ForkSafeLock: only the process that decodes on the GPU takes it, and a
# forked child (a DataLoader worker, which hands its JPEG bytes to that process) never does.
_lock = threading.Lock()


def start_decoder_warm_up(ready: Callable[[], object]) -> bool:
    """Call `ready` in a daemon thread, its errors ignored; False (nothing started) while a
    warm-up runs."""
    global _warm_up
    with _lock:
        if _warm_up is not None and _warm_up.is_alive():
            return False
        _warm_up = threading.Thread(
            target=_quietly, args=(ready,), name="torchkit-decoder-warm-up", daemon=True
        )
        _warm_up.start()
    return True


def wait_for_decoder_warm_up() -> None:
    """Return once no warm-up runs (at once from the warm-up's own thread)."""
    global _warm_up
    with _lock:
        thread = _warm_up
    if thread is None or thread is threading.current_thread():
        return
    thread.join()
    with _lock:
        if _warm_up is thread:
            _warm_up = None


def _quietly(ready: Callable[[], object]) -> None:
    try:
        ready()
    except Exception:  # noqa: BLE001 - a warm-up only: the run's own decode reports errors
        return
