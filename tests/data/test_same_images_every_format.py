"""The same images in every kind of data give the same figures: an image folder, a CSV index of
it, a `.tar` of it, WebDataset shards written by webdataset's own writer, and a parquet file
written as HF's `datasets` writes one, holding grayscale, RGBA, palette with transparency,
CMYK, 16-bit and EXIF-rotated images. `dataset-stats` measures what NumPy measures over PIL's
pixels (a 16-bit image scaled to 8 bits), and `extract-features` gives every image the same
features bit for bit, whatever holds it."""

from __future__ import annotations

import csv
import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from checkpoints import write_convnet_checkpoint
from parquet_files import write_parquet
from PIL import Image
from processes import run_torchkit_in_process

pytest.importorskip("pyarrow")
pytest.importorskip("webdataset")

CLASSES = ("a", "b")


def _encoded(kind: str, seed: int) -> tuple[str, bytes]:
    """(extension, file bytes) of one 6x9 image of `kind`."""
    rng = np.random.default_rng(seed)
    rgb = Image.fromarray(rng.integers(0, 256, (6, 9, 3), dtype=np.uint8))
    buffer = io.BytesIO()
    if kind == "gray":
        rgb.convert("L").save(buffer, format="JPEG", quality=95)
    elif kind == "rgba":
        rgba = np.dstack([np.asarray(rgb), rng.integers(0, 256, (6, 9), dtype=np.uint8)])
        Image.fromarray(rgba).save(buffer, format="PNG")
    elif kind == "palette":
        rgb.convert("P").save(buffer, format="PNG", transparency=3)
    elif kind == "cmyk":
        rgb.convert("CMYK").save(buffer, format="JPEG", quality=95)
    elif kind == "sixteen":
        Image.fromarray(rng.integers(0, 65536, (6, 9), dtype=np.uint16)).save(buffer, format="PNG")
    elif kind == "exif":  # a JPEG tagged "rotate 90": read as stored, as PIL opens it
        exif = Image.Exif()
        exif[0x0112] = 6
        rgb.save(buffer, format="JPEG", quality=90, exif=exif.tobytes())
    elif kind == "jpeg":
        rgb.save(buffer, format="JPEG", quality=90)
    else:
        rgb.save(buffer, format="PNG")
    return ("png" if buffer.getvalue()[:4] == b"\x89PNG" else "jpg"), buffer.getvalue()


KINDS = ("plain", "gray", "rgba", "palette", "cmyk", "sixteen", "exif")


def _reference_pixels(data: bytes) -> np.ndarray:
    """An image's RGB pixels as NumPy over PIL's decoding gives them, a 16-bit image's scaled
    to 8 bits (round(v / 257))."""
    image = Image.open(io.BytesIO(data))
    if image.mode.startswith("I"):
        grey = np.round(np.asarray(image, dtype=np.float64) / 257)
        return np.repeat(grey[..., None], 3, axis=2)
    return np.asarray(image.convert("RGB"), dtype=np.float64)


@pytest.fixture(scope="module")
def formats(tmp_path_factory) -> dict:
    """The one set of images in each kind of data: {name: (data, path in outputs -> the
    image's path in the folder)}, and the images' bytes by folder path."""
    import pyarrow.parquet as pq  # noqa: F401 (the parquet extra)
    import webdataset as wds

    root = tmp_path_factory.mktemp("same")
    images: dict[str, bytes] = {}
    for label, name in enumerate(CLASSES):
        for number, kind in enumerate(KINDS):
            ext, data = _encoded(kind, seed=10 * label + number)
            images[f"{name}/{kind}.{ext}"] = data
    folder = root / "folder"
    for rel, data in images.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    index = root / "index.csv"
    with index.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["path", "label"])
        writer.writerows([f"folder/{rel}", rel.split("/")[0]] for rel in images)
    archive = root / "folder.tar"
    with tarfile.open(archive, "w") as tar:
        for rel in images:
            tar.add(folder / rel, arcname=rel)
    shards = root / "shards"
    shards.mkdir()
    with wds.TarWriter(str(shards / "data-000000.tar")) as sink:
        for rel, data in images.items():
            stem, ext = rel.rsplit(".", 1)
            label = CLASSES.index(rel.split("/")[0])
            sink.write({"__key__": stem.replace("/", "_"), ext: data, "cls": label})
    (shards / "classes.txt").write_text("\n".join(CLASSES) + "\n")
    rels = list(images)
    parquet = write_parquet(
        root / "set.parquet",
        [images[rel] for rel in rels],
        [CLASSES.index(rel.split("/")[0]) for rel in rels],
        names=CLASSES,
    )
    by_stem = {rel.rsplit(".", 1)[0].replace("/", "_"): rel for rel in rels}
    checkpoint = root / "model.pt"
    write_convnet_checkpoint(checkpoint, in_channels=3, image_size=8, classes="ab")
    return {
        "images": images,
        "checkpoint": checkpoint,
        "data": {
            "folder": (folder, lambda p: p),
            "csv": (index, lambda p: p.removeprefix("folder/")),
            "tar": (archive, lambda p: p),
            "shards": (shards, lambda p: by_stem[p.split("/", 1)[1].rsplit(".", 1)[0]]),
            "parquet": (parquet, lambda p: rels[int(p.rsplit("/", 1)[1])]),
        },
    }


FORMATS = ("folder", "csv", "tar", "shards", "parquet")


@pytest.mark.parametrize("name", FORMATS)
def test_dataset_stats_measure_what_numpy_measures_over_pils_pixels(formats, name):
    data, _ = formats["data"][name]
    result = run_torchkit_in_process("dataset-stats", data, "-j", "0", "--format", "json")
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    pixels = np.concatenate(
        [_reference_pixels(b).reshape(-1, 3) / 255 for b in formats["images"].values()]
    )
    np.testing.assert_allclose(stats["mean"], pixels.mean(0), rtol=0, atol=1e-9)
    np.testing.assert_allclose(stats["std"], pixels.std(0), rtol=0, atol=1e-9)
    assert stats["images"] == 2 * len(KINDS)
    assert [(c["name"], c["images"]) for c in stats["classes"]] == [("a", 7), ("b", 7)]
    assert stats["modes"] == {"RGB": 4, "L": 2, "RGBA": 2, "P": 2, "CMYK": 2, "I;16": 2}
    assert stats["formats"] == {"PNG": 8, "JPEG": 6}


def _features(formats, name: str, out: Path) -> dict[str, tuple[str, np.ndarray]]:
    data, folder_path = formats["data"][name]
    result = run_torchkit_in_process(
        "extract-features", formats["checkpoint"], data, "--out", out, "-j", "0"
    )
    assert result.returncode == 0, result.stderr
    with (out / "index.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    features = np.load(out / "penultimate.npy")
    return {folder_path(r["path"]): (r["label"], features[int(r["row"])]) for r in rows}


def test_extract_features_are_the_same_bit_for_bit_in_every_format(formats, tmp_path):
    folder = _features(formats, "folder", tmp_path / "folder")
    assert sorted(folder) == sorted(formats["images"])
    for name in FORMATS[1:]:
        other = _features(formats, name, tmp_path / name)
        assert sorted(other) == sorted(folder), name
        for rel, (label, row) in folder.items():
            assert other[rel][0] == label == rel.split("/")[0], (name, rel)
            assert np.array_equal(other[rel][1], row), (name, rel)


def test_train_on_parquet_or_streamed_shards_that_fit_one_window_takes_the_folders_order():
    """Images read in blocks (parquet row groups, streamed shards) all of which the reader
    holds at once were shuffled otherwise than the same images in a folder: the same seed
    trained them in another order. Blocks of more than one window keep their windowed order."""
    from torchkit.core.data.stored_image import Blocks
    from torchkit.core.train.loaders import EpochSampler

    ids = [b for b in range(5) for _ in range(4)]

    def order(blocks: Blocks | None) -> list[int]:
        sampler = EpochSampler(len(ids), shuffle=True, seed=7, blocks=blocks)
        sampler.set_epoch(2)
        return [index for _, index in sampler]

    files = order(None)
    assert order(Blocks(ids, window=5)) == files  # streamed shards without a cache limit
    assert order(Blocks(ids, window=1, sizes=[10] * 5, capacity=50)) == files  # parquet
    assert order(Blocks(ids, window=2)) != files
    assert order(Blocks(ids, window=1, sizes=[10] * 5, capacity=49)) != files


def _split_folder_and_parquet(root: Path, kind: str) -> tuple[Path, Path]:
    """The same images (of `kind`) as a split root and as HF parquet of it, rows in the
    folder's order."""
    folder, parquet = root / "folder", root / "hf"
    for split, count, hf_split in (("train", 6, "train"), ("val", 2, "validation")):
        rels, labels = [], []
        for label, name in enumerate(CLASSES):
            for number in range(count):
                ext, data = _encoded(kind, seed=100 * label + 10 * count + number)
                rel = f"{name}/{number}.{ext}"
                (folder / split / rel).parent.mkdir(parents=True, exist_ok=True)
                (folder / split / rel).write_bytes(data)
                rels.append(data)
                labels.append(label)
        write_parquet(
            parquet / "data" / f"{hf_split}-00000-of-00001.parquet", rels, labels, names=CLASSES
        )
    return folder, parquet


@pytest.fixture(scope="module")
def split_data(tmp_path_factory) -> Callable[[str], tuple[Path, Path]]:
    """`_split_folder_and_parquet` of a kind of image, made once for the module's tests (which
    only read it)."""
    made: dict[str, tuple[Path, Path]] = {}

    def of(kind: str) -> tuple[Path, Path]:
        if kind not in made:
            made[kind] = _split_folder_and_parquet(tmp_path_factory.mktemp(kind), kind)
        return made[kind]

    return of


def _train_figures(root: Path, datas: tuple[Path, ...], *options: str) -> list[list[dict]]:
    figures = []
    for data in datas:
        out = root / f"run-{data.name}"
        result = run_torchkit_in_process(
            "train", "--data", data, "--model", "nets:TinyNet", "--image-size", "8",
            "--workers", "0", "--epochs", "2", "--batch-size", "4", "--seed", "3",
            "--out", out, *options,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        with (out / "metrics.csv").open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        figures.append(
            [{k: v for k, v in r.items() if "time" not in k and "_s" not in k} for r in rows]
        )
    return figures


def test_train_figures_of_a_split_folder_and_of_parquet_of_it_are_the_same(split_data, tmp_path):
    figures = _train_figures(tmp_path, split_data("plain"))
    assert figures[0] == figures[1]


def test_decode_device_takes_the_jpegs_of_parquet_as_it_takes_jpeg_files(split_data, tmp_path):
    """`--decode device` decoded JPEG files on the device and the same JPEGs in parquet rows
    (`FILE/ROW`, no `.jpg` name) in the workers, and `--decode auto` on CUDA took `fast` for
    parquet of JPEGs: other pixels, other figures (here on the CPU, where the device path
    decodes with torchvision)."""
    from torchkit.core.data.device_decode import resolve_decode
    from torchkit.core.data.sources import open_data

    folder, parquet = split_data("jpeg")
    figures = _train_figures(tmp_path, (folder, parquet), "--decode", "device")
    assert figures[0] == figures[1]
    for data, device in ((parquet, "device"), (split_data("plain")[1], "fast")):
        paths = list(open_data(str(data)).splits["train"].paths)
        chosen = resolve_decode(
            "auto", device_type="cuda", paths=paths, augment="basic", random_erasing=0.0
        )
        assert chosen == (device, None)


def test_decode_auto_judging_parquet_by_its_bytes_leaves_no_row_group_held(split_data):
    """`--decode auto` on CUDA reads the first rows of parquet to judge them: through the run's
    reader, which kept the row groups read (a whole image column: 77 MB for 1,000 images of 77
    kB) in the main process for the whole run, where loader workers read the images."""
    import pyarrow as pa

    from torchkit.core.data.device_decode import resolve_decode
    from torchkit.core.data.sources import open_data

    parquet = split_data("jpeg")[1]
    paths = list(open_data(str(parquet)).splits["train"].paths)
    before = pa.total_allocated_bytes()
    chosen = resolve_decode(
        "auto", device_type="cuda", paths=paths, augment="basic", random_erasing=0.0
    )
    assert chosen == ("device", None)
    assert pa.total_allocated_bytes() == before
    assert paths[0].read_bytes()[:2] == b"\xff\xd8"  # the run's reader still reads
