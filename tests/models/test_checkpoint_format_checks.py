"""A torchkit checkpoint of a format newer than this torchkit knows (its keys may mean other
things) loaded silently: it is one error line. One whose `classes` name a class twice (as
torchvision's ImageNet names do) still loads. The same holds for the torchkit record of an
exported file (ONNX, TorchScript)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from PIL import Image

from tests.helpers.checkpoints import read_checkpoint, write_convnet_checkpoint
from torchkit.cli import app
from torchkit.core.io.errors import CheckpointError, InputError
from torchkit.core.models import resolve_model
from torchkit.core.models.checkpoint import FORMAT_VERSION, load_checkpoint, save_checkpoint
from torchkit.core.models.exported.loading import load_exported
from torchkit.core.models.exported.metadata import METADATA_VERSION


def _checkpoint(tmp_path: Path, name: str, **changes) -> Path:
    path = tmp_path / name
    write_convnet_checkpoint(path, in_channels=3, image_size=8, classes="ab")
    save_checkpoint({**read_checkpoint(path), **changes}, path)
    return path


def _images(root: Path) -> Path:
    for index, name in enumerate("ab"):
        (root / name).mkdir(parents=True)
        Image.new("RGB", (8, 8), (index * 100, 0, 0)).save(root / name / f"{index}.png")
    return root


def test_a_checkpoint_naming_a_class_twice_still_predicts(runner, tmp_path):
    # torchvision's ImageNet names hold two `crane`s: such a checkpoint is no damaged file.
    model = _checkpoint(tmp_path, "dup.pt", classes=["a", "a"])
    images = _images(tmp_path / "imgs")
    result = runner.invoke(app, ["predict", str(model), str(images), "-j", "0", "--format", "csv"])
    assert result.exit_code == 0, result.stderr
    assert len(result.stdout.strip().splitlines()) == 3  # the header and the two images


def test_a_checkpoint_of_a_newer_format_asks_for_a_newer_torchkit(runner, tmp_path):
    model = _checkpoint(tmp_path, "new.pt", format_version=999, torchkit_version="9.0.0")
    images = _images(tmp_path / "imgs")
    result = runner.invoke(app, ["predict", str(model), str(images), "-j", "0"])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(
        f"Error: checkpoint {model} was written by torchkit 9.0.0 (checkpoint format 999); "
        f"this torchkit ("
    )
    assert lines[0].endswith(f"reads formats up to {FORMAT_VERSION} (upgrade torchkit to read it)")
    summary = runner.invoke(app, ["summary", str(model)])
    assert summary.exit_code == 1 and "upgrade torchkit" in summary.stderr


def test_format_versions_that_load_and_those_that_do_not(tmp_path):
    current = _checkpoint(tmp_path, "current.pt", format_version=FORMAT_VERSION)
    assert load_checkpoint(current)["classes"] == ["a", "b"]
    with pytest.raises(CheckpointError, match=r"was written by a newer torchkit \(checkpoint"):
        load_checkpoint(_checkpoint(tmp_path, "next.pt", format_version=FORMAT_VERSION + 1))
    with pytest.raises(CheckpointError, match="format_version '2', which no torchkit writes"):
        load_checkpoint(_checkpoint(tmp_path, "text.pt", format_version="2"))


def _record(version, **more) -> dict:
    """The torchkit record of a 3-class model for 8x8 RGB images, of metadata `version`."""
    return {
        "metadata_version": version,
        "torchkit_version": "9.0.0",
        "classes": ["a", "a", "b"],  # a name twice, as in torchvision's ImageNet names
        "input_shape": [3, 8, 8],
        "weights": "trained.pt",
        **more,
    }


def _onnx_file(path: Path, record: dict) -> Path:
    """A 1x3x8x8 -> 1x3 ONNX model (the channel means), built with onnx's helpers: no export."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("GlobalAveragePool", ["input"], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "means",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    helper.set_model_props(model, {f"torchkit.{k}": json.dumps(v) for k, v in record.items()})
    onnx.save(model, str(path))
    return path


class _Means(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean((2, 3))


def _torchscript_file(path: Path, record: dict) -> Path:
    with warnings.catch_warnings():  # torch.jit is deprecated, and says so
        warnings.simplefilter("ignore", FutureWarning)
        module = torch.jit.script(_Means())
        torch.jit.save(module, str(path), _extra_files={"torchkit.json": json.dumps(record)})
    return path


def test_an_exported_file_of_a_newer_metadata_version_asks_for_a_newer_torchkit(runner, tmp_path):
    """An ONNX or TorchScript file torchkit exported carries a metadata_version, which was
    never read: a newer record (its fields may mean other things) was used as it stood."""
    images = _images(tmp_path / "imgs")
    onnx_file = _onnx_file(tmp_path / "new.onnx", _record(METADATA_VERSION + 1))
    script_file = _torchscript_file(tmp_path / "new.ts", _record(METADATA_VERSION + 1))
    for model, trust in ((onnx_file, []), (script_file, ["--trust-checkpoint"])):
        out = tmp_path / f"{model.suffix[1:]}.csv"
        args = ["predict", str(model), str(images), "-j", "0", *trust, "-o", str(out)]
        result = runner.invoke(app, args)
        assert result.exit_code == 1, result.stderr
        assert result.stdout == "" and not out.exists()
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith(
            f"Error: {model} was written by torchkit 9.0.0 (exported-model metadata version "
            f"{METADATA_VERSION + 1}); this torchkit ("
        )
        assert lines[0].endswith(
            f"reads versions up to {METADATA_VERSION} (upgrade torchkit to read it)"
        )
    with pytest.raises(InputError, match="upgrade torchkit"):
        load_checkpoint(script_file, trust_checkpoint=True)  # convert checkpoint's reading


def test_exported_metadata_versions_that_load_and_those_that_do_not(tmp_path):
    current = load_exported(_onnx_file(tmp_path / "current.onnx", _record(METADATA_VERSION)))
    assert current.classes == ["a", "a", "b"]
    script = load_exported(_torchscript_file(tmp_path / "cur.ts", _record(METADATA_VERSION)))
    assert script.classes == ["a", "a", "b"]
    foreign = _onnx_file(tmp_path / "foreign.onnx", {})  # torch exported it: no record
    assert load_exported(foreign).classes is None
    with pytest.raises(InputError, match=r"written by a newer torchkit \(exported-model"):
        load_exported(_onnx_file(tmp_path / "next.onnx", _record(2, torchkit_version=None)))
    with pytest.raises(InputError, match="metadata_version '1', which no torchkit writes"):
        load_exported(_onnx_file(tmp_path / "text.onnx", _record("1")))
    with pytest.raises(InputError, match="metadata_version 0, which no torchkit writes"):
        load_exported(_torchscript_file(tmp_path / "zero.ts", _record(0)))


NOT_TORCHKIT = "(the file is damaged or was not written by torchkit: "
EVERY_CLASS_NAMED = NOT_TORCHKIT + "every class is named by a non-empty text)"


def test_a_checkpoint_class_no_torchkit_names_is_one_error_line_before_any_output(runner, tmp_path):
    """A class recorded as None was read as a class "None", and "" as a class of no name
    (predict printed class ""): both are refused, naming the file and the class index, by
    every reader of the file (predict, and convert checkpoint, which copies them)."""
    images = _images(tmp_path / "imgs")
    model = _checkpoint(tmp_path, "none.pt", classes=["a", None])
    out = tmp_path / "predictions.csv"
    result = runner.invoke(app, ["predict", str(model), str(images), "-j", "0", "-o", str(out)])
    assert result.exit_code == 1
    assert result.stdout == "" and not out.exists()
    assert result.stderr.strip().splitlines() == [
        f"Error: checkpoint {model} has class 1 named None, which no torchkit writes "
        + EVERY_CLASS_NAMED
    ]
    empty = _checkpoint(tmp_path, "empty.pt", classes=["a", ""])
    copy = tmp_path / "copy.pt"
    converted = runner.invoke(
        app, ["convert", "checkpoint", "--average", str(model), str(empty), str(copy)]
    )
    assert converted.exit_code == 1 and not copy.exists()
    assert converted.stderr.strip().splitlines() == [
        f"Error: checkpoint {model} has class 1 named None, which no torchkit writes "
        + EVERY_CLASS_NAMED
    ]
    with pytest.raises(CheckpointError, match=rf"^checkpoint {empty} has class 1 named '', "):
        load_checkpoint(empty)
    numbered = _checkpoint(tmp_path, "number.pt", classes=[0, "b"])
    with pytest.raises(CheckpointError, match=r"has class 0 named 0, which no torchkit writes"):
        load_checkpoint(numbered)
    letters = _checkpoint(tmp_path, "text.pt", classes="ab")
    with pytest.raises(CheckpointError, match=r"has classes 'ab', which no torchkit writes"):
        load_checkpoint(letters)


def test_checkpoint_classes_torchkit_writes_still_load(tmp_path):
    # A name twice is ImageNet's "crane"; spaces inside a name or beside another are a name.
    for classes in ([" a", "b"], ["a", "a"], ("a", "b")):
        model = _checkpoint(tmp_path, "ok.pt", classes=classes)
        assert resolve_model(str(model)).classes == list(classes)
    unnamed = _checkpoint(tmp_path, "unnamed.pt", classes=None)
    assert resolve_model(str(unnamed)).classes is None


def test_an_exported_class_no_torchkit_names_is_one_error_line_before_any_output(runner, tmp_path):
    """The same of an ONNX or TorchScript file's record: ["a", None] named an output "None",
    ["a", ""] one of no name."""
    images = _images(tmp_path / "imgs")
    onnx_file = _onnx_file(
        tmp_path / "none.onnx", _record(METADATA_VERSION, classes=["a", None, "b"])
    )
    out = tmp_path / "predictions.csv"
    result = runner.invoke(app, ["predict", str(onnx_file), str(images), "-j", "0", "-o", str(out)])
    assert result.exit_code == 1
    assert result.stdout == "" and not out.exists()
    assert result.stderr.strip().splitlines() == [
        f"Error: {onnx_file} has class 1 named None, which no torchkit writes " + EVERY_CLASS_NAMED
    ]
    script = _torchscript_file(
        tmp_path / "empty.ts", _record(METADATA_VERSION, classes=["a", "", "b"])
    )
    for read in (load_exported, lambda path: load_checkpoint(path, trust_checkpoint=True)):
        with pytest.raises(InputError, match=rf"^{script} has class 1 named '', which no "):
            read(script)
    spaced = _onnx_file(tmp_path / "spaced.onnx", {"classes": ["a", " c", "b"]})
    assert load_exported(spaced).classes == ["a", " c", "b"]  # no metadata_version: still read
    unversioned = _onnx_file(tmp_path / "unversioned.onnx", {"classes": ["a", "b", 7]})
    with pytest.raises(InputError, match="has class 2 named 7, which no torchkit writes"):
        load_exported(unversioned)
    listless = _onnx_file(tmp_path / "listless.onnx", _record(METADATA_VERSION, classes="abc"))
    with pytest.raises(InputError, match="has classes 'abc', which no torchkit writes"):
        load_exported(listless)
    unnamed = _onnx_file(tmp_path / "unnamed.onnx", _record(METADATA_VERSION, classes=None))
    assert load_exported(unnamed).classes is None
