"""Batches of JPEG bytes (`--decode device`) decoded ahead, in threads of the main process, so
that the decode of batch k+1 runs while the training step of batch k runs.

In the loop's own thread every batch costs the decode (nvJPEG holds the host until its batch is
done), then the crops' resize kernels, then the step's kernels: the GPU waits for the host
between steps. In threads, the decode and the resize of the next batches are issued while the
main thread issues the step (PyTorch's operators release the GIL while they run), as a DALI or
FFCV pipeline feeds a GPU. Two threads by default: one takes the loader's batches through the
JPEG decoder (`jpegs_decoded`), the other makes their crops (`cropped_batch`), so that the
decoder, which bounds resnet18 on the H200 (its thread busy 0.90 s of a 0.93 s epoch), is not
also kept from the next batch by the crops' operators. `TORCHKIT_ONE_DECODE_THREAD=1` does
both in one thread (the GPU check times both ways). The batches come out in the loader's order,
each exactly what `decoded_batch` gives for it; the first error in a thread is raised in the
loop where the batch would have come.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from torchkit.core.device import use_in_this_thread

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
    """Iterate `loader` with each batch through `decoded_batch(batch, device)`, decoded in
    threads up to `ahead` batches before the loop asks for it (module doc). `close()` (also at
    the end of the iteration, and when the loop leaves it early through `with`) stops the
    threads and waits for them, so the loader's iterator is never used by two threads."""

    def __init__(
        self, loader: Any, device: Any, *, ahead: int = AHEAD, threads: int | None = None
    ) -> None:
        self.loader, self.device, self.ahead = loader, device, ahead
        if threads is None:
            threads = 1 if os.environ.get("TORCHKIT_ONE_DECODE_THREAD", "") == "1" else 2
        self.threads = threads
        self._started: list[threading.Thread] = []
        self._stop = threading.Event()
        # JPEGs decoded, waiting for their crops (two threads only); batches ready for the loop.
        self._decoded: queue.Queue = queue.Queue(maxsize=1)
        # Batches of whole decoded images alive at once (being decoded, waiting, being
        # cropped): two, where one thread had one. They are the big ones: 256 photos of 12 MP
        # are 9 GB on the GPU, their crops 38 MB.
        self._whole = threading.Semaphore(2)
        self._ready: queue.Queue = queue.Queue(maxsize=ahead)
        # Seconds spent in the JPEG decoder, on the crops, and waiting for the loader's next
        # batch (each written by one thread; read after close, for `train -v`).
        self.jpeg_seconds = 0.0
        self.crop_seconds = 0.0
        self.loader_seconds = 0.0

    def __len__(self) -> int:
        return len(self.loader)

    def __enter__(self) -> DecodedAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[Any]:
        if self._started:
            raise RuntimeError("a DecodedAhead is iterated once")
        if self.threads == 1:
            self._start(self._decode_all, "torchkit-decode", self._ready, crop=True)
        else:
            self._start(self._decode_all, "torchkit-decode", self._decoded, crop=False)
            self._start(self._crop_all, "torchkit-decode-crops")
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

    def _start(self, target: Callable, name: str, *args: Any, **kwargs: Any) -> None:
        thread = threading.Thread(target=target, args=args, kwargs=kwargs, name=name, daemon=True)
        self._started.append(thread)
        thread.start()

    def _decode_all(self, out: queue.Queue, *, crop: bool) -> None:
        """The loader's batches through the JPEG decoder into `out`, and through the crops too
        when `crop` (one thread)."""
        from torchkit.core.device_decode import cropped_batch, jpegs_decoded

        try:
            use_in_this_thread(self.device)
            batches = iter(self.loader)
            while True:
                asked = time.perf_counter()
                batch = next(batches, _END)
                decoding = time.perf_counter()
                self.loader_seconds += decoding - asked
                if batch is _END or self._stop.is_set():
                    break
                if not crop and not self._acquire(self._whole):
                    return
                decoded = jpegs_decoded(batch, self.device)
                cropping = time.perf_counter()
                self.jpeg_seconds += cropping - decoding
                if crop:
                    decoded = cropped_batch(decoded, self.device)
                    self.crop_seconds += time.perf_counter() - cropping
                if not self._put(out, ("batch", decoded)):
                    return
                if self._stop.is_set():  # taken by close(): read nothing more from the loader
                    return
        except BaseException as error:  # noqa: BLE001 - raised again in the loop's thread
            self._put(out, ("error", error))
            return
        self._put(out, (_END, None))

    def _crop_all(self) -> None:
        """The crops of what `_decode_all` decoded, in its order, for the loop."""
        from torchkit.core.device_decode import cropped_batch

        try:
            use_in_this_thread(self.device)
            while not self._stop.is_set():
                try:
                    kind, value = self._decoded.get(timeout=0.1)
                except queue.Empty:
                    continue
                if kind != "batch":  # the end, or the decoding thread's error: passed on
                    self._put(self._ready, (kind, value))
                    return
                cropping = time.perf_counter()
                cropped = cropped_batch(value, self.device)
                del value  # the whole images: freed before the next batch may be decoded
                self._whole.release()
                self.crop_seconds += time.perf_counter() - cropping
                if not self._put(self._ready, ("batch", cropped)):
                    return
        except BaseException as error:  # noqa: BLE001 - raised again in the loop's thread
            self._put(self._ready, ("error", error))

    def _acquire(self, semaphore: threading.Semaphore) -> bool:
        """Take `semaphore`, waiting while it is taken; False once stopped."""
        while not self._stop.is_set():
            if semaphore.acquire(timeout=0.1):
                return True
        return False

    def _put(self, out: queue.Queue, item: tuple) -> bool:
        """Hand `item` on, waiting while `out` is full; False once stopped."""
        while not self._stop.is_set():
            try:
                out.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def close(self) -> None:
        """Stop the threads and wait for them (each finishes the batch it holds)."""
        self._stop.set()
        for thread in self._started:
            if thread is threading.current_thread():
                continue
            while thread.is_alive():
                for waiting in (self._decoded, self._ready):  # let a blocked thread see the stop
                    try:
                        while True:
                            waiting.get_nowait()
                    except queue.Empty:
                        pass
                thread.join(timeout=0.1)
