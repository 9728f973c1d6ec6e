"""`torchkit eval` against the two evaluations its users compare it with, rebuilt here from their
libraries: torchvision's reference `evaluate()` (ImageFolder, `ClassificationPresetEval`: resize
256 bilinear antialiased, centre crop 224, normalise) and timm's validate.py (`ImageDataset`,
`resolve_data_config` + `create_transform`, `timm.utils.accuracy`, losses averaged per image by
`AverageMeter`). The pixels eval feeds the model on odd image files, the figures of a
checkpoint in timm's train.py layout, and the size timm's own weights are scored at."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from processes import run_json, run_torchkit_in_process
from timm_hub import tag_with_test_size

pytestmark = pytest.mark.skipif(importlib.util.find_spec("timm") is None, reason="needs timm")

# The figures (not the pixels: the first test) are compared at 64 px, as validate.py --img-size 64
# and eval --image-size 64 take it (the crop ratio kept): a sixth of the default 160 px's compute.
FIGURES_SIZE = 64
ROUNDING = 2e-6  # float32's rounding of normalised pixels (at most about 2.6) computed otherwise


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
    return _fed_and_found(model_class, "eval", *args)[0]


def _fed_and_found(model_class: str, command: str, *args: object) -> tuple[torch.Tensor, object]:
    """`torchkit COMMAND ARGS`'s inputs to the model (as `_fed_to`) and its JSON result."""
    seen: list[torch.Tensor] = []

    def record(module, inputs):
        if type(module).__name__ == model_class:
            seen.append(inputs[0].detach().float().clone())

    hook = torch.nn.modules.module.register_module_forward_pre_hook(record)
    try:
        found = run_json(command, *args, "--workers", "0", "--batch-size", "4", "--device", "cpu")
    finally:
        hook.remove()
    return torch.cat(seen), found


def test_eval_feeds_the_pixels_of_torchvisions_preset_and_of_timms_transform(tmp_path):
    """Bit for bit on every odd file but the 16-bit PNG, which both peers clip to white (PIL's
    convert) and eval scales to 8 bits: there the peers' pixels of the scaled file."""
    import timm
    from timm.data import ImageDataset, create_transform, resolve_data_config
    from torchvision import datasets
    from torchvision.transforms import v2

    data = _odd_images(tmp_path / "odd")
    folder = datasets.ImageFolder(str(data))
    paths = [Path(path) for path, _ in folder.samples]
    preset = _reference_preset()
    # --use-v2: the same resize and crop (of the PIL image), then a scale by 1/255
    preset_v2 = v2.Compose(
        [
            v2.Resize(256, interpolation=v2.InterpolationMode.BILINEAR, antialias=True),
            v2.CenterCrop(224),
            v2.PILToTensor(),
            v2.ToDtype(torch.float, scale=True),
            v2.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
            v2.ToPureTensor(),
        ]
    )
    fed = _fed_to("TinyNet", "nets:TinyNet", "--allow-untrained", "--data", data)
    assert fed.shape == (len(paths), 3, 224, 224)
    for row, path in zip(fed, paths, strict=True):
        sixteen = path.name == "sixteen.png"
        peers = preset(_as_peers_read(path))
        assert torch.equal(row, preset(_as_peers_read(path, scaled=sixteen))), path.name
        assert torch.equal(row, peers) != sixteen, path.name
        v2_scaled = preset_v2(_as_peers_read(path, scaled=sixteen))
        assert (row - v2_scaled).abs().max() <= ROUNDING, path.name

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
    # its default prefetcher: uint8 tensors, normalised as (x - 255 mean) / (255 std)
    config = resolve_data_config({}, model=model)
    as_bytes = create_transform(**config, use_prefetcher=True)
    mean, std = (torch.tensor(config[k]).view(3, 1, 1) * 255 for k in ("mean", "std"))
    for row, path in zip(fed, paths, strict=True):
        scaled = _as_peers_read(path, scaled=path.name == "sixteen.png")
        assert torch.equal(row, transform(scaled)), path.name
        prefetched = (as_bytes(scaled).float() - mean) / std
        assert (row - prefetched).abs().max() <= ROUNDING, path.name


def _reference_preset():
    """torchvision's references/classification/presets.py `ClassificationPresetEval`, its
    defaults (PIL, use_v2 off)."""
    from torchvision import transforms as v1

    return v1.Compose(
        [
            v1.Resize(256, interpolation=v1.InterpolationMode.BILINEAR, antialias=True),
            v1.CenterCrop(224),
            v1.PILToTensor(),
            v1.ConvertImageDtype(torch.float),
            v1.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ]
    )


def _torchvision_evaluate(model, data: Path, batch_size: int) -> dict:
    """torchvision's references/classification/train.py `evaluate()`: ImageFolder and the
    preset, `utils.accuracy` weighted by the batch's size (`update(acc1, n=batch_size)`), the
    loss logged once per batch (`update(loss=...)`: n=1, a mean of batch means)."""
    from torchvision import datasets

    preset = _reference_preset()
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


def _validate_py_transform(model):
    """validate.py's transform of `model` with `--img-size FIGURES_SIZE` (test_resnet has no
    test size: its `use_test_size` changes nothing)."""
    from timm.data import create_transform, resolve_data_config

    return create_transform(**resolve_data_config({"img_size": FIGURES_SIZE}, model=model))


def _validate_py(model, data: Path, batch_size: int) -> dict:
    """timm's validate.py loop: per-batch mean loss and accuracies weighted by the batch's
    size (AverageMeter), so a short last batch counts by its images; percentages."""
    from timm.data import ImageDataset
    from timm.utils import AverageMeter, accuracy

    dataset = ImageDataset(str(data), transform=_validate_py_transform(model))
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
    # every image's loss and top-5 hit, once for each set of weights
    references = {id(weights): _reference(weights, data, names) for weights in (model, ema)}
    for weights, options, batch_size in ((model, (), 4), (model, (), 5), (ema, ("--ema",), 3)):
        found = run_json(
            "eval", "timm/test_resnet", "--weights", checkpoint, "--data", data,
            "--image-size", FIGURES_SIZE, "--classes", ",".join(names), "--batch-size",
            batch_size, "--workers", "0", "--device", "cpu", *options,
        )  # fmt: skip
        # validate.py's ImageDataset numbers the folders it finds: b..d shift past a missing e.
        truth = _validate_py(weights, data, batch_size)
        labels = np.array([names.index(sorted(counts)[i]) for i in truth["truth"]])
        assert found["num_images"] == 11
        assert found["top1"] == pytest.approx(
            float(np.mean(truth["predicted"] == labels)), abs=1e-12
        )
        loss, top5 = references[id(weights)]
        assert found["loss"] == pytest.approx(loss, rel=1e-5)
        if classes == 6:
            assert found["top5"] == pytest.approx(top5, abs=1e-6)
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
    from timm.data import ImageDataset

    dataset = ImageDataset(str(data), transform=_validate_py_transform(model))
    found = sorted({Path(name).parent.name for name in dataset.filenames()})
    images, labels = zip(*(dataset[i] for i in range(len(dataset))), strict=True)
    with torch.inference_mode():
        logits = model(torch.stack(images))
    return logits, torch.tensor([names.index(found[label]) for label in labels])


def _reference(model, data: Path, names: list[str]) -> tuple[float, float]:
    """(The mean loss over images, the fraction of images in the top 5) with timm's
    transform and `timm.utils.accuracy`."""
    from timm.utils import accuracy

    logits, labels = _logits_and_labels(model, data, names)
    loss = torch.nn.functional.cross_entropy(logits.double(), labels).item()
    return loss, accuracy(logits, labels, topk=(5,))[0].item() / 100


@pytest.fixture
def tested_tag(tmp_path, monkeypatch):
    """timm's pretrained test_resnet given a 192 px test size beside its 160 px train size
    (timm_hub.tag_with_test_size), its weights in an offline Hugging Face cache."""
    return tag_with_test_size(tmp_path / "hf", monkeypatch)


def _imagenet_images(root: Path) -> Path:
    """Two ImageNet classes' folders of images that are not square (a centre crop of a resize
    differs from a resize of the same size), in the order eval and predict read them."""
    for name, (width, height) in {"goldfish/a.png": (60, 40), "tench/b.png": (36, 70)}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(_photo(width, height, len(name) + width)).save(root / name)
    return root


def _timm_pixels(model, data: Path, *, test_size: bool) -> torch.Tensor:
    """Every image of `data` as timm's validate.py feeds it: `use_test_size` unless
    `--use-train-size`."""
    from timm.data import create_transform, resolve_data_config

    transform = create_transform(**resolve_data_config({}, model=model, use_test_size=test_size))
    return torch.stack([transform(_as_peers_read(p)) for p in sorted(data.rglob("*.png"))])


def _sizes(found: dict) -> tuple[int, int]:
    return found["preprocess"]["image_size"], found["preprocess"]["resize_size"]


def test_timms_own_weights_are_scored_at_their_test_size_as_validate_py_does(tmp_path, tested_tag):
    """`--weights DEFAULT` feeds the pixels validate.py feeds (its default `use_test_size`),
    and the loss is theirs; `--image-size --resize-size` give the train size (validate.py's
    `--use-train-size`). Weights from a file keep the train size (what train validates at,
    and records), where validate.py takes the test size: `--image-size --resize-size` give
    it."""
    import timm

    data = _imagenet_images(tmp_path / "data")
    tested = _timm_pixels(tested_tag, data, test_size=True)
    assert tested.shape[-2:] == (192, 192)
    model = ("timm/test_resnet", "--weights", "DEFAULT", "--data", data)
    fed, found = _fed_and_found("ResNet", "eval", *model)
    assert torch.equal(fed, tested) and _sizes(found) == (192, 192)
    with torch.inference_mode():
        loss = torch.nn.functional.cross_entropy(tested_tag(tested), torch.tensor([1, 0]))
    assert found["loss"] == pytest.approx(loss.item(), rel=1e-5)  # goldfish 1, tench 0

    trained = _timm_pixels(tested_tag, data, test_size=False)
    fed, found = _fed_and_found(
        "ResNet", "eval", *model, "--image-size", "160", "--resize-size", "168"
    )
    assert torch.equal(fed, trained) and _sizes(found) == (160, 168)
    # --image-size alone keeps the test crop ratio (validate.py's --img-size keeps test_crop_pct)
    assert _sizes(run_json("eval", *model, "--image-size", "128", "-j", "0")) == (128, 128)

    weights = tmp_path / "weights.pth"  # a head for the data's 2 classes
    torch.save(timm.create_model("test_resnet", num_classes=2).state_dict(), weights)
    from_file = ("timm/test_resnet", "--weights", weights, "--data", data)
    fed, found = _fed_and_found("ResNet", "eval", *from_file)
    assert torch.equal(fed, trained) and _sizes(found) == (160, 168)
    # where validate.py takes the test size for them too
    fed = _fed_to("ResNet", *from_file, "--image-size", "192", "--resize-size", "192")
    assert torch.equal(fed, tested)


def test_every_command_takes_the_test_size_of_timms_own_weights(tmp_path, tested_tag):
    """predict, extract-features, benchmark, summary and export take the size eval scores
    timm's own weights at: predict's probabilities and the features are the model's on
    validate.py's test-size pixels."""
    data = _imagenet_images(tmp_path / "data")
    model = ("timm/test_resnet", "--weights", "DEFAULT")
    with torch.inference_mode():
        logits = tested_tag(_timm_pixels(tested_tag, data, test_size=True))

    rows = run_json("predict", *model, data, "--topk", "1", "-j", "0", "--device", "cpu")
    probabilities = logits.softmax(1).max(1)
    assert [row["class_index"] for row in rows] == probabilities.indices.tolist()
    assert [row["probability"] for row in rows] == pytest.approx(
        probabilities.values.tolist(), rel=1e-4
    )
    out = tmp_path / "features"
    result = run_torchkit_in_process(
        "extract-features", *model, data, out, "-l", "logits", "-j", "0", "--device", "cpu"
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    np.testing.assert_allclose(np.load(out / "logits.npy"), logits.numpy(), rtol=1e-4, atol=1e-6)
    benchmark = run_json(
        "benchmark", *model, "-b", "1", "--warmup", "0", "--iters", "1", "--device", "cpu"
    )
    assert benchmark["input_size"] == [3, 192, 192]
    summary = run_json("summary", *model, "--no-flops", "--depth", "0")
    assert summary["input_shapes"] == [[1, 3, 192, 192]]
    exported = run_json("export", *model, tmp_path / "model.pt", "--no-verify")
    assert exported["input_shape"] == [3, 192, 192]


def test_train_fine_tunes_timms_own_weights_at_their_train_size(tmp_path, tested_tag):
    """train takes the tag's train size (timm's train.py validates there too): the tag's test
    size is for scoring the weights as they are. resnet50.a1_in1k, as the docs tell it:
    trained at 224 px crops of 235 px images, tested at 288 px uncropped."""
    import timm

    from torchkit.core.models.timm_models import timm_preprocess, timm_weights_preprocess

    data = _imagenet_images(tmp_path / "data")
    for spec, train_size in (
        ("timm/test_resnet", (160, 168)),
        ("timm/resnet50.a1_in1k", (224, 235)),
    ):
        config = run_json(
            "train", "--data", data, "--model", spec, "--weights", "DEFAULT", "--print-config"
        )
        assert (config["image_size"], config["resize_size"]) == train_size, spec
    with torch.device("meta"):
        resnet50 = timm.create_model("resnet50.a1_in1k")
    tested = timm_preprocess(resnet50, test_size=True)
    assert (tested.image_size, tested.resize_size, tested.interpolation) == (288, 288, "bicubic")
    trained = timm_weights_preprocess("timm/resnet50.a1_in1k")
    assert trained == timm_preprocess(resnet50)
    assert (trained.image_size, trained.resize_size) == (224, 235)
