"""`torchkit eval` against the two evaluations its users compare it with, rebuilt here from their
libraries: torchvision's reference `evaluate()` (ImageFolder, `ClassificationPresetEval`: resize
256 bilinear antialiased, centre crop 224, normalise) and timm's validate.py (`ImageDataset`,
`resolve_data_config` + `create_transform`, `timm.utils.accuracy`, losses averaged per image by
`AverageMeter`). The pixels eval feeds the model on odd image files, the figures of a
checkpoint in timm's train.py layout, and the size timm's own weights are scored at."""

from __future__ import annotations

import argparse
import importlib.util
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from processes import run_json

pytestmark = pytest.mark.skipif(importlib.util.find_spec("timm") is None, reason="needs timm")

HUB_COMMIT = "0" * 40  # the revision a Hugging Face cache's refs/main points to


def _photo(width: int, height: int, seed: int) -> np.ndarray:
    """Smooth gradients with noise: resizes of it differ by filter, unlike flat colours."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / (width - 1), y * 255 / (height - 1), ((x + y) % 64) * 4], -1)
    return np.clip(base + rng.integers(0, 40, (height, width, 3)), 0, 255).astype(np.uint8)


def _odd_images(root: Path) -> Path:
    """Odd files in three classes: sizes under, at and far beyond 256, portrait and landscape,
    a palette with a transparent entry, CMYK, greyscale, RGBA, an EXIF-rotated JPEG, 16 bits."""

    def save(name: str, image: Image.Image, **options) -> None:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        image.save(root / name, **options)

    save("a/landscape.png", Image.fromarray(_photo(300, 200, 0)))
    save("a/portrait.jpg", Image.fromarray(_photo(180, 410, 1)), quality=90)
    save("a/tiny.png", Image.fromarray(_photo(50, 37, 2)))
    save("a/wide.png", Image.fromarray(_photo(900, 120, 3)))
    palette = Image.fromarray(_photo(260, 240, 4)).convert("P", palette=Image.Palette.ADAPTIVE)
    save("b/palette.png", palette, transparency=3)
    save("b/cmyk.jpg", Image.fromarray(_photo(310, 250, 5)).convert("CMYK"), quality=90)
    sixteen = np.linspace(0, 65535, 280 * 230).reshape(230, 280).astype(np.uint16)
    save("b/sixteen.png", Image.fromarray(sixteen))
    save("c/exact.png", Image.fromarray(_photo(256, 300, 6)))
    turned = Image.fromarray(_photo(320, 240, 7))
    exif = turned.getexif()
    exif[0x0112] = 6  # Orientation: rotate 90 to view; both peers ignore it, as eval does
    save("c/exif.jpg", turned, exif=exif.tobytes(), quality=90)
    save("c/grey.jpg", Image.fromarray(_photo(240, 320, 8)).convert("L"), quality=90)
    rgba = np.dstack([_photo(256, 256, 9), _photo(256, 256, 10)[..., :1]])
    save("c/rgba.png", Image.fromarray(rgba, "RGBA"))
    return root


def _as_peers_read(path: Path, *, scaled: bool = False) -> Image.Image:
    """What torchvision's and timm's loaders make of a file: `Image.open(path).convert("RGB")`;
    `scaled`: a 16-bit file first scaled to 8 bits (round(v / 257)), as eval reads it."""
    image = Image.open(path)
    if scaled:
        values = np.asarray(image).astype(np.float64)
        image = Image.fromarray(np.round(values / 257).astype(np.uint8))
    return image.convert("RGB")


def _fed_to(model_class: str, *args: object) -> torch.Tensor:
    """`torchkit eval ARGS`'s inputs to the model (the top module of class `model_class`), one
    row per image in the order eval reads them (workers 0: the model runs in this process)."""
    seen: list[torch.Tensor] = []

    def record(module, inputs):
        if type(module).__name__ == model_class:
            seen.append(inputs[0].detach().float().clone())

    hook = torch.nn.modules.module.register_module_forward_pre_hook(record)
    try:
        run_json("eval", *args, "--workers", "0", "--batch-size", "4", "--device", "cpu")
    finally:
        hook.remove()
    return torch.cat(seen)


def test_eval_feeds_the_pixels_of_torchvisions_preset_and_of_timms_transform(tmp_path):
    """Bit for bit on every odd file but the 16-bit PNG, which both peers clip to white (PIL's
    convert) and eval scales to 8 bits: there the peers' pixels of the scaled file."""
    import timm
    from timm.data import ImageDataset, create_transform, resolve_data_config
    from torchvision import datasets
    from torchvision import transforms as v1

    data = _odd_images(tmp_path / "odd")
    folder = datasets.ImageFolder(str(data))
    paths = [Path(path) for path, _ in folder.samples]
    # torchvision's references/classification/presets.py, its defaults (PIL, use_v2 off)
    preset = v1.Compose(
        [
            v1.Resize(256, interpolation=v1.InterpolationMode.BILINEAR, antialias=True),
            v1.CenterCrop(224),
            v1.PILToTensor(),
            v1.ConvertImageDtype(torch.float),
            v1.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ]
    )
    fed = _fed_to("TinyNet", "nets:TinyNet", "--allow-untrained", "--data", data)
    assert fed.shape == (len(paths), 3, 224, 224)
    for row, path in zip(fed, paths, strict=True):
        sixteen = path.name == "sixteen.png"
        peers = preset(_as_peers_read(path))
        assert torch.equal(row, preset(_as_peers_read(path, scaled=sixteen))), path.name
        assert torch.equal(row, peers) != sixteen, path.name

    # timm's validate.py: ImageDataset (the same files, in the same order) and the model's
    # data config; here bicubic, crop_pct 0.95, mean and std 0.5 at 160 px.
    model = timm.create_model("test_resnet", num_classes=3)
    weights = tmp_path / "test_resnet.pth"
    torch.save(model.state_dict(), weights)
    transform = create_transform(**resolve_data_config({}, model=model))
    dataset = ImageDataset(str(data))
    assert [Path(name) for name in dataset.filenames()] == [p.relative_to(data) for p in paths]
    fed = _fed_to("ResNet", "timm/test_resnet", "--weights", weights, "--data", data)
    assert fed.shape == (len(paths), 3, 160, 160)
    for row, path in zip(fed, paths, strict=True):
        scaled = _as_peers_read(path, scaled=path.name == "sixteen.png")
        assert torch.equal(row, transform(scaled)), path.name


def _torchvision_evaluate(model, data: Path, batch_size: int) -> dict:
    """torchvision's references/classification/train.py `evaluate()`: ImageFolder and the
    preset, `utils.accuracy` weighted by the batch's size (`update(acc1, n=batch_size)`), the
    loss logged once per batch (`update(loss=...)`: n=1, a mean of batch means)."""
    from torchvision import datasets
    from torchvision import transforms as v1

    preset = v1.Compose(
        [
            v1.Resize(256, interpolation=v1.InterpolationMode.BILINEAR, antialias=True),
            v1.CenterCrop(224),
            v1.PILToTensor(),
            v1.ConvertImageDtype(torch.float),
            v1.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ]
    )
    loader = torch.utils.data.DataLoader(
        datasets.ImageFolder(str(data), transform=preset), batch_size=batch_size
    )
    criterion = torch.nn.CrossEntropyLoss()
    sums = {"acc1": 0.0, "acc5": 0.0, "images": 0, "batch_losses": []}
    with torch.inference_mode():
        for images, target in loader:
            output = model(images)
            _, pred = output.topk(5, 1, True, True)  # utils.accuracy, topk=(1, 5)
            correct = pred.t().eq(target[None])
            for k in (1, 5):
                acc = correct[:k].flatten().sum(dtype=torch.float32) * (100.0 / len(target))
                sums[f"acc{k}"] += acc.item() * len(target)
            sums["images"] += len(target)
            sums["batch_losses"].append(criterion(output, target).item())
    return {
        "acc1": sums["acc1"] / sums["images"],
        "acc5": sums["acc5"] / sums["images"],
        "loss_of_batches": float(np.mean(sums["batch_losses"])),
    }


def test_figures_match_torchvisions_reference_evaluate(tmp_path):
    """Acc@1 and Acc@5 as the reference prints them (percentages there, fractions here); its
    logged loss is a mean of batch means, which a short last batch weighs as much as a full
    one: eval's loss is the mean over images (what timm's AverageMeter gives)."""
    from image_folders import write_image_folder
    from nets import TinyNet

    data = write_image_folder(tmp_path / "data", {c: 2 for c in "abcde"} | {"f": 1}, size=20)
    torch.manual_seed(1)
    model = TinyNet(num_classes=6).eval()
    weights = tmp_path / "tiny.pth"
    torch.save(model.state_dict(), weights)
    found = run_json(
        "eval", "nets:TinyNet", "--weights", weights, "--data", data, "--batch-size", "4",
        "--workers", "0", "--device", "cpu",
    )  # fmt: skip
    truth = _torchvision_evaluate(model, data, batch_size=4)
    assert found["top1"] == pytest.approx(truth["acc1"] / 100, abs=1e-6)
    assert found["top5"] == pytest.approx(truth["acc5"] / 100, abs=1e-6)
    logits, labels = _tv_logits(model, data)
    per_image = torch.nn.functional.cross_entropy(logits.double(), labels).item()
    assert found["loss"] == pytest.approx(per_image, rel=1e-5)
    assert truth["loss_of_batches"] != pytest.approx(per_image, rel=1e-5)


def _tv_logits(model, data: Path):
    from torchvision import datasets
    from torchvision import transforms as v1

    preset = v1.Compose(
        [v1.Resize(256, antialias=True), v1.CenterCrop(224), v1.ToTensor(),
         v1.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])]
    )  # fmt: skip
    folder = datasets.ImageFolder(str(data), transform=preset)
    images, labels = zip(*(folder[i] for i in range(len(folder))), strict=True)
    with torch.inference_mode():
        return model(torch.stack(images)), torch.tensor(labels)


def _validate_py(model, data: Path, batch_size: int) -> dict:
    """timm's validate.py loop: per-batch mean loss and accuracies weighted by the batch's
    size (AverageMeter), so a short last batch counts by its images; percentages."""
    from timm.data import ImageDataset, create_transform, resolve_data_config
    from timm.utils import AverageMeter, accuracy

    dataset = ImageDataset(
        str(data), transform=create_transform(**resolve_data_config({}, model=model))
    )
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size)
    criterion = torch.nn.CrossEntropyLoss()
    loss, top1, top5 = AverageMeter(), AverageMeter(), AverageMeter()
    predicted, truth = [], []
    with torch.inference_mode():
        for images, labels in loader:
            output = model(images)
            acc1, acc5 = accuracy(output, labels, topk=(1, 5))
            loss.update(criterion(output, labels).item(), len(images))
            top1.update(acc1.item(), len(images))
            top5.update(acc5.item(), len(images))
            predicted.append(output.argmax(1))
            truth.append(labels)
    return {
        "top1": top1.avg,
        "top5": top5.avg,
        "loss": loss.avg,
        "predicted": torch.cat(predicted).numpy(),
        "truth": torch.cat(truth).numpy(),
    }


@pytest.mark.parametrize("classes", [6, 3])
def test_figures_of_a_timm_train_checkpoint_match_validate_py_and_scikit_learn(tmp_path, classes):
    """A checkpoint as timm's train.py saves it (`state_dict` with DataParallel's `module.`,
    `state_dict_ema`, `args`), 11 images at batch sizes that leave a short last batch; class
    `e` has no image. top1/top5 are fractions where validate.py prints percentages; with 3
    classes top-5 is null where timm's `accuracy` counts every image (all are in the top 5)."""
    import timm
    from image_folders import write_image_folder
    from sklearn.metrics import precision_recall_fscore_support

    counts = {"a": 3, "b": 4, "c": 2, "d": 1, "f": 1} if classes == 6 else {"a": 5, "b": 3, "c": 3}
    data = write_image_folder(tmp_path / "data", counts, size=20)
    torch.manual_seed(0)
    model = timm.create_model("test_resnet", num_classes=classes).eval()
    ema = timm.create_model("test_resnet", num_classes=classes).eval()
    checkpoint = tmp_path / "model_best.pth.tar"
    torch.save(
        {
            "epoch": 3,
            "arch": "test_resnet",
            "state_dict": {f"module.{k}": v for k, v in model.state_dict().items()},
            "state_dict_ema": ema.state_dict(),
            "args": argparse.Namespace(lr=0.1, model="test_resnet"),
        },
        checkpoint,
    )
    names = ["a", "b", "c", "d", "e", "f"][:classes]
    for weights, options, batch_size in ((model, (), 4), (model, (), 5), (ema, ("--ema",), 3)):
        found = run_json(
            "eval", "timm/test_resnet", "--weights", checkpoint, "--data", data,
            "--classes", ",".join(names), "--batch-size", batch_size, "--workers", "0",
            "--device", "cpu", *options,
        )  # fmt: skip
        # validate.py's ImageDataset numbers the folders it finds: b..d shift past a missing e.
        truth = _validate_py(weights, data, batch_size)
        labels = np.array([names.index(sorted(counts)[i]) for i in truth["truth"]])
        assert found["num_images"] == 11
        assert found["top1"] == pytest.approx(
            float(np.mean(truth["predicted"] == labels)), abs=1e-12
        )
        assert found["loss"] == pytest.approx(_reference_loss(weights, data, names), rel=1e-5)
        if classes == 6:
            assert found["top5"] == pytest.approx(_reference_top5(weights, data, names), abs=1e-6)
        else:
            assert found["top1"] == pytest.approx(truth["top1"] / 100, abs=1e-6)
            assert found["loss"] == pytest.approx(truth["loss"], rel=1e-5)
            assert found["top5"] is None and truth["top5"] == 100.0
        precision, recall, f1, support = precision_recall_fscore_support(
            labels, truth["predicted"], labels=range(classes), zero_division=0
        )
        rows = found["per_class"]
        assert [row["support"] for row in rows] == support.tolist()
        for key, values in (("precision", precision), ("recall", recall), ("f1", f1)):
            assert [row[key] for row in rows] == pytest.approx(values.tolist(), abs=1e-12)


def _logits_and_labels(model, data: Path, names: list[str]):
    """Every image's logits (timm's transform) and its label among `names`, in one batch."""
    from timm.data import ImageDataset, create_transform, resolve_data_config

    dataset = ImageDataset(
        str(data), transform=create_transform(**resolve_data_config({}, model=model))
    )
    found = sorted({Path(name).parent.name for name in dataset.filenames()})
    images, labels = zip(*(dataset[i] for i in range(len(dataset))), strict=True)
    with torch.inference_mode():
        logits = model(torch.stack(images))
    return logits, torch.tensor([names.index(found[label]) for label in labels])


def _reference_loss(model, data: Path, names: list[str]) -> float:
    logits, labels = _logits_and_labels(model, data, names)
    return torch.nn.functional.cross_entropy(logits.double(), labels).item()


def _reference_top5(model, data: Path, names: list[str]) -> float:
    from timm.utils import accuracy

    logits, labels = _logits_and_labels(model, data, names)
    return accuracy(logits, labels, topk=(5,))[0].item() / 100


def _cache_weights(hub: Path, repo: str, model) -> None:
    """`model`'s weights as `hf_hub_download(repo, "model.safetensors")` finds them cached."""
    from safetensors.torch import save_file

    folder = hub / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(HUB_COMMIT)
    (folder / "snapshots" / HUB_COMMIT).mkdir(parents=True)
    save_file(model.state_dict(), str(folder / "snapshots" / HUB_COMMIT / "model.safetensors"))


def test_timms_own_weights_are_scored_at_their_test_size_as_validate_py_does(tmp_path, monkeypatch):
    """A tag whose config has a test size (resnet50.a1_in1k: trained at 224, tested at 288
    uncropped) is scored there, as validate.py's default `use_test_size` takes it; the same
    architecture from a weights file keeps the train size (what torchkit's and timm's train
    validate at)."""
    import timm
    from huggingface_hub import constants
    from timm.data import resolve_data_config
    from timm.models import get_pretrained_cfg
    from timm.models._registry import _model_pretrained_cfgs

    home = tmp_path / "hf"  # an offline Hugging Face cache holding the tag's weights
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    config = get_pretrained_cfg("test_resnet.r160_in1k")  # a copy: the registry's is patched
    tested = replace(config, test_input_size=(3, 192, 192), test_crop_pct=1.0)
    for name, registered in list(_model_pretrained_cfgs.items()):
        if registered == config:
            monkeypatch.setitem(_model_pretrained_cfgs, name, tested)
    torch.manual_seed(0)
    truth = timm.create_model("test_resnet").eval()
    _cache_weights(home / "hub", config.hf_hub_id, truth)
    weights = tmp_path / "weights.pth"
    torch.save(timm.create_model("test_resnet", num_classes=2).state_dict(), weights)
    from image_folders import write_image_folder

    data = write_image_folder(tmp_path / "data", {"tench": 2, "goldfish": 1}, size=30)

    tested = resolve_data_config({}, model=truth, use_test_size=True)
    assert tested["input_size"] == (3, 192, 192) and tested["crop_pct"] == 1.0
    found = run_json("eval", "timm/test_resnet", "--weights", "DEFAULT", "--data", data, "-j", "0")
    assert (found["preprocess"]["image_size"], found["preprocess"]["resize_size"]) == (192, 192)
    found = run_json("eval", "timm/test_resnet", "--weights", weights, "--data", data, "-j", "0")
    assert (found["preprocess"]["image_size"], found["preprocess"]["resize_size"]) == (160, 168)
    # --image-size replaces the test size, keeping the test crop ratio (validate.py --img-size).
    found = run_json(
        "eval", "timm/test_resnet", "--weights", "DEFAULT", "--data", data, "-j", "0",
        "--image-size", "128",
    )  # fmt: skip
    assert (found["preprocess"]["image_size"], found["preprocess"]["resize_size"]) == (128, 128)
