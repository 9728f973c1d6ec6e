"""--channels-last on a model that also holds 5-D weights (a Conv3d inside an image model): its
4-D weights take the channels-last layout, the others stay as they are."""

from __future__ import annotations

import csv
import io

import pytest
import torch
from processes import run_torchkit_in_process
from torch import nn

from torchkit.core.runtime.device import to_channels_last

VOLUME_NET = """
import torch
from torch import nn


class VolumeNet(nn.Module):
    def __init__(self, num_classes=2):
        super().__init__()
        torch.manual_seed(0)  # the same weights in every run
        self.conv = nn.Conv2d(3, 4, 3)
        self.volume = nn.Conv3d(1, 2, 1)
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x):
        y = self.volume(self.conv(x).unsqueeze(1))
        return self.fc(y.mean(dim=(3, 4)).flatten(1))
"""


def test_only_four_dimensional_weights_become_channels_last():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Conv3d(4, 2, 1), nn.BatchNorm3d(2))
    assert to_channels_last(model) is model
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert not model[0].weight.is_contiguous()
    assert model[1].weight.is_contiguous() and model[1].weight.dim() == 5


# eval and benchmark call the same to_channels_last (their runs take seconds more each).
COMMANDS = {
    "predict": ("predict", "{spec}", "{images}", "--allow-untrained", "--logits", "--format")
    + ("csv",),
    "extract-features": ("extract-features", "{spec}", "{images}", "feats", "--allow-untrained"),
    "train": ("train", "--model", "{spec}", "--data", "{images}", "--val-split", "0.5")
    + ("--epochs", "1", "--batch-size", "2", "--out", "run"),
}


@pytest.mark.parametrize("command", COMMANDS)
def test_channels_last_runs_a_model_with_five_dimensional_weights(
    tmp_path, make_image_folder, command, monkeypatch
):
    """Before: 'Error: RuntimeError: required rank 4 tensor to use channels_last format', exit
    1, from every command that takes --channels-last; predict's logits are now the same as
    without it."""
    module = f"volumenet_{command.replace('-', '_')}"  # one module a case: imports are cached
    (tmp_path / f"{module}.py").write_text(VOLUME_NET)
    images = make_image_folder(tmp_path / "images", {"a": 2, "b": 2}, size=8)
    args = [arg.format(spec=f"{module}:VolumeNet", images=images) for arg in COMMANDS[command]]
    common = ["--image-size", "8", "-j", "0", "--device", "cpu"]
    result = run_torchkit_in_process(*args, *common, "--channels-last", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    if command == "predict":
        plain = run_torchkit_in_process(*args, *common, cwd=tmp_path)
        assert plain.returncode == 0, plain.stderr
        ours, theirs = (list(csv.reader(io.StringIO(run.stdout))) for run in (result, plain))
        assert [row[:4] for row in ours] == [row[:4] for row in theirs]  # path, label, class
        logits = [[float(x) for row in rows[1:] for x in row[5:-1]] for rows in (ours, theirs)]
        assert logits[0] == pytest.approx(logits[1], abs=1e-5)
