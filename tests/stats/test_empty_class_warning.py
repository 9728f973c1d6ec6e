"""dataset-stats' warning of a class without images was "1 class folder(s) hold no images: c"
for every kind of data: a class of parquet (HF's ClassLabel names it) or a CSV index is no
folder, and the val split of a split root that lacks the class has no folder of it either. It
names the split measured instead. And the warning of a channel without variation (std 0)."""

from __future__ import annotations

from image_folders import write_image_folder
from parquet_files import png, write_parquet
from processes import run_torchkit_in_process


def warnings_of(*args: object) -> list[str]:
    result = run_torchkit_in_process("dataset-stats", *args, "-j", "0", "--format", "json")
    assert result.returncode == 0, result.stderr
    return [line for line in result.stderr.splitlines() if line.startswith("Warning:")]


def test_a_class_the_classlabel_names_but_no_row_has_is_no_folder(tmp_path):
    data = write_parquet(tmp_path / "d.parquet", [png(i) for i in range(4)], [0, 1, 0, 1])
    assert warnings_of(data) == ["Warning: 1 class(es) have no images: c"]


def test_a_class_the_val_split_lacks_is_named_with_the_split(tmp_path):
    root = tmp_path / "data"
    write_image_folder(root / "train", {"a": 2, "b": 2, "c": 2})
    write_image_folder(root / "val", {"a": 1, "b": 1}, seed=7)
    expected = ["Warning: 1 class(es) have no images in the val split: c"]
    assert warnings_of(root, "--split", "val", "--no-leakage") == expected
    assert warnings_of(root, "--split", "all", "--no-leakage") == []


def test_a_channel_of_one_value_in_every_pixel_is_warned_of(tmp_path):
    """Its std is 0: the printed Normalize(std=[0.0000, ...]) divides by zero, unsaid."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for at, label in enumerate("aabb"):
        pixels = rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)
        pixels[..., 0] = 200  # red the same everywhere, in every image
        (tmp_path / label).mkdir(exist_ok=True)
        Image.fromarray(pixels).save(tmp_path / label / f"{at}.png")
    assert warnings_of(tmp_path) == [
        "Warning: channel(s) R hold one value in every pixel (std 0): transforms.Normalize "
        "with that std divides by zero; give it std 1 there"
    ]
    gray = tmp_path / "gray" / "a"
    gray.mkdir(parents=True)
    for at in range(2):
        Image.new("L", (4, 4), 90).save(gray / f"{at}.png")
    assert warnings_of(tmp_path / "gray", "--mode", "gray")[-1].startswith("Warning: channel(s) ")
