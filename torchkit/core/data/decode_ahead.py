"""Batches of JPEG bytes (`--decode device`) decoded ahead, in threads of the main process, so
that the decode of batch k+1 runs while the training step of batch k runs.

In the loop's own thread every batch costs the decode (nvJPEG holds the host until its batch is
done), then the crops' resize kernels, then the step's kernels: the GPU waits for the host
between steps. In threads, the decode and the resize of the next batches are issued while the
main thread issues the step (PyTorch's operators release the GIL while they run), as a DALI or
FFCV pipeline feeds a GPU. Two threads: one takes the loader's batches through the JPEG
decoder (`jpegs_decoded`), the other makes their crops (`cropped_batch`), so that the decoder,
which bounded resnet18 on the H200 when one thread did both (busy 0.90 s of a 0.93 s epoch), is
not also kept from the next batch by the crops' operators (on the 2-core CPU the data path ran
1.34x as fast in two threads as in one). The batches come out in the loader's order,
each exactly what `decoded_batch` gives for it; the first error in a thread is raised in the
loop where the batch would have come.

The cropped batches ready for the loop are small (256 crops of 224 px in 8 bits: 38 MB), and more
of them may wait than the two a step needs: up to `ahead_budget` bytes (512 MiB at most, a 64th
of the GPU's memory). So the decoder goes on while the model's first steps are slow (on the H200,
resnet50's first 5 steps took 1.13 s against 0.31 s later, and the decoder stopped after two
batches), and an epoch started early (`start()`, by `core.train.epoch_starts`) decodes its first
batches while the model is built, or while the epoch before validates.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from torchkit.core.runtime.device import use_in_this_thread

# How many decoded batches may always wait for the loop, whatever their size: one being trained
# on, one ready. More wait while their bytes fit in the budget (`ahead_budget`).
AHEAD = 2
# The budget's ceiling, and its share of the GPU's memory on a small GPU.
AHEAD_BYTES = 512 * 2**20
AHEAD_MEMORY_SHARE = 1 / 64
_END = object()


def ahead_budget(device: Any) -> int:
    """Bytes of decoded batches that may wait for the loop beyond `AHEAD` batches: on CUDA
    the smaller of `AHEAD_BYTES` and a 64th of the device's memory, elsewhere none (on a CPU
    nothing decodes ahead but tests)."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory
    return int(min(AHEAD_BYTES, total * AHEAD_MEMORY_SHARE))


def batch_bytes(item: Any) -> int:
    """The bytes of a decoded batch's pixels (0 for anything else)."""
    images = getattr(item, "images", None)
    if images is None or not hasattr(images, "element_size"):
        return 0
    return images.numel() * images.element_size()


class ReadyBatches:
    """The queue between the threads and the loop: `put` waits while at least `least` items
    wait and one more would take their bytes past `budget`, or until `stopped()`. The end and
    an error are items too, but not batches: `batches()` and `most` count batches only."""

    def __init__(self, least: int, budget: int) -> None:
        self.least, self.budget = least, budget
        self._items: collections.deque = collections.deque()
        self._bytes = 0
        self._batches = 0
        self._changed = threading.Condition()
        self.most = 0  # the most batches that waited at once

    def __len__(self) -> int:
        with self._changed:
            return len(self._items)

    def batches(self) -> int:
        """How many batches wait now."""
        with self._changed:
            return self._batches

    def put(
        self, item: tuple, size: int, stopped: Callable[[], bool], *, is_batch: bool = True
    ) -> bool:
        """Add `item` (`size` bytes) when there is room; False once `stopped()`."""
        with self._changed:
            while len(self._items) >= self.least and self._bytes + size > self.budget:
                if stopped():
                    return False
                self._changed.wait(0.1)
            if stopped():
                return False
            self._items.append((item, size, is_batch))
            self._bytes += size
            self._batches += is_batch
            self.most = max(self.most, self._batches)
            self._changed.notify_all()
            return True

    def get(self) -> tuple:
        """The first item, waiting for one."""
        with self._changed:
            while not self._items:
                self._changed.wait()
            item, size, is_batch = self._items.popleft()
            self._bytes -= size
            self._batches -= is_batch
            self._changed.notify_all()
            return item

    def clear(self) -> None:
        """Drop what waits (close: a thread waiting for room sees the stop)."""
        with self._changed:
            self._items.clear()
            self._bytes = self._batches = 0
            self._changed.notify_all()


def decodes_ahead(decode: str, device: Any) -> bool:
    """Whether training decodes ahead: `--decode device` on a GPU. On a CPU the thread would
    only take cores from the step it is meant to overlap."""
    import torch

    return decode == "device" and torch.device(device).type == "cuda"


class DecodedAhead:
    """Iterate `loader` with each batch through `decoded_batch(batch, device)`, decoded in
    threads before the loop asks for it: `ahead` batches, and more while they fit in `budget`
    bytes (default `ahead_budget(device)`; module doc). The threads start at the iteration, or
    before it with `start()`. `close()` (also at the end of the iteration, and when the loop
    leaves it early through `with`) stops the threads and waits for them, so the loader's
    iterator is never used by two threads."""

    def __init__(
        self,
        loader: Any,
        device: Any,
        *,
        ahead: int = AHEAD,
        budget: int | None = None,
    ) -> None:
        self.loader, self.device = loader, device
        self._started: list[threading.Thread] = []
        self._stop = threading.Event()
        # JPEGs decoded, waiting for their crops; batches ready for the loop.
        self._decoded: queue.Queue = queue.Queue(maxsize=1)
        # Batches of whole decoded images alive at once (being decoded, waiting, being
        # cropped): two. They are the big ones: 256 photos of 12 MP
        # are 9 GB on the GPU, their crops 38 MB.
        self._whole = threading.Semaphore(2)
        self._ready = ReadyBatches(ahead, ahead_budget(device) if budget is None else budget)
        self._iterated = False
        # Seconds spent in the JPEG decoder, on the crops, and waiting for the loader's next
        # batch (each written by one thread; read after close, for `train -v`), and the batches
        # ready when the loop first asked (more than 0 when started early).
        self.jpeg_seconds = 0.0
        self.crop_seconds = 0.0
        self.loader_seconds = 0.0
        self.ready_at_start = 0

    @property
    def most_ready(self) -> int:
        """The most decoded batches that waited for the loop at once."""
        return self._ready.most

    def __len__(self) -> int:
        return len(self.loader)

    def __enter__(self) -> DecodedAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Start the threads now (once; the iteration starts them otherwise)."""
        if self._started:
            return
        self._start(self._decode_all, "torchkit-decode")
        self._start(self._crop_all, "torchkit-decode-crops")

    def __iter__(self) -> Iterator[Any]:
        if self._iterated:
            raise RuntimeError("a DecodedAhead is iterated once")
        self._iterated = True
        self.ready_at_start = self._ready.batches()
        self.start()
        return self._batches()

    def _batches(self) -> Iterator[Any]:
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

    def _start(self, target: Callable, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        self._started.append(thread)
        thread.start()

    def _decode_all(self) -> None:
        """The loader's batches through the JPEG decoder, for `_crop_all`."""
        from torchkit.core.data.device_decode import jpegs_decoded

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
                if not self._acquire(self._whole):
                    return
                decoded = jpegs_decoded(batch, self.device)
                self.jpeg_seconds += time.perf_counter() - decoding
                if not self._put(self._decoded, ("batch", decoded)):
                    return
                if self._stop.is_set():  # taken by close(): read nothing more from the loader
                    return
        except BaseException as error:  # noqa: BLE001 - raised again in the loop's thread
            self._put(self._decoded, ("error", error))
            return
        self._put(self._decoded, (_END, None))

    def _crop_all(self) -> None:
        """The crops of what `_decode_all` decoded, in its order, for the loop."""
        from torchkit.core.data.device_decode import cropped_batch

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

    def _put(self, out: queue.Queue | ReadyBatches, item: tuple) -> bool:
        """Hand `item` on, waiting while `out` is full; False once stopped."""
        if isinstance(out, ReadyBatches):
            is_batch = item[0] == "batch"
            size = batch_bytes(item[1]) if is_batch else 0
            return out.put(item, size, self._stop.is_set, is_batch=is_batch)
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
                self._ready.clear()  # let a blocked thread see the stop
                try:
                    while True:
                        self._decoded.get_nowait()
                except queue.Empty:
                    pass
                thread.join(timeout=0.1)
        self._ready.clear()  # batches started early and never asked for: freed now
