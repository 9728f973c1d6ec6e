"""A model or data file whose name is not UTF-8 (b"m\\xff.onnx": Linux allows any bytes) is
written and read as any other: onnxruntime, torch.jit.load, torch.export.load, safetensors,
TensorBoard and pyarrow take a name as UTF-8 text only, so torchkit hands them the file (or
folder) by its descriptor."""

from __future__ import annotations

import csv
import io
import json
import os
import sys

import pytest
from checkpoints import write_convnet_checkpoint
from image_folders import write_image_folder
from output_checks import error_line

from torchkit.cli import app

if not os.path.isdir("/proc/self/fd") or sys.getfilesystemencoding() != "utf-8":
    pytest.skip("a name of any bytes: Linux, UTF-8 file names", allow_module_level=True)

RUN = ["--device", "cpu", "-j", "0", "--format", "csv", "-q"]
# JSON: the report names the file in text (CliRunner's stdout takes no bytes that are not UTF-8)
REPORT = ["--format", "json", "-q"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A convnet checkpoint for 8x8 RGB images, and the CSV rows predict gives an image with it."""
    folder = tmp_path_factory.mktemp("model")
    write_convnet_checkpoint(folder / "m.pt", in_channels=3, image_size=8, classes="ab")
    image = write_image_folder(folder / "images", {"a": 1}) / "a" / "a_0.png"
    return folder / "m.pt", image


def same_rows(predicted: str, expected: str) -> bool:
    """predict's CSV rows alike: the same class, and the probability to within 1e-6, for
    onnxruntime's float sums may end in other last digits than PyTorch's (0.50399071 for
    0.503990769)."""
    rows = [list(csv.reader(io.StringIO(text))) for text in (predicted, expected)]
    if [len(r) for r in rows[0]] != [len(r) for r in rows[1]] or rows[0][0] != rows[1][0]:
        return False
    return all(
        got[:4] == want[:4] and got[5:] == want[5:] and abs(float(got[4]) - float(want[4])) < 1e-6
        for got, want in zip(rows[0][1:], rows[1][1:], strict=True)
    )


# torch.export (.pt2) goes through the same helper; its export takes seconds, not tested here
@pytest.mark.parametrize(("extension", "trust"), [("onnx", []), ("ts", ["--trust-checkpoint"])])
def test_an_exported_model_under_a_name_that_is_not_utf8_is_written_and_read(
    runner, tmp_path, model, extension, trust
):
    """Before: export failed its own verification (`onnxruntime cannot load .m\\udcff....:
    TypeError: __init__(): incompatible constructor arguments`), and a file renamed so could
    not be read by predict or eval."""
    if extension == "onnx":
        pytest.importorskip("onnxruntime")
    checkpoint, image = model
    out = tmp_path / f"m\udcff.{extension}"
    exported = runner.invoke(app, ["export", str(checkpoint), str(out), *REPORT])
    assert exported.exit_code == 0, exported.stderr
    assert os.fsencode(out) in [os.fsencode(p) for p in tmp_path.iterdir()]
    expected = runner.invoke(app, ["predict", str(checkpoint), str(image), *RUN])
    predicted = runner.invoke(app, ["predict", str(out), str(image), *RUN, *trust])
    assert predicted.exit_code == 0, predicted.stderr
    assert same_rows(predicted.stdout, expected.stdout)


def test_safetensors_weights_under_a_name_that_is_not_utf8_are_read(runner, tmp_path, model):
    """Before: `Error: cannot read safetensors file w\\udcff.safetensors: Path w\ufffd.safetensors
    is not valid UTF-8`, for a file convert checkpoint had just written."""
    checkpoint, image = model
    weights = tmp_path / "w\udcff.safetensors"
    converted = runner.invoke(
        app, ["convert", "checkpoint", str(checkpoint), str(weights), *REPORT]
    )
    assert converted.exit_code == 0, converted.stderr
    expected = runner.invoke(app, ["predict", str(checkpoint), str(image), *RUN])
    model_args = ["convnet", "--weights", str(weights), "--image-size", "8"]
    predicted = runner.invoke(app, ["predict", *model_args, str(image), *RUN])
    assert predicted.exit_code == 0, predicted.stderr
    # the same class index and probability (the weights alone carry no class names)
    assert [row.split(",")[3:5] for row in predicted.stdout.splitlines()[1:]] == [
        row.split(",")[3:5] for row in expected.stdout.splitlines()[1:]
    ]
    array = tmp_path / "t\udcff.safetensors"
    assert runner.invoke(app, ["convert", "tensor", str(image), str(array), *REPORT]).exit_code == 0
    back = runner.invoke(app, ["convert", "tensor", str(array), str(tmp_path / "t.npy"), *REPORT])
    assert back.exit_code == 0, back.stderr
    # a damaged one is still said to be damaged
    (tmp_path / "bad\udcff.safetensors").write_bytes(b"junk")
    refused = runner.invoke(
        app,
        [
            "predict",
            "convnet",
            "--weights",
            str(tmp_path / "bad\udcff.safetensors"),
            str(image),
            *RUN,
        ],
    )
    assert refused.exit_code == 1
    assert "header too small" in error_line(refused.stderr)


def test_tensorboard_logs_into_a_run_folder_whose_name_is_not_utf8(tmp_path):
    """TensorBoard encodes the names it writes by as UTF-8. Before, `train --tensorboard --out
    run$'\\xff'` ended at its start: `Error: UnicodeEncodeError: 'utf-8' codec can't encode
    character '\\udcff' ...`. (Its writer alone: a train run takes seconds.)"""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from torchkit.core.train.outputs import TensorBoardLog

    folder = tmp_path / "run\udcff" / "tensorboard"
    folder.parent.mkdir()
    log = TensorBoardLog(folder)
    log.epoch({"epoch": 1, "train_loss": 0.5})
    log.close()
    (events,) = folder.iterdir()
    (tmp_path / "events").mkdir()  # read back where TensorBoard's reader can name it
    events.rename(tmp_path / "events" / events.name)
    accumulator = EventAccumulator(str(tmp_path / "events"))
    accumulator.Reload()
    assert [(e.step, e.value) for e in accumulator.Scalars("train/train_loss")] == [(1, 0.5)]


def test_a_parquet_dataset_whose_name_is_not_utf8_is_read(runner, tmp_path):
    """pyarrow takes a name as UTF-8 text. Before: `Error: UnicodeEncodeError: 'utf-8' codec
    can't encode character '\\udcff' ...` from every command given such a file as its data."""
    pytest.importorskip("pyarrow")
    from parquet_files import png, write_parquet

    written = write_parquet(tmp_path / "d.parquet", [png(seed) for seed in range(4)], [0, 1, 2, 0])
    data = written.rename(tmp_path / "d\udcff.parquet")
    result = runner.invoke(app, ["dataset-stats", str(data), "-j", "0", *REPORT])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["images"] == 4


def test_a_profile_is_written_into_a_run_folder_whose_name_is_not_utf8(tmp_path):
    """Kineto takes a name as UTF-8 text. Before, `train --profile-steps N --out run$'\\xff'`
    ended after its first epoch: `Error: TypeError: save(): incompatible function arguments`.
    (The profiler alone: a train run takes seconds.)"""
    import torch

    from torchkit.core.train.step_profiler import StepProfiler

    folder = tmp_path / "run\udcff" / "profile"
    folder.parent.mkdir()
    profiler = StepProfiler(folder, 1, 1, torch.device("cpu")).start()
    torch.ones(4).add(1)
    profiler.stepped()  # its one step: stopped
    profiler.write()
    trace = json.loads((folder / "epoch-1.json").read_text())
    assert any(event.get("name") == "aten::add" for event in trace["traceEvents"])


def test_an_onnx_model_with_external_data_in_a_folder_whose_name_is_not_utf8_is_read(
    runner, tmp_path, model
):
    """Where only a folder above is not UTF-8, the folder goes by its descriptor, the file by
    its name in it: onnxruntime finds the weights beside the model (`x.onnx.data`). Before,
    the file went by its descriptor and onnxruntime looked for them in `/proc/self/fd/`."""
    pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    checkpoint, image = model
    exported = runner.invoke(app, ["export", str(checkpoint), str(tmp_path / "m.onnx"), *REPORT])
    assert exported.exit_code == 0, exported.stderr
    written = tmp_path / "models"  # onnx writes external data under UTF-8 names only
    written.mkdir()
    onnx.save_model(
        onnx.load(str(tmp_path / "m.onnx")),
        str(written / "x.onnx"),
        save_as_external_data=True,
        location="x.onnx.data",
        size_threshold=0,
    )
    folder = written.rename(tmp_path / "models\udcff")
    expected = runner.invoke(app, ["predict", str(checkpoint), str(image), *RUN])
    predicted = runner.invoke(app, ["predict", str(folder / "x.onnx"), str(image), *RUN])
    assert predicted.exit_code == 0, predicted.stderr
    assert same_rows(predicted.stdout, expected.stdout)


def test_a_folder_this_user_may_enter_but_not_list_still_gives_its_file(tmp_path, monkeypatch):
    """The folder is opened only to name a path through it (O_PATH): one that this user may
    enter but not list (`chmod 711`, which root, running the suite, is not refused: its open
    for reading is made to fail) still gives the file in it, as it did by the file's own
    descriptor."""
    from torchkit.core.io.non_utf8_names import name_native_code_opens

    folder = tmp_path / "d\udcff"
    folder.mkdir()
    (folder / "w.safetensors").write_bytes(b"weights")
    real_open = os.open

    def opening(path, flags, *args, **kwargs):
        if os.fspath(path) == str(folder) and not flags & getattr(os, "O_PATH", 0):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", opening)
    with name_native_code_opens(folder / "w.safetensors") as name:
        assert name.startswith("/proc/self/fd/") and name.endswith("/w.safetensors")
        with open(name, "rb") as given:
            assert given.read() == b"weights"
