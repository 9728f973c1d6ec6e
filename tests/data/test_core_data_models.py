"""Basics of the data (`core.datasource`, `core.dataset`, `core.transforms`) and core.models
that every command builds on."""

from __future__ import annotations

import urllib.error
from collections import Counter
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from torchkit.core.data.batches import collate_skipping_unreadable
from torchkit.core.data.dataset import make_dataset
from torchkit.core.data.preprocessing import Preprocess
from torchkit.core.data.sources import csv_samples
from torchkit.core.data.sources.digits import digits_splits
from torchkit.core.data.sources.discovery import discover_image_folder
from torchkit.core.data.sources.splitting import largest_remainder_counts, stratified_split
from torchkit.core.data.transforms import eval_transform
from torchkit.core.io.errors import InputError, OfflineError, UsageError
from torchkit.core.models import build_model, find_head, model_from_checkpoint, replace_head


def hamilton(n: int, weights: list[Fraction]) -> list[int]:
    """Largest-remainder apportionment in exact arithmetic, written independently of core."""
    exact = [n * w for w in weights]
    counts = [int(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: n - sum(counts)]:
        counts[i] += 1
    return counts


# Splits ----------------------------------------------------------------------------------------


def test_digits_splits_are_stratified_80_10_10():
    from sklearn.datasets import load_digits

    target = load_digits().target
    splits = digits_splits()
    assert list(splits) == ["train", "val", "test"]
    assert sum(len(s) for s in splits.values()) == len(target) == 1797
    ids = [set(s.ids) for s in splits.values()]
    assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
    weights = [Fraction(8, 10), Fraction(1, 10), Fraction(1, 10)]
    for label, total in Counter(target.tolist()).items():
        expected = hamilton(total, weights)
        got = [s.class_counts()[label] for s in splits.values()]
        assert got == expected, (label, got, expected)
    train = splits["train"]
    assert train.classes == [str(c) for c in range(10)]
    assert train.images.dtype == np.uint8 and train.images.shape[1:] == (8, 8)
    assert train.images.max() == 255  # 0..16 scaled to 0..255
    index = int(train.ids[0].split("/")[1])
    np.testing.assert_array_equal(
        train.images[0], np.rint(load_digits().images[index] * 255 / 16).astype(np.uint8)
    )
    assert train.labels[0] == target[index]


def test_largest_remainder_19_at_8_1_1():
    assert largest_remainder_counts(19, [0.8, 0.1, 0.1]) == [15, 2, 2]
    labels = [0] * 19
    parts = stratified_split(labels, (8, 1, 1), seed=0)
    assert [len(p) for p in parts] == [15, 2, 2]
    assert sorted(i for p in parts for i in p) == list(range(19))


@pytest.mark.parametrize("n", [0, 1, 7, 10, 19, 101])
def test_largest_remainder_matches_exact_arithmetic(n):
    weights = [Fraction(7, 10), Fraction(2, 10), Fraction(1, 10)]
    assert largest_remainder_counts(n, [0.7, 0.2, 0.1]) == hamilton(n, weights)


def test_stratified_split_is_reproducible_and_per_class():
    labels = [0] * 30 + [1] * 11 + [2] * 5
    first = stratified_split(labels, (0.8, 0.2), seed=3)
    assert stratified_split(labels, (0.8, 0.2), seed=3) == first
    assert stratified_split(labels, (0.8, 0.2), seed=4) != first
    counts = [Counter(labels[i] for i in part) for part in first]
    assert [counts[0][c] for c in (0, 1, 2)] == [24, 9, 4]
    assert [counts[1][c] for c in (0, 1, 2)] == [6, 2, 1]


# Image folders and CSV indexes -----------------------------------------------------------------


def test_discover_image_folder(tmp_path, make_image_folder):
    root = make_image_folder(tmp_path / "data", {"dog": 2, "cat": 3})
    (root / "cat" / "notes.txt").write_text("not an image")
    nested = root / "dog" / "more"
    nested.mkdir()
    Image.new("RGB", (8, 8)).save(nested / "deep.jpg")
    samples = discover_image_folder(root)
    assert samples.classes == ["cat", "dog"]
    assert samples.labels == [0, 0, 0, 1, 1, 1]
    assert samples.ids[:3] == ["cat/cat_0.png", "cat/cat_1.png", "cat/cat_2.png"]
    assert "dog/more/deep.jpg" in samples.ids
    assert all(Path(p).is_file() for p in samples.paths)
    assert samples.class_counts() == [3, 3]


def test_discover_image_folder_errors(tmp_path):
    with pytest.raises(InputError, match="dataset folder not found"):
        discover_image_folder(tmp_path / "missing")
    flat = tmp_path / "flat"
    flat.mkdir()
    Image.new("RGB", (8, 8)).save(flat / "x.png")
    with pytest.raises(InputError, match="holds images but no class folders") as caught:
        discover_image_folder(flat)
    assert "ROOT/<class>/<image>" in caught.value.hint
    empty = tmp_path / "empty"
    (empty / "a").mkdir(parents=True)
    with pytest.raises(InputError, match="no images in"):
        discover_image_folder(empty)


def test_read_csv_index(tmp_path, make_image_folder):
    root = make_image_folder(tmp_path / "data", {"x": 3})
    index = root / "index.csv"
    index.write_text(
        "path,label\nx/x_0.png,10\nx/x_1.png,2\n" + f"{(root / 'x' / 'x_2.png').resolve()},2\n"
    )
    samples = csv_samples(index)
    assert samples.classes == ["2", "10"]  # numbers in natural order, not "10" < "2"
    assert samples.labels == [1, 0, 0]
    assert samples.paths[0] == str(root / "x" / "x_0.png")  # relative to the CSV's folder
    assert all(Path(p).is_file() for p in samples.paths)
    bad = tmp_path / "bad.csv"
    bad.write_text("file,class\na.png,1\n")
    with pytest.raises(InputError, match="needs `path` and `label` columns"):
        csv_samples(bad)


def test_collate_skips_unreadable_images(tmp_path, make_image_folder):
    root = make_image_folder(tmp_path / "data", {"a": 3, "b": 2})
    good = root / "a" / "a_0.png"
    (root / "a" / "a_1.png").write_bytes(b"not a png at all")
    (root / "b" / "b_0.png").write_bytes((root / "b" / "b_1.png").read_bytes()[:60])  # truncated
    samples = discover_image_folder(root)
    preprocess = Preprocess(image_size=8, resize_size=8, mean=(0.5,) * 3, std=(0.25,) * 3)
    dataset = make_dataset(samples, eval_transform(preprocess))
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=8, collate_fn=collate_skipping_unreadable
    )
    (batch,) = list(loader)
    assert batch.images.shape == (3, 3, 8, 8)
    assert batch.labels.tolist() == [0, 0, 1]
    assert len(batch.errors) == 2
    assert any("a_1.png" in e for e in batch.errors) and any("b_0.png" in e for e in batch.errors)
    # The surviving image went through ToTensor + Normalize: check against NumPy.
    expected = (np.asarray(Image.open(good).convert("RGB"), dtype=np.float32) / 255 - 0.5) / 0.25
    first = batch.indices.tolist().index(samples.paths.index(str(good)))
    np.testing.assert_allclose(batch.images[first].permute(1, 2, 0).numpy(), expected, atol=1e-6)
    nothing = collate_skipping_unreadable([(None, 0, 0, "x: broken")])
    assert nothing.images is None and nothing.errors == ["x: broken"]


# Models ----------------------------------------------------------------------------------------


def test_build_convnet_any_channels_and_size():
    model = build_model("convnet", 4, image_size=12, in_channels=1).eval()
    with torch.no_grad():
        assert model(torch.zeros(2, 1, 12, 12)).shape == (2, 4)
    assert find_head(model)[0] == "classifier.4"
    with pytest.raises(UsageError, match="at least 6x6"):
        build_model("convnet", 4, image_size=5)


def test_build_torchvision_models_and_replace_heads():
    resnet = build_model("resnet18", 5).eval()
    assert find_head(resnet)[0] == "fc" and resnet.fc.out_features == 5
    replace_head(resnet, 7)
    assert resnet.fc.out_features == 7 and resnet.fc.in_features == 512
    with torch.no_grad():
        assert resnet(torch.zeros(1, 3, 32, 32)).shape == (1, 7)
    mobilenet = build_model("mobilenet_v3_small", 3)
    name, head = find_head(mobilenet)
    assert name == "classifier.3" and head.out_features == 3


def test_unknown_model_suggests_close_names():
    with pytest.raises(UsageError) as caught:
        build_model("resnet19", 10)
    assert caught.value.message == "unknown model 'resnet19'"
    assert caught.value.hint.startswith("did you mean") and "resnet18" in caught.value.hint


def test_pretrained_weights_offline_is_a_clear_error(monkeypatch, tmp_path):
    """No network: `--weights DEFAULT` must say so and how to get around it."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))  # an empty cache

    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    # torchvision calls torch.hub.load_state_dict_from_url, which downloads through urlopen.
    monkeypatch.setattr(torch.hub, "urlopen", offline)
    with pytest.raises(OfflineError) as caught:
        build_model("resnet18", 3, weights="DEFAULT")
    assert caught.value.message.startswith("cannot download the DEFAULT weights of resnet18")
    assert "--weights PATH" in caught.value.hint and "cache" in caught.value.hint
    assert not any(tmp_path.rglob("*.pth"))


def test_weights_from_a_file_keep_the_backbone_and_replace_the_head(tmp_path):
    torch.manual_seed(0)
    source = build_model("convnet", 10, image_size=8)
    torch.save(
        {"state_dict": {f"module.{k}": v for k, v in source.state_dict().items()}},
        tmp_path / "w.pt",
    )
    model = build_model("convnet", 3, image_size=8, weights=str(tmp_path / "w.pt"))
    assert torch.equal(model.features[0].weight, source.features[0].weight)
    assert torch.equal(model.classifier[1].weight, source.classifier[1].weight)
    assert model.classifier[4].out_features == 3
    with pytest.raises(InputError, match="weights file not found"):
        build_model("resnet18", 3, weights=str(tmp_path / "missing.pt"))


def test_model_from_checkpoint_round_trip():
    torch.manual_seed(1)
    model = build_model("convnet", 3, image_size=10, in_channels=1).eval()
    checkpoint = {
        "format_version": 1,
        "arch": "convnet",
        "num_classes": 3,
        "model": model.state_dict(),
        "preprocess": Preprocess(image_size=10, in_channels=1).to_dict(),
    }
    rebuilt = model_from_checkpoint(checkpoint).eval()
    x = torch.randn(2, 1, 10, 10)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(x), model(x))
