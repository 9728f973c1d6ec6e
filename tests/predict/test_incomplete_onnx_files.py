"""An .onnx file with no model in it (0 bytes, a protobuf with no graph, a graph with no inputs
or outputs): onnx reads each of them without complaint, and onnxruntime refused it only at the
first batch, after predict had warned about its preprocessing and printed its CSV header. It is
refused when the file is loaded, in one error line naming it, before any output."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from PIL import Image

from torchkit.cli import app


def _write_empty(path: Path) -> None:
    path.write_bytes(b"")


def _write_graphless(path: Path) -> None:
    model = onnx.ModelProto(ir_version=8, producer_name="test")
    model.opset_import.add(domain="", version=17)
    onnx.save(model, str(path))


def _write_empty_graph(path: Path) -> None:
    model = onnx.ModelProto(ir_version=8)
    model.opset_import.add(domain="", version=17)
    model.graph.name = "nothing"
    onnx.save(model, str(path))


FILES = {
    "empty": (_write_empty, "is empty (0 bytes), not an ONNX model"),
    "graphless": (_write_graphless, "is not a complete ONNX model: it holds no graph"),
    "empty-graph": (
        _write_empty_graph,
        "is not a complete ONNX model: it holds a graph with no inputs and no outputs",
    ),
}


def _labelled_images(root: Path) -> Path:
    for index, name in enumerate(["a", "b"]):
        (root / name).mkdir(parents=True)
        Image.new("RGB", (8, 8), (index * 90, 20, 40)).save(root / name / f"{index}.png")
    return root


@pytest.mark.parametrize("kind", sorted(FILES))
@pytest.mark.parametrize("command", ["predict", "eval"])
def test_an_onnx_file_without_a_model_is_one_error_line_before_any_output(
    runner, tmp_path, kind, command
):
    write, reason = FILES[kind]
    model = tmp_path / f"{kind}.onnx"
    write(model)
    images = _labelled_images(tmp_path / "imgs")
    if command == "predict":
        args = ["predict", str(model), str(images), "--format", "csv", "-j", "0"]
    else:
        args = ["eval", str(model), "--data", str(images), "-j", "0"]
    result = runner.invoke(app, args)
    assert result.exit_code != 0
    assert result.stdout == ""  # no CSV header, no table
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr  # no warning about its preprocessing first
    assert lines[0].startswith(f"Error: {model} {reason}")
    assert lines[0].endswith("(give the .onnx file `torchkit export` or torch.onnx.export wrote)")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("command", ["summary", "benchmark"])
def test_summary_and_benchmark_refuse_an_empty_onnx_file_in_one_line(runner, tmp_path, command):
    model = tmp_path / "empty.onnx"
    model.write_bytes(b"")
    result = runner.invoke(app, [command, str(model), "--device", "cpu"])
    assert result.exit_code != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert str(model) in lines[0]
