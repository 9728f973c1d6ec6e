"""Images beside class folders (`D/cat/*.png`, `D/dog/*.png` and `D/cover.png`): the class-folder
rule in every command. The folder is labelled; the images beside its class folders are read by
no command that reads labels, each of which warns once in the same words; predict and
extract-features, which read no labels, read every image."""

from __future__ import annotations

import csv
import json
import tarfile
from pathlib import Path

import pytest
from checkpoints import write_convnet_checkpoint
from image_folders import write_image_folder
from output_checks import error_line
from processes import run_torchkit_in_process

from torchkit.core.data.sources import open_data, open_labelled, training_splits
from torchkit.core.io.errors import InputError

BESIDE = "beside the class folders"


def add_strays(folder: Path, names: tuple[str, ...] = ("cover.png", "notes.jpg")) -> Path:
    """Images at the top of `folder`, and non-image files there that nothing should warn of."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        Image.new("RGB", (8, 8), (200, 10, 10)).save(folder / name)
    for name in ("README.txt", ".DS_Store", "Thumbs.db"):
        (folder / name).write_bytes(b"not an image")
    return folder


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """D/cat (4 images), D/dog (4), and cover.png, notes.jpg beside them."""
    return add_strays(write_image_folder(tmp_path / "D", {"cat": 4, "dog": 4}))


def stray_warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if BESIDE in line]


def test_a_folder_whose_subfolders_hold_images_is_labelled_and_its_strays_recorded(data):
    for allow_unlabelled in (False, True):
        source = open_data(data, allow_unlabelled=allow_unlabelled)
        assert source.kind == "image folder" and source.classes == ["cat", "dog"]
        assert len(source.whole) == 8 and "cover.png" not in source.whole.ids
        assert source.strays == {str(data): ["cover.png", "notes.jpg"]}
    # What predict and extract-features read: every image, no labels, as before.
    every = open_data(data, allow_unlabelled=True, every_image=True)
    assert every.kind == "flat folder" and every.strays == {}
    assert len(every.whole) == 10 and "cover.png" in every.whole.ids


def test_a_folder_with_images_only_at_its_top_stays_unlabelled(tmp_path):
    flat = add_strays(tmp_path / "flat")
    (flat / "empty").mkdir()  # a subfolder without images labels nothing
    source = open_data(flat, allow_unlabelled=True)
    assert source.kind == "flat folder" and source.classes == [""] and len(source.whole) == 2
    assert source.strays == {}
    # Where labels are needed: said so, not "no images in flat" (it has two).
    with pytest.raises(InputError, match=r"flat holds images but no class folders holding any"):
        open_labelled(flat)
    archive = tmp_path / "flat.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(flat, arcname="flat")
    assert open_data(archive, allow_unlabelled=True).kind == "tar flat folder"
    with pytest.raises(InputError, match=r"flat.tar holds images but no class folders holding"):
        open_labelled(archive)


def test_class_folders_without_strays_warn_of_nothing(tmp_path, caplog):
    clean = write_image_folder(tmp_path / "clean", {"cat": 2, "dog": 2})
    for name in ("README.txt", ".DS_Store", "Thumbs.db"):  # not images: no stray warning
        (clean / name).write_bytes(b"x")
    assert open_data(clean, allow_unlabelled=True).strays == {}
    stats = run_torchkit_in_process("dataset-stats", clean, "--format", "json", "--workers", "0")
    assert stats.returncode == 0, stats.stderr
    assert stray_warnings(stats.stderr) == []


def test_dataset_stats_counts_the_classes_and_warns_once(data):
    stats = run_torchkit_in_process("dataset-stats", data, "--format", "json", "--workers", "0")
    assert stats.returncode == 0, stats.stderr
    found = json.loads(stats.stdout)
    assert found["images"] == 8 and found["num_classes"] == 2
    assert found["classes"] == [
        {"name": "cat", "index": 0, "images": 4},
        {"name": "dog", "index": 1, "images": 4},
    ]
    assert stray_warnings(stats.stderr) == [
        f"Warning: 2 images beside the class folders of {data} are not read: cover.png, notes.jpg"
    ]


def test_the_warning_names_the_first_strays_and_counts_the_rest(tmp_path):
    many = write_image_folder(tmp_path / "many", {"cat": 2, "dog": 2})
    add_strays(many, ("a.png", "b.png", "c.png", "d.png", "e.png"))
    stats = run_torchkit_in_process("dataset-stats", many, "--format", "json", "--workers", "0")
    assert stray_warnings(stats.stderr) == [
        f"Warning: 5 images beside the class folders of {many} are not read: a.png, b.png, "
        "c.png and 2 more"
    ]
    one = write_image_folder(tmp_path / "one", {"cat": 2, "dog": 2})
    add_strays(one, ("cover.png",))
    stats = run_torchkit_in_process("dataset-stats", one, "--format", "json", "--workers", "0")
    assert stray_warnings(stats.stderr) == [
        f"Warning: 1 image beside the class folders of {one} is not read: cover.png"
    ]


def images_under(folder: Path) -> list[str]:
    return sorted(
        str(p.relative_to(folder)) for p in folder.rglob("*") if p.suffix in (".png", ".jpg")
    )


def test_split_copies_the_class_folders_and_not_the_strays(data, tmp_path):
    out = tmp_path / "out"
    result = run_torchkit_in_process("split", data, "--out", out, "--ratio", "2:1:1")
    assert result.returncode == 0, result.stderr
    assert stray_warnings(result.stderr) == [
        f"Warning: 2 images beside the class folders of {data} are not read and not copied: "
        "cover.png, notes.jpg"
    ]
    written = images_under(out)
    assert len(written) == 8
    assert {path.split("/")[1] for path in written} == {"cat", "dog"}  # split/class/image
    assert {path.split("/")[0] for path in written} == {"train", "val", "test"}
    with (out / "split.csv").open(newline="") as handle:
        assert {row["label"] for row in csv.DictReader(handle)} == {"cat", "dog"}
    assert len(images_under(data)) == 10  # the data untouched


def test_split_move_leaves_the_strays_where_they_are(data, tmp_path):
    out = tmp_path / "out"
    result = run_torchkit_in_process("split", data, "--out", out, "--mode", "move")
    assert result.returncode == 0, result.stderr
    assert stray_warnings(result.stderr) == [
        f"Warning: 2 images beside the class folders of {data} are not read and stay where "
        "they are: cover.png, notes.jpg"
    ]
    assert images_under(data) == ["cover.png", "notes.jpg"]
    assert len(images_under(out)) == 8


def test_train_reads_the_class_folders_and_warns_once(data, caplog):
    # What `train` reads its data with (a run's CLI costs seconds): the warning comes once.
    source, refused = open_labelled(data)
    splits, _ = training_splits(source, val_split=None, seed=0)
    assert refused is None and source.classes == ["cat", "dog"]
    assert sorted(splits["train"].ids + splits["val"].ids) == sorted(source.whole.ids)
    assert len(source.whole) == 8 and "cover.png" not in source.whole.ids
    assert [r.getMessage() for r in caplog.records if BESIDE in r.getMessage()] == [
        f"2 images beside the class folders of {data} are not read: cover.png, notes.jpg"
    ]


def test_eval_reads_the_class_folders_and_warns_once(data, tmp_path):
    checkpoint = tmp_path / "two.pt"
    write_convnet_checkpoint(checkpoint, in_channels=3, image_size=8, classes=["cat", "dog"])
    scored = run_torchkit_in_process(
        "eval", checkpoint, "--data", data, "--format", "json", "--workers", "0"
    )
    assert scored.returncode == 0, scored.stderr
    assert stray_warnings(scored.stderr) == [
        f"Warning: 2 images beside the class folders of {data} are not read: cover.png, notes.jpg"
    ]
    assert json.loads(scored.stdout)["num_images"] == 8


def test_predict_and_extract_features_read_the_strays_too(data, tmp_path):
    checkpoint = tmp_path / "two.pt"
    write_convnet_checkpoint(checkpoint, in_channels=3, image_size=8, classes=["cat", "dog"])
    predicted = run_torchkit_in_process(
        "predict", checkpoint, data, "--format", "csv", "--workers", "0"
    )
    assert predicted.returncode == 0, predicted.stderr
    paths = [row["path"] for row in csv.DictReader(predicted.stdout.splitlines())]
    assert len(paths) == 10 and {"cover.png", "notes.jpg"} <= set(paths)
    assert stray_warnings(predicted.stderr) == []
    out = tmp_path / "features"
    extracted = run_torchkit_in_process(
        "extract-features", checkpoint, data, out, "--device", "cpu", "--workers", "0"
    )
    assert extracted.returncode == 0, extracted.stderr
    with (out / "index.csv").open(newline="") as handle:
        assert {"cover.png", "notes.jpg"} <= {row["path"] for row in csv.DictReader(handle)}
    assert stray_warnings(extracted.stderr) == []


def test_convert_shards_writes_the_classes_and_warns(data, tmp_path):
    shards = tmp_path / "shards"
    converted = run_torchkit_in_process("convert", "shards", data, shards)
    assert converted.returncode == 0, converted.stderr
    assert stray_warnings(converted.stderr) == [
        f"Warning: 2 images beside the class folders of {data} are not read: cover.png, notes.jpg"
    ]
    assert (shards / "classes.txt").read_text().split() == ["cat", "dog"]
    assert len(open_data(shards).whole) == 8


def test_a_split_root_reads_each_split_folder_by_the_same_rule(tmp_path, caplog):
    root = tmp_path / "sr"
    for split in ("train", "val"):
        add_strays(write_image_folder(root / split, {"cat": 2, "dog": 2}), ("cover.png",))
    source, refused = open_labelled(root)  # both split folders had images: read flat
    assert refused is None and source.classes == ["cat", "dog"]
    assert [len(source.splits[name]) for name in ("train", "val")] == [4, 4]
    assert source.strays == {str(root / "train"): ["cover.png"], str(root / "val"): ["cover.png"]}
    stats = run_torchkit_in_process("dataset-stats", root, "--format", "json", "--workers", "0")
    assert stray_warnings(stats.stderr) == [
        f"Warning: 1 image beside the class folders of {root / name} is not read: cover.png"
        for name in ("train", "val")
    ]
    assert json.loads(stats.stdout)["num_classes"] == 2
    # An unlabelled test split (images without class folders) stays unlabelled.
    add_strays(root / "test", ("x.png",))
    source = open_data(root, allow_unlabelled=True)
    assert source.classes == ["cat", "dog", ""] and len(source.splits["test"]) == 1


def test_a_tar_reads_its_folders_by_the_same_rule(data, tmp_path):
    archive = tmp_path / "D.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(data, arcname="D")
    source = open_data(archive, allow_unlabelled=True)
    assert source.kind == "tar image folder" and source.classes == ["cat", "dog"]
    assert len(source.whole) == 8 and source.strays == {str(archive): ["cover.png", "notes.jpg"]}
    every = open_data(archive, allow_unlabelled=True, every_image=True)
    assert every.kind == "tar flat folder" and len(every.whole) == 10
    stats = run_torchkit_in_process("dataset-stats", archive, "--format", "json", "--workers", "0")
    assert json.loads(stats.stdout)["num_classes"] == 2
    assert stray_warnings(stats.stderr) == [
        f"Warning: 2 images beside the class folders of {archive} are not read: cover.png, "
        "notes.jpg"
    ]
    split_root = tmp_path / "sr.tar"
    with tarfile.open(split_root, "w") as tar:
        tar.add(data, arcname="train")
        tar.add(data, arcname="val")
    source = open_data(split_root, allow_unlabelled=True)
    assert source.classes == ["cat", "dog"] and len(source.splits["val"]) == 8
    assert source.strays == {
        f"{split_root}:{name}": ["cover.png", "notes.jpg"] for name in ("train", "val")
    }


def test_tars_beside_class_or_split_folders_are_warned_of_as_not_read(tmp_path):
    # `cat/` and `backup.tar` in one folder: read as the image folder (or split root) it also
    # is, the archives were left out without a word.
    data = write_image_folder(tmp_path / "D", {"cat": 2, "dog": 2})
    for name in ("photos.tar", "scans.tar"):
        with tarfile.open(data / name, "w"):
            pass
    (data / "notes.txt").write_text("not an archive\n")
    stats = run_torchkit_in_process("dataset-stats", data, "--format", "json", "--workers", "0")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["images"] == 4
    assert [line for line in stats.stderr.splitlines() if ".tar" in line] == [
        f"Warning: 2 .tar files in {data}, read as an image folder, are not read: "
        f"photos.tar, scans.tar (to read shards, name them: "
        f"{data}/NAME-{{000000..000009}}.tar)"
    ]
    root = tmp_path / "R"
    write_image_folder(root / "train", {"cat": 2, "dog": 2})
    with tarfile.open(root / "old.tar", "w"):
        pass
    source = open_data(root)
    assert source.kind == "split root" and source.unread_archives == {str(root): ["old.tar"]}
    assert open_data(write_image_folder(tmp_path / "plain", {"a": 1})).unread_archives == {}


def test_shards_beside_class_or_split_folders_are_refused(tmp_path):
    """`train-000000.tar` beside class folders (or `val-000000.tar` beside a split root's
    `train/`) was read as the image folder with a warning: shards and images in one folder are
    two data, and which is meant a guess."""
    data = write_image_folder(tmp_path / "D", {"cat": 2, "dog": 2})
    for name in ("train-000000.tar", "train-000001.tar", "backup.tar"):
        with tarfile.open(data / name, "w"):
            pass
    stats = run_torchkit_in_process("dataset-stats", data, "--workers", "0")
    assert stats.returncode == 1 and stats.stdout == ""
    assert error_line(stats.stderr, besides="nothing") == (
        f"Error: {data} holds WebDataset shards (train-000000.tar, train-000001.tar) and images "
        f"(cat/, dog/): which of them is the data is a guess (name the shards, "
        f"'{data}/train-{{000000..000001}}.tar', or move the images or the .tar files out of "
        f"{data})"
    )
    root = tmp_path / "R"
    write_image_folder(root / "train", {"cat": 2, "dog": 2})
    for name in ("val-000000.tar", "val-000002.tar"):  # a gap: no one range names them
        with tarfile.open(root / name, "w"):
            pass
    with pytest.raises(InputError) as raised:
        open_data(root)
    assert str(raised.value).endswith(
        f"(name the shards, '{root}/NAME-{{000000..000009}}.tar', or move the images or the "
        f".tar files out of {root})"
    )
