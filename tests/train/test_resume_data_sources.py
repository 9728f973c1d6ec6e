"""Every kind of data names its samples for the digests `--resume` compares: the built-in digits
(in memory), parquet rows, shard members, CSV index rows; the same data read from another
folder is the same samples."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from image_folders import write_image_folder
from parquet_files import png, write_parquet
from shards import write_shards

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
