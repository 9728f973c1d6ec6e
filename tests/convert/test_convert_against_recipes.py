"""`torchkit convert` against the hand recipes it replaces: `convert cifar` against torchvision's
`CIFAR10`/`CIFAR100`, `convert checkpoint` against `torch.load` + prefix stripping + `torch.save`,
and `convert tensor` against torchvision's `read_image`, `pil_to_tensor`, `to_tensor` and the v2
`to_dtype`. Where the results are the same they are compared bit for bit; where torchkit differs
on purpose, the test shows both sides."""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
from pathlib import Path
from unittest import mock

import cv2
import numpy as np
import pytest
import torch
import torch.serialization
import torchvision.datasets.cifar as tv_cifar
from cifar_files import cifar_rows, py2_pickle
from PIL import Image
from safetensors.torch import load_file, save_file
from torch import nn
from torchvision.datasets import CIFAR10, CIFAR100
from torchvision.io import ImageReadMode, read_image
from torchvision.transforms import v2
from torchvision.transforms.functional import pil_to_tensor, to_pil_image, to_tensor
from typer.testing import CliRunner

from torchkit.cli import app
from torchkit.core.convert.cifar import read_cifar

runner = CliRunner()


def ok(*args: str | Path):
    result = runner.invoke(app, [*map(str, args)])
    assert result.exit_code == 0, result.stderr
    return result


# --- convert cifar against torchvision's CIFAR10 / CIFAR100 ------------------------------------


def write_batch(path: Path, rng: np.random.Generator, count: int, **labels: list[int]) -> None:
    """A batch in the real files' format (Python 2's cPickle, byte-string keys), which is what
    torchvision's `pickle.load(..., encoding="latin1")` expects."""
    images = rng.integers(0, 256, (count, 32, 32, 3), dtype=np.uint8)
    batch = {b"data": cifar_rows(images), b"filenames": [b"x.png"] * count}
    batch.update({key.encode(): values for key, values in labels.items()})
    path.write_bytes(py2_pickle(batch))


def skip_tv_integrity(monkeypatch) -> None:
    """torchvision checks the md5 sum of every known CIFAR file; generated pickles have other
    sums, so only that check is patched out: the reading is torchvision's own."""
    monkeypatch.setattr(tv_cifar, "check_integrity", lambda *args, **kwargs: True)


@pytest.fixture
def tv_integrity_skipped(monkeypatch):
    skip_tv_integrity(monkeypatch)


def png_at(out: Path, split: str, name: str, index: int, width: int) -> Image.Image:
    with Image.open(out / split / name / f"{index:0{width}d}.png") as image:
        image.load()
        return image


def assert_same_as_torchvision(out: Path, dataset) -> None:
    """Each torchvision item (PIL image, label) is the PNG at split/<classes[label]>/<index>.png,
    and there are no other PNGs."""
    split = "train" if dataset.train else "test"
    width = len(str(len(dataset) - 1))
    expected = set()
    for index in range(len(dataset)):
        image, label = dataset[index]
        name = dataset.classes[label]
        written = png_at(out, split, name, index, width)
        assert (written.mode, written.size) == (image.mode, image.size) == ("RGB", (32, 32))
        np.testing.assert_array_equal(np.asarray(written), np.asarray(image))
        expected.add(f"{name}/{index:0{width}d}.png")
    found = {p.relative_to(out / split).as_posix() for p in (out / split).rglob("*.png")}
    assert found == expected


def test_convert_cifar10_is_torchvision_cifar10_item_for_item(tmp_path, monkeypatch):
    rng = np.random.default_rng(10)
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship"]
    names.append("truck")
    for number in range(1, 6):  # torchvision reads exactly data_batch_1 .. data_batch_5
        labels = [int(x) for x in rng.integers(0, 10, 3)]
        write_batch(folder / f"data_batch_{number}", rng, 3, labels=labels)
    write_batch(folder / "test_batch", rng, 12, labels=[int(x) for x in rng.integers(0, 10, 12)])
    meta = {b"label_names": [n.encode() for n in names], b"num_cases_per_batch": 3}
    (folder / "batches.meta").write_bytes(py2_pickle(meta))

    ok("convert", "cifar", folder, tmp_path / "png", "-j", "0")
    # torchvision reads the original files only (their md5 sums); torchkit reads the format
    with pytest.raises(RuntimeError, match="corrupted"):
        CIFAR10(tmp_path)
    skip_tv_integrity(monkeypatch)
    for train in (True, False):
        dataset = CIFAR10(tmp_path, train=train)
        assert dataset.classes == names
        assert_same_as_torchvision(tmp_path / "png", dataset)
    assert len(CIFAR10(tmp_path, train=True)) == 15  # the five batches, in order


@pytest.fixture
def cifar100_folder(tmp_path) -> tuple[Path, dict]:
    """A CIFAR-100 folder; returns it and {split: coarse labels} as the pickles hold them."""
    rng = np.random.default_rng(100)
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    coarse_of = {}
    for split, count in (("train", 25), ("test", 12)):
        fine = [int(x) for x in rng.integers(0, 100, count)]
        # As in CIFAR-100, each superclass holds 5 fine classes (here fine // 5).
        coarse_of[split] = [label // 5 for label in fine]
        write_batch(folder / split, rng, count, fine_labels=fine, coarse_labels=coarse_of[split])
    meta = {
        b"fine_label_names": [f"fine_{i:02d}".encode() for i in range(100)],
        b"coarse_label_names": [f"super_{i:02d}".encode() for i in range(20)],
    }
    (folder / "meta").write_bytes(py2_pickle(meta))
    return folder, coarse_of


def test_convert_cifar100_is_torchvision_cifar100_item_for_item(
    tmp_path, cifar100_folder, tv_integrity_skipped
):
    folder, _ = cifar100_folder
    ok("convert", "cifar", folder, tmp_path / "png", "-j", "0")
    for train in (True, False):
        assert_same_as_torchvision(tmp_path / "png", CIFAR100(tmp_path, train=train))


def test_convert_cifar100_coarse_uses_the_pickles_coarse_labels(
    tmp_path, cifar100_folder, tv_integrity_skipped
):
    """torchvision's CIFAR100 has fine labels only: the coarse folders are checked against the
    files themselves, read as torchvision reads them (`pickle.load(encoding="latin1")`)."""
    folder, coarse_of = cifar100_folder
    ok("convert", "cifar", folder, tmp_path / "png", "--label-type", "coarse", "-j", "0")
    with open(folder / "meta", "rb") as handle:
        coarse_names = pickle.load(handle, encoding="latin1")["coarse_label_names"]
    out = tmp_path / "png"
    for split, train in (("train", True), ("test", False)):
        with open(folder / split, "rb") as handle:
            coarse = pickle.load(handle, encoding="latin1")["coarse_labels"]
        assert coarse == coarse_of[split]
        dataset = CIFAR100(tmp_path, train=train)  # the same images, in the same order
        assert not hasattr(dataset, "coarse_targets")
        width = len(str(len(dataset) - 1))
        assert sorted(p.name for p in (out / split).iterdir()) == sorted(coarse_names)
        for index, label in enumerate(coarse):
            written = png_at(out, split, coarse_names[label], index, width)
            np.testing.assert_array_equal(np.asarray(written), np.asarray(dataset[index][0]))
        assert len(list((out / split).rglob("*.png"))) == len(coarse)


def test_byte_string_class_names_are_read_as_torchvision_reads_them(tmp_path, tv_integrity_skipped):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(1)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        write_batch(folder / name, rng, 1, labels=[0])
    names = ["café", *(f"c{i}" for i in range(1, 10))]
    meta = {b"label_names": [n.encode("utf-8") for n in names]}
    (folder / "batches.meta").write_bytes(py2_pickle(meta))
    classes = read_cifar(folder).classes
    assert classes == CIFAR10(tmp_path).classes
    assert classes[0] == "café".encode().decode("latin1")  # 'cafÃ©', as torchvision reads it


# --- convert checkpoint against torch.load + strip + torch.save ---------------------------------


def model() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4, 2))
    net[1].running_var.uniform_(0.5, 2)
    net[1].num_batches_tracked += 5
    return net


def hand_recipe(path: Path, key: str | None = None) -> dict:
    """What users write by hand: load on the CPU, take the usual sub-dict, strip DDP's and
    torch.compile's prefixes, make every tensor a CPU one."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    if key is None:
        key = next((k for k in ("state_dict", "model", "state_dict_ema") if k in checkpoint), None)
    state = checkpoint if key is None else checkpoint[key]
    return {k.removeprefix("module.").removeprefix("_orig_mod."): v.cpu() for k, v in state.items()}


def assert_identical(state: dict, expected: dict, *, ordered: bool) -> None:
    assert (list(state) if ordered else sorted(state)) == (
        list(expected) if ordered else sorted(expected)
    )
    for name, tensor in expected.items():
        assert state[name].dtype == tensor.dtype and state[name].device.type == "cpu"
        assert torch.equal(state[name], tensor), name
    loaded = model()
    loaded.load_state_dict(state, strict=True)
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, expected[name])


def prefixed(state: dict, prefix: str) -> dict:
    return {prefix + k: v for k, v in state.items()}


CHECKPOINTS = {
    "bare_ddp_state_dict": lambda s: prefixed(s, "module."),
    "timm_state_dict": lambda s: {"state_dict": s, "epoch": 3, "arch": "net"},
    "ddp_model_and_optimizer": lambda s: {"model": prefixed(s, "module."), "epoch": 9},
    "compiled_ddp": lambda s: {"state_dict": prefixed(s, "module._orig_mod."), "epoch": 1},
    "compiled": lambda s: prefixed(s, "_orig_mod."),
}


@pytest.mark.parametrize("kind", sorted(CHECKPOINTS))
@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_convert_checkpoint_is_the_hand_recipe(tmp_path, kind, suffix):
    torch.save(CHECKPOINTS[kind](model().state_dict()), tmp_path / "in.pth")
    ok("convert", "checkpoint", tmp_path / "in.pth", tmp_path / f"out{suffix}")
    written = (
        load_file(tmp_path / "out.safetensors")
        if suffix == ".safetensors"
        else torch.load(tmp_path / "out.pt", weights_only=True)
    )
    # .pt keeps the key order; safetensors stores keys sorted
    assert_identical(written, hand_recipe(tmp_path / "in.pth"), ordered=suffix == ".pt")


def test_a_gpu_checkpoint_needs_the_recipes_map_location_and_not_torchkit(tmp_path):
    with mock.patch.object(torch.serialization, "location_tag", lambda storage: "cuda:0"):
        torch.save({"state_dict": prefixed(model().state_dict(), "module.")}, tmp_path / "g.pth")
    if not torch.cuda.is_available():  # without map_location the bare recipe fails here
        with pytest.raises((RuntimeError, pickle.UnpicklingError), match="CUDA"):
            torch.load(tmp_path / "g.pth", weights_only=True)
    ok("convert", "checkpoint", tmp_path / "g.pth", tmp_path / "g.pt")
    written = torch.load(tmp_path / "g.pt", weights_only=True)
    assert_identical(written, hand_recipe(tmp_path / "g.pth"), ordered=True)


def test_ema_weights_beside_state_dict_need_key_as_in_the_recipe(tmp_path):
    """timm keeps `state_dict` and `state_dict_ema`: both take `state_dict` unless told."""
    weights, ema = model().state_dict(), {k: v + 1 for k, v in model().state_dict().items()}
    torch.save({"state_dict": weights, "state_dict_ema": ema}, tmp_path / "t.pth")
    ok("convert", "checkpoint", tmp_path / "t.pth", tmp_path / "plain.pt")
    plain = torch.load(tmp_path / "plain.pt", weights_only=True)
    assert_identical(plain, hand_recipe(tmp_path / "t.pth"), ordered=True)
    ok("convert", "checkpoint", tmp_path / "t.pth", tmp_path / "ema.pt", "--key", "state_dict_ema")
    picked = torch.load(tmp_path / "ema.pt", weights_only=True)
    assert_identical(picked, hand_recipe(tmp_path / "t.pth", "state_dict_ema"), ordered=True)
    assert not torch.equal(picked["0.weight"], plain["0.weight"])


def test_a_channels_last_model_goes_to_safetensors_where_save_file_refuses_it(tmp_path):
    """A model trained in channels_last has non-contiguous convolution weights, which
    safetensors' own `save_file` refuses; the command writes them contiguous, the same values."""
    net = model().to(memory_format=torch.channels_last)
    state = net.state_dict()
    assert not state["0.weight"].is_contiguous()
    torch.save({"state_dict": state}, tmp_path / "cl.pth")
    with pytest.raises(ValueError, match="non contiguous"):
        save_file(hand_recipe(tmp_path / "cl.pth"), str(tmp_path / "recipe.safetensors"))
    ok("convert", "checkpoint", tmp_path / "cl.pth", tmp_path / "cl.safetensors")
    written = load_file(tmp_path / "cl.safetensors")
    assert_identical(written, hand_recipe(tmp_path / "cl.pth"), ordered=False)
    ok("convert", "checkpoint", tmp_path / "cl.pth", tmp_path / "cl.pt")
    plain = torch.load(tmp_path / "cl.pt", weights_only=True)
    assert all(tensor.is_contiguous() for tensor in plain.values())
    assert_identical(plain, hand_recipe(tmp_path / "cl.pth"), ordered=True)


def test_keys_partly_prefixed_are_kept_where_the_recipe_strips_each(tmp_path):
    """On purpose: `module.` is stripped only when every key has it (a DDP file), so a model
    whose own submodule is named `module` keeps its keys; --strip-prefix module. is the recipe."""
    state = model().state_dict()
    mixed = {("module." + k if k.startswith("0.") else k): v for k, v in state.items()}
    torch.save(mixed, tmp_path / "m.pth")
    result = ok("convert", "checkpoint", tmp_path / "m.pth", tmp_path / "kept.pt")
    assert "left as they are" in result.stderr
    assert list(torch.load(tmp_path / "kept.pt", weights_only=True)) == list(mixed)
    args = ("--strip-prefix", "module.")
    ok("convert", "checkpoint", tmp_path / "m.pth", tmp_path / "stripped.pt", *args)
    stripped = torch.load(tmp_path / "stripped.pt", weights_only=True)
    assert_identical(stripped, hand_recipe(tmp_path / "m.pth"), ordered=True)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_dtype_is_the_recipes_cast_of_floating_point_tensors(tmp_path, dtype):
    torch.save(model().state_dict(), tmp_path / "m.pth")
    ok("convert", "checkpoint", tmp_path / "m.pth", tmp_path / "h.pt", "--dtype", dtype)
    cast = getattr(torch, dtype)
    expected = {
        k: v.to(cast) if v.is_floating_point() else v
        for k, v in hand_recipe(tmp_path / "m.pth").items()
    }
    written = torch.load(tmp_path / "h.pt", weights_only=True)
    assert written["1.num_batches_tracked"].dtype == torch.int64  # integer buffers kept
    assert list(written) == list(expected)
    for name, tensor in expected.items():
        assert written[name].dtype == tensor.dtype and torch.equal(written[name], tensor)


def test_a_pickled_model_is_refused_where_the_recipe_fails_too(tmp_path):
    net = model()
    torch.save(net, tmp_path / "whole.pt")
    with pytest.raises(pickle.UnpicklingError):  # the recipe's weights_only=True load
        torch.load(tmp_path / "whole.pt", weights_only=True)
    result = runner.invoke(
        app, ["convert", "checkpoint", str(tmp_path / "whole.pt"), str(tmp_path / "w.pt")]
    )
    assert result.exit_code == 1
    assert result.stderr.startswith("Error:") and "--trust-checkpoint" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "w.pt").exists()
    ok("convert", "checkpoint", tmp_path / "whole.pt", tmp_path / "w.pt", "--trust-checkpoint")
    # = torch.load(..., weights_only=False).state_dict(), the trusting recipe
    trusted = torch.load(tmp_path / "whole.pt", weights_only=False).state_dict()
    assert_identical(torch.load(tmp_path / "w.pt", weights_only=True), trusted, ordered=True)


def test_an_existing_output_is_kept_where_torch_save_replaces_it(tmp_path):
    torch.save(model().state_dict(), tmp_path / "m.pth")
    (tmp_path / "out.pt").write_bytes(b"mine")
    result = runner.invoke(
        app, ["convert", "checkpoint", str(tmp_path / "m.pth"), str(tmp_path / "out.pt")]
    )
    assert result.exit_code != 0 and "--force" in result.stderr
    assert (tmp_path / "out.pt").read_bytes() == b"mine"


# --- convert tensor against torchvision's readers ----------------------------------------------


RNG = np.random.default_rng(7)


def saved(path: Path, array: np.ndarray, **options) -> Path:
    Image.fromarray(array).save(path, **options)
    return path


def tensor_of(tmp_path: Path, source: Path, name: str, *options: str) -> torch.Tensor:
    ok("convert", "tensor", source, tmp_path / name, *options)
    return torch.load(tmp_path / name, weights_only=True)


EIGHT_BIT = {
    "RGB": lambda: RNG.integers(0, 256, (5, 7, 3), dtype=np.uint8),
    "L": lambda: RNG.integers(0, 256, (5, 7), dtype=np.uint8),
    "RGBA": lambda: RNG.integers(0, 256, (5, 7, 4), dtype=np.uint8),
}


@pytest.mark.parametrize("mode", sorted(EIGHT_BIT))
def test_eight_bit_png_is_read_image_and_pil_to_tensor_and_to_tensor(tmp_path, mode):
    src = saved(tmp_path / "a.png", EIGHT_BIT[mode]())
    raw = tensor_of(tmp_path, src, "u8.pt", "--dtype", "uint8")
    expected = read_image(str(src))
    assert raw.dtype == torch.uint8 and raw.shape == expected.shape
    assert torch.equal(raw, expected)
    with Image.open(src) as image:
        assert torch.equal(raw, pil_to_tensor(image))
        plain = tensor_of(tmp_path, src, "f.pt")
        assert plain.dtype == torch.float32
        assert torch.equal(plain, to_tensor(image))  # v / 255, bit for bit
        # v2's ToImage + ToDtype(scale=True) multiplies by 1 / 255 instead: at most one float32
        # step (2**-24 below 1.0) from it
        as_float = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])(image)
        assert (plain - as_float.as_subclass(torch.Tensor)).abs().max() <= 2**-24
    ok("convert", "tensor", src, tmp_path / "hwc.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "hwc.npy"), np.asarray(Image.open(src)))


def close_to_dtype(scaled: torch.Tensor, stored: torch.Tensor) -> bool:
    """`scaled` (v / 65535 in float32) is within one float32 step of v2's
    `to_dtype(stored, float32, scale=True)`, which multiplies by 1 / 65535."""
    expected = v2.functional.to_dtype(stored, torch.float32, scale=True)
    return scaled.dtype == torch.float32 and bool((scaled - expected).abs().max() <= 2**-24)


def test_sixteen_bit_gray_png_keeps_its_depth_where_to_tensor_wraps(tmp_path):
    pixels = RNG.integers(0, 65536, (5, 7), dtype=np.uint16)
    pixels[0, :2] = (40000, 65535)  # past int16's range
    src = saved(tmp_path / "g.png", pixels)
    ok("convert", "tensor", src, tmp_path / "g.npy")
    array = np.load(tmp_path / "g.npy")
    assert array.dtype == np.uint16
    np.testing.assert_array_equal(array, np.asarray(Image.open(src)))
    stored = read_image(str(src), ImageReadMode.UNCHANGED)
    assert stored.dtype == torch.uint16 and torch.equal(stored[0], torch.from_numpy(array))
    scaled = tensor_of(tmp_path, src, "g.pt")
    assert torch.equal(scaled, torch.from_numpy(array.astype(np.float32) / np.float32(65535))[None])
    assert close_to_dtype(scaled, stored)
    # to_tensor reads PIL's I;16 as int16, unscaled: 40000 wraps to a negative number
    with Image.open(src) as image:
        wrapped = to_tensor(image)
    assert wrapped.dtype == torch.int16 and int(wrapped[0, 0, 0]) == 40000 - 65536
    # --dtype uint8 rounds v / 257 (the 8-bit value nearest), not the high byte
    eight = tensor_of(tmp_path, src, "g8.pt", "--dtype", "uint8")
    expected = np.rint(pixels / 257).astype(np.uint8)
    assert torch.equal(eight[0], torch.from_numpy(expected))


def test_sixteen_bit_colour_png_is_read_image_where_pil_keeps_eight_bits(tmp_path):
    pixels = RNG.integers(0, 65536, (5, 7, 3), dtype=np.uint16)
    src = tmp_path / "c.png"
    assert cv2.imwrite(str(src), pixels[..., ::-1])  # PIL cannot write 16-bit colour
    ok("convert", "tensor", src, tmp_path / "c.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "c.npy"), pixels)
    stored = read_image(str(src), ImageReadMode.UNCHANGED)
    assert torch.equal(stored, torch.from_numpy(pixels).permute(2, 0, 1))
    scaled = tensor_of(tmp_path, src, "c.pt")
    assert close_to_dtype(scaled, stored)
    with Image.open(src) as image:  # PIL decodes it to 8 bits: the high bytes
        np.testing.assert_array_equal(np.asarray(image), (pixels >> 8).astype(np.uint8))


@pytest.mark.parametrize("transparent", [False, True])
def test_a_palette_png_is_expanded_where_to_tensor_gives_indices(tmp_path, transparent):
    palette = Image.fromarray(RNG.integers(0, 256, (5, 7, 3), dtype=np.uint8)).quantize(16)
    src = tmp_path / "p.png"
    palette.save(src, **({"transparency": 3} if transparent else {}))
    raw = tensor_of(tmp_path, src, "p.pt", "--dtype", "uint8")
    mode, read_mode = (
        ("RGBA", ImageReadMode.RGB_ALPHA) if transparent else ("RGB", ImageReadMode.RGB)
    )
    assert torch.equal(raw, read_image(str(src), read_mode))
    with Image.open(src) as image:
        assert torch.equal(raw, pil_to_tensor(image.convert(mode)))
        assert to_tensor(image).shape == (1, 5, 7)  # the palette indices
        assert np.asarray(image).shape == (5, 7)
    assert read_image(str(src)).shape == (1, 5, 7)


def test_exif_orientation_is_read_image_with_apply_exif_orientation(tmp_path):
    exif = Image.Exif()
    exif[0x0112] = 6  # turned 90 degrees
    src = saved(tmp_path / "o.png", RNG.integers(0, 256, (4, 6, 3), dtype=np.uint8), exif=exif)
    turned = tensor_of(tmp_path, src, "t.pt", "--dtype", "uint8")
    assert torch.equal(turned, read_image(str(src), apply_exif_orientation=True))
    assert turned.shape == (3, 6, 4)
    stored = tensor_of(tmp_path, src, "s.pt", "--dtype", "uint8", "--no-exif")
    assert torch.equal(stored, read_image(str(src)))  # read_image's default: as stored
    with Image.open(src) as image:
        # pil_to_tensor and to_tensor take the pixels as stored too
        assert torch.equal(stored, pil_to_tensor(image))
        assert to_tensor(image).shape == (3, 4, 6)


def test_floats_to_png_round_where_to_pil_image_truncates(tmp_path):
    values = torch.tensor([[[0.0, 0.25, 0.999, 1.0, 127.6 / 255]]])
    torch.save(values, tmp_path / "f.pt")
    ok("convert", "tensor", tmp_path / "f.pt", tmp_path / "f.png")
    written = np.asarray(Image.open(tmp_path / "f.png"))
    np.testing.assert_array_equal(written, [[0, 64, 255, 255, 128]])  # round(x * 255)
    buffer = io.BytesIO()
    to_pil_image(values).save(buffer, format="PNG")  # x.mul(255).byte()
    np.testing.assert_array_equal(np.asarray(Image.open(buffer)), [[0, 63, 254, 255, 127]])


def test_eight_bit_pixels_as_a_uint8_tensor_print_no_torch_warning(tmp_path):
    """PIL's pixels are a read-only array: handed to torch as they were, torch printed a
    UserWarning (once a process, hence a process of its own here) about non-writable arrays."""
    src = saved(tmp_path / "g.png", EIGHT_BIT["L"]())
    command = [sys.executable, "-m", "torchkit", "convert", "tensor", str(src)]
    done = subprocess.run(
        [*command, str(tmp_path / "g.pt"), "--dtype", "uint8", "-q"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    with Image.open(src) as image:
        assert torch.equal(torch.load(tmp_path / "g.pt", weights_only=True), pil_to_tensor(image))
