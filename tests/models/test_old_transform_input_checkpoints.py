"""googlenet and inception_v3 checkpoints of checkpoint format 1 trained from torchvision's named
weights (`--weights DEFAULT`) were trained with torchvision's `transform_input=True` on
ImageNet-normalised images; every command rebuilds them without it, so they are fed what
training fed their weights: mean/std 0.5 (the same input). Format 2 trains without it."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
import torchvision
from torch import nn

from torchkit.core.data.preprocessing import IMAGENET_MEAN, IMAGENET_STD
from torchkit.core.models import resolve_model
from torchkit.core.models.checkpoint import save_checkpoint
from torchkit.core.models.resolver import recorded_preprocess
from torchkit.core.models.transform_input import mean_std_as_trained

HALF = (0.5, 0.5, 0.5)
SIZES = {"googlenet": 32, "inception_v3": 80}


@pytest.fixture(autouse=True)
def _no_random_init(monkeypatch):
    """googlenet's and inception_v3's truncated-normal initialisation takes seconds, and every
    weight it draws is replaced by the checkpoint's."""
    from torchkit.core.models import builders

    off = {"init_weights": False}
    monkeypatch.setattr(builders, "INIT_KWARGS", {"googlenet": off, "inception_v3": off})


def _trained_with_transform_input(arch: str) -> nn.Module:
    """A 2-class model as torchvision builds it for its weights (transform_input, no auxiliary
    heads), with BatchNorm statistics of real activations (with the defaults the deep nets'
    outputs hardly depend on their input)."""
    torch.manual_seed(0)
    model = torchvision.models.get_model(
        arch, num_classes=2, aux_logits=False, transform_input=True, init_weights=False
    )
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.momentum = None  # the plain average of what it sees
    with torch.no_grad():
        model.train()(torch.rand(2, 3, SIZES[arch], SIZES[arch]))
    return model.eval()


def _old_checkpoint(model: nn.Module, arch: str, **changes: Any) -> dict:
    """What train saved of `--model ARCH --weights DEFAULT` before format 2 (its default
    mean/std: ImageNet's), with `changes` to the config and the preprocessing."""
    size = SIZES[arch]
    mean, std = changes.pop("mean", IMAGENET_MEAN), changes.pop("std", IMAGENET_STD)
    config = {"model": arch, "weights": "DEFAULT", "mean": list(mean), "std": list(std)}
    preprocess = {"image_size": size, "resize_size": size, "mean": list(mean), "std": list(std)}
    return {
        "format_version": changes.pop("format_version", 1),
        "torchkit_version": "0.1.0",
        "arch": arch,
        "num_classes": 2,
        "classes": ["a", "b"],
        "model": model.state_dict(),
        "config": {**config, **changes},
        "preprocess": preprocess,
    }


def _outputs(model: nn.Module, mean, std, pixels: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(torchvision.transforms.Normalize(mean, std)(pixels))


def test_an_old_checkpoint_answers_as_it_was_trained(tmp_path, arch="googlenet"):
    """Was rebuilt without transform_input and fed ImageNet-normalised images: outputs far
    from the trained model's (by up to 792 for a trained googlenet)."""
    truth = _trained_with_transform_input(arch)
    path = tmp_path / "best.pt"
    save_checkpoint(_old_checkpoint(truth, arch), path)
    pixels = torch.rand(2, 3, SIZES[arch], SIZES[arch])
    expected = _outputs(truth, IMAGENET_MEAN, IMAGENET_STD, pixels)  # as training fed it
    assert not torch.allclose(expected[0], expected[1])  # outputs that tell inputs apart
    # MODEL as the checkpoint (eval, predict, export, extract-features), --weights CHECKPOINT,
    # and the preprocessing train fine-tunes it with.
    for resolved in (resolve_model(str(path)), resolve_model(arch, weights=str(path))):
        assert not resolved.model.transform_input
        assert (resolved.preprocess.mean, resolved.preprocess.std) == (HALF, HALF)
        got = _outputs(resolved.model, resolved.preprocess.mean, resolved.preprocess.std, pixels)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-4 * float(expected.abs().max()))
    recorded = recorded_preprocess(str(path))
    assert recorded is not None and (recorded.mean, recorded.std) == (HALF, HALF)


@pytest.mark.parametrize(
    "changes",
    [
        {"format_version": 2},  # trained without transform_input, on the user's ImageNet mean/std
        {"mean": HALF, "std": HALF},  # format 1 after the change: train's 0.5
        {"weights": "weights/googlenet-1378be20.pth"},  # a file: loaded without transform_input
        {"weights": None},
    ],
)
def test_checkpoints_trained_without_transform_input_keep_their_mean_std(changes):
    checkpoint = _old_checkpoint(nn.Identity(), "googlenet", **changes)
    assert mean_std_as_trained(checkpoint, "best.pt") is None


def test_which_checkpoints_were_trained_with_transform_input():
    """Its named weights (any spelling torchvision takes), googlenet or inception_v3, trained
    from the name (a run fine-tuned from a checkpoint was rebuilt without it)."""
    for arch in ("googlenet", "inception_v3"):
        for weights in ("DEFAULT", "IMAGENET1K_V1"):
            checkpoint = _old_checkpoint(nn.Identity(), arch, weights=weights)
            assert mean_std_as_trained(checkpoint, "best.pt") == (HALF, HALF), (arch, weights)
    old = _old_checkpoint(nn.Identity(), "googlenet")
    for changed in ({"arch": "resnet18"}, {"config": {**old["config"], "model": "x/best.pt"}}):
        assert mean_std_as_trained({**old, **changed}, "best.pt") is None


def test_an_old_checkpoint_of_its_own_mean_std_is_warned_about_once(caplog):
    """Format 1 with a --mean/--std given: trained with transform_input before the change,
    without it after; which cannot be told, so it is fed as it records, with a warning that
    says what would feed it as trained with transform_input."""
    truth = _trained_with_transform_input("googlenet")
    mean, std = (0.4, 0.45, 0.5), (0.2, 0.25, 0.3)
    checkpoint = _old_checkpoint(truth, "googlenet", mean=mean, std=std)
    with caplog.at_level(logging.WARNING, logger="torchkit"):
        assert mean_std_as_trained(checkpoint, "mine.pt") is None
        assert mean_std_as_trained(checkpoint, "mine.pt") is None
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert message.startswith("mine.pt: a googlenet trained from torchvision's weights")
    given = message.split("takes --mean ")[1]
    fed_mean, fed_std = (
        tuple(float(v) for v in text.split(",")) for text in given.split(" --std ")
    )
    pixels = torch.rand(2, 3, 32, 32)
    expected = _outputs(truth, mean, std, pixels)
    truth.transform_input = False
    got = _outputs(truth, fed_mean, fed_std, pixels)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-4 * float(expected.abs().max()))


def test_resuming_an_old_run_feeds_it_as_it_was_trained(tmp_path):
    """--resume rebuilt the model without transform_input and went on feeding it
    ImageNet-normalised images; it now feeds (and records) mean/std 0.5, so the checkpoints it
    writes rebuild as trained. A run of format 2 keeps the ImageNet mean/std it was given."""
    from torchkit.core.train.config import TrainConfig
    from torchkit.core.train.setup import plan_run

    options = TrainConfig(
        data=str(tmp_path), model="googlenet", weights="DEFAULT", epochs=2, image_size=32,
        resize_size=32, mean=IMAGENET_MEAN, std=IMAGENET_STD, interpolation="bilinear",
    ).to_dict()  # fmt: skip
    for version, fed in ((1, HALF), (2, IMAGENET_MEAN)):
        run = tmp_path / f"format-{version}"
        run.mkdir()
        checkpoint = _old_checkpoint(nn.Identity(), "googlenet", format_version=version)
        training = {"optimizer": {}, "scheduler": {"updates": 0}, "epoch": 1, "config": options}
        save_checkpoint({**checkpoint, **training}, run / "last.pt")
        planned = plan_run(TrainConfig(resume=str(run)), overrides=[]).config
        assert (tuple(planned.mean), tuple(planned.std)) == (
            fed,
            HALF if version == 1 else IMAGENET_STD,
        )


def test_the_warning_about_an_old_checkpoint_gives_what_each_command_can_do(tmp_path, caplog):
    """The warning told `export` to give --mean/--std, which export does not take: it now says
    that the export records the checkpoint's mean/std and where the values go (eval or predict
    of the exported file); eval, which takes them, is still told --mean/--std."""
    checkpoint = _old_checkpoint(_trained_with_transform_input("googlenet"), "googlenet",
                                 mean=(0.4, 0.45, 0.5), std=(0.2, 0.25, 0.3))  # fmt: skip
    messages = {}
    for command in ("export", "eval"):
        path = tmp_path / f"{command}.pt"
        save_checkpoint(checkpoint, path)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="torchkit"):
            resolve_model(str(path), command=command)
        (messages[command],) = [record.getMessage() for record in caplog.records]
    assert "the export records the checkpoint's own: give --mean " in messages["export"]
    assert "to eval or predict of the exported file" in messages["export"]
    assert messages["eval"].endswith(messages["export"].split("give ")[1].split(" to eval")[0])
