"""Parquet files as Hugging Face `datasets` writes them, and the small PNGs they hold: what the
parquet tests (data/test_parquet_read.py, data/test_parquet_train_order.py) read."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

CLASSES_LIST = ("a", "b", "c")


def hf_features(names: Sequence[str] | None) -> dict:
    label = {"_type": "ClassLabel", "names": list(names)} if names else {"_type": "Value"}
    return {"image": {"_type": "Image"}, "label": label}


def write_parquet(
    path: Path,
    images: list[bytes | None],
    labels: list[int] | None,
    *,
    names: Sequence[str] | None = CLASSES_LIST,
    row_group_size: int = 4,
    image_paths: Sequence[str | None] | None = None,
) -> Path:
    """A parquet file as HF's `datasets` writes one: an `image` struct {bytes, path}, an int
    `label`, and the `huggingface` schema metadata naming the features. `image_paths`: each
    image's `path` (a null image with a path: a dataset saved without its images embedded)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    fields = [("image", image)] + ([("label", pa.int64())] if labels is not None else [])
    features = hf_features(names)
    if labels is None:
        features.pop("label")
    metadata = {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
    paths = image_paths or [None] * len(images)
    columns: dict = {
        "image": [
            None if b is None and p is None else {"bytes": b, "path": p}
            for b, p in zip(images, paths, strict=True)
        ]
    }
    if labels is not None:
        columns["label"] = labels
    path.parent.mkdir(parents=True, exist_ok=True)
    schema = pa.schema(fields, metadata=metadata)
    pq.write_table(pa.table(columns, schema=schema), path, row_group_size=row_group_size)
    return path


def png(seed: int) -> bytes:
    import io

    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def counted_row_group_reads(monkeypatch) -> list[int]:
    """The row groups pyarrow reads from now on (`ParquetFile.read_row_group`), in order, each
    still read as ever."""
    import pyarrow.parquet as pq

    reads: list[int] = []
    real = pq.ParquetFile.read_row_group

    def counted(self, group, *args, **kwargs):
        reads.append(group)
        return real(self, group, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", counted)
    return reads
