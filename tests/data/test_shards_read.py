"""Reading WebDataset tar shards and .tar archives of image folders in place (issue #48): the
shards webdataset's own ShardWriter writes give the same statistics, metrics and features as the
image folder they were written from; split shards split; bad tars are one error line; and two
DDP ranks over uneven shards see every sample, repeated only as DistributedSampler pads."""

from __future__ import annotations

import csv
import io
import json
import os
import shlex
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
from checkpoints import write_convnet_checkpoint
from gloo_ranks import run_ranks, stderr_of
from image_folders import write_image_folder
from output_checks import error_line, torchkit_log_to_caplog, tree_digest
from processes import dataset_stats, run_json, run_torchkit_in_process
from shards import write_shards
from stats_plots import write_stats_plot_undrawn

from torchkit.core.io.errors import InputError

CLASSES = "abc"


def stats(data: object, *extra: object) -> dict:
    """dataset-stats without worker processes (each fork of the test process costs about a
    tenth of a second); the first test and the corrupt shard's read shards through them."""
    return dataset_stats(data, "--workers", "0", *extra)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """images/ (3 classes x 6 8x8 PNGs), shards/ (ShardWriter, 5 a shard: 4 shards), a split
    root and its split shards, and a convnet checkpoint."""
    root = tmp_path_factory.mktemp("shards")
    images = write_image_folder(root / "images", dict.fromkeys(CLASSES, 6))
    (root / "shards").mkdir()
    write_shards(str(root / "shards" / "shard-%06d.tar"), images, maxcount=5)
    (root / "shards" / "classes.txt").write_text("a\nb\nc\n")
    split_root = root / "split"
    write_image_folder(split_root / "train", dict.fromkeys(CLASSES, 4), seed=1)
    write_image_folder(split_root / "val", dict.fromkeys(CLASSES, 2), seed=2)
    (root / "split-shards").mkdir()
    for split in ("train", "val"):
        write_shards(
            str(root / "split-shards" / f"{split}-%06d.tar"), split_root / split, maxcount=5
        )
    write_convnet_checkpoint(root / "model.pt", in_channels=3, image_size=8, classes=CLASSES)
    return root


def test_brace_patterns_expand_as_webdataset_writes_them():
    from torchkit.core.data.sources.shards import expand_braces

    assert expand_braces("d/s-{000008..000011}.tar") == [
        "d/s-000008.tar",
        "d/s-000009.tar",
        "d/s-000010.tar",
        "d/s-000011.tar",
    ]
    assert expand_braces("{train,val}-{0..1}.tar") == [
        "train-0.tar",
        "train-1.tar",
        "val-0.tar",
        "val-1.tar",
    ]


@pytest.mark.parametrize(
    "pattern",
    ["s-{0..11}.tar", "s-{0..-2}.tar", "s-{-05..1}.tar", "s-{00..10..5}.tar", "s-{9..1..-4}.tar"],
)
def test_brace_patterns_expand_as_webdatasets_braceexpand(pattern):
    """`{0..11}` gave s-00.tar ... (a bound of 0 was taken for zero padding): the shards
    `ShardWriter("s-%d.tar")` writes were "not found"; `-05` did not pad, `..step` was a name."""
    from braceexpand import braceexpand

    from torchkit.core.data.sources.shards import expand_braces

    assert expand_braces(pattern) == list(braceexpand(pattern))


def test_a_range_of_thousands_of_digits_is_one_error_line(tmp_path):
    """int() refuses 4,300 digits: "Error: ValueError: Exceeds the limit ..." """
    result = run_torchkit_in_process("dataset-stats", f"{tmp_path}/s-{{0..{'9' * 5000}}}.tar")
    assert result.returncode == 1
    assert "has a range of numbers over 30 digits long" in error_line(result.stderr)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("pipe:curl -s https://host/d/s-{0..3}.tar", "is a webdataset pipe: command"),
        ("s3://bucket/d/s-{0..3}.tar", "not s3:// URLs"),
        ("gs://bucket/d/s-0.tar", "not gs:// URLs"),
    ],
)
def test_webdatasets_pipe_and_s3_forms_are_said_to_be_unread(spec, message):
    """They were "shard not found" (check the pattern) or "dataset not found: s3:/bucket..."."""
    result = run_torchkit_in_process("dataset-stats", spec)
    assert result.returncode == 1
    line = error_line(result.stderr)
    assert message in line and "not found" not in line, line
    assert line.endswith(
        "(give the shards' http or https URL, such as https://HOST/DIR/NAME-{000000..000009}.tar, "
        "or copy them to a folder first)"
        if spec.startswith("pipe:")
        else "(copy the data to a folder first with aws s3 cp, gsutil cp..., or give an https URL "
        "to it, such as a presigned one)"
    )


def test_dataset_stats_of_shards_is_that_of_their_folder(world):
    folder = stats(world / "images")  # the reference, read in this process; shards by workers
    assert dataset_stats(world / "shards") == folder
    assert dataset_stats(world / "shards" / "shard-{000000..000003}.tar") == folder
    assert folder["images"] == 18


def test_eval_of_shards_scores_as_the_folder(world):
    def metrics(data: Path, *extra: str) -> dict:
        found = run_json("eval", world / "model.pt", "--data", data, "--device", "cpu", *extra)
        return {
            k: v
            for k, v in found.items()
            if k not in ("data", "root", "seconds") and "per_s" not in k and "second" not in k
        }

    folder = metrics(world / "images", "-j", "0")  # the reference, read in this process
    assert metrics(world / "shards") == folder
    assert folder["num_images"] == 18


def test_extract_features_of_shards_gives_the_folders_rows_in_shard_order(world, tmp_path):
    # the shards through the loader's workers; the folder, the reference, in this process
    for data, out, *workers in (
        (world / "images", "folder", "-j", "0"),
        (world / "shards", "shards"),
    ):
        result = run_torchkit_in_process(
            "extract-features", world / "model.pt", data, "--out", tmp_path / out,
            "--device", "cpu", *workers,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
    with open(tmp_path / "shards" / "index.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert rows[0]["path"] == "shard-000000.tar/a_a_0.png"
    assert [r["path"].split("/")[0] for r in rows] == sorted(r["path"].split("/")[0] for r in rows)
    assert [r["label"] for r in rows] == [c for c in CLASSES for _ in range(6)]
    folder = np.load(tmp_path / "folder" / "penultimate.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "shards" / "penultimate.npy"), folder)


def test_extract_features_reads_a_pattern_and_a_missing_shard_leaves_no_out(world, tmp_path):
    pattern = str(world / "shards" / "shard-{000000..000003}.tar")
    result = run_torchkit_in_process(
        "extract-features", world / "model.pt", pattern, tmp_path / "feats", "--device", "cpu",
        "-j", "0",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert len(np.load(tmp_path / "feats" / "penultimate.npy")) == 18
    missing = str(world / "shards" / "shard-{000000..000009}.tar")
    result = run_torchkit_in_process(
        "extract-features", world / "model.pt", missing, tmp_path / "none", "--device", "cpu",
        "-j", "0",
    )  # fmt: skip
    assert result.returncode == 1
    assert "shard not found" in error_line(result.stderr)
    assert not (tmp_path / "none").exists()


def test_train_runs_an_epoch_on_shards_and_predict_reads_a_pattern(world, tmp_path):
    result = run_torchkit_in_process(
        "train", "--data", world / "shards", "--model", "convnet", "--image-size", "8",
        "--epochs", "1", "--batch-size", "4", "--workers", "0", "--device", "cpu",
        "--out", tmp_path / "run",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    split = (tmp_path / "run" / "split.csv").read_text().splitlines()
    assert len(split) == 19 and split[1].startswith("shard-0000")
    pattern = world / "shards" / "shard-{000000..000001}.tar"
    predicted = run_torchkit_in_process(
        "predict", tmp_path / "run" / "best.pt", pattern, "--format", "csv", "--device", "cpu",
        "-j", "0",
    )  # fmt: skip
    assert predicted.returncode == 0, predicted.stderr
    assert len(predicted.stdout.splitlines()) == 1 + 10


def test_outputs_may_not_be_nor_hold_the_shards_a_pattern_or_list_names(world, tmp_path):
    """A brace pattern or `::` list names no path, yet its shards are inputs: with --force,
    `-o SHARD` overwrote one and `OUT` = their folder (a torchkit output) deleted them all."""
    from torchkit.core.io.force import write_marker

    shards = tmp_path / "shards"
    shutil.copytree(world / "shards", shards)
    write_marker(shards, "convert shards")
    before = tree_digest(shards)
    pattern = str(shards / "shard-{000000..000003}.tar")
    listed = f"{shards / 'shard-000000.tar'}::{shards / 'shard-000001.tar'}"
    model = world / "model.pt"
    for command in (
        ["predict", model, pattern, "-o", shards / "shard-000000.tar"],
        ["dataset-stats", listed, "--format", "json", "-o", shards / "shard-000001.tar"],
        ["extract-features", model, pattern, shards],
        ["eval", model, "--data", listed, "--out", shards],
    ):
        result = run_torchkit_in_process(*command, "--force", "-j", "0")
        assert result.returncode == 1, (command, result.stderr)
        assert " shard " in error_line(result.stderr), command
    assert tree_digest(shards) == before


def test_one_shard_or_a_pattern_is_named_as_given_not_by_its_folder(world, tmp_path, monkeypatch):
    """`dataset-stats shard-000000.tar` titled its report with the shard's folder (JSON
    `source`) and refused `--plot p.png` beside it as lying inside that data folder."""
    plotted = write_stats_plot_undrawn(monkeypatch)  # where the plot goes, not its drawing
    shutil.copy(world / "shards" / "shard-000000.tar", tmp_path)
    for spec in ("shard-000000.tar", "shard-{000000..000000}.tar"):
        table = run_torchkit_in_process(
            "dataset-stats", spec, "--plot", "p.png", "-j", "0", cwd=tmp_path
        )
        assert table.returncode == 0, table.stderr
        assert table.stdout.splitlines()[0].strip() == f"Dataset {spec}"
        (tmp_path / "p.png").unlink()
    assert [plot["images"] for plot in plotted] == [5, 5]  # the shard's samples
    found = run_torchkit_in_process(
        "dataset-stats", "shard-000000.tar", "-o", "s.json", "-j", "0", cwd=tmp_path
    )
    assert found.returncode == 0, found.stderr
    assert json.loads((tmp_path / "s.json").read_text())["source"] == "shard-000000.tar"
    assert stats(world / "shards")["images"] == 18  # a folder of shards: still the folder


def test_a_folder_of_shards_is_named_as_given_not_by_its_absolute_path(world, tmp_path):
    """`dataset-stats shards` titled its report `Dataset /abs/.../shards` (JSON `source` too),
    where a folder of images keeps the name it was given; a plot inside it is still refused."""
    shutil.copytree(world / "shards", tmp_path / "shards")
    for spec in ("shards", "shards/"):
        table = run_torchkit_in_process("dataset-stats", spec, "-j", "0", cwd=tmp_path)
        assert table.returncode == 0, table.stderr
        assert table.stdout.splitlines()[0].strip() == "Dataset shards"
    found = run_torchkit_in_process(
        "dataset-stats", "shards", "-o", "s.json", "-j", "0", cwd=tmp_path
    )
    assert found.returncode == 0, found.stderr
    assert json.loads((tmp_path / "s.json").read_text())["source"] == "shards"
    inside = run_torchkit_in_process(
        "dataset-stats", "shards", "--plot", "shards/p.png", "-j", "0", cwd=tmp_path
    )
    assert inside.returncode != 0
    assert "lies inside the data folder shards" in error_line(inside.stderr)
    assert not (tmp_path / "shards" / "p.png").exists()


def tar_folder(folder: Path, archive: Path, *, wrapped: bool) -> Path:
    """`tar cf archive -C folder .` (members class/img.png), or with everything inside one
    folder named as the archive (`tar cf X.tar X`)."""
    with tarfile.open(archive, "w") as tar:
        for path in sorted(folder.rglob("*")):
            relative = path.relative_to(folder).as_posix()
            tar.add(
                path, arcname=f"{archive.stem}/{relative}" if wrapped else relative, recursive=False
            )
    return archive


def test_a_tar_of_an_image_folder_or_a_split_root_reads_as_the_folder(world, tmp_path):
    folder = stats(world / "images")
    assert stats(tar_folder(world / "images", tmp_path / "images.tar", wrapped=False)) == folder
    assert stats(tar_folder(world / "images", tmp_path / "wrapped.tar", wrapped=True)) == folder
    archive = tar_folder(world / "split", tmp_path / "split.tar", wrapped=False)
    for split in ("train", "val"):
        assert stats(archive, "--split", split) == stats(world / "split", "--split", split)


def test_a_tar_of_an_image_folder_named_like_a_shard_reads_as_the_folder(world, tmp_path):
    # `caltech-101.tar`, `photos-2024.tar` were read as unlabelled shards: one class in
    # dataset-stats, and eval and train asked for KEY.cls files.
    from torchkit.core.data.sources import open_data

    archive = tar_folder(world / "images", tmp_path / "caltech-101.tar", wrapped=False)
    assert stats(archive) == stats(world / "images")
    model = world / "model.pt"
    scores = [
        run_json("eval", "--model", model, "--data", d, "-j", "0")["top1"]  # read here: no worker
        for d in (archive, world / "images")
    ]
    assert scores[0] == scores[1]
    # A shard keeps its name's meaning where an image has a member of its sample beside it.
    png = (world / "images/a/a_0.png").read_bytes()
    labelled = {"a/x.png": png, "a/x.json": b'{"label": "b"}'}
    shard = tar_of(tmp_path / "labelled-000000.tar", labelled)
    assert open_data(str(shard)).whole.ids == ["labelled-000000.tar/a/x.png"]
    # Not a KEY.json that holds no label (an annotation tool's metadata), as in a tar of any
    # other name: it read as an unlabelled shard, its class folders lost without a word.
    for name in ("annotated-000000.tar", "annotated.tar"):
        annotated = {"a/x.png": png, "a/x.json": b'{"shapes": []}', "b/y.png": png}
        folder = open_data(str(tar_of(tmp_path / name, annotated)))
        assert (folder.classes, folder.whole.ids) == (["a", "b"], ["a/x.png", "b/y.png"])
    # So does one whose image has any other member beside it (a caption: no label).
    captioned = tar_of(tmp_path / "captioned-000000.tar", {"a/x.png": png, "a/x.txt": b"a caption"})
    assert open_data(str(captioned), allow_unlabelled=True).whole.ids == [
        "captioned-000000.tar/a/x.png"
    ]


def test_a_tar_of_thousands_of_class_folders_is_listed_in_linear_time(tmp_path):
    """Each class's images were found by a scan of every name in the archive: 1,000 classes of
    40 images took 20 s, ImageNet's 1,000 of 1,300 hours. 4,000 classes of one image: about
    0.15 s of CPU now, 4 s and more before."""
    import time

    from torchkit.core.data.sources import open_data

    archive = tar_of(tmp_path / "many.tar", {f"c{i:05d}/x.png": b"png" for i in range(4000)})
    started = time.process_time()  # CPU time, which other processes' load does not stretch
    data = open_data(str(archive))
    assert time.process_time() - started < 1.5
    assert len(data.classes) == 4000 and list(data.whole.labels[:3]) == [0, 1, 2]


def test_a_tar_of_a_split_of_a_flat_folder_reads_as_that_split(world, tmp_path):
    # OUT/train/x.png (what split writes for a flat folder), tarred: every reader stopped
    # ("X.tar:train holds images but no class folders") while the folder reads unlabelled.
    from torchkit.core.data.sources import open_data
    from torchkit.core.io.errors import InputError

    png = (world / "images" / "a" / "a_0.png").read_bytes()
    folder = tmp_path / "flat-split"
    for name in ("train/x.png", "train/y.png", "val/z.png"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(png)
    archive = tar_folder(folder, tmp_path / "flat-split.tar", wrapped=True)
    read = {}
    for data in (folder, archive):
        opened = open_data(str(data), allow_unlabelled=True)
        read[data] = (opened.classes, {s: part.ids for s, part in opened.splits.items()})
    assert (
        read[archive]
        == read[folder]
        == ([""], {"train": ["train/x.png", "train/y.png"], "val": ["val/z.png"]})
    )
    with pytest.raises(InputError, match="is a split of unlabelled images"):
        open_data(str(archive))  # train and eval need labels: one error


@pytest.mark.parametrize("wrapped", [False, True])
def test_a_split_root_whose_test_split_has_no_class_folders_reads_so_tarred(
    world, tmp_path, wrapped
):
    # test/x.png beside train/<class>/ (HF's unlabelled test split as a folder): every reader
    # stopped ("X.tar:test holds images but no class folders"), as the folder read did.
    from torchkit.core.data.sources import open_data, open_labelled

    png = (world / "images" / "a" / "a_0.png").read_bytes()
    folder = tmp_path / "with-test"
    for name in ("train/a/p.png", "train/b/q.png", "test/x.png", "test/y.png"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(png)
    archive = tar_folder(folder, tmp_path / "with-test.tar", wrapped=wrapped)
    read = {}
    for data in (folder, archive):
        opened = open_data(str(data), allow_unlabelled=True)
        labels = {s: [part.classes[i] for i in part.labels] for s, part in opened.splits.items()}
        read[data] = (opened.classes, {s: part.ids for s, part in opened.splits.items()}, labels)
    assert (
        read[archive]
        == read[folder]
        == (
            ["a", "b", ""],
            {"train": ["train/a/p.png", "train/b/q.png"], "test": ["test/x.png", "test/y.png"]},
            {"train": ["a", "b"], "test": ["", ""]},
        )
    )
    source, refused = open_labelled(str(archive))  # train and eval: the labelled splits
    assert source.splits["test"].has_unlabelled and not source.splits["train"].has_unlabelled
    assert refused.message == f"{archive}:test holds images but no class folders"


def test_split_shards_are_split_data_and_eval_reads_only_val(world):
    found = run_json(
        "eval", world / "model.pt", "--data", world / "split-shards", "--split", "val",
        "--device", "cpu", "-j", "0",
    )  # fmt: skip
    assert found["split"] == "val" and found["num_images"] == 6
    val = run_json(
        "eval", world / "model.pt", "--data", world / "split", "--split", "val", "--device", "cpu",
        "-j", "0",
    )  # fmt: skip
    assert found["accuracy"] == val["accuracy"] and found["loss"] == val["loss"]


def test_a_split_whose_shards_hold_no_sample_is_no_split_with_a_warning(world, tmp_path):
    """val-000000.tar of no member (a writer stopped before its first sample) was left out
    without a word: `--split val` said there is "no val split", and train held val out of
    train as though no val shard were there. Now it is said, as an empty val/ folder is."""
    folder = tmp_path / "split-shards"
    folder.mkdir()
    shutil.copy(world / "split-shards" / "train-000000.tar", folder)
    tar_of(folder / "val-000000.tar", {})
    read = run_torchkit_in_process("dataset-stats", folder, "-j", "0")
    assert read.returncode == 0, read.stderr
    assert (
        f"Warning: {folder}/val-000000.tar holds no images: {folder} is read without a val split"
    ) in read.stderr.splitlines()
    asked = run_torchkit_in_process("dataset-stats", folder, "-j", "0", "--split", "val")
    assert asked.returncode == 1
    assert error_line(asked.stderr) == (
        f"Error: no images in {folder}/val-000000.tar: the val split of {folder} is empty (it "
        "has: train; --split NAME picks another)"
    )


def tar_of(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_a_corrupt_image_in_a_shard_is_counted_unreadable(world, tmp_path):
    png = (world / "images" / "a" / "a_0.png").read_bytes()
    shard = tar_of(
        tmp_path / "s-000000.tar",
        {"x.png": png, "x.cls": b"0", "y.png": b"not a png", "y.cls": b"1"},
    )
    found = run_json("dataset-stats", shard)
    assert found["images"] == 1 and found["unreadable_count"] == 1
    strict = run_torchkit_in_process("dataset-stats", shard, "--strict")
    assert strict.returncode == 1
    assert "s-000000.tar/y.png" in error_line(strict.stderr)


def test_shards_of_some_samples_without_a_label_are_read_as_parquet_is(
    world, tmp_path, caplog, monkeypatch
):
    """A shard of one labelled and one unlabelled sample was refused by dataset-stats (and
    predict, extract-features), which need no labels, while parquet of some rows without a
    label is read unlabelled with a warning: now the one rule for both. train and eval still
    refuse it, and a bad label among them is still an error."""
    from torchkit.core.data.sources import open_data

    png = (world / "images" / "a" / "a_0.png").read_bytes()
    shard = tar_of(tmp_path / "s-000000.tar", {"x.png": png, "x.cls": b"0", "y.png": png})
    result = run_torchkit_in_process("dataset-stats", shard, "-j", "0", "--format", "json")
    assert result.returncode == 0, result.stderr
    # Each label kept (it was read all unlabelled: the class counts lost), as of parquet.
    assert json.loads(result.stdout)["classes"] == [
        {"name": "0", "index": 0, "images": 1},
        {"name": "", "index": 1, "images": 1},
    ]
    torchkit_log_to_caplog(caplog, monkeypatch)
    with caplog.at_level("WARNING", logger="torchkit"):
        assert open_data(str(shard), allow_unlabelled=True).classes == [""]
    assert caplog.messages == [
        f"{shard} has 1 sample(s) without a label (no KEY.cls, no label in KEY.json, or -1; "
        "sample y in s-000000.tar) among 1 labelled ones: its images are read unlabelled"
    ]
    with pytest.raises(InputError) as refused:  # train's and eval's reader
        open_data(str(shard))
    assert str(refused.value).startswith("sample y in s-000000.tar has no label (give each")
    # An index past classes.txt is an error in every command, labels read or not.
    (tmp_path / "classes.txt").write_text("a\n")
    tar_of(shard, {"x.png": png, "x.cls": b"3", "y.png": png})
    with pytest.raises(InputError, match="sample x in s-000000.tar has class index 3"):
        open_data(str(shard), allow_unlabelled=True)


@pytest.mark.parametrize(
    "damage, message",
    [
        ("truncated", "is truncated or damaged"),
        ("text", "is not a tar archive"),
        ("gzip", "is a compressed tar"),
        ("no samples", "s-000000.tar names: they hold no member named KEY.EXT (a sample is"),
        ("missing shard", "shard not found: "),
        ("huge class index", "sample y in s-000000.tar has class index 250,000,000"),
        ("huge pattern", "names 100,000,000,000 shards"),
        ("5,000-digit cls", "y.cls holds '11111111111111111111', not a class index"),
        ("deep json", "y.json is not JSON"),
    ],
)
def test_bad_shards_are_one_error_line(world, tmp_path, damage, message):
    shard = tmp_path / "s-000000.tar"
    good = world / "shards" / "shard-000001.tar"
    data: object = shard
    if damage == "truncated":
        shard.write_bytes(good.read_bytes()[:4000])
    elif damage == "text":
        shard.write_text("hello, I am not a tar\n" * 40)
    elif damage == "gzip":
        import gzip

        shard.write_bytes(gzip.compress(good.read_bytes()))
    elif damage == "no samples":
        tar_of(shard, {})
    elif damage == "missing shard":
        shutil.copy(good, shard)
        data = tmp_path / "s-{000000..000002}.tar"
    elif damage == "huge pattern":  # a typo that took all memory to list
        shutil.copy(good, shard)
        data = tmp_path / "s-{0..99999999999}.tar"
    elif damage in ("5,000-digit cls", "deep json"):  # were a ValueError, a RecursionError
        png = (world / "images" / "a" / "a_0.png").read_bytes()
        bad = {"y.cls": b"1" * 5000} if damage.endswith("cls") else {"y.json": b"[" * 100_000}
        tar_of(shard, {"x.png": png, "x.cls": b"0", "y.png": png, **bad})
    elif damage == "huge class index":  # no class names: "0".."N" took all memory
        png = (world / "images" / "a" / "a_0.png").read_bytes()
        tar_of(shard, {"x.png": png, "x.cls": b"0", "y.png": png, "y.cls": b"250000000"})
    else:
        png = (world / "images" / "a" / "a_0.png").read_bytes()
        tar_of(shard, {"x.png": png, "x.cls": b"0", "y.png": png})
    result = run_torchkit_in_process("dataset-stats", data)
    assert result.returncode == 1
    line = error_line(result.stderr)
    assert message in line, line
    if damage not in ("missing shard", "huge pattern"):
        assert str(shard) in line or shard.name in line, line


@pytest.mark.parametrize("named", ["twice", "as ./", "in braces", "through a link"])
def test_a_shard_named_twice_is_one_error_line(world, tmp_path, named):
    """A shard list naming one shard twice read its samples twice: dataset-stats counted 10
    images of 5, eval scored each twice, and train's held-out val took copies of train."""
    folder = tmp_path / "shards"
    shutil.copytree(world / "shards", folder)
    first = folder / "shard-000000.tar"
    data = {
        "twice": f"{first}::{first}",
        "as ./": f"{first}::{folder}/./shard-000000.tar",
        "in braces": f"{folder}/shard-{{000000,000001,000000}}.tar",
        "through a link": f"{first}::{folder}/shard-000009.tar",
    }[named]
    (folder / "shard-000009.tar").symlink_to("shard-000000.tar")
    result = run_torchkit_in_process("dataset-stats", data, "-j", "0")
    assert result.returncode == 1
    line = error_line(result.stderr)
    said = "shard-000000.tar twice"
    if named == "through a link":
        said = "one shard twice, as shard-000000.tar and shard-000009.tar"
    assert f"{data} names {said}" in line, line
    assert "counted twice: name each shard once" in line, line


def test_a_shard_linked_into_a_second_split_is_refused_and_reported_by_dataset_stats(
    world, tmp_path
):
    """val-000000.tar -> train-000000.tar: train validated (and eval scored) on training
    samples without a word. Now every reader refuses it, and dataset-stats' leakage check
    lists each sample as one file under two names (same_file), as for a linked folder."""
    from torchkit.core.data.sources import open_data

    folder = tmp_path / "split-shards"
    folder.mkdir()
    shutil.copy(world / "split-shards" / "train-000000.tar", folder)
    (folder / "val-000000.tar").symlink_to("train-000000.tar")
    with pytest.raises(InputError, match=r"train-000000.tar and val-000000.tar are one file in "
                       r"two splits, train and val \(its samples would leak"):  # fmt: skip
        open_data(str(folder))
    result = run_torchkit_in_process(
        "dataset-stats", folder, "-j", "0", "--split", "all", "--leakage-csv", tmp_path / "p.csv"
    )
    assert result.returncode == 0, result.stderr
    with (tmp_path / "p.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    with tarfile.open(folder / "train-000000.tar") as shard:
        keys = sorted(name.split(".")[0] for name in shard.getnames())
    assert [(r["path_a"], r["path_b"], r["same_file"]) for r in rows] == [
        (f"train-000000.tar/{key}.png", f"val-000000.tar/{key}.png", "true")
        for key in dict.fromkeys(keys)
    ]


@pytest.mark.parametrize("label", ["-2", "1.5", "true", '""', "[0]"])
def test_a_json_label_that_is_no_class_is_one_error_line(world, tmp_path, label):
    # Every sample labelled -2 (or 1.5, true) was read silently as unlabelled data.
    png = (world / "images" / "a" / "a_0.png").read_bytes()
    bad = f'{{"label": {label}}}'.encode()
    shard = tar_of(tmp_path / "s-000000.tar", {"x.png": png, "x.json": bad})
    result = run_torchkit_in_process("dataset-stats", shard)
    assert result.returncode == 1
    assert 'x in s-000000.tar: x.json has "label": ' in error_line(result.stderr)


def test_a_json_or_cls_label_of_minus_one_is_no_label_as_in_parquet(world, tmp_path):
    # HF's "no label" (an unlabelled test split): unlabelled data, where that is allowed. A
    # KEY.cls of -1 (webdataset's ShardWriter writes {"cls": -1} so) was "not a class index".
    png = (world / "images" / "a" / "a_0.png").read_bytes()
    members = {"x.png": png, "x.json": b'{"label": -1}', "y.png": png, "y.json": b'{"cls": -1}'}
    members |= {"z.png": png, "z.cls": b"-1"}
    shard = tar_of(tmp_path / "s-000000.tar", members)
    assert [c["name"] for c in stats(shard)["classes"]] == [""]


def test_unlabelled_shards_train_only_as_a_test_split_and_say_they_are_unlabelled(tmp_path):
    # Shards `convert shards` wrote of unlabelled images were refused by train with "give each
    # sample a KEY.cls": the hint now says what reads them; an unlabelled test split beside
    # labelled train and val shards (HF's) was refused the same way and now trains.

    def shard(name: str, labels: list[int | None]) -> None:
        members = {}
        for i, label in enumerate(labels):
            members[f"{i}.png"] = _png(8 + i)
            if label is not None:
                members[f"{i}.cls"] = str(label).encode()
        tar_of(data / name, members)

    data = tmp_path / "shards"
    data.mkdir()
    shard("train-000000.tar", [0, 1, 0, 1])
    shard("val-000000.tar", [0, 1])
    shard("test-000000.tar", [None, None])
    result = run_torchkit_in_process(
        "train", "--data", data, "--model", "convnet", "--image-size", "8", "--epochs", "1",
        "--workers", "0", "--device", "cpu", "--out", tmp_path / "run",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "has no labels: best.pt is not tested" in result.stderr
    alone = run_torchkit_in_process(
        "train", "--data", data / "test-000000.tar", "--model", "convnet"
    )
    assert alone.returncode == 1
    line = error_line(alone.stderr)
    assert "sample 0 in test-000000.tar has no label (2 samples have none)" in line
    assert "the shards hold unlabelled images, which predict, extract-features and " in line


def test_names_and_indices_paired_in_the_samples_label_as_webdataset_reads_cls(world, tmp_path):
    """Without classes.txt the names were sorted: `dog` (KEY.cls 0) became class 2, so a
    model's output i was not the class i webdataset's reader (and the exported model's user)
    takes from KEY.cls. The pairs the samples hold now give the order."""
    import webdataset as wds

    from torchkit.core.data.sources import open_data

    png = (world / "images" / "a" / "a_0.png").read_bytes()
    shard = tmp_path / "pets-000000.tar"
    names = ["dog", "cat", "bird"]
    with wds.TarWriter(str(shard)) as sink:
        for i in range(6):
            sink.write(
                {"__key__": f"s{i}", "png": png, "cls": i % 3, "json": {"label": names[i % 3]}}
            )
    source = open_data(str(shard))
    assert source.classes == names
    read = [int(s["cls"]) for s in wds.WebDataset(str(shard), shardshuffle=False)]
    assert source.whole.labels == read == [0, 1, 2, 0, 1, 2]


def test_a_whole_number_float_json_label_is_a_class_index(world, tmp_path):
    png = (world / "images" / "a" / "a_0.png").read_bytes()
    members = {"x.png": png, "x.json": b'{"label": 1.0}', "y.png": png, "y.json": b'{"cls": 0}'}
    shard = tar_of(tmp_path / "s-000000.tar", members)
    counts = {c["name"]: c["images"] for c in stats(shard)["classes"]}
    assert counts == {"0": 1, "1": 1}


@pytest.mark.parametrize("classes_file", ["classes.txt", "classes.json"])
def test_a_class_index_and_a_label_naming_two_classes_of_the_class_file_are_refused(
    world, tmp_path, classes_file
):
    """With classes.txt [a, b], `cls` 1 beside "label": "a" was read as a, silently, while
    webdataset's reader takes 1 (a model trained on it: every such sample's output swapped)."""
    import webdataset as wds

    png = (world / "images" / "a" / "a_0.png").read_bytes()
    folder = tmp_path / "shards"
    folder.mkdir()
    (folder / classes_file).write_text("a\nb\n" if classes_file == "classes.txt" else '["a", "b"]')
    members = {"x.png": png, "x.cls": b"0", "x.json": b'{"label": "a"}'}
    members |= {"y.png": png, "y.cls": b"1", "y.json": b'{"label": "a"}'}
    members |= {"z.png": png, "z.cls": b"0", "z.json": b'{"label": "b"}'}
    shard = tar_of(folder / "s-000000.tar", members)
    assert [int(s["cls"]) for s in wds.WebDataset(str(shard), shardshuffle=False)] == [0, 1, 0]
    result = run_torchkit_in_process("dataset-stats", folder, "--workers", "0")
    assert result.returncode == 1
    assert error_line(result.stderr, besides="nothing") == (
        f"Error: sample y in s-000000.tar has class index 1, which {classes_file} names 'b', "
        f"and the label 'a', class 0 of {classes_file}; 2 samples disagree so (fix the "
        'sample\'s KEY.cls or its KEY.json "label", whichever is wrong: webdataset reads the '
        "index)"
    )


def test_shards_beside_a_folder_are_said_to_be_so_and_a_stray_tar_in_an_image_folder_is_not(
    world, tmp_path
):
    """A folder of shards that also held `old/` (older shards) was read as an image folder:
    `Error: no images in DIR`, not naming the shards nor what to do."""
    shards = tmp_path / "shards"
    shutil.copytree(world / "shards", shards)
    (shards / "old").mkdir()
    shutil.copy(shards / "shard-000000.tar", shards / "old")
    for command in (("dataset-stats", shards, "--workers", "0"), ("train", "--data", shards)):
        result = run_torchkit_in_process(*command)
        assert result.returncode == 1
        assert error_line(result.stderr, besides="nothing") == (
            f"Error: {shards} holds .tar shards (shard-000000.tar, shard-000001.tar, "
            "shard-000002.tar, ... 4 in all) beside a folder (old/): a folder of shards holds "
            "no folder, and as an image folder it holds no images (move old/ out of it to read "
            f"it as a folder of shards, or name the shards with a pattern, {shards}/NAME-"
            "{000000..000009}.tar)"
        )
    images = tmp_path / "images"
    shutil.copytree(world / "images", images)
    shutil.copy(shards / "shard-000000.tar", images / "backup.tar")  # not named as a shard
    assert stats(images)["images"] == 18


def test_shards_beside_images_are_refused_as_a_guess(world, tmp_path):
    """A folder of shards holding a subfolder of images (`previews/`) was read as an image
    folder of one class, `previews`, the shards left out with a warning alone: `train` trained
    on it. A shard-named `.tar` beside class folders is as much a guess."""
    from torchkit.core.data.sources import open_data

    shards = tmp_path / "shards"
    shutil.copytree(world / "shards", shards)
    write_image_folder(shards / "previews", {"x": 1})
    result = run_torchkit_in_process("dataset-stats", shards, "--workers", "0")
    assert result.returncode == 1 and result.stdout == ""
    line = error_line(result.stderr, besides="nothing")
    assert line == (
        f"Error: {shards} holds WebDataset shards (shard-000000.tar, shard-000001.tar, "
        "shard-000002.tar and 1 more) and images (previews/): which of them is the data is a "
        f"guess (name the shards, '{shards}/shard-{{000000..000003}}.tar', or move the images "
        f"or the .tar files out of {shards})"
    )
    # The pattern the hint gives, pasted into a shell, is one word (quoted: bare, the shell
    # expanded its braces into four, three of them extra arguments) and reads the shards
    # (classes.txt beside them names the classes).
    pasted = shlex.split(line.split("name the shards, ")[1].split(", or move")[0])
    assert pasted == [f"{shards}/shard-{{000000..000003}}.tar"]
    assert stats(*pasted)["images"] == 18
    images = tmp_path / "images"
    shutil.copytree(world / "images", images)
    shutil.copy(shards / "shard-000000.tar", images)
    with pytest.raises(InputError, match=r"holds WebDataset shards \(shard-000000.tar\) and "):
        open_data(str(images))


def test_shards_written_again_in_place_are_read_from_the_new_files(world, tmp_path):
    # A process kept the descriptor of each shard it had read: opened again after `convert
    # shards --force` rewrote them, the new listing's offsets were read from the replaced file
    # (a .cls holding an image's bytes, or the wrong image).
    from torchkit.core.data.sources import open_data

    first, second = (world / "images" / "a" / "a_0.png").read_bytes(), _png(16)
    shard = tar_of(tmp_path / "s-000000.tar", {"x.png": first, "x.cls": b"0"})
    assert open_data(str(shard)).whole.paths[0].read_bytes() == first
    tar_of(tmp_path / "new.tar", {"x.png": second, "x.cls": b"1"})
    (tmp_path / "new.tar").replace(shard)
    again = open_data(str(shard))
    assert again.whole.labels == [1] and again.whole.paths[0].read_bytes() == second


def test_a_shard_written_again_while_a_run_reads_it_is_one_error_not_other_images(tmp_path):
    """webdataset's TarWriter writes a shard again in place (a worker opening one that `convert
    shards --force` renamed over it alike): the listed offsets then held the new shard's
    images, read under the listed labels without a word."""
    from torchkit.core.data.sources import open_data
    from torchkit.core.data.stored_image import StoredReadError

    dark, light = (b"P6\n2 2\n255\n" + bytes([value]) * 12 for value in (0, 255))
    shard = tar_of(tmp_path / "s-000000.tar", {"x.ppm": dark, "x.cls": b"0"})
    samples = open_data(str(shard)).whole
    tar_of(shard, {"y.ppm": light, "y.cls": b"1"})  # the same offsets and sizes
    with pytest.raises(StoredReadError, match="s-000000.tar was written again after it was"):
        samples.paths[0].read_bytes()


def test_a_shard_under_another_inode_with_its_size_and_mtime_is_read(tmp_path, monkeypatch):
    """FUSE mounts without stable inode numbers (sshfs without `use_ino`) give one file another
    inode on each open, as a `cp -p` copy renamed over it does: the same bytes, read as listed
    by a loader worker, which opens the shard itself."""
    from torchkit.core.data.sources import open_data, shards

    dark = b"P6\n2 2\n255\n" + bytes(12)
    shard = tar_of(tmp_path / "s-000000.tar", {"x.ppm": dark, "x.cls": b"0"})
    samples = open_data(str(shard)).whole
    copy = tmp_path / "copy.tar"
    shutil.copy2(shard, copy)  # its size and mtime, another inode
    os.replace(copy, shard)
    monkeypatch.setattr(shards, "_descriptors_pid", -1)  # a forked worker: its own descriptors
    assert samples.paths[0].read_bytes() == dark


def _png(size: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (size, size), (1, 2, 3)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_two_ddp_ranks_over_uneven_shards_see_every_sample(tmp_path):
    """25 train samples in 5 shards of 1, 3, 5, 7 and 9: each rank sees 13 (DistributedSampler's
    padding: the order is repeated up to a multiple of the world size), together every sample
    once and one of them twice."""
    from PIL import Image

    shards = tmp_path / "shards"
    shards.mkdir()
    level = 0
    for number, count in enumerate((1, 3, 5, 7, 9)):
        members = {}
        for _ in range(count):
            buffer = io.BytesIO()
            Image.new("RGB", (8, 8), (level * 9, level * 9, level * 9)).save(buffer, "PNG")
            members[f"{level:03d}.png"] = buffer.getvalue()
            members[f"{level:03d}.cls"] = str(level % 2).encode()
            level += 1
        tar_of(shards / f"train-{number:06d}.tar", members)
    tar_of(shards / "val-000000.tar", {"v.png": members["024.png"], "v.cls": b"0"})
    seen = tmp_path / "seen"
    seen.mkdir()
    done = run_ranks(
        "train", "--data", shards, "--model", "nets:SeenNet", "--image-size", "8",
        "--augment", "none", "--epochs", "1", "--batch-size", "2", "--workers", "0",
        "--device", "cpu", "--out", tmp_path / "run", timeout=240,
        env={"TORCHKIT_TEST_SEEN_DIR": str(seen)},  # a tests' switch: the ranks still fork
    )  # fmt: skip
    assert [rank.returncode for rank in done] == [0, 0], stderr_of(done)[-3000:]
    ranks = [(seen / f"rank-{rank}.txt").read_text().split() for rank in (0, 1)]
    assert [len(values) for values in ranks] == [13, 13]
    every = ranks[0] + ranks[1]
    assert len(set(every)) == 25


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("classes.txt", "a\n\nb\n", "line 2 of {folder}/classes.txt is blank, between class names"),
        ("classes.txt", "a\r\n \t\r\nb\r\n", "line 2 of {folder}/classes.txt is blank"),
        ("classes.json", '["a", "", "b"]', "{folder}/classes.json names class 1 '', an empty"),
        ("classes.json", '{"a": 0, " ": 1}', "{folder}/classes.json names class 1 ' ', an empty"),
        # sorted() of the indices raised a TypeError: a traceback
        ("classes.json", '{"a": 0, "b": "1"}', "{folder}/classes.json is neither a list of"),
    ],
)
def test_a_class_file_that_would_shift_or_lose_a_name_is_refused(
    world, tmp_path, name, text, message
):
    """Label i is line i of classes.txt: a blank line between names was skipped, so every later
    class took the name of the next (a mislabelled model or report). A classes.json entry ""
    is a class without a name, which classes.txt cannot hold."""
    from torchkit.core.data.sources import open_data
    from torchkit.core.io.errors import InputError

    png = (world / "images" / "a" / "a_0.png").read_bytes()
    folder = tmp_path / "shards"
    folder.mkdir()
    tar_of(folder / "s-000000.tar", {"x.png": png, "x.cls": b"0", "y.png": png, "y.cls": b"1"})
    (folder / name).write_text(text)
    with pytest.raises(InputError) as refused:
        open_data(str(folder))
    assert str(refused.value).startswith(message.format(folder=folder)), refused.value
    # Blank lines before the first name and after the last, spaces and Windows line ends: fine.
    (folder / name).unlink()
    (folder / "classes.txt").write_text("\n\na \r\nb\r\n\t\r\n\n")
    assert open_data(str(folder)).classes == ["a", "b"]


def test_a_compressed_shard_beside_tar_shards_is_said_to_be_compressed(world, tmp_path):
    """A folder of `.tar` shards and one `.tar.gz` (a shard gzipped to save room) was refused as
    one of shards and "other files", asking for a pattern that would leave it out."""
    import gzip

    folder = tmp_path / "shards"
    folder.mkdir()
    png = (world / "images" / "a" / "a_0.png").read_bytes()
    tar_of(folder / "s-000000.tar", {"x.png": png, "x.cls": b"0"})
    second = tar_of(tmp_path / "s-000001.tar", {"y.png": png, "y.cls": b"1"})
    (folder / "s-000001.tar.gz").write_bytes(gzip.compress(second.read_bytes()))
    result = run_torchkit_in_process("dataset-stats", folder)
    assert result.returncode == 1
    assert error_line(result.stderr) == (
        f"Error: {folder / 's-000001.tar.gz'} is a compressed tar (shards are read in place: "
        "decompress it to a .tar)"
    )


def test_a_text_file_listing_shards_says_how_to_read_them(world, tmp_path):
    """A `shards.txt` of one shard a line (some tools write one beside the shards) was "neither
    a folder nor a CSV index", naming no way to read them; the hint, followed, reads them."""
    png = (world / "images" / "a" / "a_0.png").read_bytes()
    (tmp_path / "data").mkdir()
    for i in range(2):
        tar_of(tmp_path / "data" / f"s-00000{i}.tar", {f"x{i}.png": png, f"x{i}.cls": b"0"})
    listed = tmp_path / "data" / "shards.txt"
    listed.write_text("s-000000.tar\ns-000001.tar\n")
    result = run_torchkit_in_process("dataset-stats", "data/shards.txt", cwd=tmp_path)
    assert result.returncode == 1
    line = error_line(result.stderr)
    assert line == (
        "Error: data/shards.txt lists 2 shards, one a line, which torchkit does not read as a "
        "list (join them with ::, as --data data/s-000000.tar::data/s-000001.tar, or name them "
        "with a pattern, DIR/NAME-{000000..000009}.tar)"
    )
    example = line.split("--data ")[1].split(",")[0]
    followed = run_torchkit_in_process(
        "dataset-stats", "--data", example, "--format", "json", cwd=tmp_path
    )
    assert followed.returncode == 0, followed.stderr
    assert json.loads(followed.stdout)["images"] == 2
    # A text file of anything else is what it was.
    (tmp_path / "notes.txt").write_text("s-000000.tar\nnot a shard\n")
    other = run_torchkit_in_process("dataset-stats", "notes.txt", cwd=tmp_path)
    assert "notes.txt is neither a folder nor a CSV index" in error_line(other.stderr)


def test_the_shard_list_hint_quotes_a_folder_with_a_space_as_one_shell_word(world, tmp_path):
    """The hint's `--data A::B` is pasted into a shell: under `my data/` it was written
    unquoted, two words (`--data my` and `data/s-000000.tar::my`), read as no data."""
    png = (world / "images" / "a" / "a_0.png").read_bytes()
    (tmp_path / "my data").mkdir()
    for i in range(2):
        tar_of(tmp_path / "my data" / f"s-00000{i}.tar", {f"x{i}.png": png, f"x{i}.cls": b"0"})
    (tmp_path / "my data" / "shards.txt").write_text("s-000000.tar\ns-000001.tar\n")
    result = run_torchkit_in_process("dataset-stats", "my data/shards.txt", cwd=tmp_path)
    line = error_line(result.stderr)
    assert "as --data 'my data/s-000000.tar::my data/s-000001.tar', or name" in line, line
    words = shlex.split(line.split("as --data ")[1].split(", or name")[0])
    assert words == ["my data/s-000000.tar::my data/s-000001.tar"]
    followed = run_torchkit_in_process(
        "dataset-stats", "--data", *words, "--format", "json", cwd=tmp_path
    )
    assert followed.returncode == 0, followed.stderr
    assert json.loads(followed.stdout)["images"] == 2


def test_a_sample_of_two_members_of_one_extension_names_both(world, tmp_path):
    """`000.PNG` beside `000.png`: the error said the shard held `000.png` twice, a name
    `tar -tf` lists once."""
    png = (world / "images" / "a" / "a_0.png").read_bytes()
    shard = tar_of(tmp_path / "s-000000.tar", {"000.PNG": png, "000.cls": b"0", "000.png": png})
    result = run_torchkit_in_process("dataset-stats", shard)
    assert result.returncode == 1
    assert error_line(result.stderr) == (
        "Error: s-000000.tar holds 000.PNG and 000.png, two .png members of sample 000 (one "
        "member per extension a sample: remove or rename one)"
    )
