"""A `.tar` of an image folder reads as the folder `tar -xf` unpacks it to: a name stored twice
keeps its last member, a `..` after a link in a link's target steps out of the folder the link
leads to, an image-named link to a folder is a folder, members under a folder that is a link
out of the archive are not read, links out of the archive are unreadable images, and warnings
show link targets as the archive stores them; where a file and a folder of one name meet the
first written stays, a hard link to a folder is no link, and a link target through a file
names nothing. GNU tar is the reference where
the machine has it (`tar --version`); the tests record what GNU tar 1.34 unpacks."""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

import pytest
from parquet_files import png
from processes import run_json, run_torchkit_in_process
from tar_members import (
    bytes_or_errors,
    bytes_or_none,
    has_gnu_tar,
    images_read,
    opened_with_warnings,
    readable_and_not,
    tar_of_members,
)

from torchkit.core.data.sources import open_data
from torchkit.core.data.sources.shards import LEADS_OUT


def _tar(path: Path, members: list[tuple[str, bytes | str | None]]) -> Path:
    return tar_of_members(path, members, format=tarfile.GNU_FORMAT)


def _unpacked_by_gnu_tar(archive: Path) -> Path | None:
    """The folder GNU tar unpacks `archive` to (whatever it refuses left out); None without
    GNU tar."""
    if not has_gnu_tar():
        return None
    unpacked = archive.parent / f"{archive.stem}-unpacked"
    unpacked.mkdir()
    subprocess.run(["tar", "-xf", archive, "-C", unpacked], capture_output=True)
    return unpacked


def _read(archive: Path, caplog) -> tuple[dict[str, bytes], list[str]]:
    """({id: its bytes}, the warnings) of `open_data` of `archive`."""
    source, warned = opened_with_warnings(archive, caplog)
    return images_read(source), warned


def _files(folder: Path, names) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in names}


def _assert_gnu_tar_unpacks_them(archive: Path, images: dict[str, bytes]) -> None:
    """Where the machine has GNU tar: the folder it unpacks `archive` to reads as `images`."""
    unpacked = _unpacked_by_gnu_tar(archive)
    if unpacked is not None:
        assert open_data(str(unpacked)).whole.ids == sorted(images)
        assert _files(unpacked, images) == images


# The warning naming the images tar -x does not write where a file and a folder of one name meet
_UNWRITTEN = (
    "image members are not read, as tar -x writes no file where a folder of its name holds "
    "files, nor anything in a file: "
)


def test_a_name_stored_again_reads_its_last_member(tmp_path, caplog):
    """`tar -rf` appends a newer version of a file, and `tar -xf` leaves the last member of a
    name: where the versions were of two kinds the first was read (a file then a link to
    another image read the old file; a file after a link out of the archive was left out as
    that link), and so where a path was stored under two spellings (`/cat/f.png`). A hard
    link made before a newer member of its target's name keeps the data it was made to (a
    second name of the earlier file), where it read the newer one."""
    members = [
        ("cat/a.png", png(0)),
        ("cat/d.png", png(1)),
        ("cat/e.png", "->/etc/passwd"),
        ("/cat/f.png", png(5)),
        ("cat/g.png", png(6)),
        ("cat/h.png", png(8)),
        ("dog/c.png", png(9)),
        ("cat/i.png", "=>cat/a.png"),  # a second name of the first a.png: it stays
        ("cat/a.png", png(2)),  # a file again
        ("cat/e.png", png(3)),  # a file where a link out was
        ("cat/f.png", png(4)),
        ("/cat/f.png", png(7)),  # a third time, under the first spelling
        ("cat/g.png", "->d.png"),  # a symbolic link where a file was
        ("cat/h.png", "=>cat/d.png"),  # a hard link where a file was
    ]
    archive = _tar(tmp_path / "pets.tar", members)
    images, warned = _read(archive, caplog)
    expected = {"a": 2, "d": 1, "e": 3, "f": 7, "g": 1, "h": 1, "i": 0}
    assert images == {
        **{f"cat/{name}.png": png(index) for name, index in expected.items()},
        "dog/c.png": png(9),
    }
    assert warned == []
    report = run_json("dataset-stats", archive, "-j", "0")
    assert (report["images"], report["unreadable_count"]) == (8, 0)
    out = tmp_path / "shards"
    converted = run_torchkit_in_process("convert", "shards", archive, out)
    assert converted.returncode == 0, converted.stderr
    written = {}
    with tarfile.open(next(out.glob("*.tar"))) as shard:
        for member in shard.getmembers():
            written[member.name] = shard.extractfile(member).read()
    paths = {
        json.loads(data)["path"]: written[name.replace(".json", ".png")]
        for name, data in written.items()
        if name.endswith(".json")
    }
    assert paths == images
    unpacked = _unpacked_by_gnu_tar(archive)
    if unpacked is not None:
        # cat/e.png aside: GNU tar makes a link out last (a placeholder file till then), and
        # where the file written over the placeholder takes its inode it puts the link back.
        shown = [name for name in images if name != "cat/e.png"]
        assert _files(unpacked, shown) == {name: images[name] for name in shown}


def test_a_shard_member_stored_again_reads_its_last_member_in_its_first_place(tmp_path):
    """A shard's image and label appended again (`tar -rf`): the sample reads the last of
    each, at the place its name first took in the shard, as the folder `tar -xf` unpacks lists
    it (00000, 00001, 00002); the sample moved to the end, so `convert shards` of the shard
    wrote other shards than of the same shard written once (with --no-shuffle, and with its
    seeded shuffle). So for a sample whose members are links: at its links' place, not after
    every sample of regular members."""
    once = [
        ("00000.png", png(2)),
        ("00000.cls", b"1"),
        ("00001.png", png(1)),
        ("00001.cls", b"1"),
        ("00002.png", "->00001.png"),
        ("00002.cls", "->00001.cls"),
        ("00003.png", png(3)),
        ("00003.cls", b"0"),
    ]
    appended = [("00000.png", png(0)), ("00000.cls", b"0"), *once[2:], *once[:2]]
    (tmp_path / "once").mkdir()
    (tmp_path / "appended").mkdir()
    written = tar_of_members(tmp_path / "once" / "shard-000000.tar", once)
    stored_again = tar_of_members(tmp_path / "appended" / "shard-000000.tar", appended)
    source = open_data(str(stored_again))
    assert [path.read_bytes() for path in source.whole.paths] == [png(2), png(1), png(1), png(3)]
    assert list(source.whole.labels) == [1, 1, 1, 0]
    assert source.whole.ids == [f"shard-000000.tar/0000{i}.png" for i in range(4)]
    for extra in ([], ["--no-shuffle"]):
        shards = {}
        for name, shard in (("once", written), ("appended", stored_again)):
            out = tmp_path / f"{name}-out{len(extra)}"
            result = run_torchkit_in_process("convert", "shards", shard, out, *extra)
            assert result.returncode == 0, result.stderr
            shards[name] = [path.read_bytes() for path in sorted(out.glob("*.tar"))]
        assert shards["appended"] == shards["once"]


@pytest.mark.parametrize("name", ["shard-000000.tar", "shard.tar"])
def test_a_shard_image_stored_again_under_another_spelling_is_its_samples_image(tmp_path, name):
    """`/00000.png` appended after `00000.png` and `00000.cls` replaces the image `tar -x`
    unpacks to 00000.png: the listing kept it, under its own spelling, but grouped it as a
    sample `/00000` of no label, 00000 then one of no image (the shard read as one flat
    unlabelled image, its labels skipped as files that are no images)."""
    members = [
        ("00000.png", png(0)),
        ("00000.cls", b"1"),
        ("00001.png", png(1)),
        ("00001.cls", b"0"),
        ("/00000.png", png(2)),
    ]
    source = open_data(str(tar_of_members(tmp_path / name, members)))
    assert [path.read_bytes() for path in source.whole.paths] == [png(2), png(1)]
    assert list(source.whole.labels) == [1, 0]


def test_a_dot_dot_after_a_link_in_a_link_target_steps_out_of_the_linked_folder(tmp_path, caplog):
    """`cat/s.png -> link/../x.png`, where `cat/link -> ../.sub/deeper`: the system takes the
    `..` out of .sub/deeper (.sub/x.png), where torchkit collapsed `link/..` as text and read
    cat/x.png; one more `..` is x.png at the root, and three more lead out of the archive."""
    members = [
        ("cat/a.png", png(0)),
        ("dog/c.png", png(1)),
        (".sub/deeper/q.png", png(2)),
        (".sub/x.png", png(3)),
        ("cat/x.png", png(4)),
        ("x.png", png(5)),
        ("cat/link", "->../.sub/deeper"),
        ("cat/s.png", "->link/../x.png"),
        ("cat/t.png", "->link/../../x.png"),
        ("dog/u.png", "->../cat/link/../../../x.png"),
    ]
    archive = _tar(tmp_path / "pets.tar", members)
    source, warned = opened_with_warnings(archive, caplog)
    assert bytes_or_errors(source) == {
        "cat/a.png": png(0),
        "cat/s.png": png(3),
        "cat/t.png": png(5),
        "cat/x.png": png(4),
        "dog/c.png": png(1),
        "dog/u.png": LEADS_OUT,  # never followed: an unreadable image, as a shard's
    }
    assert warned == [
        f"1 linked folder(s) in {archive} not entered: each leads back into the data, above "
        "it, or to a folder read already: cat/link",
    ]
    unpacked = _unpacked_by_gnu_tar(archive)
    if unpacked is not None:
        assert _files(unpacked, ["cat/s.png", "cat/t.png"]) == {
            "cat/s.png": png(3),
            "cat/t.png": png(5),
        }
        assert (unpacked / "dog/u.png").resolve() == (tmp_path / "x.png").resolve()


def test_an_image_named_link_to_a_folder_is_a_folder_not_an_unreadable_image(tmp_path):
    """`cat/f.png -> ../dog/`: tar -xf makes a link to a folder, which a folder on disk does
    not enter (with its warning); torchkit warned so and also listed it as an image it could
    not read. A class folder so named (`b.png -> .sub`) is read as a linked class folder."""
    members = [
        ("cat/a.png", png(0)),
        ("dog/c.png", png(1)),
        (".sub/q.png", png(2)),
        ("cat/f.png", "->../dog/"),
        ("b.png", "->.sub"),
    ]
    archive = _tar(tmp_path / "pets.tar", members)
    result = run_torchkit_in_process("dataset-stats", archive, "-j", "0", "--format", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["images"], report["unreadable_count"]) == (3, 0)
    assert report["num_classes"] == 3
    assert (
        f"Warning: 1 linked folder(s) in {archive} not entered: each leads back into the data, "
        "above it, or to a folder read already: cat/f.png"
    ) in result.stderr.splitlines()
    source = open_data(str(archive))
    assert source.whole.ids == ["b.png/q.png", "cat/a.png", "dog/c.png"]


def test_members_in_a_folder_that_is_a_link_tar_does_not_write_through_are_not_read(
    tmp_path, caplog
):
    """`out -> /host`, then `out/x.png`: tar -xf writes no member through such a link ('Cannot
    open: Not a directory'), where torchkit read out/x.png as class out. Nor through a link
    above the root, one whose target holds `..` (GNU tar makes those last: a plain file till
    then), or one to a file. Left out, said with each link as stored. A plain link to a
    folder of the archive is written through, as tar does."""
    host = tmp_path / "host"
    host.mkdir()
    members = [
        ("cat/a.png", png(0)),
        ("dog/c.png", png(1)),
        ("out", f"->{host}"),
        ("out/x.png", png(2)),
        ("cat/up", "->../.."),
        ("cat/up/y.png", png(3)),
        ("dog/in", "->../cat"),
        ("dog/in/w.png", png(4)),
        ("cat/f", "->a.png"),
        ("cat/f/v.png", png(5)),
        (".s/q.png", png(6)),
        ("bird", "->.s"),
        ("bird/u.png", png(7)),
    ]
    archive = _tar(tmp_path / "pets.tar", members)
    images, warned = _read(archive, caplog)
    assert images == {
        "bird/q.png": png(6),
        "bird/u.png": png(7),
        "cat/a.png": png(0),
        "dog/c.png": png(1),
    }
    assert warned == [
        f"{archive}: 4 image members lie in a folder that is a link, not read, as tar -x writes "
        "no member through a link out of the archive, to a file, or whose target starts with "
        "'/' or holds '..': cat/f/v.png (in cat/f -> a.png), cat/up/y.png (in cat/up -> ../..), "
        "dog/in/w.png (in dog/in -> ../cat) and 1 more",
        f"1 linked folder(s) in {archive} not entered: each leads back into the data, above "
        "it, or to a folder read already: dog/in",
        f"{archive}: 1 link where a class folder could be leads out of the archive, not "
        f"followed, as torchkit follows no link out of an archive: out -> {host} (tar -h "
        "stores the files a link leads to)",
    ]
    unpacked = _unpacked_by_gnu_tar(archive)
    if unpacked is not None:
        assert list(host.iterdir()) == []
        assert not (tmp_path / "y.png").exists()
        assert sorted(p.name for p in (unpacked / "cat").iterdir()) == ["a.png", "f", "up"]
        assert sorted(p.name for p in (unpacked / ".s").iterdir()) == ["q.png", "u.png"]


def test_members_written_through_a_plain_link_to_a_folder_are_read_where_tar_puts_them(
    tmp_path,
):
    """`cat/plain -> sub`, then `cat/plain/z.png`: tar -xf writes it through the link, to
    cat/sub/z.png (a later `cat/plain/k.png` replacing `cat/sub/k.png`), where torchkit read it
    as cat/plain/z.png, a path the unpacked folder does not read (a link not entered)."""
    members = [
        ("cat/a.png", png(0)),
        ("dog/c.png", png(1)),
        ("cat/plain", "->sub"),
        ("cat/sub/k.png", png(2)),
        ("cat/plain/z.png", png(3)),
        ("cat/plain/k.png", png(4)),
    ]
    archive = _tar(tmp_path / "pets.tar", members)
    source = open_data(str(archive))
    images = images_read(source)
    assert images == {
        "cat/a.png": png(0),
        "cat/sub/k.png": png(4),
        "cat/sub/z.png": png(3),
        "dog/c.png": png(1),
    }
    unpacked = _unpacked_by_gnu_tar(archive)
    if unpacked is not None:
        folder = open_data(str(unpacked))
        assert folder.whole.ids == source.whole.ids
        assert _files(unpacked, images) == images


@pytest.mark.parametrize("kind", ["file", "link"])
def test_the_listing_keeps_one_member_a_name(tmp_path, kind):
    """A name stored as a file and again as a `kind`: the listing holds it once, as its last
    member (a name in both the members and the links read the file first)."""
    from torchkit.core.data.sources.shards import list_tar

    again = png(1) if kind == "file" else "->b.png"
    archive = _tar(tmp_path / "x.tar", [("a.png", png(0)), ("b.png", png(2)), ("a.png", again)])
    listing = list_tar(str(archive))
    assert ("a.png" in listing.members, "a.png" in listing.links) == (
        kind == "file",
        kind == "link",
    )
    assert listing.locator("a.png") == listing.members["a.png" if kind == "file" else "b.png"]


def test_a_folder_stored_after_a_link_of_its_name_is_a_folder(tmp_path):
    """`bird -> dog`, then the folder `bird/` (an archive appended to after the link was made a
    folder again): tar -xf replaces the link by the folder and writes `bird/q.png` into it,
    where torchkit kept the link (bird read as dog's images, one file in two classes: an
    error). So for an image-named link (`cat/s.png -> a.png`, then `cat/s.png/`): a folder,
    not an image."""
    members = [
        ("dog/c.png", png(2)),
        ("cat/a.png", png(1)),
        ("bird", "->dog"),
        ("bird/", None),
        ("bird/q.png", png(7)),
        ("cat/s.png", "->a.png"),
        ("./cat/s.png/", None),
        ("cat/s.png/r.png", png(3)),
    ]
    archive = _tar(tmp_path / "pets.tar", members)
    source = open_data(str(archive))
    images = images_read(source)
    assert images == {
        "bird/q.png": png(7),
        "cat/a.png": png(1),
        "cat/s.png/r.png": png(3),
        "dog/c.png": png(2),
    }
    assert source.whole.classes == ["bird", "cat", "dog"]
    unpacked = _unpacked_by_gnu_tar(archive)
    if unpacked is not None:
        assert open_data(str(unpacked)).whole.ids == source.whole.ids
        assert _files(unpacked, images) == images


def test_an_image_thousands_of_folders_deep_beside_a_link_is_listed_in_linear_time(tmp_path):
    """The folders on the way to each image were looked up as links one path at a time, each
    path joined anew: the square of the depth (about 2 s of CPU for one image 24,000 folders
    deep, a 48 KB name, four times that for twice the depth). A walk down the links' parts
    now: well under a second."""
    import time

    deep = "cat/" + "d/" * 24_000 + "x.png"
    archive = _tar(
        tmp_path / "pets.tar",
        [
            ("cat/a.png", png(0)),
            ("dog/c.png", png(1)),
            (deep, png(2)),
            ("dog/l.png", "->c.png"),
        ],
    )
    started = time.process_time()  # CPU time, which other processes' load does not stretch
    source = open_data(str(archive))
    assert time.process_time() - started < 0.5
    assert source.whole.ids == ["cat/a.png", deep, "dog/c.png", "dog/l.png"]


def test_a_member_thousands_of_folders_deep_beside_a_link_to_a_folder_costs_its_length(tmp_path):
    """Where a link leads to no member (here to a folder), every folder on the way to each
    member was kept in a set to tell the archive's folders: the square of a path's depth, in
    time and memory (1 GB and 1 s of CPU for one member 32,000 folders deep, a 64 KB name;
    4 GB for twice that). The folders' paths sorted, and searched, now."""
    import time

    deep = "cat/" + "d/" * 32_000 + "x.png"
    members = [("cat/a.png", png(0)), ("dog/c.png", png(1)), (deep, png(2)), ("dog/d", "->../cat")]
    archive = _tar(tmp_path / "pets.tar", members)
    started = time.process_time()  # CPU time, which other processes' load does not stretch
    source = open_data(str(archive))
    assert time.process_time() - started < 0.5
    assert source.whole.ids == ["cat/a.png", deep, "dog/c.png"]


def test_a_link_loop_where_no_image_is_read_refuses_nothing(tmp_path):
    """A loop of links in a hidden folder beside the classes (`.trash/x.png -> y.png -> x.png`),
    in `__MACOSX/`, or in a hidden folder of a split root: GNU tar -xf unpacks them as links to
    nothing (exit 0), which the unpacked folder never reads; torchkit refused the whole archive
    for them. Nothing read goes through them now; a loop among the images read (a hidden
    folder inside a class is read) is an unreadable image, as the unpacked folder's link is
    (`test_a_link_loop_among_the_images_is_an_unreadable_image_as_unpacked`)."""
    members = [
        ("cat/a.png", png(0)),
        ("dog/c.png", png(1)),
        (".trash/x.png", "->y.png"),
        (".trash/y.png", "->x.png"),
        ("__MACOSX/cat/z.png", "->z.png"),
    ]
    archive = _tar(tmp_path / "pets.tar", members)
    assert run_json("dataset-stats", archive, "-j", "0")["images"] == 2
    assert open_data(str(archive)).whole.ids == ["cat/a.png", "dog/c.png"]
    split = [
        ("train/cat/a.png", png(0)),
        ("train/dog/c.png", png(1)),
        ("train/.old/x.png", "->x.png"),
        ("val/cat/b.png", png(2)),
    ]
    source = open_data(str(_tar(tmp_path / "split.tar", split)))
    assert {name: part.ids for name, part in source.splits.items()} == {
        "train": ["train/cat/a.png", "train/dog/c.png"],
        "val": ["val/cat/b.png"],
    }


def test_a_hard_link_to_a_folder_is_made_by_no_tar(tmp_path, caplog):
    """`bird` stored as a hard link to the folder `dog`: GNU tar -xf makes nothing there
    ('Cannot hard link to dog: Operation not permitted'), having removed a file stored before
    under that name; torchkit read it as a class of dog's images (one file in two classes: an
    error), or an image-named one as a linked folder. Left out now, with a warning naming it as
    `tar -tv` lists it; members stored under its name after it make a folder, as on disk. A
    hard link to a symbolic link to a folder is a second such link: a linked class folder."""
    members = [
        ("dog/c.png", png(2)),
        ("cat/a.png", png(1)),
        ("bird", "=>dog"),
        ("bird/q.png", png(3)),
        ("cat/s.png", png(4)),
        ("cat/s.png", "=>dog/"),
    ]
    archive = _tar(tmp_path / "pets.tar", members)
    images, warned = _read(archive, caplog)
    # GNU tar 1.34: bird/q.png, cat/a.png, dog/c.png, and no cat/s.png
    assert images == {"bird/q.png": png(3), "cat/a.png": png(1), "dog/c.png": png(2)}
    assert warned == [
        f"{archive}: 2 hard links to a folder are not read, as tar -x makes no hard link to a "
        "folder: bird link to dog, cat/s.png link to dog/"
    ]
    unpacked = _unpacked_by_gnu_tar(archive)
    if unpacked is not None:
        assert open_data(str(unpacked)).whole.ids == sorted(images)
    from torchkit.core.data.sources.shards import list_tar

    copied = [("dog/c.png", png(2)), (".h/z.png", png(5)), ("bird", "->.h"), ("fish", "=>bird")]
    listing = list_tar(str(_tar(tmp_path / "copied.tar", copied)))
    assert (listing.folder_links, listing.hard_to_folders) == ({"bird": ".h", "fish": ".h"}, {})


def test_a_link_target_through_a_file_names_no_file(tmp_path):
    """`cat/s.png -> a.png/../b.png`, where cat/a.png is a file: the system resolves no path
    through a file ('Not a directory'), nor through a name the archive does not hold, nor
    `a.png/` (a final `/` after a file, or after a link to one); torchkit took the target as
    text (`a.png/..` is cat, so cat/b.png was read; `a.png/` was a.png). Each is a link to
    nothing now (an unreadable image, as other links to nothing in a tar). Through a folder
    (`../dog/..`) the `..` steps back as before; a folder only a member of a `..` part lies
    in (`cat/n/../e.png`, which tar does not unpack) is none (`n/../b.png` read cat/b.png)."""
    members = [
        ("dog/c.png", png(2)),
        ("cat/a.png", png(1)),
        ("cat/b.png", png(3)),
        ("cat/f", "->a.png"),
        ("cat/g", "->gone"),
        ("cat/s.png", "->a.png/../b.png"),
        ("cat/t.png", "->nothing/../b.png"),
        ("cat/u.png", "->f/../b.png"),
        ("cat/v.png", "->g/../b.png"),
        ("cat/w.png", "->a.png/"),
        ("cat/x.png", "->a.png/."),
        ("cat/x2.png", "->f/"),
        ("cat/y.png", "->../dog/../cat/b.png"),
        ("cat/z.png", "->y.png/../../dog/c.png"),
        ("cat/n/../e.png", png(4)),  # not unpacked: no folder cat/n
        ("cat/t2.png", "->n/../b.png"),
    ]
    archive = _tar(tmp_path / "pets.tar", members)
    read = bytes_or_none(open_data(str(archive)))  # None: a link to nothing
    # GNU tar 1.34 unpacks s to z.png as links to nothing but y.png (cat/b.png)
    nothing = dict.fromkeys(f"cat/{n}.png" for n in [*"stuvwxz", "x2", "t2"])
    assert read == {
        "cat/a.png": png(1),
        "cat/b.png": png(3),
        "cat/y.png": png(3),
        "dog/c.png": png(2),
        **nothing,
    }
    report = run_json("dataset-stats", archive, "-j", "0")
    assert (report["images"], report["unreadable_count"]) == (4, 9)
    unpacked = _unpacked_by_gnu_tar(archive)
    if unpacked is not None:
        assert [name for name in read if (unpacked / name).is_file()] == [
            name for name, data in read.items() if data is not None
        ]


def test_a_file_and_a_folder_of_one_name_read_as_tar_leaves_them(tmp_path, caplog):
    """Where a file (or link) and a folder of one name meet, the first written stays. A file,
    link or hard link stored when the folder of its name holds files is not written ('Cannot
    open: File exists', 'Cannot create symlink: File exists'), where torchkit read the link
    (`bird -> dog`: one file in two classes, an error) or the file beside the folder's images;
    members stored under a file after it are not written ('Not a directory'), where torchkit
    read them (`notes`, then `notes/q.png`: a class `notes`). Where the folder was empty, the
    file stored after it takes its place, as before. Images left out are named in a warning."""
    members = [
        ("dog/c.png", png(2)),
        ("cat/a.png", png(1)),
        ("bird/", None),
        ("bird/q.png", png(7)),
        ("bird", "->dog"),  # after the folder it names, which holds q.png: not written
        ("cat/s.png/r.png", png(3)),
        ("cat/s.png", png(4)),  # not written: a folder of its name holds r.png
        ("notes", b"a file"),
        ("notes/q.png", png(5)),  # under a file: not written
        ("cat/t", b"x"),
        ("cat/t/u/v.png", png(6)),  # deeper under a file: not written
        ("cat/e.png/", None),
        ("cat/e.png", png(8)),  # after an empty folder: written in its place
    ]
    archive = _tar(tmp_path / "pets.tar", members)
    images, warned = _read(archive, caplog)
    # GNU tar 1.34 (exit 2, each refusal said) unpacks these images
    assert images == {
        "bird/q.png": png(7),
        "cat/a.png": png(1),
        "cat/e.png": png(8),
        "cat/s.png/r.png": png(3),
        "dog/c.png": png(2),
    }
    assert warned == [
        f"{archive}: 3 {_UNWRITTEN}cat/s.png (a folder of its name holds "
        "files), cat/t/u/v.png (in cat/t, a file), notes/q.png (in notes, a file)"
    ]
    _assert_gnu_tar_unpacks_them(archive, images)
    # A file replaced by a folder is gone: stored again after the folder holds y.png, it is
    # not written (GNU tar: cat/x/y.png).
    again = [("dog/c.png", png(2)), ("cat/x", b"1"), ("cat/x/", None), ("cat/x/y.png", png(3))]
    archive = _tar(tmp_path / "again.tar", [*again, ("cat/x", b"2")])
    assert open_data(str(archive)).whole.ids == ["cat/x/y.png", "dog/c.png"]


def test_a_file_and_a_folder_of_one_name_meet_under_any_spelling(tmp_path, caplog):
    """`notes`, then `/notes/q.png` or `notes//r.png`: tar -xf unpacks them to notes/q.png and
    notes/r.png, under the file notes ('Not a directory'), and writes neither; torchkit met
    the names as stored, found no file of the folder's name and read a class `notes`. So for
    a file stored after a folder spelled otherwise (`/cat/s.png/r.png`, then `cat/s.png`)."""
    members = [
        ("cat/a.png", png(1)),
        ("dog/c.png", png(2)),
        ("notes", b"a file"),
        ("/notes/q.png", png(3)),
        ("notes//r.png", png(4)),
        ("/cat/s.png/r.png", png(5)),
        ("cat/./s.png", png(6)),  # not written: a folder of its name holds r.png
    ]
    archive = _tar(tmp_path / "pets.tar", members)
    images, warned = _read(archive, caplog)
    assert images == {"cat/a.png": png(1), "cat/s.png/r.png": png(5), "dog/c.png": png(2)}
    assert warned == [
        f"{archive}: 3 {_UNWRITTEN}/notes/q.png (in notes, a file), "
        "cat/./s.png (a folder of its name holds files), notes//r.png (in notes, a file)"
    ]
    _assert_gnu_tar_unpacks_them(archive, images)


def test_folders_in_one_another_each_of_a_file_s_name_cost_what_they_hold_once(tmp_path):
    """`cat/a/.../a/N.png` 200 folders deep, then files `cat/a`, `cat/a/a`, ... each stored
    after the folder of its name (each not written): each such folder's members were read
    again for each folder it lies in (0.9 s of CPU for this pass here; a 77 MB tar of 50k
    such members listed in 4.1 s, 0.9 s now). Once each now: 0.03 s."""
    import time

    from torchkit.core.data.sources.shards import _leave_out_what_tar_writes_not, _PlainMembers

    depth, count = 200, 20_000
    found = _PlainMembers(None, 0, False)
    deep = "cat/" + "a/" * depth
    for index in range(count):
        found.members[f"{deep}{index}.png"] = (index, 0)
    for index in range(1, depth + 1):
        found.members["cat/" + "/".join(["a"] * index)] = (count + index, 0)
    started = time.process_time()  # CPU time, which other processes' load does not stretch
    _leave_out_what_tar_writes_not(found)
    assert time.process_time() - started < 0.3
    assert len(found.unwritten) == depth
    assert len(found.members) == count


def test_members_stored_under_a_file_a_folder_replaced_later_are_not_read(tmp_path, caplog):
    """`cat/f`, `cat/f/x.png`, then the folder `cat/f/`: tar -xf writes nothing under the file
    ('Not a directory'), then replaces it by the folder, empty; torchkit met only the folder
    and read cat/f/x.png (and a hard link so stored). What is stored after the folder is
    written into it; where the folder was there before the file (`dog/g/a.png`, then `dog/g`:
    'File exists'), what follows the file is written into the folder too."""
    members = [
        ("cat/a.png", png(1)),
        ("cat/f", png(2)),
        ("cat/f/x.png", png(3)),  # under a file: not written
        ("cat/f/s.png", "=>cat/f"),  # nor a hard link to that file
        ("/cat/f/h.png", "=>cat/a.png"),  # nor a hard link
        ("cat/./f/", None),  # the file replaced by a folder
        ("cat/f/y.png", png(4)),
        ("dog/g/a.png", png(5)),
        ("dog/g", png(6)),  # not written: the folder holds a.png
        ("dog/g/b.png", png(7)),  # into the folder
        ("dog/g/", None),
    ]
    archive = _tar(tmp_path / "pets.tar", members)
    images, warned = _read(archive, caplog)
    assert images == {
        "cat/a.png": png(1),
        "cat/f/y.png": png(4),
        "dog/g/a.png": png(5),
        "dog/g/b.png": png(7),
    }
    assert warned == [
        f"{archive}: 3 {_UNWRITTEN}/cat/f/h.png (in cat/f, a file), "
        "cat/f/s.png (in cat/f, a file), cat/f/x.png (in cat/f, a file)"
    ]
    _assert_gnu_tar_unpacks_them(archive, images)


def test_a_file_stored_after_a_folder_whose_file_a_folder_replaced_is_not_written(tmp_path):
    """`b.png/h/a.png`, then the file `b.png` (not written: the folder b.png holds a file,
    'File exists'), then the folder `b.png/h/a.png/` in that file's place: torchkit dated the
    folder b.png/h/a.png from its own member, after b.png, took b.png's folder for empty when
    b.png was written and read b.png (and a hard link to it: cat/x.png). The path holds
    something from its first member on."""
    members = [
        ("cat/a.png", png(1)),
        ("b.png/h/a.png", png(2)),
        ("b.png", png(3)),  # not written: b.png/ holds h/a.png
        ("b.png/h/a.png/", None),  # a folder in the file's place
        ("cat/x.png", "=>b.png"),  # a hard link to a folder: nothing
        ("dog/s.png", "->../cat/a.png"),
        ("dog/s.png/", None),  # a folder in the link's place
        ("dog", png(4)),  # not written: dog/ holds s.png/
        ("dog/c.png", png(5)),
    ]
    archive = _tar(tmp_path / "pets.tar", members)
    source = open_data(str(archive))
    images = images_read(source)
    assert images == {"cat/a.png": png(1), "dog/c.png": png(5)}
    _assert_gnu_tar_unpacks_them(archive, images)


def test_a_hard_link_to_a_symbolic_link_reads_its_target_from_its_own_folder(tmp_path):
    """`cp -al cat dog` makes dog/s.png a second name of the symbolic link cat/s.png -> a.png,
    and `tar -cf` stores it as a hard link to cat/s.png; tar -xf makes it so, a link whose
    `a.png` the system reads from dog/: dog/a.png. torchkit read it as cat/a.png and refused
    the archive ('one file in two classes'). A hard link to that hard link is one too."""
    members = [
        ("cat/a.png", png(1)),
        ("cat/s.png", "->a.png"),
        ("dog/a.png", png(2)),
        ("dog/s.png", "=>cat/s.png"),
        ("dog/t.png", "=>/dog/s.png"),
        ("bird/c.png", png(3)),
        ("bird/s.png", "=>cat/s.png"),  # bird/a.png: none, a link to nothing
    ]
    archive = _tar(tmp_path / "pets.tar", members)
    images = bytes_or_none(open_data(str(archive)))
    assert images == {
        "bird/c.png": png(3),
        "bird/s.png": None,
        "cat/a.png": png(1),
        "cat/s.png": png(1),
        "dog/a.png": png(2),
        "dog/s.png": png(2),
        "dog/t.png": png(2),
    }
    unpacked = _unpacked_by_gnu_tar(archive)
    if unpacked is not None:
        assert not (unpacked / "bird/s.png").exists()  # a link to nothing
        read = [name for name in images if name != "bird/s.png"]
        assert _files(unpacked, read) == {name: images[name] for name in read}


def _stats(data: Path) -> tuple[int, list[str]]:
    """dataset-stats of `data` (it must succeed): (images read, the unreadable files' paths)."""
    report = run_json("dataset-stats", data, "-j", "0")
    return report["images"], sorted(row["path"] for row in report["unreadable"])


def test_a_link_chain_through_a_target_ending_in_a_slash_reads_no_file(tmp_path):
    """`x.png -> y.png`, `y.png -> f/`, `f -> a.png`: the system resolves no path with a final
    `/` after a file ('Not a directory'), so neither link reads anything once unpacked; torchkit
    read a.png's bytes at x.png (the `/` was looked at for y.png's own target only). Both are
    links to nothing now, as the unpacked folder's are (listed unreadable by dataset-stats,
    where the folder passed them over unsaid); a chain without the `/` still reads a.png."""
    members = [
        ("cat/a.png", png(1)),
        ("dog/c.png", png(2)),
        ("cat/x.png", "->y.png"),
        ("cat/y.png", "->f/"),
        ("cat/f", "->a.png"),
        ("cat/v.png", "->w.png"),
        ("cat/w.png", "->f"),
    ]
    archive = _tar(tmp_path / "pets.tar", members)
    read, unreadable = readable_and_not(open_data(str(archive)))
    # GNU tar 1.34: cat/x.png and cat/y.png read nothing, cat/v.png and cat/w.png read a.png
    assert read == {
        "cat/a.png": png(1),
        "cat/v.png": png(1),
        "cat/w.png": png(1),
        "dog/c.png": png(2),
    }
    assert unreadable == ["cat/x.png", "cat/y.png"]
    assert _stats(archive) == (4, ["cat/x.png", "cat/y.png"])
    unpacked = _unpacked_by_gnu_tar(archive)
    if unpacked is not None:
        assert _files(unpacked, read) == read
        assert _stats(unpacked) == (4, ["cat/x.png", "cat/y.png"])


def test_a_hard_link_reads_its_target_as_tar_met_it(tmp_path, caplog):
    """tar -x makes a hard link to what its target's path holds when it meets the link: a hard
    link stored before its target, or to a name never stored, or through a link to a file, is
    not made ('Cannot hard link to ...: No such file or directory'), what was at its name
    stays, and members stored under its name make a folder there, as does the folder it lies
    in (a hard link to that folder is one to a folder). torchkit resolved hard links by the
    archive's final state: it read a link stored before its target at the target's bytes, an
    earlier file of the link's name not at all, and members under a hard link to nothing not
    at all (as in a folder that is a link), and a hard link to its own name as a link to
    nothing, where tar leaves the file. A hard link after its target reads it, as before."""
    members = [
        ("cat/a.png", png(0)),
        ("dog/c.png", png(1)),
        ("cat/h.png", "=>cat/b.png"),  # before its target: not made
        ("cat/b.png", png(2)),
        ("cat/k.png", png(3)),
        ("cat/k.png", "=>cat/nothing.png"),  # to nothing: k.png stays the file
        ("bird", "=>nothing"),  # not made: bird/q.png makes the folder bird
        ("bird/q.png", png(4)),
        ("cat/m.png", "=>cat/b.png"),  # after its target: b.png's bytes
        ("cat/a.png", "=>cat/a.png"),  # to itself: a.png stays (was a link to nothing)
        ("/cat/p.png", png(5)),
        ("/cat/p.png", "=>/cat/p.png"),  # so under any spelling
        ("cat/n.png", png(6)),
        ("cat/l", "->a.png"),
        ("cat/n.png", "=>cat/l/x.png"),  # through a link to a file: not made, n.png stays
        ("fish/e.png", "=>nothing"),  # not made: the folder fish is, empty
        ("cat/z.png", "=>fish"),  # to that folder: not made either
    ]
    archive = _tar(tmp_path / "pets.tar", members)
    source, warned = opened_with_warnings(archive, caplog)
    assert source.whole.classes == ["bird", "cat", "dog", "fish"]
    read, unreadable = readable_and_not(source)
    # GNU tar 1.34 unpacks these, and no cat/h.png
    expected = {
        "bird/q.png": png(4),
        "cat/a.png": png(0),
        "cat/b.png": png(2),
        "cat/k.png": png(3),
        "cat/m.png": png(2),
        "cat/n.png": png(6),
        "cat/p.png": png(5),
        "dog/c.png": png(1),
    }
    assert (read, unreadable) == (expected, [])
    assert warned == [
        f"{archive}: 1 hard link to a folder is not read, as tar -x makes no hard link to a "
        "folder: cat/z.png link to fish",
        f"{archive}: 2 hard links named as an image are not read, as tar -x makes no hard link "
        "to a file stored after the link, or not at all: cat/h.png link to cat/b.png, "
        "fish/e.png link to nothing",
    ]
    assert _stats(archive) == (8, [])
    unpacked = _unpacked_by_gnu_tar(archive)
    if unpacked is not None:
        assert open_data(str(unpacked)).whole.classes == source.whole.classes
        assert open_data(str(unpacked)).whole.ids == sorted(read)
        assert _files(unpacked, read) == read


def test_a_link_loop_among_the_images_is_an_unreadable_image_as_unpacked(tmp_path):
    """A link to itself (`cat/s.png -> s.png`) or a loop of links among the images read: GNU
    tar -xf makes the links (exit 0), and the unpacked folder reads, each being unreadable
    ('Too many levels of symbolic links'); torchkit refused the whole archive for one such
    link. Each is an unreadable image now, as a link to nothing is, in the archive and in the
    folder, where the folder's listing passed such links over unsaid (as one through a file):
    dataset-stats counts and lists them alike. Inside the folder a `.tar` of one holds too."""
    folder = tmp_path / "flowers"
    for name, data in (("rose/r.png", png(1)), ("tulip/t.png", png(2))):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    links = [
        ("rose/s.png", "s.png"),
        ("rose/u.png", "u.png/../r.png"),  # read r.png: the `..` after the link was not followed
        ("tulip/a.png", "b.png"),
        ("tulip/b.png", "a.png"),
    ]
    for name, target in links:
        (folder / name).symlink_to(target)
    members = [("flowers/rose/r.png", png(1)), ("flowers/tulip/t.png", png(2))]
    members += [(f"flowers/{name}", f"->{target}") for name, target in links]
    archive = _tar(tmp_path / "flowers.tar", members)
    expected = (2, ["rose/s.png", "rose/u.png", "tulip/a.png", "tulip/b.png"])
    assert _stats(folder) == expected
    assert _stats(archive) == expected
    errors = {}
    for data in (folder, archive):
        result = run_torchkit_in_process("dataset-stats", data, "-j", "0", "--format", "json")
        errors[data] = {
            row["path"]: row["error"] for row in json.loads(result.stdout)["unreadable"]
        }
    # the unpacked link's words, not the archive's path and words of its own (rose/u.png's
    # `..` after a link round a loop is a link to nothing in the archive's reading)
    looped = ["rose/s.png", "tulip/a.png", "tulip/b.png"]
    assert [errors[archive][name] for name in looped] == [errors[folder][n] for n in looped]
    assert errors[archive]["tulip/a.png"] == "too many levels of symbolic links"
    read, unreadable = readable_and_not(open_data(str(archive)))
    assert (read, unreadable) == (
        {"rose/r.png": png(1), "tulip/t.png": png(2)},
        ["rose/s.png", "rose/u.png", "tulip/a.png", "tulip/b.png"],
    )
    unpacked = _unpacked_by_gnu_tar(archive)
    if unpacked is not None:
        assert _stats(unpacked / "flowers") == expected
