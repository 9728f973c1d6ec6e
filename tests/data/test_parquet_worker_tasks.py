"""Parquet images read in worker processes (dataset-stats' `-j`): each task a worker is sent
carries its chunk of images pickled, and with them a copy of their reader. Each copy came with
an empty cache, so a row group was read again for every chunk of its rows: a file of one row
group of R rows (what pandas and pyarrow write by default) R/64 times, the whole group each
time. A worker's copies are now one reader, which reads the group once."""

from __future__ import annotations

import pickle

from parquet_files import counted_row_group_reads, png, write_parquet

ROWS = 40


def test_a_workers_tasks_read_a_row_group_of_theirs_once(tmp_path, monkeypatch):
    from torchkit.core.data.sources import open_data
    from torchkit.core.stats.scan import scan_files, scan_tasks

    images = [png(i) for i in range(ROWS)]
    data = write_parquet(
        tmp_path / "d.parquet", images, [i % 2 for i in range(ROWS)], row_group_size=ROWS
    )
    samples = open_data(str(data)).whole
    tasks = scan_tasks(samples, 2, "rgb", None)
    assert len(tasks) == 8  # chunks of 5 rows, all of the one row group
    reads = counted_row_group_reads(monkeypatch)
    read = sum(len(scan_files(*pickle.loads(pickle.dumps(task))).records) for task in tasks)
    assert read == ROWS
    assert reads == [0]


def test_readers_of_two_files_taken_in_turn_read_their_own_images(tmp_path):
    from torchkit.core.data.sources import open_data

    first = [png(i) for i in range(4)]
    second = [png(100 + i) for i in range(4)]
    one = open_data(str(write_parquet(tmp_path / "a.parquet", first, [0, 1, 0, 1]))).whole
    two = open_data(str(write_parquet(tmp_path / "b.parquet", second, [1, 0, 1, 0]))).whole
    for row in range(4):
        # each unpickled as a worker's task is, the other's reader replaced in between
        assert pickle.loads(pickle.dumps(one.paths[row])).read_bytes() == first[row]
        assert pickle.loads(pickle.dumps(two.paths[row])).read_bytes() == second[row]
