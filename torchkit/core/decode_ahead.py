"""Batches of JPEG bytes (`--decode device`) decoded one batch ahead, in a thread of the main
process, so that the decode of batch k+1 runs while the training step of batch k runs.

In the loop's own thread every batch costs the decode (nvJPEG holds the host until its batch is
done), then the crops' resize kernels, then the step's kernels: the GPU waits for the host
between steps. In a thread, the decode and the resize of the next batch are issued while the
main thread issues the step (PyTorch's operators release the GIL while they run), as a DALI or
FFCV pipeline feeds a GPU. The batches come out in the loader's order, each exactly what
`decoded_batch` gives for it; the first error in the thread is raised in the loop where the
batch would have come.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

# How many decoded batches wait for the loop: one being trained on, one ready. More would hold
# more decoded images in GPU memory and gain nothing once the decode keeps up.
AHEAD = 2
_END = object()


def decodes_ahead(decode: str, device: Any) -> bool:
    """Whether training decodes ahead: `--decode device` on a GPU. On a CPU the thread would
    only take cores from the step it is meant to overlap."""
    import torch

    return decode == "device" and torch.device(device).type == "cuda"


class DecodedAhead:
    """Iterate `loader` with each batch through `decoded_batch(batch, device)`, decoded in a
    thread up to `ahead` batches before the loop asks for it. `close()` (also at the end of
    the iteration, and when the loop leaves it early through `with`) stops the thread and waits
    for it, so the loader's iterator is never used by two threads."""

    def __init__(self, loader: Any, device: Any, *, ahead: int = AHEAD) -> None:
        self.loader, self.device, self.ahead = loader, device, ahead
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._ready: queue.Queue = queue.Queue(maxsize=ahead)
        # Seconds the thread spent in the decode (of which `times.jpeg_seconds` in the JPEG
        # decoder), and waiting for the loader's next batch (written by the thread; read
        # after close, for `train -v`).
        self.decode_seconds = 0.0
        self.loader_seconds = 0.0
        from torchkit.core.device_decode import DecodeTimes

        self.times = DecodeTimes()

    def __len__(self) -> int:
        return len(self.loader)

    def __enter__(self) -> DecodedAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[Any]:
        if self._thread is not None:
            raise RuntimeError("a DecodedAhead is iterated once")
        self._thread = threading.Thread(
            target=self._decode_all, name="torchkit-decode", daemon=True
        )
        self._thread.start()
        try:
            while True:
                kind, value = self._ready.get()
                if kind is _END:
                    return
                if kind == "error":
                    raise value
                yield value
        finally:
            self.close()

    def _decode_all(self) -> None:
        import torch

        from torchkit.core.device_decode import decoded_batch

        try:
            device = torch.device(self.device)
            if device.type == "cuda" and device.index is not None:
                torch.cuda.set_device(device)  # a thread starts on GPU 0, not on the loop's
            batches = iter(self.loader)
            while True:
                asked = time.perf_counter()
                batch = next(batches, _END)
                decoding = time.perf_counter()
                self.loader_seconds += decoding - asked
                if batch is _END or self._stop.is_set():
                    break
                decoded = decoded_batch(batch, self.device, self.times)
                self.decode_seconds += time.perf_counter() - decoding
                if not self._put(("batch", decoded)):
                    return
                if self._stop.is_set():  # taken by close(): read nothing more from the loader
                    return
        except BaseException as error:  # noqa: BLE001 - raised again in the loop's thread
            self._put(("error", error))
            return
        self._put((_END, None))

    def _put(self, item: tuple) -> bool:
        """Hand `item` to the loop, waiting while `ahead` batches wait; False once stopped."""
        while not self._stop.is_set():
            try:
                self._ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def close(self) -> None:
        """Stop the thread and wait for it (it finishes the batch it is decoding)."""
        self._stop.set()
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return
        while thread.is_alive():
            try:  # let a thread blocked on a full queue see the stop
                while True:
                    self._ready.get_nowait()
            except queue.Empty:
                pass
            thread.join(timeout=0.1)
