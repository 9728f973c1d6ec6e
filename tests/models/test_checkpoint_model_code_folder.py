"""A checkpoint of model code (`--model MODULE:Callable`, a module of the run's working
directory) loaded from another folder: every command that loads it imports the code from the
folder the checkpoint records (`model_code_folder`), as `train --resume` does, with no less
trust (`--trust-checkpoint`) than it needs from here."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from checkpoints import save_torchkit_checkpoint
from image_folders import write_image_folder
from output_checks import error_line
from processes import run_torchkit_in_process

NAME = "code_folder_net"  # a module no other test imports
SIDE = 8


@pytest.fixture
def world(tmp_path, monkeypatch) -> tuple[Path, Path, Path]:
    """(the folder the run found its code in, its checkpoint there, another folder): a model
    that answers b for every image (zero weights, a bias for b), its module in the first."""
    import torch

    start = tmp_path / "start"
    start.mkdir()
    (start / f"{NAME}.py").write_text(
        "from torch import nn\n"
        "def Tiny(num_classes=2):\n"
        "    pooled = [nn.AdaptiveAvgPool2d(1), nn.Flatten()]\n"
        "    return nn.Sequential(*pooled, nn.Linear(3, num_classes))\n"
    )
    write_image_folder(start / "data", {"a": 2, "b": 2}, size=SIDE)
    model = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
    model.append(torch.nn.Linear(3, 2))
    with torch.no_grad():
        model[2].weight.zero_()
        model[2].bias.copy_(torch.tensor([0.0, 1.0]))
    checkpoint = start / "best.pt"
    save_torchkit_checkpoint(checkpoint, f"{NAME}:Tiny", model, SIDE)
    recorded = torch.load(checkpoint, weights_only=True)
    torch.save({**recorded, "model_code_folder": str(start)}, checkpoint)  # as train records it
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setattr(sys, "path", list(sys.path))  # each command puts its folder there
    monkeypatch.delitem(sys.modules, NAME, raising=False)
    yield start, checkpoint, elsewhere
    sys.modules.pop(NAME, None)


def test_eval_and_predict_import_the_model_code_where_the_run_found_it(world):
    """From another folder, eval and predict said `cannot import model`; they import the
    module from the folder the checkpoint records, not another file of its name here (a
    note says so), and their answers are the checkpoint's model's."""
    start, checkpoint, elsewhere = world
    (elsewhere / f"{NAME}.py").write_text('raise ImportError("not the run\'s model")\n')
    note = (
        f"Note: {NAME}:Tiny, which {checkpoint} records, is imported from {start / NAME}.py, "
        f"where the run trained, not from {NAME}.py here"
    )
    common = ["--trust-checkpoint", "--device", "cpu", "--workers", "0", "--format", "json"]
    evaluated = run_torchkit_in_process(
        "eval", checkpoint, "--data", start / "data", *common, cwd=elsewhere
    )
    assert evaluated.returncode == 0, evaluated.stderr
    assert note in evaluated.stderr.splitlines()
    assert json.loads(evaluated.stdout)["accuracy"] == 0.5  # b for all: 2 of 4 right
    sys.modules.pop(NAME)  # predict imports it again
    predicted = run_torchkit_in_process(
        "predict", checkpoint, start / "data", *common, cwd=elsewhere
    )
    assert predicted.returncode == 0, predicted.stderr
    assert note in predicted.stderr.splitlines()
    rows = json.loads(predicted.stdout)
    assert [row["class"] for row in rows] == ["b"] * 4
    b_odds = math.exp(1)  # logits 0 and 1
    assert [row["probability"] for row in rows] == pytest.approx([b_odds / (1 + b_odds)] * 4)
    assert str(start) not in sys.path  # for those imports only


def test_model_code_found_in_neither_folder_is_one_error_and_needs_trust_first(world):
    """Without --trust-checkpoint the recorded folder is not searched: the refusal to run a
    file's code, as from here. Trusted, a module gone from both folders is one error line
    naming both, where it said `No module named` with a hint of this folder alone."""
    start, checkpoint, elsewhere = world
    data = ["--data", start / "data", "--device", "cpu", "--workers", "0"]
    untrusted = run_torchkit_in_process("eval", checkpoint, *data, cwd=elsewhere)
    assert untrusted.returncode != 0
    assert error_line(untrusted.stderr, besides="nothing") == (
        f"Error: {checkpoint} names the model code '{NAME}:Tiny', which would be imported and "
        "run to build the model (pass --trust-checkpoint to allow it, only if you trust where "
        "the file came from)"
    )
    assert NAME not in sys.modules
    (start / f"{NAME}.py").unlink()
    lost = run_torchkit_in_process("eval", checkpoint, *data, "--trust-checkpoint", cwd=elsewhere)
    assert lost.returncode == 2
    assert error_line(lost.stderr, besides="nothing") == (
        f"Error: cannot import model '{NAME}:Tiny', which {checkpoint} records: No module named "
        f"'{NAME}', neither in {start}, where the run trained, nor here (put {NAME}.py or "
        f"{NAME}/ back in {start}, or run torchkit from the folder that holds it now)"
    )


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        ({"model_code_folder": "/start", "data": {"workdir": "/other"}}, "/start"),
        ({"data": {"workdir": "/start"}}, "/start"),  # written before the folder was recorded
        ({"model_code_folder": "start"}, None),  # no absolute path: from here only
        ({"model_code_folder": "/st\0art"}, None),
        ({"model_code_folder": 3, "data": {"workdir": "/start"}}, None),  # made by hand
        ({"data": ["/start"]}, None),
        ({}, None),
    ],
)
def test_model_code_folder_is_the_recorded_absolute_folder_or_none(record, expected):
    from torchkit.core.models.usercode import model_code_folder

    assert model_code_folder(record) == expected
