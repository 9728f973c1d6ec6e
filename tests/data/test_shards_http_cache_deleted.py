"""The cache deleted (`rm -rf $TORCHKIT_CACHE`, or its shards folder as data.md suggests) while a
run downloads URL shards into it. The download's temporary file, its claim and its lock go with
the folder: the run wrote the rest of the body into a deleted file (room on the disk no claim
showed), then failed at its rename with "Error: FileNotFoundError: [Errno 2] ..." (or, checked
as a whole tar, "cannot read URL: No such file or directory", as if the URL were missing); a
shard whose download began after the deletion failed opening its lock file the first way. Each
now ends at once in one line saying the cache was deleted, nothing kept under the shard's name.
It is not downloaded again into a folder made anew: the side files read beside the shards
(classes.txt) went with the old one.

Deterministic: the cache is deleted from a hook on the download's reads of the body."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest
from output_checks import error_line
from processes import run_torchkit_in_process
from shards import serving

CHUNK = 1 << 20  # what torchkit reads (and writes) of a body at a time


def cache_deleted_line(url: str, folder: Path) -> str:
    """The one error line of a download of `url` into `folder` whose cache was deleted."""
    return (
        f"Error: cannot download {url} into {folder}: the cache was deleted while torchkit used "
        "it (another program deleted the folder or the file being written) (run again; nothing "
        "of it was kept)"
    )


def _shard(path, size: int) -> bytes:
    """A tar at `path` of about `size` bytes (one member of random bytes); its bytes."""
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo("k0.bin")
        info.size = size
        tar.addfile(info, io.BytesIO(os.urandom(size)))
    return path.read_bytes()


def _deleting_the_cache_at_read(monkeypatch, cache, read_number: int) -> list[int]:
    """`rm -rf` of `cache` just before the download's `read_number`th read of a shard's body;
    the reads made after it (one item each)."""
    from torchkit.core.data.sources import http_shards

    read, after = http_shards._read, []

    def deleting(response, url):
        if not url.endswith(".tar"):  # a side file (manifest.json)
            return read(response, url)
        deleting.reads += 1
        if deleting.reads == read_number:
            shutil.rmtree(cache)
        elif deleting.reads > read_number:
            after.append(deleting.reads)
        return read(response, url)

    deleting.reads = 0
    monkeypatch.setattr(http_shards, "_read", deleting)
    return after


@pytest.mark.parametrize("checked_by", ["manifest", "whole tar", "whole tar of no size"])
@pytest.mark.parametrize("deleted_at", ["second chunk", "end of body"])
def test_a_cache_deleted_as_a_shard_downloads_is_one_line(
    tmp_path, monkeypatch, checked_by, deleted_at
):
    """Also a body of no size (no Content-Length), whose room is looked at before each chunk:
    that look made the cache's folder again to hold the claims' lock file, and the run left a
    cache of one empty lock file behind its error."""
    from torchkit.core.data.sources.http_shards import shard_cache_folder

    served, cache = tmp_path / "served", tmp_path / "cache"
    served.mkdir()
    data = _shard(served / "a-000000.tar", 2 * CHUNK + CHUNK // 2)  # read in 3 chunks, then b""
    if checked_by == "manifest":  # the sha256 checks it: the rename fails
        entry = {"name": "a-000000.tar", "bytes": len(data)}
        entry["sha256"] = hashlib.sha256(data).hexdigest()
        (served / "manifest.json").write_text(json.dumps({"shards": [entry]}))
    after = _deleting_the_cache_at_read(
        monkeypatch, cache, 2 if deleted_at == "second chunk" else 4
    )
    with serving(served, cache, monkeypatch) as server:
        where = server.url
        if checked_by == "whole tar of no size":  # the server's first N bytes, no length
            where = f"{server.url}/unsized/{len(data)}"
        spec = f"{where}/" if checked_by == "manifest" else f"{where}/a-000000.tar"
        folder = shard_cache_folder(where)
        result = run_torchkit_in_process("dataset-stats", spec, "--workers", "0")
    assert result.returncode == 1, result.stdout
    assert error_line(result.stderr) == cache_deleted_line(f"{where}/a-000000.tar", folder)
    assert after == []  # stopped at the chunk it was deleted at, not read to its end
    assert not cache.exists()  # not made again: nothing of it kept


def test_a_cache_deleted_between_two_shards_downloads_is_one_line(tmp_path, monkeypatch):
    """The cache deleted once the first shard is downloaded: the second's lock file could not
    be made in the folder gone ("Error: FileNotFoundError: ..."). One line now."""
    from torchkit.core.data.sources import http_shards

    served, cache = tmp_path / "served", tmp_path / "cache"
    served.mkdir()
    for name in ("a-000000.tar", "a-000001.tar"):
        _shard(served / name, 10_000)
    monkeypatch.setattr(http_shards, "DOWNLOAD_THREADS", 1)  # one after the other
    recorded = http_shards._write_record

    def deleting_after_the_first(target, *args):
        recorded(target, *args)
        shutil.rmtree(cache)

    monkeypatch.setattr(http_shards, "_write_record", deleting_after_the_first)
    with serving(served, cache, monkeypatch) as server:
        folder = http_shards.shard_cache_folder(server.url)
        spec = f"{server.url}/a-{{000000..000001}}.tar"
        result = run_torchkit_in_process("dataset-stats", spec, "--workers", "0")
    assert result.returncode == 1, result.stdout
    assert error_line(result.stderr) == cache_deleted_line(f"{server.url}/a-000001.tar", folder)
    assert not cache.exists()


@pytest.mark.parametrize("checked_by", ["manifest", "whole tar"])
@pytest.mark.parametrize("deleted_at", ["second chunk", "end of body"])
def test_the_file_being_written_deleted_is_one_line(tmp_path, monkeypatch, checked_by, deleted_at):
    """The download's temporary file deleted alone, its folder kept (a cleaner of hidden files):
    the body was written on into the deleted file to its end (its claim still counts its
    room), then failed at the rename with "Error: FileNotFoundError: [Errno 2] ...", or,
    checked as a whole tar, "cannot read URL: No such file or directory", while the message for
    a deleted cache names the file being written too. It ends in that line now, nothing kept."""
    from torchkit.core.data.sources import http_shards
    from torchkit.core.io.temporaries import temporary_stem

    served, cache = tmp_path / "served", tmp_path / "cache"
    served.mkdir()
    data = _shard(served / "a-000000.tar", 2 * CHUNK + CHUNK // 2)  # read in 3 chunks, then b""
    if checked_by == "manifest":
        entry = {"name": "a-000000.tar", "bytes": len(data)}
        entry["sha256"] = hashlib.sha256(data).hexdigest()
        (served / "manifest.json").write_text(json.dumps({"shards": [entry]}))
    read, deleted = http_shards._read, []
    read_number = 2 if deleted_at == "second chunk" else 4

    def deleting_the_temporary(response, url):
        if not url.endswith(".tar"):  # a side file (manifest.json)
            return read(response, url)
        deleting_the_temporary.reads += 1
        if deleting_the_temporary.reads == read_number:
            for path in folder.iterdir():
                if temporary_stem(path.name) == "a-000000.tar":
                    path.unlink()
                    deleted.append(path.name)
        return read(response, url)

    deleting_the_temporary.reads = 0
    monkeypatch.setattr(http_shards, "_read", deleting_the_temporary)
    with serving(served, cache, monkeypatch) as server:
        spec = f"{server.url}/" if checked_by == "manifest" else f"{server.url}/a-000000.tar"
        folder = http_shards.shard_cache_folder(server.url)
        result = run_torchkit_in_process("dataset-stats", spec, "--workers", "0")
    assert len(deleted) == 1
    assert result.returncode == 1, result.stdout
    assert error_line(result.stderr) == cache_deleted_line(f"{server.url}/a-000000.tar", folder)
    assert not (folder / "a-000000.tar").exists()
    assert [name for name in os.listdir(folder) if temporary_stem(name)] == []
