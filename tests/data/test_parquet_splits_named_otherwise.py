"""A folder of parquet files naming two splits in the middle of their names
(`cifar10-train.parquet` beside `cifar10-test.parquet`, which HF's datasets reads as two
splits) was read as one unsplit dataset: train trained on the test images too, holding out a
tenth of both, and dataset-stats measured both as one, without a word. It is one error line
naming a file of each split; one file still reads, as do files naming one split or none."""

from __future__ import annotations

import pytest
from parquet_files import png, write_parquet

from torchkit.core.io.errors import InputError


def test_files_of_two_splits_named_in_the_middle_are_one_error_line(tmp_path):
    from torchkit.core.data.sources import open_data

    for name, count in (("cifar10-train.parquet", 2), ("cifar10-test.parquet", 1)):
        write_parquet(tmp_path / name, [png(i) for i in range(count)], [0] * count)
    with pytest.raises(InputError) as raised:
        open_data(str(tmp_path))
    line = str(raised.value)
    assert f"{tmp_path} holds parquet files of 2 splits named in the middle" in line, line
    assert "(cifar10-train.parquet, cifar10-test.parquet)" in line, line
    assert len(open_data(str(tmp_path / "cifar10-train.parquet")).whole.paths) == 2
    # Files of one split (or of none: `contest` is no word of one) stay one dataset.
    (tmp_path / "cifar10-test.parquet").rename(tmp_path / "cifar10-contest.parquet")
    assert len(open_data(str(tmp_path)).whole.paths) == 3
