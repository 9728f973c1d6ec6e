"""predict's JSON and JSONL rows named an image's true class by its name alone (`label`): where
two classes share a name (ImageNet's two `crane`s), a row could not say which it was. They now
carry `label_index` beside it, as eval's predictions.csv does; CSV and the table keep their
columns (they show such a name as `crane (#2)`)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
from checkpoints import write_convnet_checkpoint
from PIL import Image
from processes import run_torchkit_in_process

NAMES = ["crane", "b", "crane", "c"]  # classes 0 and 2 share a name
LABELS = [0, 2, 1, 2]  # the shard's samples' classes (KEY.cls)


def png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def write_world(root: Path) -> dict[str, Path]:
    """shards/: a shard (webdataset's TarWriter) of samples labelled by index beside a
    classes.txt naming `crane` twice; photo.png: an unlabelled image file; a convnet of NAMES."""
    import webdataset as wds

    shards = root / "shards"
    shards.mkdir()
    (shards / "classes.txt").write_text("".join(f"{name}\n" for name in NAMES))
    with wds.TarWriter(str(shards / "s-000000.tar")) as sink:
        for key, label in enumerate(LABELS):
            sink.write({"__key__": f"k{key}", "png": png(key), "cls": label})
    (root / "photo.png").write_bytes(png(9))
    model = root / "model.pt"
    write_convnet_checkpoint(model, in_channels=3, image_size=8, classes=NAMES)
    return {"shards": shards, "photo": root / "photo.png", "model": model}


def predicted(*args: object) -> str:
    found = run_torchkit_in_process("predict", *args, "-j", "0")
    assert found.returncode == 0, found.stderr
    return found.stdout


def test_json_rows_say_which_of_two_classes_of_one_name_an_image_is(tmp_path):
    world = write_world(tmp_path)
    rows = json.loads(predicted(world["model"], world["shards"], "--format", "json"))
    assert [row["label"] for row in rows] == [NAMES[label] for label in LABELS]
    assert [row["label_index"] for row in rows] == LABELS
    assert list(rows[0])[:4] == ["path", "label", "label_index", "class"]

    # Several IMAGES (and JSONL): each label's index among its own input's classes, as
    # `label` is its name there; an image file has neither. (CSV keeps its columns:
    # test_predict's header checks.)
    lines = predicted(world["model"], world["photo"], world["shards"], "--format", "jsonl")
    both = [json.loads(line) for line in lines.splitlines()]
    assert [(row["label"], row["label_index"]) for row in both] == [
        (None, None),
        *((NAMES[label], label) for label in LABELS),
    ]
    assert both[1:] == [{**row, "path": both[1 + at]["path"]} for at, row in enumerate(rows)]
