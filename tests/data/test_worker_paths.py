"""What a DataLoader worker reads an item's path and label from (`core.data.dataset.make_dataset`):
packed copies made with the dataset, never the samples' Python lists, whose str and int
objects a forked worker would copy page by page as it wrote their reference counts (a copy of
every path in every worker of a shuffled epoch)."""

from __future__ import annotations

import os

from torchkit.core.data.dataset import make_dataset
from torchkit.core.data.sources.samples import Samples


class _ReturnsPath:
    """A file transform that reads no file: its item is the path it was given."""

    def pixels_from_file(self, path, mode):
        return path


class _Untouchable:
    """A list no item may be read from (what the workers' reads would copy)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __bool__(self) -> bool:
        return True

    def __getitem__(self, index):
        raise AssertionError(f"item {index} read from the samples' own list")


NAMES = [
    "cat/a.png",
    "/data/ünïcödé/б.jpg",
    os.fsdecode(b"dog/\xff\xfe-latin1.png"),  # not UTF-8: surrogate-escaped
    "x" * 300 + "/long.png",
    "",
    "\ud800lone-surrogate.png",
]


def test_items_read_packed_paths_and_labels_not_the_samples_lists():
    labels = [0, 300, 2, 70000, 1, 299]  # 257 and more: int objects of their own
    samples = Samples(["a", "b"], list(labels), list(NAMES))  # labels unchecked here
    dataset = make_dataset(samples, _ReturnsPath(), pixels=True)
    samples.paths = _Untouchable(len(NAMES))
    samples.labels = _Untouchable(len(NAMES))
    items = [dataset[index] for index in range(len(dataset))]
    assert [item[0] for item in items] == NAMES  # every str back exactly
    assert [item[1] for item in items] == labels
    assert all(type(item[1]) is int for item in items)


def test_an_unreadable_image_is_named_by_its_exact_path(tmp_path):
    missing = os.fsdecode(os.fsencode(tmp_path) + b"/gone-\xff.png")
    samples = Samples(["a"], [0], [missing])
    dataset = make_dataset(samples, lambda image: image)
    samples.paths = _Untouchable(1)
    image, label, index, error = dataset[0]
    assert (image, label, index) == (None, 0, 0)
    assert error.startswith(f"{missing}: ")


def test_paths_that_are_not_a_list_of_str_are_read_as_they_are():
    member = object()  # a stdin list's entry: neither a str nor a stored image
    samples = Samples(["a"], [0], [member])
    dataset = make_dataset(samples, _ReturnsPath(), pixels=True)
    assert dataset[0][0] is member


def test_packed_paths_index_like_the_list():
    from torchkit.core.data.dataset import PackedPaths

    packed = PackedPaths(NAMES)
    assert len(packed) == len(NAMES)
    assert [packed[i] for i in range(len(NAMES))] == NAMES
    assert len(PackedPaths([])) == 0


class _Reader:
    def read(self, locator):
        return repr(locator).encode()


def test_stored_images_come_back_with_their_reader_and_locator():
    from torchkit.core.data.stored_image import StoredImage

    readers = [_Reader(), _Reader()]
    locators = [(512, 3000), None, (1, 2, 3), (7, "cls/x.jpg")]  # tar, parquet, http shards
    images = [
        StoredImage(f"train-{i}.tar/{name}", readers[i % 2], locator)
        for i, (name, locator) in enumerate(zip(NAMES, locators, strict=False))
    ]
    samples = Samples(["a"], [0] * len(images), list(images))
    dataset = make_dataset(samples, _ReturnsPath(), pixels=True)
    for index, image in enumerate(images):
        item = dataset[index][0]
        assert item is not image  # made from the packed copy, not read from the list
        assert type(item) is StoredImage and item == image
        assert item.reader is image.reader and item.locator == image.locator
        assert item.read_bytes() == image.read_bytes()


def test_a_negative_index_counts_from_the_end_as_in_the_samples_lists():
    import pytest

    from torchkit.core.data.dataset import PackedPaths
    from torchkit.core.data.stored_image import StoredImage

    # Read as a list reads it; a negative index read every path joined into one before.
    labels = list(range(len(NAMES)))
    dataset = make_dataset(Samples(["a"], labels, list(NAMES)), _ReturnsPath(), pixels=True)
    items = [dataset[index] for index in range(-len(NAMES), 0)]
    assert [item[0] for item in items] == NAMES and [item[1] for item in items] == labels
    images = [StoredImage(name, _Reader(), (i, name)) for i, name in enumerate(NAMES)]
    stored = make_dataset(Samples(["a"], labels, list(images)), _ReturnsPath(), pixels=True)
    for index in range(-len(NAMES), 0):
        item = stored[index][0]
        assert item == images[index] and item.locator == images[index].locator
    packed = PackedPaths(NAMES)
    for past in (len(NAMES), -len(NAMES) - 1):
        with pytest.raises(IndexError):
            packed[past]


def test_a_stored_image_costs_little_more_than_its_name():
    """A parquet listing held about 600 B a row (a million rows: 600 MB), half of it each
    StoredImage's attribute dict, grown key by key to 304 bytes; made whole it is 184."""
    import gc
    import tracemalloc

    from torchkit.core.data.stored_image import StoredImage

    reader = _Reader()
    names = [f"/data/parquet/train-00003-of-00010.parquet/{row}" for row in range(5000)]
    locators = [(3, row // 1000, row % 1000) for row in range(5000)]
    # A full collection empties Python's free lists, so that every object made is counted
    # whatever ran before in this process (356-360 B a row otherwise; 360 after it).
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        images = [StoredImage(n, reader, at) for n, at in zip(names, locators, strict=True)]
        added = (tracemalloc.get_traced_memory()[0] - before) / len(images)
    finally:
        tracemalloc.stop()
    assert added < 440, added  # the name again (about 100 B), the dict (184): 360; 512 before
    assert images[7].reader is reader and images[7].locator == (3, 0, 7)
    assert images[7] == names[7] and images[7].read_bytes() == _Reader().read((3, 0, 7))
