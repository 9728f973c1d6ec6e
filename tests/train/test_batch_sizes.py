"""How a run cuts its images into batches: a training set one image over a multiple of the
batch size leaves that image out with BatchNorm (torch cannot train BatchNorm on a batch of
one), and validation's batches are sized so that every loader worker has some."""

from __future__ import annotations

import pytest
import torch
from image_folders import write_image_folder

from torchkit.core.models.norms import has_batch_norm
from torchkit.core.train.loaders import lone_last_batch


@pytest.mark.parametrize(
    ("images", "batch_size", "lone"),
    [(9, 4, True), (5, 4, True), (8, 4, False), (10, 4, False), (1, 4, False), (3, 2, True)],
)
def test_a_lone_last_batch_is_one_image_after_a_full_batch(images, batch_size, lone):
    assert lone_last_batch(images, batch_size) is lone


def test_batch_norm_is_found_wherever_it_sits():
    plain = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())
    nested = torch.nn.Sequential(
        torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    )
    synced = torch.nn.Sequential(torch.nn.SyncBatchNorm(4))
    assert not has_batch_norm(plain) and not has_batch_norm(torch.nn.GroupNorm(2, 4))
    assert has_batch_norm(nested) and has_batch_norm(synced)


def _train(runner, root, out, model):
    from torchkit.cli import app

    return runner.invoke(
        app,
        ["train", "--data", str(root), "--model", model, "--image-size", "16", "--batch-size",
         "4", "--epochs", "2", "--device", "cpu", "-j", "0", "--out", str(out)],
    )  # fmt: skip


def _nine_images(root):
    """9 training images: in batches of 4, 4 + 4 + 1."""
    write_image_folder(root / "train", {"a": 5, "b": 4}, size=20)
    write_image_folder(root / "val", {"a": 1, "b": 1}, size=20, seed=1)
    return root


def test_batch_norm_trains_on_a_set_that_ends_in_one_image(runner, tmp_path):
    # torch raised on the batch of one.
    root = _nine_images(tmp_path / "data")
    result = _train(runner, root, tmp_path / "run", "nets:NoisyNet")
    assert result.exit_code == 0, result.stderr
    assert "each epoch's last training batch is left out: it would hold 1 image" in result.stderr
    checkpoint = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    assert checkpoint["global_step"] == 4  # 2 batches an epoch
    assert checkpoint["drop_last"] is False  # the run's recorded choice is cuDNN's alone


def test_a_model_without_batch_norm_keeps_the_lone_image(runner, tmp_path):
    root = _nine_images(tmp_path / "data")
    result = _train(runner, root, tmp_path / "run", "nets:TinyNet")
    assert result.exit_code == 0, result.stderr
    assert "left out" not in result.stderr
    checkpoint = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    assert checkpoint["global_step"] == 6  # 3 batches an epoch


# -- validation's batches shared among the workers (loaders.eval_batch_size) -----------------


def test_validation_batches_give_each_worker_about_two():
    from torchkit.core.train.loaders import MIN_SHARED_EVAL_BATCH, eval_batch_size

    assert eval_batch_size(800, 256, 14) == 32  # 4 batches of 256 left 10 of 14 workers idle
    assert eval_batch_size(8000, 256, 14) == 256  # enough batches: --batch-size
    assert eval_batch_size(200, 256, 2) == 50
    assert eval_batch_size(200, 256, 1) == eval_batch_size(200, 256, 0) == 256  # nobody to share
    assert eval_batch_size(10, 256, 8) == MIN_SHARED_EVAL_BATCH
    assert eval_batch_size(10, 16, 8) == 16  # never above --batch-size


def test_the_validation_loader_shares_its_images_and_the_figures_stay(tmp_path):
    from torchkit.core.train.config import TrainConfig
    from torchkit.core.train.loaders import build_loaders, load_splits, preprocess_for
    from torchkit.core.train.validation import resolve_defaults

    root = tmp_path / "data"
    write_image_folder(root / "train", {"a": 4, "b": 4}, size=20)
    write_image_folder(root / "val", {"a": 40, "b": 40}, size=20, seed=1)
    config = resolve_defaults(
        TrainConfig(data=str(root), image_size=16, workers=2, batch_size=64), is_digits=False
    )
    loaders = build_loaders(load_splits(config).splits, preprocess_for(config), config)
    try:
        assert loaders.val.batch_size == 32  # 80 images, 2 workers: 20 a batch, at least 32
        assert sum(len(batch.labels) for batch in loaders.val) == 80
    finally:
        loaders.close()
