"""The README's pipeline, end to end on small generated data: split (manifest) -> dataset-stats
-> train -> eval -> extract-features -> predict -> a pandas join on `path`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from eval_plots import lay_out_eval_plots_only
from PIL import Image

from torchkit.cli import app

CLASSES = ("ant", "bee", "cow")


def make_dataset(root, per_class: int = 10) -> None:
    rng = np.random.default_rng(0)
    for label, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 80, (8, 8, 3), dtype=np.uint8) + 80 * label
            Image.fromarray(pixels.astype(np.uint8)).save(root / name / f"{name}_{i}.png")


def ok(runner, *args: str):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.stderr
    return result


FAST = ("--model", "convnet", "--image-size", "8", "--epochs", "1", "-j", "0", "--device", "cpu")


def test_readme_pipeline_joins_on_path_and_eval_says_which_split_it_scores(
    runner, tmp_path, monkeypatch
):
    lay_out_eval_plots_only(monkeypatch)  # the PNGs' pictures are not this test's (eval_plots)
    monkeypatch.chdir(tmp_path)
    make_dataset(tmp_path / "dataset")
    ok(runner, "split", "dataset", "out", "--mode", "manifest", "--ratio", "6:2:2")
    manifest = pd.read_csv("out/split.csv")
    sizes = manifest["split"].value_counts().to_dict()
    assert sizes == {"train": 18, "val": 6, "test": 6}

    stats = ok(
        runner, "dataset-stats", "out/split.csv", "--format", "json", "-o", "stats.json", "-j", "0"
    )
    assert "using train (normalisation statistics come from training data only)" in stats.stderr
    computed = json.loads(Path("stats.json").read_text())
    assert computed["split"] == "train" and computed["images"] == 18  # train rows only

    ok(runner, "train", "--data", "out/split.csv", "--stats", "stats.json", "--out", "run", *FAST)
    used = pd.read_csv("run/split.csv")
    assert used["split"].value_counts().to_dict() == sizes  # the manifest's split, as it is
    assert set(used["path"]) == set(manifest["path"])

    ok(
        runner,
        "eval",
        "run/best.pt",
        "--data",
        "out/split.csv",
        "--split",
        "val",
        "--out",
        "report",
        "-j",
        "0",
        "--device",
        "cpu",
    )
    # Without --split, eval says which split of the split data it scores: the held-out test.
    result = ok(runner, "eval", "run/best.pt", "--data", "out/split.csv", "--format", "json",
                "-j", "0")  # fmt: skip
    assert "using test (held-out test data)" in result.stderr
    assert json.loads(result.stdout)["split"] == "test"
    clash = runner.invoke(app, ["eval", "convnet", "--model", "resnet18", "--data", "out"])
    assert clash.exit_code == 2 and "MODEL convnet contradicts --model resnet18" in clash.stderr

    predictions = pd.read_csv("report/predictions.csv")
    metrics = json.loads(Path("report/metrics.json").read_text())
    assert metrics["split"] == "val" and metrics["num_images"] == 6
    val_paths = set(manifest.loc[manifest["split"] == "val", "path"])
    assert set(predictions["path"]) == val_paths  # the val rows, nothing of train

    ok(
        runner,
        "extract-features",
        "run/best.pt",
        "out/split.csv",
        "feats",
        "-l",
        "logits",
        "-j",
        "0",
        "--device",
        "cpu",
    )
    index = pd.read_csv("feats/index.csv")
    assert index["split"].value_counts().to_dict() == sizes
    assert set(index["label"]) == set(CLASSES)  # class names, never split names
    logits = np.load("feats/logits.npy")

    # One vocabulary: `label` is the true class name in both, so they join on it too.
    joined = predictions.merge(index, on=["path", "label"], how="inner")
    assert len(joined) == 6 and (joined["split"] == "val").all()
    # eval's predicted class is the argmax of the features' logits for the same image
    argmax = logits[joined["row"].astype(int)].argmax(1)
    assert [CLASSES[i] for i in argmax] == list(joined["class"])

    predicted = ok(runner, "predict", "run/best.pt", "out/split.csv", "--split", "val", "--format",
                   "csv", "-o", "predict.csv", "-j", "0", "--device", "cpu")  # fmt: skip
    assert "wrote predict.csv" in predicted.stderr
    # predict's rows and eval's predictions.csv agree column for column on what they share.
    shared = ["path", "label", "class", "class_index"]
    rows = pd.read_csv("predict.csv").merge(predictions, on=shared)
    assert len(rows) == 6
    assert np.allclose(rows["probability_x"], rows["probability_y"], atol=1e-6)


def test_a_split_train_made_is_the_split_eval_scores(runner, tmp_path, monkeypatch):
    lay_out_eval_plots_only(monkeypatch)  # the PNGs' pictures are not this test's (eval_plots)
    monkeypatch.chdir(tmp_path)
    make_dataset(tmp_path / "flat")
    trained = ok(runner, "train", "--data", "flat", "--val-split", "0.2", "--out", "run", *FAST)
    assert "holding out 0.2" in trained.stderr
    held_out = pd.read_csv("run/split.csv")
    val = set(held_out.loc[held_out["split"] == "val", "path"])
    assert len(val) == 6
    ok(runner, "eval", "run/best.pt", "--data", "flat", "--split", "val", "--out", "r", "-j", "0")
    assert set(pd.read_csv("r/predictions.csv")["path"]) == val
    # extract-features and predict pick the same held-out images.
    ok(runner, "extract-features", "run/best.pt", "flat", "f", "-l", "logits", "--split", "val",
       "-j", "0")  # fmt: skip
    assert set(pd.read_csv("f/index.csv")["path"]) == val
    ok(runner, "predict", "run/best.pt", "flat", "--split", "val", "--format", "csv", "-o", "p.csv",
       "-j", "0")  # fmt: skip
    assert set(pd.read_csv("p.csv")["path"]) == val
    # Without --split, the run's own data is scored on what it held out (issue #31), and
    # --split all scores the whole folder.
    held = ok(runner, "eval", "run/best.pt", "--data", "flat", "--format", "json", "-j", "0")
    assert json.loads(held.stdout)["num_images"] == 6
    whole = ok(runner, "eval", "run/best.pt", "--data", "flat", "--split", "all", "--format=json",
               "-j", "0")  # fmt: skip
    assert json.loads(whole.stdout)["num_images"] == 30


def test_a_cifar_like_root_without_val_trains(runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    make_dataset(tmp_path / "cifar" / "train")
    make_dataset(tmp_path / "cifar" / "test", per_class=2)
    trained = ok(runner, "train", "--data", "cifar", "--out", "run", *FAST)
    assert "has no val split" in trained.stderr
    used = pd.read_csv("run/split.csv")
    assert used["split"].value_counts().to_dict() == {"train": 27, "val": 3, "test": 6}


@pytest.mark.parametrize("bom", [False, True])
def test_an_excel_csv_with_a_bom_trains(runner, tmp_path, monkeypatch, bom):
    monkeypatch.chdir(tmp_path)
    make_dataset(tmp_path / "dataset")
    lines = ["path,label"] + [
        f"dataset/{name}/{name}_{i}.png,{name}" for name in CLASSES for i in range(10)
    ]
    text = "\r\n".join(lines) + "\r\n"
    (tmp_path / "index.csv").write_bytes(("\ufeff" if bom else "").encode() + text.encode())
    ok(runner, "train", "--data", "index.csv", "--val-split", "0.2", "--out", "run", *FAST)
