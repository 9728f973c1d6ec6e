"""`--weights DEFAULT` of a timm model with an `--image-size` it cannot run at is refused before
the weights are fetched: the size error first, online or not; a size it runs at goes on to the
download (here refused as offline)."""

from __future__ import annotations

import importlib.util

import pytest

from torchkit.core.io.errors import OfflineError
from torchkit.core.models.size_bound import UnrunnableSizeError
from torchkit.core.models.timm_models import timm_pretrained

pytestmark = pytest.mark.skipif(importlib.util.find_spec("timm") is None, reason="needs timm")


def test_a_size_the_model_cannot_run_at_is_refused_before_its_weights_are_fetched(monkeypatch):
    import timm

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
    builds.clear()
    with pytest.raises(OfflineError, match="cannot download the pretrained weights"):
        timm_pretrained("timm/coatnet_nano_rw_224", "DEFAULT", image_size=64)
    assert builds[-1] is True
