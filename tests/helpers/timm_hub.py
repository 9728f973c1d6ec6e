"""timm's pretrained weights without a network: an offline Hugging Face cache that holds them as
a first download leaves them, and a tag given a test size beside its train size."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

HUB_COMMIT = "0" * 40  # the revision a Hugging Face cache's refs/main points to


def offline_hub(home: Path, monkeypatch) -> Path:
    """An empty Hugging Face cache under `home`, offline; returns its hub folder.
    huggingface_hub reads its settings at import, so they are set on its constants as well as
    in the environment."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return home / "hub"


def cache_weights(hub: Path, repo: str, model) -> None:
    """`model`'s weights as `hf_hub_download(repo, "model.safetensors")` finds them cached."""
    from safetensors.torch import save_file

    folder = hub / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(HUB_COMMIT)
    (folder / "snapshots" / HUB_COMMIT).mkdir(parents=True)
    save_file(model.state_dict(), str(folder / "snapshots" / HUB_COMMIT / "model.safetensors"))


def tag_with_test_size(home: Path, monkeypatch):
    """timm's pretrained test_resnet (its default tag, test_resnet.r160_in1k, trained at 160 px
    crops of 168 px images) given a test size, as resnet50.a1_in1k has one (trained at 224,
    tested at 288 uncropped): 192 px, uncropped. Its seeded weights are in an offline Hugging
    Face cache under `home`; the pretrained model is returned, in eval mode."""
    import timm
    import torch
    from timm.models import get_pretrained_cfg
    from timm.models._registry import _model_pretrained_cfgs

    hub = offline_hub(home, monkeypatch)
    config = get_pretrained_cfg("test_resnet.r160_in1k")  # a copy: the registry's is patched
    assert (config.input_size, config.crop_pct, config.test_input_size) == (
        (3, 160, 160),
        0.95,
        None,
    )
    tested = replace(config, test_input_size=(3, 192, 192), test_crop_pct=1.0)
    for name, registered in list(_model_pretrained_cfgs.items()):
        if registered == config:  # test_resnet and test_resnet.r160_in1k
            monkeypatch.setitem(_model_pretrained_cfgs, name, tested)
    torch.manual_seed(0)
    model = timm.create_model("test_resnet").eval()
    cache_weights(hub, config.hf_hub_id, model)
    return model
