"""`torchkit export` against torch's own exporters called by hand, as a user would with the
options torchkit documents as its defaults (eval mode, opset 17, a dynamic batch, the input
names `input` and `logits`, the model's input size): the loaded files give the same outputs on
the same random batches, the ONNX graph is torch's own, and what a hand export gets wrong that
torchkit guards against (a model left in train mode; a model whose trace differs from it
eagerly; a batch fixed without meaning to) is shown on both sides."""

from __future__ import annotations

import importlib.util
import inspect
import io
import json

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from net_sources import ATTENTION
from output_checks import error_line
from torch import nn
from typer.testing import CliRunner

from torchkit.cli import app

pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:FutureWarning"),
    pytest.mark.filterwarnings("ignore:You are using the legacy:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:The feature will be removed:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning"),
    pytest.mark.filterwarnings("ignore:.*torch.jit.*is deprecated:FutureWarning"),
    pytest.mark.filterwarnings("ignore:.*TorchScript-based ONNX export:DeprecationWarning"),
]

PKG = "handexportnets"  # a name of its own: the package is imported once per pytest process
SIZE = 16
SAMPLE = (3, SIZE, SIZE)
NETS = (
    '''
import torch
from torch import nn
from typer.testing import CliRunner


class Net(nn.Module):
    """A user's own model: BatchNorm and Dropout, which behave otherwise in train mode."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.norm = nn.BatchNorm2d(8)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc(self.drop(torch.relu(self.norm(self.conv(x))).mean((2, 3))))


'''
    + ATTENTION
    + '''

class BatchCounted(nn.Module):
    """Adds the batch size to every logit through a Python float: eagerly right for every
    batch, while a trace keeps the example's batch size as a constant."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return self.conv(x).mean((2, 3)) + torch.tensor([[float(x.shape[0])]])
'''
)
WEIGHTS = ("Net", "Attention", "BatchCounted")  # the models given --weights
SUFFIX = {"onnx": ".onnx", "torchscript": ".ts", "exported-program": ".pt2"}


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    """The package of models and its classes, their weights (Net's BatchNorm statistics are not
    the defaults), torchkit's export of Net in each format (made once, at the
    default options) with its JSON result, and the calls torchkit made to torch's exporters."""
    root = tmp_path_factory.mktemp("against_torch")
    (root / PKG).mkdir()
    (root / PKG / "__init__.py").write_text("")
    (root / PKG / "nets.py").write_text(NETS)
    nets: dict = {}
    exec(NETS, nets)
    torch.manual_seed(0)
    net = nets["Net"]()
    with torch.no_grad():
        net.norm.running_mean.uniform_(-0.5, 0.5)
        net.norm.running_var.uniform_(0.5, 2)
    torch.save(net.state_dict(), root / "Net.pt")
    for name in WEIGHTS[1:]:
        torch.save(nets[name]().state_dict(), root / f"{name}.pt")
    exports, results, calls = {}, {}, {}
    runner = CliRunner()
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)  # package.module:Callable imports from the working directory
        for owner, name in ((torch.jit, "trace"), (torch.export, "export"), (torch.onnx, "export")):
            patch.setattr(owner, name, spy(getattr(owner, name), calls, owner.__name__))
        for fmt, suffix in SUFFIX.items():
            out = root / f"torchkit{suffix}"
            result = runner.invoke(app, [*spec("Net", root), str(out), "--format", "json"])
            assert result.exit_code == 0, result.stderr
            exports[fmt], results[fmt] = out, json.loads(result.stdout)
    return {"root": root, "nets": nets, "exports": exports, "results": results, "calls": calls}


def spy(call, calls: dict, owner: str):
    """`call`, recording the example's shape and the keyword arguments torchkit gives it."""

    def recorded(model, example, *args, **kwargs):
        first = example[0] if isinstance(example, tuple) else example
        calls[f"{owner}.{call.__name__}"] = (tuple(first.shape), kwargs)
        return call(model, example, *args, **kwargs)

    return recorded


def spec(name: str, root) -> list[str]:
    weights = ["--weights", str(root / f"{name}.pt")] if name in WEIGHTS else []
    return ["export", f"{PKG}.nets:{name}", *weights, "--image-size", str(SIZE)]


def by_hand(world: dict, name: str = "Net", *, train: bool = False) -> nn.Module:
    """The model as a user's script has it: built, its weights loaded, and put in eval mode
    (or, by mistake, left in the train mode a new module starts in)."""
    model = world["nets"][name]()
    if name in WEIGHTS:
        model.load_state_dict(torch.load(world["root"] / f"{name}.pt", weights_only=True))
    return model.train(train)


def batches(*sizes: int, seed: int = 7) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn((n, *SAMPLE), generator=generator) for n in sizes]


def eager(model: nn.Module, x: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return model.eval()(x).numpy()


def onnx_runner(path):
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda x: session.run(None, {name: x.numpy()})[0]


def onnx_by_hand(model: nn.Module, example: torch.Tensor, **kwargs) -> bytes:
    buffer = io.BytesIO()
    torch.onnx.export(model, (example,), buffer, dynamo=False, **kwargs)
    return buffer.getvalue()


# What torchkit documents as its defaults, as torch.onnx.export's arguments.
ONNX_AS_TORCHKIT = {
    "opset_version": 17,
    "input_names": ["input"],
    "output_names": ["logits"],
    "dynamic_axes": {"input": {0: "batch"}, "logits": {0: "batch"}},
}


# -- the same outputs ----------------------------------------------------------------------------


def test_onnx_is_torchs_own_graph_with_the_record_added(world, tmp_path):
    """torchkit's .onnx is the graph torch.onnx.export writes with torchkit's defaults as
    arguments, node for node; only the metadata_props differ (torchkit's record). The same
    batches give bit-identical outputs in onnxruntime, at batch sizes other than the export's."""
    ours = onnx.load(str(world["exports"]["onnx"]))
    hand = onnx.load_model_from_string(
        onnx_by_hand(by_hand(world), batches(2)[0], **ONNX_AS_TORCHKIT)
    )
    assert {p.key for p in ours.metadata_props} >= {"torchkit.classes", "torchkit.preprocess"}
    assert list(hand.metadata_props) == []  # a hand export carries no record
    del ours.metadata_props[:]
    assert ours.SerializeToString() == hand.SerializeToString()

    path = tmp_path / "hand.onnx"
    path.write_bytes(hand.SerializeToString())
    ours_run, hand_run = onnx_runner(world["exports"]["onnx"]), onnx_runner(path)
    model = by_hand(world)
    for x in batches(1, 3, 5):
        assert np.array_equal(ours_run(x), hand_run(x))
        np.testing.assert_allclose(ours_run(x), eager(model, x), rtol=1e-4, atol=1e-5)


def test_the_onnx_graphs_inputs_outputs_and_opset_are_as_documented(world):
    model = onnx.load(str(world["exports"]["onnx"]))
    [opset] = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    assert opset == 17 == world["results"]["onnx"]["opset"]
    [given], [made] = model.graph.input, model.graph.output
    assert given.name == "input" and made.name == "logits"
    assert (
        given.type.tensor_type.elem_type
        == made.type.tensor_type.elem_type
        == onnx.TensorProto.FLOAT
    )
    dims = [d.dim_param or d.dim_value for d in given.type.tensor_type.shape.dim]
    assert dims == ["batch", *SAMPLE]  # the batch is a name: any size
    assert [d.dim_param or d.dim_value for d in made.type.tensor_type.shape.dim] == ["batch", 3]


def test_torchscript_gives_torch_jit_traces_outputs_bit_for_bit(world, tmp_path):
    model = by_hand(world)
    traced = torch.jit.trace(model, batches(2)[0])
    path = tmp_path / "hand.ts"
    torch.jit.save(traced, str(path))
    hand = torch.jit.load(str(path))
    ours = torch.jit.load(str(world["exports"]["torchscript"]))
    with torch.no_grad():
        for x in batches(1, 3, 5):
            assert torch.equal(ours(x), hand(x))
            np.testing.assert_allclose(ours(x).numpy(), eager(model, x), rtol=1e-4, atol=1e-5)


def test_pt2_gives_torch_exports_outputs_bit_for_bit(world, tmp_path):
    model = by_hand(world)
    batch = torch.export.Dim("batch", min=1)
    program = torch.export.export(model, (batches(2)[0],), dynamic_shapes=({0: batch},))
    path = tmp_path / "hand.pt2"
    torch.export.save(program, path)
    hand = torch.export.load(path).module()
    ours = torch.export.load(world["exports"]["exported-program"]).module()
    with torch.no_grad():
        for x in batches(1, 3, 5):
            assert torch.equal(ours(x), hand(x))
            np.testing.assert_allclose(ours(x).numpy(), eager(model, x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("options", "arguments", "example_size"),
    [
        ([], {}, 2),
        (
            ["--opset", "18", "--static-batch", "--batch-size", "4"],
            {"opset_version": 18, "dynamic_axes": None},
            4,
        ),
        (["--dtype", "float16"], {}, 2),
    ],
    ids=["defaults", "opset-static-batch", "float16"],
)
def test_torchkits_options_are_torch_onnx_exports_arguments(
    world, tmp_path, monkeypatch, options, arguments, example_size
):
    """--opset is opset_version, --static-batch drops dynamic_axes (the batch is the example's,
    --batch-size), --dtype float16 is model.half() with a float16 example: the same graph."""
    monkeypatch.chdir(world["root"])
    out = tmp_path / "m.onnx"
    result = CliRunner().invoke(app, [*spec("Net", world["root"]), str(out), *options])
    assert result.exit_code == 0, result.stderr
    model, example = by_hand(world), batches(example_size)[0]
    if "float16" in options:
        model, example = model.half(), example.half()
    hand = onnx.load_model_from_string(
        onnx_by_hand(model, example, **{**ONNX_AS_TORCHKIT, **arguments})
    )
    ours = onnx.load(str(out))
    del ours.metadata_props[:]
    assert ours.SerializeToString() == hand.SerializeToString()
    elem_type = ours.graph.input[0].type.tensor_type.elem_type
    assert elem_type == (
        onnx.TensorProto.FLOAT16 if "float16" in options else onnx.TensorProto.FLOAT
    )


# -- what a hand export gets wrong ---------------------------------------------------------------


def test_bare_calls_fix_the_batch_where_torchkits_files_take_any(world, tmp_path):
    """torch.onnx.export without dynamic_axes and torch.export.export without dynamic_shapes
    fix the batch to the example's; torchkit's files of the same model ran batches of 1, 3 and
    5 above. A Dim("batch") that torch.export is given with an example of 1 image is refused:
    torchkit traces a batch of at least 2 (`--batch-size 1` exports)."""
    model, (two, three) = by_hand(world), batches(2, 3)
    session = onnx_runner_of(onnx_by_hand(model, two, opset_version=17), tmp_path)
    with pytest.raises(Exception, match="(?i)dimension|shape"):
        session(three)
    program = torch.export.export(model, (two,))
    with pytest.raises(Exception, match="(?i)guard|size|shape"):
        program.module()(three)
    batch = torch.export.Dim("batch")
    with pytest.raises(Exception, match="Constraints violated"):
        torch.export.export(model, (batches(1)[0],), dynamic_shapes=({0: batch},))
    assert world["results"]["exported-program"]["verified_batch_sizes"] == [1, 3]


def onnx_runner_of(data: bytes, folder):
    path = folder / "hand.onnx"
    path.write_bytes(data)
    return onnx_runner(path)


def test_the_bare_onnx_names_are_torchs_where_torchkits_are_input_and_logits(world):
    hand = onnx.load_model_from_string(onnx_by_hand(by_hand(world), batches(2)[0]))
    assert hand.graph.input[0].name == "input.1" and hand.graph.output[0].name.isdigit()
    [opset] = [o.version for o in hand.opset_import if o.domain in ("", "ai.onnx")]
    # torch's own default opset, which moves with its version; torchkit writes 17 unless told
    from torch.onnx import _constants

    assert opset == _constants.ONNX_DEFAULT_OPSET
    if torch.__version__.startswith("2.15."):
        assert opset == 20  # as the docs say


@pytest.mark.parametrize("fmt", ["torchscript", "exported-program"])
def test_a_model_left_in_train_mode_is_exported_in_train_mode_by_hand(world, fmt):
    """torch.jit.trace and torch.export.export take the module as it is: left in the train
    mode a new module starts in, the file normalises with each batch's own statistics and
    drops activations at random. torchkit puts the model in eval mode: its file gives the
    eval-mode outputs (the tests above)."""
    model, (x,) = by_hand(world, train=True), batches(4)
    torch.manual_seed(0)
    if fmt == "torchscript":
        hand = torch.jit.trace(model, x, check_trace=False)
    else:
        hand = torch.export.export(model, (x,)).module()
    truth = eager(by_hand(world), x)
    with torch.no_grad():
        first, second = hand(x).numpy(), hand(x).numpy()
    assert np.abs(first - truth).max() > 0.1
    assert np.abs(first - second).max() > 0.1  # Dropout, still on
    ours = world["exports"][fmt]
    loaded = torch.jit.load(str(ours)) if fmt == "torchscript" else torch.export.load(ours).module()
    with torch.no_grad():
        np.testing.assert_allclose(loaded(x).numpy(), truth, rtol=1e-4, atol=1e-5)


def test_torch_onnx_exports_torchscript_exporter_puts_the_model_in_eval_mode_itself(world):
    """(training=TrainingMode.EVAL is its default: there, a hand export is as torchkit's)."""
    model = by_hand(world, train=True)
    hand = onnx_by_hand(model, batches(2)[0], **ONNX_AS_TORCHKIT)
    assert model.training  # put back as it was
    ours = onnx.load(str(world["exports"]["onnx"]))
    del ours.metadata_props[:]
    assert ours.SerializeToString() == hand


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_a_model_whose_trace_differs_from_it_is_refused_where_a_hand_trace_is_wrong(
    world, tmp_path, monkeypatch, fmt
):
    """BatchCounted adds its batch size through a Python float: the trace keeps the example's
    (2). By hand, the file is written and gives other outputs than the model at batch 3;
    torchkit's verification (batches of 1 and 3) refuses it in one Error line that says the
    file is right at the batch size it was traced at alone (before, its hint was to raise
    --atol/--rtol, which cannot help), and writes nothing."""
    model, (two, three) = by_hand(world, "BatchCounted"), batches(2, 3)
    if fmt == "onnx":
        run = onnx_runner_of(onnx_by_hand(model, two, **ONNX_AS_TORCHKIT), tmp_path)
    else:
        traced = torch.jit.trace(model, two)
        run = lambda x: traced(x).detach().numpy()  # noqa: E731
    np.testing.assert_allclose(run(three), eager(model, three) - 1, rtol=1e-5, atol=1e-5)

    monkeypatch.chdir(world["root"])
    out = tmp_path / f"m{SUFFIX[fmt]}"
    result = CliRunner().invoke(app, [*spec("BatchCounted", world["root"]), str(out)])
    assert result.exit_code == 1
    line = error_line(result.stderr, besides="warnings")
    assert "differ from PyTorch's by up to 1, beyond the tolerance " in line
    assert line.endswith(
        ", at batch 1 and 3 but not at batch 2, the size it was traced at: the model turns its "
        "batch size into a Python number, as `float(x.shape[0])` does, which the trace kept as "
        "a constant (keep the batch size a tensor, `x.shape[0]` without `int()` or `float()`, or "
        "export one batch size with --static-batch --batch-size N; nothing was written)"
    )
    hand_files = ["hand.onnx"] if fmt == "onnx" else []
    assert sorted(p.name for p in tmp_path.iterdir()) == hand_files  # no OUT, no temporary


def test_the_batch_sizes_said_follow_batch_size_and_static_batch_exports_it(
    world, tmp_path, monkeypatch
):
    monkeypatch.chdir(world["root"])
    out = tmp_path / "m.onnx"
    args = [*spec("BatchCounted", world["root"]), str(out), "--batch-size", "3"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1 and not out.exists()
    assert ", at batch 5 but not at batch 3, the size it was traced at: " in error_line(
        result.stderr, besides="warnings"
    )
    result = CliRunner().invoke(app, [*args, "--static-batch", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["verification"] == "passed"
    x = batches(3)[0]
    np.testing.assert_allclose(
        onnx_runner(out)(x), eager(by_hand(world, "BatchCounted"), x), rtol=1e-5, atol=1e-5
    )


def test_a_float16_file_off_at_every_batch_size_keeps_the_tolerance_hint(world, tmp_path):
    """A float16 TorchScript file rounds as the float16 model does, so at the traced size it
    matches the model as it is now, yet misses the float32 references at every size: that is
    the tolerance's doing, not a batch size kept as a constant (the error said so before)."""
    out = tmp_path / "m.ts"
    args = [*spec("Net", world["root"]), str(out), "--dtype", "float16", "--atol", "1e-6"]
    result = CliRunner().invoke(app, [*args, "--rtol", "0"])
    assert result.exit_code == 1 and not out.exists()
    line = error_line(result.stderr, besides="warnings")
    assert "differ from PyTorch's by up to " in line and "Python number" not in line
    assert line.endswith("(raise --atol/--rtol if that much is expected; nothing was written)")


def test_torch_export_of_it_is_one_error_line_too(world, tmp_path, monkeypatch):
    monkeypatch.chdir(world["root"])
    out = tmp_path / "m.pt2"
    result = CliRunner().invoke(app, [*spec("BatchCounted", world["root"]), str(out)])
    assert result.exit_code == 1
    line = error_line(result.stderr, besides="nothing")
    assert "with a dynamic batch size: the model fixes it" in line
    assert "--static-batch" in line and list(tmp_path.iterdir()) == []


def test_a_hand_trace_runs_any_image_size_where_torchkits_torchscript_refuses(world):
    """The traced Net pools globally, so a 20 x 20 image runs through a hand trace exported at
    16 x 16; torchkit's .ts checks the shape it was exported at, as ONNX and .pt2 files do."""
    traced = torch.jit.trace(by_hand(world), batches(2)[0])
    other = torch.randn(1, 3, 20, 20)
    assert traced(other).shape == (1, 3)
    ours = torch.jit.load(str(world["exports"]["torchscript"]))
    with pytest.raises(torch.jit.Error, match=r"expected input of shape \[N, \[3, 16, 16\]\]"):
        ours(other)
    with pytest.raises(Exception, match="(?i)dimension|shape"):
        onnx_runner(world["exports"]["onnx"])(other)
    with pytest.raises(Exception, match="(?i)guard|size|shape"):
        torch.export.load(world["exports"]["exported-program"]).module()(other)


def test_an_existing_file_is_replaced_by_a_bare_call_and_refused_by_torchkit(world, tmp_path):
    out = tmp_path / "m.onnx"
    out.write_bytes(b"an earlier export")
    result = CliRunner().invoke(app, [*spec("Net", world["root"]), str(out)])
    assert result.exit_code != 0 and "--force" in error_line(result.stderr)
    assert out.read_bytes() == b"an earlier export"
    torch.onnx.export(by_hand(world), (batches(2)[0],), str(out), dynamo=False)
    assert out.read_bytes() != b"an earlier export"  # no question asked


@pytest.mark.skipif(
    importlib.util.find_spec("onnxscript") is not None
    or inspect.signature(torch.onnx.export).parameters["dynamo"].default is not True,
    reason="the bare call's default exporter runs here",
)
def test_the_bare_calls_default_exporter_needs_onnxscript_where_torchkit_does_not(world):
    """torch.onnx.export's default is the dynamo exporter (dynamo=True, torch 2.9 on), which
    needs onnxscript; torchkit calls the TorchScript-based one (dynamo=False), as the graph
    tests above show, and wrote its .onnx without it."""
    with pytest.raises(ImportError, match="onnxscript"):
        torch.onnx.export(by_hand(world), (batches(2)[0],), io.BytesIO())
    assert world["results"]["onnx"]["verified"] is True


def test_the_exporters_are_called_as_the_docs_say(world):
    """torch.onnx.export with dynamo=False; torch.jit.trace with check_trace=False (the
    verification takes its place); every trace made from a batch of 2 at the default -b 1."""
    calls = world["calls"]
    shape, kwargs = calls["torch.onnx.export"]
    assert shape == (2, *SAMPLE) and kwargs["dynamo"] is False
    assert {key: kwargs[key] for key in ONNX_AS_TORCHKIT} == ONNX_AS_TORCHKIT
    shape, kwargs = calls["torch.jit.trace"]
    assert shape == (2, *SAMPLE) and kwargs["check_trace"] is False
    shape, kwargs = calls["torch.export.export"]
    assert shape == (2, *SAMPLE)
    [[batch]] = [list(axes.values()) for axes in kwargs["dynamic_shapes"]]
    assert batch.min == 1


def test_a_static_pt2_is_torch_exports_without_dynamic_shapes(world, tmp_path, monkeypatch):
    monkeypatch.chdir(world["root"])
    out = tmp_path / "m.pt2"
    options = ["--static-batch", "--batch-size", "2"]
    result = CliRunner().invoke(app, [*spec("Net", world["root"]), str(out), *options])
    assert result.exit_code == 0, result.stderr
    model, (two, three) = by_hand(world), batches(2, 3)
    hand = torch.export.export(model, (two,)).module()
    ours = torch.export.load(out).module()
    with torch.no_grad():
        assert torch.equal(ours(two), hand(two))
    for module in (ours, hand):
        with pytest.raises(Exception, match="(?i)guard|size|shape"):
            module(three)


def test_onnx_under_no_grad_fails_by_hand_on_attention_where_torchkit_exports_it(
    world, tmp_path, monkeypatch
):
    """Under torch.no_grad(), eval-mode nn.MultiheadAttention takes its fast path, an operator
    ONNX lacks: a hand export from inside no_grad fails; torchkit traces with autograd on,
    even when called from inside no_grad."""
    model, example = by_hand(world, "Attention"), batches(2)[0]
    with torch.no_grad(), pytest.raises(Exception, match="_native_multi_head_attention"):
        onnx_by_hand(model, example, **ONNX_AS_TORCHKIT)
    monkeypatch.chdir(world["root"])
    out = tmp_path / "m.onnx"
    with torch.no_grad():
        result = CliRunner().invoke(app, [*spec("Attention", world["root"]), str(out)])
    assert result.exit_code == 0, result.stderr
    run = onnx_runner(out)
    for x in batches(1, 3):
        np.testing.assert_allclose(run(x), eager(model, x), rtol=1e-4, atol=1e-5)
