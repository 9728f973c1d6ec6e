"""Partly labelled data for tests: the same samples, of which only some have a label, as
WebDataset shards, an HF parquet file or a CSV index (docs/data.md's partly labelled data)."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Sequence
from pathlib import Path

from parquet_files import write_parquet
from PIL import Image

KINDS = ["shards", "parquet", "csv"]


def png(index: int) -> bytes:
    """A 4x4 PNG whose red value is `index` * 40 (which sample it is, read back)."""
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4), (index * 40, 3, 5)).save(buffer, format="PNG")
    return buffer.getvalue()


def partly_labelled_source(
    kind: str, folder: Path, labels: Sequence[str | None], names: Sequence[str]
) -> Path:
    """`labels` (a class name of `names` per sample, None for no label) as partly labelled data
    of `kind` in `folder` (made): shards `s{i}` with no `KEY.cls` for no label beside
    classes.txt, a parquet file (null and -1 in turn for no label), or a CSV index of `{i}.png`
    (an empty label). Returns what `--data` names."""
    folder.mkdir()
    if kind == "shards":
        (folder / "classes.txt").write_text("".join(f"{name}\n" for name in names))
        with tarfile.open(folder / "shard-000000.tar", "w") as tar:
            for index, label in enumerate(labels):
                members = {"png": png(index)}
                if label is not None:
                    members["cls"] = str(names.index(label)).encode()
                for extension, data in members.items():
                    info = tarfile.TarInfo(f"s{index}.{extension}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        return folder
    if kind == "parquet":
        missing = [None, -1]
        indices, unlabelled = [], 0
        for label in labels:
            if label is None:
                indices.append(missing[unlabelled % 2])
                unlabelled += 1
            else:
                indices.append(names.index(label))
        images = [png(index) for index in range(len(labels))]
        return write_parquet(folder / "data.parquet", images, indices, names=list(names))
    lines = ["path,label"]
    for index, label in enumerate(labels):
        (folder / f"{index}.png").write_bytes(png(index))
        lines.append(f"{index}.png,{label or ''}")
    (folder / "index.csv").write_text("\n".join(lines) + "\n")
    return folder / "index.csv"
