"""eval at many classes: the confusion matrix is counted as its non-zero cells (ConfusionPairs),
so counting, the most confused classes and the reports follow the images, not C x C; above
DENSE_CONFUSION_MAX_CLASSES classes --out writes confusion_pairs.csv instead of the dense
confusion_matrix.csv and .png. Both paths agree with scikit-learn."""

from __future__ import annotations

import csv
import json
import logging

import numpy as np
import pytest
from checkpoints import write_convnet_checkpoint
from eval_plots import lay_out_eval_plots_only
from image_folders import write_image_folder
from processes import run_torchkit_in_process
from sklearn.metrics import confusion_matrix, precision_recall_fscore_support

from torchkit.core.data.sources.samples import Samples
from torchkit.core.evaluate import reports
from torchkit.core.evaluate.metrics import ConfusionPairs, compute_metrics
from torchkit.core.evaluate.results import EvalResult, Predictions


def _read_csv(path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.reader(handle))


def _records(path) -> list[dict[str, str]]:
    header, *rows = _read_csv(path)
    return [dict(zip(header, row, strict=True)) for row in rows]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pairs_agree_with_sklearn_and_the_dense_matrix(seed):
    rng = np.random.default_rng(seed)
    num_classes = 9  # the last one never occurs; labels out of range are left out as sklearn does
    y_true = rng.integers(-1, num_classes - 1, size=200)
    y_pred = np.where(rng.random(200) < 0.4, y_true, rng.integers(0, num_classes + 1, size=200))
    pairs = ConfusionPairs.counted(y_true, y_pred, num_classes)
    cm = confusion_matrix(y_true, y_pred, labels=np.arange(num_classes))
    np.testing.assert_array_equal(pairs.dense(), cm)
    assert (pairs.count > 0).all() and len(pairs.count) == np.count_nonzero(cm)
    np.testing.assert_array_equal(pairs.support(), cm.sum(axis=1))
    np.testing.assert_array_equal(pairs.predictions(), cm.sum(axis=0))
    np.testing.assert_array_equal(pairs.correct(), np.diag(cm))
    for label, found in enumerate(pairs.most_confused(3)):
        others = sorted(
            (-cm[label, j], j) for j in range(num_classes) if j != label and cm[label, j]
        )
        assert found == [(j, -n) for n, j in others[:3]]


class _Scorer:
    """scikit-learn's answer without scikit-learn's seconds: zeros (the reports' shape is what
    these tests look at, the scores are checked against scikit-learn elsewhere)."""

    def call(self, request):
        zeros = [0.0] * request["num_classes"]
        return {
            "precision": zeros,
            "recall": zeros,
            "f1": zeros,
            "accuracy": 0.0,
            "macro": [0.0, 0.0, 0.0],
            "weighted": [0.0, 0.0, 0.0],
            "f1_micro": 0.0,
            "averaged_classes": request["num_classes"],
        }


class _Painter:
    """A plot helper that draws nothing and says it drew: which plots were asked for."""

    def __init__(self) -> None:
        self.kinds: list[str] = []

    def draw(self, kind, path, **values) -> bool:
        self.kinds.append(kind)
        return True


def test_reports_above_the_class_limit_never_build_the_matrix(tmp_path, monkeypatch, caplog):
    """One class above the limit (one image each): confusion_pairs.csv, in label order, and no
    dense CSV or PNG; nothing builds the C x C matrix, and one warning says so."""
    monkeypatch.setattr(ConfusionPairs, "dense", None)  # any use of it fails
    num_classes = reports.DENSE_CONFUSION_MAX_CLASSES + 1
    rng = np.random.default_rng(0)
    y_true = np.arange(num_classes)
    y_pred = np.where(rng.random(num_classes) < 0.5, y_true, rng.integers(0, 7, num_classes))
    topk = np.stack([y_pred, (y_pred + 1) % num_classes], axis=1)
    metrics = compute_metrics(y_true, y_pred, topk, num_classes, 2, scorer=_Scorer())
    classes = [f"c{i}" for i in range(num_classes)]
    classes[3] = "a,b"  # quoted as every CSV field is
    predictions = Predictions(
        y_true, y_true, topk, np.full((num_classes, 2), 0.5, np.float32),
        np.ones(num_classes, np.float32), np.ones(num_classes, bool),
    )  # fmt: skip
    samples = Samples(classes, y_true.tolist(), paths=[f"{i}.png" for i in y_true])
    result = EvalResult(classes, metrics, predictions, samples, 1.0, [], 1.0, {}, topk=2)
    painter = _Painter()
    with caplog.at_level(logging.WARNING, logger="torchkit"):
        written = reports.write_reports(result, tmp_path / "out", painter=painter)
    names = ["metrics.json", "per_class.csv", "confusion_pairs.csv", "predictions.csv"]
    assert [path.name for path in written] == [*names, "errors.png"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(names)  # PNGs: painter
    assert painter.kinds == ["errors"]
    assert [r.getMessage() for r in caplog.records] == [
        f"{num_classes} classes: confusion_pairs.csv lists the confusion matrix's non-zero cells "
        "(true,predicted,count); confusion_matrix.csv and .png are written up to "
        f"{reports.DENSE_CONFUSION_MAX_CLASSES} classes"
    ]
    table = _read_csv(tmp_path / "out" / "confusion_pairs.csv")
    assert table[0] == ["true", "predicted", "count"]
    wrong = np.flatnonzero(y_pred != y_true)
    expected = sorted(zip(y_true.tolist(), y_pred.tolist(), strict=True))
    assert table[1:] == [[classes[t], classes[p], "1"] for t, p in expected]
    assert table[4][0] == "a,b"
    per_class = {row["label"]: row for row in _records(tmp_path / "out/per_class.csv")}
    first = wrong[0]
    assert per_class[classes[first]]["confused_with_1"] == f"{classes[y_pred[first]]}:1"


def _counts_from_report(out, classes: list[str]) -> np.ndarray:
    """The confusion matrix a user reads from --out: confusion_matrix.csv, or the cells of
    confusion_pairs.csv."""
    index = {name: i for i, name in enumerate(classes)}
    cm = np.zeros((len(classes), len(classes)), dtype=np.int64)
    if (out / "confusion_matrix.csv").exists():
        table = _read_csv(out / "confusion_matrix.csv")
        assert [row[0] for row in table[1:]] == table[0][1:] == classes
        return np.array([row[1:] for row in table[1:]], dtype=np.int64)
    table = _read_csv(out / "confusion_pairs.csv")
    assert table[0] == ["true", "predicted", "count"]
    for true, predicted, count in table[1:]:
        cm[index[true], index[predicted]] = int(count)
    return cm


@pytest.mark.parametrize("limit", [6, 5], ids=["dense", "pairs"])
def test_both_reports_agree_with_sklearn_from_predictions_csv(tmp_path, monkeypatch, limit):
    """eval --out on 6 classes (one with no images) with the limit at 6 (the dense matrix and
    its PNG) and at 5 (confusion_pairs.csv and a warning): the same counts, scikit-learn's."""
    lay_out_eval_plots_only(monkeypatch)  # the PNGs' pictures are not this test's (eval_plots)
    monkeypatch.setattr(reports, "DENSE_CONFUSION_MAX_CLASSES", limit)
    classes = "abcdef"
    ckpt = tmp_path / "model.pt"
    write_convnet_checkpoint(ckpt, in_channels=3, image_size=8, classes=classes)
    data = write_image_folder(tmp_path / "data", {"a": 4, "b": 3, "c": 3, "d": 2, "e": 3})
    out = tmp_path / "out"
    result = run_torchkit_in_process(
        "eval", ckpt, "--data", data, "--out", out, "--device", "cpu", "-j", "0",
        "--format", "json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    dense = limit == len(classes)
    assert ("confusion_pairs.csv" in result.stderr) is not dense
    assert (out / "confusion_matrix.png").exists() is dense
    rows = _records(out / "predictions.csv")
    y_true = np.array([int(row["label_index"]) for row in rows])
    y_pred = np.array([int(row["class_index"]) for row in rows])
    labels = np.arange(len(classes))
    cm = confusion_matrix(y_true, y_pred, labels=labels)
    assert cm.trace() < len(rows), "the untrained model should make mistakes"
    np.testing.assert_array_equal(_counts_from_report(out, list(classes)), cm)
    p, r, f, s = precision_recall_fscore_support(
        y_true, y_pred, labels=labels, average=None, zero_division=0
    )
    per_class = json.loads((out / "metrics.json").read_text())["per_class"]
    for label, row in enumerate(per_class):
        assert (row["support"], row["predicted"]) == (s[label], cm[:, label].sum())
        assert [row["precision"], row["recall"], row["f1"]] == pytest.approx(
            [p[label], r[label], f[label]], abs=1e-12
        )
        others = sorted((-cm[label, j], j) for j in labels if j != label and cm[label, j])
        assert row["confused_with"] == [
            {"class": classes[j], "index": int(j), "count": -n} for n, j in others
        ]


def test_the_per_class_table_shows_the_classes_of_lowest_f1_and_says_how_to_see_all():
    """1,000 ImageNet classes printed 1,000 rows: the table shows MOST_CLASS_ROWS, those of
    lowest F1 (then most images, then label order), and says in its last line how many it
    leaves out and how to see them (--all-classes: every class, in label order);
    per_class.csv's rows (--format csv) and JSON keep all 1,000."""
    from torchkit.cli.evaluate import MOST_CLASS_ROWS, per_class_table
    from torchkit.cli.render import render_plain_tables

    num_classes = 1000
    rng = np.random.default_rng(0)
    y_true = np.repeat(np.arange(num_classes), 2)
    y_pred = np.where(rng.random(len(y_true)) < 0.6, y_true, rng.integers(0, 999, len(y_true)))
    topk = np.stack([y_pred, (y_pred + 1) % num_classes], axis=1)
    metrics = compute_metrics(y_true, y_pred, topk, num_classes, 2)
    classes = [f"c{i}" for i in range(num_classes)]
    predictions = Predictions(
        y_true, y_true, topk, np.full((len(y_true), 2), 0.5, np.float32),
        np.ones(len(y_true), np.float32), np.ones(len(y_true), bool),
    )  # fmt: skip
    samples = Samples(classes, y_true.tolist(), paths=[f"{i}.png" for i in range(len(y_true))])
    result = EvalResult(classes, metrics, predictions, samples, 1.0, [], 1.0, {}, topk=2)

    table = per_class_table(result)
    worst = sorted(range(num_classes), key=lambda c: (metrics.f1[c], -metrics.support[c], c))
    assert [row[1] for row in table.rows] == worst[:MOST_CLASS_ROWS]
    assert [row[0] for row in table.rows] == [classes[c] for c in worst[:MOST_CLASS_ROWS]]
    shown = render_plain_tables([table], width=120)
    assert len(shown.splitlines()) < MOST_CLASS_ROWS + 12  # not a line per class
    words = " ".join(shown.split())  # the title and the note wrap
    assert f"Per class, the {MOST_CLASS_ROWS} with the lowest F1" in words
    assert words.endswith(
        f"{num_classes - MOST_CLASS_ROWS} of 1,000 classes not shown: --all-classes shows them "
        "all, and --format csv or json, or --out's per_class.csv, list them"
    )
    every = per_class_table(result, all_classes=True)
    assert [row[1] for row in every.rows] == list(range(num_classes))
    assert every.note is None and "lowest" not in every.title
    assert len(result.per_class_rows()) == len(result.to_dict()["per_class"]) == num_classes
