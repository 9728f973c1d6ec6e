"""The one data resolver through the commands (issue #15): train on a split manifest and on a
root without val/ (split.csv and the checkpoint's record), resume keeping the split, special
files in a CSV (a FIFO never opened, so never waited on), dataset-stats --split, split's input."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from checkpoints import read_checkpoint
from disks import fifo_never_opened
from image_folders import write_image_folder
from output_checks import error_line
from PIL import Image
from processes import run_torchkit_in_process

from torchkit.cli import app
from torchkit.core.data.sources import open_data, select_split
from torchkit.core.models.checkpoint import CHECKPOINT_KEYS

TINY = ["--model", "convnet", "--image-size", "8", "--batch-size", "4", "--workers", "0"]
ONE_EPOCH = [*TINY, "--epochs", "1"]


def rows_of(path: Path) -> list[dict]:
    with path.open(newline="", encoding="utf-8-sig") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture
def cifar_like(tmp_path: Path) -> Path:
    root = tmp_path / "cifar"
    write_image_folder(root / "train", {"cat": 10, "dog": 10}, seed=1)
    write_image_folder(root / "test", {"cat": 2, "dog": 2}, seed=2)
    return root


def test_train_on_a_split_manifest_with_bom_uses_its_rows(runner, tmp_path):
    write_image_folder(tmp_path / "images", {"ant": 5, "bee": 5})
    rows = [("train", range(3)), ("val", range(3, 4)), ("test", range(4, 5))]
    lines = [
        f"images/{c}/{c}_{i}.png,{c},{split}"
        for split, ids in rows
        for c in ("ant", "bee")
        for i in ids
    ]
    manifest = tmp_path / "manifest.csv"
    manifest.write_bytes(
        b"\xef\xbb\xbf" + ("path,label,split\n" + "\n".join(lines) + "\n").encode()
    )
    out = tmp_path / "run"
    result = runner.invoke(app, ["train", "--data", str(manifest), *ONE_EPOCH, "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["data_sizes"] == {"train": 6, "val": 2, "test": 2}
    assert config["data"]["kind"] == "split csv" and config["data"]["split_csv"] == "split.csv"
    assert config["data"]["root"] == str(tmp_path.resolve())
    written = rows_of(out / "split.csv")
    assert sorted((r["path"], r["label"], r["split"]) for r in written) == sorted(
        tuple(line.split(",")) for line in lines
    )
    assert all((tmp_path / r["path"]).is_file() for r in written)  # relative to the data root
    best = read_checkpoint(out / "best.pt")
    assert set(CHECKPOINT_KEYS) <= set(best)
    assert best["data"]["spec"] == str(manifest) and best["data"]["held_out"] == {}


def test_a_root_without_val_trains_and_records_the_held_out_images(runner, cifar_like, tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(
        app, ["train", "--data", str(cifar_like), *ONE_EPOCH, "--out", str(out), "--format", "json"]
    )
    assert result.exit_code == 0, result.stderr
    assert "has no val split (train, test): holding out 0.1 of its train split" in result.stderr
    summary = json.loads(result.stdout)
    assert (summary["train_size"], summary["val_size"], summary["test_size"]) == (18, 2, 4)
    written = rows_of(out / "split.csv")
    assert [r["split"] for r in written].count("val") == 2 and len(written) == 24
    val_ids = [r["path"] for r in written if r["split"] == "val"]
    assert all(p.startswith("train/") for p in val_ids)  # held out of train/

    record = read_checkpoint(out / "best.pt")["data"]
    assert record["held_out"] == {"val": val_ids} and record["held_out_of"] == "train"
    assert record["root"] == str(cifar_like.resolve())
    # What eval / extract-features will do with `--data ROOT --split val` and this checkpoint.
    val, _ = select_split(open_data(cifar_like), "val", default="test", recorded=record)
    assert val.ids == val_ids


def test_resume_keeps_the_recorded_split_when_files_were_added(runner, tmp_path):
    data = write_image_folder(tmp_path / "flat", {"x": 10, "y": 10})
    out = tmp_path / "run"
    args = ["train", "--data", str(data), *TINY, "--val-split", "0.2", "--out", str(out)]
    first = runner.invoke(app, [*args, "--epochs", "1"])
    assert first.exit_code == 0, first.stderr
    before = rows_of(out / "split.csv")
    for i in range(5):  # new images: a fresh split of 25 would hold out other ones
        Image.new("RGB", (8, 8), (i * 40, 0, 0)).save(data / "x" / f"new_{i}.png")
    resumed = runner.invoke(app, ["train", "--resume", str(out), "--epochs", "2"])
    assert resumed.exit_code == 0, resumed.stderr
    after = rows_of(out / "split.csv")
    val = [r["path"] for r in before if r["split"] == "val"]
    assert [r["path"] for r in after if r["split"] == "val"] == val
    assert len(after) == 25  # the new images train
    assert read_checkpoint(out / "last.pt")["data"]["held_out"] == {"val": val}


def test_a_fifo_and_a_dangling_link_in_a_csv_are_counted_unreadable_not_opened(tmp_path):
    write_image_folder(tmp_path / "images", {"a": 4, "b": 4})
    (tmp_path / "images" / "gone.png").symlink_to(tmp_path / "nowhere.png")
    lines = [
        f"images/{c}/{c}_{i}.png,{c},{'val' if i == 3 else 'train'}" for c in "ab" for i in range(4)
    ]
    lines += ["images/pipe.png,a,train", "images/gone.png,b,train"]
    index = tmp_path / "index.csv"
    index.write_text("path,label,split\n" + "\n".join(lines) + "\n")

    out = tmp_path / "run"
    with fifo_never_opened(tmp_path / "images" / "pipe.png"):  # opening it would block
        trained = run_torchkit_in_process(
            "train", "--data", index, *ONE_EPOCH, "--out", out, "--format", "json"
        )
        stats = run_torchkit_in_process("dataset-stats", index, "--format", "json", "-j", "0")
    assert trained.returncode == 0, trained.stderr
    assert json.loads(trained.stdout)["skipped_images"] == 2
    assert "pipe.png: not a regular file (a FIFO)" in trained.stderr
    assert "gone.png: not a regular file (a symbolic link to nothing)" in trained.stderr

    assert stats.returncode == 0, stats.stderr
    report = json.loads(stats.stdout)
    assert report["split"] == "train" and report["images"] == 6
    assert {u["path"]: u["error"] for u in report["unreadable"]} == {
        "images/pipe.png": "not a regular file (a FIFO)",
        "images/gone.png": "not a regular file (a symbolic link to nothing)",
    }


def test_dataset_stats_on_a_split_root_measures_train_by_default(runner, tmp_path):
    root = tmp_path / "data"
    write_image_folder(root / "train", {"cat": 3, "dog": 2}, seed=1)
    write_image_folder(root / "val", {"cat": 1, "dog": 1}, seed=2)
    write_image_folder(root / "test", {"cat": 1, "dog": 2}, seed=3)
    (root / "val" / "notes.txt").write_text("not an image")

    def stats(*args: str) -> tuple[dict, str]:
        result = runner.invoke(
            app, ["dataset-stats", str(root), "-j", "0", "--format", "json", *args]
        )
        assert result.exit_code == 0, result.stderr
        return json.loads(result.stdout), result.stderr

    default, stderr = stats()
    assert "using train (normalisation statistics come from training data only" in stderr
    assert "--split all takes every split" in stderr
    assert default["split"] == "train" and default["images"] == 5
    assert default["classes"] == [
        {"name": "cat", "index": 0, "images": 3},
        {"name": "dog", "index": 1, "images": 2},
    ]
    assert default["non_image_files"] == 0  # val/notes.txt is not in train/
    everything, stderr = stats("--split", "all")
    assert "Note:" not in stderr and everything["split"] == "all"
    assert everything["classes"] == [
        {"name": "cat", "index": 0, "images": 5},
        {"name": "dog", "index": 1, "images": 5},
    ]
    assert everything["non_image_files"] == 1
    val, _ = stats("--split", "val")
    assert (val["split"], val["images"]) == ("val", 2)
    assert stats("--split", "train")[0]["mean"] == default["mean"] != everything["mean"]

    folder = root / "train"  # an image folder: --split cannot apply
    refused = runner.invoke(app, ["dataset-stats", str(folder), "--split", "val"])
    assert refused.exit_code == 2
    assert "--split val: " in error_line(refused.stderr) and "is not split data" in refused.stderr
    plain = runner.invoke(app, ["dataset-stats", str(folder), "--format", "json", "-j", "0"])
    assert plain.exit_code == 0 and json.loads(plain.stdout)["split"] is None


def test_a_split_root_whose_test_split_has_no_class_folders_reads_it_unlabelled(runner, tmp_path):
    # ROOT/test/x.png beside ROOT/{train,val}/<class>/: the folder form of HF's unlabelled test
    # split was refused by every reader ("ROOT/test holds images but no class folders").
    root = tmp_path / "data"
    write_image_folder(root / "train", {"a": 4, "b": 4}, seed=1)
    write_image_folder(root / "val", {"a": 1, "b": 1}, seed=2)
    write_image_folder(root / "test", {"x": 3}, seed=3)
    for image in (root / "test" / "x").iterdir():
        image.rename(root / "test" / image.name)
    (root / "test" / "x").rmdir()

    def run(*args: object) -> object:
        return runner.invoke(app, [str(arg) for arg in args])

    stats = run("dataset-stats", root, "--split", "all", "-j", "0", "--format", "json")
    assert stats.exit_code == 0, stats.stderr
    counts = {row["name"]: row["images"] for row in json.loads(stats.stdout)["classes"]}
    assert counts == {"a": 5, "b": 5, "": 3}
    out = tmp_path / "run"
    trained = run("train", "--data", root, *ONE_EPOCH, "--out", out, "--format", "json")
    assert trained.exit_code == 0, trained.stderr
    assert "has no labels: best.pt is not tested" in trained.stderr
    assert json.loads(trained.stdout)["test_top1"] is None
    assert {r["split"] for r in rows_of(out / "split.csv")} == {"train", "val"}
    refused = run("eval", out / "best.pt", "--data", root)  # the default test split
    assert refused.exit_code == 1
    assert f"{root / 'test'} holds images but no class folders" in error_line(refused.stderr)
    assert "--split val scores a labelled split" in refused.stderr
    predicted = run("predict", out / "best.pt", root, "--format", "csv", "-j", "0")
    assert predicted.exit_code == 0, predicted.stderr
    labels = {r["path"]: r["label"] for r in csv.DictReader(predicted.stdout.splitlines())}
    assert labels["train/a/a_0.png"] == "a" and labels["test/x_0.png"] == ""
    assert len(labels) == 13

    # A flat val/ (or train/) still keeps train from running: one line naming the split.
    (root / "test").rename(tmp_path / "unlabelled")
    (root / "val").rename(root / "test")
    (tmp_path / "unlabelled").rename(root / "val")
    refused = run("train", "--data", root, *ONE_EPOCH, "--out", tmp_path / "run2")
    assert refused.exit_code == 1
    assert f"the val split of {root} has 3 image(s) without a label" in error_line(refused.stderr)


def test_split_reads_a_bom_csv_and_refuses_data_that_is_split_already(runner, tmp_path):
    write_image_folder(tmp_path / "in" / "images", {"a": 5, "b": 5})
    lines = [f"images/{c}/{c}_{i}.png,{c}" for c in "ab" for i in range(5)]
    index = tmp_path / "in" / "index.csv"
    index.write_bytes(b"\xef\xbb\xbf" + ("path,label\n" + "\n".join(lines) + "\n").encode())
    out = tmp_path / "out"
    result = runner.invoke(
        app, ["split", str(index), str(out), "--mode", "manifest", "--format", "json"]
    )
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["files"] == 10
    manifest = rows_of(out / "split.csv")
    assert list(manifest[0]) == ["path", "label", "split", "source"]
    assert open_data(out / "split.csv").kind == "split csv"  # train takes it as it is

    again = runner.invoke(app, ["split", str(out / "split.csv"), str(tmp_path / "again")])
    assert again.exit_code == 1
    assert "is split already" in error_line(again.stderr)
    root = tmp_path / "root"
    write_image_folder(root / "train", {"a": 2})
    write_image_folder(root / "val", {"a": 1})
    refused = runner.invoke(app, ["split", str(root), str(tmp_path / "out2")])
    assert refused.exit_code == 1
    assert "(split root: train, val) is split already" in error_line(refused.stderr)
    assert not (tmp_path / "out2").exists()
