"""`torchkit export` and `torchkit.core.export`: round trips through each format's own runtime
(onnxruntime, torch.jit.load, torch.export.load) at batch 1 and 3, a fixed batch that refuses
another, float16, the classes and preprocessing read back, `load_exported`; and the failures:
corrupt checkpoint, unknown format, unwritable or protected OUT, a model that cannot export, a
verification that fails (nothing at OUT)."""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import io
import json
import os
import stat
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
import torchvision
from disks import FifoReader, fill_disk
from image_folders import write_image_folder
from net_sources import ATTENTION
from output_checks import error_line
from processes import run_torchkit_in_process
from torch import nn
from typer.testing import CliRunner

from torchkit.cli import app
from torchkit.core.data.preprocessing import Preprocess
from torchkit.core.export import (
    EXPORTED_PROGRAM,
    FORMATS,
    ONNX,
    TORCHSCRIPT,
    ExportedModel,
    load_exported,
    sniff_format,
)
from torchkit.core.export.writing import export_failure
from torchkit.core.io.errors import InputError
from torchkit.core.models.checkpoint import FORMAT_VERSION, save_checkpoint
from torchkit.core.models.convnet import convnet_class
from torchkit.core.models.exported.loading import RuntimeFailure

pytestmark = [
    # the tests load files with torch's own APIs too, deprecated ones included
    pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:FutureWarning"),
    pytest.mark.filterwarnings("ignore:You are using the legacy:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:The feature will be removed:DeprecationWarning"),
]

CLASSES = ["cat", "dog", "fox"]
PREPROCESS = Preprocess(
    image_size=28, resize_size=32, mean=(0.5,) * 3, std=(0.25,) * 3, interpolation="bicubic"
)
SUFFIX = {ONNX: ".onnx", TORCHSCRIPT: ".ts", EXPORTED_PROGRAM: ".pt2"}
PKG = "exportnets"
NETS = (
    '''
import torch
from torch import nn


class Svd(nn.Module):
    """Singular values: no ONNX symbolic, no float16 kernel on the CPU."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return torch.linalg.svdvals(self.conv(x).mean((2, 3)).reshape(-1, 2, 2))


class Branchy(nn.Module):
    """A Python branch on a tensor value: torch.export cannot follow it."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        y = self.conv(x).mean((2, 3))
        if y.sum() > 0:
            return y
        return -y


class Scaled(nn.Module):
    """Tensors turned into Python floats: tracing warns, the constants it keeps are right for
    every input (they come from the input's shape and from the weights, not its values)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        y = self.conv(x).mean((2, 3)) * float(x.shape[1] == 3)
        return y * float(self.conv.weight.abs().sum() > 0)


class Rare(nn.Module):
    """A branch on the input's values that the random inputs never take (`if x.mean() > 0:`
    half of them may not): the trace keeps the way its example went."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        y = self.conv(x).mean((2, 3))
        if x.mean() > 10:  # the branch
            return -y
        return y


'''
    + ATTENTION
    + '''

class BatchOfTwo(nn.Module):
    """Code that tests the batch size: torch.export specialises it."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        y = self.conv(x).mean((2, 3))
        return y * 1.0 if x.shape[0] == 2 else y


class ZeroHead(nn.Module):
    """A zero-initialised last layer (as vit_b_16's): every output is 0 whatever the input."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.head = nn.Linear(4, 3)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, x):
        return self.head(self.conv(x).mean((2, 3)))


class Faint(ZeroHead):
    """Outputs that depend on the input but are ~1e-9 (random weights deep down), far below
    the tolerance: an export that returned zeros would be as close."""

    def __init__(self):
        super().__init__()
        nn.init.normal_(self.head.weight, std=1e-9)


class Normed(nn.Module):
    """Convolutions with BatchNorm in eval mode and a residual sum, as in resnet18, at a
    fraction of its export cost."""

    def __init__(self, num_classes=4):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.BatchNorm2d(8), nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8))
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x):
        y = self.stem(x)
        y = torch.relu(y + self.block(y))
        return self.fc(y.mean((2, 3)))


class RandomInEval(nn.Module):
    """F.dropout's `training` defaults to True: random in eval mode too."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return torch.nn.functional.dropout(self.conv(x).mean((2, 3)), 0.5)


class Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        y = self.conv(x).mean((2, 3))
        return y, y
'''
)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    """A convnet torchkit checkpoint (classes, preprocessing), resnet18 weights with 4 outputs,
    a corrupt checkpoint and a package of models that do not export; with the truth modules."""
    root = tmp_path_factory.mktemp("export")
    torch.manual_seed(0)
    convnet = convnet_class()(3, 3, 28).eval()
    save_checkpoint(
        {
            "format_version": FORMAT_VERSION,
            "arch": "convnet",
            "num_classes": 3,
            "classes": CLASSES,
            "model": convnet.state_dict(),
            "preprocess": PREPROCESS.to_dict(),
        },
        root / "convnet.pt",
    )
    resnet = torchvision.models.resnet18(num_classes=4)
    nets: dict = {}
    exec(NETS, nets)  # the package's own code: the truth of `exportnets.nets:Normed`
    normed = nets["Normed"]()
    for name, model in (("resnet18", resnet), ("normed", normed)):
        with torch.no_grad():  # BatchNorm statistics that are not the defaults
            for module in model.modules():
                if isinstance(module, nn.BatchNorm2d):
                    module.running_mean.uniform_(-0.5, 0.5)
                    module.running_var.uniform_(0.5, 2)
        torch.save(model.eval().state_dict(), root / f"{name}_4.pt")
    (root / "bad.pt").write_bytes(b"this is not a checkpoint\n" * 10)
    (root / PKG).mkdir()
    (root / PKG / "__init__.py").write_text("")
    (root / PKG / "nets.py").write_text(NETS)
    return {"root": root, "convnet": convnet, "resnet18": resnet, "normed": normed}


MODELS = {
    "convnet": lambda root: [str(root / "convnet.pt")],
    "resnet18": lambda root: [
        "resnet18",
        "--weights",
        str(root / "resnet18_4.pt"),
        "--image-size",
        "16",  # layer4 sees 1x1: the same graph, a third less work than 32x32
    ],
    "normed": lambda root: [
        f"{PKG}.nets:Normed",
        "--weights",
        str(root / "normed_4.pt"),
        "--image-size",
        "16",
    ],
}
SAMPLE = {"convnet": (3, 28, 28), "resnet18": (3, 16, 16), "normed": (3, 16, 16)}
ARCH = {"convnet": "convnet", "resnet18": "resnet18", "normed": f"{PKG}.nets:Normed"}


def export(runner, *args: str):
    """`torchkit export ARGS --format json`: (result, parsed JSON or None)."""
    result = runner.invoke(app, ["export", *args, "--format", "json"])
    data = json.loads(result.stdout) if result.exit_code == 0 else None
    return result, data


def batch(n: int, shape: tuple[int, ...], seed: int = 5) -> torch.Tensor:
    return torch.randn((n, *shape), generator=torch.Generator().manual_seed(seed))


def truth(model: nn.Module, x: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return model(x).numpy()


def own_load(path: Path, fmt: str):
    """The exported file read with its format's own API (not torchkit's loader): a function
    from a tensor to a NumPy array, and what the file says about the model. TorchScript and
    torch.export files are loaded once for both (a load of the resnet18 .pt2 costs about a
    second of CPU)."""
    if fmt == ONNX:
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        props = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
        stored = {k.removeprefix("torchkit."): json.loads(v) for k, v in props.items()}
        return lambda x: session.run(None, {name: x.numpy()})[0], stored
    extra = {"torchkit.json": ""}
    if fmt == TORCHSCRIPT:
        module = torch.jit.load(str(path), _extra_files=extra)
    else:
        module = torch.export.load(str(path), extra_files=extra).module()

    def run(x):
        with torch.no_grad():
            return module(x).numpy()

    return run, json.loads(extra["torchkit.json"])


def read_programs_once(monkeypatch) -> None:
    """From now on in the test, `torch.export.load` of a file it has read already hands back
    that program and its extra files: `own_load` reads a .pt2 with torch's API, and
    `load_exported` (torchkit's reader, which calls the same API, then reads the record,
    checks it and takes the module) is given what that read made instead of deserialising the
    file a second time (about a second of CPU for resnet18's). Installed after the export, so
    that the export's own verification and the first read of each file are real."""
    real = torch.export.load
    read: dict[tuple[str, int], tuple[object, dict]] = {}

    def load_once(f, *, extra_files=None, **kwargs):
        key = (os.fspath(f), os.stat(f).st_mtime_ns)
        wanted = dict.fromkeys(extra_files or {}, "")
        if key not in read or not set(wanted) <= set(read[key][1]) or kwargs:
            read[key] = (real(f, extra_files=wanted, **kwargs), wanted)
        program, extra = read[key]
        for name in wanted:
            extra_files[name] = extra[name]
        return program

    monkeypatch.setattr(torch.export, "load", load_once)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def leftovers(folder: Path) -> list[str]:
    """Temporary files the export may have left beside OUT."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


# -- round trips ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "name"),
    [
        *((fmt, "convnet") for fmt in FORMATS),
        # a real architecture (resnet18 named, its weights a state dict) through the exporter
        # that rewrites the graph most; the other formats take a small named net with a
        # state dict, BatchNorm and a residual sum instead (torch.export of resnet18 and its
        # read back cost about 5 s of CPU, TorchScript's 1.5 s)
        (ONNX, "resnet18"),
        (TORCHSCRIPT, "normed"),
        (EXPORTED_PROGRAM, "normed"),
    ],
)
def test_round_trip_in_the_formats_own_runtime_at_batch_1_and_3_and_to_names_any_files_format(
    runner, world, tmp_path, monkeypatch, fmt, name
):
    """...and `--to` names the format of a file whose name does not (the small named net's
    files are `model.bin`: a file is read back by its contents, not its name)."""
    monkeypatch.chdir(world["root"])  # package.module:Callable imports from here
    named = name == "normed"
    out = tmp_path / ("model.bin" if named else f"model{SUFFIX[fmt]}")
    to = ["--to", fmt] if named else []
    result, data = export(runner, *MODELS[name](world["root"]), str(out), *to)
    assert result.exit_code == 0, result.stderr
    read_programs_once(monkeypatch)
    sample = SAMPLE[name]
    assert data["format"] == fmt and data["path"] == str(out)
    assert data["verified"] is True and data["verified_batch_sizes"] == [1, 3]
    assert data["verification"] == "passed" and data["output_spread"] > 2 * data["tolerance"]
    assert 0 <= data["max_abs_diff"] <= data["tolerance"]
    assert data["dynamic_batch"] is True and data["batch_size"] is None
    assert data["input_shape"] == list(sample) and data["dtype"] == "float32"
    assert data["opset"] == (17 if fmt == ONNX else None)
    assert data["file_bytes"] == out.stat().st_size
    assert leftovers(tmp_path) == []
    assert sniff_format(out) == fmt

    if fmt == ONNX:
        onnx.checker.check_model(onnx.load(str(out)), full_check=True)
    model = world[name]
    run, stored = own_load(out, fmt)
    for n in (1, 3):  # the dynamic batch dimension
        x = batch(n, sample)
        np.testing.assert_allclose(run(x), truth(model, x), rtol=1e-4, atol=1e-4)

    assert stored["arch"] == ARCH[name] and stored["format"] == fmt
    assert stored["input_shape"] == list(sample) and stored["batch_size"] is None
    if name == "convnet":  # a torchkit checkpoint's classes and preprocessing travel along
        assert stored["classes"] == CLASSES
        assert stored["preprocess"] == PREPROCESS.to_dict()
    else:  # a state dict has no class names; --image-size keeps torchvision's crop ratio
        assert stored["classes"] is None
        assert stored["preprocess"]["image_size"] == 16
        assert stored["preprocess"]["resize_size"] == round(16 * 256 / 224)  # 18

    loaded = load_exported(out)  # what `predict` will use
    assert loaded.format == fmt and loaded.arch == ARCH[name]
    assert loaded.classes == (CLASSES if name == "convnet" else None)
    assert loaded.input_shape == sample and loaded.batch_size is None
    if name == "convnet":
        assert loaded.preprocess == PREPROCESS
    x = batch(5, sample, seed=9)
    logits = loaded(x.numpy())  # NumPy in, NumPy out
    assert isinstance(logits, np.ndarray) and logits.dtype == np.float32
    np.testing.assert_allclose(logits, truth(model, x), rtol=1e-4, atol=1e-4)
    assert torch.allclose(loaded(x), torch.from_numpy(logits))  # a tensor in, a tensor out


@pytest.mark.parametrize("fmt", FORMATS)
def test_static_batch_is_fixed_refuses_batch_3_and_a_wrong_shape_is_one_clear_failure(
    runner, world, tmp_path, monkeypatch, fmt
):
    out = tmp_path / f"fixed{SUFFIX[fmt]}"
    convnet = str(world["root"] / "convnet.pt")
    result, data = export(runner, convnet, str(out), "--static-batch", "--batch-size", "2")
    assert result.exit_code == 0, result.stderr
    read_programs_once(monkeypatch)
    assert data["dynamic_batch"] is False and data["batch_size"] == 2
    assert data["verified_batch_sizes"] == [2]
    run, stored = own_load(out, fmt)
    x = batch(2, SAMPLE["convnet"])
    np.testing.assert_allclose(run(x), truth(world["convnet"], x), rtol=1e-4, atol=1e-4)
    with pytest.raises(Exception, match=r"(?i)batch|dimension|size|shape|guard"):
        run(batch(3, SAMPLE["convnet"]))
    assert stored["batch_size"] == 2

    loaded = load_exported(out)
    assert loaded.batch_size == 2
    x = batch(5, SAMPLE["convnet"], seed=3)  # run in slices of 2, the last one padded
    np.testing.assert_allclose(loaded(x).numpy(), truth(world["convnet"], x), atol=1e-4)

    # A batch of 3 handed to the file in one call (no slicing): one clear runtime failure.
    with pytest.raises(RuntimeFailure) as failure:
        loaded.run_batch(batch(3, SAMPLE["convnet"]))
    assert "fails on an input of shape 3x3x28x28" in failure.value.message
    assert "\n" not in failure.value.message
    assert failure.value.hint == "the model takes float32 inputs of shape 2x3x28x28"
    if fmt == TORCHSCRIPT:
        assert failure.value.message.endswith("RuntimeError: expected a batch of 2, got 3")


@pytest.mark.parametrize("net", ["ZeroHead", "Faint"])
def test_outputs_that_barely_depend_on_the_input_make_the_verification_inconclusive(
    runner, world, tmp_path, monkeypatch, net
):
    monkeypatch.chdir(world["root"])
    out = tmp_path / "net.onnx"
    result, data = export(runner, f"{PKG}.nets:{net}", str(out), "--image-size", "8")
    assert result.exit_code == 0, result.stderr
    assert data["verification"] == "inconclusive" and data["verified"] is False
    assert data["max_abs_diff"] <= data["tolerance"]  # it ran and matched: proving nothing
    assert data["output_spread"] <= 2 * data["tolerance"]
    [warning] = result.stderr.splitlines()
    assert warning.startswith(
        f"Warning: the verification of {out} is inconclusive: PyTorch's outputs for distinct "
        "inputs differ by at most "
    )
    assert out.is_file()  # kept: the file may be right, the check cannot tell


def test_a_batch_whose_export_outgrows_the_free_memory_is_refused(runner, tmp_path, monkeypatch):
    """Before: only the example images were checked against the free memory, while a layer's
    output is often several times them (resnet18 -b 4096: 2.5 GB of images, ~29 GB in its
    first layers, the kernel's OOM killer); then a batch counted at half the free memory passed,
    while TorchScript's trace peaks at ~3.3x the count (resnet18). TinyNet at 16 px, per image:
    3,072 bytes of images; its pooling holds the 4,096-byte ReLU output and makes 64 bytes;
    163 weights (652 bytes)."""
    from torchkit.core.runtime import memory

    monkeypatch.setattr(memory, "available_memory", lambda: 2_000_000)
    out = tmp_path / "tiny.ts"
    args = ["nets:TinyNet", str(out), "--image-size", "16"]
    # 79 images (-b 77 verifies 79): 3.5 x 79 x 7,232 + 3 x 652 = 2,001,604 bytes
    result, _ = export(runner, *args, "-b", "77")
    assert result.exit_code == 2, result.stderr
    assert error_line(result.stderr).startswith(
        "Error: --batch-size 77 needs about 0.002 GB to export to torchscript (3.5 x 0.0 GB for "
        "a batch of 79 3x16x16 inputs and one layer's inputs and output, plus 3 x 0.0 GB for "
        "the weights), more than the 0.002 GB free"
    )
    assert not out.exists()
    # 78 images: 1,976,292 bytes (half the free memory let -b 136 through: 998,016 bytes
    # counted, ~3.5 MB at TorchScript's peak)
    fits, _ = export(runner, *args, "-b", "76", "--no-verify")
    assert fits.exit_code == 0, fits.stderr


def test_a_batch_past_a_zettabyte_is_refused_in_powers_of_ten(runner, tmp_path, monkeypatch):
    """Before: `--batch-size 9223372036854775800` read 'needs about 233,461,992,996,868.1 GB
    ... (3.5 x 66,703,426,570,533.7 GB ...)' (and from a larger side, float noise past its 16th
    digit), where every other memory refusal writes such figures (from a zettabyte up) as
    '2.3e+14 GB'."""
    from torchkit.core.runtime import memory

    monkeypatch.setattr(memory, "available_memory", lambda: 2_000_000)
    out = tmp_path / "tiny.ts"
    result, _ = export(runner, "nets:TinyNet", str(out), "--image-size", "16", "-b", str(2**63 - 8))
    assert result.exit_code == 2, result.stderr
    line = error_line(result.stderr)
    assert line.startswith(
        f"Error: --batch-size {2**63 - 8} needs about 2.3e+14 GB to export to torchscript "
        "(3.5 x 6.7e+13 GB for a batch of "
    ), line
    assert line.endswith(
        "(give a smaller --batch-size: the exported model takes any batch size unless "
        "--static-batch)"
    ), line
    assert not out.exists()


@pytest.mark.parametrize(("suffix", "imported"), [(".pt2", True), (".ts", False)])
def test_a_pt2_export_imports_torch_exports_machinery_before_its_memory_check(
    runner, tmp_path, monkeypatch, suffix, imported
):
    """Before: where nothing had imported torch._dynamo (a `module:Callable` model) the check
    added a flat 160 MB for it, torch 2.15's cost, while torch 2.4's is 60 MB (sympy imported
    already): a tiny model's .pt2 export took 98 MB past the check there and was counted
    240 MB, refused with 0.2 GB free. Now .pt2's export imports it first, so the memory the
    check reads is what is left after it, whatever the version (80 MB counted, 38-56 MB
    taken: torch 2.4 and 2.15); ONNX and TorchScript do not need it."""
    from torchkit.core.export import run
    from torchkit.core.runtime import memory

    seen: list[str] = []
    monkeypatch.setattr(run, "import_pt2_machinery", lambda: seen.append("imported"))
    monkeypatch.setattr(memory, "available_memory", lambda: seen.append("free") or 1)
    out = tmp_path / f"tiny{suffix}"
    result, _ = export(runner, "nets:TinyNet", str(out), "--image-size", "16")
    assert result.exit_code == 2, result.stderr
    assert seen == (["imported", "free"] if imported else ["free"])


@pytest.mark.parametrize("batch_size", ["1", "4"])
def test_an_export_that_no_batch_fits_is_not_told_to_take_a_smaller_batch(
    runner, tmp_path, monkeypatch, batch_size
):
    """Before: TinyNet to .pt2 with 0.05 GB free read '--batch-size 1 needs about 0.1 GB ...,
    more than the 0.1 GB free (give a smaller --batch-size ...)': the two figures alike, and a
    smaller batch no way out where what torch.export takes at any batch (80-240 MB) does not
    fit. Now the figures differ, and the hint says no batch fits."""
    from torchkit.core.runtime import memory

    monkeypatch.setattr(memory, "available_memory", lambda: 50_000_000)
    out = tmp_path / "tiny.pt2"
    result, _ = export(runner, "nets:TinyNet", str(out), "--image-size", "16", "-b", batch_size)
    assert result.exit_code == 2, result.stderr
    line = error_line(result.stderr)
    # 80 MB, 240 MB where torch.export's imports wait; the batches and weights under 5 MB
    shown = line.split("needs about ", 1)[1].split(" GB", 1)[0]
    assert 0.08 <= float(shown) <= 0.245
    assert "more than the 0.05 GB free" in line
    smaller = "no smaller batch" if batch_size == "1" else "--batch-size 1 needs about 0."
    assert f"({smaller}" in line
    assert line.endswith(": free some memory, or export on a machine with more)")
    assert "give a smaller --batch-size" not in line
    assert not out.exists()


@pytest.mark.parametrize(
    ("fmt", "free", "refused"),
    [
        # torch.export traces with fake tensors: its peak is ~1.3-1.5x the count, where half
        # the free memory refused any batch past 0.5x (what fits in 0.6x free was refused);
        # 1.7 x 737,664 + 1.4 x 102 x 3,072 (the other batches' images) + 1.2 x 652 bytes,
        # and the 80 MB its run takes at any batch: 81,693,493 bytes
        (EXPORTED_PROGRAM, 81_694_000, False),
        (EXPORTED_PROGRAM, 81_693_000, True),
        (TORCHSCRIPT, 2_584_000, False),  # 3.5 x 737,664 + 3 x 652 = 2,583,780 bytes
        (ONNX, 2_584_000, True),  # the weights' copies: 4 x 652, 2,584,432 bytes
        (ONNX, 2_584_500, False),
    ],
)
def test_the_memory_an_export_needs_is_counted_for_its_format(monkeypatch, fmt, free, refused):
    """102 TinyNet images at 16 px: 737,664 bytes counted; 652 bytes of weights."""
    from torchkit.core.export import run
    from torchkit.core.io.errors import UsageError
    from torchkit.core.runtime import memory

    monkeypatch.setattr(memory, "available_memory", lambda: free)
    monkeypatch.setattr(run, "_PT2_IMPORTS", 0)  # torch.export's machinery imported already
    check = [(3, 16, 16), 102, 100, 4160]
    if refused:
        with pytest.raises(UsageError, match=rf"needs about 0\.\d+ GB to export to {fmt} "):
            run._check_batch_memory(*check, fmt=fmt, weight_bytes=652)
    else:
        run._check_batch_memory(*check, fmt=fmt, weight_bytes=652)


class _Tokens(nn.Module):
    """16 tokens of 8 channels from a 16 px image, mixed twice by 2 heads of attention:
    through nn.MultiheadAttention, F.scaled_dot_product_attention on heads split by hand, or
    attention written by hand (a scaled product of queries and keys, then a softmax)."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how
        self.patches = nn.Conv2d(3, 8, 4, stride=4)
        self.attention = nn.MultiheadAttention(8, 2, batch_first=True)
        self.qkv = nn.Linear(8, 24)

    def forward(self, x):
        tokens = self.patches(x).flatten(2).transpose(1, 2)
        for _ in range(2):  # two attention calls, as two blocks of a ViT
            if self.how == "MultiheadAttention":
                tokens = self.attention(tokens, tokens, tokens, need_weights=False)[0]
                continue
            q, k, v = self.qkv(tokens).unflatten(2, (3, 2, 4)).permute(2, 0, 3, 1, 4)
            if self.how == "sdpa":
                tokens = nn.functional.scaled_dot_product_attention(q, k, v)
            else:
                tokens = ((q @ k.transpose(-2, -1)) * 0.5).softmax(-1) @ v
            tokens = tokens.transpose(1, 2).flatten(2)
        return tokens.mean(1)


@pytest.mark.parametrize("how", ["MultiheadAttention", "sdpa", "by hand"])
def test_the_attention_matrix_of_each_call_is_counted(how):
    """Before: the largest layer call alone; the heads x N x N matrix each attention call
    holds is no layer's output, and the tracers keep every one (a small ViT's ONNX export held
    2.1-2.2x the count). Counted beside the largest call and every layer's new outputs; and
    written by hand (before: not counted at all, the product being no layer's output)."""
    from torchkit.core.export.run import _per_image_bytes
    from torchkit.core.summary.counting import MB, summarize

    model = _Tokens(how).eval()
    layer = summarize(model, [(1, 3, 16, 16)], count_flops=False, run_for_real=False)
    matrix = 2 * 16 * 16 * 4  # heads x queries x keys, float32
    outputs = int(layer.forward_backward_mb * MB / 2)  # the outputs, not their gradients
    call, attention, kept = _per_image_bytes(model, (3, 16, 16))
    assert (call, attention.total(), attention.largest(), kept) == (
        int(layer.largest_call_mb * MB),
        2 * matrix,  # two calls
        matrix,
        outputs,
    )


@pytest.mark.parametrize("fmt", [ONNX, TORCHSCRIPT])
def test_an_attention_matrix_is_counted_once_as_the_tracers_keep_it(
    runner, world, tmp_path, monkeypatch, fmt
):
    """Before: each attention call's matrix was counted with one layer's call, 3.5 times over
    (that multiple stands for every layer's output the tracers keep): a thin 12-block ViT's
    export held 0.43x its count at -b 64, and batches that fit were refused. Attention at 16
    px: 16 tokens, 2 heads, one matrix of 2,048 bytes an image; 66 images at -b 64."""
    from torchkit.core.runtime import memory
    from torchkit.core.summary.counting import MB, summarize

    nets: dict = {}
    exec(NETS, nets)
    model = nets["Attention"]().eval()
    call = summarize(model, [(1, 3, 16, 16)], count_flops=False, run_for_real=False)
    before = 3.5 * 66 * (3 * 16 * 16 * 4 + int(call.largest_call_mb * MB) + 2 * 16 * 16 * 4)
    # the batch's count before, less than it with the weights': refused before
    monkeypatch.setattr(memory, "available_memory", lambda: before)
    monkeypatch.chdir(world["root"])
    out = tmp_path / f"attention{SUFFIX[fmt]}"
    args = [f"{PKG}.nets:Attention", str(out), "--image-size", "16", "-b", "64", "--no-verify"]
    result, _ = export(runner, *args)
    assert result.exit_code == 0, result.stderr
    assert out.is_file()


def test_a_deep_models_count_is_at_least_what_its_tracer_keeps(monkeypatch):
    """Before: vit_b_16's ONNX export grew 1.24x its count per image (measured at -b 1 and 8):
    -b 64 was counted at 7.8 GB, passed with 8 GB free, and needs ~9.1 GB (resnet50 held 1.9x
    its count at -b 10, mobilenet_v2 2.1x at -b 32). Now at least 1.6x the images, every
    layer's outputs and the attention matrices its tracer keeps (vit_b_16's figures from
    summary, per image: one layer's call 4.84 MB, matrices 22.35 MB, outputs 88.36 MB)."""
    from torchkit.core.export import run
    from torchkit.core.io.errors import UsageError
    from torchkit.core.runtime import memory

    monkeypatch.setattr(memory, "available_memory", lambda: 8_000_000_000)
    per_image = {
        "attention_bytes": 22_354_000,
        "output_bytes": 88_358_000,
        "largest_attention_bytes": 1_862_832,  # 12 heads x 197 x 197 floats, in each block
    }
    check = [(3, 224, 224), 66, 64, 4_841_000]
    with pytest.raises(UsageError, match="needs about 13.1 GB to export to onnx .1.6 x 7.3 GB"):
        run._check_batch_memory(*check, fmt=ONNX, weight_bytes=346_300_000, **per_image)
    # torch.export traces with fake tensors: its count is the layer's call's and one block's
    # attention matrix, 2.5 x 66 x 5,443,112 + 4 x 66 x 1,862,832 + 1.2 x 346,300,000 bytes
    # and its 80 MB at any batch
    run._check_batch_memory(*check, fmt=EXPORTED_PROGRAM, weight_bytes=346_300_000, **per_image)


def test_a_fixed_batch_of_1_is_verified_on_two_inputs(runner, world, tmp_path):
    out = tmp_path / "one.onnx"
    result, data = export(runner, *MODELS["convnet"](world["root"]), str(out), "--static-batch")
    assert result.exit_code == 0, result.stderr
    assert data["verification"] == "passed" and data["verified_batch_sizes"] == [1]
    assert result.stderr == ""


@pytest.mark.parametrize("fmt", FORMATS)
def test_float16_weights_and_inputs(runner, world, tmp_path, monkeypatch, fmt):
    out = tmp_path / f"half{SUFFIX[fmt]}"
    result, data = export(runner, str(world["root"] / "convnet.pt"), str(out), "--dtype", "float16")
    assert result.exit_code == 0, result.stderr
    read_programs_once(monkeypatch)
    assert data["dtype"] == "float16" and data["verified"] is True
    assert (data["atol"], data["rtol"]) == (1e-2, 2e-2)  # float16's defaults
    assert data["max_abs_diff"] <= data["tolerance"]
    x = batch(3, SAMPLE["convnet"])
    expected = truth(world["convnet"], x)
    run, _ = own_load(out, fmt)
    output = run(x.half())  # the file takes float16 inputs
    assert output.dtype == np.float16
    np.testing.assert_allclose(output.astype(np.float32), expected, atol=2e-2, rtol=2e-2)
    if fmt == ONNX:
        session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
        assert session.get_inputs()[0].type == "tensor(float16)"
    loaded = load_exported(out)
    assert loaded.dtype == "float16"
    logits = loaded(x)  # float32 in (cast for the model), float32 out
    assert logits.dtype == torch.float32
    np.testing.assert_allclose(logits.numpy(), expected, atol=2e-2, rtol=2e-2)
    # a bit smaller than float32: the weights take half the bytes
    assert out.stat().st_size < 0.6 * (world["root"] / "convnet.pt").stat().st_size


def test_opset_is_the_one_asked_for(runner, world, tmp_path):
    out = tmp_path / "m.onnx"
    result, data = export(runner, str(world["root"] / "convnet.pt"), str(out), "--opset", "13")
    assert result.exit_code == 0, result.stderr
    assert data["opset"] == 13
    opsets = {o.domain: o.version for o in onnx.load(str(out)).opset_import}
    assert opsets[""] == 13


def test_table_csv_and_report_file(runner, world, tmp_path):
    convnet = str(world["root"] / "convnet.pt")
    table = runner.invoke(app, ["export", convnet, str(tmp_path / "a.onnx")])
    assert table.exit_code == 0, table.stderr
    for words in ("max abs diff", "yes, in onnxruntime at batch 1, 3", "Nx3x28x28", "tolerance"):
        assert words in table.stdout
    # (ONNX: a torch.export file costs several times as much to write and verify)
    csv = runner.invoke(app, ["export", convnet, str(tmp_path / "b.onnx"), "--format", "csv"])
    header, row = csv.stdout.splitlines()
    assert header.split(",")[:3] == ["format", "path", "arch"] and "max_abs_diff" in header
    assert row.startswith(f"onnx,{tmp_path / 'b.onnx'},convnet,")
    # a shape as the table shows it; the batch sizes a list of numbers, as video-info's
    # frame_indices (it read 1x3, a shape)
    cells = dict(zip(header.split(","), row.split(","), strict=True))
    assert cells["input_shape"] == "3x28x28" and cells["verified_batch_sizes"] == "1 3"
    report = tmp_path / "report.json"
    done = runner.invoke(
        app, ["export", convnet, str(tmp_path / "c.ts"), "--format", "json", "-o", str(report)]
    )
    assert done.exit_code == 0, done.stderr
    assert done.stdout == ""
    assert json.loads(report.read_text())["format"] == TORCHSCRIPT


def test_a_model_without_weights_is_the_same_file_in_every_run(runner, tmp_path):
    """Before: its random weights were drawn from torch's random state as it stood, so each run
    wrote another file; now from seed 0, as predict's and eval's --allow-untrained."""
    files = [tmp_path / "a.onnx", tmp_path / "b.onnx"]
    for out in files:
        args = ["export", "convnet", str(out), "--image-size", "8", "--no-verify"]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.stderr
        assert "convnet has random weights" in result.stderr
    assert digest(files[0]) == digest(files[1])


def test_no_verify_says_so(runner, world, tmp_path):
    out = tmp_path / "m.ts"
    result, data = export(runner, str(world["root"] / "convnet.pt"), str(out), "--no-verify")
    assert result.exit_code == 0, result.stderr
    assert data["verified"] is False and data["max_abs_diff"] is None
    assert data["verification"] == "skipped" and data["output_spread"] is None
    assert data["verified_batch_sizes"] == []
    assert "not verified (--no-verify)" in result.stderr
    assert out.is_file()


@pytest.fixture(scope="module")
def exported_convnet(world, tmp_path_factory) -> dict:
    """The convnet checkpoint (28x28 inputs) exported to ONNX and TorchScript, and images of
    its classes."""
    root = tmp_path_factory.mktemp("exported")
    runner = CliRunner()
    paths = {}
    for fmt in (ONNX, TORCHSCRIPT):
        paths[fmt] = str(root / f"convnet{SUFFIX[fmt]}")
        result, _ = export(runner, str(world["root"] / "convnet.pt"), paths[fmt])
        assert result.exit_code == 0, result.stderr
    paths["images"] = str(write_image_folder(root / "images", dict.fromkeys(CLASSES, 1), size=32))
    return paths


@pytest.mark.parametrize(
    "args",
    [
        ["eval", ONNX, "--data", "images", "--image-size", "32"],
        ["predict", ONNX, "images", "--image-size", "32"],
        ["benchmark", TORCHSCRIPT, "--trust-checkpoint", "--image-size", "32", "--device", "cpu"],
        ["summary", TORCHSCRIPT, "--trust-checkpoint", "-i", "3,32,32"],
    ],
    ids=["eval", "predict", "benchmark", "summary"],
)
def test_a_size_the_exported_file_does_not_take_is_refused_first(runner, exported_convnet, args):
    args = [exported_convnet.get(arg, arg) for arg in args]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.stderr
    name = Path(args[1]).name
    assert error_line(result.stderr, besides="nothing") == (
        f"Error: {name} takes 3x28x28 inputs (C, H, W, as exported), not 3x32x32 (leave the "
        "size out, the file sets it; or export the model again at 32x32)"
    )


def test_the_size_the_exported_file_takes_may_be_given(runner, exported_convnet):
    args = ["predict", exported_convnet[ONNX], exported_convnet["images"], "--image-size", "28"]
    result = runner.invoke(app, [*args, "--format", "json", "-j", "0"])
    assert result.exit_code == 0, result.stderr
    assert len(json.loads(result.stdout)) == len(CLASSES)


def test_a_missing_out_folder_is_made(runner, world, tmp_path):
    out = tmp_path / "new" / "deeper" / "m.onnx"
    result, _ = export(runner, str(world["root"] / "convnet.pt"), str(out))
    assert result.exit_code == 0, result.stderr
    assert out.is_file()


# -- load_exported -------------------------------------------------------------------------------


def test_load_exported_reads_an_onnx_file_torchkit_did_not_write(world, tmp_path):
    out = tmp_path / "plain.onnx"
    torch.onnx.export(
        world["convnet"], (batch(1, SAMPLE["convnet"]),), str(out), dynamo=False, opset_version=17
    )
    loaded = load_exported(out)
    assert loaded.classes is None and loaded.preprocess is None
    # what the graph fixes stands in for torchkit's record: one sample's shape, a batch of 1
    assert loaded.input_shape == tuple(SAMPLE["convnet"]) and loaded.batch_size == 1
    x = batch(1, SAMPLE["convnet"])
    np.testing.assert_allclose(loaded(x.numpy()), truth(world["convnet"], x), atol=1e-4)


class FixedRows(nn.Module):
    def forward(self, x):
        return x.reshape(2, -1)


def test_an_onnx_run_that_fails_is_one_error_without_onnxruntimes_log_line(tmp_path, capfd):
    """onnxruntime logged a red '[E:onnxruntime:...] Non-zero status code returned while
    running Reshape node' on descriptor 2 besides the exception torchkit makes its Error line
    of (export's verification, eval, predict)."""
    out = tmp_path / "rows.onnx"
    axes = {"x": {0: "n"}}
    torch.onnx.export(
        FixedRows(),
        (torch.randn(2, 3),),
        str(out),
        dynamo=False,
        input_names=["x"],
        dynamic_axes=axes,
    )
    capfd.readouterr()
    with pytest.raises(RuntimeFailure, match="onnxruntime fails on an input of shape 3x3"):
        load_exported(out).run_batch(torch.zeros(3, 3))
    assert capfd.readouterr().err == ""


def test_a_pt2_file_in_older_torchs_layout_is_an_exported_program(tmp_path):
    # torch 2.4's torch.export.save writes its entries at the archive's top, with no
    # `archive_format`: its own .pt2 files were refused as "not an exported model".
    old = tmp_path / "old.pt2"
    with zipfile.ZipFile(old, "w") as archive:
        for name in ("serialized_exported_program.json", "serialized_state_dict.pt", "version"):
            archive.writestr(name, b"")
        archive.writestr("extra_files/torchkit.json", b"{}")
    assert sniff_format(old) == EXPORTED_PROGRAM
    written = tmp_path / "new.pt2"
    torch.export.save(torch.export.export(nn.Linear(3, 2), (torch.randn(2, 3),)), written)
    assert sniff_format(written) == EXPORTED_PROGRAM  # this torch's own layout


def test_a_zip_holding_only_the_programs_name_at_its_top_is_no_exported_program(tmp_path):
    # A user's archive that happens to hold serialized_exported_program.json was taken for a
    # .pt2 (code that runs when loaded): torch 2.4's archives also hold `version` at the top.
    archive_path = tmp_path / "mine.zip"
    with zipfile.ZipFile(archive_path, "w") as archive:
        archive.writestr("serialized_exported_program.json", b"{}")
        archive.writestr("notes.txt", b"x")
    assert sniff_format(archive_path) is None


@pytest.mark.skipif(
    importlib.util.find_spec("torch.export.pt2_archive") is None,
    reason="this torch writes (and reads) the entries at the archive's top itself",
)
def test_a_pt2_an_older_torch_saved_is_one_error_line_without_torchs_log(tmp_path, capfd):
    # torch 2.4's .pt2 (entries at the top) in this torch: torch.export.load logged a
    # traceback as warnings, then 'We ran into an error ... check the warnings above' or a
    # schema version, with the hint 'is it a complete file written by this version ...?'.
    old = tmp_path / "old.pt2"
    with zipfile.ZipFile(old, "w") as archive:
        archive.writestr("serialized_exported_program.json", b"{}")
        archive.writestr("serialized_state_dict.pt", b"")
        archive.writestr("version", b"5.3")
    with pytest.raises(RuntimeFailure) as failure:
        load_exported(old)
    assert failure.value.message.startswith(
        f"torch.export.load cannot load {old}, saved by an older torch (its entries at the "
        f"archive's top) that torch {torch.__version__} cannot read: "
    )
    assert failure.value.hint == (
        "export the model again with this torch: torchkit export CHECKPOINT OUT.pt2"
    )
    assert capfd.readouterr().err == ""


def test_load_exported_refuses_what_is_not_an_exported_model(world, tmp_path):
    assert sniff_format(world["root"] / "convnet.pt") is None  # a checkpoint, not a TorchScript
    with pytest.raises(InputError, match="not an exported model"):
        load_exported(world["root"] / "convnet.pt")
    with pytest.raises(InputError, match="not found"):
        load_exported(tmp_path / "missing.onnx")
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not protobuf")
    with pytest.raises(RuntimeFailure, match="onnxruntime cannot load"):
        load_exported(broken)


# -- refusals and failures: one Error line, nothing at OUT ---------------------------------------


def test_a_corrupt_checkpoint_is_one_error_line(runner, world, tmp_path):
    out = tmp_path / "m.onnx"
    result, _ = export(runner, str(world["root"] / "bad.pt"), str(out))
    assert result.exit_code == 1
    assert "bad.pt" in error_line(result.stderr, besides="nothing")
    assert not out.exists() and leftovers(tmp_path) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["m.tflite"],
            "cannot tell the export format from 'm.tflite' (end OUT with .onnx, with .ts or .pt "
            "for TorchScript, or with .pt2 for torch.export; or pass "
            "--to onnx|torchscript|exported-program)",
        ),
        (["m.onnx", "--to", "tflite"], "Invalid value for '--to'"),
        (["m.pt2", "--to", "onnx"], "--to onnx contradicts the extension"),
        (["m.ts", "--opset", "13"], "--opset goes with ONNX"),
        (["m.onnx", "--opset", "99"], "--opset 99 is not one"),
        # an infinite tolerance passes any output: a verification that checks nothing
        (
            ["m.onnx", "--atol", "inf"],
            "--atol must be a finite number, not inf (give a number >= 0)",
        ),
        (
            ["m.onnx", "--rtol", "inf"],
            "--rtol must be a finite number, not inf (give a number >= 0)",
        ),
        # a tolerance no check uses: the report showed "atol": 0.5 beside "verification":
        # "skipped"
        (
            ["m.onnx", "--no-verify", "--atol", "0.5"],
            "Error: --atol sets the verification's tolerance, and --no-verify skips the "
            "verification (drop --atol or --no-verify)",
        ),
        (["m.onnx", "--rtol", "0.1", "--no-verify"], "Error: --rtol sets the verification's"),
    ],
)
def test_unknown_formats_and_options_are_usage_errors(
    runner, world, tmp_path, monkeypatch, args, message
):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["export", str(world["root"] / "convnet.pt"), *args])
    assert result.exit_code == 2
    assert message in error_line(result.stderr)
    assert list(tmp_path.iterdir()) == []


def test_out_that_is_an_input_is_refused(runner, world):
    root = world["root"]
    before = digest(root / "convnet.pt")
    for args in (
        [str(root / "convnet.pt"), str(root / "convnet.pt"), "--to", "torchscript", "--force"],
        ["resnet18", "--weights", str(root / "resnet18_4.pt"), str(root / "resnet18_4.pt")],
    ):
        result, _ = export(runner, *args, "--force")
        assert result.exit_code == 1
        assert "is the" in error_line(result.stderr, besides="nothing")
    assert digest(root / "convnet.pt") == before
    report = runner.invoke(
        app, ["export", "convnet", str(root / "x.onnx"), "-o", str(root / "x.onnx")]
    )
    assert report.exit_code == 1
    assert "is the exported model" in error_line(report.stderr)
    assert not (root / "x.onnx").exists()


def test_an_existing_out_needs_force(runner, world, tmp_path):
    out = tmp_path / "m.onnx"
    out.write_bytes(b"precious")
    result, _ = export(runner, str(world["root"] / "convnet.pt"), str(out))
    assert result.exit_code == 1
    assert "already exists" in error_line(result.stderr, besides="nothing")
    assert out.read_bytes() == b"precious"
    result, _ = export(runner, str(world["root"] / "convnet.pt"), str(out), "--force")
    assert result.exit_code == 0, result.stderr
    assert load_exported(out).classes == CLASSES
    assert leftovers(tmp_path) == []


def test_an_out_folder_that_is_a_file_is_one_error_line(runner, world, tmp_path):
    (tmp_path / "file").write_text("x")
    result, _ = export(runner, "convnet", str(tmp_path / "file" / "m.onnx"))
    assert result.exit_code == 1
    assert "is a file, not a folder" in error_line(result.stderr)


def test_an_unwritable_out_folder_is_one_error_line(runner, world, small_tmpfs):
    disk = small_tmpfs(64)
    remounted = subprocess.run(["mount", "-o", "remount,ro", str(disk)], capture_output=True)
    if remounted.returncode != 0:
        pytest.skip("cannot remount the tmpfs read-only")
    result, _ = export(runner, str(world["root"] / "convnet.pt"), str(disk / "m.onnx"))
    assert result.exit_code == 1
    line = error_line(result.stderr, besides="nothing")
    assert line.startswith(f"Error: cannot write {disk / 'm.onnx'}") and "Read-only" in line
    assert os.listdir(disk) == []


def test_a_fifo_gets_the_verified_file_and_stays_a_fifo(runner, world, tmp_path):
    """`export ck.pt out.onnx` where out.onnx is a FIFO (or /dev/stdout a pipe) was refused:
    'the file is read back to verify it'. The file is verified in a temporary file, then
    written into the FIFO, which stays one (every format: atomic_path, tests/cli)."""
    fmt = TORCHSCRIPT  # the quickest to export
    reader = FifoReader(tmp_path / f"m{SUFFIX[fmt]}")
    result, data = export(runner, str(world["root"] / "convnet.pt"), str(reader.path))
    written = reader.result()
    assert result.exit_code == 0, result.stderr
    assert data["verification"] == "passed" and data["file_bytes"] == len(written) > 0
    copy = tmp_path / f"copy{SUFFIX[fmt]}"
    copy.write_bytes(written)
    assert load_exported(copy).classes == CLASSES


def test_dev_null_is_a_discard(runner, world):
    """`export ck.pt /dev/null --to onnx`: exported and verified, the bytes discarded (was
    refused: 'the file is read back to verify it')."""
    result, data = export(runner, str(world["root"] / "convnet.pt"), "/dev/null", "--to", ONNX)
    assert result.exit_code == 0, result.stderr
    assert data["verification"] == "passed" and data["path"] == "/dev/null"
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


@pytest.mark.parametrize("fmt", [ONNX, TORCHSCRIPT])
def test_a_full_disk_is_one_error_line_and_leaves_nothing(runner, world, small_tmpfs, fmt):
    disk = fill_disk(small_tmpfs(64))
    out = disk / f"m{SUFFIX[fmt]}"
    result, _ = export(runner, str(world["root"] / "convnet.pt"), str(out))
    assert result.exit_code == 1
    line = error_line(result.stderr, besides="nothing")
    assert line.startswith(f"Error: cannot write {out}: No space left")
    assert os.listdir(disk) == ["filler"]


@pytest.mark.parametrize("old_out", [True, False])
def test_a_report_the_full_disk_refuses_leaves_the_old_out_and_report(
    world, tmp_path, small_tmpfs, old_out
):
    """`export CK OUT -o REPORT --force` where the disk of REPORT is full: the new OUT was left
    in place of the old one while the command failed. Both old files are as they were now, a
    new OUT that replaced nothing is gone (and the folder made for it), and nothing is left
    beside them."""
    folder = tmp_path / "models"
    folder.mkdir()
    out = folder / "m.ts" if old_out else folder / "made" / "m.ts"  # a folder export makes
    if old_out:
        out.write_bytes(b"the old model")
    disk = small_tmpfs(64)
    report = disk / "report.json"
    report.write_text('{"old": "report"}\n')
    fill_disk(disk)
    ck = str(world["root"] / "convnet.pt")
    done = run_torchkit_in_process("export", ck, out, "-o", report, "--force")
    assert done.returncode == 1, done.stderr
    line = error_line(done.stderr, besides="nothing")
    assert line.startswith(f"Error: cannot write {report}: No space left"), line
    assert report.read_text() == '{"old": "report"}\n'
    assert sorted(os.listdir(disk)) == ["filler", "report.json"]
    assert os.listdir(folder) == (["m.ts"] if old_out else [])
    if old_out:
        assert out.read_bytes() == b"the old model"


def test_an_operator_onnx_lacks_is_one_error_line_naming_it(world, tmp_path, capfd):
    # The exporter's C++ graph dump goes to file descriptor 2, not sys.stderr: capfd holds
    # descriptors 1 and 2 while the command runs in this process.
    out = tmp_path / "svd.onnx"
    capfd.readouterr()
    done = run_torchkit_in_process(
        "export", f"{PKG}.nets:Svd", str(out), "--image-size", "8", cwd=world["root"]
    )
    assert capfd.readouterr() == ("", "")
    assert done.returncode == 1
    line = error_line(done.stderr, besides="nothing")
    assert "aten::linalg_svdvals" in line and "not supported" in line
    assert done.stdout == "" and not out.exists() and leftovers(tmp_path) == []


def test_torch_2_4s_words_for_a_branch_on_values_are_the_same_error():
    # torch 2.4's torch.export refuses Branchy with these words (a UserError), which fell
    # through to the generic line without the hint that names torch.cond.
    error = type("UserError", (Exception,), {})(
        "Dynamic control flow is not supported at the moment. Please use "
        "functorch.experimental.control_flow.cond to explicitly capture the control flow."
    )
    failure = export_failure(error, arch="Branchy", fmt=EXPORTED_PROGRAM)
    assert failure.message == (
        "cannot export Branchy to exported-program: the model branches on tensor values "
        "(data-dependent control flow: Dynamic control flow is not supported at the moment)"
    )
    assert "torch.cond" in failure.hint


def test_the_exporters_refusals_hint_in_one_flat_line(monkeypatch, tmp_path):
    unsupported = type("UnsupportedOperatorError", (Exception,), {})(
        "Exporting the operator 'aten::linalg_svdvals' to ONNX opset version 17 is not supported."
    )
    failure = export_failure(unsupported, arch="Svd", fmt=ONNX)
    assert failure.hint == (
        "try another --opset, or export to .pt2 for torch.export or .ts for TorchScript"
    )
    fixed = RuntimeError("Constraints violated (batch)! the batch was specialized to 2")
    failure = export_failure(fixed, arch="BatchOfTwo", fmt=EXPORTED_PROGRAM)
    assert failure.hint == "pass --static-batch, with --batch-size N"
    # more weights than one ONNX file holds: refused before the exporter runs
    from torchkit.core.export import writing

    monkeypatch.setattr(writing, "ONNX_MAX_BYTES", 1)
    with pytest.raises(writing.ExportError) as caught:
        writing.write_onnx(
            nn.Linear(2, 2),
            torch.zeros(1, 2),
            tmp_path / "m.onnx",
            target=tmp_path / "m.onnx",
            dynamic=True,
            opset=17,
            metadata={"arch": "big"},
        )
    assert caught.value.message == (
        "big holds more than 2 GB of weights, more than one ONNX file can"
    )
    assert caught.value.hint == "export to .pt2 for torch.export or .ts for TorchScript"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("model", "out", "extra", "message"),
    [
        (f"{PKG}.nets:Branchy", "b.pt2", [], "data-dependent control flow"),
        (f"{PKG}.nets:BatchOfTwo", "b.pt2", [], "with a dynamic batch size: the model fixes"),
        (f"{PKG}.nets:Pair", "p.onnx", [], "returns a tuple, not one tensor of logits"),
        (f"{PKG}.nets:Svd", "s.ts", ["--dtype", "float16"], "cannot run in float16 on the CPU"),
        ("convnet.pt", "c.onnx", ["--image-size", "32"], "does not run on an input of shape"),
    ],
)
def test_a_model_that_cannot_export_is_one_error_line(
    runner, world, tmp_path, monkeypatch, model, out, extra, message
):
    monkeypatch.chdir(world["root"])  # package.module:Callable imports from here
    size = [] if extra[:1] == ["--image-size"] else ["--image-size", "8"]
    result, _ = export(runner, model, str(tmp_path / out), *size, *extra)
    assert result.exit_code == 1
    line = error_line(result.stderr, besides="nothing")
    assert message in line
    if "float16" in extra:
        assert line.endswith("(export float32: drop --dtype float16)")
    if model == "convnet.pt":  # before: "give the image size it was trained at", not which
        assert line.endswith(
            "(it was trained on 28x28 images: give --image-size 28, or leave it out)"
        )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("fmt", [ONNX, TORCHSCRIPT])
def test_tracer_warnings_are_one_warning_line(runner, world, tmp_path, monkeypatch, fmt):
    monkeypatch.chdir(world["root"])
    out = tmp_path / f"scaled{SUFFIX[fmt]}"
    result, data = export(runner, f"{PKG}.nets:Scaled", str(out), "--image-size", "8")
    assert result.exit_code == 0, result.stderr
    assert data["verified"] is True
    warnings = result.stderr.splitlines()
    assert len(warnings) == 1 and warnings[0].startswith(f"Warning: tracing for {fmt} warned: ")
    assert "Converting a tensor to a Python float" in warnings[0]


RARE_BRANCH = NETS.splitlines().index("        if x.mean() > 10:  # the branch") + 1


@pytest.mark.parametrize("fmt", [ONNX, TORCHSCRIPT])
def test_a_branch_on_the_inputs_values_makes_the_verification_inconclusive(
    runner, world, tmp_path, monkeypatch, fmt
):
    """Before: verified, passed (the tracer's warning aside), though the file gives y where
    PyTorch gives -y for every input whose mean is over 10: the random inputs of the check all
    went the example's way. Now the check says it cannot tell, and where the model branched."""
    monkeypatch.chdir(world["root"])
    out = tmp_path / f"rare{SUFFIX[fmt]}"
    result, data = export(runner, f"{PKG}.nets:Rare", str(out), "--image-size", "8")
    assert result.exit_code == 0, result.stderr
    assert data["verification"] == "inconclusive" and data["verified"] is False
    # it matched, on inputs whose outputs differ: inconclusive for the branch alone
    assert data["max_abs_diff"] <= data["tolerance"] < data["output_spread"] / 2
    place = f"{world['root'] / PKG / 'nets.py'}:{RARE_BRANCH}"
    assert data["traced_input_values"] == [place]
    tracer, warning = result.stderr.splitlines()
    assert tracer.startswith(f"Warning: tracing for {fmt} warned: Converting a tensor to a ")
    assert warning == (
        f"Warning: the verification of {out} is inconclusive: the model turns a value of its "
        f"input into a Python value at {place}, perhaps in a branch, which the file keeps fixed "
        "to what the example input gave, so inputs that would go another way there may get wrong "
        "outputs (write it with tensor operations such as torch.where to export it whole)"
    )
    assert out.is_file()  # kept, as torch.onnx.export keeps it: right for the example's way


def test_a_mismatch_of_a_model_that_branches_on_its_input_names_the_branch(
    runner, world, tmp_path, monkeypatch
):
    monkeypatch.chdir(world["root"])
    real_run = ExportedModel.run_batch
    # as if the check's inputs had gone the other way
    monkeypatch.setattr(ExportedModel, "run_batch", lambda self, data: -real_run(self, data))
    out = tmp_path / "rare.ts"
    result, _ = export(runner, f"{PKG}.nets:Rare", str(out), "--image-size", "8")
    assert result.exit_code == 1
    line = error_line(result.stderr, besides="warnings")  # and the tracer's
    assert "differ from PyTorch's by up to" in line
    assert line.endswith(
        f"(the model reads a value of its input at {world['root'] / PKG / 'nets.py'}:"
        f"{RARE_BRANCH}, perhaps in a branch, which the trace fixed to the example input's way; "
        "nothing was written)"
    )
    assert list(tmp_path.iterdir()) == []


class _CountsPositives(nn.Module):
    """Adds 1 once per positive input value, in a Python loop the tracer unrolls: the count
    comes from a shape (of nonzero's rows, or of a boolean mask's selection)."""

    def __init__(self, count):
        super().__init__()
        self.count = count

    def forward(self, x):
        out = x.sum() * 0
        for _ in range(self.count(x)):  # the read
            out = out + 1
        return out


class _ReadsBeforeWritingItsInput(nn.Module):
    def forward(self, x):
        positive = x.mean() > 0
        x.mul_(2)  # in place: the example gets a new value in the graph
        return x if positive else -x  # the read


def _traced_reads(model, example, onnx_too=True):
    from torchkit.core.export.value_reads import input_values_read

    found = []
    with input_values_read(example) as reads:
        torch.jit.trace(model, example, check_trace=False)
    found.append(list(reads))
    if onnx_too:
        with input_values_read(example) as reads:
            torch.onnx.export(model, (example,), io.BytesIO(), dynamo=False)
        found.append(list(reads))
    return found


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize(
    "count",
    [
        lambda x: torch.nonzero(x > 0).shape[0],
        lambda x: x[x > 0].shape[0],
        lambda x: torch.where(x > 0)[0].shape[0],
        lambda x: torch.arange(x.max()).shape[0],
    ],
    ids=["nonzero", "mask", "where", "arange"],
)
def test_a_loop_counted_by_a_shape_of_the_inputs_values_is_a_read(count):
    """Before: not found (a shape read stopped the search), and the file adds the example's
    count for every input."""
    example = torch.tensor([1.0, -1.0, 2.0, -3.0])
    line = f"{__file__}:{_CountsPositives.forward.__code__.co_firstlineno + 2}"
    assert _traced_reads(_CountsPositives(count), example) == [[line], [line]]
    # a shape read of a tensor whose shape the input's values do not make is not
    shape_only = _CountsPositives(lambda x: torch.nonzero(x.new_ones(3)).shape[0] + x.shape[0])
    assert _traced_reads(shape_only, example, onnx_too=False) == [[]]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize(
    "count",
    [
        lambda x: sum(1 for _ in torch.nonzero(x > 0)),
        lambda x: len(torch.nonzero(x > 0).unbind(0)),
        lambda x: len(torch.nonzero(x > 0).split(1)),
        lambda x: len(torch.chunk(torch.nonzero(x > 0), 4)),
    ],
    ids=["iter", "unbind", "split", "chunk"],
)
def test_the_tensors_a_shape_of_the_inputs_values_splits_into_are_a_read(count):
    """Before: not found: the count of rows a loop over a tensor (or unbind, split, chunk)
    gives is fixed in the file. A loop over the input's own rows is not a read, nor a split
    into listed sizes (as many pieces as sizes, whatever the shape)."""
    line = f"{__file__}:{count.__code__.co_firstlineno}"
    example = torch.tensor([1.0, -1.0, 2.0, -3.0])
    assert _traced_reads(_CountsPositives(count), example, onnx_too=False) == [[line]]
    rows = _CountsPositives(lambda x: len([row for row in torch.where(x > 0, x, -x)]))
    assert _traced_reads(rows, example, onnx_too=False) == [[]]
    listed = _CountsPositives(
        lambda x: len(x.split(1)) + len(torch.split(torch.nonzero(x > 0), [1, 1]))
    )
    assert _traced_reads(listed, example, onnx_too=False) == [[]]


class _ChecksEachStep(nn.Module):
    def forward(self, x):
        for _ in range(100):
            x = x.tanh() + x
            if x.sum() > -1e9:  # a read in each step, of a chain as long as the steps so far
                x = x * 1.0
        return x


@pytest.mark.filterwarnings("ignore")
def test_the_look_for_reads_costs_as_much_as_the_graph_not_its_square(monkeypatch):
    """Before: each read searched its whole chain back to the input again: 20,400 values
    looked at in a graph of 500 nodes (100 steps; 1,000 steps: a 1.3 s trace took 39 s)."""
    from torchkit.core.export.value_reads import input_values_read

    node = torch._C.Value.node
    looked_at = []
    monkeypatch.setattr(torch._C.Value, "node", lambda value: looked_at.append(1) or node(value))
    example = torch.ones(3)
    with input_values_read(example) as reads:
        graph = torch.jit.trace(_ChecksEachStep(), example, check_trace=False).graph
    assert len(reads) == 1
    assert len(looked_at) <= 2 * len(list(graph.nodes()))


@pytest.mark.filterwarnings("ignore")
def test_a_read_of_a_tensor_made_from_the_inputs_shape_alone_is_not():
    """Before: listed (torch.ones_like(x) was followed back to x, as a value of it)."""
    model = _CountsPositives(lambda x: int(torch.ones_like(x).sum()) + int(x.new_zeros(2).sum()))
    assert _traced_reads(model, torch.randn(4)) == [[], []]


class _BranchesOn(nn.Module):
    def __init__(self, condition):
        super().__init__()
        self.condition = condition

    def forward(self, x):
        return x if self.condition(x) else -x


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize(
    "condition",
    [
        lambda x: x.mean().numpy() > 0,
        lambda x: np.asarray(x.mean()) > 0,
        lambda x: complex(x.mean()).real > 0,
        lambda x: torch.equal(x, x.abs()),
        lambda x: torch.allclose(x.abs(), x),
        lambda x: x.allclose(x.abs()),
        lambda x: torch.is_nonzero(x.mean() > 0),
        lambda x: f"{x.mean():.0f}" == "1",
        lambda x: str(x.mean()) == "tensor(1.)",
        lambda x: format(x.mean(), ".0f") == "1",
        lambda x: 1.0 in x,
    ],
    ids=[
        *("numpy", "asarray", "complex", "equal", "allclose", "method", "is_nonzero"),
        *("f-string", "str", "format", "in"),
    ],
)
def test_python_values_of_the_input_by_other_ways_are_reads(condition):
    """Before: not found, and the file kept the example's way for every input."""
    line = f"{__file__}:{condition.__code__.co_firstlineno}"  # the lambda, innermost
    assert _traced_reads(_BranchesOn(condition), torch.ones(4), onnx_too=False) == [[line]]


@pytest.mark.filterwarnings("ignore")
def test_a_read_before_the_model_writes_into_its_input_is_found():
    """Before: not found (the example's value in the graph was taken after x.mul_)."""
    line = f"{__file__}:{_ReadsBeforeWritingItsInput.forward.__code__.co_firstlineno + 3}"
    found = _traced_reads(_ReadsBeforeWritingItsInput(), torch.ones(4), onnx_too=False)
    assert found == [[line]]


class _PredictsInTorch(nn.AdaptiveLogSoftmaxWithLoss):
    """A model whose forward is torch's own code, which branches on its predictions."""

    forward = nn.AdaptiveLogSoftmaxWithLoss.predict


@pytest.mark.filterwarnings("ignore")
def test_a_read_in_torchs_own_code_is_named_where_torch_makes_it(tmp_path):
    """Before: named the exporter's line that calls the tracer (torchkit's writing.py), no
    line of the model: the model had no frame outside torch, and torchkit's came next."""
    import linecache

    from torchkit.core.export.writing import write_torchscript

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), _PredictsInTorch(12, 10, [5])).eval()
    out = tmp_path / "m.ts"
    example = torch.randn(2, 3, 2, 2)
    reads = write_torchscript(model, example, out, target=out, dynamic=True, metadata={})
    source = os.path.abspath(inspect.getsourcefile(nn.AdaptiveLogSoftmaxWithLoss))
    assert len(reads) >= 1
    for place in reads:
        filename, line = place.rsplit(":", 1)
        assert os.path.abspath(filename) == source
        assert "not_in_shortlist" in linecache.getline(filename, int(line))


class _ChecksItsSize(nn.Module):
    """Checks its input's height with torch._assert, as torchvision's ViT and timm's patch
    embeddings do: a shape check, the same for every input of the exported shape."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 2, 3)

    def forward(self, x):
        torch._assert(x.shape[2] == 8, "expected 8 px")
        return self.conv(x).mean((2, 3))


@pytest.mark.parametrize("fmt", [ONNX, TORCHSCRIPT])
def test_a_shape_check_in_torchs_own_code_is_no_tracer_warning(tmp_path, caplog, fmt):
    """Before: 'tracing for onnx warned: Converting a tensor to a Python boolean' for every
    export of torchvision's ViT: the look for reads makes each read itself, so the tracer
    named that line in torchkit, which is no library's, instead of torch._assert's."""
    from torchkit.core.export.writing import write_onnx, write_torchscript

    out = tmp_path / f"checked{SUFFIX[fmt]}"
    kwargs = {"target": out, "dynamic": True, "metadata": {"arch": "checked"}}
    with caplog.at_level("WARNING", logger="torchkit"):
        if fmt == ONNX:
            reads = write_onnx(_ChecksItsSize(), torch.randn(2, 3, 8, 8), out, opset=18, **kwargs)
        else:
            reads = write_torchscript(_ChecksItsSize(), torch.randn(2, 3, 8, 8), out, **kwargs)
    assert reads == [] and caplog.messages == []


@pytest.mark.parametrize("fmt", FORMATS)
def test_attention_models_export_like_vit(runner, world, tmp_path, monkeypatch, fmt):
    monkeypatch.chdir(world["root"])
    out = tmp_path / f"attention{SUFFIX[fmt]}"
    result, data = export(runner, f"{PKG}.nets:Attention", str(out), "--image-size", "16")
    assert result.exit_code == 0, result.stderr
    assert data["verified"] is True and data["num_classes"] == 3
    assert result.stderr == ""  # torch's own shape checks are no tracer warnings for the user


def test_ema_of_a_checkpoint_without_one_is_one_error_line(runner, world, tmp_path):
    result, _ = export(runner, str(world["root"] / "convnet.pt"), str(tmp_path / "m.onnx"), "--ema")
    assert result.exit_code == 1
    assert "holds no EMA weights" in error_line(result.stderr, besides="nothing")
    assert list(tmp_path.iterdir()) == []


# (every format's writer hands its bytes to the same write into atomic_path's temporary, and
# the verification that fails is the same; torch.export's file costs several times as much to
# make as the other two)
@pytest.mark.parametrize("fmt", [ONNX, TORCHSCRIPT])
def test_a_failed_verification_leaves_nothing_at_out(runner, world, tmp_path, monkeypatch, fmt):
    real_run = ExportedModel.run_batch
    monkeypatch.setattr(ExportedModel, "run_batch", lambda self, data: real_run(self, data) + 0.5)
    out = tmp_path / "new" / f"m{SUFFIX[fmt]}"
    result, _ = export(runner, str(world["root"] / "convnet.pt"), str(out))
    assert result.exit_code == 1
    line = error_line(result.stderr, besides="nothing")
    assert "differ from PyTorch's by up to 0.5" in line and "beyond the tolerance" in line
    assert list(tmp_path.iterdir()) == []  # no file, no temporary, not even the folder made

    old = tmp_path / f"old{SUFFIX[fmt]}"
    old.write_bytes(b"the earlier export")
    result, _ = export(runner, str(world["root"] / "convnet.pt"), str(old), "--force")
    assert result.exit_code == 1
    assert old.read_bytes() == b"the earlier export"  # replaced only by a verified file
    assert leftovers(tmp_path) == []


def test_a_model_random_in_eval_mode_is_refused_as_such(runner, world, tmp_path, monkeypatch):
    """Before: 'the exported model's outputs differ from PyTorch's by up to 1.2 ... (raise
    --atol/--rtol if that much is expected)', though PyTorch itself differed from run to run
    and no tolerance short of hiding everything would pass; now the error says that."""
    monkeypatch.chdir(world["root"])
    out = tmp_path / "m.ts"
    spec = f"{PKG}.nets:RandomInEval"
    result, _ = export(runner, spec, str(out), "--image-size", "8")
    assert result.exit_code == 1
    line = error_line(result.stderr, besides="nothing")
    assert line.startswith(
        f"Error: {spec} itself gives other outputs for the same input in PyTorch from one run "
        "to the next (by up to "
    ), line
    assert line.endswith(
        "(make its forward pass deterministic in eval mode, e.g. "
        "`F.dropout(x, p, training=self.training)`; --no-verify writes the file unchecked)"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_model_whose_own_outputs_are_nan_is_refused_as_such(runner, world, tmp_path):
    """Weights with a NaN (a diverged run): every output is NaN in PyTorch too, so the check
    says that, not that the export "differs by inf" (no tolerance could pass it)."""
    checkpoint = torch.load(world["root"] / "convnet.pt", weights_only=True)
    first = next(name for name in checkpoint["model"] if name.endswith("weight"))
    checkpoint["model"][first] = checkpoint["model"][first].clone().fill_(float("nan"))
    save_checkpoint(checkpoint, tmp_path / "diverged.pt")
    old = tmp_path / "m.ts"
    old.write_bytes(b"the earlier export")
    result, _ = export(runner, str(tmp_path / "diverged.pt"), str(old), "--force")
    assert result.exit_code == 1
    assert error_line(result.stderr, besides="nothing") == (
        "Error: convnet itself gives NaN outputs in PyTorch (for 4 of the 4 random inputs of "
        "the verification): there is nothing to check the export against (check whether the "
        "weights come from a diverged training run or hold NaN or inf; --no-verify writes the "
        "file unchecked)"
    )
    assert old.read_bytes() == b"the earlier export"
    result, data = export(runner, str(tmp_path / "diverged.pt"), str(old), "--force", "--no-verify")
    assert result.exit_code == 0, result.stderr
    assert data["verification"] == "skipped" and old.read_bytes() != b"the earlier export"


@pytest.mark.parametrize(
    ("reason", "hint"),
    [
        ("boom", "pass --static-batch if the model fixes its batch size"),
        # onnxruntime's CPU kernels lack some float16 operators: the file may still serve a GPU
        (
            "NOT_IMPLEMENTED : Could not find an implementation for Conv(11)",
            "onnxruntime on the CPU lacks a kernel this model needs, often one for float16: "
            "export float32, or pass --no-verify to keep the file for a runtime that has it",
        ),
    ],
)
def test_a_runtime_failure_in_verification_is_one_error_line(
    runner, world, tmp_path, monkeypatch, reason, hint
):
    def broken(self, data):
        raise RuntimeFailure(f"onnxruntime fails on an input of shape 3x3x28x28: {reason}")

    monkeypatch.setattr(ExportedModel, "run_batch", broken)
    out = tmp_path / "m.onnx"
    result, _ = export(runner, str(world["root"] / "convnet.pt"), str(out))
    assert result.exit_code == 1
    line = error_line(result.stderr, besides="nothing")
    assert "verification failed: onnxruntime fails" in line and line.endswith(f"({hint})")
    assert not out.exists() and leftovers(tmp_path) == []


@pytest.mark.parametrize("category", [FutureWarning, DeprecationWarning])
def test_torch_jit_loads_deprecation_warning_is_not_the_users(tmp_path, monkeypatch, category):
    """torch.jit.load warns that it is deprecated: a FutureWarning now, a DeprecationWarning up
    to torch 2.11, which made `summary FILE` fail where warnings are errors. Both loaders of
    TorchScript files (checkpoints handed to torch.load, exported files) go through jit_load."""
    import warnings

    from torchkit.core.models.checkpoint import load_checkpoint
    from torchkit.core.models.exported.loading import load_exported

    path = tmp_path / "scripted.pt"
    torch.jit.script(nn.Linear(2, 2)).save(str(path))
    real = torch.jit.load

    def deprecated(*args, **kwargs):
        warnings.warn("`torch.jit.load` is deprecated", category, stacklevel=2)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.jit, "load", deprecated)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert isinstance(load_checkpoint(path, trust_checkpoint=True), torch.jit.ScriptModule)
        assert load_exported(path).module is not None


def test_eval_and_predict_of_an_exported_file_score_the_split_its_run_held_out(runner, tmp_path):
    # A run on an unsplit folder holds out its val images, recorded in the checkpoint; the file
    # exported from it carries the record, so eval of it on that folder scores those images,
    # as eval of the checkpoint does, not the images the model trained on.
    import sklearn.metrics  # noqa: F401  (eval scores in this process, without a helper's start)
    from checkpoints import read_checkpoint, write_convnet_checkpoint

    folder = write_image_folder(tmp_path / "flat", {"a": 4, "b": 4})
    checkpoint = tmp_path / "best.pt"
    write_convnet_checkpoint(checkpoint, in_channels=3, image_size=8, classes="ab")
    state = read_checkpoint(checkpoint)
    state["data"] = {
        "version": 1, "spec": str(folder), "kind": "image folder", "root": str(folder),
        "sizes": {"train": 6, "val": 2}, "held_out": {"val": ["a/a_1.png", "b/b_2.png"]},
        "held_out_of": "all",
    }  # fmt: skip
    save_checkpoint(state, checkpoint)
    out = tmp_path / "model.onnx"  # (TorchScript and .pt2 files carry the same metadata)
    assert runner.invoke(app, ["export", str(checkpoint), str(out), "-q"]).exit_code == 0
    for model in (checkpoint, out):
        args = ["eval", str(model), "--data", str(folder), "--format", "json", "-j", "0"]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.stderr
        report = json.loads(result.stdout)
        assert (report["split"], report["num_images"]) == ("val", 2), model
        args = ["predict", str(model), str(folder), "--split", "val", "--format", "csv", "-j", "0"]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.stderr
        assert [r.split(",")[0] for r in result.stdout.splitlines()[1:]] == [
            "a/a_1.png", "b/b_2.png",
        ], model  # fmt: skip
