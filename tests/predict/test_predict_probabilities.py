"""`predict`'s and `eval`'s probabilities are the softmax of the logits, bit for bit (the
exponent of the log-softmax differed from it by an ulp in about one row of eight)."""

from __future__ import annotations

import csv
import io

import pytest
import sklearn.metrics  # noqa: F401 - eval scores in this process, with no helper to wait for
import torch
from checkpoints import write_convnet_checkpoint
from eval_plots import lay_out_eval_plots_only
from image_folders import write_image_folder

from torchkit.cli import app
from torchkit.core.data.preprocessing import Preprocess

CLASSES = list("abcdefghij")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("probabilities")
    torch.manual_seed(0)
    ckpt = root / "model.pt"
    preprocess = Preprocess(image_size=12, resize_size=12, mean=(0.5,) * 3, std=(0.25,) * 3)
    write_convnet_checkpoint(
        ckpt,
        in_channels=3,
        image_size=12,
        classes="".join(CLASSES),
        preprocess=preprocess.to_dict(),
    )
    data = write_image_folder(root / "data", {"a": 8, "b": 8}, size=12)
    return ckpt, data


def rows_of(result) -> list[dict[str, str]]:
    assert result.exit_code == 0, result.stderr
    return list(csv.DictReader(io.StringIO(result.stdout)))


@pytest.mark.parametrize("amp", [[], ["--amp", "--amp-dtype", "bf16"]], ids=["float32", "bf16"])
def test_probabilities_are_torch_softmax_of_the_logits_bit_for_bit(runner, world, amp):
    ckpt, data = world
    k = len(CLASSES)
    command = ["predict", str(ckpt), str(data), "--device", "cpu", "-j", "0", "--logits"]
    rows = rows_of(runner.invoke(app, [*command, "--topk", str(k), "--format", "csv", *amp]))
    # 9 significant digits: every float32 logit and probability comes back exactly
    logits = torch.tensor([[float(r[f"logit_{i}"]) for i in range(k)] for r in rows])
    top = torch.tensor([[CLASSES.index(r[f"class_{j}"]) for j in range(1, k + 1)] for r in rows])
    got = torch.tensor([[float(r[f"probability_{j}"]) for j in range(1, k + 1)] for r in rows])
    expected = torch.softmax(logits, dim=1).gather(1, top)
    assert torch.equal(got, expected)
    assert torch.equal(got[:, 0], torch.tensor([float(r["probability"]) for r in rows]))


def test_evals_probabilities_are_predicts(runner, world, tmp_path, monkeypatch):
    lay_out_eval_plots_only(monkeypatch)  # the PNGs' pictures are not this test's (eval_plots)
    ckpt, data = world
    common = [str(ckpt), "--device", "cpu", "-j", "0"]
    report = tmp_path / "report"
    evaluated = runner.invoke(app, ["eval", *common, "--data", str(data), "--out", str(report)])
    assert evaluated.exit_code == 0, evaluated.stderr
    with open(report / "predictions.csv", newline="") as handle:
        from_eval = {r["path"]: r["probability"] for r in csv.DictReader(handle)}
    predicted = rows_of(runner.invoke(app, ["predict", *common, str(data), "--format", "csv"]))
    assert {r["path"]: r["probability"] for r in predicted} == from_eval
