"""`torchkit summary` beyond image models (issue #21): named, typed and unbatched inputs,
parameter-only summaries, TorchScript modules, pruned layers and training mode. Every total is
counted by hand on a tiny generated model."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from nets import TinyNet
from output_checks import error_line
from torch import nn
from torch.nn.utils import prune

from torchkit.cli import app
from torchkit.core.io.errors import UsageError
from torchkit.core.summary import summarize
from torchkit.core.summary.counting import InputSpec, summarize_tree
from torchkit.core.summary.run import InputArg, full_shapes, parse_input

HERE = __name__
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:FutureWarning")


def invoke(runner, *args):
    return runner.invoke(app, ["summary", *args, "--format", "json"])


def invoke_json(runner, *args):
    result = invoke(runner, *args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


# --- the -i grammar ----------------------------------------------------------------------------


def test_parse_input_grammar():
    assert parse_input("3,224,224") == InputArg((3, 224, 224))
    assert parse_input("3 224 224") == InputArg((3, 224, 224))
    assert parse_input("input_ids=1,128:long") == InputArg((1, 128), "input_ids", "long")
    assert parse_input(" mask = 128 : bool ") == InputArg((128,), "mask", "bool")
    assert parse_input("t=():long") == InputArg((), "t", "long")
    assert parse_input("scalar") == InputArg(())
    for dtype in ("int", "float16", "bfloat16", "float32"):
        assert parse_input(f"4:{dtype}") == InputArg((4,), None, dtype)
    for bad, message in [
        ("1,2:float8", "unknown dtype"),
        ("1x=3", "invalid input name"),
        ("x=1,a", "invalid input size"),
        ("x=", "invalid input size"),
    ]:
        with pytest.raises(UsageError, match=message):
            parse_input(bad)
    assert full_shapes([(), (4,)], None, image_model=False, no_batch_dim=True) == [(), (4,)]
    assert full_shapes([()], 3, image_model=False) == [(3,)]  # one number per sample
    with pytest.raises(UsageError, match="contradicts --no-batch-dim"):
        full_shapes([(4,)], 2, image_model=False, no_batch_dim=True)


def test_a_batch_size_no_tensor_holds_is_named_as_the_batch_size(runner):
    """summary --batch-size 99999999999999999999 named an input size never given and hinted at
    one (`give the size of a real input, e.g. 3,224,224`); the batch size is the culprit."""
    with pytest.raises(UsageError, match="--batch-size 99999999999999999999 of inputs 3,8,8"):
        full_shapes([(3, 8, 8)], 99999999999999999999, image_model=True)
    assert full_shapes([(3, 8, 8)], 2**20, image_model=True) == [(2**20, 3, 8, 8)]
    refused = runner.invoke(
        app, ["summary", "nets:TinyNet", "--input-size", "3,8,8", "-b", "99999999999999999999"]
    )
    assert refused.exit_code == 2
    assert error_line(refused.stderr) == (
        "Error: --batch-size 99999999999999999999 of inputs 3,8,8 is more values than a tensor "
        "can hold (give a smaller --batch-size)"
    )


class TokenModel(nn.Module):
    """A transformer-style model: keyword inputs, an integer and a boolean one."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, input_ids, attention_mask=None):
        hidden = self.embed(input_ids)
        if attention_mask is not None:
            hidden = hidden * attention_mask.unsqueeze(-1)
        return self.head(hidden)


def token_model() -> nn.Module:
    return TokenModel()


def test_keyword_inputs_with_their_dtypes(runner):
    data = invoke_json(
        runner, f"{HERE}:token_model", "-i", "input_ids=5:long", "-i", "attention_mask=5:bool"
    )
    assert data["inputs"] == [
        {"name": "input_ids", "shape": [1, 5], "dtype": "int64"},
        {"name": "attention_mask", "shape": [1, 5], "dtype": "bool"},
    ]
    assert data["input_shapes"] == [[1, 5], [1, 5]]
    assert data["layers"][0]["input_shape"] == {"input_ids": [1, 5], "attention_mask": [1, 5]}
    assert data["layers"][0]["output_shape"] == [1, 5, 3]
    totals = data["totals"]
    assert totals["total_params"] == 10 * 4 + 4 * 3 + 3
    # the embedding once per sample (torchinfo's rule), the head once per token
    assert totals["total_mult_adds"] == 1 * 40 + 5 * 15
    assert totals["input_mb"] == (5 * 8 + 5 * 1) / 1e6  # int64 ids, one-byte booleans
    table = runner.invoke(
        app, ["summary", f"{HERE}:token_model", "-i", "input_ids=5:long", "-b", "2"]
    )
    assert table.exit_code == 0, table.stderr
    assert "TokenModel on input input_ids=2×5:int64 (float32, cpu)" in table.stdout


class Denoiser(nn.Module):
    """A diffusion-style step: a batch of samples and one 0-d timestep."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 3)

    def forward(self, x, t):
        return self.net(x) * t


def denoiser() -> nn.Module:
    return Denoiser()


def vector_model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 3))


def test_shapes_without_a_batch_dimension(runner):
    data = invoke_json(runner, f"{HERE}:denoiser", "--no-batch-dim", "-i", "2,4", "-i", "t=():long")
    assert data["inputs"] == [
        {"name": None, "shape": [2, 4], "dtype": "float32"},
        {"name": "t", "shape": [], "dtype": "int64"},
    ]
    assert data["layers"][0]["output_shape"] == [2, 3]
    assert data["totals"]["total_mult_adds"] == 2 * (4 * 3 + 3)
    one_d = invoke_json(runner, f"{HERE}:vector_model", "--no-batch-dim", "-i", "4")
    assert one_d["input_shapes"] == [[4]] and one_d["layers"][0]["output_shape"] == [3]
    assert one_d["totals"]["total_mult_adds"] == 15  # one row


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-i", "4:float8"], "unknown dtype 'float8'"),
        (["-i", "9x=4"], "invalid input name"),
        (["-i", "4", "--no-batch-dim", "-b", "2"], "contradicts --no-batch-dim"),
        (["-i", "x=4", "-i", "x=4"], "given twice"),
        (["-i", "4", "--params-only"], "--params-only runs no forward pass"),
        (["--params-only", "-b", "4"], "drop --batch-size"),  # was accepted and ignored
        (["--params-only", "--no-batch-dim"], "drop --no-batch-dim"),
        (["-i", "input_ids=5:float32"], "cannot run on an input of shape input_ids=(1, 5)"),
    ],
)
def test_input_errors_are_one_line(runner, args, message):
    model = f"{HERE}:token_model" if "input_ids" in " ".join(args) else f"{HERE}:vector_model"
    result = runner.invoke(app, ["summary", model, *args])
    # stdout too: on one GPU machine (torch 2.11) the last case once exited 0, unexplained.
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def lookup_model() -> nn.Module:
    return nn.Sequential(nn.Embedding(10, 4), nn.Flatten(), nn.Linear(12, 2))


def select_model() -> nn.Module:
    class Select(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = nn.Parameter(torch.zeros(10, 4))

        def forward(self, indices: torch.Tensor) -> torch.Tensor:
            return self.table.index_select(0, indices.flatten())

    return Select()


@pytest.mark.parametrize("model", ["lookup_model", "select_model"])
def test_float_indices_say_to_give_an_integer_dtype(runner, model):
    """A language model summarised with the default float input. Before, the hint was only
    'check --input-size (and --dtype)' after torch's 'Expected tensor for argument #1
    'indices' to have one of the following scalar types: Long, Int'."""
    result = runner.invoke(app, ["summary", f"{HERE}:{model}", "-i", "3"])
    assert result.exit_code == 2
    line = error_line(result.stderr)
    assert line.startswith(f"Error: {'Sequential' if model == 'lookup_model' else 'Select'} ")
    assert line.endswith(
        "(the model takes indices, as an Embedding does, not floating-point numbers: give that "
        "input an integer dtype, -i SHAPE:long, or --dtype int64)"
    )
    assert invoke_json(runner, f"{HERE}:{model}", "-i", "3:long")["totals"]["total_params"] == (
        40 + 26 if model == "lookup_model" else 40
    )


def rgb_model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3))


def miswired_model() -> nn.Module:
    """A user's bug: the second convolution takes 8 channels, the first makes 4."""
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.Conv2d(8, 4, 3))


def test_a_grayscale_input_to_an_rgb_model_says_which_channels_it_takes(runner):
    """Before: torch's 'expected input[1, 1, 8, 10] to have 3 channels, but got 1 channels
    instead' and 'check --input-size (and --dtype)'."""
    for batch in ("1", "2"):
        result = runner.invoke(app, ["summary", f"{HERE}:rgb_model", "-i", "1,8,10", "-b", batch])
        assert result.exit_code == 2
        assert error_line(result.stderr).endswith(
            "(the model takes 3-channel images: give C,H,W as 3,8,10)"
        )
    # a layer deeper in that gets the wrong channels says nothing of the model's input
    result = runner.invoke(app, ["summary", f"{HERE}:miswired_model", "-i", "1,8,8"])
    assert result.exit_code == 2
    assert error_line(result.stderr).endswith("(check --input-size and --dtype)")


def signal_model() -> nn.Module:
    return nn.Sequential(nn.Conv1d(3, 4, 3))


def video_model() -> nn.Module:
    return nn.Sequential(nn.Conv3d(3, 4, 3))


@pytest.mark.parametrize(
    ("model", "given", "hint", "runs"),
    [
        ("signal_model", "2,100", "the model takes 3-channel inputs: give C,L as 3,100", "3,100"),
        (
            "video_model",
            "2,8,16,16",
            "the model takes 3-channel inputs: give C,D,H,W as 3,8,16,16",
            "3,8,16,16",
        ),
    ],
)
def test_the_wrong_channels_of_a_1d_or_3d_convolution_keep_its_other_dimensions(
    runner, model, given, hint, runs
):
    """Before: a Conv1d's input (1, 2, 100) was told 'give C,H,W as 3,2,100' (a 2-D sample, which
    a Conv1d then refuses), a Conv3d's (1, 2, 8, 16, 16) 'give C,H,W as 3,16,16' (its depth
    dropped). The shape the hint gives runs."""
    result = runner.invoke(app, ["summary", f"{HERE}:{model}", "-i", given])
    assert result.exit_code == 2
    assert error_line(result.stderr).endswith(f"({hint})")
    taken = runner.invoke(app, ["summary", f"{HERE}:{model}", "-i", runs, "--format", "json"])
    assert taken.exit_code == 0, taken.stderr


def test_an_empty_shape_for_an_image_model_is_named_in_the_error(runner):
    """Before: the error line ended in `not ` with nothing after it."""
    result = runner.invoke(app, ["summary", "convnet", "-i", "()"])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "Error: convnet takes images: give the input size as C,H,W (or N,C,H,W), not () (no "
        "dimensions)"
    )
    # With --no-batch-dim the input size holds the batch: 3,32,32 was said to be `32,32`, and
    # the hint to give C,H,W was what the user gave.
    unbatched = runner.invoke(app, ["summary", "convnet", "-i", "3,32,32", "--no-batch-dim"])
    assert unbatched.exit_code == 2
    assert unbatched.stderr.strip() == (
        "Error: convnet takes images, and with --no-batch-dim the input size is N,C,H,W, not "
        "3,32,32 (give the batch first, such as 1,3,28,28, or drop --no-batch-dim)"
    )
    followed = runner.invoke(app, ["summary", "convnet", "-i", "1,3,28,28", "--no-batch-dim"])
    assert followed.exit_code == 0, followed.stderr


def test_convnet_is_sized_for_a_non_square_input(runner):
    """Before: convnet was built for the input's width alone (47x47) and then fed 33x47:
    'mat1 and mat2 shapes cannot be multiplied (1x18816 and 28224x128)'. Hand count for one
    1x20x36 image: two 3x3 convolutions, 16x32 -> a 2x2 max-pool, 8x16 maps of 64 channels."""
    summary = invoke_json(runner, "convnet", "-i", "1,20,36")
    first, second = 1 * 32 * 9 + 32, 32 * 64 * 9 + 64
    hidden, head = 64 * 8 * 16 * 128 + 128, 128 * 10 + 10
    assert summary["totals"]["total_params"] == first + second + hidden + head
    convolutions = 18 * 34 * first + 16 * 32 * second
    assert summary["totals"]["total_mult_adds"] == convolutions + hidden + head
    shapes = {row["name"]: row["output_shape"] for row in summary["layers"]}
    assert shapes["features"] == [1, 64, 8, 16] and shapes[""] == [1, 10]
    narrow = runner.invoke(app, ["summary", "convnet", "-i", "3,5,40"])
    assert narrow.exit_code == 2
    assert narrow.stderr == "Error: convnet needs images of at least 6x6, not 5x40\n"


# --- parameters only ------------------------------------------------------------------------


def nested() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.Sequential(nn.ReLU(), nn.Linear(4, 2)))


def test_params_only_lists_the_module_tree():
    model = nested()
    model[0].requires_grad_(False)
    ours = summarize_tree(model)
    rows = [(r.depth, r.name, r.type, r.params, r.trainable, r.mult_adds) for r in ours.layers]
    assert rows == [
        (0, "", "Sequential", 26, False, None),
        (1, "0", "Linear", 16, False, None),
        (1, "1", "Sequential", 10, True, None),
        (2, "1.0", "ReLU", 0, None, None),
        (2, "1.1", "Linear", 10, True, None),
    ]
    assert (ours.total_params, ours.trainable_params, ours.non_trainable_params) == (26, 10, 16)
    assert ours.total_mult_adds is None and ours.flops is None and ours.total_mb is None
    assert ours.params_mb == 26 * 4 / 1e6


def test_params_only_option_and_the_default_without_an_input_size(runner):
    data = invoke_json(runner, "convnet", "--params-only")
    assert data["inputs"] == [] and data["input_shapes"] == []
    assert data["totals"]["total_mult_adds"] is None and data["totals"]["flops"] is None
    with_forward = invoke_json(runner, "convnet")
    assert data["totals"]["total_params"] == with_forward["totals"]["total_params"]
    assert all(layer["mult_adds"] is None for layer in data["layers"])
    table = runner.invoke(app, ["summary", f"{HERE}:nested"])  # no -i, nothing known
    assert table.exit_code == 0, table.stderr
    assert "Note:" in table.stderr and "mult-adds" in table.stderr and "-i" in table.stderr
    assert "Sequential: parameters only" in table.stdout and "not measured" in table.stdout
    csv = runner.invoke(app, ["summary", f"{HERE}:nested", "--format", "csv"])
    assert csv.exit_code == 0 and csv.stdout.splitlines()[-1] == ",(total),,,,26,,,"


# --- TorchScript ------------------------------------------------------------------------------


def scripted() -> nn.Module:
    return torch.jit.script(nested())


def test_torchscript_module_from_the_tree_with_flops():
    ours = summarize(scripted(), [(2, 3)])
    assert [(r.name, r.type, r.params) for r in ours.layers] == [
        ("", "Sequential", 26),
        ("0", "Linear", 16),
        ("1", "Sequential", 10),
        ("1.0", "ReLU", 0),
        ("1.1", "Linear", 10),
    ]
    assert ours.model == "Sequential" and ours.total_params == 26
    assert ours.total_mult_adds is None and "TorchScript" in ours.notes[0]
    assert ours.layers[0].output_shape == [2, 2]
    assert ours.flops == 2 * 2 * (3 * 4 + 4 * 2)  # the forward still runs, without hooks


def test_torchscript_in_the_command(runner, tmp_path):
    result = invoke(runner, f"{HERE}:scripted", "-i", "3")
    assert result.exit_code == 0, result.stderr
    assert "TorchScript" in result.stderr and "register_forward_pre_hook" not in result.stderr
    data = json.loads(result.stdout)
    assert data["totals"]["total_params"] == 26 and data["totals"]["total_mult_adds"] is None
    path = tmp_path / "scripted.pt"
    scripted().save(str(path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch.load's "dispatching to torch.jit.load" included
        loaded = invoke(runner, str(path), "--trust-checkpoint")  # no input size known
    assert loaded.exit_code == 0, loaded.stderr
    assert json.loads(loaded.stdout)["totals"]["total_params"] == 26
    assert "TorchScript" in loaded.stderr


def test_a_torchscript_module_that_fails_says_why(runner):
    # The interpreter's message opens with "The following operation failed in the TorchScript
    # interpreter." and says what failed on its last line, after two tracebacks.
    result = invoke(runner, f"{HERE}:scripted", "-i", "5")
    assert result.exit_code == 2
    line = error_line(result.stderr)
    assert "mat1 and mat2 shapes cannot be multiplied (1x5 and 3x4)" in line, line
    assert "TorchScript interpreter" not in line


def test_a_torchscript_file_of_a_fixed_batch_is_counted_at_its_batch(runner, tmp_path):
    """Before: `export --static-batch -b 3` files were run at batch 1 without --batch-size:
    'ShapeChecked cannot run on an input of shape (1, 3, 8, 8): expected a batch of 3, got 1
    (check --input-size ...)'. Now they are counted at 3 (as benchmark times them), and another
    batch is one usage error naming 3."""
    path = tmp_path / "fixed.ts"
    exported = runner.invoke(
        app,
        ["export", "nets:TinyNet", str(path), "--image-size", "8", "--static-batch", "-b", "3"],
    )
    assert exported.exit_code == 0, exported.stderr
    plain = invoke_json(runner, str(path), "--trust-checkpoint")
    assert plain["inputs"][0]["shape"] == [3, 3, 8, 8]
    assert plain["totals"]["flops"] == 3 * summarize(TinyNet(), [(1, 3, 8, 8)]).flops
    assert invoke_json(runner, str(path), "--trust-checkpoint", "-b", "3") == plain
    hint = "(give --batch-size 3 or none, or export it without --static-batch)"
    for args, other in ((["-b", "2"], 2), (["-i", "1,3,8,8"], 1)):
        refused = invoke(runner, str(path), "--trust-checkpoint", *args)
        assert refused.exit_code == 2 and refused.stdout == ""
        assert error_line(refused.stderr) == (
            f"Error: {path} takes batches of 3 only (exported with --static-batch), not "
            f"{other} {hint}"
        )


# --- pruned layers ---------------------------------------------------------------------------


def test_pruned_layers_count_the_dense_operations_the_forward_runs():
    torch.manual_seed(0)
    linear = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    conv = nn.Sequential(nn.Conv2d(3, 4, 3))
    before = (summarize(linear, [(2, 8)]), summarize(conv, [(1, 3, 5, 5)]))
    for layer in (linear[0], linear[2], conv[0]):
        prune.l1_unstructured(layer, "weight", amount=0.5)
    after = (summarize(linear, [(2, 8)]), summarize(conv, [(1, 3, 5, 5)]))
    assert after[0].total_mult_adds == before[0].total_mult_adds == 2 * 2 * (64 + 8)
    assert after[1].total_mult_adds == before[1].total_mult_adds == 3 * 3 * (4 * 27 + 4)
    assert after[0].total_params == 2 * (64 + 8)  # weight_orig, as stored
    assert [r.mult_adds for r in after[0].layers if r.leaf] == [144, 0, 144]
    assert summarize(linear, [(2, 8)], on_meta=False).total_mult_adds == 288


def _reparametrized(kind, layer):
    """`layer` with its weight computed before each call: a parametrization (a layer with a
    `parametrizations` child), or the older forward pre-hook (a leaf with weight_g, weight_v)."""
    from torch.nn.utils import parametrizations

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the older API is deprecated
        if kind == "parametrized weight_norm":
            return parametrizations.weight_norm(layer)
        if kind == "parametrized spectral_norm":
            return parametrizations.spectral_norm(layer)
        if kind == "weight_norm hook":
            return nn.utils.weight_norm(layer)
        return nn.utils.spectral_norm(layer)


@pytest.mark.parametrize(
    "kind",
    [
        "parametrized weight_norm",
        "parametrized spectral_norm",
        "weight_norm hook",
        "spectral_norm hook",
    ],
)
def test_weight_normalised_layers_count_the_operations_of_the_plain_layer(kind):
    """A layer whose weight is computed from other parameters (weight_norm's g and v, as
    audio vocoders and GAN discriminators use them) does the plain layer's work: it counted 0
    mult-adds (its bias only, for the older hook), and a parametrized layer's output took no
    memory (only the weight its parametrization computes, kept with its gradient, did)."""
    torch.manual_seed(0)
    for layer, shape in (
        (nn.Linear(8, 4), (2, 8)),
        (nn.Conv1d(2, 3, 3), (1, 2, 10)),
        (nn.ConvTranspose1d(2, 3, 2, stride=2), (1, 2, 10)),
    ):
        plain = summarize(nn.Sequential(layer), [shape])
        weight_mb = 2 * layer.weight.numel() * 4 / 1e6 if kind.startswith("parametrized") else 0
        model = nn.Sequential(_reparametrized(kind, layer))
        for on_meta in (True, False):
            ours = summarize(model, [shape], on_meta=on_meta)
            assert ours.total_mult_adds == plain.total_mult_adds > 0
            assert ours.layers[1].mult_adds == plain.total_mult_adds
            assert ours.layers[1].leaf
            assert ours.forward_backward_mb == pytest.approx(plain.forward_backward_mb + weight_mb)


# --- training mode ------------------------------------------------------------------------------


class AuxNet(nn.Module):
    """An auxiliary head that runs only in training mode, as GoogLeNet's do."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.norm = nn.BatchNorm1d(4)
        self.aux = nn.Linear(4, 2)

    def forward(self, x):
        x = self.norm(self.body(x))
        return (x, self.aux(x)) if self.training else x


def aux_net() -> nn.Module:
    return AuxNet()


@pytest.mark.parametrize("on_meta", [True, False])
def test_train_mode_runs_the_training_branches_and_restores_everything(on_meta):
    model = AuxNet()
    model.norm.eval()  # a mixed mode comes back as it was
    state = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    evaluated = summarize(model, [(2, 4)], on_meta=on_meta)
    trained = summarize(model, [(2, 4)], on_meta=on_meta, train_mode=True)
    assert evaluated.total_mult_adds == 2 * 20 + 2 * 8  # body per row, norm per sample
    assert trained.total_mult_adds == 2 * 20 + 2 * 8 + 2 * 10  # and the auxiliary head
    assert [r.name for r in trained.layers] == ["", "body", "norm", "aux"]
    assert trained.layers[0].output_shape == [[2, 4], [2, 2]]
    assert [m.training for m in model.modules()] == [True, True, False, True]
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert torch.equal(torch.get_rng_state(), rng)


def test_train_mode_option(runner):
    data = invoke_json(runner, f"{HERE}:aux_net", "-i", "4", "-b", "2", "--train-mode")
    assert data["totals"]["total_mult_adds"] == 76
    assert (
        invoke_json(runner, f"{HERE}:aux_net", "-i", "4", "-b", "2")["totals"]["total_mult_adds"]
        == 56
    )
    result = runner.invoke(app, ["summary", f"{HERE}:aux_net", "--train-mode"])
    assert result.exit_code == 2
    assert error_line(result.stderr).endswith(
        "--train-mode needs a forward pass (give --input-size, -i for short)"
    )


class NoOutputs(nn.Module):
    def forward(self, x):
        return ()


class LossOfNothing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.nothing = NoOutputs()
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        self.nothing(x)
        return self.head(x).sum()


def loss_of_nothing() -> nn.Module:
    return LossOfNothing()


def test_an_empty_tuple_output_is_told_apart_from_a_0_d_tensor(runner):
    # Both read "scalar" in the table and [] in JSON.
    data = invoke_json(runner, f"{HERE}:loss_of_nothing", "-i", "4")
    assert [row["output_shape"] for row in data["layers"]] == [[], "empty tuple", [1, 1]]
    table = runner.invoke(app, ["summary", f"{HERE}:loss_of_nothing", "-i", "4"])
    rows = {line.split()[1]: line for line in table.stdout.splitlines() if "│" in line}
    assert "scalar" in rows["LossOfNothing"] and "scalar" not in rows["nothing"]
    assert "empty tuple" in rows["nothing"]


def test_train_mode_on_one_value_per_channel_hints_at_the_batch_size(runner):
    # The hint said "check --input-size (and --dtype)", where BatchNorm needs a larger batch.
    result = runner.invoke(app, ["summary", f"{HERE}:aux_net", "-i", "4", "--train-mode"])
    assert result.exit_code == 2
    assert error_line(result.stderr).endswith(
        "(BatchNorm in training mode needs more than one value per channel: give --batch-size "
        "2 or more, or leave out --train-mode)"
    )


class AuxiliaryHead(nn.Module):
    """An image model whose auxiliary head, as GoogLeNet's and Inception's, runs in training
    mode only and takes larger images than the rest: a 5x5 average pool of stride 3 and a 3x3
    convolution after the stem's stride 2, then a BatchNorm on a 1x1 map."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))
        self.aux = nn.Sequential(nn.AvgPool2d(5, stride=3), nn.Conv2d(4, 4, 3), nn.BatchNorm2d(4))

    def forward(self, x: torch.Tensor):
        x = self.stem(x)
        return (self.head(x), self.aux(x)) if self.training else self.head(x)


SMALLEST_21 = "the smallest it takes is 21: use --image-size 21 or larger"
WITH_A_BATCH = (
    ", with --batch-size 2 or more; BatchNorm in training mode needs more than one value per "
    "channel"
)


@pytest.mark.parametrize(("batch", "hint"), [(1, SMALLEST_21 + WITH_A_BATCH), (3, SMALLEST_21)])
def test_train_mode_on_images_too_small_for_the_auxiliary_head_names_the_smallest(batch, hint):
    """Before: torch's 'Output size is too small' and 'check --input-size', as the smallest size
    was looked for in eval mode, where the model runs at 12 px. By hand: the stem makes
    ceil(n/2) x ceil(n/2) maps, the pool needs 11 of them for 3x3 outputs, so n = 21. At batch
    1 the auxiliary head's BatchNorm on a 1x1 map fails at any size: the hint says so (it named
    21 alone, and the batch's refusal came next)."""
    model = AuxiliaryHead()
    assert summarize(model, [(batch, 3, 12, 12)]).layers[0].output_shape == [batch, 2]
    with pytest.raises(UsageError) as caught:
        summarize(model, [(batch, 3, 12, 12)], train_mode=True)
    assert caught.value.hint == hint
    if batch == 1:
        with pytest.raises(UsageError, match="more than 1 value per channel"):
            summarize(model, [(1, 3, 21, 21)], train_mode=True)
        # without a BatchNorm, a batch of one runs at 21: nothing said of the batch
        model.aux[2] = nn.Identity()
        with pytest.raises(UsageError) as caught:
            summarize(model, [(1, 3, 12, 12)], train_mode=True)
        assert caught.value.hint == SMALLEST_21
        assert summarize(model, [(1, 3, 21, 21)], train_mode=True).layers
    assert summarize(model, [(2, 3, 21, 21)], train_mode=True).layers[0].output_shape == [
        [2, 2],
        [2, 4, 1, 1],
    ]
    with pytest.raises(UsageError):
        summarize(model, [(2, 3, 20, 20)], train_mode=True)


def test_input_spec_keywords_in_core():
    ours = summarize(
        TokenModel(),
        [
            InputSpec((2, 3), torch.long, "input_ids"),
            InputSpec((2, 3), torch.bool, "attention_mask"),
        ],
    )
    assert ours.total_mult_adds == 2 * 40 + 2 * 3 * 15
    assert ours.dtype == "float32" and [i["dtype"] for i in ours.inputs] == ["int64", "bool"]


def test_a_torchscript_file_without_trust_says_why(tmp_path, runner):
    scripted = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(4, 2)))
    path = tmp_path / "scripted.pt"
    torch.jit.save(scripted, str(path))
    result = runner.invoke(app, ["summary", str(path)])
    assert result.exit_code == 1
    assert "is a TorchScript archive, whose code runs when it is loaded" in result.stderr
    assert "--trust-checkpoint" in result.stderr and "weights_only" not in result.stderr


def test_the_default_input_is_the_one_help_names(runner, _torchkit_command):
    """--help said 3,224,224 whatever the model; convnet's default input is 3,28,28."""
    options = _torchkit_command.commands["summary"].params
    help_text = next(option.help for option in options if "--input-size" in option.opts)
    assert invoke_json(runner, "convnet")["inputs"][0]["shape"] == [1, 3, 28, 28]
    assert "3,28,28 for convnet" in help_text
