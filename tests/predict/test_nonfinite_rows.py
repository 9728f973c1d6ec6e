"""predict's row of an image whose outputs are not finite: no class, class index or probability
(NaN ranks first, so the ranking's first class read as a prediction the model never made),
the error column saying why; the other rows as ever. The model is named on the command line as
`test_nonfinite_rows:BrightNanNet` (this module, imported by pytest)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import torch
from PIL import Image
from processes import run_torchkit_in_process
from torch import nn

HERE = Path(__file__).stem


class BrightNanNet(nn.Module):
    """Two classes; NaN outputs for an image brighter than the mean (the white one)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc(x.mean(dim=(2, 3)))
        bright = x.mean(dim=(1, 2, 3)) > 0
        return torch.where(bright[:, None], torch.full_like(out, float("nan")), out)


def _predict(tmp_path, fmt: str):
    for name, colour in (("k", 0), ("w", 255)):
        Image.new("RGB", (8, 8), (colour,) * 3).save(tmp_path / f"{name}.png")
    result = run_torchkit_in_process(
        "predict", f"{HERE}:BrightNanNet", "--allow-untrained", tmp_path / "k.png",
        tmp_path / "w.png", "--image-size", "8", "-j", "0", "--topk", "2", "--format", fmt,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_non_finite_row_names_no_class(tmp_path):
    first, nan = json.loads(_predict(tmp_path, "json"))
    assert nan["error"] == "non-finite output"
    predicted = ["class", "class_index", "probability", "class_1", "class_index_1"]
    predicted += ["probability_1", "class_2", "class_index_2", "probability_2"]
    assert [nan[key] for key in predicted] == [None] * 9
    assert list(nan).index("class_index_2") == list(nan).index("class_2") + 1
    assert first["error"] is None and first["class"] == first["class_1"]
    assert first["class_index"] in (0, 1) and 0 < first["probability"] <= 1


def test_a_non_finite_row_leaves_the_csv_fields_empty(tmp_path):
    first, nan = csv.DictReader(io.StringIO(_predict(tmp_path, "csv")))
    assert nan["error"] == "non-finite output"
    assert {nan[key] for key in ("class", "class_index", "probability", "class_2")} == {""}
    assert first["class"] in ("0", "1") and first["error"] == ""


def test_eval_writes_no_class_for_a_non_finite_row(tmp_path):
    """eval's predictions.csv (the same vocabulary): the white image, of the first class, was
    written as that class (NaN ranks it first) and `correct` 1."""
    for label, colour in (("a", 255), ("b", 0)):
        (tmp_path / "data" / label).mkdir(parents=True)
        Image.new("RGB", (8, 8), (colour,) * 3).save(tmp_path / "data" / label / "x.png")
    result = run_torchkit_in_process(
        "eval", f"{HERE}:BrightNanNet", "--allow-untrained", "--data", tmp_path / "data",
        "--image-size", "8", "-j", "0", "--out", tmp_path / "report", "--format", "json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    with open(tmp_path / "report" / "predictions.csv", newline="") as file:
        nan, finite = csv.DictReader(file)
    assert nan["path"] == "a/x.png" and nan["label"] == "a"
    predicted = ("class", "class_index", "probability", "correct", "class_1", "probability_1")
    assert {nan[key] for key in predicted} == {""}
    assert finite["class"] in ("a", "b") and finite["correct"] in ("0", "1")
