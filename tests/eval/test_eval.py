"""`torchkit eval`: end to end through the CLI, every number checked against scikit-learn (from
the written predictions.csv) or a hand-written PyTorch loop."""

from __future__ import annotations

import csv
import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from eval_plots import lay_out_eval_plots_only
from gloo_ranks import forks_noted, run_ranks, stderr_of, watching_forks
from output_checks import error_line
from PIL import Image
from sklearn.metrics import (
    balanced_accuracy_score,
    confusion_matrix,
    precision_recall_fscore_support,
    top_k_accuracy_score,
)
from typer.testing import CliRunner

from torchkit.cli import app
from torchkit.core.data.preprocessing import Preprocess
from torchkit.core.data.transforms import eval_transform
from torchkit.core.models import build_model, model_from_checkpoint
from torchkit.core.models.checkpoint import FORMAT_VERSION, load_checkpoint, save_checkpoint

runner = CliRunner()

# Label order of the checkpoint is deliberately not alphabetical: folders are matched by name.
CLASSES = ["cherry", "apple", "elder", "banana", "date"]
ABSENT = "elder"  # in the checkpoint, not in the test folder: zero support
SIZE = 16
PREPROCESS = Preprocess(
    image_size=SIZE, resize_size=SIZE, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), in_channels=3
)
PER_CLASS_COLUMNS = [
    "label",
    "index",
    "support",
    "predicted",
    "precision",
    "recall",
    "f1",
    "top1",
    "top5",
    "loss",
    "confused_with_1",
    "confused_with_2",
    "confused_with_3",
    "confused_with_4",
    "confused_with_5",
]


def _class_images(label: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """Noisy images whose mean colour leans a little towards the class's: a tiny convnet
    trained for a few steps gets about two thirds of them right."""
    signs = np.array([[1, -1, -1], [-1, 1, -1], [-1, -1, 1], [1, 1, -1], [-1, 1, 1]])
    noise = rng.normal(0, 60, size=(count, SIZE, SIZE, 3))
    return np.clip(128 + 16 * signs[label] + noise, 0, 255).astype(np.uint8)


def _to_tensor(images: np.ndarray) -> torch.Tensor:
    return (torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255 - 0.5) / 0.5


def _checkpoint(model, arch, classes, preprocess) -> dict:
    return {
        "format_version": FORMAT_VERSION,
        "torchkit_version": "0.1.0",
        "arch": arch,
        "num_classes": len(classes),
        "classes": list(classes),
        "model": model.state_dict(),
        "optimizer": None,
        "scheduler": None,
        "scaler": None,
        "epoch": 1,
        "global_step": 10,
        "best_metric": 0.5,
        "rng_state": None,
        "config": {"lr": 0.01},
        "preprocess": preprocess.to_dict(),
    }


def _train(model, images: torch.Tensor, labels: torch.Tensor, steps: int, batch: int = 32):
    """A few Adam steps on shuffled batches: a model that is right often, not always."""
    torch.manual_seed(0)
    order = torch.randperm(len(labels))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: one thread is faster, above all on a busy machine
    try:
        model.train()
        for step in range(steps):
            idx = order[(step * batch + torch.arange(batch)) % len(labels)]
            optimizer.zero_grad()
            F.cross_entropy(model(images[idx]), labels[idx]).backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    return model.eval()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A trained tiny convnet checkpoint and a split dataset root with an odd number of images
    (41: the 2-rank run cannot split it evenly) and one checkpoint class with no images."""
    root = tmp_path_factory.mktemp("eval")
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    train_x = np.concatenate([_class_images(c, 40, rng) for c in range(5)])
    train_y = torch.arange(5).repeat_interleave(40)
    model = _train(
        build_model("convnet", 5, image_size=SIZE), _to_tensor(train_x), train_y, steps=12
    )
    ckpt = root / "model.pt"
    save_checkpoint(_checkpoint(model, "convnet", CLASSES, PREPROCESS), ckpt)
    data = root / "data"
    counts = {"cherry": 12, "apple": 11, "banana": 10, "date": 8}
    for name, count in counts.items():
        folder = data / "test" / name
        folder.mkdir(parents=True)
        for i, pixels in enumerate(_class_images(CLASSES.index(name), count, rng)):
            Image.fromarray(pixels).save(folder / f"{name}_{i:02d}.png")
    (data / "test" / ABSENT).mkdir()  # an empty class folder
    (data / "val" / "apple").mkdir(parents=True)
    Image.fromarray(_class_images(1, 1, rng)[0]).save(data / "val" / "apple" / "a.png")
    return {"root": root, "ckpt": ckpt, "data": data, "model": model, "n": sum(counts.values())}


def invoke(*args: str):
    # On the CPU, as the hand-written references compute (a later --device wins).
    return runner.invoke(app, ["eval", "--device", "cpu", *map(str, args)])


def _reference(model, paths: list[str], tta: bool = False):
    """A hand-written evaluation: the probabilities of each image (flip TTA averages them)."""
    transform = eval_transform(PREPROCESS)
    x = torch.stack([transform(Image.open(p).convert("RGB")) for p in paths])
    with torch.no_grad():
        probs = model(x).softmax(1)
        if tta:
            probs = (probs + model(x.flip(3)).softmax(1)) / 2
    return probs


def _read_csv(path: Path) -> tuple[list[str], list[dict]]:
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames), list(reader)


@pytest.fixture(scope="module")
def report(setup, tmp_path_factory):
    """One eval --out run, its PNGs drawn for real, with the texts drawn on figures recorded
    (errors.png's titles)."""
    from matplotlib.figure import Figure

    out = tmp_path_factory.mktemp("report") / "out"
    texts: list[str] = []
    original = Figure.text

    def recording(self, x, y, s, *args, **kwargs):
        texts.append(s)
        return original(self, x, y, s, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Figure, "text", recording)
        result = invoke(
            setup["ckpt"], "--data", setup["data"], "--out", out, "--format", "json",
            "--topk", "3", "--workers", "0", "--batch-size", "7",
        )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    return {
        "out": out,
        "json": json.loads(result.stdout),
        "stderr": result.stderr,
        "figure_texts": texts,
    }


def test_reports_agree_with_sklearn_from_predictions_csv(setup, report):
    out, shown = report["out"], report["json"]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [
            ".torchkit",  # the marker: --force may replace this folder
            "metrics.json",
            "per_class.csv",
            "confusion_matrix.csv",
            "confusion_matrix.png",
            "predictions.csv",
            "errors.png",
        ]
    )
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics == shown  # the same numbers on stdout and on disk
    columns, rows = _read_csv(out / "predictions.csv")
    assert columns[:8] == [
        "path",
        "label",
        "label_index",
        "class",
        "class_index",
        "probability",
        "correct",
        "loss",
    ]
    assert columns[8:] == [f"{kind}_{i}" for i in (1, 2, 3) for kind in ("class", "probability")]
    assert len(rows) == setup["n"] == metrics["num_images"]
    y_true = np.array([int(r["label_index"]) for r in rows])
    y_pred = np.array([int(r["class_index"]) for r in rows])
    assert all(CLASSES[int(r["label_index"])] == r["label"] for r in rows)
    assert all(CLASSES[int(r["class_index"])] == r["class"] == r["class_1"] for r in rows)
    assert all(Path(r["path"]).parent.name == r["label"] for r in rows)  # matched by name
    assert 0 < metrics["accuracy"] < 1, "the fixture model should make some mistakes"
    labels = list(range(len(CLASSES)))

    assert metrics["accuracy"] == pytest.approx(np.mean(y_true == y_pred), abs=1e-12)
    # Top-k from the ranked classes written per image (score = minus the rank).
    score = np.full((len(rows), len(CLASSES)), -100.0)
    for i, r in enumerate(rows):
        for rank in (1, 2, 3):
            score[i, CLASSES.index(r[f"class_{rank}"])] = -rank
    assert metrics["topk"] == 3
    assert metrics["topk_accuracy"] == pytest.approx(
        top_k_accuracy_score(y_true, score, k=3, labels=labels), abs=1e-12
    )
    for average in ("macro", "weighted"):
        p, r, f, _ = precision_recall_fscore_support(
            y_true, y_pred, average=average, zero_division=0
        )
        assert metrics[f"precision_{average}"] == pytest.approx(p, abs=1e-12)
        assert metrics[f"recall_{average}"] == pytest.approx(r, abs=1e-12)
        assert metrics[f"f1_{average}"] == pytest.approx(f, abs=1e-12)
    _, _, f_micro, _ = precision_recall_fscore_support(y_true, y_pred, average="micro")
    assert metrics["f1_micro"] == pytest.approx(f_micro, abs=1e-12)
    assert metrics["balanced_accuracy"] == pytest.approx(
        balanced_accuracy_score(y_true, y_pred), abs=1e-12
    )
    losses = np.array([float(r["loss"]) for r in rows])
    assert metrics["loss"] == pytest.approx(losses.mean(), rel=1e-6)

    # per_class.csv: the columns, sklearn's numbers, zero support for the absent class.
    p, r, f, s = precision_recall_fscore_support(
        y_true, y_pred, labels=labels, average=None, zero_division=0
    )
    cm = confusion_matrix(y_true, y_pred, labels=labels)
    header, per_class = _read_csv(out / "per_class.csv")
    assert header == [name.replace("top5", "top3") for name in PER_CLASS_COLUMNS]  # --topk 3
    assert [row["label"] for row in per_class] == CLASSES
    for label, row in enumerate(per_class):
        assert int(row["index"]) == label
        assert int(row["support"]) == s[label]
        assert float(row["precision"]) == pytest.approx(p[label], abs=1e-12)
        assert float(row["recall"]) == pytest.approx(r[label], abs=1e-12)
        assert float(row["f1"]) == pytest.approx(f[label], abs=1e-12)
        off_diagonal = [(-cm[label, j], j) for j in labels if j != label and cm[label, j] > 0]
        expected = sorted(off_diagonal)[:5]
        confused = [row[f"confused_with_{i}"] for i in range(1, 6)]
        assert confused == [f"{CLASSES[j]}:{-n}" for n, j in expected] + [""] * (5 - len(expected))
        if s[label]:
            assert float(row["top1"]) == pytest.approx(r[label], abs=1e-12)
            assert float(row["top1"]) <= float(row["top3"]) <= 1
            mine = [float(x["loss"]) for x in rows if int(x["label_index"]) == label]
            assert float(row["loss"]) == pytest.approx(np.mean(mine), rel=1e-6)
    absent = CLASSES.index(ABSENT)
    assert per_class[absent]["support"] == "0" and per_class[absent]["top1"] == ""
    assert metrics["per_class"][absent]["support"] == 0
    # JSON's per-class entries use per_class.csv's names: `label` the name, `index` its index.
    assert metrics["per_class"][absent]["label"] == ABSENT
    assert metrics["per_class"][absent]["index"] == absent
    assert metrics["top1"] == metrics["accuracy"] and metrics["top3"] == metrics["topk_accuracy"]

    with (out / "confusion_matrix.csv").open(newline="") as handle:
        table = list(csv.reader(handle))
    assert table[0][1:] == CLASSES
    assert [row[0] for row in table[1:]] == CLASSES
    np.testing.assert_array_equal(np.array([row[1:] for row in table[1:]], dtype=int), cm)

    for name in ("confusion_matrix.png", "errors.png"):
        with Image.open(out / name) as image:
            assert image.format == "PNG" and min(image.size) > 100


def test_numbers_match_a_hand_written_loop(setup, report):
    _, rows = _read_csv(report["out"] / "predictions.csv")
    root = Path(report["json"]["root"])  # paths are relative to the data root it records
    assert root == setup["data"] and rows[0]["path"].startswith("test/")
    probs = _reference(setup["model"], [str(root / r["path"]) for r in rows])
    labels = torch.tensor([int(r["label_index"]) for r in rows])
    assert [int(r["class_index"]) for r in rows] == probs.argmax(1).tolist()
    np.testing.assert_allclose(
        [float(r["probability"]) for r in rows], probs.max(1).values.numpy(), rtol=1e-5
    )
    reference_loss = F.nll_loss(probs.log(), labels).item()
    assert report["json"]["loss"] == pytest.approx(reference_loss, rel=1e-5)


def test_tta_flip_averages_image_and_mirror(setup, tmp_path, monkeypatch):
    lay_out_eval_plots_only(monkeypatch)  # the PNGs' pictures are not this test's (eval_plots)
    out = tmp_path / "tta"
    result = invoke(
        setup["ckpt"], "--data", setup["data"], "--tta", "flip", "--out", out,
        "--workers", "0", "--format", "json",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    _, rows = _read_csv(out / "predictions.csv")
    root = Path(setup["data"])
    probs = _reference(setup["model"], [str(root / r["path"]) for r in rows], tta=True)
    assert [int(r["class_index"]) for r in rows] == probs.argmax(1).tolist()
    np.testing.assert_allclose(
        [float(r["probability_1"]) for r in rows], probs.max(1).values.numpy(), rtol=1e-5
    )
    assert json.loads(result.stdout)["tta"] == "flip"


def test_table_output_and_split_choice(setup, report):
    result = invoke(setup["ckpt"], "--data", setup["data"], "--workers", "0")
    assert result.exit_code == 0, result.stderr
    for text in ("Accuracy (top-1)", "Balanced accuracy", "F1 (macro)", "F1 (micro)", "Loss"):
        assert text in result.stdout
    assert "Top-5" not in result.stdout  # 5 classes: every class is in the top 5
    result = invoke(setup["ckpt"], "--data", setup["data"], "--topk", "3", "--workers", "0")
    assert "Top-3 accuracy" in result.stdout
    assert "Confused with" in result.stdout and ABSENT in result.stdout
    result = invoke(
        setup["ckpt"], "--data", setup["data"], "--topk", "9", "--format", "json", "-j", "0"
    )
    data = json.loads(result.stdout)
    assert result.exit_code == 0 and data["topk"] == 9
    assert data["top9"] is None and data["topk_accuracy"] is None
    assert "Warning: --topk 9 with 5 classes: every class is in the top 9" in result.stderr
    # --split val picks the other folder; csv prints per_class.csv's table and the overall rows.
    result = invoke(
        setup["ckpt"], "--data", setup["data"], "--split", "val", "--format", "csv",
        "--workers", "0",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split(",") == PER_CLASS_COLUMNS
    assert lines[2].startswith("apple,1,1,")
    assert lines[1] == "cherry,0,0,0,0.0,0.0,0.0,,,,,,,,"  # no images, never predicted
    rows = {row["label"]: row for row in csv.DictReader(lines) if row["index"] == ""}
    assert list(rows) == ["all", "macro avg", "weighted avg"]
    data = invoke(
        setup["ckpt"], "--data", setup["data"], "--split", "val", "--format", "json",
        "--workers", "0",
    ).stdout  # fmt: skip
    data = json.loads(data)
    assert float(rows["all"]["top1"]) == data["top1"] == data["accuracy"]
    assert float(rows["all"]["loss"]) == data["loss"] and rows["all"]["top5"] == ""
    assert float(rows["macro avg"]["f1"]) == data["f1_macro"]
    assert float(rows["weighted avg"]["recall"]) == data["recall_weighted"]
    assert int(rows["all"]["support"]) == data["num_images"]


def test_images_per_second_has_thousands_separators_in_the_table_only(setup, monkeypatch):
    """The table showed 'Images/s 3739' where train's shows '4,196': one formatter for every
    table and message; JSON keeps the plain number."""
    from torchkit.core.evaluate.results import EvalResult

    monkeypatch.setattr(EvalResult, "images_per_second", property(lambda self: 3739.4))
    args = [setup["ckpt"], "--data", setup["data"], "--workers", "0"]
    result = invoke(*args)
    assert result.exit_code == 0, result.stderr
    (line,) = [line for line in result.stdout.splitlines() if "Images/s" in line]
    assert line.split()[-2:] == ["3,739", "│"]
    data = json.loads(invoke(*args, "--format", "json").stdout)
    assert data["images_per_second"] == 3739.4


def test_a_small_loss_keeps_its_digits_in_the_table(tmp_path, make_image_folder):
    """A model sure of the right class (logits 12 and 0: a loss of 6.2e-6 per image, torch's
    float32 cross-entropy) showed Loss 0.0000, as if it had none."""
    from checkpoints import write_constant_convnet_checkpoint

    data = make_image_folder(tmp_path / "data", {"a": 2, "b": 0})
    checkpoint = tmp_path / "ck.pt"
    write_constant_convnet_checkpoint(checkpoint, image_size=8, classes="ab", logits=[12.0, 0.0])
    result = invoke(checkpoint, "--data", data, "--workers", "0")
    assert result.exit_code == 0, result.stderr
    (line,) = [line for line in result.stdout.splitlines() if "│ Loss" in line]
    loss = F.cross_entropy(torch.tensor([[12.0, 0.0]]), torch.tensor([0])).item()
    assert line.split()[-2:] == [f"{loss:.8f}", "│"]  # 0.00000620


def test_many_classes_table_leaves_out_empty_rows(setup, tmp_path):
    classes = [*CLASSES, *(f"extra_{i:02d}" for i in range(55))]
    torch.manual_seed(0)
    model = build_model("convnet", len(classes), image_size=SIZE)
    ckpt = tmp_path / "many.pt"
    save_checkpoint(_checkpoint(model, "convnet", classes, PREPROCESS), ckpt)
    result = invoke(ckpt, "--data", setup["data"], "--workers", "0")
    assert result.exit_code == 0, result.stderr
    data = json.loads(invoke(ckpt, "--data", setup["data"], "--format", "json", "-j", "0").stdout)
    shown = [c for c in data["per_class"] if c["support"] or c["predicted"]]
    assert len(data["per_class"]) == 60 and len(shown) < 60
    words = " ".join(result.stdout.split())  # the note may wrap
    note = (
        f"{60 - len(shown)} of 60 classes, without images or predictions, not shown: "
        "--all-classes shows them all"
    )
    assert note in words
    assert words.endswith("list them")  # the note is the table's last line
    assert all(f"│ {c['label']} " in result.stdout for c in shown)
    every = invoke(ckpt, "--data", setup["data"], "--workers", "0", "--all-classes")
    assert every.exit_code == 0, every.stderr
    assert all(f"│ {c['label']} " in every.stdout for c in data["per_class"])
    assert "not shown" not in every.stdout


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_all_classes_beside_csv_or_json_is_a_usage_error(fmt):
    """They list every class already: --all-classes would do nothing there."""
    result = invoke("convnet", "--data", "digits", "--format", fmt, "--all-classes")
    assert result.exit_code == 2
    assert error_line(result.stderr, besides="nothing") == (
        f"Error: --all-classes shapes the table, and --format {fmt} lists every class already "
        "(drop --all-classes)"
    )


def assert_same_per_class(got: list[dict], expected: list[dict]) -> None:
    """The same predictions: equal counts and scores, each class's mean loss up to float32
    noise (batches of other sizes sum in another order)."""
    assert [{**c, "loss": None} for c in got] == [{**c, "loss": None} for c in expected]
    for mine, theirs in zip(got, expected, strict=True):
        assert mine["loss"] == (theirs["loss"] and pytest.approx(theirs["loss"], rel=1e-5))


def test_output_file_and_out_dir_need_force(setup, report, tmp_path, monkeypatch):
    lay_out_eval_plots_only(monkeypatch)  # the PNGs' pictures are not this test's (eval_plots)
    target = tmp_path / "metrics.json"
    args = [setup["ckpt"], "--data", setup["data"], "--format", "json", "--workers", "0"]
    assert invoke(*args, "-o", target).exit_code == 0
    accuracy = report["json"]["accuracy"]
    assert json.loads(target.read_text())["accuracy"] == accuracy
    again = invoke(*args, "-o", target)
    assert again.exit_code == 1 and "Error: output already exists" in again.stderr

    refused = invoke(*args, "--out", report["out"])
    assert refused.exit_code == 1
    assert "already exists" in refused.stderr and "--force" in refused.stderr
    # --force replaces an earlier eval's folder, never one with other files in it.
    earlier = tmp_path / "earlier"
    shutil.copytree(report["out"], earlier)  # an earlier eval's folder, its marker included
    old = json.loads((earlier / "metrics.json").read_text())  # eval's record: its own to replace
    (earlier / "metrics.json").write_text(json.dumps({**old, "accuracy": -1.0}))
    assert invoke(*args, "--out", earlier, "--force").exit_code == 0
    assert json.loads((earlier / "metrics.json").read_text())["accuracy"] == accuracy
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("x")
    refused = invoke(*args, "--out", out, "--force")
    assert refused.exit_code == 1 and "was not written by torchkit" in refused.stderr
    assert [p.name for p in out.iterdir()] == ["old.txt"]


@pytest.mark.parametrize(
    "options",
    [["--normalize"], ["--show-errors", "3"], ["--normalize", "--show-errors", "3"]],
)
def test_plot_options_without_out_are_refused(setup, options):
    """--normalize and --show-errors shape the PNGs of --out: alone they would do nothing."""
    result = invoke(setup["ckpt"], "--data", setup["data"], *options)
    assert result.exit_code == 2, result.stderr
    assert "--out" in error_line(result.stderr) and result.stdout == ""


def test_channels_last_workers_and_amp(setup, report):
    base = [setup["ckpt"], "--data", setup["data"], "--format", "json", "--device", "cpu"]
    result = invoke(*base, "--channels-last", "--workers", "1", "--batch-size", "16", "--topk", "3")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert_same_per_class(data["per_class"], report["json"]["per_class"])  # same predictions
    assert data["loss"] == pytest.approx(report["json"]["loss"], rel=1e-5)
    result = invoke(*base, "--amp", "--workers", "0")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["amp"] is True and data["num_images"] == setup["n"]
    assert data["loss"] == pytest.approx(report["json"]["loss"], rel=0.05)  # bfloat16 on CPU


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_matches_cpu(setup, report):
    result = invoke(
        setup["ckpt"], "--data", setup["data"], "--device", "cuda", "--format", "json",
        "--workers", "0",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["device"].startswith("cuda")
    assert data["accuracy"] == report["json"]["accuracy"]
    assert data["loss"] == pytest.approx(report["json"]["loss"], rel=1e-4)


def test_digits_reproduces_the_test_accuracy_train_reported(tmp_path, monkeypatch):
    """The issue's target: `train --data digits` reports a test accuracy for best.pt; `eval`
    of best.pt on digits gives exactly that number."""
    pytest.importorskip("torchkit.cli.train", reason="needs `torchkit train`")
    run = tmp_path / "run"
    trained = runner.invoke(
        app,
        [
            "train", "--data", "digits", "--epochs", "1", "--image-size", "8",
            "--batch-size", "128", "--workers", "0", "--out", str(run), "--format", "json",
            "--device", "cpu",  # eval (on the CPU) gives exactly train's numbers
        ],
    )  # fmt: skip
    assert trained.exit_code == 0, trained.stderr
    reported = json.loads(trained.stdout)
    result = invoke(run / "best.pt", "--data", "digits", "--format", "json", "--workers", "0")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["split"] == "test" and data["num_images"] == reported["test_size"] == 179
    assert data["accuracy"] == reported["test_top1"]
    assert data["topk"] == 5 and data["topk_accuracy"] == reported["test_top5"]
    assert data["loss"] == pytest.approx(reported["test_loss"], rel=1e-5)


def test_csv_index_gives_the_same_numbers(setup, report, tmp_path):
    _, rows = _read_csv(report["out"] / "predictions.csv")
    index = tmp_path / "test.csv"
    with index.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["path", "label"])
        writer.writerows([setup["data"] / r["path"], r["label"]] for r in rows)
    result = invoke(setup["ckpt"], "--data", index, "--format", "json", "--topk", "3", "-j", "0")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    for key in ("num_images", "accuracy", "topk_accuracy"):
        assert data[key] == report["json"][key], key
    assert_same_per_class(data["per_class"], report["json"]["per_class"])


def test_ema_weights(setup, report, tmp_path):
    torch.manual_seed(1)
    untrained = build_model("convnet", len(CLASSES), image_size=SIZE)
    checkpoint = _checkpoint(untrained, "convnet", CLASSES, PREPROCESS)
    ckpt = tmp_path / "ema.pt"
    save_checkpoint(checkpoint, ckpt)
    args = ["--data", setup["data"], "--format", "json", "--workers", "0", "--topk", "3"]
    missing = invoke(ckpt, *args, "--ema")
    assert missing.exit_code == 1 and "holds no EMA weights" in missing.stderr
    # The EMA copy holds the trained weights (as AveragedModel saves them: module. + counter).
    ema_state = {f"module.{k}": v for k, v in setup["model"].state_dict().items()}
    checkpoint["model_ema"] = {**ema_state, "n_averaged": torch.tensor(3)}
    save_checkpoint(checkpoint, ckpt)
    result = invoke(ckpt, *args, "--ema")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["ema"] is True
    assert_same_per_class(data["per_class"], report["json"]["per_class"])
    plain = json.loads(invoke(ckpt, *args).stdout)
    assert plain["ema"] is False and plain["loss"] != data["loss"]


def test_plain_state_dict_with_module_prefix(setup, tmp_path):
    from torchkit.core.models.resolver import plain_preprocess

    weights = tmp_path / "weights.pth"
    torch.save({f"module.{k}": v for k, v in setup["model"].state_dict().items()}, weights)
    names = tmp_path / "classes.txt"
    names.write_text("\n".join(CLASSES) + "\n")
    result = invoke(
        weights, "--model", "convnet", "--classes", names, "--image-size", SIZE,
        "--data", setup["data"], "--format", "json", "--workers", "0",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["classes"] == CLASSES and data["model_source"] == "state dict"
    # Plain weights carry no preprocessing: ImageNet statistics, resize to size/0.875, crop.
    transform = eval_transform(plain_preprocess(3, SIZE))
    paths = sorted((setup["data"] / "test").glob("*/*.png"))
    x = torch.stack([transform(Image.open(p).convert("RGB")) for p in paths])
    truth = torch.tensor([CLASSES.index(p.parent.name) for p in paths])
    with torch.no_grad():
        correct = int((setup["model"](x).argmax(1) == truth).sum())
    assert data["num_images"] == len(paths) and data["accuracy"] == correct / len(paths)

    # Without --classes the class folders, sorted, name the labels.
    base = [weights, "--model", "convnet", "--data", setup["data"], "--image-size", SIZE]
    result = invoke(*base, "--workers", "0", "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["classes"] == sorted(CLASSES)
    # The weights have 5 outputs: asking for 6 classes is refused, not scored on a new head.
    for extra in (["--num-classes", "6"], ["--classes", ",".join([*CLASSES, "fig"])]):
        result = invoke(*base, *extra)
        assert result.exit_code == 2
        assert (
            "6 classes asked for" in result.stderr and "state dict has 5 outputs" in result.stderr
        )


def _accuracy_with(model, data: Path, preprocess: Preprocess) -> float:
    transform = eval_transform(preprocess)
    paths = sorted((data / "test").glob("*/*.png"))
    x = torch.stack([transform(Image.open(p).convert("RGB")) for p in paths])
    truth = torch.tensor([CLASSES.index(p.parent.name) for p in paths])
    with torch.no_grad():
        return int((model(x).argmax(1) == truth).sum()) / len(paths)


def test_preprocessing_options_for_plain_weights_and_over_a_checkpoint(setup, tmp_path):
    weights = tmp_path / "weights.pth"
    torch.save(setup["model"].state_dict(), weights)
    # The statistics the weights were trained with, given by hand to plain weights.
    result = invoke(
        weights, "--model", "convnet", "--classes", ",".join(CLASSES), "--image-size", SIZE,
        "--resize-size", SIZE, "--mean", "0.5", "--std", "0.5,0.5,0.5",
        "--data", setup["data"], "--format", "json", "--workers", "0",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["preprocess"] == PREPROCESS.to_dict()
    assert data["accuracy"] == _accuracy_with(setup["model"], setup["data"], PREPROCESS)

    # Over a checkpoint's own preprocessing: only what is given changes.
    result = invoke(
        setup["ckpt"], "--std", "0.25", "--resize-size", 20, "--data", setup["data"],
        "--format", "json", "--workers", "0",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    changed = replace(PREPROCESS, resize_size=20, std=(0.25, 0.25, 0.25))
    data = json.loads(result.stdout)
    assert data["preprocess"] == changed.to_dict()
    model = model_from_checkpoint(load_checkpoint(setup["ckpt"])).eval()
    assert data["accuracy"] == _accuracy_with(model, setup["data"], changed)

    # The convnet's classifier is sized for 16x16 inputs: another size is one clear error.
    result = invoke(setup["ckpt"], "--image-size", 12, "--data", setup["data"], "--workers", "0")
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    assert "Error: the model fails on 12x12 images" in result.stderr
    assert "(it was trained on 16x16 images: give --image-size 16, or leave it out)" in (
        result.stderr
    )
    result = invoke(setup["ckpt"], "--std", "0,1,1", "--data", setup["data"])
    assert result.exit_code == 2 and "--std values must be positive" in result.stderr
    result = invoke(setup["ckpt"], "--mean", "0.5,0.5", "--data", setup["data"])
    assert result.exit_code == 2 and "--mean has 2 values" in result.stderr
    result = invoke(setup["ckpt"], "--mean", "half", "--data", setup["data"])
    assert result.exit_code == 2 and "--mean must be numbers" in result.stderr


def test_plain_state_dict_errors(setup, tmp_path):
    weights = tmp_path / "weights.pth"
    torch.save(setup["model"].state_dict(), weights)
    result = invoke(weights, "--data", setup["data"])
    assert result.exit_code == 2
    assert "holds plain weights" in result.stderr and "--weights" in result.stderr
    result = invoke(
        weights, "--model", "resnet18", "--num-classes", "5", "--classes", ",".join(CLASSES),
        "--data", setup["data"],
    )  # fmt: skip
    assert result.exit_code == 1
    assert "do not fit the model" in result.stderr and "Traceback" not in result.stderr


def test_pickled_model_needs_trust(setup, tmp_path):
    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 14 * 14, 5)
    )
    path = tmp_path / "whole.pt"
    torch.save(module, path)
    args = [path, "--data", setup["data"], "--classes", ",".join(CLASSES), "--image-size", SIZE]
    refused = invoke(*args)
    assert refused.exit_code == 1
    assert "Error:" in refused.stderr and "--trust-checkpoint" in refused.stderr
    result = invoke(*args, "--trust-checkpoint", "--format", "json", "--workers", "0")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["model_source"] == "pickled model" and data["num_images"] == setup["n"]


def test_torchvision_default_weights_offline_is_a_clear_error(setup, monkeypatch, tmp_path):
    import urllib.error

    import torchvision.models._api as api

    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -2] Name or service not known")

    monkeypatch.setattr(api, "load_state_dict_from_url", offline)
    imagenet = tmp_path / "imagenet"
    for name in ("tench", "goldfish"):  # folders named like the weights' categories
        (imagenet / name).mkdir(parents=True)
        Image.new("RGB", (8, 8)).save(imagenet / name / "x.png")
    result = invoke("--model", "resnet18", "--weights", "DEFAULT", "--data", imagenet)
    assert result.exit_code == 1
    assert "Error: cannot download the DEFAULT weights of resnet18" in result.stderr
    assert "--weights PATH" in result.stderr and "Traceback" not in result.stderr
    # With the weights cached, folders named otherwise are not among its 1000 categories.
    import torchvision

    import torchkit.core.models.resolver as resolver

    monkeypatch.setattr(
        resolver,
        "torchvision_pretrained",
        lambda name, _: torchvision.models.get_model(name, weights=None),
    )
    result = invoke("--model", "resnet18", "--weights", "DEFAULT", "--data", setup["data"])
    assert result.exit_code == 1 and "not among the model's 1000 classes" in result.stderr
    unknown = invoke("--model", "resnet18", "--weights", "NOPE", "--data", setup["data"])
    assert unknown.exit_code == 2 and "torchvision has: DEFAULT" in unknown.stderr


@pytest.fixture
def bad_checkpoints(tmp_path):
    (tmp_path / "empty.pt").write_bytes(b"")
    (tmp_path / "garbage.pt").write_bytes(os.urandom(256))
    return tmp_path


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("missing.pt", "Error: checkpoint not found"),
        ("empty.pt", "Error: checkpoint is empty"),
        ("garbage.pt", "Error: cannot read checkpoint"),
    ],
)
def test_bad_checkpoints(setup, bad_checkpoints, name, message):
    result = invoke(bad_checkpoints / name, "--data", setup["data"])
    assert result.exit_code == 1
    assert message in result.stderr and "Traceback" not in result.stderr


def test_truncated_checkpoint(setup, tmp_path):
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(setup["ckpt"].read_bytes()[:2000])
    result = invoke(truncated, "--data", setup["data"])
    assert result.exit_code == 1 and "Error: cannot read checkpoint" in result.stderr


def test_bad_data(setup, tmp_path):
    ckpt = setup["ckpt"]
    empty = tmp_path / "empty"
    (empty / "apple").mkdir(parents=True)
    result = invoke(ckpt, "--data", empty)
    assert result.exit_code == 1 and "Error: no images in" in result.stderr
    unknown = tmp_path / "unknown"
    (unknown / "kiwi").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(unknown / "kiwi" / "k.png")
    result = invoke(ckpt, "--data", unknown)
    assert result.exit_code == 1
    assert "kiwi" in result.stderr and "not among the model's 5 classes" in result.stderr
    result = invoke(ckpt, "--data", tmp_path / "nowhere")
    assert result.exit_code == 1 and "Error: dataset not found" in result.stderr
    result = invoke(ckpt, "--data", setup["data"], "--split", "train")
    assert result.exit_code == 2 and "has no train split (it has: val, test" in result.stderr
    result = invoke(ckpt, "--data", "digits")
    assert result.exit_code == 1 and "are not among the model's" in result.stderr


def test_classes_named_like_the_overall_rows_are_told_apart_by_their_index(tmp_path):
    """--format csv prints the overall rows `all`, `macro avg`, `weighted avg` beside the classes:
    a class of one of those names is told from them by its `index` (empty for overall rows);
    the JSON keeps the classes apart (`per_class`)."""
    from checkpoints import write_convnet_checkpoint
    from image_folders import write_image_folder

    classes = ["all", "macro avg", "weighted avg"]
    ckpt = tmp_path / "model.pt"
    write_convnet_checkpoint(ckpt, in_channels=3, image_size=8, classes=classes)
    data = write_image_folder(tmp_path / "data", dict.fromkeys(classes, 1))
    result = invoke(ckpt, "--data", data, "--format", "csv", "-j", "0")
    assert result.exit_code == 0, result.stderr
    rows = list(csv.DictReader(result.stdout.splitlines()))
    assert [row["label"] for row in rows] == classes * 2
    assert [row["index"] for row in rows] == ["0", "1", "2", "", "", ""]
    report = json.loads(invoke(ckpt, "--data", data, "--format", "json", "-j", "0").stdout)
    assert [row["label"] for row in report["per_class"]] == classes


def test_a_class_spelled_in_another_unicode_form_is_the_models_class(tmp_path):
    # A folder named on macOS spells "é" as "e" + a combining accent (NFD); a checkpoint trained
    # on the same data on Linux (or a CSV typed there) spells it as one letter (NFC).
    import tarfile

    from checkpoints import write_convnet_checkpoint

    ckpt = tmp_path / "model.pt"
    write_convnet_checkpoint(ckpt, in_channels=3, image_size=8, classes="a\u00e9")
    folder, root = tmp_path / "folder", tmp_path / "root"
    for i, name in enumerate(("a", "e\u0301")):
        for where in (folder, root / "test"):
            (where / name).mkdir(parents=True)
            Image.new("RGB", (8, 8), (i * 200, 0, 0)).save(where / name / f"{i}.png")
    index = tmp_path / "folder" / "index.csv"
    index.write_text("path,label\na/0.png,a\ne\u0301/1.png,e\u0301\n", encoding="utf-8")
    with tarfile.open(tmp_path / "root.tar", "w") as archive:
        archive.add(root / "test", arcname="test")
    for data in (folder, index, root, tmp_path / "root.tar"):
        result = invoke(ckpt, "--data", data, "--format", "json", "-j", "0")
        assert result.exit_code == 0, result.stderr
        report = json.loads(result.stdout)
        assert report["num_images"] == 2 and report["classes"] == ["a", "\u00e9"]
        assert [row["support"] for row in report["per_class"]] == [1, 1]


def test_tied_logits_predict_the_first_class_whatever_the_topk(tmp_path):
    # torch's topk orders equal scores differently for another k: the predicted class, and the
    # top-1 accuracy, changed with --topk (on CPU: class 8 with k=5, class 5 with k=6).
    from checkpoints import write_tied_convnet_checkpoint
    from image_folders import write_image_folder

    from torchkit.core.topk import ranked_classes

    ckpt = tmp_path / "tied.pt"
    write_tied_convnet_checkpoint(ckpt, image_size=8, classes="abcdefghij")
    data = write_image_folder(tmp_path / "data", {"a": 1, "i": 1})
    for k in ("1", "5", "6"):
        result = invoke(ckpt, "--data", data, "--topk", k, "--format", "json", "-j", "0")
        assert result.exit_code == 0, result.stderr
        report = json.loads(result.stdout)
        assert report["top1"] == 0.5  # both images predicted as logits.argmax(): a
        assert [row["predicted"] for row in report["per_class"]] == [2] + [0] * 9
    scores = torch.tensor([[0.0, 2.0, 1.0, 2.0, 2.0]])
    assert ranked_classes(scores, 4).tolist() == [[1, 3, 4, 2]]


def test_ranked_classes_of_many_classes_equal_the_full_stable_sort():
    # Many classes sort only the candidates for the first k: the same classes in the same order
    # as sorting every score, ties (scores rounded to one decimal), infinities and NaN included.
    from torchkit.core.topk import ranked_classes

    generator = torch.Generator().manual_seed(0)
    for classes, k in ((200, 1), (1000, 5), (3000, 10)):
        scores = (torch.rand(16, classes, generator=generator) * 10).round() / 10
        scores[0] = 0.5  # a row of ties (an untrained head)
        scores[3, :10] = float("inf")
        scores[4, scores[4] < 0.5] = float("-inf")
        for batch in (
            scores,
            scores[3:],
            scores[3:].bfloat16(),
            torch.where(scores > 0.95, float("nan"), scores),
        ):
            full = batch.sort(dim=1, descending=True, stable=True).indices[:, :k]
            assert torch.equal(ranked_classes(batch, k), full)


def test_topk_1_keeps_the_top1_accuracy_of_a_one_class_model(tmp_path):
    # top{k} is null where k >= the classes; with --topk 1 that null overwrote `top1`, which the
    # table and `accuracy` gave as 1.0.
    from checkpoints import write_convnet_checkpoint
    from image_folders import write_image_folder

    ckpt = tmp_path / "one.pt"
    write_convnet_checkpoint(ckpt, in_channels=3, image_size=8, classes="a")
    data = write_image_folder(tmp_path / "data", {"a": 2})
    result = invoke(ckpt, "--data", data, "--topk", "1", "--format", "json", "-j", "0")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["top1"] == report["accuracy"] == report["per_class"][0]["top1"] == 1.0
    # nor does a warning say it is left out (null in JSON and CSV)
    assert "left out" not in result.stderr
    result = invoke(ckpt, "--data", data, "--topk", "1", "--format", "csv", "-j", "0")
    rows = {row["label"]: row for row in csv.DictReader(result.stdout.splitlines())}
    assert rows["a"]["top1"] == rows["all"]["top1"] == "1.0"


def test_unreadable_image_is_skipped_and_counted_or_fatal_with_strict(setup, tmp_path):
    data = tmp_path / "data"
    rng = np.random.default_rng(1)
    for name in ("apple", "date"):
        (data / name).mkdir(parents=True)
        for i, pixels in enumerate(_class_images(CLASSES.index(name), 3, rng)):
            Image.fromarray(pixels).save(data / name / f"{i}.png")
    (data / "date" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    result = invoke(setup["ckpt"], "--data", data, "--format", "json", "--workers", "0")
    assert result.exit_code == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["num_images"] == 6 and payload["num_skipped"] == 1
    assert payload["skipped_files"][0].startswith(str(data / "date" / "broken.png"))
    assert "Warning: skipped 1 unreadable image" in result.stderr
    strict = invoke(setup["ckpt"], "--data", data, "--strict", "--workers", "0")
    assert strict.exit_code == 1
    assert "Error: unreadable image" in strict.stderr and "broken.png" in strict.stderr
    for image in data.glob("*/[0-9].png"):
        image.unlink()
    nothing = invoke(setup["ckpt"], "--data", data, "--workers", "0")
    assert nothing.exit_code == 1
    assert "Error: none of the 1 images" in nothing.stderr and "could be read" in nothing.stderr
    # Which file and why, as dataset-stats says it (e.g. a CSV index with paths off its folder).
    assert f"(the first, {data / 'date' / 'broken.png'}: " in error_line(nothing.stderr)


def test_confusion_matrix_png_is_readable_with_100_classes(tmp_path, monkeypatch):
    """Each class gets at least 22 pixels (a 7-point name). The figure is built with every
    artist but not rasterised: Agg took 1.5-2.5 s of CPU to paint 2,300 x 2,300 pixels and 200
    names, and savefig, asked for a plain PNG (no bbox_inches, no dpi of its own), writes the
    figure's size at its dpi; a drawn PNG is read in the report's test."""
    from matplotlib.figure import Figure

    from torchkit.core.evaluate.reports import plot_confusion_matrix

    saved = []

    from torchkit.core.io.output_proofs import PNG_METADATA

    def sized_png(figure, path, **kwargs):
        width, height = figure.get_size_inches() * figure.dpi
        saved.append((round(width), round(height), kwargs))
        Image.new("RGB", (1, 1)).save(path, format="PNG")

    monkeypatch.setattr(Figure, "savefig", sized_png)
    rng = np.random.default_rng(0)
    cm = rng.integers(0, 3, size=(100, 100)) + np.eye(100, dtype=int) * 20
    path = tmp_path / "cm.png"
    plot_confusion_matrix(cm, [f"class_{i:03d}" for i in range(100)], path, normalize=True)
    [(width, height, kwargs)] = saved
    # the PNG's pixels are the figure's (no dpi of savefig's), with torchkit's Software text
    assert kwargs == {"format": "png", "metadata": PNG_METADATA}
    assert min(width, height) >= 100 * 22  # at least 22 pixels (a 7-point name) per class
    assert path.is_file() and not list(tmp_path.glob(".*.tmp*"))  # atomically, no leftovers


def test_torchrun_two_processes_give_the_same_numbers(setup, report, tmp_path):
    """2 Gloo processes over 41 images (21 + 20: nothing padded, nothing dropped), started as
    torchrun starts them (gloo_ranks: its variables, without its agent, whose own start cost
    seconds; eval reads the agent's variable only when a rank fails). Each rank forks its
    loader worker before the process group starts Gloo's threads (gloo_tcp_loop,
    pt_gloo_runloop; rank 0's TCPStore server): a process forked beside a thread may deadlock
    in the child on a lock that thread held (predict's: test_predict.py's torchrun test)."""
    out = tmp_path / "ddp"
    watch = tmp_path / "watch"
    ranks = run_ranks(
        "eval", setup["ckpt"], "--data", setup["data"], "--out", out, "--format", "json",
        "--topk", "3", "--workers", "1", "--batch-size", "7", "--device", "cpu",
        env=watching_forks(watch), timeout=300,
    )  # fmt: skip
    assert [done.returncode for done in ranks] == [0, 0], stderr_of(ranks)[-3000:]
    for rank in (0, 1):  # its one worker, forked with the main thread alone (Linux: /proc)
        forks = forks_noted(watch, rank)
        assert len(forks) == (1 if os.path.isdir("/proc/self/task") else 0), (rank, forks)
        assert all(len(threads) == 1 for threads in forks), (rank, forks)
    assert ranks[1].stdout == ""  # printed once, by rank 0 only
    ddp = json.loads(ranks[0].stdout)
    single = report["json"]
    assert ddp["world_size"] == 2 and single["world_size"] == 1
    for key in ("num_images", "accuracy", "topk_accuracy", "f1_macro", "f1_weighted"):
        assert ddp[key] == single[key], key
    assert_same_per_class(ddp["per_class"], single["per_class"])
    assert ddp["loss"] == pytest.approx(single["loss"], rel=1e-6)
    ddp_rows = _read_csv(out / "predictions.csv")[1]
    single_rows = _read_csv(report["out"] / "predictions.csv")[1]
    assert [r["path"] for r in ddp_rows] == [r["path"] for r in single_rows]
    assert [r["class_index"] for r in ddp_rows] == [r["class_index"] for r in single_rows]
    assert (out / "confusion_matrix.csv").read_text() == (
        report["out"] / "confusion_matrix.csv"
    ).read_text()


def test_errors_png_names_the_files_of_the_mistakes(report):
    _, rows = _read_csv(report["out"] / "predictions.csv")
    wrong = [r for r in rows if r["label"] != r["class"]]
    assert wrong, "the fixture's model makes mistakes"
    most_confident = max(wrong, key=lambda r: float(r["probability"]))
    assert Path(most_confident["path"]).name in report["figure_texts"]
