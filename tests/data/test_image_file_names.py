"""Which files of a folder are images: the extensions data.md names are those the readers take,
in any case; an animated GIF is its first frame; other files are not images."""

from __future__ import annotations

import re

import numpy as np
from PIL import Image
from processes import run_json
from suite_paths import REPO

from torchkit.core.data.sources.discovery import IMAGE_EXTENSIONS


def test_data_md_names_exactly_the_extensions_read():
    text = (REPO / "docs" / "data.md").read_text(encoding="utf-8")
    bullet = re.search(r"^- Image files are those named (.*?)in any case", text, re.M | re.S)
    assert bullet, "data.md's bullet naming the image extensions"
    assert set(re.findall(r"`(\.\w+)`", bullet.group(1))) == IMAGE_EXTENSIONS


def test_upper_case_jfif_and_animated_gif_files_are_images_and_others_are_not(tmp_path):
    cat = tmp_path / "data" / "cat"
    cat.mkdir(parents=True)
    red = np.zeros((4, 4, 3), np.uint8)
    red[..., 0] = 255
    Image.fromarray(red).save(cat / "a.JPG", quality=100)
    Image.fromarray(red).save(cat / "b.jfif", format="JPEG", quality=100)
    first, second = Image.fromarray(red), Image.new("RGB", (4, 4), (0, 0, 255))
    first.save(cat / "c.gif", save_all=True, append_images=[second], duration=10)
    (cat / "Thumbs.db").write_bytes(b"\0" * 64)
    stats = run_json("dataset-stats", tmp_path / "data", "--no-leakage", "-j", "0")  # no pool
    assert stats["images"] == 3 and stats["unreadable_count"] == 0
    assert stats["non_image_files"] == 1
    assert stats["formats"] == {"GIF": 1, "JPEG": 2}
    # the GIF's first frame (red), as Image.open(path).convert("RGB") gives it, not its blue one
    assert stats["mean"][2] < 0.02 and stats["mean"][0] > 0.98
