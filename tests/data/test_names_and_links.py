"""Class names no report can show, and tar links that lead nowhere or to a folder.

A class of spaces (or invisible characters) alone prints as no name, and two classes that are
one name in two Unicode spellings print alike: each reader refuses them where it meets them (a
file of class names by its line or index, a shard by its sample), whatever reader gives a data
source its classes the source is held to the same rule, and so are the class names a
checkpoint or exported file stores. Shard labels without a class index that differ only by the
spaces around them are refused as those of one index are. A class index past the classes file
beside a name it lists, and a link loop inside a WebDataset shard, are one error each."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
import unicodedata
from pathlib import Path

import pytest
from output_checks import error_line
from parquet_files import png, write_parquet
from processes import run_torchkit_in_process
from tar_members import bytes_or_errors, has_gnu_tar, opened_with_warnings, tar_of_members

from torchkit.core.data.sources import open_data
from torchkit.core.data.sources.class_files import class_names_in_json, class_names_in_text
from torchkit.core.data.sources.shards import LEADS_OUT
from torchkit.core.io.errors import CheckpointError, InputError
from torchkit.core.models.stored_classes import stored_class_names

COMPOSED, DECOMPOSED = "caf\u00e9", unicodedata.normalize("NFD", "caf\u00e9")
ZERO_WIDTH = "\u200b"


def _sample(key: str, i: int, *, cls: int | None = None, label: str | None = None) -> list:
    members = [(f"{key}.png", png(i))]
    if cls is not None:
        members.append((f"{key}.cls", str(cls).encode()))
    if label is not None:
        members.append((f"{key}.json", json.dumps({"label": label}).encode()))
    return members


def _refused(spec: Path | str) -> str:
    with pytest.raises(InputError) as raised:
        open_data(str(spec))
    return str(raised.value)


# --- files of class names ----------------------------------------------------------------


def test_a_classes_txt_line_of_invisible_characters_is_refused_naming_its_line():
    """A line of spaces is a blank line (refused between names, as before); a zero-width
    space survives the strip and was a class that printed as no name."""
    text = f"\ncat\n{ZERO_WIDTH}\ndog\n"
    with pytest.raises(InputError) as raised:
        class_names_in_text(text, "classes.txt")
    assert str(raised.value) == (
        "line 3 of classes.txt names class '\\u200b', a name no report can show "
        "(give every class its name, in label order)"
    )


def test_classes_txt_lines_in_two_unicode_spellings_are_refused_naming_both_lines():
    with pytest.raises(InputError) as raised:
        class_names_in_text(f"{COMPOSED}\ntea\n{DECOMPOSED}\n", "F")
    assert str(raised.value) == (
        f"line 3 of F names class {ascii(DECOMPOSED)}, and line 1 of F names class "
        f"{ascii(COMPOSED)}: one name in two Unicode spellings (composed and decomposed "
        "accents) (give each class one name that tells it apart: torchkit reads them as one "
        "class)"
    )


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["cat", " "], "F names class 1 ' ', an empty name"),
        ([COMPOSED, "tea", DECOMPOSED], "F names class 2 'cafe\\u0301', and F names class 0 "),
        ({"cat": 0, ZERO_WIDTH: 1}, "F names class 1 '\\u200b', a name no report can show"),
    ],
)
def test_a_classes_json_name_no_report_can_show_is_refused_naming_its_index(names, message):
    with pytest.raises(InputError, match="^" + message.replace("\\", "\\\\")):
        class_names_in_json(json.dumps(names), "F")


def test_a_classes_list_is_held_to_the_rule_of_a_classes_file():
    """`--classes a,<zero-width space>` named an output that printed as no name, and
    `--classes café,café` (two spellings) two outputs that print alike: usage errors."""
    from torchkit.core.evaluate.source import parse_class_names
    from torchkit.core.io.errors import UsageError

    with pytest.raises(UsageError) as raised:
        parse_class_names(f"a,{ZERO_WIDTH}")
    assert str(raised.value) == (
        "--classes names class 1 '\\u200b', a name no report can show (give every class its "
        "name, in label order)"
    )
    with pytest.raises(UsageError, match="one name in two Unicode spellings"):
        parse_class_names(f"{COMPOSED},{DECOMPOSED}")
    assert parse_class_names(f"{COMPOSED},tea") == [COMPOSED, "tea"]


def test_classes_beside_shards_and_exact_names_still_read(tmp_path):
    folder = tmp_path / "shards"
    folder.mkdir()
    tar_of_members(folder / "s-000000.tar", _sample("a", 0, cls=0) + _sample("b", 1, cls=1))
    (folder / "classes.json").write_text(json.dumps([COMPOSED, " dog"]), encoding="utf-8")
    assert open_data(str(folder)).classes == [COMPOSED, " dog"]
    (folder / "classes.json").write_text(json.dumps([DECOMPOSED, COMPOSED]), encoding="utf-8")
    assert _refused(folder) == (
        f"{folder / 'classes.json'} names class 1 'caf\\xe9', and {folder / 'classes.json'} "
        "names class 0 'cafe\\u0301': one name in two Unicode spellings (composed and decomposed "
        "accents) (give each class one name that tells it apart: torchkit reads them as one "
        "class)"
    )


# --- shards --------------------------------------------------------------------------------


def test_shard_labels_without_an_index_that_differ_by_spaces_are_one_class_error(tmp_path):
    """`cat` and `cat ` in KEY.json alone (no KEY.cls) were two classes, as the same two names
    of one KEY.cls index are not: the same error, naming both samples."""
    shard = tar_of_members(
        tmp_path / "s-000000.tar",
        _sample("a", 0, label="cat") + _sample("b", 1, label="dog") + _sample("c", 2, label="cat "),
    )
    assert _refused(shard) == (
        "sample c in s-000000.tar is labelled 'cat ', and sample a in s-000000.tar 'cat': one "
        "class would be two whose names differ only by the spaces around them (give the "
        "samples of one class one name in KEY.json)"
    )
    split = tmp_path / "split"  # val's `cat ` beside train's `cat`
    split.mkdir()
    tar_of_members(
        split / "train-000000.tar", _sample("a", 0, label="cat") + _sample("b", 1, label="dog")
    )
    tar_of_members(
        split / "val-000000.tar", _sample("c", 2, label="cat ") + _sample("d", 3, label="dog")
    )
    assert _refused(split).startswith(
        "sample c in val-000000.tar is labelled 'cat ', and sample a in train-000000.tar 'cat': "
    )


def test_a_shard_label_of_spaces_alone_is_refused_naming_the_sample(tmp_path):
    shard = tar_of_members(
        tmp_path / "s-000000.tar", _sample("a", 0, label="cat") + _sample("b", 1, label=" ")
    )
    assert _refused(shard).startswith(
        "b in s-000000.tar: b.json has \"label\": ' ', not a class index or name ("
    )


def test_shards_naming_some_classes_and_indexing_others_ask_for_classes_txt(tmp_path):
    """Sample a gives class index 0 alone, sample b names its class: which name index 0 stands
    for is unknown, and the hint says how the names are given."""
    shard = tar_of_members(
        tmp_path / "s-000000.tar", _sample("a", 0, cls=0) + _sample("b", 1, label="dog")
    )
    assert _refused(shard) == (
        "sample a in s-000000.tar has a class index and no class name, while other samples "
        "name their class (put classes.txt beside the shards, one class name per line in label "
        "order)"
    )


def test_a_class_index_past_the_classes_file_beside_a_listed_name_is_one_error(tmp_path):
    """KEY.cls 5 of classes.txt's 2 names, beside "label": "dog": read as dog, silently,
    while webdataset's reader takes index 5."""
    folder = tmp_path / "shards"
    folder.mkdir()
    tar_of_members(
        folder / "s-000000.tar",
        _sample("a", 0, cls=0, label="cat") + _sample("b", 1, cls=5, label="dog"),
    )
    (folder / "classes.txt").write_text("cat\ndog\n", encoding="utf-8")
    assert _refused(folder) == (
        "sample b in s-000000.tar has class index 5, past the 2 classes classes.txt names, and "
        "the label 'dog', class 1 of classes.txt (fix the sample's KEY.cls or its KEY.json "
        '"label", whichever is wrong: webdataset reads the index)'
    )


def test_a_link_loop_inside_a_shard_is_one_error_line_naming_the_member(tmp_path):
    """s1.png -> s1b.png -> s1.png: read as a sample s1b of no label (or, with labels, as an
    image that could not be read): one error line naming the link."""
    shard = tar_of_members(
        tmp_path / "s-000000.tar",
        [
            *_sample("s0", 0, cls=0),
            ("s1.png", "->s1b.png"),
            ("s1b.png", "->s1.png"),
            ("s1.cls", b"0"),
            ("s1b.cls", b"0"),
        ],
    )
    result = run_torchkit_in_process("dataset-stats", shard, "-j", "0")
    assert result.returncode == 1
    assert error_line(result.stderr, besides="nothing") == (
        "Error: s-000000.tar:s1.png -> s1b.png is a link that leads round in a loop of links, "
        "to no file (and 1 more) (remove the link, or point it at a member of the shard)"
    )


# --- every data source ----------------------------------------------------------------------


def test_a_class_folder_of_spaces_alone_is_one_error_line(tmp_path):
    root = tmp_path / "data"
    for name in ("cat", " "):
        (root / name).mkdir(parents=True)
        (root / name / "x.png").write_bytes(png(0))
    result = run_torchkit_in_process("dataset-stats", root, "-j", "0")
    assert result.returncode == 1
    assert error_line(result.stderr, besides="nothing") == (
        f"Error: {root} has class 0 named ' ', which no report can show (name every class by "
        "visible text: rename the class folder or label of spaces or invisible characters "
        "alone)"
    )


def test_predict_of_a_tar_with_a_class_folder_of_spaces_alone_is_one_error_line(tmp_path):
    """predict asks the container readers itself: a `.tar` of class folders `cat` and ` `
    gave the label column a class of no name, where the folder is refused."""
    from checkpoints import write_convnet_checkpoint

    archive = tar_of_members(tmp_path / "x.tar", [("cat/x.png", png(0)), (" /y.png", png(1))])
    model = tmp_path / "m.pt"
    write_convnet_checkpoint(model, in_channels=3, image_size=8, classes="ab")
    result = run_torchkit_in_process("predict", model, archive, "-j", "0")
    assert result.returncode == 1 and result.stdout == ""
    assert error_line(result.stderr, besides="nothing").startswith(
        f"Error: {archive} has class 0 named ' ', which no report can show ("
    )


def test_csv_and_parquet_class_names_no_report_can_show_are_refused(tmp_path):
    """A quoted CSV label ' ' keeps its spaces, as a class folder ' ' does; parquet's
    ClassLabel names are checked for null and "" alone. Names that differ only by the spaces
    around them stay two classes (CSV and JSON outputs keep them apart)."""
    root = tmp_path / "data"
    (root / "a").mkdir(parents=True)
    (root / "a" / "x.png").write_bytes(png(0))
    (root / "a" / "y.png").write_bytes(png(1))
    index = root / "index.csv"
    index.write_text('path,label\na/x.png,cat\na/y.png," "\n', encoding="utf-8")
    assert _refused(index).startswith(f"{index} has class 0 named ' ', which no report can show")
    index.write_text('path,label\na/x.png,cat\na/y.png,"cat "\n', encoding="utf-8")
    assert open_data(str(index)).classes == ["cat", "cat "]
    data = write_parquet(tmp_path / "d.parquet", [png(0), png(1)], [0, 1], names=["a", ZERO_WIDTH])
    assert _refused(data).startswith(f"{data} has class 1 named '\\u200b', which no report ")
    write_parquet(data, [png(0), png(1)], [0, 1], names=[COMPOSED, DECOMPOSED])
    assert _refused(data) == (
        f"class names of {data}: 'caf\\xe9' and 'cafe\\u0301' are one name in two Unicode "
        "spellings (composed and decomposed accents) (rename one to the other's spelling: "
        "torchkit reads them as one class)"
    )


# --- stored class names ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("classes", "message"),
    [
        (["a", " "], "has class 1 named ' ', which no output can show"),
        (["a", ZERO_WIDTH], "has class 1 named '\\u200b', which no output can show"),
        (
            [COMPOSED, DECOMPOSED],
            "has classes 0 'caf\\xe9' and 1 'cafe\\u0301', one name in two Unicode spellings",
        ),
    ],
)
def test_stored_class_names_no_output_can_show_are_refused_naming_the_index(classes, message):
    with pytest.raises(CheckpointError) as raised:
        stored_class_names(classes, "checkpoint m.pt", CheckpointError)
    assert str(raised.value).startswith(f"checkpoint m.pt {message}")


def test_stored_names_given_twice_exactly_still_load():
    crane = ["crane", "kite", "crane"]  # torchvision's ImageNet names: two "crane"s
    assert stored_class_names(crane, "checkpoint m.pt", CheckpointError) == crane
    assert stored_class_names([COMPOSED, " tea"], "m.onnx", InputError) == [COMPOSED, " tea"]
    # Class folders ` cat` and `cat ` train such names; CSV and JSON outputs keep them apart.
    spaced = ["cat", " cat", "cat "]
    assert stored_class_names(spaced, "checkpoint m.pt", CheckpointError) == spaced


def test_predict_with_a_checkpoint_of_look_alike_classes_is_one_error_line(tmp_path):
    """Two outputs named `café` in two Unicode spellings printed alike in every prediction; a
    class of spaces alone (an older torchkit trained a class folder ' ' so) printed as none."""
    from checkpoints import read_checkpoint, write_convnet_checkpoint

    from torchkit.core.models.checkpoint import save_checkpoint

    images = tmp_path / "images"
    images.mkdir()
    (images / "x.png").write_bytes(png(0))
    model = tmp_path / "m.pt"
    write_convnet_checkpoint(model, in_channels=3, image_size=8, classes="ab")
    for classes, said in (
        ([COMPOSED, DECOMPOSED], "has classes 0 'caf\\xe9' and 1 'cafe\\u0301', one name in"),
        ([" ", "b"], "has class 0 named ' ', which no output can show"),
    ):
        save_checkpoint({**read_checkpoint(model), "classes": classes}, model)
        result = run_torchkit_in_process("predict", model, images, "-j", "0")
        assert result.returncode == 1 and result.stdout == ""
        assert error_line(result.stderr, besides="nothing").startswith(
            f"Error: checkpoint {model} {said}"
        )


# --- linked class folders in a tar of an image folder ----------------------------------------


def _image_folder_tar(path: Path, members: list[tuple[str, bytes | str]]) -> Path:
    """`_tar`, and the same members unpacked beside it (`path` without .tar, its links as
    symbolic links), for reading both ways."""
    import os

    folder = path.with_suffix("")
    for name, data in members:
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, str):
            os.symlink(data.removeprefix("->"), target)
        else:
            target.write_bytes(data)
    return tar_of_members(path, members)


def test_a_linked_class_folder_in_a_tar_is_read_as_the_unpacked_folder_reads_it(tmp_path):
    """A member `img` -> `.real/` (whose files are `.real/x.png`): torchkit read no class img,
    silently, where the unpacked folder reads img/x.png as class img."""
    members = [(".real/x.png", png(0)), ("other/y.png", png(1)), ("img", "->.real")]
    archive = _image_folder_tar(tmp_path / "flowers.tar", members)
    from_tar, on_disk = open_data(str(archive)), open_data(str(archive.with_suffix("")))
    assert from_tar.classes == on_disk.classes == ["img", "other"]
    assert from_tar.whole.ids == on_disk.whole.ids == ["img/x.png", "other/y.png"]
    assert [path.read_bytes() for path in from_tar.whole.paths] == [png(0), png(1)]
    # in a split folder, beside a class folder of the same name in another split
    split = [
        ("train/cat/x.png", png(0)),
        (".more/cat/w.png", png(3)),
        ("val/cat", "->../.more/cat"),
    ]
    source = open_data(str(_image_folder_tar(tmp_path / "split.tar", split)))
    assert source.splits["val"].ids == ["val/cat/w.png"]
    assert [path.read_bytes() for path in source.splits["val"].paths] == [png(3)]


def test_a_tar_class_folder_linked_to_another_class_is_one_error_naming_the_link(tmp_path):
    members = [("real/x.png", png(0)), ("img", "->real")]
    archive = _image_folder_tar(tmp_path / "flowers.tar", members)
    assert _refused(archive) == (
        f"{archive}:img/x.png and {archive}:real/x.png are one file in two classes, img and "
        f"real (an image has one label: remove the link {archive}:img -> real)"
    )
    unpacked = archive.with_suffix("")
    assert _refused(unpacked).startswith(
        f"{unpacked}/img/x.png and {unpacked}/real/x.png are one file in two classes, img and "
    )
    rooted = tar_of_members(tmp_path / "rooted.tar", [("cat/x.png", png(0)), ("all", "->.")])
    assert _refused(rooted) == (
        f"{rooted}:all -> . is a class folder linked to a folder that holds it, or that it "
        "holds (remove the link, or link to the class's own folder)"
    )


def test_a_folder_link_inside_a_tar_class_is_not_entered_with_the_warning_on_disk(tmp_path):
    """`cat/more` -> `../.s/` leads back into the data: on disk it is not entered, with a
    warning naming it; in the tar it was passed over without a word."""
    members = [("cat/x.png", png(0)), (".s/y.png", png(1)), ("cat/more", "->../.s")]
    archive = _image_folder_tar(tmp_path / "flowers.tar", members)
    warning = "1 linked folder(s) in {} not entered: each leads back into the data, above it, or "
    for data in (archive, archive.with_suffix("")):
        result = run_torchkit_in_process("dataset-stats", data, "-j", "0", "--format", "json")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["images"] == 1
        assert f"Warning: {warning.format(data)}to a folder read already: cat/more" in (
            result.stderr.splitlines()
        )


def _unpacked_by_tar(archive: Path, *, check: bool = True) -> Path | None:
    """The folder GNU tar (or the tar there is) unpacks `archive` to; None without tar. With
    `check`, tar must exit 0."""
    if shutil.which("tar") is None:
        return None
    unpacked = archive.parent / "unpacked"
    unpacked.mkdir()
    subprocess.run(["tar", "-xf", archive, "-C", unpacked], check=check, capture_output=True)
    return unpacked


def test_links_in_a_tar_end_where_tar_unpacks_their_targets(tmp_path):
    """Links were resolved by the members' stored names: a hard link to `/cat/b.png` (as `tar
    -cP` writes its targets) or to `cat/a.png` stored as `/cat/a.png` read as unreadable, where
    tar -xf strips the leading slash of both; links to `../up.png`, which is not read (tar does
    not unpack it), read its pixels under their own names; a hard link to `cat/x/../b.png`
    read cat/b.png, where tar strips all up to the last `..` (b.png: no member, so tar makes no
    link there, and none is read: `test_a_hard_link_reads_its_target_as_tar_met_it`)."""
    members = [
        ("/cat/a.png", png(0)),
        ("cat/b.png", png(1)),
        ("cat/h.png", "=>/cat/b.png"),
        ("cat/k.png", "=>cat/a.png"),
        ("cat/m.png", "=>cat/x/../b.png"),  # tar: b.png, no member (normpath: cat/b.png)
        ("../up.png", png(2)),
        ("dog/c.png", png(3)),
        ("dog/s.png", "->../../up.png"),
        ("dog/t.png", "=>../up.png"),
    ]
    archive = tar_of_members(tmp_path / "pets.tar", members)
    source = open_data(str(archive))
    readable = {}
    for name, path in zip(source.whole.ids, source.whole.paths, strict=True):
        try:
            readable[name] = path.read_bytes()
        except OSError as error:
            # dog/s.png leads out of the archive (to ../up.png): never followed, as
            # test_tar_links_out_of_the_archive_are_never_followed says.
            assert str(error) == (LEADS_OUT if name == "dog/s.png" else "not a regular file"
                                  " (a symbolic link to nothing)")  # fmt: skip
    assert source.whole.ids == [
        "cat/a.png", "cat/b.png", "cat/h.png", "cat/k.png", "dog/c.png", "dog/s.png"
    ]  # fmt: skip
    expected = {"cat/a.png": 0, "cat/b.png": 1, "cat/h.png": 1, "cat/k.png": 0, "dog/c.png": 3}
    assert readable == {name: png(index) for name, index in expected.items()}
    unpacked = _unpacked_by_tar(archive, check=False)  # exit 2: the '..'
    if unpacked is None:
        return
    files = {
        path.relative_to(unpacked).as_posix(): path.read_bytes()
        for path in unpacked.rglob("*")
        if path.is_file()
    }
    assert files == readable


def test_tar_members_are_read_where_tar_unpacks_them(tmp_path, caplog):
    """`cat/../dog/e.png` counted as class cat, then as dog/e.png, and `/abs/x.png` was left out:
    GNU tar (`tar -xf`) unpacks no member with a `..` part, also one that stays inside the
    archive, and unpacks `/abs/x.png` as abs/x.png. The tar is read as the folder it unpacks
    to: the same images under the same classes."""
    members = [
        ("cat/a.png", png(0)),
        ("dog/c.png", png(1)),
        ("/abs/x.png", png(2)),
        ("../up.png", png(3)),
        ("cat/../dog/e.png", png(4)),
        ("cat/./f.png", png(5)),
    ]
    archive = tar_of_members(tmp_path / "pets.tar", members)
    source, warned = opened_with_warnings(archive, caplog)
    assert source.classes == ["abs", "cat", "dog"]
    assert source.whole.ids == ["abs/x.png", "cat/a.png", "cat/f.png", "dog/c.png"]
    assert [source.classes[label] for label in source.whole.labels] == ["abs", "cat", "cat", "dog"]
    assert [path.read_bytes() for path in source.whole.paths] == [png(i) for i in (2, 0, 5, 1)]
    assert warned == [
        f"{archive}: 2 image members with '..' in their path are not read, as tar -x does not "
        "unpack such members: ../up.png, cat/../dog/e.png"
    ]
    unpacked = _unpacked_by_tar(archive, check=False)  # exit 2: the '..'
    if unpacked is None:
        return
    folder = open_data(str(unpacked))
    assert (folder.classes, folder.whole.ids) == (source.classes, source.whole.ids)
    assert [Path(path).read_bytes() for path in folder.whole.paths] == [
        path.read_bytes() for path in source.whole.paths
    ]


def test_tar_links_out_of_the_archive_are_never_followed(tmp_path, caplog):
    """tar -xf unpacks a symbolic link as it is stored: one to an absolute path, or above the
    archive's root, points at the host's files (an attacker's archive at /etc/passwd). Such
    links, and links that lead to one, are never read: unreadable images whose reason says
    why, as a shard's are (they were left out with a warning, where a shard counted them). A
    link stored as `/cat/s.png` -> `a.png` is cat/s.png -> cat/a.png, as tar unpacks it (it
    was a link to /cat/a.png, unreadable)."""
    host = tmp_path / "host.png"
    host.write_bytes(png(9))
    members = [
        ("cat/a.png", png(0)),
        ("dog/c.png", png(1)),
        ("cat/abs.png", f"->{host}"),
        ("dog/up.png", "->../../host.png"),  # unpacked in tmp_path/unpacked: tmp_path/host.png
        ("dog/via.png", "->up.png"),
        ("/cat/s.png", "->a.png"),
    ]
    archive = tar_of_members(tmp_path / "pets.tar", members)
    source, warned = opened_with_warnings(archive, caplog)
    assert bytes_or_errors(source) == {
        "cat/a.png": png(0),
        "cat/abs.png": LEADS_OUT,
        "cat/s.png": png(0),
        "dog/c.png": png(1),
        "dog/up.png": LEADS_OUT,
        "dog/via.png": LEADS_OUT,
    }
    assert warned == []
    unpacked = _unpacked_by_tar(archive)
    if unpacked is None:
        return
    for name in ("cat/abs.png", "dog/up.png", "dog/via.png"):
        assert (unpacked / name).resolve() == host.resolve(), name  # the host's file
    assert (unpacked / "cat/s.png").resolve() == (unpacked / "cat/a.png").resolve()


def _write_with_holes(path: Path) -> None:
    """A 512x512 BMP, all zeros past its header, written as a hole: a sparse file where the
    file system keeps holes."""
    from PIL import Image

    whole = io.BytesIO()
    Image.new("RGB", (512, 512)).save(whole, format="BMP")
    with open(path, "wb") as holes:
        holes.write(whole.getvalue()[:54])
        holes.truncate(len(whole.getvalue()))


def _sparse_tar(archive: Path, folder: Path, names: list[str], form: str = "pax") -> Path:
    """GNU `tar --sparse` of `names` in `folder`; the test is skipped without GNU tar, or where
    tar stored every file whole (a file system that keeps no holes)."""
    if not has_gnu_tar():
        pytest.skip("GNU tar writes the sparse members")
    command = ["tar", "--sparse", f"--format={form}", "-cf", archive, "-C", folder, *names]
    subprocess.run(command, check=True, capture_output=True)
    with tarfile.open(archive) as tar:
        if not any(member.issparse() for member in tar.getmembers()):
            pytest.skip("this file system keeps no holes: tar stored the file whole")
    return archive


def test_a_tar_link_to_a_link_out_is_left_out_where_the_archive_holds_its_target(tmp_path, caplog):
    """`cat/x.png -> y.png -> /etc/p.png`, in an archive that also stores `/etc/p.png` (which
    tar unpacks as etc/p.png): unpacked, x.png is the host's /etc/p.png, as y.png is. x.png
    was read as the archive's etc/p.png, an image in two classes, and the data refused ('one
    file in two classes ... remove the link cat/x.png -> /etc/p.png'); it is left out with
    y.png."""
    members = [
        ("cat/a.png", png(0)),
        ("dog/c.png", png(1)),
        ("cat/x.png", "->y.png"),
        ("cat/y.png", "->/etc/p.png"),
        ("/etc/p.png", png(2)),
    ]
    archive = tar_of_members(tmp_path / "pets.tar", members)
    source, warned = opened_with_warnings(archive, caplog)
    assert bytes_or_errors(source) == {
        "cat/a.png": png(0),
        "cat/x.png": LEADS_OUT,
        "cat/y.png": LEADS_OUT,
        "dog/c.png": png(1),
        "etc/p.png": png(2),
    }
    assert warned == []
    unpacked = _unpacked_by_tar(archive)
    if unpacked is not None:
        assert os.readlink(unpacked / "cat/x.png") == "y.png"
        assert os.readlink(unpacked / "cat/y.png") == "/etc/p.png"  # the host's, not etc/p.png
        assert (unpacked / "etc/p.png").read_bytes() == png(2)


def test_a_tar_link_to_the_root_is_a_link_out_of_the_archive(tmp_path, caplog):
    """A symbolic link to `/` (or `//`) points at the host's root once unpacked: it was a
    link to the archive's root, listed as an unreadable image with the warning of a linked
    folder not entered."""
    members = [("cat/a.png", png(0)), ("dog/c.png", png(1)), ("cat/r.png", "->/")]
    members.append(("dog/r.png", "->//"))
    archive = tar_of_members(tmp_path / "pets.tar", members)
    source, warned = opened_with_warnings(archive, caplog)
    assert bytes_or_errors(source) == {
        "cat/a.png": png(0),
        "cat/r.png": LEADS_OUT,
        "dog/c.png": png(1),
        "dog/r.png": LEADS_OUT,
    }
    assert warned == []
    unpacked = _unpacked_by_tar(archive)
    if unpacked is not None:
        assert (unpacked / "cat/r.png").resolve() == Path("/")


def test_a_tar_class_folder_linked_out_of_the_archive_is_said(tmp_path, caplog):
    """`tar -cf` stores a class folder that is a link (`bird -> /data/birds`) as that link:
    never followed, its class went missing without a word. One warning names such links where
    a class or split folder could be; links deeper inside a class, and hidden ones, not."""
    members = [
        ("pets/train/cat/a.png", png(0)),
        ("pets/train/dog/c.png", png(1)),
        ("pets/train/bird", "->/data/birds"),
        ("pets/val", "->../../val"),
        ("pets/train/cat/more", "->/data/more"),
        ("pets/.cache", "->/tmp"),
    ]
    archive = tar_of_members(tmp_path / "pets.tar", members)
    source, warned = opened_with_warnings(archive, caplog)
    assert source.splits["train"].ids == ["train/cat/a.png", "train/dog/c.png"]
    assert warned == [
        f"{archive}: 2 links where a class folder could be lead out of the archive, not "
        "followed, as torchkit follows no link out of an archive: train/bird -> /data/birds, "
        "val -> ../../val (tar -h stores the files a link leads to)"
    ]


def test_a_tar_name_stored_as_a_file_and_as_a_link_out_is_named_once(tmp_path, caplog):
    """`cat/x.png` stored as an image, then again as a link to /etc/passwd (which tar -xf
    leaves, the later member replacing the first): the warning named it twice."""
    members = [
        ("cat/a.png", png(0)),
        ("dog/c.png", png(1)),
        ("cat/x.png", png(2)),
        ("cat/x.png", "->/etc/passwd"),
    ]
    archive = tar_of_members(tmp_path / "pets.tar", members)
    source, warned = opened_with_warnings(archive, caplog)
    assert bytes_or_errors(source) == {
        "cat/a.png": png(0),
        "cat/x.png": LEADS_OUT,
        "dog/c.png": png(1),
    }
    assert warned == []
    unpacked = _unpacked_by_tar(archive)
    if unpacked is not None:
        assert os.readlink(unpacked / "cat/x.png") == "/etc/passwd"


def test_a_shard_image_linked_out_of_the_shard_is_unreadable_saying_so(tmp_path):
    """A shard sample's image stored as a link out of the shard (`b.png -> /etc/hostname`, or
    through a link that leads out) is never followed: an unreadable image whose reason says
    why, where it said 'a symbolic link to nothing' (the host's file may well be there)."""
    members = [
        ("a.png", png(0)), ("a.cls", b"0"),
        ("b.png", "->/etc/hostname"), ("b.cls", b"1"),
        ("c.png", "->links/via"), ("links/via", "->../../up.png"), ("c.cls", b"1"),
        ("e.png", "->gone.png"), ("e.cls", b"0"),
    ]  # fmt: skip
    shard = tar_of_members(tmp_path / "s-000000.tar", members)
    report = run_torchkit_in_process("dataset-stats", shard, "--format", "json", "-j", "0")
    assert report.returncode == 0, report.stderr
    out = "a symbolic link out of the archive, never followed"
    assert json.loads(report.stdout)["unreadable"] == [
        {"path": "s-000000.tar/b.png", "error": out},
        {"path": "s-000000.tar/c.png", "error": out},
        {"path": "s-000000.tar/e.png", "error": "not a regular file (a symbolic link to nothing)"},
    ]


@pytest.mark.parametrize("form", ["pax", "gnu"])
def test_tar_members_stored_sparse_are_named_by_their_real_path_and_not_read(
    tmp_path, caplog, form
):
    """GNU tar's `--sparse --format=pax` stores a file with holes under a header named
    `dog/GNUSparseFile.NNN/s.bmp`, its real name in a pax record: it was read as an image of
    that name (a folder in class dog), its bytes the sparse map and pieces, 'not an image PIL
    can read'; the old GNU format's was left out silently. Both are said by their real name,
    not read."""
    folder = tmp_path / "pets"
    for name, index in (("cat/a.png", 0), ("dog/c.png", 1)):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(png(index))
    _write_with_holes(folder / "dog" / "s.bmp")
    archive = _sparse_tar(tmp_path / "pets.tar", folder, ["cat", "dog"], form)
    source, warned = opened_with_warnings(archive, caplog)
    assert source.whole.ids == ["cat/a.png", "dog/c.png"]
    assert [path.read_bytes() for path in source.whole.paths] == [png(0), png(1)]
    assert warned == [
        f"{archive}: 1 image member is stored sparse (tar --sparse), which torchkit does not "
        "read: dog/s.bmp (write the archive without --sparse, or give the folder tar -x "
        "unpacks)"
    ]
    listed = subprocess.run(["tar", "-tf", archive], check=True, capture_output=True, text=True)
    assert "dog/s.bmp" in listed.stdout.splitlines()  # the name tar -x gives it


@pytest.mark.parametrize("form", ["pax", "gnu"])
def test_a_tar_hard_link_to_a_member_stored_sparse_is_said_with_it(tmp_path, caplog, form):
    """`tar --sparse` of a folder whose sparse image has a second name (a hard link stored
    after it, which tar -x makes): the link was said to be one 'tar -x makes no hard link to a
    file stored after the link, or not at all' (untrue: its file is stored before it); it is
    a member stored sparse too, named with the file in one warning."""
    folder = tmp_path / "pets"
    for name, index in (("cat/a.png", 0), ("dog/c.png", 1)):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(png(index))
    _write_with_holes(folder / "dog" / "s.bmp")
    os.link(folder / "dog" / "s.bmp", folder / "dog" / "t.bmp")
    names = ["cat", "dog/c.png", "dog/s.bmp", "dog/t.bmp"]
    archive = _sparse_tar(tmp_path / "pets.tar", folder, names, form)
    listed = subprocess.run(["tar", "-tvf", archive], check=True, capture_output=True, text=True)
    assert "dog/t.bmp link to dog/s.bmp" in listed.stdout
    source, warned = opened_with_warnings(archive, caplog)
    assert source.whole.ids == ["cat/a.png", "dog/c.png"]
    assert warned == [
        f"{archive}: 2 image members are stored sparse (tar --sparse), which torchkit does not "
        "read: dog/s.bmp, dog/t.bmp (write the archive without --sparse, or give the folder "
        "tar -x unpacks)"
    ]


def test_a_shard_image_that_is_a_hard_link_stored_before_its_target_is_named(tmp_path):
    """A shard whose `00000.png` is a hard link to `00001.png` stored after it: tar -x does
    not make the link, and webdataset's reader, which reads no link member, gives sample 00000
    no image either. The error said only 'has no image; it holds cls', where `tar -tvf` lists
    00000.png: it names the link and why. Stored after its target, the link reads its bytes."""
    first = [("00000.png", "=>00001.png"), ("00000.cls", b"0")]
    then = [("00001.png", png(1)), ("00001.cls", b"1")]
    (tmp_path / "before").mkdir()
    (tmp_path / "after").mkdir()
    shard = tar_of_members(tmp_path / "before" / "shard-000000.tar", first + then)
    assert _refused(shard) == (
        "sample 00000 in shard-000000.tar has no image; it holds cls (00000.png is a hard link "
        "to 00001.png, stored before it or to no member: tar -x does not make it) (store the "
        "file, or the link after its target, as tar -cf does)"
    )
    shard = tar_of_members(tmp_path / "after" / "shard-000000.tar", then + first)
    source = open_data(str(shard))
    assert [path.read_bytes() for path in source.whole.paths] == [png(1), png(1)]
    assert list(source.whole.labels) == [1, 0]


def test_a_shard_label_that_is_a_hard_link_stored_before_its_target_is_named(tmp_path):
    """`00000.cls` a hard link to `00001.cls` stored after it: tar -x does not make it, and
    the sample read as unlabelled without a word (dataset-stats, predict), where an image link
    so is named. Stored after its target, the link reads its label."""
    first = [("00000.png", png(0)), ("00000.cls", "=>00001.cls")]
    then = [("00001.png", png(1)), ("00001.cls", b"1")]
    (tmp_path / "before").mkdir()
    (tmp_path / "after").mkdir()
    shard = tar_of_members(tmp_path / "before" / "shard-000000.tar", first + then)
    with pytest.raises(InputError) as raised:
        open_data(str(shard), allow_unlabelled=True)
    assert str(raised.value) == (
        "sample 00000 in shard-000000.tar has no label: 00000.cls is a hard link to 00001.cls, "
        "stored before it or to no member: tar -x does not make it (store the file, or the "
        "link after its target, as tar -cf does)"
    )
    shard = tar_of_members(tmp_path / "after" / "shard-000000.tar", then + first)
    assert list(open_data(str(shard)).whole.labels) == [1, 1]


def test_a_shard_sample_of_no_image_or_of_two_is_refused_naming_what_it_holds(tmp_path):
    """A sample of no image member (and no hard link tar -x leaves unmade to name) or of two
    images is refused, naming what it holds and the one image a sample has."""
    hint = (
        "(one image per sample, as KEY.bmp, KEY.gif, KEY.jfif, KEY.jpeg, KEY.jpg, KEY.pgm, "
        "KEY.png, KEY.ppm, KEY.tif, KEY.tiff, KEY.webp)"
    )
    for name, extra, what in (
        ("none", [("00000.txt", b"a cat")], "no image; it holds cls, txt"),
        (
            "two",
            [("00000.png", png(0)), ("00000.jpg", png(0))],
            "2 images (png, jpg); it holds cls, jpg, png",
        ),
    ):
        (tmp_path / name).mkdir()
        members = [*extra, ("00000.cls", b"0"), ("00001.png", png(1)), ("00001.cls", b"1")]
        shard = tar_of_members(tmp_path / name / "shard-000000.tar", members)
        assert _refused(shard) == f"sample 00000 in shard-000000.tar has {what} {hint}"


def test_a_shard_with_a_member_stored_sparse_is_refused_naming_it(tmp_path):
    """A webdataset shard written with GNU tar --sparse: its sample was said to have no image
    ('it holds cls'), its image left unread."""
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "00000.png").write_bytes(png(0))
    (folder / "00000.cls").write_text("0")
    _write_with_holes(folder / "00001.bmp")
    (folder / "00001.cls").write_text("1")
    members = ["00000.png", "00000.cls", "00001.bmp", "00001.cls"]
    shard = _sparse_tar(tmp_path / "shard-000000.tar", folder, members)
    assert _refused(shard) == (
        "shard-000000.tar:00001.bmp is stored sparse (tar --sparse), which torchkit does not "
        "read (write the shard without --sparse)"
    )


def test_a_shard_member_stored_sparse_that_no_sample_reads_is_no_refusal(tmp_path):
    """A shard's extra member stored sparse (`00001.depth.bmp`, `00001.npy`: torchkit reads a
    sample's image and labels only) refused the whole shard ('is stored sparse ... write the
    shard without --sparse'): its samples read as they did before sparse members were said."""
    folder = tmp_path / "src"
    folder.mkdir()
    members = []
    for key, index in (("00000", 0), ("00001", 1)):
        (folder / f"{key}.png").write_bytes(png(index))
        (folder / f"{key}.cls").write_text(str(index))
        _write_with_holes(folder / f"{key}.depth.bmp")
        _write_with_holes(folder / f"{key}.npy")
        members += [f"{key}.png", f"{key}.cls", f"{key}.depth.bmp", f"{key}.npy"]
    shard = _sparse_tar(tmp_path / "shard-000000.tar", folder, members)
    source = open_data(str(shard))
    assert [path.read_bytes() for path in source.whole.paths] == [png(0), png(1)]
    assert list(source.whole.labels) == [0, 1]


def test_a_tar_link_reaches_a_member_stored_under_another_spelling_of_its_path(tmp_path):
    """A member stored as `dog/./c.png` (or `dog//c.png`) is dog/c.png once unpacked, and a
    link to it (`dog/s.png` -> `c.png`) an image there too: it was 'a link to a member the
    archive does not hold', skipped as unreadable."""
    members = [
        ("cat/a.png", png(0)),
        ("cat/b.png", png(1)),
        ("dog/./c.png", png(2)),
        ("dog//d.png", png(3)),
        ("dog/s.png", "->c.png"),
        ("dog/t.png", "->./d.png"),
    ]
    source = open_data(str(tar_of_members(tmp_path / "pets.tar", members)))
    assert source.whole.ids == [
        f"{c}.png" for c in ("cat/a", "cat/b", "dog/c", "dog/d", "dog/s", "dog/t")
    ]
    assert [path.read_bytes() for path in source.whole.paths[4:]] == [png(2), png(3)]


def test_a_tar_link_stored_under_another_spelling_of_its_path_is_named_in_the_hint(tmp_path):
    """`cat/./s.png` -> `../dog/c.png`, one file in two classes: the hint said to remove one
    of two names of a file (hard links), missing the link by its unpacked path cat/s.png."""
    members = [
        ("cat/a.png", png(0)),
        ("dog/c.png", png(1)),
        ("cat/./s.png", "->../dog/c.png"),
    ]
    archive = tar_of_members(tmp_path / "pets.tar", members)
    assert _refused(archive) == (
        f"{archive}:cat/s.png and {archive}:dog/c.png are one file in two classes, cat and dog "
        f"(an image has one label: remove the link {archive}:cat/s.png -> ../dog/c.png)"
    )
