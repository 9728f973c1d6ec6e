"""A FIFO named like a shard in a folder of shards (`mkfifo d/s-000001.tar`): listing the
folder opened it, which waits for a writer, so every command reading the folder hung for good.
It is one error line naming it, and nothing opens it."""

from __future__ import annotations

import io
import os
import tarfile
import threading

import pytest

from torchkit.core.io.errors import InputError

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")


def test_a_fifo_among_shards_is_one_error_not_a_hang(tmp_path):
    from torchkit.core.data.sources import open_data

    with tarfile.open(tmp_path / "s-000000.tar", "w") as tar:
        for name, data in (("k.png", b"not read"), ("k.cls", b"0")):
            member = tarfile.TarInfo(name)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    fifo = tmp_path / "s-000001.tar"
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def read() -> None:
        try:
            open_data(str(tmp_path), allow_unlabelled=True)
            outcome.append(None)
        except BaseException as error:  # the test's to judge, in the main thread
            outcome.append(error)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=15)  # at once where it is refused; a daemon thread left where not
    if reader.is_alive():
        pytest.fail("reading the folder waits on the FIFO named like a shard")
    assert isinstance(outcome[0], InputError), outcome
    assert f"{fifo} is not a regular file (a FIFO)" in str(outcome[0])
