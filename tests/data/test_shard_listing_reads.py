"""Listing shards at scale: a shard's `.cls` and `.json` labels are read with its headers (one
pass over the file), not by a read of their own each (a million samples cost a million reads
more), and the headers' checksums, checked a chunk of headers at a time, still catch a damaged
header wherever it lies."""

from __future__ import annotations

import contextlib
import io
import json
import signal
import tarfile
from pathlib import Path

import pytest

from torchkit.core.data.sources import open_data, shards
from torchkit.core.io.errors import InputError


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    """A ustar archive of `members` in this order (a name may come twice)."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def counted_reads(monkeypatch) -> list:
    """The locators of every read of a shard's bytes outside its listing."""
    reads = []
    real_read = shards.TarReader.read

    def read(self, locator):
        reads.append(locator)
        return real_read(self, locator)

    monkeypatch.setattr(shards.TarReader, "read", read)
    return reads


def test_labels_are_read_with_the_headers_not_a_read_each(tmp_path, counted_reads):
    """300 samples over three shards, labelled by `.cls` (and some by a `.json` name): opening
    them reads no member on its own; a `.json` past the size read with its header (a long
    caption) is read alone, and still labels its sample."""
    png = b"\x89PNG not decoded here"
    folder = tmp_path / "shards"
    folder.mkdir()
    caption = "x" * 6000
    for shard in range(3):
        members = []
        for key in range(shard * 100, shard * 100 + 100):
            members.append((f"{key:05d}.png", png))
            if key % 10 == 3:
                members.append((f"{key:05d}.json", json.dumps({"label": "b"}).encode()))
            elif key == 250:
                meta = {"label": "c", "caption": caption}
                members.append((f"{key:05d}.json", json.dumps(meta).encode()))
            else:
                members.append((f"{key:05d}.cls", str(key % 3).encode()))
        write_tar(folder / f"shard-{shard:06d}.tar", members)
    (folder / "classes.txt").write_text("a\nb\nc\n")
    data = open_data(str(folder))
    expected = [1 if key % 10 == 3 else 2 if key == 250 else key % 3 for key in range(300)]
    assert list(data.whole.labels) == expected
    assert len(counted_reads) == 1  # the long .json alone
    assert counted_reads[0][1] > shards._LABEL_READ_BYTES


def test_a_label_member_written_again_under_its_name_is_read_as_the_last(tmp_path):
    """A tar may hold a name twice (appended to: `tar rf`); the last one is the member, as
    tarfile reads it. A first `.cls` kept from the headers' pass, under a second too long to
    be kept so, gave the sample the first one's label."""
    png = b"\x89PNG"
    padded = b"2" + b" " * (shards._LABEL_READ_BYTES + 10)  # "2", whitespace around it
    shard = write_tar(
        tmp_path / "s-000000.tar",
        [("x.png", png), ("x.cls", b"1"), ("y.png", png), ("y.cls", b"0"), ("x.cls", padded)],
    )
    data = open_data(str(shard), allow_unlabelled=True)
    assert dict(zip(data.whole.ids, data.whole.labels, strict=True)) == {
        "s-000000.tar/x.png": 2,
        "s-000000.tar/y.png": 0,
    }


@pytest.mark.parametrize("members", [6, 200])  # checked one by one; a chunk at a time
def test_a_header_with_a_wrong_checksum_is_damage_wherever_it_lies(tmp_path, members):
    files = [(f"{i:04d}.cls", b"1") for i in range(members)]
    archive = write_tar(tmp_path / "s.tar", files)
    raw = bytearray(archive.read_bytes())
    bad = (members // 2) * 2 * tarfile.BLOCKSIZE  # the header of member members // 2
    assert raw[bad : bad + 4] == b"%04d" % (members // 2)
    raw[bad] = ord("9")  # its checksum no longer holds
    archive.write_bytes(bytes(raw))
    assert shards._read_plain_headers(str(archive), len(raw)) is None  # tarfile judges
    with pytest.raises(shards.DamagedTar, match=f"after {members // 2} members"):
        shards.list_tar(str(archive))


def test_the_headers_pass_finds_every_member_where_tarfile_does(tmp_path):
    """Members of many sizes, so that headers fall across the chunks the pass reads, and some
    larger than a chunk: the same names, offsets and sizes as tarfile's, labels kept whole."""
    sizes = [0, 1, 511, 512, 513, 70_000, 5, 200_000, *range(0, 3000, 97)]
    files = [(f"d/{i:03d}.{'cls' if i % 2 else 'bin'}", bytes([i % 251]) * n)
             for i, n in enumerate(sizes)]  # fmt: skip
    archive = write_tar(tmp_path / "mixed.tar", files)
    listing = shards._read_plain_headers(str(archive), archive.stat().st_size, labels=True)
    assert listing is not None
    with tarfile.open(archive) as tar:
        expected = {m.name: (m.offset_data, m.size) for m in tar.getmembers()}
    assert listing.members == expected
    small = {name: data for name, data in files
             if name.endswith(".cls") and len(data) <= shards._LABEL_READ_BYTES}  # fmt: skip
    assert listing.labels == small


class Looped(BaseException):
    """Raised into a listing that went on past its time (no `except Exception` catches it)."""


@contextlib.contextmanager
def stopped_after(seconds: float):
    """A listing that loops is stopped (`Looped`) rather than hanging the suite."""

    def stop(signum, frame):
        raise Looped("the listing went on past its time: a loop")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _with_size_field(raw: bytearray, header: int, field: bytes, *, checksum: bool) -> bytes:
    """`raw` with the size field of the header at `header` set to `field`, its checksum made
    to hold again where `checksum` (a tar written so) or left wrong (a damaged one)."""
    raw[header + 124 : header + 136] = field.ljust(12, b"\0")
    if checksum:
        block = raw[header : header + 512]
        block[148:156] = b" " * 8
        raw[header + 148 : header + 156] = b"%06o\0 " % sum(block)
    return bytes(raw)


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="SIGALRM stops a loop")
@pytest.mark.parametrize(
    ("field", "checksum", "after"),
    [
        (b"-0001000", False, 2),  # damaged: the chunked pass went on for ever (tarfile: 2)
        (b"-0002000", False, 2),  # back to a data block read as a header, then here again
        (b"-0001000", True, 2),  # a header that says so: this one again, for ever (tarfile too)
        (b"-0002000", True, 2),
    ],
)
def test_a_negative_member_size_is_damage_not_a_loop(tmp_path, field, checksum, after):
    """A size field of `-1000` (octal) parses as a size of -512: the next header is then this
    one, or one before it. A damaged header's checksum is checked a chunk later, after its
    size is used: the pass read the same headers for ever (its list of headers to check
    growing with them), where one by one it stopped at that header."""
    files = [(name, b"\x89PNG" + bytes(600) if name.endswith(".png") else b"1")
             for i in range(6) for name in (f"k{i}.png", f"k{i}.cls")]  # fmt: skip
    archive = write_tar(tmp_path / "s-000000.tar", files)
    raw = bytearray(archive.read_bytes())
    header = 5 * 512  # k1.png's: after k0.png's header and 2 blocks, k0.cls's header and 1
    assert raw[header : header + 6] == b"k1.png"
    archive.write_bytes(_with_size_field(raw, header, field, checksum=checksum))
    with stopped_after(2), pytest.raises(shards.DamagedTar, match=f"after {after} members"):
        shards.list_tar(str(archive))
    with stopped_after(2), pytest.raises(InputError, match="truncated or damaged"):
        open_data(str(archive))


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="SIGALRM stops a loop")
def test_a_negative_pax_size_is_damage_not_a_loop(tmp_path):
    archive = tmp_path / "s-000000.tar"
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in (("k0.png", b"\x89PNG"), ("k0.cls", b"1")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.pax_headers = {"size": "-1024"} if name == "k0.cls" else {}
            tar.addfile(info, io.BytesIO(data))
    with stopped_after(2), pytest.raises(shards.DamagedTar, match="negative size"):
        shards.list_tar(str(archive))


def test_the_samples_of_one_class_share_its_name_and_index(tmp_path, monkeypatch):
    """Each `KEY.json` label parses into a str of its own (and each index past 256 into an int
    of its own): a million samples held a million copies of a hundred names while the shards
    were listed. The samples of a class now share one name and one index, over every shard;
    the labels are the same."""
    png = b"\x89PNG not decoded here"
    folder = tmp_path / "shards"
    folder.mkdir()
    for shard in range(2):
        members = []
        for key in range(shard * 60, shard * 60 + 60):
            meta = {"label": f"class_{key % 3}", "cls": 1000 + key % 3, "path": f"{key}.png"}
            members += [(f"{key:05d}.png", png), (f"{key:05d}.json", json.dumps(meta).encode())]
        write_tar(folder / f"shard-{shard:06d}.tar", members)
    listed = []
    real_source = shards.shards_source

    def source(spec, root, found, *args, **kwargs):
        listed.extend(found)
        return real_source(spec, root, found, *args, **kwargs)

    monkeypatch.setattr(shards, "shards_source", source)
    data = open_data(str(folder))
    assert len(listed) == 120
    assert len({id(sample.name) for sample in listed}) == 3
    assert len({id(sample.index) for sample in listed}) == 3
    assert sorted({(sample.name, sample.index) for sample in listed}) == [
        ("class_0", 1000),
        ("class_1", 1001),
        ("class_2", 1002),
    ]
    assert list(data.whole.labels) == [key % 3 for key in range(120)]
