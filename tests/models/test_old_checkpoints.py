"""Weights saved before PyTorch 0.4.1 have no BatchNorm `num_batches_tracked` buffers:
`load_state_dict` accepts them, and so do eval, summary, benchmark and export (they said
"20 missing keys (first: bn1.num_batches_tracked)"). Any other missing weight is refused as
before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torchvision
from image_folders import write_image_folder
from output_checks import error_line
from processes import run_torchkit_in_process

from torchkit.core.models import resolve_model
from torchkit.core.models.checkpoint import FORMAT_VERSION, save_checkpoint

COUNTER = "num_batches_tracked"


@pytest.fixture(scope="module")
def old(tmp_path_factory) -> dict:
    """A two-class resnet18 (trained BatchNorm statistics) saved as PyTorch 0.4 saved it: a
    state dict `old.pt`, and the same in a torchkit checkpoint `old_tk.pt`."""
    root = tmp_path_factory.mktemp("old")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=2).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-1, 1)
                module.num_batches_tracked.fill_(7)
    state = {k: v for k, v in model.state_dict().items() if not k.endswith(COUNTER)}
    torch.save(state, root / "old.pt")
    checkpoint = {"format_version": FORMAT_VERSION, "arch": "resnet18", "num_classes": 2}
    save_checkpoint({**checkpoint, "classes": ["a", "b"], "model": state}, root / "old_tk.pt")
    del state["fc.bias"]
    torch.save(state, root / "no_fc_bias.pt")
    write_image_folder(root / "imgs", {"a": 2, "b": 1}, size=32)
    return {"root": root, "model": model}


def test_old_state_dict_loads_with_counters_as_torch_leaves_them(old):
    resolved = resolve_model("resnet18", weights=str(old["root"] / "old.pt"))
    loaded = resolved.model.state_dict()
    for key, value in old["model"].state_dict().items():
        if key.endswith(COUNTER):
            assert loaded[key].item() == 0, key  # a new model's, as load_state_dict leaves it
        else:
            assert torch.equal(loaded[key], value), key


COMMANDS = {
    "eval": ["--data", "imgs", "--image-size", "32", "--resize-size", "32", "-j", "0"],
    "summary": ["-i", "3,32,32", "--no-flops", "--format", "json"],
    "benchmark": ["-i", "3,32,32", "-b", "1", "--warmup", "0", "--iters", "1", "--device", "cpu"],
    # + a file in the test's own folder; unverified: the verification runs the model built in
    # memory against the file written from it, after the weights were loaded (about a third
    # of the case's CPU)
    "export": ["--image-size", "32", "--no-verify", "--out"],
}


# Each command with weights named (`resnet18 --weights old.pt`) and with a checkpoint as MODEL,
# but export with weights named only: it builds the model through the same resolver as
# benchmark, whose two branches for the two kinds of file the other commands take both ways
# (tracing resnet18 costs about a second of CPU a case).
CASES = [
    (command, given)
    for command in COMMANDS
    for given in ("weights", "model_file")
    if (command, given) != ("export", "model_file")
]


@pytest.mark.parametrize(("command", "given"), CASES)
def test_commands_take_weights_without_batch_counters(old, tmp_path, command, given):
    model = ["resnet18", "--weights", "old.pt"] if given == "weights" else ["old_tk.pt"]
    extra = [str(tmp_path / "r.ts")] if command == "export" else []
    done = run_torchkit_in_process(command, *model, *COMMANDS[command], *extra, cwd=old["root"])
    assert done.returncode == 0, done.stderr
    if command == "summary":
        total = sum(p.numel() for p in old["model"].parameters())
        assert json.loads(done.stdout)["totals"]["total_params"] == total


def test_a_missing_weight_is_still_refused(old):
    done = run_torchkit_in_process(
        "summary", "resnet18", "--weights", "no_fc_bias.pt", "-i", "3,32,32", cwd=old["root"]
    )
    assert done.returncode == 1
    assert error_line(done.stderr) == (
        f"Error: the weights in {Path('no_fc_bias.pt')} do not fit the model: 1 missing keys "
        "(first: fc.bias) (check the model)"
    )
