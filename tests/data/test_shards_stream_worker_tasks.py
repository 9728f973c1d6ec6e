"""The shards of a folder URL read in worker processes (dataset-stats' `-j`): each task a worker
is sent carries its chunk of images pickled, and with them a copy of their reader, which
listed its shard again (and kept it open: a descriptor leaked a task), for every chunk of 64 of
its images: dataset-stats -j 2 of 40,000 images in one shard took minutes. A worker's copies
are now one reader, which lists each shard once."""

from __future__ import annotations

import pickle

from image_folders import write_image_folder
from processes import run_torchkit_in_process
from shards import serving


def test_a_workers_tasks_list_a_streamed_shard_once(tmp_path, monkeypatch):
    import torchkit.core.data.sources.shards as shards
    from torchkit.core.data.sources import open_data

    write_image_folder(tmp_path / "images", dict.fromkeys("ab", 4))
    served = tmp_path / "served" / "data"
    result = run_torchkit_in_process("convert", "shards", tmp_path / "images", served)
    assert result.returncode == 0, result.stderr
    listed: list[str] = []
    real = shards.list_tar

    def counted(path: str, **kwargs):
        listed.append(str(path))
        return real(path, **kwargs)

    monkeypatch.setattr(shards, "list_tar", counted)
    with serving(tmp_path / "served", tmp_path / "cache", monkeypatch) as server:
        paths = open_data(f"{server.url}/data").whole.paths
        local = open_data(served).whole.paths
        # one image a task, each unpickled as a worker's task is
        read = [pickle.loads(pickle.dumps(path)).read_bytes() for path in paths]
    assert read == [path.read_bytes() for path in local]
    assert len([path for path in listed if path.startswith(str(tmp_path / "cache"))]) == 1
