"""What an exported file says about its model (classes, preprocessing, input shape...), and how
each format carries it: ONNX as `metadata_props` (key `torchkit.<field>`, value the field as
JSON), TorchScript and torch.export as one extra file `torchkit.json` inside the archive (both
`torch.jit.save(_extra_files=...)` and `torch.export.save(extra_files=...)` round-trip it)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from torchkit import __version__
from torchkit.core.data.preprocessing import Preprocess
from torchkit.core.io.errors import InputError
from torchkit.core.models.stored_classes import stored_class_names
from torchkit.core.models.written_versions import check_written_version

METADATA_VERSION = 1
EXTRA_FILE = "torchkit.json"
ONNX_PREFIX = "torchkit."
INPUT_NAME = "input"
OUTPUT_NAME = "logits"


def build_metadata(
    *,
    fmt: str,
    arch: str,
    classes: list[str] | None,
    preprocess: Preprocess,
    input_shape: tuple[int, ...],
    batch_size: int | None,
    dtype: str,
    opset: int | None,
    weights_source: str | None,
    num_outputs: int | None = None,
    data: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The fields stored with an exported model; `batch_size` None means a dynamic batch.
    `data` is the checkpoint's record of its training data (the split the run held out), so
    that eval of the file on that data scores the same images as eval of the checkpoint."""
    fields = {
        "metadata_version": METADATA_VERSION,
        "torchkit_version": __version__,
        "format": fmt,
        "arch": arch,
        "classes": list(classes) if classes else None,
        "preprocess": preprocess.to_dict(),
        "input_shape": [int(n) for n in input_shape],
        "batch_size": batch_size,
        "dtype": dtype,
        "opset": opset,
        "input_name": INPUT_NAME,
        "output_name": OUTPUT_NAME,
        "weights": weights_source,
        "num_outputs": num_outputs,
    }
    if data:
        # Not the working directory the run trained in (a home folder, a user name): only
        # `train --resume` reads it, and an exported file is made to be handed on.
        fields["data"] = {key: value for key, value in data.items() if key != "workdir"}
    return fields


def to_onnx_props(metadata: Mapping[str, Any]) -> dict[str, str]:
    return {f"{ONNX_PREFIX}{key}": json.dumps(value) for key, value in metadata.items()}


def from_onnx_props(props: Mapping[str, str]) -> dict[str, Any]:
    """The torchkit fields of an ONNX model's metadata_props; a value that is not JSON is kept
    as the string it is."""
    found: dict[str, Any] = {}
    for key, value in props.items():
        if key.startswith(ONNX_PREFIX):
            try:
                found[key[len(ONNX_PREFIX) :]] = json.loads(value)
            except ValueError:
                found[key[len(ONNX_PREFIX) :]] = value
    return found


def to_extra_file(metadata: Mapping[str, Any]) -> str:
    return json.dumps(dict(metadata), indent=2)


def from_extra_file(content: str | bytes | None) -> dict[str, Any]:
    """The fields of `torchkit.json` (torch.jit.load gives bytes, torch.export.load a str);
    empty when the archive has none (not written by torchkit) or it is not a JSON object."""
    if not content:
        return {}
    if isinstance(content, bytes):
        content = content.decode("utf-8", errors="replace")
    try:
        data = json.loads(content)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def check_metadata(metadata: Mapping[str, Any], source: str) -> None:
    """Refuse, before any output, the torchkit record of an exported file newer than this
    torchkit's (its fields may mean other things: read anyway, the model could be fed or
    labelled wrongly without a word), as a checkpoint of a newer format is refused, and one
    whose class names no torchkit writes (`classes_of`). A file without one (torch exported
    it, not torchkit) has nothing to refuse."""
    if "metadata_version" in metadata:
        check_written_version(
            metadata["metadata_version"],
            metadata.get("torchkit_version"),
            METADATA_VERSION,
            where=source,
            field="torchkit metadata_version",
            kind="exported-model metadata version",
            error=InputError,
        )
    classes_of(metadata, source)


def preprocess_of(metadata: Mapping[str, Any]) -> Preprocess | None:
    data = metadata.get("preprocess")
    return Preprocess.from_dict(data) if isinstance(data, dict) else None


def data_of(metadata: Mapping[str, Any]) -> dict[str, Any] | None:
    data = metadata.get("data")
    return data if isinstance(data, dict) else None


def classes_of(metadata: Mapping[str, Any], source: str) -> list[str] | None:
    """The class names the record of the file `source` stores (`stored_class_names`)."""
    return stored_class_names(metadata.get("classes"), source, InputError)
