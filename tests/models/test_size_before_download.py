"""`--weights DEFAULT` of a timm model (or a torchvision ViT or MaxViT) with an `--image-size` it
cannot be built for or run at is refused before the weights are fetched: the size error first,
online or not; a size it runs at goes on to the download (here refused as offline)."""

from __future__ import annotations

import importlib.util

import pytest

from torchkit.core.io.errors import OfflineError, UsageError
from torchkit.core.models import resolver
from torchkit.core.models.size_bound import UnrunnableSizeError
from torchkit.core.models.timm_models import timm_pretrained

needs_timm = pytest.mark.skipif(importlib.util.find_spec("timm") is None, reason="needs timm")


@needs_timm
def test_a_size_the_model_cannot_run_at_is_refused_before_its_weights_are_fetched_undrawn(
    monkeypatch,
):
    """...by builds on the meta device (the size asked for, then two it may run at, for the
    hint), where torch's random initialisers would draw nothing but run its Python references
    (about half of each build's CPU): they are skipped there."""
    import timm
    import torch

    drawn: list[str] = []
    for method in ("normal_", "uniform_"):  # what nn.init's and timm's initialisers draw with

        def counted(self, *args, _real=getattr(torch.Tensor, method), **kwargs):
            drawn.append(self.device.type)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, method, counted)

    create_model = timm.create_model
    builds: list[bool] = []

    def no_network(name: str, pretrained: bool = False, **kwargs):
        builds.append(pretrained)
        if pretrained:  # timm's download of the weights
            raise OSError("no network here")
        return create_model(name, pretrained=pretrained, **kwargs)

    monkeypatch.setattr(timm, "create_model", no_network)
    # CoAtNet is built for 48 px but cannot run at it. Before: the weights were downloaded
    # (offline: "cannot download the pretrained weights ...") and only then the size refused.
    with pytest.raises(UnrunnableSizeError, match="cannot run on 48x48 images.*such as 32 or 64"):
        timm_pretrained("timm/coatnet_nano_rw_224", "DEFAULT", image_size=48)
    assert True not in builds
    assert drawn == []
    builds.clear()
    with pytest.raises(OfflineError, match="cannot download the pretrained weights"):
        timm_pretrained("timm/coatnet_nano_rw_224", "DEFAULT", image_size=64)
    assert builds[-1] is True


def test_a_size_a_torchvision_vit_cannot_be_built_for_is_refused_before_the_download(monkeypatch):
    downloads: list[str] = []

    def offline(name: str, weights: str):
        downloads.append(name)
        raise OfflineError(f"cannot download the {weights} weights of {name}")

    monkeypatch.setattr(resolver, "torchvision_pretrained", offline)
    with pytest.raises(UsageError, match="cannot build vit_b_16 for 40x40 images.*32 or 48"):
        resolver.resolve_model("vit_b_16", weights="DEFAULT", image_size=40, num_classes=2)
    assert downloads == []
    with pytest.raises(OfflineError):
        resolver.resolve_model("vit_b_16", weights="DEFAULT", image_size=32, num_classes=2)
    assert downloads == ["vit_b_16"]
