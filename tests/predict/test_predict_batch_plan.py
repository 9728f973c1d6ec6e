"""predict's plan of batches: rank r of W takes batches r, r + W, ... of the images in order.
It was a list of every batch, made before the first one ran: an int and a pointer for every
image (40 MB and 0.4 s of CPU at a million images, before any was read). The batches are now
made as the loader asks for them."""

from __future__ import annotations

import tracemalloc
from types import SimpleNamespace

import pytest

from torchkit.core.predict.inputs import LoaderPass
from torchkit.core.predict.run import PredictRun, _InterleavedBatches, _steps


@pytest.mark.parametrize(("size", "batch_size", "world"), [(10, 3, 1), (10, 3, 2), (7, 2, 3)])
def test_every_image_is_in_one_rank_s_batch_in_order(size, batch_size, world):
    plans = [_InterleavedBatches(size, batch_size, rank, world) for rank in range(world)]
    steps = _steps(size, batch_size, world)
    batches = [list(plan) for plan in plans]
    assert all(len(plan) == len(own) <= steps for plan, own in zip(plans, batches, strict=True))
    interleaved = [b for step in range(steps) for own in batches for b in own[step : step + 1]]
    assert [index for batch in interleaved for index in batch] == list(range(size))
    assert all(len(batch) == batch_size for batch in interleaved[:-1])


def test_the_plan_of_ten_million_images_holds_no_list_of_them():
    tracemalloc.start()
    try:
        plan = _InterleavedBatches(10_000_000, 256, 0, 1)
        first = next(iter(plan))
        made, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(plan) == 39_063 and first == list(range(256))
    assert made < 100_000  # before: 400 MB


class _Paths:
    """The paths of a list of `size` images, made as they are asked for."""

    def __getitem__(self, index: int) -> str:
        return f"img/{index}.png"


def test_the_keyed_plan_of_a_list_on_stdin_under_torchrun_holds_no_key_of_every_image():
    """torchrun with `-`: the loader, started before the list came, finds each path in its key.
    The keys of every batch of the rank were made at once (about 250 bytes an image)."""
    passes = LoaderPass()
    run = SimpleNamespace(
        _listed=("loader", passes),
        image_set=SimpleNamespace(samples=SimpleNamespace(paths=_Paths())),
    )
    tracemalloc.start()
    try:
        loader = PredictRun._listed_loader(run, _InterleavedBatches(200_000, 64, 1, 2))
        made, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert loader == "loader" and run._listed is None
    assert made < 100_000  # before: 31 MB (the keys, and here their paths)
    assert len(passes) == 1562  # of the 3,125 batches, those at odd places
    first, *_, last = passes
    assert first == list(range(64, 128)) and last == list(range(199_872, 199_936))
    assert [key.path for key in first[:2]] == ["img/64.png", "img/65.png"]
