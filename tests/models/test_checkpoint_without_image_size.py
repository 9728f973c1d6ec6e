"""A torchkit checkpoint that records no image size (made by hand, or its `preprocess` lost):
its convnet, whose classifier is sized for its images, is built for the `--image-size` given,
as the error of weights that do not fit hints. It was built for the default 224 whatever the
option said, so following the hint failed with the same error."""

from __future__ import annotations

import json

import pytest
import torch
from image_folders import write_image_folder
from output_checks import error_line
from processes import run_torchkit_in_process

from torchkit.core.models.checkpoint import FORMAT_VERSION, save_checkpoint
from torchkit.core.models.convnet import convnet_class

SIDE = 12
PREPROCESS = {"image_size": SIDE, "resize_size": SIDE, "mean": [0.5] * 3, "std": [0.25] * 3}


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("unsized")
    torch.manual_seed(0)
    model = convnet_class()(2, 3, SIDE).eval()
    base = {
        "format_version": FORMAT_VERSION,
        "arch": "convnet",
        "num_classes": 2,
        "classes": ["a", "b"],
        "model": model.state_dict(),
    }
    save_checkpoint(base, root / "unsized.pt")
    save_checkpoint({**base, "preprocess": PREPROCESS}, root / "sized.pt")
    images = write_image_folder(root / "images", {"a": 2, "b": 2}, size=16)
    return {"root": root, "images": images, "model": model}


def _logits(done) -> list[list[float]]:
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    return [[row[f"logit_{i}"] for i in range(2)] for row in rows]


def test_the_hint_of_weights_that_do_not_fit_works_when_followed(world):
    unsized, images = world["root"] / "unsized.pt", world["images"]
    cpu = ["--device", "cpu", "-j", "0", "--format", "json", "--logits"]
    refused = run_torchkit_in_process("predict", unsized, images, *cpu)
    assert refused.returncode == 1
    assert error_line(refused.stderr).endswith("(check the model and --image-size)")
    options = ["--image-size", str(SIDE), "--resize-size", str(SIDE)]
    options += ["--mean", "0.5", "--std", "0.25"]
    got = _logits(run_torchkit_in_process("predict", unsized, images, *cpu, *options))
    expected = _logits(run_torchkit_in_process("predict", world["root"] / "sized.pt", images, *cpu))
    assert got == expected and len(got) == 4


def test_summary_counts_the_model_built_for_the_size_given(world):
    done = run_torchkit_in_process(
        "summary", world["root"] / "unsized.pt", "--image-size", str(SIDE), "--format", "json"
    )
    assert done.returncode == 0, done.stderr
    params = sum(p.numel() for p in world["model"].parameters())
    assert json.loads(done.stdout)["totals"]["total_params"] == params
