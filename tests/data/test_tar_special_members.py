"""A FIFO or a device stored in a `.tar` (of an image folder, or a WebDataset shard) named like an
image is the image tar -x unpacks it to, one that cannot be read: listed, never opened, an
unreadable image (`not a regular file (a FIFO)`), as the folder reader makes a FIFO on disk; a
link to one reads it so too. Both listings of a tar (torchkit's own pass over plain headers,
and Python's `tarfile` where that pass gives up: a pax global header here) left such members out
without a word: a shard's sample then had no image, an error saying it held only its label."""

from __future__ import annotations

import csv
import io
import json
import tarfile
from pathlib import Path

import pytest
from checkpoints import write_convnet_checkpoint
from output_checks import error_line
from parquet_files import png
from processes import run_torchkit_in_process
from tar_members import readable_and_not, tar_of_members

from torchkit.core.data.image_files import NotARegularFile
from torchkit.core.data.sources import open_data, shards
from torchkit.core.io.errors import InputError

# the plain-header pass lists the tar; a pax global header leaves it to tarfile
LISTINGS = {"headers": None, "tarfile": {"comment": "made by a test"}}


@pytest.fixture(params=list(LISTINGS))
def pax(request) -> dict | None:
    return LISTINGS[request.param]


def folder_tar(path: Path, pax: dict | None) -> Path:
    members = [
        ("cat/a.png", png(0)),
        ("cat/f.png", "|fifo"),
        ("cat/s.png", "->f.png"),  # a symbolic link to the FIFO
        ("dog/b.png", png(1)),
        ("dog/c.png", "|char"),
        ("dog/d.png", "|block"),
        ("dog/notes.txt", "|fifo"),  # not named like an image: no image
    ]
    archive = tar_of_members(path, members, pax_headers=pax)
    listing = shards._read_plain_headers(str(archive), archive.stat().st_size)
    assert (listing is None) == (pax is not None)
    return archive


def test_a_folder_tar_lists_them_as_unreadable_images(tmp_path, pax):
    source = open_data(str(folder_tar(tmp_path / "pets.tar", pax)))
    ids = ["cat/a.png", "cat/f.png", "cat/s.png", "dog/b.png", "dog/c.png", "dog/d.png"]
    assert source.whole.ids == ids
    assert list(source.whole.labels) == [0, 0, 0, 1, 1, 1]
    read, unreadable = readable_and_not(source)
    assert read == {"cat/a.png": png(0), "dog/b.png": png(1)}
    assert unreadable == ["cat/f.png", "cat/s.png", "dog/c.png", "dog/d.png"]
    reasons = []
    for path in source.whole.paths[1:3] + source.whole.paths[4:]:
        with pytest.raises(NotARegularFile) as raised:
            path.read_bytes()
        reasons.append(str(raised.value))
    assert reasons == [
        f"not a regular file ({what})" for what in ("a FIFO",) * 2 + ("a device",) * 2
    ]


def test_dataset_stats_counts_them_and_strict_refuses(tmp_path):
    archive = folder_tar(tmp_path / "pets.tar", None)
    report = run_torchkit_in_process("dataset-stats", archive, "--format", "json", "-j", "0")
    assert report.returncode == 0, report.stderr
    found = json.loads(report.stdout)
    assert (found["images"], found["unreadable_count"]) == (2, 4)
    assert found["unreadable"][:2] == [
        {"path": "cat/f.png", "error": "not a regular file (a FIFO)"},
        {"path": "cat/s.png", "error": "not a regular file (a FIFO)"},
    ]
    strict = run_torchkit_in_process("dataset-stats", archive, "--strict", "-j", "0")
    assert strict.returncode == 1
    assert error_line(strict.stderr) == (
        "Error: unreadable image pets.tar/cat/f.png: not a regular file (a FIFO) (fix or "
        "remove it, or leave out --strict to skip unreadable images)"
    )


def test_predict_gives_each_its_row(tmp_path):
    archive = folder_tar(tmp_path / "pets.tar", None)
    checkpoint = tmp_path / "two.pt"
    write_convnet_checkpoint(checkpoint, in_channels=3, image_size=8, classes=["cat", "dog"])
    predicted = run_torchkit_in_process(
        "predict", checkpoint, archive, "--format", "csv", "--workers", "0"
    )
    assert predicted.returncode == 0, predicted.stderr
    rows = {row["path"]: row["error"] for row in csv.DictReader(predicted.stdout.splitlines())}
    assert rows == {
        "cat/a.png": "",
        "cat/f.png": "not a regular file (a FIFO)",
        "cat/s.png": "not a regular file (a FIFO)",
        "dog/b.png": "",
        "dog/c.png": "not a regular file (a device)",
        "dog/d.png": "not a regular file (a device)",
    }


def test_a_shard_sample_whose_image_is_a_fifo_is_an_unreadable_image(tmp_path, pax):
    """The sample was said to have no image ('it holds cls'), and the shard refused."""
    members = [
        ("s0.png", png(0)), ("s0.cls", b"0"),
        ("s1.png", "|fifo"), ("s1.cls", b"1"),
        ("s2.png", png(2)), ("s2.cls", b"1"),
        ("s3.jpg", "=>s1.png"), ("s3.cls", b"0"),  # a hard link to the FIFO: one too
    ]  # fmt: skip
    shard = tar_of_members(tmp_path / "shard-000000.tar", members, pax_headers=pax)
    source = open_data(str(shard))
    assert source.whole.ids == [
        f"shard-000000.tar/{n}" for n in ("s0.png", "s1.png", "s2.png", "s3.jpg")
    ]
    assert list(source.whole.labels) == [0, 1, 1, 0]
    read, unreadable = readable_and_not(source)
    assert unreadable == ["shard-000000.tar/s1.png", "shard-000000.tar/s3.jpg"]
    with pytest.raises(NotARegularFile, match=r"^not a regular file \(a FIFO\)$"):
        source.whole.paths[1].read_bytes()


def test_a_shard_label_that_is_a_fifo_is_an_error_naming_it(tmp_path, pax):
    """The sample read as unlabelled: partly labelled data, or train's missing label."""
    members = [("s0.png", png(0)), ("s0.cls", b"0"), ("s1.png", png(1)), ("s1.cls", "|fifo")]
    shard = tar_of_members(tmp_path / "shard-000000.tar", members, pax_headers=pax)
    with pytest.raises(InputError) as raised:
        open_data(str(shard))
    assert str(raised.value) == (f"cannot read s1.cls in {shard}: not a regular file (a FIFO)")


def test_a_name_stored_again_is_what_its_last_member_is(tmp_path, pax):
    """`tar -rf` of a file over a FIFO of its name, and of a FIFO over a file: tar -x leaves the
    last, and a hard link made to the first keeps what it was made to."""
    members = [
        ("cat/a.png", "|fifo"),
        ("cat/h.png", "=>cat/a.png"),
        ("cat/b.png", png(1)),
        ("dog/c.png", png(2)),
        ("cat/a.png", png(0)),
        ("cat/b.png", "|fifo"),
    ]
    source = open_data(str(tar_of_members(tmp_path / "pets.tar", members, pax_headers=pax)))
    read, unreadable = readable_and_not(source)
    assert read == {"cat/a.png": png(0), "dog/c.png": png(2)}
    assert unreadable == ["cat/b.png", "cat/h.png"]


def kinds_tar(path: Path, members: list[tuple[str, bytes, bytes]], pax: dict | None) -> Path:
    """A tar of (name, kind, data) members."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT, pax_headers=pax) as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            info.type, info.size = kind, len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_a_files_kind_named_as_a_folder_is_a_folder_in_both_listings(tmp_path, pax):
    """tarfile's listing (where the plain headers' pass gives up) read a file's kind with a
    name ending in `/` as a file (`cat/x.png`), where the pass and GNU tar -x make it a folder
    (its data skipped): one archive read two ways."""
    members = [
        ("cat/a.png", tarfile.REGTYPE, png(0)),
        ("cat/x.png/", tarfile.REGTYPE, png(1)),
        ("dog/b.png", tarfile.REGTYPE, png(2)),
    ]
    source = open_data(str(kinds_tar(tmp_path / "pets.tar", members, pax)))
    assert source.whole.ids == ["cat/a.png", "dog/b.png"]
    assert [path.read_bytes() for path in source.whole.paths] == [png(0), png(2)]


def test_a_member_of_a_kind_tar_does_not_know_is_a_file(tmp_path):
    """Left out without a word, where GNU tar -x, and tarfile's extract, make a file of it
    ("Unknown file type 'Z', extracted as normal file"); GNU's dumped folder (`D`, `tar -g`)
    is a folder, as tar -x makes it."""
    members = [
        ("cat/a.png", tarfile.REGTYPE, png(0)),
        ("dog/b.png", tarfile.REGTYPE, png(2)),
        ("dog/z.png", b"Z", png(3)),
        ("dog/old.png", b"D", b""),
    ]
    source = open_data(str(kinds_tar(tmp_path / "pets.tar", members, None)))
    assert source.whole.ids == ["cat/a.png", "dog/b.png", "dog/z.png"]
    assert [path.read_bytes() for path in source.whole.paths] == [png(0), png(2), png(3)]


def test_a_fifo_named_as_a_label_does_not_make_a_folders_tar_a_shard(tmp_path, pax):
    """A FIFO `cat/a.json` beside `cat/a.png` is a file the folder reads as no image: the tar
    is the image folder (it was, the FIFO left out), not a shard whose label cannot be read."""
    members = [("cat/a.png", png(0)), ("cat/a.json", "|fifo"), ("dog/b.png", png(1))]
    source = open_data(str(tar_of_members(tmp_path / "pets.tar", members, pax_headers=pax)))
    assert (source.classes, source.whole.ids) == (["cat", "dog"], ["cat/a.png", "dog/b.png"])


def test_a_fifo_under_two_names_in_two_classes_is_two_unreadable_images(tmp_path, pax):
    """A hard link to a FIFO in another class (`dog/g.png` => `cat/f.png`) was one file in two
    classes, an error refusing the archive, where the folder tar -x unpacks lists both as
    unreadable images (no image is read from a FIFO to be labelled twice)."""
    members = [
        ("cat/a.png", png(0)),
        ("cat/f.png", "|fifo"),
        ("dog/b.png", png(1)),
        ("dog/g.png", "=>cat/f.png"),
    ]
    source = open_data(str(tar_of_members(tmp_path / "pets.tar", members, pax_headers=pax)))
    assert readable_and_not(source)[1] == ["cat/f.png", "dog/g.png"]


def fifo_with_data_tar(path: Path, pax: dict | None, *, stored: bool) -> Path:
    """pets.tar whose `cat/f.png` is a FIFO of size field 10: its 10 bytes stored after it (as
    some writers do), or none (as POSIX has it, and tarfile writes it)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT, pax_headers=pax) as tar:
        for name, data in (("cat/a.png", png(0)), ("cat/f.png", None), ("dog/b.png", png(1))):
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.size = tarfile.FIFOTYPE, 10
                tar.addfile(info)  # the header alone
                if stored:
                    tar.fileobj.write(b"0123456789".ljust(tarfile.BLOCKSIZE, b"\0"))
                    tar.offset += tarfile.BLOCKSIZE
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    path.write_bytes(out.getvalue())
    return path


@pytest.mark.parametrize("stored", [True, False], ids=["data-stored", "no-data"])
def test_a_fifo_of_a_nonzero_size_is_an_unreadable_image_in_both_listings(tmp_path, pax, stored):
    """Where its writer stored the bytes its size field counts, tarfile's listing (a pax global
    header) read them as the next header: the archive "truncated or damaged", refused whole,
    where GNU tar -x skips them and makes the FIFO, and the plain headers' pass read it."""
    archive = fifo_with_data_tar(tmp_path / "pets.tar", pax, stored=stored)
    source = open_data(str(archive))
    read, unreadable = readable_and_not(source)
    assert read == {"cat/a.png": png(0), "dog/b.png": png(1)}
    assert unreadable == ["cat/f.png"]
    if pax is not None:
        strict = run_torchkit_in_process("dataset-stats", archive, "--strict", "-j", "0")
        assert strict.returncode == 1
        assert error_line(strict.stderr).startswith(
            "Error: unreadable image pets.tar/cat/f.png: not a regular file (a FIFO)"
        )
