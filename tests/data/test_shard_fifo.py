"""A FIFO named like a shard in a folder of shards (`mkfifo d/s-000001.tar`): listing the
folder opened it, which waits for a writer, so every command reading the folder hung for good.
It is one error line naming it, and nothing opens it. So is a `classes.txt` or `classes.json`
beside the shards that is no file (a FIFO, a link to nothing), which was passed over
without a word: the classes were named "0", "1", ..., not as it names them."""

from __future__ import annotations

import io
import os
import tarfile
import threading
from pathlib import Path

import pytest

from torchkit.core.io.errors import InputError

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")


def write_shard(path: Path) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in (("k.png", b"not read"), ("k.cls", b"0")):
            member = tarfile.TarInfo(name)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))


def test_a_fifo_among_shards_is_one_error_not_a_hang(tmp_path):
    from torchkit.core.data.sources import open_data

    write_shard(tmp_path / "s-000000.tar")
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


@pytest.mark.parametrize(
    ("name", "what"),
    [("classes.txt", "a FIFO"), ("classes.json", "a FIFO"), ("classes.txt", "a link")],
)
def test_a_class_names_file_that_is_no_file_is_an_error_naming_it(tmp_path, name, what):
    from torchkit.core.data.sources import open_data

    write_shard(tmp_path / "s-000000.tar")
    side = tmp_path / name
    if what == "a FIFO":
        os.mkfifo(side)
    else:
        side.symlink_to("gone.txt")
        what = "a symbolic link to nothing"
    with pytest.raises(InputError) as raised:
        open_data(str(tmp_path), allow_unlabelled=True)
    assert str(raised.value) == (
        f"cannot read the class names beside the shards: {side} is not a regular file ({what}) "
        f"(make {name} a file of the class names, or remove it)"
    )
