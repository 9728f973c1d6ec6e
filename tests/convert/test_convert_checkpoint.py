"""`torchkit convert checkpoint`: DDP/GPU training checkpoints to plain CPU state dicts, checked
by loading the result into the model with `load_state_dict(strict=True)` and comparing tensors."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.serialization
from output_checks import error_line
from safetensors.torch import load_file, save_file
from torch import nn
from typer.testing import CliRunner

from torchkit.cli import app
from torchkit.core.convert.checkpoint import pick_state_dict, rename_keys
from torchkit.core.io.errors import CheckpointError
from torchkit.core.models.checkpoint import FORMAT_VERSION

runner = CliRunner()


def convert(*args: str | Path):
    return runner.invoke(app, ["convert", "checkpoint", *map(str, args)])


def ok(*args: str | Path):
    result = convert(*args)
    assert result.exit_code == 0, result.stderr
    return result


def small_model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4, 2))
    model[1].running_mean.uniform_()  # buffers that differ from a fresh model
    model[1].num_batches_tracked += 7
    return model


class TiedLM(nn.Module):
    """Input embedding and output projection share one weight (GPT-2 style)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(6, 4)
        self.head = nn.Linear(4, 6, bias=False)
        self.head.weight = self.embed.weight


def save_as_if_on_gpu(obj, path: Path) -> None:
    """torch.save with every storage tagged cuda:0, as a checkpoint written on a GPU is."""
    with mock.patch.object(torch.serialization, "location_tag", lambda storage: "cuda:0"):
        torch.save(obj, path)


def ddp_checkpoint(model: nn.Module) -> dict:
    """What a DDP training script saves; the optimizer state is written out by hand because the
    first `optimizer.step()` in a process imports half of torch (seconds)."""
    params = list(model.parameters())
    optimizer = {
        "state": {i: {"momentum_buffer": torch.randn_like(p)} for i, p in enumerate(params)},
        "param_groups": [{"lr": 0.1, "momentum": 0.9, "params": list(range(len(params)))}],
    }
    return {
        "model": {f"module.{k}": v for k, v in model.state_dict().items()},
        "optimizer": optimizer,
        "epoch": 3,
        "best_acc1": 0.5,
    }


def assert_same_weights(state: dict, model: nn.Module, *, ordered: bool = False) -> None:
    """Same keys and tensors as `model` (in the same order for .pt; safetensors sorts them)."""
    expected = model.state_dict()
    assert (list(state) if ordered else sorted(state)) == (
        list(expected) if ordered else sorted(expected)
    )
    for key, tensor in expected.items():
        assert state[key].device.type == "cpu"
        assert state[key].dtype == tensor.dtype
        assert torch.equal(state[key], tensor), key
    fresh = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4, 2))
    fresh.load_state_dict(state, strict=True)


def test_gpu_ddp_checkpoint_to_safetensors(tmp_path):
    model = small_model()
    save_as_if_on_gpu(ddp_checkpoint(model), tmp_path / "ddp.pth")
    if not torch.cuda.is_available():  # the file really needs map_location
        # torch 2.4 says so as an UnpicklingError
        with pytest.raises((RuntimeError, pickle.UnpicklingError), match="CUDA"):
            torch.load(tmp_path / "ddp.pth", weights_only=True)
    result = ok(tmp_path / "ddp.pth", tmp_path / "model.safetensors", "--format", "json")
    report = json.loads(result.stdout)
    state = load_file(tmp_path / "model.safetensors")
    assert_same_weights(state, model)
    expected = model.state_dict()
    assert report["key"] == "model"
    assert report["tensors"] == len(expected)
    assert report["values"] == sum(t.numel() for t in expected.values())
    nbytes = sum(t.numel() * t.element_size() for t in expected.values())
    assert report["bytes_before"] == report["bytes_after"] == nbytes
    assert report["keys_renamed"] == len(expected)
    assert report["prefix_stripped"] == "module."
    assert report["file_bytes_after"] == (tmp_path / "model.safetensors").stat().st_size
    assert report["file_bytes_before"] == (tmp_path / "ddp.pth").stat().st_size


def test_plain_pt_state_dict_and_table(tmp_path):
    model = small_model()
    save_as_if_on_gpu(ddp_checkpoint(model), tmp_path / "ddp.pth")
    result = ok(tmp_path / "ddp.pth", tmp_path / "model.pt")
    state = torch.load(tmp_path / "model.pt", weights_only=True)
    assert type(state) is dict
    assert_same_weights(state, model, ordered=True)
    for label in ("tensors", "values", "tensor bytes before", "keys renamed", "module."):
        assert label in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ddp.pth", "model.pt"]


def test_safetensors_outputs_get_the_permissions_of_every_other_output(tmp_path):
    """Before: safetensors' writer made the file anew, 0600 whatever the umask (.pt: 0644)."""
    import os
    import stat

    from torchkit.core.io.temporaries import UMASK

    torch.save(small_model().state_dict(), tmp_path / "model.pth")
    for name in ("copy.safetensors", "copy.pt"):
        ok(tmp_path / "model.pth", tmp_path / name)
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o666 & ~UMASK, name


def test_a_fifo_named_safetensors_is_written_into_not_replaced(tmp_path):
    """safetensors' writer renames a temporary file over its path: the FIFO was replaced by a
    regular file, which no reader of the FIFO ever saw."""
    from disks import FifoReader
    from safetensors.torch import load

    state = small_model().state_dict()
    torch.save(state, tmp_path / "model.pth")
    reader = FifoReader(tmp_path / "model.safetensors")
    done = ok(tmp_path / "model.pth", reader.path, "--format", "json")
    written = reader.result()
    assert torch.equal(load(written)["3.weight"], state["3.weight"])
    # the size written, not the FIFO's (0), as for /dev/null or /dev/stdout
    assert json.loads(done.stdout)["file_bytes_after"] == len(written)


def test_a_name_without_an_extension_takes_the_format_of_to(tmp_path):
    """`convert checkpoint last.pt /dev/stdout` (or /dev/null): "cannot tell the output format
    from 'stdout' (end DST with .safetensors or .pt)", a name no pipe can have. --to says the
    format; a --to the extension contradicts is refused."""
    import os

    from safetensors.torch import load

    state = small_model().state_dict()
    torch.save(state, tmp_path / "model.pth")
    refused = convert(tmp_path / "model.pth", "/dev/null")
    assert refused.exit_code == 2 and "pass --to for a name without one" in refused.stderr
    read_end, write_end = os.pipe()
    try:
        ok(tmp_path / "model.pth", f"/dev/fd/{write_end}", "--to", "safetensors")
        ok(tmp_path / "model.pth", "/dev/null", "--to", "pt")
        torch.save(small_model().state_dict(), tmp_path / "other.pth")
        ok("--average", tmp_path / "model.pth", tmp_path / "other.pth", "/dev/null", "--to", "pt")
    finally:
        os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        written = reader.read()
    assert torch.equal(load(written)["3.weight"], state["3.weight"])
    contradicted = convert(tmp_path / "model.pth", tmp_path / "x.safetensors", "--to", "pt")
    assert contradicted.exit_code == 2
    assert "--to pt contradicts the extension of" in contradicted.stderr
    assert not (tmp_path / "x.safetensors").exists()


def test_values_are_not_called_parameters(tmp_path):
    """The issue: `parameters 271098` for a model with 269,722 parameters. A state dict holds
    parameters and buffers (BatchNorm's running statistics and counter) without saying which
    is which: the report counts values, and says so."""
    model = small_model()
    parameters = sum(p.numel() for p in model.parameters())
    buffers = sum(b.numel() for b in model.buffers())
    assert buffers > 0
    torch.save(model.state_dict(), tmp_path / "sd.pt")
    report = json.loads(
        ok(tmp_path / "sd.pt", tmp_path / "a.safetensors", "--format", "json").stdout
    )
    assert report["values"] == parameters + buffers
    assert report["tensors"] == len(model.state_dict())
    assert "parameters" not in report
    table = ok(tmp_path / "sd.pt", tmp_path / "b.safetensors").stdout
    cells = {
        line.split("│")[1].strip(): line.split("│")[2].strip()
        for line in table.splitlines()
        if line.count("│") == 3
    }
    assert cells["values (parameters and buffers)"] == str(parameters + buffers)
    assert "parameters" not in cells


def test_json_types(tmp_path):
    model = small_model()
    save_as_if_on_gpu(ddp_checkpoint(model), tmp_path / "ddp.pth")
    report = json.loads(
        ok(tmp_path / "ddp.pth", tmp_path / "m.pt", "--format", "json", "--dtype", "float16").stdout
    )
    kinds = {
        "source": str, "destination": str, "key": str, "tensors": int, "values": int,
        "bytes_before": int, "bytes_after": int, "file_bytes_before": int,
        "file_bytes_after": int, "keys_renamed": int, "prefix_stripped": str,
        "dtype": str, "tensors_cast": int, "shared_tensors_copied": int, "skipped_entries": list,
    }  # fmt: skip
    for key, kind in kinds.items():
        assert type(report[key]) is kind, key
    assert report["prefix_added"] is None  # nothing added: null, not "" or "none"
    plain = json.loads(ok(tmp_path / "m.pt", tmp_path / "n.pt", "--format", "json").stdout)
    assert plain["key"] is None and plain["dtype"] is None and plain["prefix_stripped"] is None


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_dtype_casts_floating_point_tensors_only(tmp_path, dtype):
    model = small_model()
    torch.save(model.state_dict(), tmp_path / "sd.pt")
    result = ok(
        tmp_path / "sd.pt", tmp_path / "half.safetensors", "--dtype", dtype, "--format", "json"
    )
    report = json.loads(result.stdout)
    state = load_file(tmp_path / "half.safetensors")
    target = getattr(torch, dtype)
    for key, tensor in model.state_dict().items():
        if tensor.is_floating_point():
            assert state[key].dtype == target
            assert torch.equal(state[key], tensor.to(target))
        else:
            assert state[key].dtype == torch.int64 and torch.equal(state[key], tensor)
    floats = [t for t in model.state_dict().values() if t.is_floating_point()]
    assert report["tensors_cast"] == len(floats)
    assert report["bytes_after"] == report["bytes_before"] - 2 * sum(t.numel() for t in floats)
    assert report["keys_renamed"] == 0 and report["prefix_stripped"] is None


def test_tied_weights_are_written_to_safetensors(tmp_path):
    model = TiedLM()
    state = model.state_dict()
    assert state["embed.weight"].data_ptr() == state["head.weight"].data_ptr()
    with pytest.raises(RuntimeError, match="share memory"):  # why the command has to handle it
        save_file(state, str(tmp_path / "direct.safetensors"))
    torch.save(state, tmp_path / "tied.pt")
    result = ok(tmp_path / "tied.pt", tmp_path / "tied.safetensors", "--format", "json")
    assert json.loads(result.stdout)["shared_tensors_copied"] == 1
    loaded = load_file(tmp_path / "tied.safetensors")
    assert sorted(loaded) == ["embed.weight", "head.weight"]
    assert torch.equal(loaded["head.weight"], model.embed.weight)
    TiedLM().load_state_dict(loaded, strict=True)


def test_several_state_dicts_need_key(tmp_path):
    model, ema = small_model(), small_model()
    with torch.no_grad():
        ema[3].weight.add_(1)
    torch.save(
        {"model": model.state_dict(), "model_ema": ema.state_dict(), "epoch": 1},
        tmp_path / "ckpt.pt",
    )
    result = convert(tmp_path / "ckpt.pt", tmp_path / "out.pt")
    assert result.exit_code == 1
    assert "several state dicts: model, model_ema" in result.stderr and "--key" in result.stderr
    ok(tmp_path / "ckpt.pt", tmp_path / "ema.pt", "--key", "model_ema")
    assert_same_weights(torch.load(tmp_path / "ema.pt", weights_only=True), ema)
    result = convert(tmp_path / "ckpt.pt", tmp_path / "x.pt", "--key", "nope")
    assert result.exit_code == 2 and "no key 'nope'" in result.stderr


def test_torchkit_checkpoint_picks_model(tmp_path):
    model = small_model()
    checkpoint = {
        "format_version": FORMAT_VERSION,
        "arch": "custom",
        "num_classes": 2,
        "classes": ["a", "b"],
        "model": model.state_dict(),
        "model_ema": {k: v + 1 for k, v in model.state_dict().items()},
        "epoch": 2,
    }
    torch.save(checkpoint, tmp_path / "tk.pt")
    ok(tmp_path / "tk.pt", tmp_path / "w.safetensors")
    assert_same_weights(load_file(tmp_path / "w.safetensors"), model)


def test_state_dict_is_found_by_usual_names():
    weights = {"w": torch.zeros(1)}
    assert pick_state_dict({"state_dict": weights, "rng": {"torch": torch.zeros(2)}}) == (
        weights,
        "state_dict",
    )
    assert pick_state_dict({"anything": weights, "epoch": 3}) == (weights, "anything")
    assert pick_state_dict({"outer": {"net": weights}}, "outer.net") == (weights, "outer.net")
    with pytest.raises(CheckpointError, match="cannot find a state dict"):
        pick_state_dict({"epoch": 3, "config": {"lr": 0.1}})


def test_prefix_options(tmp_path):
    model = small_model()
    prefixed = {f"module.{k}": v for k, v in model.state_dict().items()}
    torch.save(prefixed, tmp_path / "ddp.pt")
    ok(tmp_path / "ddp.pt", tmp_path / "kept.pt", "--strip-prefix", "")
    assert list(torch.load(tmp_path / "kept.pt", weights_only=True)) == list(prefixed)
    ok(tmp_path / "ddp.pt", tmp_path / "bb.pt", "--add-prefix", "backbone.")
    assert list(torch.load(tmp_path / "bb.pt", weights_only=True)) == [
        f"backbone.{k}" for k in model.state_dict()
    ]
    ok(tmp_path / "ddp.pt", tmp_path / "explicit.pt", "--strip-prefix", "module.0.")
    assert list(torch.load(tmp_path / "explicit.pt", weights_only=True))[0] == "weight"


def test_auto_strip_needs_every_key_prefixed():
    assert rename_keys(["module.a", "module._orig_mod.b"], None, "")[0] == {
        "module.a": "a",
        "module._orig_mod.b": "_orig_mod.b",
    }
    renamed, stripped = rename_keys(["_orig_mod.module.a", "_orig_mod.module.b"], None, "")
    assert renamed == {"_orig_mod.module.a": "a", "_orig_mod.module.b": "b"}
    assert stripped == "_orig_mod.module."
    renamed, stripped = rename_keys(["module.a", "b"], None, "")
    assert renamed == {"module.a": "module.a", "b": "b"} and stripped is None
    with pytest.raises(CheckpointError, match="two keys the same"):
        rename_keys(["module.a", "a"], "module.", "")


def test_partly_prefixed_keys_are_left_with_a_warning(tmp_path):
    torch.save({"module.a": torch.zeros(1), "b": torch.ones(1)}, tmp_path / "mixed.pt")
    result = ok(tmp_path / "mixed.pt", tmp_path / "out.pt")
    assert "Warning: 1 of 2 keys start with 'module.'" in result.stderr
    assert list(torch.load(tmp_path / "out.pt", weights_only=True)) == ["module.a", "b"]


def test_non_tensor_entries_are_left_out_with_a_warning(tmp_path):
    torch.save({"net": {"w": torch.ones(2), "note": "hello", "step": 5}}, tmp_path / "c.pt")
    result = ok(tmp_path / "c.pt", tmp_path / "o.safetensors", "--key", "net", "--format", "json")
    assert "2 entries are not tensors" in result.stderr
    assert json.loads(result.stdout)["skipped_entries"] == ["note", "step"]
    assert list(load_file(tmp_path / "o.safetensors")) == ["w"]


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"1": torch.ones(1), 1: torch.zeros(1)}, "the state dict has two keys that read '1'"),
        ({"w": torch.empty(3, device="meta")}, "'w' is a meta tensor: it holds no values"),
        ({"w": torch.eye(2).to_sparse()}, "'w' is a sparse_coo tensor: convert checkpoint"),
        (
            {"w": torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8)},
            "'w' is a qint8 tensor: convert checkpoint",
        ),
    ],
    ids=["keys-1-and-'1'", "meta", "sparse", "quantized"],
)
def test_what_cannot_be_written_as_it_was_is_one_error_and_no_file(tmp_path, state, message):
    """Before: the two keys wrote one tensor (exit 0); a meta tensor wrote a .pt without its
    values (exit 0); sparse and quantized tensors ended in an internal error."""
    torch.save(state, tmp_path / "c.pt")
    for out in ("o.pt", "o.safetensors"):
        result = convert(tmp_path / "c.pt", tmp_path / out)
        assert result.exit_code == 1, result.stdout
        assert result.stderr.startswith(f"Error: {message}"), result.stderr
        assert not (tmp_path / out).exists()


def test_a_key_safetensors_keeps_for_its_header_is_refused_there(tmp_path):
    # Written, it made a .safetensors file no reader parses (exit 0).
    torch.save({"__metadata__": torch.zeros(2), "w": torch.ones(2)}, tmp_path / "c.pt")
    result = convert(tmp_path / "c.pt", tmp_path / "o.safetensors")
    assert result.exit_code == 1, result.stdout
    assert result.stderr.startswith("Error: the state dict has a key '__metadata__'")
    assert not (tmp_path / "o.safetensors").exists()
    ok(tmp_path / "c.pt", tmp_path / "o.safetensors", "--add-prefix", "m.")
    assert sorted(load_file(tmp_path / "o.safetensors")) == ["m.__metadata__", "m.w"]


def test_pickled_model_needs_trust(tmp_path):
    model = small_model()
    torch.save(model, tmp_path / "whole.pt")
    result = convert(tmp_path / "whole.pt", tmp_path / "w.safetensors")
    assert result.exit_code == 1
    assert "--trust-checkpoint" in result.stderr
    assert not (tmp_path / "w.safetensors").exists()
    ok(tmp_path / "whole.pt", tmp_path / "w.safetensors", "--trust-checkpoint")
    assert_same_weights(load_file(tmp_path / "w.safetensors"), model)


def test_safetensors_source_to_pt(tmp_path):
    model = small_model()
    save_file(model.state_dict(), str(tmp_path / "m.safetensors"))
    ok(tmp_path / "m.safetensors", tmp_path / "m.pth")
    assert_same_weights(torch.load(tmp_path / "m.pth", weights_only=True), model)


def test_upper_case_safetensors_output_reads_back(tmp_path):
    """An output named M.SAFETENSORS is written as safetensors: it must load back as one."""
    model = small_model()
    torch.save(model.state_dict(), tmp_path / "sd.pt")
    ok(tmp_path / "sd.pt", tmp_path / "m.SAFETENSORS")
    ok(tmp_path / "m.SAFETENSORS", tmp_path / "back.pt")
    assert_same_weights(torch.load(tmp_path / "back.pt", weights_only=True), model)


def test_bad_input_and_existing_output(tmp_path):
    model = small_model()
    torch.save(model.state_dict(), tmp_path / "sd.pt")
    data = (tmp_path / "sd.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    (tmp_path / "empty.pt").write_bytes(b"")
    (tmp_path / "exists.pt").write_bytes(b"old")
    cases = [
        (("missing.pt", "o.pt"), 1, "Error: checkpoint not found"),
        (("cut.pt", "o.pt"), 1, "Error: cannot read checkpoint"),
        (("empty.pt", "o.pt"), 1, "is empty (0 bytes)"),
        (
            ("sd.pt", "o.onnx"),
            2,
            "cannot tell the output format from 'o.onnx' (end DST with .safetensors or .pt; .pth, "
            ".bin and .ckpt count as .pt; or pass --to for a name without one)",
        ),
        (("sd.pt", "exists.pt"), 1, "already exists"),
        (("sd.pt", "sd.pt", "--force"), 1, "is the source checkpoint"),
    ]
    for (src, dst, *extra), code, message in cases:
        result = convert(tmp_path / src, tmp_path / dst, *extra)
        assert result.exit_code == code, (src, dst, result.stderr)
        assert message in result.stderr, result.stderr
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert (tmp_path / "exists.pt").read_bytes() == b"old"
    assert (tmp_path / "sd.pt").read_bytes() == data
    assert not (tmp_path / "o.pt").exists()
    ok(tmp_path / "sd.pt", tmp_path / "exists.pt", "--force")
    assert_same_weights(torch.load(tmp_path / "exists.pt", weights_only=True), model)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_real_cuda_checkpoint(tmp_path):
    model = small_model().cuda()
    torch.save(
        {"state_dict": {f"module.{k}": v for k, v in model.state_dict().items()}},
        tmp_path / "gpu.pt",
    )
    ok(tmp_path / "gpu.pt", tmp_path / "cpu.safetensors")
    assert_same_weights(load_file(tmp_path / "cpu.safetensors"), model.cpu())


def test_float16_cast_beyond_its_range_is_reported(tmp_path):
    """float32 values past float16's +-65,504 become inf in the cast: counted, named, warned."""
    state = small_model().state_dict()
    state["scale"] = torch.tensor([1e6, -1e6, 1.0, float("inf")])  # the inf was there already
    torch.save(state, tmp_path / "sd.pt")
    result = ok(tmp_path / "sd.pt", tmp_path / "half.pt", "--dtype", "float16", "--format", "json")
    report = json.loads(result.stdout)
    assert report["values_overflowed"] == 2
    assert "made 2 finite values infinite" in result.stderr and "in scale" in result.stderr
    assert torch.load(tmp_path / "half.pt")["scale"].isinf().sum() == 3
    result = ok(tmp_path / "sd.pt", tmp_path / "b.pt", "--dtype", "bfloat16", "--format", "json")
    assert json.loads(result.stdout)["values_overflowed"] == 0 and "infinite" not in result.stderr


def _exported_program_archive(path: Path) -> Path:
    """A zip laid out as torch.export.save's archives are (the entries `sniff_format` and
    torch.export.load look for), without the cost of exporting a model."""
    import zipfile

    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("model/archive_format", "pt2")
        archive.writestr("model/version", "0")
        archive.writestr("model/models/model.json", "{}")
    return path


@pytest.mark.parametrize("trust", [[], ["--trust-checkpoint"]])
@pytest.mark.parametrize("average", [False, True])
def test_a_torch_export_archive_is_refused_as_no_checkpoint(tmp_path, trust, average):
    """Before: untrusted, 'pass --trust-checkpoint to load it', and trusted, torch's
    'PytorchStreamReader failed locating file data.pkl': the hint led nowhere."""
    archive = _exported_program_archive(tmp_path / "model.pt2")
    sources = [archive]
    if average:
        torch.save(small_model().state_dict(), tmp_path / "plain.pt")
        sources = [tmp_path / "plain.pt", archive]
    args = [*(["--average"] if average else []), *sources, tmp_path / "out.safetensors", *trust]
    result = convert(*args)
    assert result.exit_code == 1
    line = error_line(result.stderr)
    assert line == (
        f"Error: {archive} is a torch.export archive, not a checkpoint "
        "(give the checkpoint it was exported from)"
    )
    assert not (tmp_path / "out.safetensors").exists()
