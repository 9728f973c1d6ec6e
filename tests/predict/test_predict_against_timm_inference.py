"""`torchkit predict` against timm's inference.py, rebuilt here from timm's library as the script
runs it: `create_model(**resolve_model_input_args(...), checkpoint_path=...)` (which loads a
checkpoint's EMA weights where it has them), `resolve_input_data_config(..., use_test_size=True)`
(the test size of the architecture's pretrained config, unless --use-train-size), `ImageDataset`
with `create_transform` (and `create_loader`'s prefetcher, which the script uses), softmax, topk,
and `DatasetInfoLabelMapper` for ImageNet's class descriptions.

The checkpoint is a random timm/resnet10t with ImageNet's 1,000 outputs, saved as timm's train.py
saves one (`state_dict`, `state_dict_ema`, `args`): resnet10t's pretrained config trains at 176
px crops of 201 px images and tests at 224 px crops of 235 px images, so the two sizes differ.
docs/commands/predict.md's "Against timm's inference.py" states what is checked here."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
from photos import photo
from PIL import Image
from processes import run_torchkit_in_process

from torchkit.core.runtime.extras import installed_version

# The timm release whose library this rebuild of inference.py follows (its functions as that
# release has them): with an older timm the rebuilt script fails, not predict.
OLDEST_TIMM = "1.0.31"


def timm_skip_reason() -> str | None:
    """Why these tests cannot run here (no timm, or one older than OLDEST_TIMM), else None."""
    from packaging.version import InvalidVersion, Version

    version = installed_version("timm")
    if version is None:
        return "needs timm"
    try:
        too_old = Version(version) < Version(OLDEST_TIMM)
    except InvalidVersion:
        return f"needs timm >= {OLDEST_TIMM} (installed: {version}, a version not understood)"
    return f"needs timm >= {OLDEST_TIMM} (installed: {version})" if too_old else None


SKIP_REASON = timm_skip_reason()
pytestmark = pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")

ARCH = "resnet10t"
TOPK = 5
# class folder -> its images (width, height): not square, so a crop of a resize differs from a
# resize; names whose natural order (timm's) is not their order as text (torchkit's)
IMAGES = {
    "cats/img2.png": (60, 40),
    "cats/img10.png": (36, 70),
    "dogs/Zebra.jpg": (50, 50),
    "dogs/a b.png": (90, 31),
}
PREFETCH_ROUNDING = 1e-6  # the prefetcher normalises uint8 as (x - 255 mean) / (255 std)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    """photos/ (two class folders) and ckpt.pth.tar: model and EMA weights as timm's train.py's
    CheckpointSaver writes them."""
    import timm

    root = tmp_path_factory.mktemp("timm_inference")
    for seed, (name, size) in enumerate(IMAGES.items()):
        (root / "photos" / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(photo(*size, seed)).save(root / "photos" / name)
    torch.manual_seed(0)
    model, ema = timm.create_model(ARCH), timm.create_model(ARCH)
    checkpoint = root / "ckpt.pth.tar"
    torch.save(
        {
            "epoch": 3,
            "arch": ARCH,
            "state_dict": model.state_dict(),
            "state_dict_ema": ema.state_dict(),
            "version": 2,
            "args": argparse.Namespace(model=ARCH, img_size=None),
            "metric": 1.0,
        },
        checkpoint,
    )
    return {"data": root / "photos", "checkpoint": checkpoint, "root": root}


def timm_inference(
    checkpoint: Path, data: Path, *, use_train_size: bool = False, use_ema: bool = True
) -> dict:
    """inference.py's `--model ARCH --checkpoint CHECKPOINT DATA --topk TOPK` in this process:
    per image (in the script's order) the top-k indices and probabilities, the pixels fed to the
    model, the probabilities through the script's prefetching loader, and its filenames and
    description labels. `use_ema=False` loads the model weights as validate.py does by default
    (`load_checkpoint(model, path, use_ema=False)`): inference.py has no way to."""
    from timm.data import (
        DatasetInfoLabelMapper,
        ImageDataset,
        ImageNetInfo,
        create_loader,
        create_transform,
        infer_imagenet_subset,
        resolve_input_data_config,
    )
    from timm.models import create_model, load_checkpoint, resolve_model_input_args

    args = {"model": ARCH, "img_size": None, "input_size": None, "in_chans": None}
    model = create_model(
        **resolve_model_input_args(
            ARCH,
            args,
            num_classes=None,
            pretrained=False,
            checkpoint_path=str(checkpoint) if use_ema else "",
        )
    )
    if not use_ema:
        load_checkpoint(model, str(checkpoint), use_ema=False)
    model.eval()
    config = resolve_input_data_config(model, args, use_test_size=not use_train_size)
    dataset = ImageDataset(str(data), transform=create_transform(**config))
    pixels = torch.stack([dataset[i][0] for i in range(len(dataset))])
    loader = create_loader(
        ImageDataset(str(data)),
        batch_size=256,
        use_prefetcher=True,
        num_workers=0,
        device=torch.device("cpu"),
        **config,
    )
    fullnames = dataset.filenames(basename=False)
    # One batch in predict's order (the paths as text): a row's float32 logits may depend on
    # where it sits in its batch, and the script's figures are compared with predict's.
    order = sorted(range(len(fullnames)), key=fullnames.__getitem__)
    with torch.inference_mode():
        probabilities = torch.empty(len(order), model.num_classes)
        probabilities[order] = model(pixels[order]).softmax(-1)
        prefetched = torch.cat([model(batch).softmax(-1) for batch, _ in loader])
    values, indices = probabilities.topk(TOPK)
    to_label = DatasetInfoLabelMapper(
        ImageNetInfo(infer_imagenet_subset({"num_classes": model.num_classes})),
        label_type="description",
    )
    return {
        "config": config,
        "pixels": pixels,
        "indices": indices.tolist(),
        "probabilities": values,
        "prefetched": prefetched,
        "fullnames": fullnames,
        "basenames": dataset.filenames(basename=True),
        "labels": [[to_label(i) for i in row] for row in indices.tolist()],
    }


def torchkit_predict(world: dict[str, Path], *args: object) -> tuple[list[dict], str, torch.Tensor]:
    """`torchkit predict timm/ARCH --weights CHECKPOINT photos/ --topk TOPK --format json ARGS`:
    its rows, its stderr and the pixels it fed the model (rows in its order)."""
    seen: list[torch.Tensor] = []

    def record(module, inputs):
        if type(module).__name__ == "ResNet":
            seen.append(inputs[0].detach().clone())
            # float32 matrix products, torch's default, where inference.py allows TF32 on CUDA
            assert not torch.backends.cuda.matmul.allow_tf32
            assert torch.get_float32_matmul_precision() == "highest"

    hook = torch.nn.modules.module.register_module_forward_pre_hook(record)
    try:
        found = run_torchkit_in_process(
            "predict", f"timm/{ARCH}", "--weights", world["checkpoint"], world["data"],
            "--topk", TOPK, "--format", "json", "-j", "0", "--device", "cpu", *args,
        )  # fmt: skip
    finally:
        hook.remove()
    assert found.returncode == 0, found.stderr
    return json.loads(found.stdout), found.stderr, torch.cat(seen)


def in_timm_order(rows: list[dict], timm: dict) -> list[dict]:
    by_path = {row["path"]: row for row in rows}
    assert sorted(by_path) == sorted(timm["fullnames"])
    return [by_path[name] for name in timm["fullnames"]]


def top(row: dict) -> tuple[list[str], torch.Tensor]:
    names = [row[f"class_{rank}"] for rank in range(1, TOPK + 1)]
    values = torch.tensor([row[f"probability_{rank}"] for rank in range(1, TOPK + 1)])
    return names, values


@pytest.fixture(scope="module")
def at_test_size(world) -> tuple[dict, list[dict], str, torch.Tensor]:
    """timm's default run and predict with the options that match it: --ema, its test size
    (224 px crops of floor(224 / 0.95) = 235 px images) and ImageNet's descriptions as
    --classes (a file, one per line)."""
    from timm.data import ImageNetInfo

    names = world["root"] / "imagenet.txt"
    names.write_text("".join(f"{d}\n" for d in ImageNetInfo().label_descriptions()))
    timm = timm_inference(world["checkpoint"], world["data"])
    found = torchkit_predict(
        world, "--ema", "--image-size", 224, "--resize-size", 235, "--classes", names
    )
    return timm, *found


def test_same_pixels_classes_and_probabilities_bit_for_bit(at_test_size):
    """With inference.py's EMA weights and test size, predict feeds the pixels create_transform
    makes, bit for bit, so the top-k classes and their float32 probabilities are timm's exactly
    (JSON's 9 significant digits round-trip a float32)."""
    timm, rows, stderr, fed = at_test_size
    assert timm["config"] == {
        "input_size": (3, 224, 224),
        "interpolation": "bicubic",
        "mean": (0.485, 0.456, 0.406),
        "std": (0.229, 0.224, 0.225),
        "crop_pct": 0.95,
        "crop_mode": "center",
    }
    rows = in_timm_order(rows, timm)
    order = [timm["fullnames"].index(row["path"]) for row in at_test_size[1]]
    assert torch.equal(fed, timm["pixels"][order])
    for row, indices, values, labels in zip(
        rows, timm["indices"], timm["probabilities"], timm["labels"], strict=True
    ):
        names, probabilities = top(row)
        assert names == labels  # ImageNet's descriptions, as --label-type description gives
        assert row["class_index"] == indices[0] and row["class"] == labels[0]
        # --include-index: JSON gives each top-k class's index beside its name
        assert [row[f"class_index_{rank}"] for rank in range(1, TOPK + 1)] == indices
        assert torch.equal(probabilities, values)
        assert torch.tensor(row["probability"]) == values[0]
    assert "loaded its EMA weights (state_dict_ema)" in stderr


def test_within_float_rounding_of_the_scripts_prefetching_loader(at_test_size):
    """inference.py feeds uint8 batches through create_loader's prefetcher, which normalises in
    another order of float operations: the same classes, probabilities within 1e-6."""
    timm, rows, _, _ = at_test_size
    prefetched = timm["prefetched"]
    for row, position in zip(in_timm_order(rows, timm), range(len(rows)), strict=True):
        values, indices = prefetched[position].topk(TOPK)
        names, probabilities = top(row)
        assert names == timm["labels"][position] and indices.tolist() == timm["indices"][position]
        assert (probabilities - values).abs().max() <= PREFETCH_ROUNDING


def test_paths_order_and_label_column(at_test_size):
    """`path` is inference.py's --fullname filename (relative to the folder; by default it
    writes the file's name alone); rows come in the folder's paths sorted as text where timm
    sorts them naturally (numbers by value, case ignored); `label` is the true class, the
    folder's, where timm's `label` is the predicted class's."""
    timm, rows, _, _ = at_test_size
    paths = [row["path"] for row in rows]
    assert paths == sorted(timm["fullnames"]) != timm["fullnames"]
    assert timm["fullnames"] == [
        "cats/img2.png",
        "cats/img10.png",
        "dogs/a b.png",
        "dogs/Zebra.jpg",
    ]
    assert timm["basenames"] == [Path(name).name for name in timm["fullnames"]]
    assert [row["label"] for row in rows] == [path.split("/")[0] for path in paths]


def test_default_is_the_train_size_and_the_model_weights(world, at_test_size):
    """Without those options predict reads the file's model weights (validate.py's default;
    inference.py loads the EMA ones) at resnet10t's train size, 176 px crops of 201 px images
    (inference.py's --use-train-size), and names the 1,000 outputs as ImageNet-1k's classes
    by timm's names (the first name of each of inference.py's descriptions, as timm's own
    ImageNet weights are named): bit for bit what timm gives that way."""
    timm = timm_inference(world["checkpoint"], world["data"], use_train_size=True, use_ema=False)
    assert timm["config"]["input_size"] == (3, 176, 176) and timm["config"]["crop_pct"] == 0.875
    rows, stderr, fed = torchkit_predict(world)
    order = [timm["fullnames"].index(row["path"]) for row in rows]
    assert torch.equal(fed, timm["pixels"][order])
    for row, indices, values, labels in zip(
        in_timm_order(rows, timm), timm["indices"], timm["probabilities"], timm["labels"],
        strict=True,
    ):  # fmt: skip
        names, probabilities = top(row)
        assert names == [label.split(",")[0] for label in labels]
        assert row["class_index"] == indices[0]
        assert torch.equal(probabilities, values)
    assert "are assumed to be ImageNet-1k's classes, named as timm names them" in stderr
    assert "loaded state_dict; --ema loads state_dict_ema" in stderr
    # inference.py's own run (EMA weights, test size) ranks other classes
    assert at_test_size[0]["indices"] != timm["indices"]


def test_image_size_alone_keeps_the_train_crop_ratio(world):
    """`--image-size 64` of a weights file is inference.py's `--img-size 64 --use-train-size`
    (crop_pct 0.875: 64 px crops of floor(64 / 0.875) = 73 px images), bit for bit; the
    script's `--img-size 64` alone keeps the test crop_pct (0.95: 67 px), which `--resize-size
    67` gives."""
    import timm
    from timm.data import ImageDataset, create_transform, resolve_input_data_config

    model = timm.create_model(ARCH, num_classes=1)  # its pretrained config: the sizes
    for extra, use_test_size in (
        (["--image-size", 64], False),
        (["--image-size", 64, "--resize-size", 67], True),
    ):
        config = resolve_input_data_config(model, {"img_size": 64}, use_test_size=use_test_size)
        assert config["crop_pct"] == (0.95 if use_test_size else 0.875)
        dataset = ImageDataset(str(world["data"]), transform=create_transform(**config))
        pixels = {name: dataset[i][0] for i, name in enumerate(dataset.filenames())}
        rows, _, fed = torchkit_predict(world, *extra)
        assert torch.equal(fed, torch.stack([pixels[row["path"]] for row in rows]))


def test_a_split_root_and_an_unreadable_file(world, tmp_path):
    """Of a split root the script reads the `val` folder alone (its --split validation) and
    names files below it; where a file is unreadable, its dataset feeds the next image in its
    place, under the unreadable file's name; it lists .png, .jpg and .jpeg files alone. predict
    reads every split (a `split` column), names paths below the root, gives the unreadable file
    a row with its error, and reads the other image files too (a .bmp)."""
    from timm.data import create_dataset, create_transform

    root = tmp_path / "splits"
    for split, name in (("train", "x.png"), ("val", "y.png")):
        (root / split / "cats").mkdir(parents=True)
        (root / split / "cats" / name).write_bytes(
            (world["data"] / "cats" / "img2.png").read_bytes()
        )
    (root / "val" / "cats" / "broken.png").write_bytes(b"not an image")
    Image.open(root / "val" / "cats" / "y.png").save(root / "val" / "cats" / "z.bmp")
    dataset = create_dataset("", root=str(root), split="validation")
    dataset.transform = create_transform(input_size=(3, 32, 32), crop_pct=1.0)
    assert dataset.filenames() == ["cats/broken.png", "cats/y.png"]  # .png, .jpg, .jpeg only
    assert torch.equal(dataset[0][0], dataset[1][0])  # broken.png's place: y.png

    found = run_torchkit_in_process(
        "predict", f"timm/{ARCH}", "--weights", world["checkpoint"], root, "--image-size", 32,
        "--resize-size", 32, "--format", "json", "-j", "0", "--device", "cpu",
    )  # fmt: skip
    assert found.returncode == 0, found.stderr
    rows = json.loads(found.stdout)
    assert [(row["path"], row["split"]) for row in rows] == [
        ("train/cats/x.png", "train"), ("val/cats/broken.png", "val"), ("val/cats/y.png", "val"),
        ("val/cats/z.bmp", "val"),
    ]  # fmt: skip
    assert rows[1]["class"] is None and rows[1]["error"] == "not an image PIL can read"
    assert rows[2]["class"] is not None and rows[2]["error"] is None
    assert f"the 1 class of {root} is not its 1000 outputs" in found.stderr
