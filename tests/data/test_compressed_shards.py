"""Shards compressed whole (`train-000000.tar.gz`, `.tgz`: what webdataset streams
decompressed): torchkit reads a shard in place, by offset, so it refuses them, but a pattern
or a file naming them said "dataset not found", and a folder of them "no images", though the
files were there. Each is one error line naming a compressed tar, as a gzipped `.tar` is."""

from __future__ import annotations

import gzip
import io
import tarfile

import pytest
from output_checks import error_line
from processes import run_torchkit_in_process

from torchkit.core.io.errors import InputError


def write_gzipped_shard(path):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in (("k.png", b"not read"), ("k.cls", b"0")):
            member = tarfile.TarInfo(name)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    path.write_bytes(gzip.compress(buffer.getvalue()))


@pytest.mark.parametrize(
    "named, shown",
    [
        ("d/s-{000000..000001}.tar.gz", "d/s-000000.tar.gz is a compressed tar (and 1 more)"),
        ("d/s-000001.tar.gz", "d/s-000001.tar.gz is a compressed tar"),
        ("d", "d/s-000000.tar.gz is a compressed tar (and 1 more)"),
        ("one.tgz", "one.tgz is a compressed tar"),
    ],
)
def test_compressed_shards_are_one_error_naming_them(tmp_path, named, shown):
    from torchkit.core.data.sources import open_data

    (tmp_path / "d").mkdir()
    for path in (
        tmp_path / "d/s-000000.tar.gz",
        tmp_path / "d/s-000001.tar.gz",
        tmp_path / "one.tgz",
    ):
        write_gzipped_shard(path)
    with pytest.raises(InputError) as raised:
        open_data(str(tmp_path / named), allow_unlabelled=True)
    assert str(tmp_path / shown) in str(raised.value)
    assert "decompress it to a .tar" in str(raised.value.hint)


def test_a_pattern_of_compressed_shards_is_one_error_line(tmp_path):
    write_gzipped_shard(tmp_path / "s-000000.tar.gz")
    result = run_torchkit_in_process("dataset-stats", tmp_path / "s-{000000..000000}.tar.gz")
    assert result.returncode == 1
    assert f"{tmp_path}/s-000000.tar.gz is a compressed tar" in error_line(result.stderr)


@pytest.mark.parametrize(
    "named, shown",
    [
        (
            "https://host.invalid/d/train-{0..9}.tar.gz",
            "https://host.invalid/d/train-0.tar.gz is a compressed tar (and 9 more)",
        ),
        (
            "http://user:secret@127.0.0.1:9/d/a.tar::http://127.0.0.1:9/d/b.tgz?token=t",
            "http://127.0.0.1:9/d/b.tgz is a compressed tar",
        ),
        ("http://127.0.0.1:9/one.tar.gz", "http://127.0.0.1:9/one.tar.gz is a compressed tar"),
    ],
)
def test_compressed_shard_urls_are_the_same_error_before_any_download(named, shown):
    """Before: '... names no .tar shard: a :: list joins shard URLs' for a pattern of them, and
    a folder URL's missing manifest.json for one (after asking the server); now the error of a
    compressed shard on disk, from the names alone (no address here answers)."""
    from torchkit.core.data.sources import open_data

    with pytest.raises(InputError) as raised:
        open_data(named, allow_unlabelled=True)
    assert raised.value.message == shown  # no query (a token), no password
    assert raised.value.hint == "shards are read in place: decompress it to a .tar"
