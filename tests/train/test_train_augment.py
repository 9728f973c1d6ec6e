"""Augmentation policies, random erasing and the interpolation: shapes, dtypes and seeding of
each policy; the interpolation recorded in the checkpoint, which eval then uses."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from torchkit.cli import app
from torchkit.core.data.preprocessing import Preprocess
from torchkit.core.data.transforms import AUGMENT_POLICIES, train_transform
from torchkit.core.models.checkpoint import load_checkpoint

PREPROCESS = Preprocess(image_size=24, resize_size=28)


@pytest.fixture(scope="module")
def image() -> Image.Image:
    pixels = np.random.default_rng(0).integers(0, 256, (40, 30, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


@pytest.mark.parametrize("policy", AUGMENT_POLICIES)
def test_each_policy_gives_a_normalised_float_tensor_and_is_seeded(image, policy):
    transform = train_transform(PREPROCESS, augment=policy, randaugment_magnitude=12)
    torch.manual_seed(3)
    first = transform(image)
    torch.manual_seed(3)
    again = transform(image)
    assert first.shape == (3, 24, 24) and first.dtype == torch.float32
    assert torch.equal(first, again)  # the same seed, the same augmentation
    if policy != "none":
        outputs = set()
        for seed in range(6):
            torch.manual_seed(seed)
            outputs.add(transform(image).sum().item())
        assert len(outputs) > 1  # and other seeds, other augmentations


def test_random_erasing_erases(image):
    torch.manual_seed(0)
    erased = train_transform(PREPROCESS, augment="none", random_erasing=1.0)(image)
    plain = train_transform(PREPROCESS, augment="none")(image)
    assert (erased == 0).sum() > 0 and not torch.equal(erased, plain)


def test_bad_augment_options_are_usage_errors(runner):
    for args, message in (
        (["--augment", "mixall"], "--augment"),
        (["--random-erasing", "1.5"], "--random-erasing is a probability"),
        (["--randaugment-magnitude", "40"], "--randaugment-magnitude"),
        (["--augmix-severity", "0"], "--augmix-severity"),
        (["--augment", "augmix", "--interpolation", "bicubic"], "cannot use --interpolation"),
    ):
        result = runner.invoke(app, ["train", "--print-config", *args])
        assert result.exit_code == 2 and message in result.stderr, result.stderr


def _train_one_epoch(runner, tmp_path, make_image_folder, *options: str):
    """One epoch of the convnet at 8 px on a small split root, with `options`: its data folder,
    its run folder and the result."""
    data = tmp_path / "data"
    make_image_folder(data / "train", {"a": 4, "b": 4}, size=12)
    make_image_folder(data / "val", {"a": 2, "b": 2}, size=12, seed=1)
    out = tmp_path / "run"
    result = runner.invoke(
        app,
        ["train", "--data", str(data), "--model", "convnet", "--image-size", "8", "--epochs", "1",
         "-j", "0", *options, "--out", str(out)],
    )  # fmt: skip
    return data, out, result


def test_the_interpolation_and_policy_are_recorded_and_eval_uses_them(
    runner, tmp_path, make_image_folder
):
    data, out, result = _train_one_epoch(
        runner, tmp_path, make_image_folder,
        "--augment", "trivialaugment", "--random-erasing", "0.25", "--interpolation", "bicubic",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    checkpoint = load_checkpoint(out / "best.pt")
    assert checkpoint["preprocess"]["interpolation"] == "bicubic"
    options = json.loads((out / "config.json").read_text())["options"]
    assert options["augment"] == "trivialaugment" and options["random_erasing"] == 0.25
    evaluated = runner.invoke(
        app, ["eval", str(out / "best.pt"), "--data", str(data), "--split", "val", "--format",
              "json", "-j", "0"],
    )  # fmt: skip
    assert evaluated.exit_code == 0, evaluated.stderr
    assert json.loads(evaluated.stdout)["preprocess"]["interpolation"] == "bicubic"


def _reference_recipe(
    preprocess: Preprocess, policy: str, magnitude: int, erasing: float, severity: int = 3
):
    """The train transform of torchvision's references/classification presets for these
    options, built from torchvision's own transforms: the oracle for `train_transform`."""
    from torchvision import transforms as T

    mode = T.InterpolationMode(preprocess.interpolation)
    steps = [
        T.RandomResizedCrop(preprocess.image_size, interpolation=mode, antialias=True),
        T.RandomHorizontalFlip(0.5),
    ]
    steps += {
        "basic": [],
        "trivialaugment": [T.TrivialAugmentWide(interpolation=mode)],
        "randaugment": [T.RandAugment(interpolation=mode, magnitude=magnitude)],
        "autoaugment": [T.AutoAugment(T.AutoAugmentPolicy.IMAGENET, interpolation=mode)],
        "autoaugment cifar10": [T.AutoAugment(T.AutoAugmentPolicy.CIFAR10, interpolation=mode)],
        "autoaugment svhn": [T.AutoAugment(T.AutoAugmentPolicy.SVHN, interpolation=mode)],
        "augmix": [T.AugMix(interpolation=mode, severity=severity)],
    }[policy]
    steps += [T.PILToTensor(), T.ConvertImageDtype(torch.float32)]
    steps += [T.Normalize(preprocess.mean, preprocess.std), T.RandomErasing(p=erasing)]
    return T.Compose(steps)


@pytest.mark.parametrize("decode", ["fast", "exact"])
@pytest.mark.parametrize(
    "policy",
    ["basic", "trivialaugment", "randaugment", "autoaugment", "autoaugment cifar10",
     "autoaugment svhn", "augmix"],
)  # fmt: skip
def test_the_train_transform_is_the_reference_scripts_recipe(image, tmp_path, policy, decode):
    # Same seed, same tensor as torchvision's reference recipe: the crop, flip, policy (its
    # magnitude, severity and interpolation), normalisation, then erasing, drawn in the same
    # order. AugMix resamples tensors, which bicubic cannot (train refuses the pair).
    path = tmp_path / "image.png"
    image.save(path)
    for interpolation in ("bilinear", "bicubic", "nearest"):
        if policy == "augmix" and interpolation == "bicubic":
            continue
        preprocess = Preprocess(image_size=16, resize_size=18, interpolation=interpolation)
        augment, _, autoaugment_policy = policy.partition(" ")
        ours = train_transform(
            preprocess,
            augment=augment,
            autoaugment_policy=autoaugment_policy or "imagenet",
            randaugment_magnitude=13,
            augmix_severity=7,
            random_erasing=0.5,
            decode=decode,
        )
        reference = _reference_recipe(preprocess, policy, 13, 0.5, severity=7)
        for seed in range(4):
            torch.manual_seed(seed)
            got = ours.from_file(path, "RGB") if decode == "fast" else ours(image)
            torch.manual_seed(seed)
            assert torch.equal(got, reference(image)), (interpolation, seed)


def test_augmix_and_its_severity_are_recorded_and_a_resume_or_replay_keeps_them(
    runner, tmp_path, make_image_folder
):
    data, out, result = _train_one_epoch(
        runner, tmp_path, make_image_folder, "--augment", "augmix", "--augmix-severity", "2"
    )
    assert result.exit_code == 0, result.stderr
    options = json.loads((out / "config.json").read_text())["options"]
    assert (options["augment"], options["augmix_severity"]) == ("augmix", 2)
    for again in (["--resume", str(out), "--epochs", "2"], ["--config", str(out / "config.json")]):
        printed = runner.invoke(app, ["train", *again, "--print-config"])
        assert printed.exit_code == 0, printed.stderr
        recipe = json.loads(printed.stdout)
        assert (recipe["augment"], recipe["augmix_severity"]) == ("augmix", 2), again


@pytest.mark.parametrize("digits", [False, True])
def test_the_train_crop_size_crops_training_images_and_leaves_validation_at_the_image_size(
    tmp_path, digits
):
    # torchvision's reference recipes train at 176 and evaluate at 224 (--train-crop-size).
    from torchkit.core.data.sources.digits import digits_splits
    from torchkit.core.data.sources.samples import Samples
    from torchkit.core.train.config import TrainConfig
    from torchkit.core.train.loaders import eval_dataset, preprocess_for, train_dataset
    from torchkit.core.train.validation import resolve_defaults

    if digits:
        samples = digits_splits()["train"].subset(range(4))
    else:
        paths = []
        for i in range(2):
            paths.append(str(tmp_path / f"{i}.png"))
            Image.fromarray(np.full((20, 16, 3), 40 * i, dtype=np.uint8)).save(paths[-1])
        samples = Samples(classes=["a", "b"], labels=[0, 1], paths=paths)
    config = resolve_defaults(
        TrainConfig(image_size=12, resize_size=14, train_crop_size=8), is_digits=digits
    )
    preprocess = preprocess_for(config)
    assert train_dataset(samples, preprocess, config)[0][0].shape[-2:] == (8, 8)
    assert eval_dataset(samples, preprocess)[0][0].shape[-2:] == (12, 12)


@pytest.mark.parametrize(
    ("decode", "cpu_share"), [("fast", 0.0), ("exact", 0.0), ("device", 0.0), ("device", 1.0)]
)
def test_each_decode_crops_training_batches_to_the_train_crop_size(
    tmp_path, monkeypatch, decode, cpu_share
):
    # The fast decode's reduced scale keeps the training crop's pixels across, and the device
    # path (libjpeg on the CPU here) resizes to the training crop; validation keeps the image
    # size. JPEGs large enough that their crops are decoded at a reduced scale.
    import torchkit.core.data.decode as decode_module
    from torchkit.core.data.device_decode import decoded_batch
    from torchkit.core.data.sources.samples import Samples
    from torchkit.core.train.config import TRAIN_OPTIONS, TrainConfig
    from torchkit.core.train.loaders import build_loaders, preprocess_for
    from torchkit.core.train.validation import resolve_defaults

    sides = []
    reduction_for = decode_module.reduction_for

    def recorded_reduction(width: int, height: int, image_size: int) -> int:
        sides.append(image_size)
        return reduction_for(width, height, image_size)

    monkeypatch.setattr(decode_module, "reduction_for", recorded_reduction)
    paths = []
    for i in range(4):
        paths.append(str(tmp_path / f"{i}.jpg"))
        pixels = np.random.default_rng(i).integers(0, 256, (120, 160, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(paths[-1])
    samples = Samples(classes=["a", "b"], labels=[0, 1, 0, 1], paths=paths)
    config = resolve_defaults(
        TrainConfig(image_size=12, resize_size=14, train_crop_size=8, decode=decode,
                    decode_cpu_share=cpu_share, workers=0, batch_size=4),
        is_digits=False,
    )  # fmt: skip
    loaders = build_loaders({"train": samples, "val": samples}, preprocess_for(config), config)
    train = decoded_batch(next(iter(loaders.train)), torch.device("cpu"))
    assert tuple(train.images.shape) == (4, 3, 8, 8)
    assert tuple(next(iter(loaders.val)).images.shape) == (4, 3, 12, 12)
    if decode == "fast" or cpu_share:
        assert sides and set(sides) == {8}
        # and --decode's help says so (it said --image-size's pixels)
        assert "--train-crop-size" in " ".join(TRAIN_OPTIONS["decode"].help.split())


def test_the_train_crop_size_is_recorded_and_the_checkpoint_keeps_the_image_size(
    runner, tmp_path, make_image_folder
):
    data = tmp_path / "data"
    make_image_folder(data / "train", {"a": 4, "b": 4}, size=16)
    make_image_folder(data / "val", {"a": 2, "b": 2}, size=16, seed=1)
    out = tmp_path / "run"
    args = ["train", "--data", str(data), "--image-size", "12", "--train-crop-size", "8",
            "--epochs", "1", "-j", "0", "--out", str(out)]  # fmt: skip
    result = runner.invoke(app, [*args, "--model", "nets:TinyNet"])  # pooled: any size
    assert result.exit_code == 0, result.stderr
    assert load_checkpoint(out / "best.pt")["preprocess"]["image_size"] == 12
    assert json.loads((out / "config.json").read_text())["options"]["train_crop_size"] == 8
    # The convnet's classifier is sized for --image-size: refused before the run, one line.
    refused = runner.invoke(app, [*args, "--model", "convnet", "--force"])
    assert refused.exit_code == 2
    assert "Error: --train-crop-size 8: convnet does not run on 8x8 images" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert load_checkpoint(out / "best.pt")["arch"] == "nets:TinyNet"  # the run is kept


def test_decode_device_leaves_in_memory_training_batches_as_they_are():
    # The digits are in memory (no JPEG bytes): `--decode device` trains on the batches the
    # dataset collates, as `fast` does (it stopped with "TypeError: 'Batch' object is not
    # iterable" at the first batch).
    from torchkit.core.data.device_decode import decoded_batch
    from torchkit.core.data.sources.digits import digits_splits
    from torchkit.core.train.config import TrainConfig
    from torchkit.core.train.loaders import build_loaders, preprocess_for
    from torchkit.core.train.validation import resolve_defaults

    splits = {name: samples.subset(range(8)) for name, samples in digits_splits().items()}
    batches = []
    for decode in ("fast", "device"):
        config = resolve_defaults(
            TrainConfig(data="digits", decode=decode, workers=0, batch_size=4), is_digits=True
        )
        loaders = build_loaders(splits, preprocess_for(config), config)
        batches.append(decoded_batch(next(iter(loaders.train)), torch.device("cpu")))
    fast, device = batches
    assert torch.equal(device.images, fast.images) and torch.equal(device.labels, fast.labels)
