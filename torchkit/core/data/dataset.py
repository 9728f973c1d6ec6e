"""The torch Dataset over `Samples` that skips unreadable images instead of crashing the
DataLoader, the one inference commands read (`inference_dataset`), and the DataLoader settings
that go with them: worker count, start method, seeding."""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from torchkit.core.data.preprocessing import Preprocess
from torchkit.core.data.sources.samples import Samples
from torchkit.core.runtime.cpus import usable_cpus
from torchkit.core.runtime.orphans import end_with_parent, exit_if_orphaned


def worker_options(workers: int, then: Callable[[int], None] | None = None) -> dict[str, Any]:
    """The DataLoader arguments of `workers` worker processes (none for 0): forked
    (`loader_context`), each started by `OrphanedWorkerExit` and then `then`."""
    if workers <= 0:
        return {}
    workers_temp_folder()
    context = loader_context()
    if context is None:  # not forked: the workers' parent is not the loader's process
        return {"worker_init_fn": then} if then is not None else {}
    return {"multiprocessing_context": context, "worker_init_fn": OrphanedWorkerExit(then)}


def workers_temp_folder() -> str:
    """multiprocessing's temporary folder, made here (in TMPDIR) before any worker is forked.
    A worker hands each batch over through a socket in that folder (torch shares tensors by
    file descriptor); made in the worker, a failure (a full disk, a folder removed since a
    library caller made it) loses the batch in a thread of the worker, and the loader waits for
    it forever. Made here it is an error, and the workers inherit the folder."""
    import tempfile
    from multiprocessing import process, util

    from torchkit.core.io.errors import TorchkitError

    config = process.current_process()._config
    made = config.get("tempdir")
    if made is not None and not os.path.isdir(made):
        del config["tempdir"]  # removed since: made again
    try:
        return util.get_temp_dir()
    except OSError as error:
        raise TorchkitError(
            f"cannot make the temporary folder loader workers hand batches over through, in "
            f"{tempfile.gettempdir()}: {error.strerror or error}",
            "free some space there, set TMPDIR to a writable folder with room, or use --workers 0",
        ) from None


class OrphanedWorkerExit:
    """A forked DataLoader worker's first step: end with the process that made the loader.
    torch's watchdog notes the worker's parent only after this step, so a worker forked just
    before its parent was killed took init as its parent, never saw it die, and waited
    forever, keeping what it inherited open: the run folder's lock with it, which refused
    every later run on that folder. And a worker whose parent is killed later sees it only at
    the watchdog's next look, up to 5 s on, holding that lock until then: a rerun at once
    (a retry after the OOM killer, `timeout -s KILL`) was refused as "being written by another
    torchkit process" with the dead PID. So a worker forked by the main thread is ended by
    the kernel with its parent (`end_with_parent`); one forked by another thread (a loader
    read ahead in a thread) is not, as the kernel would end it with that thread."""

    def __init__(self, then: Callable[[int], None] | None = None) -> None:
        import threading

        self.parent = os.getpid()
        self.main_thread = threading.main_thread().ident
        self.then = then

    def __call__(self, worker_id: int) -> None:
        import threading

        # A forked process runs on in the thread that forked it, with that thread's ident.
        if threading.get_ident() == self.main_thread:
            end_with_parent(self.parent)
        else:
            exit_if_orphaned(self.parent)
        if self.then is not None:
            self.then(worker_id)


def loader_context():
    """The multiprocessing context of DataLoaders over `make_dataset`: fork where there is one,
    because the Dataset class is local and spawn or forkserver (the Linux default from Python
    3.14) could not pickle it; None (the platform's default) elsewhere. Workers never touch
    CUDA."""
    import multiprocessing

    if "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    return None


class PackedPaths:
    """File paths in one bytes buffer and an array of their ends: what a forked DataLoader
    worker reads an item's path from. Read from a list, every path is a str object whose
    reference count the worker writes, so the kernel copies the page that holds it into the
    worker: each worker of a shuffled epoch ended up with its own copy of every path (about
    100 bytes an image, times the workers). Two objects here, one page each. Every str comes
    back exactly (UTF-8 with `surrogatepass`: a name that is not UTF-8 too)."""

    def __init__(self, paths: Sequence[str]) -> None:
        self._data = bytearray()  # appended to, path by path: no list of a million bytes
        self._ends = array("q")
        for path in paths:
            self._data += path.encode("utf-8", "surrogatepass")
            self._ends.append(len(self._data))

    def __len__(self) -> int:
        return len(self._ends)

    def __getitem__(self, index: int) -> str:
        start, end = _span(self._ends, index)
        return self._data[start:end].decode("utf-8", "surrogatepass")


def _span(ends: array, index: int) -> tuple[int, int]:
    """(start, end) of item `index` (negative: from the end, as a list's) of a buffer whose
    items end at `ends`; IndexError past either end."""
    end = ends[index]
    if index < 0:
        index += len(ends)
    return (ends[index - 1] if index > 0 else 0), end


class PackedStoredImages:
    """`StoredImage`s (images in shards, a .tar, parquet files) packed as `PackedPaths` packs
    paths: each one's name, its reader (an index into the few readers, the same objects) and
    its locator (pickled here, from the listing: no outside data). A list of them was copied
    into every worker as a list of paths was, with each image's locator and attributes: about
    240 bytes an image a worker."""

    def __init__(self, images: Sequence[Any]) -> None:
        import pickle

        from torchkit.core.data.stored_image import StoredImage

        self._loads, self._stored_image = pickle.loads, StoredImage  # no import per item
        self._names = PackedPaths(images)
        self._readers: list[Any] = []
        self._reader_of = array("q")
        self._locators = bytearray()
        self._locator_ends = array("q")
        numbers: dict[int, int] = {}  # id(reader) -> its index in _readers
        for image in images:
            number = numbers.get(id(image.reader))
            if number is None:
                number = numbers[id(image.reader)] = len(self._readers)
                self._readers.append(image.reader)
            self._reader_of.append(number)
            self._locators += pickle.dumps(image.locator, pickle.HIGHEST_PROTOCOL)
            self._locator_ends.append(len(self._locators))

    def __len__(self) -> int:
        return len(self._names)

    def __getitem__(self, index: int) -> Any:
        start, end = _span(self._locator_ends, index)
        locator = self._loads(self._locators[start:end])
        reader = self._readers[self._reader_of[index]]
        return self._stored_image(self._names[index], reader, locator)


def worker_paths(paths: Any) -> Any:
    """`paths` as a forked worker should read them: a plain list of str packed
    (`PackedPaths`), one of `StoredImage`s too (`PackedStoredImages`); anything else (a stdin
    list that grows as it is read) as it is."""
    from torchkit.core.data.stored_image import StoredImage

    if type(paths) is not list:
        return paths
    if all(type(path) is str for path in paths):
        return PackedPaths(paths)
    if all(type(path) is StoredImage for path in paths):
        return PackedStoredImages(paths)
    return paths


def stop_workers(batches: Any) -> None:
    """Stop the worker processes of `batches` now: a DataLoader's iterator, or a DataLoader
    (its persistent workers' iterator); nothing where it has none. Dropping the last reference
    to the iterator is not enough once a run failed on an error one of its workers raised (a
    shard written again since it was listed): the traceback, which a caller may keep (a
    notebook's last one, a test runner's result), holds the iterator's own frame, and the
    workers lived as long as it did."""
    iterator = getattr(batches, "_iterator", batches)  # a loader's: None before its first pass
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def worker_labels(labels: Any) -> Any:
    """`labels` as a forked worker should read them: a plain list of ints in an array (an int
    of 257 or more is an object of its own, copied into each worker as a path is); anything
    else as it is."""
    if type(labels) is list and all(type(label) is int for label in labels):
        try:
            return array("q", labels)
        except OverflowError:
            return labels
    return labels


def make_dataset(samples: Samples, transform, *, mode: str = "RGB", pixels: bool = False):
    """A torch Dataset over `samples` whose items are (tensor, label, index, error).

    Files are read by `core.image_files.load_image`: 16-bit images scaled to 8 bits, the pixels
    as stored (no EXIF rotation), and a path that is not a regular file (a FIFO, a dangling
    symlink) unreadable without being opened.
    An unreadable image gives `(None, label, index, "path: reason")` instead of raising, so one
    corrupt file does not kill a DataLoader worker; `collate_skipping_unreadable` drops it and
    reports it to the main process, which counts it (or stops, with --strict).

    A transform with a `from_file(path, mode)` method (`train_transform(decode="fast")`) reads
    image files itself, through the same opener. With `pixels`, such a transform's
    `pixels_from_file` is called instead: its items are uint8 pixels where it can give them
    (no random erasing), which the training loop normalises a batch at a time on the device
    (`FileTrainTransform.normalized`), a quarter of the bytes to pass along.
    """
    import torch
    from PIL import Image

    from torchkit.core.data.image_files import (
        load_image,
        unreadable_image_errors,
        unreadable_reason,
    )
    from torchkit.core.data.stored_image import recorded_source

    from_file = getattr(transform, "pixels_from_file" if pixels else "from_file", None)
    unreadable = unreadable_image_errors()
    # The workers read paths and labels from packed copies, never from `samples`' lists (see
    # `PackedPaths`); a sample list that grows as it is read (stdin) is read as it is.
    paths = None if samples.paths is None else worker_paths(samples.paths)
    labels = worker_labels(samples.labels)

    class _ImageDataset(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(samples)

        def __getitem__(self, index: int):
            label = labels[index]
            try:
                if samples.images is not None:
                    image = Image.fromarray(samples.images[index])
                elif from_file is not None:
                    return from_file(paths[index], mode), label, index, ""
                else:
                    # Regular files only (a FIFO would block), high bit depths scaled.
                    image = load_image(paths[index], mode)
                if image.mode != mode:
                    image = image.convert(mode)
                return transform(image), label, index, ""
            except unreadable as error:
                name = paths[index] if samples.paths else str(index)
                reason = unreadable_reason(error)
                return None, label, index, f"{name}: {reason}{recorded_source(name)}"

    return _ImageDataset()


def seed_worker(worker_id: int) -> None:
    """Seed NumPy and `random` in each DataLoader worker from torch's per-worker seed."""
    import random

    import numpy as np
    import torch

    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


class WithholdingSampler:
    """A sampler that `withheld()` empties for a while: a loader with persistent workers
    iterated there starts its workers and hands them nothing yet
    (`train.loaders.Loaders.start_workers`)."""

    _withheld = False

    @contextmanager
    def withheld(self) -> Iterator[None]:
        """No index inside the block."""
        self._withheld = True
        try:
            yield
        finally:
            self._withheld = False


class ShardSampler(WithholdingSampler):
    """Indices rank, rank + world_size, ...: the evaluation shards of all ranks cover every
    image exactly once (torch's DistributedSampler pads the shards with repeated images, which
    would then be counted twice). Eval's loader and train's validation and test loaders."""

    def __init__(self, size: int, rank: int = 0, world_size: int = 1) -> None:
        self.indices = range(rank, size, world_size)

    def __iter__(self):
        return iter(range(0) if self._withheld else self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def default_workers() -> int:
    """Loader workers: one core is left to the main process (the cores it may use, not the
    machine's: taskset and container cpusets count)."""
    return max(0, min(8, usable_cpus() - 1))


def inference_dataset(samples: Samples, preprocess: Preprocess, *, mode: str, decode: str):
    """What eval, predict and extract-features read: 8-bit crops of the eval recipe (normalised
    on the device by `core.decode.NormalizedPixels`), or JPEG bytes with `decode="device"`.
    Images in memory (digits) are cropped once, without torchvision (`core.data.in_memory`)."""
    if samples.images is not None and decode != "device":
        from torchkit.core.data.in_memory import InMemoryEvalImages

        return InMemoryEvalImages(samples, preprocess, mode)
    from torchkit.core.data.transforms import eval_transform

    transform = eval_transform(preprocess, pixels=True, decode=decode)
    return make_dataset(samples, transform, mode=mode, pixels=True)


def inference_workers(samples: Samples, workers: int | None) -> int:
    """Loader workers of an inference command: as asked, else none for images in memory
    (cropped already: a worker process would only add its start and the copies) and
    `default_workers()` for files."""
    if workers is not None:
        return workers
    return 0 if samples.images is not None else default_workers()
