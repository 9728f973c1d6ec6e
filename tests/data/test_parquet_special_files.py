"""A folder of parquet files passed over, without a word, a FIFO named like one (`mkfifo
data/train-00001-of-00002.parquet`) and a folder of it that cannot be listed (`data/` another
user's): a split, or half of one, missing. The FIFO is an error naming it, as one among shards
is (and never opened: opening a FIFO blocks); the folder is the warning of a folder that
cannot be listed, an error with --strict."""

from __future__ import annotations

import logging
import os

import pytest
from parquet_files import png, write_parquet

from torchkit.core.io.errors import InputError

pytest.importorskip("pyarrow")


def test_a_fifo_named_like_a_parquet_file_is_an_error_naming_it(tmp_path):
    from torchkit.core.data.sources import open_data

    write_parquet(tmp_path / "data" / "train-00000-of-00002.parquet", [png(0), png(1)], [0, 1])
    fifo = tmp_path / "data" / "train-00001-of-00002.parquet"
    os.mkfifo(fifo)
    with pytest.raises(InputError) as refused:
        open_data(tmp_path)
    assert refused.value.message == f"{fifo} is not a regular file (a FIFO)"


def test_a_split_folder_that_cannot_be_listed_is_named(tmp_path, monkeypatch, caplog):
    from torchkit.core.data.sources import open_data
    from torchkit.core.data.strict_reading import reading_strictly

    write_parquet(tmp_path / "train" / "a.parquet", [png(0), png(1)], [0, 1])
    write_parquet(tmp_path / "test" / "a.parquet", [png(2), png(3)], [0, 1])
    denied, listdir = str(tmp_path / "test"), os.listdir

    def listing(path="."):
        if os.fspath(path) == denied:
            raise PermissionError(13, "Permission denied", denied)
        return listdir(path)

    monkeypatch.setattr(os, "listdir", listing)
    with caplog.at_level(logging.WARNING, logger="torchkit"):
        read = open_data(tmp_path)
    assert sorted(read.splits) == ["train"]
    assert [r.getMessage() for r in caplog.records if "cannot be listed" in r.getMessage()] == [
        f"1 folder(s) in {tmp_path} cannot be listed, their images not read: test (permission "
        "denied) (make them readable, or --strict makes this an error)"
    ]
    with reading_strictly(), pytest.raises(InputError, match="^cannot list folder"):
        open_data(tmp_path)
