"""A model (or a layer) that gives no values per image, (N, 0): predict and eval refuse it in the
one line they give for any output that is not logits, and extract-features refuses such a layer,
instead of an IndexError out of the ranking or an array of empty rows counted as non-finite."""

from __future__ import annotations

import textwrap

import pytest
from output_checks import error_line
from processes import run_torchkit_in_process

# Classes in a module of the test's working folder (importable as `package.module:Callable`).
EMPTY_MODULE = textwrap.dedent(
    """
    import torch

    class NoClassNet(torch.nn.Module):
        def __init__(self, num_classes=2):
            super().__init__()
            self.head = torch.nn.Linear(3, num_classes)

        def forward(self, x):
            return self.head(x.mean(dim=(2, 3)))[:, :0]

    class EmptyMapNet(torch.nn.Module):
        def __init__(self, num_classes=2):
            super().__init__()
            self.body = torch.nn.Conv2d(3, 4, 1)
            self.head = torch.nn.Linear(4, num_classes)

        def forward(self, x):
            empty = self.body(x)[:, :0]  # (N, 0, H, W): a layer with no channels
            return self.head(self.body(x).mean(dim=(2, 3)) + empty.sum())
    """
)


@pytest.fixture
def work(tmp_path, image_folder):
    (tmp_path / "empty_outputs_nets.py").write_text(EMPTY_MODULE)
    return tmp_path


@pytest.mark.parametrize("command", ["predict", "eval"])
def test_a_model_with_no_class_outputs_is_one_error_line(work, image_folder, command):
    args = ["empty_outputs_nets:NoClassNet", image_folder]
    if command == "eval":
        args = ["--model", args[0], "--data", args[1], "--num-classes", "2"]
    done = run_torchkit_in_process(
        command, *args, "--image-size", "8", "--allow-untrained", "--device", "cpu",
        "--workers", "0", "--batch-size", "5", cwd=work,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert error_line(done.stderr) == (
        "Error: the model returns a tensor of shape (5, 0) for a batch of 5 images, not the (5, "
        "classes) logits of a classifier (eval and predict score classifiers: give a model "
        "whose forward returns its logits alone, or wrap it in a module that picks them)"
    )


@pytest.mark.parametrize(
    ("net", "layer", "shape"),
    [("NoClassNet", "logits", "(5, 0)"), ("EmptyMapNet", "getitem", "(5, 0, 8, 8)")],
)
def test_extract_features_refuses_a_layer_with_no_values(work, image_folder, net, layer, shape):
    done = run_torchkit_in_process(
        "extract-features", f"empty_outputs_nets:{net}", image_folder, "features", "-l", layer,
        "--image-size", "8", "--allow-untrained", "--device", "cpu", "--workers", "0",
        "--batch-size", "5", cwd=work,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert error_line(done.stderr) == (
        f"Error: layer {layer} gives shape {shape}: no values for an image (pick another layer: "
        "--list-layers lists them)"
    )
    assert not (work / "features").exists()
