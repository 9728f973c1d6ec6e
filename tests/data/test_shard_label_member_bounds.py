"""A shard's label members (`KEY.cls`, `KEY.json`) were read whole into memory, whatever their
size: a 10 GB `KEY.json` (mislabelled, or a hostile shard) took all of it. One past 16 MiB is
refused by the size its tar header gives, before a byte of it is read."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from output_checks import error_line
from parquet_files import png
from processes import run_torchkit_in_process

from torchkit.core.io.errors import InputError

HUGE = (16 << 20) + 1  # one byte past the bound


def write_shard_of_a_huge_member(folder: Path, member: str) -> Path:
    """FOLDER/s-000000.tar: sample k0 (a PNG and `member` of HUGE bytes, a hole in a sparse
    file that costs no disk), then sample k1 (a PNG and its KEY.cls)."""
    folder.mkdir(parents=True, exist_ok=True)
    shard = folder / "s-000000.tar"
    with open(shard, "wb") as handle:
        for name, data in (
            ("k0.png", png(0)),
            (member, None),
            ("k1.png", png(1)),
            ("k1.cls", b"0"),
        ):
            info = tarfile.TarInfo(name)
            info.size = HUGE if data is None else len(data)
            handle.write(info.tobuf(format=tarfile.GNU_FORMAT))
            if data is None:
                handle.seek(-(-HUGE // 512) * 512, io.SEEK_CUR)
            else:
                handle.write(data + b"\0" * (-len(data) % 512))
        handle.write(b"\0" * 1024)  # the end-of-archive marker
    return folder


@pytest.mark.parametrize("member", ["k0.json", "k0.cls"])
def test_a_label_member_past_16_mib_is_refused_unread(tmp_path, member, monkeypatch):
    from torchkit.core.data.sources import open_data, shards

    shard = write_shard_of_a_huge_member(tmp_path / "shards", member)
    with tarfile.open(shard / "s-000000.tar") as tar:  # tar's own reading of the headers
        assert tar.getmember(member).size == HUGE
    read = []
    with monkeypatch.context() as patched, pytest.raises(InputError) as refused:
        patched.setattr(shards.TarReader, "read", lambda self, at: read.append(at) or b"0")
        open_data(str(shard))
    assert refused.value.message == (
        f"k0 in s-000000.tar: {member} holds 16,777,217 bytes, more than the 16 MiB a label "
        "member may"
    )
    assert read == []  # refused before any label was read
    result = run_torchkit_in_process("dataset-stats", shard, "-j", "0")
    assert result.returncode == 1 and result.stdout == ""
    assert error_line(result.stderr, besides="nothing").startswith(f"Error: {refused.value}")
