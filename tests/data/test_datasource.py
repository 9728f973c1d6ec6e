"""The one data resolver (issue #15), in core: what `--data` names, `--split`, train's splits and
their record, CSV indexes (BOM, errors naming the line), and the image loader's fixes (16-bit
images scaled to 8 bits, special files never opened)."""

from __future__ import annotations

import csv
import os
import threading
from pathlib import Path

import numpy as np
import pytest
from image_folders import SIXTEEN_BIT_GRAY, write_image_folder
from PIL import Image

from torchkit.core.data.dataset import make_dataset
from torchkit.core.data.image_files import NotARegularFile, load_image, open_regular_file
from torchkit.core.data.sources import (
    open_data,
    select_split,
    split_record,
    training_splits,
    write_split_csv,
)
from torchkit.core.io.errors import InputError, UsageError


def _write(path: Path, text: str, *, bom: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))
    return path


@pytest.fixture
def cifar_like(tmp_path: Path) -> Path:
    """train/ and test/, no val/: what `convert cifar` writes."""
    root = tmp_path / "cifar"
    write_image_folder(root / "train", {"cat": 10, "dog": 10}, seed=1)
    write_image_folder(root / "test", {"cat": 2, "dog": 2}, seed=2)
    return root


# -- what --data names -------------------------------------------------------------------------


def test_a_split_root_has_real_classes_and_ids_relative_to_the_root(tmp_path):
    root = tmp_path / "data"
    write_image_folder(root / "train", {"b": 2, "a": 1})
    write_image_folder(root / "val", {"a": 1, "c": 1})  # c only in val: after train's classes
    (root / ".cache").mkdir()  # hidden folders are not splits or classes
    source = open_data(root)
    assert (source.kind, source.root, source.whole) == ("split root", str(root), None)
    assert list(source.splits) == ["train", "val"]
    assert source.classes == ["a", "b", "c"]
    train, val = source.splits["train"], source.splits["val"]
    assert train.ids == ["train/a/a_0.png", "train/b/b_0.png", "train/b/b_1.png"]
    assert train.splits == ["train"] * 3 and val.splits == ["val"] * 2
    assert [source.classes[label] for label in val.labels] == ["a", "c"]
    assert all(Path(p).is_file() for p in train.paths + val.paths)


def test_split_data_of_many_classes_unites_their_names_in_linear_time():
    """Each split's class names are looked up in a set, not in the list of names so far:
    40,000 classes (one folder per identity) took 10 s of 13 to open. Counted: comparisons."""
    from torchkit.core.data.sources.samples import Samples
    from torchkit.core.data.sources.source import _union_classes

    compared = 0

    class Name(str):
        __hash__ = str.__hash__

        def __eq__(self, other: object) -> bool:
            nonlocal compared
            compared += 1
            return str.__eq__(self, other)

    n = 300
    parts = {
        split: Samples([Name(f"c{i}") for i in range(first, first + n)], [])
        for split, first in (("train", 0), ("val", n // 2))
    }
    names = _union_classes(parts)
    assert compared <= n  # was n * n
    assert names == [f"c{i}" for i in range(n + n // 2)]


def test_image_folder_flat_folder_and_what_is_refused(tmp_path):
    folder = write_image_folder(tmp_path / "folder", {"x": 2, "y": 1})
    source = open_data(folder)
    assert (source.kind, source.splits, source.classes) == ("image folder", {}, ["x", "y"])
    assert source.whole.ids == ["x/x_0.png", "x/x_1.png", "y/y_0.png"]
    assert source.whole.splits is None

    flat = tmp_path / "flat"
    flat.mkdir()
    Image.new("RGB", (4, 4)).save(flat / "one.png")
    with pytest.raises(InputError, match="holds images but no class folders"):
        open_data(flat)  # train, eval: labels needed
    unlabelled = open_data(flat, allow_unlabelled=True)  # dataset-stats, split, predict
    assert (unlabelled.kind, unlabelled.classes, unlabelled.whole.ids) == (
        "flat folder",
        [""],
        ["one.png"],
    )

    mixed = write_image_folder(tmp_path / "mixed", {"train": 1, "cat": 1})
    with pytest.raises(InputError, match=r"mixes split folders \(train/\) with other folders"):
        open_data(mixed)
    with pytest.raises(InputError, match="dataset not found"):
        open_data(tmp_path / "missing")
    with pytest.raises(InputError, match="neither a folder nor a CSV index"):
        open_data(flat / "one.png")


@pytest.mark.parametrize("target", [".", "..", "x"], ids=["root", "above-root", "a-class"])
def test_a_class_folder_linking_to_root_or_above_is_refused(tmp_path, target):
    """Before: `ROOT/loop -> ROOT` was one more class, holding every image again. A link to
    another class's folder gives each of its images two labels: refused, naming the link."""
    folder = write_image_folder(tmp_path / "data" / "folder", {"x": 2, "y": 1})
    (folder / "loop").symlink_to((folder / target).resolve(), target_is_directory=True)
    if target == "x":
        with pytest.raises(InputError, match=r"in two classes, loop and x .*remove the link"):
            open_data(folder)
        return
    with pytest.raises(InputError, match=r"class folder .*loop links to .*, which holds .*folder"):
        open_data(folder)


def test_digits_is_split_data_with_its_own_val():
    source = open_data("digits")
    assert (source.kind, source.root, list(source.splits)) == (
        "digits",
        "",
        ["train", "val", "test"],
    )
    assert [len(s) for s in source.splits.values()] == [1438, 180, 179]
    assert source.splits["test"].splits[0] == "test"


def _add_macos_leftovers(root: Path, classes: list[str]) -> None:
    """What unzipping a zip that macOS's Finder made leaves: `__MACOSX/<class>/._<image>` beside
    the class folders, and `._<image>` AppleDouble files (not images) in a class folder."""
    apple_double = b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X" + bytes(64)
    for name in classes:
        (root / "__MACOSX" / name).mkdir(parents=True)
        (root / "__MACOSX" / name / f"._{name}_0.png").write_bytes(apple_double)
        (root / name / f"._{name}_0.png").write_bytes(apple_double)
        (root / name / "__MACOSX").mkdir()
        (root / name / "__MACOSX" / f"._{name}_0.png").write_bytes(apple_double)


def test_macos_zip_leftovers_are_no_class_split_or_image(tmp_path):
    """`__MACOSX/` is not a class (nor a split), `._x.png` is not an image: in an image folder,
    a split root, a flat folder and a tar of an image folder."""
    import tarfile

    folder = write_image_folder(tmp_path / "folder", {"cat": 2, "dog": 1})
    _add_macos_leftovers(folder, ["cat", "dog"])
    source = open_data(folder)
    assert source.kind == "image folder" and source.classes == ["cat", "dog"]
    assert source.whole.ids == ["cat/cat_0.png", "cat/cat_1.png", "dog/dog_0.png"]

    split_root = tmp_path / "split"
    write_image_folder(split_root / "train", {"cat": 1, "dog": 1})
    write_image_folder(split_root / "val", {"cat": 1, "dog": 1})
    _add_macos_leftovers(split_root, ["train", "val"])  # __MACOSX/ beside the splits
    split = open_data(split_root)
    assert split.kind == "split root" and list(split.splits) == ["train", "val"]
    assert split.classes == ["cat", "dog"] and len(split.splits["train"]) == 2

    flat = tmp_path / "flat"
    write_image_folder(flat, {"cat": 2})
    _add_macos_leftovers(flat, ["cat"])
    (flat / "cat" / "._top.png").write_bytes(b"\x00\x05\x16\x07")
    unlabelled = open_data(flat / "cat", allow_unlabelled=True)
    assert unlabelled.kind == "flat folder"
    assert unlabelled.whole.ids == ["cat_0.png", "cat_1.png"]

    archive = tmp_path / "folder.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(folder, arcname="folder")  # wrapped in its folder, __MACOSX/ inside it
        tar.add(folder / "__MACOSX", arcname="__MACOSX/folder")  # and beside it, as in a zip
    in_tar = open_data(archive)
    assert in_tar.classes == ["cat", "dog"] and len(in_tar.whole) == 3


def test_csv_index_with_bom_paths_as_written_and_a_split_column(tmp_path):
    write_image_folder(tmp_path / "images", {"cat": 2, "dog": 2})
    index = _write(
        tmp_path / "index.csv",
        "path,label,split\n"
        "images/cat/cat_0.png,cat,train\n"
        "images/dog/dog_0.png,dog,train\n"
        "images/cat/cat_1.png,cat,val\n"
        "./images/dog/dog_1.png,dog, test \n",
        bom=True,  # Excel's "CSV UTF-8": the first column is `\ufeffpath` to a plain reader
    )
    source = open_data(index)
    assert (source.kind, source.root, source.whole) == ("split csv", str(tmp_path), None)
    assert {name: s.ids for name, s in source.splits.items()} == {
        "train": ["images/cat/cat_0.png", "images/dog/dog_0.png"],
        "val": ["images/cat/cat_1.png"],
        "test": ["./images/dog/dog_1.png"],
    }
    assert source.classes == ["cat", "dog"]
    assert all(Path(p).is_file() for s in source.splits.values() for p in s.paths)

    plain = _write(tmp_path / "plain.csv", "path,label\nimages/cat/cat_0.png,cat\n", bom=True)
    unsplit = open_data(plain)
    assert (unsplit.kind, unsplit.splits, unsplit.whole.ids) == (
        "csv",
        {},
        ["images/cat/cat_0.png"],
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("file,label\na.png,x\n", r"needs `path` and `label` columns \(line 1 has file, label\)"),
        ("", r"needs `path` and `label` columns \(line 1 has nothing: the file is empty\)"),
        ("path,label\na.png,x\n,y\nb.png,z\n", r"1 row\(s\) with an empty path \(line 3\)"),
        ('path,label\na.png,x\n"b\nc.png",\n', r"1 row\(s\) with an empty label \(line 4\)"),
        (
            "path,label,split\na.png,x,train\nb.png,x,validation\nc.png,x,\n",
            r"2 row\(s\) with a split other than train, val or test \(line 3 'validation', "
            r"4 ''\)",
        ),
        ("path,label\n", "no rows in CSV index"),
    ],
)
def test_bad_csv_indexes_are_one_line_errors_naming_the_line(tmp_path, text, message):
    index = _write(tmp_path / "index.csv", text, bom=True)
    with pytest.raises(InputError, match=message) as refused:
        open_data(index)
    assert "\n" not in refused.value.message


def test_a_csv_index_reads_quoting_unicode_blank_lines_and_odd_spellings_as_written(tmp_path):
    index = _write(
        tmp_path / "data" / "index.csv",
        "split, label ,path\n"  # spaces around a name (a column named twice is an error)
        'train,"cat","a,b.png"\n'
        "\n"  # a blank line is no row
        'val,"dog","ünï cödé/ß ""q"".png"\n'
        "test,cat,./c/./d//e.png\n"
        "train,dog,/abs/f.png\n"
        "train,cat\n",  # a short row: its path is empty
        bom=True,
    )
    with pytest.raises(InputError, match=r"1 row\(s\) with an empty path \(line 7\)"):
        open_data(index)
    index.write_text(index.read_text(encoding="utf-8-sig").rsplit("train,cat\n", 1)[0])
    samples = open_data(index)
    ids = [i for name in ("train", "val", "test") for i in samples.splits[name].ids]
    paths = [p for name in ("train", "val", "test") for p in samples.splits[name].paths]
    assert ids == ["a,b.png", "/abs/f.png", 'ünï cödé/ß "q".png', "./c/./d//e.png"]
    base = tmp_path / "data"
    assert paths == [
        f"{base}/a,b.png",
        "/abs/f.png",
        f'{base}/ünï cödé/ß "q".png',
        f"{base}/c/d/e.png",  # as pathlib joins it
    ]
    assert samples.classes == ["cat", "dog"]


def test_csv_labels_are_read_without_spaces_around_them_paths_exactly(tmp_path):
    """`a.png, cat` is class cat (the header `path, label` is read so too); a path is read as
    written, and spaces around it that only a typo explains are refused naming the line."""
    write_image_folder(tmp_path / "images", {"cat": 1, "dog": 1})
    (tmp_path / "images" / " spaced.png").write_bytes(
        (tmp_path / "images" / "cat" / "cat_0.png").read_bytes()
    )
    index = _write(
        tmp_path / "index.csv",
        "path, label\n"
        "images/cat/cat_0.png, cat\n"
        "images/dog/dog_0.png,dog \n"
        "images/ spaced.png,cat\n",
    )
    samples = open_data(index).whole
    assert samples.classes == ["cat", "dog"]
    assert samples.labels == [0, 1, 0]
    assert samples.ids[2] == "images/ spaced.png"  # a name that starts with a space exists

    typo = _write(
        tmp_path / "typo.csv", "label, path\ncat,images/cat/cat_0.png\ndog, images/dog/dog_0.png\n"
    )
    with pytest.raises(
        InputError,
        match=r"1 row\(s\) whose path has spaces around it .*line 3 ' images/dog/dog_0.png'",
    ) as refused:
        open_data(typo)
    assert "remove the spaces" in refused.value.hint


NFC, NFD = "caf\u00e9", "cafe\u0301"  # one name: a composed "é", "e" + a combining accent


def test_two_spellings_of_one_class_name_in_one_listing_are_refused_across_splits_one(tmp_path):
    """Folders (or labels) "café" typed and "café" made on macOS: one folder is one clear
    error; the spellings in train and val are one class (train's spelling)."""
    write_image_folder(tmp_path / "both", {NFC: 1, NFD: 1, "dog": 1})
    with pytest.raises(InputError, match=r"'cafe\\u0301' and 'caf\\xe9' are one name in two"):
        open_data(tmp_path / "both")
    index = _write(tmp_path / "both.csv", f"path,label\na.png,{NFC}\nb.png,{NFD}\n")
    with pytest.raises(InputError, match=r"labels of .*both.csv: .* are one name in two"):
        open_data(index)

    write_image_folder(tmp_path / "root" / "train", {NFC: 2, "dog": 2})
    write_image_folder(tmp_path / "root" / "val", {NFD: 1, "dog": 1})
    index = _write(
        tmp_path / "split.csv",
        f"path,label,split\nroot/train/{NFC}/{NFC}_0.png,{NFC},train\n"
        f"root/train/dog/dog_0.png,dog,train\nroot/val/{NFD}/{NFD}_0.png,{NFD},val\n",
    )
    for data in (tmp_path / "root", index):
        source = open_data(data)
        assert source.classes == [NFC, "dog"], data
        assert source.splits["val"].labels[0] == 0, data


def test_a_csv_index_of_many_rows_makes_no_path_object_per_row(tmp_path, monkeypatch):
    """A million rows: Path objects per row took seconds (issue #48)."""
    rows = "".join(f"images/c{i % 3}/{i}.png,c{i % 3}\n" for i in range(1000))
    index = _write(tmp_path / "index.csv", "path,label\n" + rows)
    joins = []
    join = Path.__truediv__
    monkeypatch.setattr(Path, "__truediv__", lambda *a: joins.append(a) or join(*a))
    samples = open_data(index).whole
    assert len(joins) < 10
    assert samples.paths[-1] == f"{tmp_path}/images/c0/999.png"
    assert samples.ids[-1] == "images/c0/999.png" and samples.labels[-1] == 0


def test_a_csv_that_is_not_utf8_is_refused_clearly(tmp_path):
    index = tmp_path / "latin1.csv"
    index.write_bytes("path,label\ncaf\xe9.png,x\n".encode("latin-1"))
    with pytest.raises(InputError, match="is not UTF-8 text"):
        open_data(index)


# -- --split -----------------------------------------------------------------------------------


def test_select_split_picks_defaults_all_and_refuses_what_cannot_apply(cifar_like, tmp_path):
    source = open_data(cifar_like)
    test, notes = select_split(source, None, default="test")
    assert len(test) == 4 and set(test.splits) == {"test"}
    assert notes and "using test" in notes[0]
    everything, _ = select_split(source, "all", default="test")
    assert len(everything) == 24 and everything.splits == ["train"] * 20 + ["test"] * 4
    assert everything.ids[-1] == "test/dog/dog_1.png"
    with pytest.raises(UsageError, match="has no val split") as refused:
        select_split(source, "val", default="test")
    assert "it has: train, test" in refused.value.hint
    with pytest.raises(UsageError, match="unknown --split 'validation'"):
        select_split(source, "validation", default="test")

    folder = open_data(cifar_like / "train")  # an image folder: no splits
    whole, notes = select_split(folder, None, default="test")
    assert len(whole) == 20 and notes == [] and whole.splits is None
    for split in ("train", "val", "all"):
        with pytest.raises(UsageError, match=f"--split {split}: .* is not split data") as caught:
            select_split(folder, split, default="test")
        assert caught.value.hint == (
            "--split picks train/, val/ or test/ of a split root, the rows of a CSV index with a "
            "split column, or the split a training run recorded, given its checkpoint; drop "
            "--split"
        )


# -- train's splits, their record and split.csv ------------------------------------------------


def test_a_root_without_val_holds_out_a_stratified_seeded_share_of_train(cifar_like):
    source = open_data(cifar_like)
    splits, notes = training_splits(source, val_split=None, seed=0)
    assert list(splits) == ["train", "val", "test"]
    assert [len(s) for s in splits.values()] == [18, 2, 4]
    assert sorted(splits["val"].labels) == [0, 1]  # stratified: one of each class
    assert not set(splits["val"].ids) & set(splits["train"].ids)
    assert splits["val"].splits == ["val", "val"] and splits["test"].splits[0] == "test"
    assert "has no val split (train, test): holding out 0.1 of its train split" in notes[0]
    again, _ = training_splits(source, val_split=None, seed=0)
    assert again["val"].ids == splits["val"].ids  # seeded
    other, _ = training_splits(source, val_split=0.3, seed=0)
    assert len(other["val"]) == 6


def test_the_held_out_share_depends_on_paths_not_on_the_order_images_are_listed(tmp_path):
    # The same images as a folder and as a CSV index listing them in another order: one seed
    # holds out the same ones (as `split` does), so the form the data comes in does not matter.
    root = tmp_path / "data"
    write_image_folder(root, {"a": 6, "b": 6})
    folder = open_data(root)
    rows = [f"{i},{i.split('/')[0]}" for i in reversed(folder.whole.ids)]
    index = _write(root / "index.csv", "path,label\n" + "\n".join(rows) + "\n")
    for seed in range(4):
        by_folder, _ = training_splits(folder, val_split=0.5, seed=seed)
        by_index, _ = training_splits(open_data(index), val_split=0.5, seed=seed)
        assert sorted(by_index["val"].ids) == sorted(by_folder["val"].ids)


def test_the_record_gives_back_exactly_the_held_out_images(cifar_like, tmp_path):
    splits, _ = training_splits(open_data(cifar_like), val_split=0.2, seed=3)
    record = split_record(open_data(cifar_like), splits)
    assert record["held_out"] == {"val": splits["val"].ids}
    assert (record["held_out_of"], record["root"]) == ("train", str(cifar_like.resolve()))
    assert record["kind"] == "split root" and record["sizes"] == {"train": 16, "val": 4, "test": 4}

    # Images added since: a fresh split could move validation images into training; the record
    # keeps the run's (resume), and eval/extract-features pick exactly those with --split val.
    for i in range(3):
        Image.new("RGB", (8, 8), (i, 0, 0)).save(cifar_like / "train" / "cat" / f"new_{i}.png")
    source = open_data(cifar_like)
    resumed, _ = training_splits(source, val_split=0.2, seed=3, recorded=record)
    assert resumed["val"].ids == splits["val"].ids
    assert len(resumed["train"]) == 16 + 3  # the new images train
    val, notes = select_split(source, "val", default="test", recorded=record)
    assert val.ids == splits["val"].ids and val.splits == ["val"] * 4
    assert "the val split the training run made: 4 images" in notes
    train, _ = select_split(source, "train", default="test", recorded=record)
    assert not set(train.ids) & set(val.ids)

    (cifar_like / "train" / splits["val"].ids[0].split("/", 1)[1]).unlink()
    with pytest.raises(
        InputError, match="1 of the 4 images the training run held out for val"
    ) as e:
        select_split(open_data(cifar_like), "val", default="test", recorded=record)
    assert e.value.hint == f"give the data the run trained on: {cifar_like.resolve()}"


def test_the_held_out_images_are_matched_however_a_csv_index_spells_their_paths(tmp_path):
    # A run on an index listing `./a/x.png`, scored on one listing `a/x.png` (or `a//x.png`):
    # the same files, but eval found none of the images the run held out.
    root = tmp_path / "data"
    write_image_folder(root, {"a": 5, "b": 5})
    ids = open_data(root).whole.ids
    spelled = {
        "dot": [f"./{i}" for i in ids],
        "plain": list(ids),
        "double": [i.replace("/", "//") for i in ids],
    }
    index = {}
    for name, paths in spelled.items():
        rows = "".join(f"{p},{i.split('/')[0]}\n" for p, i in zip(paths, ids, strict=True))
        index[name] = _write(root / f"{name}.csv", "path,label\n" + rows)
    source = open_data(index["dot"])
    splits, _ = training_splits(source, val_split=0.2, seed=0)
    record = split_record(source, splits)
    held = sorted(p.removeprefix("./") for p in splits["val"].ids)
    for name in ("plain", "double"):
        val, _ = select_split(open_data(index[name]), "val", default="test", recorded=record)
        assert sorted(p.replace("//", "/") for p in val.ids) == held
        train, _ = select_split(open_data(index[name]), "train", default="test", recorded=record)
        assert len(train) == 8 and not set(train.ids) & set(val.ids)


def test_a_resume_on_data_that_would_make_another_val_split_is_refused(cifar_like, tmp_path):
    # `train --resume RUN --data OTHER_FORM`: the same images with a val split of their own, or
    # without one, would validate on other images and train on the run's validation images.
    import shutil

    held = split_record(
        open_data(cifar_like), training_splits(open_data(cifar_like), val_split=None, seed=0)[0]
    )  # val held out of train/
    flat = cifar_like / "train"  # the same classes, unsplit
    with pytest.raises(InputError, match="has no train split to hold them out of"):
        training_splits(open_data(flat), val_split=None, seed=0, recorded=held)
    shutil.copytree(cifar_like / "test", cifar_like / "val")
    with pytest.raises(InputError, match="has a val split of its own"):
        training_splits(open_data(cifar_like), val_split=None, seed=0, recorded=held)

    source = open_data(cifar_like)
    own = split_record(source, training_splits(source, val_split=None, seed=0)[0])
    assert own["held_out"] == {}
    again, _ = training_splits(open_data(cifar_like), val_split=None, seed=0, recorded=own)
    assert again["val"].ids == source.splits["val"].ids
    with pytest.raises(InputError, match=r"the val split of .*cifar; .*train has none"):
        training_splits(open_data(flat), val_split=None, seed=0, recorded=own)


def test_data_with_its_own_val_ignores_val_split_and_records_nothing_held_out(tmp_path, caplog):
    root = tmp_path / "data"
    write_image_folder(root / "train", {"a": 2, "b": 2})
    write_image_folder(root / "val", {"a": 1, "b": 1})
    source = open_data(root)
    splits, notes = training_splits(source, val_split=0.5, seed=0)
    assert notes == [] and [len(s) for s in splits.values()] == [4, 2]
    assert "--val-split is ignored" in caplog.text
    assert split_record(source, splits)["held_out"] == {}
    with pytest.raises(UsageError, match="--val-split must be between 0 and 1"):
        training_splits(source, val_split=1.5, seed=0)
    caplog.clear()  # a resumed run's recorded --val-split was warned of as the run began
    training_splits(source, val_split=0.5, seed=0, recorded=split_record(source, splits))
    assert "--val-split is ignored" not in caplog.text


def test_split_csv_lists_every_image_with_its_class_name_and_split(cifar_like, tmp_path):
    splits, _ = training_splits(open_data(cifar_like), val_split=None, seed=0)
    written = write_split_csv(tmp_path / "run" / "split.csv", splits)
    with written.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["path", "label", "split"]
    assert len(rows) == 24
    assert [r["split"] for r in rows] == ["train"] * 18 + ["val"] * 2 + ["test"] * 4
    assert {r["label"] for r in rows} == {"cat", "dog"}
    assert all((cifar_like / r["path"]).is_file() for r in rows)  # relative to the data root
    assert [r["path"] for r in rows if r["split"] == "val"] == splits["val"].ids


# -- the loader: 16-bit images, special files --------------------------------------------------


def test_16_bit_images_feed_their_8_bit_values_not_white(tmp_path):
    import torch
    from torchvision import transforms as T

    values = np.linspace(0, 65535, 64).astype(np.uint16).reshape(8, 8)
    values[0, :4] = (0, 1, 128, 129)  # rounding at the bottom: 0, 0, 0, 1
    path = tmp_path / "sixteen.png"
    Image.fromarray(values).save(path)
    with Image.open(path) as image:
        assert image.mode == SIXTEEN_BIT_GRAY  # really 16 bits on disk
    expected = np.floor(values.astype(np.float64) * 255 / 65535 + 0.5).astype(np.uint8)

    assert np.array_equal(np.asarray(load_image(path, "L")), expected)
    from torchkit.core.data.sources.samples import Samples

    samples = Samples(["x"], [0], paths=[str(path)], ids=["sixteen.png"])
    tensor, label, index, error = make_dataset(samples, T.PILToTensor(), mode="RGB")[0]
    assert error == "" and tensor.shape == (3, 8, 8)
    for channel in tensor:
        assert torch.equal(channel, torch.from_numpy(expected))
    assert int(tensor.max()) == 255 and int(tensor.float().mean()) < 200  # not pure white

    # dataset-stats --mode rgb measures the same 8-bit pixels.
    from torchkit.core.stats import compute_dataset_stats

    folder = tmp_path / "set" / "x"
    folder.mkdir(parents=True)
    os.replace(path, folder / "sixteen.png")
    stats = compute_dataset_stats(tmp_path / "set", workers=0)
    assert stats.mean == pytest.approx([expected.mean() / 255] * 3, abs=1e-12)


def test_special_files_and_dangling_links_are_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    dangling = tmp_path / "gone.png"
    dangling.symlink_to(tmp_path / "nowhere.png")
    results: dict[str, str] = {}

    def attempt() -> None:
        for name, path in (("fifo", fifo), ("link", dangling), ("dir", tmp_path)):
            try:
                open_regular_file(path).close()
            except NotARegularFile as error:
                results[name] = str(error)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(timeout=20)
    assert not worker.is_alive(), "opening a FIFO blocked"
    assert results == {
        "fifo": "not a regular file (a FIFO)",
        "link": "not a regular file (a symbolic link to nothing)",
        "dir": "not a regular file (a folder)",
    }
    with pytest.raises(FileNotFoundError):
        open_regular_file(tmp_path / "missing.png")


def test_a_stop_just_as_an_image_file_opens_is_the_stop_not_a_bad_descriptor(tmp_path):
    # Ctrl-C or SIGTERM is raised where Python next checks for signals: also just after the
    # call that made the file object, which is then dropped and closes its descriptor. The
    # opener closed it a second time, so a `split --mode move` stopped there ended in `Error:
    # OSError: [Errno 9] Bad file descriptor` (exit 1, not 143). A profile hook raises at that
    # very point: after `open` returns its file object.
    import io
    import sys

    path = tmp_path / "x.png"
    path.write_bytes(b"pixels")
    fds_before = set(os.listdir("/proc/self/fd"))

    def stop_after_open(frame, event, arg):
        if event == "c_return" and arg is io.open:
            sys.setprofile(None)
            raise KeyboardInterrupt

    sys.setprofile(stop_after_open)
    try:
        with pytest.raises(KeyboardInterrupt):
            open_regular_file(path)
    finally:
        sys.setprofile(None)
    assert set(os.listdir("/proc/self/fd")) <= fds_before  # closed once, not leaked
    with open_regular_file(path) as handle:
        assert handle.read() == b"pixels"


def test_many_small_classes_still_hold_out_a_tenth_for_validation(tmp_path):
    # 4 images a class: 0.4 of an image each rounds to none, and training stopped on an empty
    # val set; the held-out tenth is taken across classes instead, and a note says so.
    rows = [f"c{c:02d}/{i}.png,c{c:02d}" for c in range(40) for i in range(4)]
    index = _write(tmp_path / "index.csv", "path,label\n" + "\n".join(rows) + "\n")
    splits, notes = training_splits(open_data(index), val_split=None, seed=0)
    assert (len(splits["train"]), len(splits["val"])) == (144, 16)
    assert len(set(splits["val"].labels)) == 16 and len(set(splits["train"].labels)) == 40
    assert "(16 images; stratified" in notes[0]
    assert notes[1].startswith("every class's share of val rounds to no image")
