"""`convert shards` from parquet past the reader's cache of row groups: the shards are a seeded
shuffle of every sample, and read in that order nearly every sample read its whole row group
again (a million tiny images: 7 s of CPU a shard instead of 1). The samples of a window of
positions are now read in source order, each row group once a window, and written in the
shuffled order, the same bytes. Where that would read the row groups more than twice over (large
images, many windows), the samples are spilled to an unnamed file in source order first, each
row group read once."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
from image_folders import write_image_folder
from output_checks import error_line
from parquet_files import counted_row_group_reads, png, write_parquet
from processes import run_torchkit_in_process
from shards import serving, shard_downloads

from torchkit.core.convert import shards as shards_module
from torchkit.core.data.sources import open_data
from torchkit.core.data.sources import parquet as parquet_module

ROWS, GROUP_ROWS = 120, 8
GROUPS = ROWS // GROUP_ROWS


@pytest.fixture
def row_group_reads(monkeypatch) -> list[int]:
    """The row groups read, in order, with a cache that holds about one of them."""
    monkeypatch.setattr(parquet_module, "CACHE_BYTES", 3_000)  # a group: 8 PNGs of ~250 bytes
    return counted_row_group_reads(monkeypatch)


def convert_parquet(tmp_path: Path, out: Path, *options: str) -> dict[str, bytes]:
    source = tmp_path / "rows.parquet"
    if not source.exists():
        images = [png(row) for row in range(ROWS)]
        write_parquet(source, images, [row % 3 for row in range(ROWS)], row_group_size=GROUP_ROWS)
    result = run_torchkit_in_process(
        "convert", "shards", source, out, "--per-shard", 10, "--seed", 5, *options
    )
    assert result.returncode == 0, result.stderr
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.tar"))}


def test_a_shuffled_convert_reads_each_row_group_once_and_writes_each_rows_image(
    tmp_path, row_group_reads
):
    shards = convert_parquet(tmp_path, tmp_path / "out", "-j", "2")
    assert sorted(row_group_reads) == list(range(GROUPS))  # was about one read a sample

    # Each sample holds its own row's image, whatever order the rows were read in.
    keys = []
    for name in shards:
        with tarfile.open(tmp_path / "out" / name) as tar:
            members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
        for member, data in members.items():
            key, _, extension = member.partition(".")
            if extension == "json":
                row = int(json.loads(data)["path"].rsplit("/", 1)[1])
                assert members[f"{key}.png"] == png(row)
                keys.append(row)
    assert sorted(keys) == list(range(ROWS))
    assert keys != sorted(keys)  # shuffled


def sample_cost(tmp_path: Path) -> int:
    """The bytes a window counts for one sample of the file `convert_parquet` writes."""
    return shards_module._window_costs(open_data(tmp_path / "rows.parquet").whole)(0)


def test_windows_smaller_than_the_data_read_each_row_group_once_a_window_same_bytes(
    tmp_path, row_group_reads, monkeypatch
):
    whole = convert_parquet(tmp_path, tmp_path / "whole", "-j", "0")
    row_group_reads.clear()
    # Two windows of 60 samples: each row group once a window, nothing spilled.
    monkeypatch.setattr(shards_module, "WINDOW_BYTES", 60 * sample_cost(tmp_path))
    monkeypatch.setattr(shards_module, "_SpilledSamples", None)  # fails if used
    windowed = convert_parquet(tmp_path, tmp_path / "windowed", "-j", "2")
    assert windowed == whole
    assert GROUPS < len(row_group_reads) <= 2 * GROUPS


@pytest.mark.parametrize("window", [40, 3, 1])
def test_many_windows_of_a_shuffle_read_each_row_group_once_through_a_spill_same_bytes(
    tmp_path, row_group_reads, monkeypatch, window
):
    """Large images (few a window) in a full shuffle read every row group once a window: 400
    windows of a 100 GB source, each reading nearly all of it. The samples are now spilled to
    an unnamed file in the output folder in source order, and each window read back from it."""
    whole = convert_parquet(tmp_path, tmp_path / "whole", "-j", "0")
    row_group_reads.clear()
    monkeypatch.setattr(shards_module, "WINDOW_BYTES", window * sample_cost(tmp_path))
    out = tmp_path / "windowed"
    windowed = convert_parquet(tmp_path, out, "-j", "2")
    assert windowed == whole  # byte for byte, the same shards in the same order
    assert sorted(row_group_reads) == list(range(GROUPS))  # was a read a window: 45 to 1,800
    assert sorted(p.name for p in out.iterdir()) == sorted(
        p.name for p in (tmp_path / "whole").iterdir()
    )


def test_windows_of_an_unshuffled_convert_read_each_row_group_once_without_a_spill(
    tmp_path, row_group_reads, monkeypatch
):
    whole = convert_parquet(tmp_path, tmp_path / "whole", "--no-shuffle")
    row_group_reads.clear()
    monkeypatch.setattr(shards_module, "WINDOW_BYTES", 3 * sample_cost(tmp_path))
    monkeypatch.setattr(shards_module, "_SpilledSamples", None)  # fails if used
    assert convert_parquet(tmp_path, tmp_path / "windowed", "--no-shuffle") == whole
    assert sorted(row_group_reads) == list(range(GROUPS))


@pytest.mark.parametrize("spilled", [False, True])
def test_shards_streamed_under_a_cache_limit_are_fetched_once_and_written_as_local_ones(
    tmp_path, monkeypatch, spilled
):
    write_image_folder(tmp_path / "images" / "train", dict.fromkeys("abc", 30))
    served = tmp_path / "served" / "converted"  # 18 shards of 5, in the folder's order
    result = run_torchkit_in_process(
        "convert", "shards", tmp_path / "images", served, "--per-shard", 5, "--no-shuffle"
    )
    assert result.returncode == 0, result.stderr
    local = tmp_path / "local"
    result = run_torchkit_in_process("convert", "shards", served, local, "--per-shard", 7)
    assert result.returncode == 0, result.stderr
    largest = max(p.stat().st_size for p in served.glob("*.tar"))
    spills = []
    if spilled:  # windows of a few samples: spilled, as data of many windows is
        monkeypatch.setattr(shards_module, "WINDOW_BYTES", 3_000)
        real_spill = shards_module._spill

        def spill(*args):
            spills.append(real_spill(*args))
            return spills[-1]

        monkeypatch.setattr(shards_module, "_spill", spill)
    with serving(served.parent, tmp_path / "cache", monkeypatch) as server:
        monkeypatch.setenv("TORCHKIT_CACHE_LIMIT", str(2 * largest))  # two shards at a time
        streamed = tmp_path / "streamed"
        result = run_torchkit_in_process(
            "convert", "shards", f"{server.url}/converted", streamed, "--per-shard", 7, "-j", 2
        )
        assert result.returncode == 0, result.stderr
        downloads = shard_downloads(server.requests)
    assert len(downloads) == 18  # in the shuffled order: 80
    assert len(spills) == int(spilled) and None not in spills
    tars = {p.name: p.read_bytes() for p in local.glob("*.tar")}
    assert tars and {p.name: p.read_bytes() for p in streamed.glob("*.tar")} == tars


@pytest.mark.parametrize("spilled", [False, True])
def test_a_samples_read_error_is_raised_at_its_position_after_those_before(
    tmp_path, monkeypatch, spilled
):
    order = [5, 3, 0, 4, 1, 2]
    read_order: list[int] = []

    def read(position: int) -> bytes | Exception:
        read_order.append(order[position])
        return shards_module.InputError("gone") if position == 3 else bytes([order[position]])

    def load(position: int, data: bytes | Exception) -> shards_module.Loaded:
        if isinstance(data, Exception):
            raise data
        return shards_module.Loaded("png", data)

    if spilled:  # windows of one sample, read back from a spill
        monkeypatch.setattr(shards_module, "_spill_pays", lambda *args: True)
        costs = shards_module._BlockCosts([0] * 6, [6], [1])
        reads = shards_module._read_in_windows(
            read, load, range(6), order, costs, 2, spill_folder=tmp_path, window_bytes=1
        )
    else:
        reads = shards_module._read_in_windows(read, load, range(6), order, lambda index: 1, 2)
    got = []
    with pytest.raises(shards_module.InputError, match="gone"):
        for loaded in reads:
            got.append(loaded.data[0])
    assert got == [5, 3, 0]  # the samples before it, in writing order
    assert read_order == [0, 1, 2, 3, 4, 5]  # read in source order
    assert list(tmp_path.iterdir()) == []  # the spill, if any, has no name


def test_a_spill_after_a_resume_holds_only_the_positions_left(tmp_path, monkeypatch):
    order = [5, 3, 0, 4, 1, 2]
    read_order: list[int] = []

    def read(position: int) -> bytes:
        read_order.append(order[position])
        return bytes([order[position]])

    monkeypatch.setattr(shards_module, "_spill_pays", lambda *args: True)
    costs = shards_module._BlockCosts([0] * 6, [6], [1])
    reads = shards_module._read_in_windows(
        read,
        lambda position, data: shards_module.Loaded("png", data),
        range(2, 6),  # the first two positions' shard is complete
        order,
        costs,
        0,
        spill_folder=tmp_path,
        window_bytes=1,
    )
    assert [loaded.data[0] for loaded in reads] == [0, 4, 1, 2]
    assert read_order == [0, 1, 2, 4]  # once each, in source order


def test_a_spill_of_rows_with_null_images_holds_no_row_group_for_their_errors(
    tmp_path, monkeypatch
):
    """A null image's error, kept until its window is written, held through its traceback the
    reader's frame and in it the whole row group: with a null image in every row group, a
    spill held them all (a 100 GB source: 100 GB of memory). Its frames are cleared now."""
    import os
    import random

    import pyarrow as pa

    groups, rows, image = 30, 10, 20_000
    images = [None if i % rows == 0 else png(i) + os.urandom(image) for i in range(groups * rows)]
    labels = [0] * len(images)
    source = write_parquet(tmp_path / "nulls.parquet", images, labels, row_group_size=rows)
    monkeypatch.setattr(parquet_module, "CACHE_BYTES", 2 * rows * image)  # about one row group
    samples = open_data(source).whole
    order = list(range(len(images)))
    random.Random(0).shuffle(order)
    costs = shards_module._window_costs(samples)
    held = []

    def load(position: int, data: bytes | Exception) -> shards_module.Loaded:
        held.append(pa.total_allocated_bytes())
        return shards_module.Loaded("png", b"" if isinstance(data, Exception) else data)

    reads = shards_module._read_in_windows(
        lambda position: shards_module.read_file(samples, order[position]),
        load,
        range(len(order)),
        order,
        costs,
        0,
        spill_folder=tmp_path,
        window_bytes=3 * costs(1),
    )
    assert sum(1 for _ in reads) == len(images)
    assert max(held) < 4 * rows * image  # was all of them: groups * rows * image


def write_large_rows(path: Path) -> Path:
    """60 rows of 20 kB images (PNGs with bytes after their end), in row groups of 6."""
    images = [png(row) + bytes(range(256)) * 80 for row in range(60)]
    return write_parquet(path, images, [row % 3 for row in range(60)], row_group_size=6)


def test_a_spill_that_leaves_no_room_for_the_shards_is_not_made(tmp_path, small_tmpfs, monkeypatch):
    """The spill's images beside the shards take twice the room of the shards alone: on a disk
    with room for the shards only, a run that wrote the shards before read everything into the
    spill, then failed at a shard with 'No space left on device'. OUT's free space is now
    checked first, and the windows read the row groups again instead, with a warning."""
    source = write_large_rows(tmp_path / "rows.parquet")
    whole = tmp_path / "whole"
    assert run_torchkit_in_process("convert", "shards", source, whole).returncode == 0
    each = shards_module._window_costs(open_data(source).whole)(0)
    monkeypatch.setattr(shards_module, "WINDOW_BYTES", 3 * each)
    out = small_tmpfs(2000) / "out"  # 2 MB: the shards' 1.4 MB, not their images twice
    done = run_torchkit_in_process("convert", "shards", source, out)
    assert done.returncode == 0, done.stderr
    assert tars_of(out) == tars_of(whole)
    warning = "no room for a temporary copy of the images"
    assert warning in done.stderr and "MB free" in done.stderr


def test_a_spill_past_the_disks_largest_file_leaves_the_windows_to_read_the_row_groups_again(
    tmp_path, monkeypatch
):
    """The spill is one file as large as all the images: past the largest file the disk takes
    (FAT32's 4 GB, a quota, `ulimit -f`), the run failed after reading everything, where
    shards of a few hundred kB each were written before. It is given up now, with a warning,
    and the windows read the row groups again."""
    resource = pytest.importorskip("resource")  # POSIX
    source = write_large_rows(tmp_path / "rows.parquet")
    whole = tmp_path / "whole"
    done = run_torchkit_in_process("convert", "shards", source, whole, "--per-shard", 10)
    assert done.returncode == 0
    each = shards_module._window_costs(open_data(source).whole)(0)
    monkeypatch.setattr(shards_module, "WINDOW_BYTES", 3 * each)
    out = tmp_path / "out"
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (500_000, limits[1]))  # Python ignores SIGXFSZ
    try:
        done = run_torchkit_in_process("convert", "shards", source, out, "--per-shard", 10)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
    assert done.returncode == 0, done.stderr
    assert tars_of(out) == tars_of(whole)
    assert f"the temporary copy of the images in {out} could not be written (File too large)" in (
        done.stderr.replace("\n", " ")
    )


def test_a_spill_file_the_disk_refuses_leaves_the_windows_to_read_the_row_groups_again(
    tmp_path, monkeypatch
):
    """Where OUT's disk refuses the spill's file itself (a quota, a disk full since the room
    was checked), the run goes on without it, with a warning, as where writing it fails."""
    import errno
    import tempfile

    source = write_large_rows(tmp_path / "rows.parquet")
    whole = tmp_path / "whole"
    assert run_torchkit_in_process("convert", "shards", source, whole).returncode == 0
    each = shards_module._window_costs(open_data(source).whole)(0)
    monkeypatch.setattr(shards_module, "WINDOW_BYTES", 3 * each)

    def refused(*args, **kwargs):
        raise OSError(errno.EDQUOT, "Disk quota exceeded")

    monkeypatch.setattr(tempfile, "TemporaryFile", refused)
    out = tmp_path / "out"
    done = run_torchkit_in_process("convert", "shards", source, out)
    assert done.returncode == 0, done.stderr
    assert tars_of(out) == tars_of(whole)
    assert f"cannot make a temporary copy of the images in {out} (Disk quota exceeded)" in (
        done.stderr.replace("\n", " ")
    )


def tars_of(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.tar"))}


def test_a_spilled_sample_read_back_in_parts_is_whole(tmp_path, monkeypatch):
    """One read returns at most 2 GiB less a page on Linux (and any read may return less than
    asked): a sample past that, spilled, failed the run as 'read back short'."""
    order = [2, 0, 1]
    images = [bytes([index]) * 20 for index in range(3)]
    real_pread = shards_module.os.pread
    monkeypatch.setattr(shards_module.os, "pread", lambda fd, n, at: real_pread(fd, min(n, 7), at))
    monkeypatch.setattr(shards_module, "_spill_pays", lambda *args: True)
    reads = shards_module._read_in_windows(
        lambda position: images[order[position]],
        lambda position, data: shards_module.Loaded("png", data),
        range(3),
        order,
        shards_module._BlockCosts([0] * 3, [60], [20]),
        0,
        spill_folder=tmp_path,
        window_bytes=1,
    )
    assert [loaded.data for loaded in reads] == [images[index] for index in order]


def test_the_spill_says_how_far_it_is_beside_the_progress(tmp_path, monkeypatch):
    """No sample is written while the images are copied to the spill (a 100 GB source: many
    minutes): the bar stood at 0 without a word. The copy's count is shown beside it now."""
    convert_parquet(tmp_path, tmp_path / "whole")
    monkeypatch.setattr(shards_module, "WINDOW_BYTES", 3 * sample_cost(tmp_path))
    said: list[str | None] = []
    progress: list[int] = []
    shards_module.convert_shards(
        tmp_path / "rows.parquet",
        tmp_path / "out",
        options=shards_module.shard_options(per_shard=10, seed=5),
        workers=0,
        progress=lambda done, total: progress.append(done),
        status=said.append,
    )
    assert said[0] == f"copying images to a temporary file, 0 of {ROWS}"
    assert len(said) == ROWS + 1 and said[-1] is None  # a hundredth's count (here each), then none
    assert progress[-1] == ROWS


@pytest.mark.parametrize(
    ("image", "reason"),
    [
        (None, "the row's image is null (no bytes)"),
        (b"not an image" * 100, "not an image PIL can read"),
    ],
    ids=["null", "no-image"],
)
def test_strict_stops_at_an_image_the_spill_cannot_read(tmp_path, monkeypatch, image, reason):
    """--strict with a null image, or bytes that are no image: the spill copied every other
    sample first (all the data's images: 493 MB of 10,000 rows measured, 100 GB for a source
    that large), then the run stopped at the row's turn. It stops as the spill reaches it now
    (an image's header opened as it is copied), with the error the row's turn gives where
    nothing is spilled; without --strict the spill checks nothing."""
    source = write_large_rows(tmp_path / "rows.parquet")
    images = open_data(source).whole
    broken = write_parquet(
        tmp_path / "broken.parquet",
        [image if row == 13 else path.read_bytes() for row, path in enumerate(images.paths)],
        [row % 3 for row in range(60)],
        row_group_size=6,
    )
    each = shards_module._window_costs(open_data(broken).whole)(0)
    monkeypatch.setattr(shards_module, "WINDOW_BYTES", 3 * each)
    spilled: list[int] = []
    write = shards_module._SpilledSamples.write

    def counted(self, position: int, data: bytes | Exception) -> None:
        spilled.append(position)
        write(self, position, data)

    monkeypatch.setattr(shards_module._SpilledSamples, "write", counted)
    done = run_torchkit_in_process("convert", "shards", broken, tmp_path / "out", "--strict")
    assert done.returncode == 1, done.stderr
    said = error_line(done.stderr)
    assert said == (
        f"Error: unreadable image {broken}/13: {reason} (fix or remove it, or leave out "
        "--strict to skip unreadable images)"
    )
    assert len(spilled) == 13  # rows 0-12, in source order (was: all 60)
    # the same error as the row's turn gives where nothing is spilled
    monkeypatch.setattr(shards_module, "WINDOW_BYTES", 1 << 30)
    spilled.clear()
    whole = run_torchkit_in_process("convert", "shards", broken, tmp_path / "one", "--strict")
    assert whole.returncode == 1 and error_line(whole.stderr) == said, whole.stderr
    assert spilled == []
    # without --strict the spill holds them all, the row skipped with a warning at its turn
    checked = []
    real_load = shards_module.load_sample
    monkeypatch.setattr(
        shards_module, "load_sample", lambda *a, **k: checked.append(1) or real_load(*a, **k)
    )
    monkeypatch.setattr(shards_module, "WINDOW_BYTES", 3 * each)
    done = run_torchkit_in_process("convert", "shards", broken, tmp_path / "lenient")
    assert done.returncode == 1, done.stderr  # once every other row is written
    assert len(spilled) == 60 and f"skipped unreadable image {broken}/13" in done.stderr
    assert len(checked) == 60  # each image opened once, at its turn
