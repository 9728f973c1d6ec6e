"""A model with lazy layers (`nets:RecordedLazyNet`: LazyConv2d, LazyBatchNorm2d, LazyLinear,
and an auxiliary lazy head only its training forward runs) trained by 2 Gloo CPU ranks: the
resolver sizes it in each rank before DistributedDataParallel wraps it (DDP refuses
uninitialised parameters), and both ranks end with the same weights, the ones rank 0 saves."""

from __future__ import annotations

import pytest
import torch
from gloo_ranks import run_ranks, stderr_of
from image_folders import write_image_folder

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="torch.distributed missing"
)


def test_a_lazy_model_trains_under_ddp_to_the_same_weights_on_both_ranks(tmp_path):
    data = tmp_path / "data"
    write_image_folder(data / "train", {"a": 4, "b": 4}, seed=1)  # 2 global batches of 4
    write_image_folder(data / "val", {"a": 1, "b": 1}, seed=2)  # one image a rank
    weights = tmp_path / "weights"
    weights.mkdir()
    out = tmp_path / "run"
    ranks = run_ranks(
        "train", "--data", data, "--model", "nets:RecordedLazyNet", "--image-size", "8",
        "--batch-size", "2", "--epochs", "1", "--optimizer", "sgd", "--lr", "0.5",
        "--workers", "0", "--device", "cpu", "--out", out, "-q",
        env={"TORCHKIT_TEST_WEIGHTS_DIR": str(weights)},
    )  # fmt: skip
    assert [done.returncode for done in ranks] == [0, 0], stderr_of(ranks)[-4000:]

    saved = torch.load(out / "last.pt", weights_only=True)
    assert saved["global_step"] == 2 and saved["world_size"] == 2
    rank0 = torch.load(weights / "rank-0.pt", weights_only=True)
    rank1 = torch.load(weights / "rank-1.pt", weights_only=True)
    assert rank0["aux.0.weight"].shape == (8, 16)  # the lazy layers, sized (the head too)
    assert rank0["fc.weight"].shape == (2, 16)
    assert sorted(saved["model"]) == sorted(rank0) == sorted(rank1)
    for key, value in rank0.items():
        assert torch.equal(saved["model"][key], value), key  # what rank 0 trained to
        if "running_" not in key:  # BatchNorm statistics: each rank's last batch moved its own
            assert torch.equal(rank1[key], value), key
    assert saved["model"]["aux.1.num_batches_tracked"].item() == 2  # sizing counted none
