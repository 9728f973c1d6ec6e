"""Every kind of data names its samples for the digests `--resume` compares: the built-in digits
(in memory), parquet rows, shard members (local, or streamed over HTTP), CSV index rows; the
same data read from another folder, or named another way, is the same samples."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from image_folders import write_image_folder
from parquet_files import png, write_parquet
from processes import run_torchkit_in_process
from shards import serving, write_shards

from torchkit.core.data.sources import open_labelled, training_splits
from torchkit.core.train.resume_data import sample_digests


def digests_of(spec: str) -> dict[str, str]:
    source, _ = open_labelled(spec)
    splits, _ = training_splits(source, val_split=0.25, seed=0)
    return sample_digests(splits)


def test_the_digits_are_named_by_their_index():
    found = digests_of("digits")
    assert set(found) == {"train", "val", "test"}  # digits has a test split of its own
    assert found == digests_of("digits")


def write_parquet_data(folder: Path) -> str:
    labels = [i % 3 for i in range(12)]
    write_parquet(folder / "data.parquet", [png(i) for i in range(12)], labels)
    return "data.parquet"


def write_shard_data(folder: Path) -> str:
    images = write_image_folder(folder.parent / f"{folder.name}-images", {"a": 4, "b": 4})
    folder.mkdir(parents=True)
    write_shards(str(folder / "part-%06d.tar"), images, maxcount=4)
    return "part-{000000..000001}.tar"


def write_index_data(folder: Path) -> str:
    write_image_folder(folder, {"a": 4, "b": 4})
    rows = ["path,label"] + [
        f"./{image.relative_to(folder).as_posix()},{image.parent.name}"
        for image in sorted(folder.glob("*/*.png"))
    ]
    (folder / "index.csv").write_text("\n".join(rows) + "\n")
    return "index.csv"


@pytest.mark.parametrize("write", [write_parquet_data, write_shard_data, write_index_data])
def test_data_moved_to_another_folder_is_the_same_samples(tmp_path, write):
    first = tmp_path / "here"
    name = write(first)
    found = digests_of(str(first / name))
    assert set(found) == {"train", "val"}
    moved = Path(shutil.move(first, tmp_path / "mounted" / "elsewhere"))
    assert digests_of(str(moved / name)) == found


def test_a_folder_named_any_way_is_the_same_samples(tmp_path, monkeypatch):
    """`./data`, `data/`, its absolute path, a symbolic link to it: one folder, one digest;
    a split folder's test split is digested too (recorded, not compared)."""
    data = tmp_path / "data"
    for split, seed in (("train", 1), ("val", 2), ("test", 3)):
        write_image_folder(data / split, {"a": 3, "b": 3}, seed=seed)
    (tmp_path / "link").symlink_to(data)
    monkeypatch.chdir(tmp_path)
    found = digests_of(str(data))
    assert set(found) == {"train", "val", "test"}
    for spec in ("./data", "data/", "data", "link", "./link/"):
        assert digests_of(spec) == found, spec


def test_names_of_bytes_that_are_not_utf8_are_the_same_samples_moved(tmp_path):
    first = tmp_path / "here"
    write_image_folder(first, {"a": 4, "b": 4})
    (first / "a" / "a_0.png").rename(first / "a" / os.fsdecode(b"\xff\xfe.png"))
    (first / "b").rename(first / os.fsdecode(b"b\xff"))
    found = digests_of(str(first))
    moved = Path(shutil.move(first, tmp_path / "elsewhere"))
    assert digests_of(str(moved)) == found
    (moved / "a" / os.fsdecode(b"\xff\xfe.png")).rename(moved / "a" / os.fsdecode(b"\xfe.png"))
    assert digests_of(str(moved)) != found


def test_shards_streamed_through_another_cache_folder_are_the_local_samples(tmp_path, monkeypatch):
    """Shards over HTTP, read from a pattern (downloaded to the cache) or from the manifest of
    a `convert shards` folder (streamed): the cache folder is no part of a sample's name."""
    images = write_image_folder(tmp_path / "images", {"a": 4, "b": 4})
    served = tmp_path / "served"
    (served / "shards").mkdir(parents=True)
    write_shards(str(served / "shards" / "part-%06d.tar"), images, maxcount=4)
    converted = run_torchkit_in_process(
        "convert", "shards", images, served / "converted", "--per-shard", "4", "--workers", "0"
    )
    assert converted.returncode == 0, converted.stderr
    pattern = "shards/part-{000000..000001}.tar"
    local = {spec: digests_of(str(served / spec)) for spec in (pattern, "converted")}
    for cache in ("cache-one", "cache-two"):
        with serving(served, tmp_path / cache, monkeypatch) as server:
            for spec, found in local.items():
                assert digests_of(f"{server.url}/{spec}") == found, (cache, spec)
