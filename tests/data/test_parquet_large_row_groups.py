"""Parquet row groups past the 2 GiB an Arrow `binary` array holds (what pyarrow's and pandas'
defaults write for some 20,000 images of 100 kB: a million rows a group): pyarrow refuses to
read HF's Image struct column of such a group whole, "Nested data conversions not implemented
for chunked array outputs" (seen on a real 2.2 GB group), and reads it in batches. Every image
of such a file was unreadable, each read of one reading its gigabytes again; they are read.
The 2 GiB limit is played by a row group read that fails as pyarrow's does there: the suite
writes no gigabytes."""

from __future__ import annotations

import pytest
from parquet_files import png, write_parquet

ROWS = 40  # more rows than one batch of the reader's (`_BATCH_ROWS`): the group comes in chunks


@pytest.fixture
def past_two_gib(monkeypatch):
    """Each whole row group read fails as pyarrow's read of a struct column past 2 GiB."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def read_row_group(self, *args, **kwargs):
        raise pa.ArrowNotImplementedError(
            "Nested data conversions not implemented for chunked array outputs"
        )

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", read_row_group)


def test_images_of_a_row_group_past_two_gib_read_their_own_bytes(tmp_path, past_two_gib):
    from torchkit.core.data.sources import open_data
    from torchkit.core.data.sources.parquet import NullImage

    images = [png(i) for i in range(ROWS - 1)] + [None]
    paths = [None] * (ROWS - 1) + ["imgs/x.png"]
    data = write_parquet(
        tmp_path / "d.parquet",
        images,
        [i % 3 for i in range(ROWS)],
        row_group_size=ROWS,
        image_paths=paths,
    )
    stored = open_data(str(data)).whole.paths
    # Backwards too: a row of a later batch first, then the rows of the cached group.
    for row in reversed(range(ROWS - 1)):
        assert stored[row].read_bytes() == images[row], row
    # A row of no bytes still names the file its image's path gives.
    with pytest.raises(NullImage, match=r"only a path \(imgs/x\.png\)"):
        stored[ROWS - 1].read_bytes()
