"""A weights file is read once per command: the read that sizes the model (its recorded image
size and channels) is the one loaded into it, so a trusted pickle's code runs once."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.checkpoints import (
    read_checkpoint,
    save_torchkit_checkpoint,
    write_convnet_checkpoint,
)
from tests.helpers.processes import run_torchkit_in_process


@pytest.fixture
def reads(monkeypatch) -> list[str]:
    """The paths `load_checkpoint` reads while the test runs."""
    from torchkit.core.models import checkpoint

    read: list[str] = []
    load = checkpoint.load_checkpoint

    def counted(path, **options):
        read.append(str(path))
        return load(path, **options)

    monkeypatch.setattr(checkpoint, "load_checkpoint", counted)
    return read


@pytest.mark.parametrize("layout", ["checkpoint", "state dict"])
def test_summary_of_a_weights_file_reads_it_once(tmp_path, reads, layout):
    """`summary convnet --weights FILE` read FILE to size the convnet, then again to load it."""
    weights = tmp_path / "weights.pt"
    write_convnet_checkpoint(weights, in_channels=1, image_size=8, classes="ab")
    size = []
    if layout == "state dict":  # its channels read from the stem's weights; no size recorded
        torch.save(read_checkpoint(weights)["model"], weights)
        size = ["--image-size", "8"]
    reads.clear()
    result = run_torchkit_in_process(
        "summary", "convnet", "--weights", weights, *size, "--trust-checkpoint", "--format", "json"
    )
    assert result.returncode == 0, result.stderr
    assert reads == [str(weights)]


@pytest.fixture
def checkpoint(tmp_path):
    """A torchkit checkpoint of the convnet for 8x8 RGB images of classes a and b."""
    path = tmp_path / "model.pt"
    write_convnet_checkpoint(path, in_channels=3, image_size=8, classes="ab")
    return path


def train(images, out) -> list:
    return ["train", "--data", images, "--out", out, "--val-split", "0.4", "--epochs", "1",
            "--batch-size", "2", "--workers", "0", "--device", "cpu"]  # fmt: skip


COMMANDS = {  # eval reads once too, but its metrics helper process costs seconds
    "predict": lambda model, images, out: ["predict", model, images, "--format", "json"],
    "extract-features": lambda model, images, out: ["extract-features", model, images, out],
    "export": lambda model, images, out: ["export", model, out / "model.ts"],
    "benchmark": lambda model, images, out: ["benchmark", model, "--iters", "1", "--warmup", "0"],
    "summary": lambda model, images, out: ["summary", model],
    "train from MODEL": lambda model, images, out: [*train(images, out), "--model", model],
    "train --weights": lambda model, images, out: [
        *train(images, out),
        "--model",
        "convnet",
        "--weights",
        model,
    ],
}


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_reads_a_checkpoint_once(tmp_path, image_folder, checkpoint, reads, command):
    """train read a checkpoint for the preprocessing it records, then again for its model."""
    args = COMMANDS[command](checkpoint, image_folder, tmp_path / "out")
    if command in ("predict", "extract-features"):
        args += ["-j", "0"]  # no loader worker forked in this process: not the subject here
    reads.clear()
    result = run_torchkit_in_process(*args)
    assert result.returncode == 0, result.stderr
    assert reads.count(str(checkpoint)) == 1, reads


def test_only_convert_syncbn_keeps_every_module_of_a_pickled_dict(tmp_path):
    # {'model': net, 'model_ema': ema}: a command that runs the model keeps `model` alone; an
    # EMA copy held for the whole run would double its memory.
    import torch
    from torch import nn

    from torchkit.core.models import ModelSpec, resolve_spec

    path = tmp_path / "pickled.pt"
    torch.save({"model": nn.Linear(2, 2), "model_ema": nn.Linear(2, 2)}, path)
    spec = ModelSpec(model=str(path), trust_checkpoint=True)
    assert resolve_spec(spec, command="predict").pickled_modules is None
    kept = resolve_spec(spec, command="convert-syncbn", every_pickled_module=True)
    assert list(kept.pickled_modules) == ["model", "model_ema"]


# Models sized from their weights: ViT and MaxViT (position embeddings, attention grids) are built
# for the image size a torchkit checkpoint records, timm's for that size and its channels.
def _tiny_torchvision(name: str, weights=None, num_classes: int = 1000, **size):
    """vit_b_16 and maxvit_t as torchvision builds them for `size`, with few, narrow layers (the
    real ones are 86M and 31M parameters): the same image_size / input_size keywords."""
    from torchvision.models.maxvit import MaxVit
    from torchvision.models.vision_transformer import VisionTransformer

    assert weights is None
    if name == "vit_b_16":
        image_size = size.get("image_size", 224)
        return VisionTransformer(image_size, 16, 1, 1, 8, 8, num_classes=num_classes)
    assert name == "maxvit_t", name
    return MaxVit(size.get("input_size", (224, 224)), stem_channels=8, partition_size=2,
                  block_channels=[8], block_layers=[1], head_dim=4, stochastic_depth_prob=0.0,
                  num_classes=num_classes)  # fmt: skip


SIZED = {"vit_b_16": 32, "maxvit_t": 64, "timm/test_vit": 32}  # what each checkpoint records


@pytest.fixture(params=list(SIZED))
def sized(request, tmp_path, monkeypatch):
    """(arch, a torchkit checkpoint of it built for SIZED[arch] px RGB images, classes a b)."""
    import torchvision

    from torchkit.core.models import resolve_model

    arch, size = request.param, SIZED[request.param]
    if arch.startswith("timm/"):
        pytest.importorskip("timm")
    else:
        monkeypatch.setattr(torchvision.models, "get_model", _tiny_torchvision)
    model = resolve_model(arch, image_size=size, num_classes=2).model
    path = tmp_path / "sized.pt"
    save_torchkit_checkpoint(path, arch, model, size)
    return arch, path


SIZED_COMMANDS = {
    # (no FLOP count: a third of the ViT's summary, and a pass over the model already built)
    "summary": lambda arch, path, images, out: ["summary", arch, "--weights", path, "--no-flops"],
    "train": lambda arch, path, images, out: [*train(images, out), "--model", arch, "--weights",
                                              path],
}  # fmt: skip


@pytest.mark.parametrize("command", SIZED_COMMANDS)
def test_a_model_sized_from_its_weights_reads_them_once(
    tmp_path, image_folder, sized, reads, command
):
    """The read that says the image size the model is built for is the one loaded into it."""
    arch, path = sized
    reads.clear()
    result = run_torchkit_in_process(*SIZED_COMMANDS[command](arch, path, image_folder,
                                                              tmp_path / "out"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert reads.count(str(path)) == 1, reads


def test_the_resolver_reads_the_weights_of_a_sized_model_once(sized, reads):
    from torchkit.core.models import ModelSpec, resolve_spec

    arch, path = sized
    reads.clear()
    resolved = resolve_spec(ModelSpec(model=arch, weights=str(path)), command="summary")
    assert resolved.sample_shape == (3, SIZED[arch], SIZED[arch])  # built for the recorded size
    assert reads == [str(path)]
