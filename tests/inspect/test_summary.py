"""`torchkit summary` and `torchkit.core.summary`: checked against torchinfo 1.8.0 on torchvision
models, and against hand counts where torchinfo is wrong."""

from __future__ import annotations

import gc
import json
import math
import weakref

import pytest
import torch
import torchinfo
from checkpoints import write_convnet_checkpoint
from output_checks import error_line
from torch import nn

from torchkit.cli import app
from torchkit.core.io.errors import UsageError
from torchkit.core.models import resolve_model
from torchkit.core.models.random_init import skipped_weight_init
from torchkit.core.summary import run as summary_run
from torchkit.core.summary import summarize
from torchkit.core.summary.counting import trainable_label
from torchkit.core.summary.run import full_shapes, parse_input_size, summarize_model

# --- agreement with torchinfo ------------------------------------------------------------------


def torchinfo_corrected(model: nn.Module, shape: tuple[int, ...]) -> tuple[int, list, list]:
    """torchinfo's total params, and its leaf rows (type, mult-adds) in call order with the one
    known error fixed: a Linear layer applies its parameters once per row of its input, not
    once per sample."""
    result = torchinfo.summary(model, input_size=shape, verbose=0, depth=100)
    leaves = []
    for layer in result.summary_list:
        if not layer.is_leaf_layer:
            continue
        macs = layer.macs
        if isinstance(layer.module, nn.Linear) and len(layer.output_size) > 2:
            macs = math.prod(layer.output_size[:-1]) * layer.num_params
        leaves.append((layer.class_name, macs))
    return result.total_params, leaves, result


def build_without_init(name: str, sample_shape: tuple[int, ...]) -> nn.Module:
    """The model with uninitialised weights: counting needs no values, and initialising VGG's
    or ViT's ~100M parameters would take most of this test's time. Torch's random initialisers
    are skipped too: on the meta device they run torch's Python references (about 0.8 s of
    densenet121's 0.9 s build)."""
    try:
        with torch.device("meta"), skipped_weight_init():
            model = resolve_model(
                name, in_channels=sample_shape[0], image_size=sample_shape[1:]
            ).model
    except NotImplementedError:  # RegNet computes its widths with tensors while building
        with skipped_weight_init():
            return resolve_model(
                name, in_channels=sample_shape[0], image_size=sample_shape[1:]
            ).model
    return model.to_empty(device="cpu")


@pytest.mark.parametrize(
    "name",
    [
        "resnet18",
        "vgg11",
        "mobilenet_v3_small",
        "efficientnet_b0",
        "densenet121",
        "vit_b_16",
        "convnext_tiny",
        "regnet_y_400mf",
    ],
)
def test_agrees_with_torchinfo_on_torchvision_models(name):
    # 32x32 keeps this fast; ViT is built for that size (image_size=32, so 4 patches + class).
    model = build_without_init(name, (3, 32, 32))
    shape = (1, 3, 32, 32)
    ours = summarize(model, [shape])
    total_params, leaves, raw = torchinfo_corrected(model, shape)

    assert ours.total_params == total_params == sum(p.numel() for p in model.parameters())
    our_leaves = [(row.type, row.mult_adds) for row in ours.layers if row.leaf]
    assert our_leaves == leaves  # one row per leaf call, in the same order, same mult-adds
    expected = sum(macs for _, macs in leaves)
    if name == "vit_b_16":  # its attention projections, which torchinfo counts as 0
        expected += sum(row.mult_adds for row in ours.layers if row.type == "MultiheadAttention")
    assert abs(ours.total_mult_adds - expected) <= 0.01 * expected
    if name in ("vit_b_16", "convnext_tiny"):
        # their MLPs are Linear layers on 3-D/4-D inputs, which torchinfo undercounts
        assert raw.total_mult_adds < 0.9 * ours.total_mult_adds
    else:
        assert raw.total_mult_adds == ours.total_mult_adds
    # FLOPs measured by torch: 2 per mult-add of every matmul/convolution, and more for ViT's
    # attention products, which no module's parameters account for.
    assert ours.flops > 1.5 * ours.total_mult_adds


# --- hand counts where torchinfo is wrong ---------------------------------------------------


def test_linear_on_a_sequence_counts_every_row():
    model = nn.Sequential(nn.Linear(8, 4))
    ours = summarize(model, [(2, 5, 8)])
    assert ours.total_mult_adds == 2 * 5 * (8 * 4 + 4)  # 360
    assert torchinfo.summary(model, input_size=(2, 5, 8), verbose=0).total_mult_adds == 72


def test_transposed_and_unbatched_layers_count_what_runs():
    """A transposed convolution applies its kernel at every input position (torchinfo counts
    every output position: stride**2 times too many), and an unbatched convolution's or RNN's
    output has no batch (torchinfo took its channels or features for one)."""
    up = nn.Sequential(nn.ConvTranspose2d(8, 4, 2, stride=2))
    ours = summarize(up, [(2, 8, 16, 16)])
    weight, bias = 2 * 16 * 16 * (8 * 4 * 2 * 2), 2 * 32 * 32 * 4
    assert ours.total_mult_adds == weight + bias
    assert ours.flops == 2 * weight  # torch's count: the weight's work, at the input positions
    assert torchinfo.summary(up, input_size=(2, 8, 16, 16), verbose=0).total_mult_adds == (
        2 * 32 * 32 * (8 * 4 * 2 * 2) + bias
    )

    conv = nn.Sequential(nn.Conv2d(8, 4, 3, padding=1))
    batched = summarize(conv, [(1, 8, 16, 16)]).total_mult_adds
    assert batched == 16 * 16 * (8 * 4 * 9 + 4)
    assert summarize(conv, [(8, 16, 16)]).total_mult_adds == batched
    assert summarize(up, [(8, 16, 16)]).total_mult_adds == (weight + bias) // 2

    recurrent = nn.GRU(6, 5)  # 195 parameters, each used at every step of every sample
    assert summarize(recurrent, [(7, 2, 6)]).total_mult_adds == 7 * 2 * 195
    assert summarize(recurrent, [(7, 6)]).total_mult_adds == 7 * 195  # unbatched: was 7 * 5 * 195


class CrossAttention(nn.Module):
    """nn.MultiheadAttention with keys and values of their own widths and lengths."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(8, 2, kdim=6, vdim=5, batch_first=True)

    def forward(self, query, key, value):
        return self.attention(query, key, value=value, need_weights=False)[0]


def test_attention_projections_are_counted():
    """MultiheadAttention's projections run on its own parameters in functional calls, not
    module calls: torchinfo (and torchkit before) counted 0, a third of a ViT's mult-adds."""
    ours = summarize(CrossAttention(), [(2, 3, 8), (2, 7, 6), (2, 7, 5)])
    q, k, v = 2 * 3, 2 * 7, 2 * 7  # tokens
    expected = q * (8 * 8 + 8) + k * (8 * 6 + 8) + v * (8 * 5 + 8) + q * (8 * 8 + 8)
    assert ours.total_mult_adds == expected
    assert [(row.name, row.mult_adds) for row in ours.layers] == [
        ("", expected),
        ("attention", expected),
    ]
    # torch's FLOPs: 2 per mult-add of the weights (biases add none) plus the attention products
    products = 2 * 2 * 2 * 3 * 7 * 8
    assert ours.flops == 2 * (2 * q * 64 + k * 48 + v * 40) + products


class FunctionalProjection(nn.Module):
    """A Linear's parameters used through F.linear by its parent, as torchvision's Swin does."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x):
        return nn.functional.linear(x, self.qkv.weight, self.qkv.bias)


def test_functional_products_on_parameters_are_counted():
    """qkv is never called as a module: per-leaf counting (torchinfo's) gave 0 mult-adds."""
    for shape in [(2, 5, 8), (10, 8)]:
        ours = summarize(FunctionalProjection(), [shape])
        assert ours.total_mult_adds == 10 * (8 * 24 + 24)
        assert ours.layers[0].mult_adds == ours.total_mult_adds
        assert ours.flops == 2 * 10 * 8 * 24


class OwnProduct(nn.Module):
    """A user's leaf module: its own parameters in a matrix product, one not named weight."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        setattr(self, name, nn.Parameter(torch.randn(24, 8)))
        self.bias = nn.Parameter(torch.zeros(24))

    def forward(self, x):
        return x @ getattr(self, self.name).t() + self.bias


class Holder(nn.Module):
    """OwnProduct with a child it never calls: the same forward, no longer a leaf."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.inner = OwnProduct(name)
        self.unused = nn.Identity()

    def forward(self, x):
        return self.inner.forward(x)


@pytest.mark.parametrize("name", ["w", "weight"])
@pytest.mark.parametrize("shape", [(2, 5, 8), (10, 8)])
def test_a_leaf_modules_own_products_count_every_row(name, shape):
    """Per-sample counting (torchinfo's) gave such a leaf 0 mult-adds for `w` (a name without
    weight or bias) and 2 * 216 for `weight` on 2x5 rows; the same forward in a module with an
    unused child counted every row."""
    expected = 10 * (8 * 24 + 24)
    for model in (OwnProduct(name), Holder(name)):
        ours = summarize(model, [shape])
        assert ours.total_mult_adds == expected
        assert ours.layers[0].mult_adds == expected
        assert ours.flops == 2 * 10 * 8 * 24


@pytest.mark.parametrize(
    ("cell", "gates"), [(nn.LSTMCell(10, 20), 4), (nn.GRUCell(10, 20), 3), (nn.RNNCell(10, 20), 1)]
)
def test_recurrent_cells_count_each_sample_once(cell, gates):
    """A cell's output is (N, H): the per-time-step rule of recurrent layers took it for N
    samples of H steps and counted H = 20 times too many (as torchinfo does)."""
    ours = summarize(cell, [(3, 10)])
    assert ours.total_mult_adds == 3 * gates * 20 * (10 + 20 + 2)  # weights, both biases
    assert torchinfo.summary(cell, input_size=(3, 10), verbose=0).total_mult_adds == (
        20 * ours.total_mult_adds
    )


class OwnConvolution(nn.Module):
    """A user's leaf module convolving with its own parameters (F.conv2d, F.conv_transpose2d)."""

    def __init__(self, name: str, transposed: bool) -> None:
        super().__init__()
        self.name, self.transposed = name, transposed
        setattr(
            self,
            name,
            nn.Parameter(torch.randn(3, 4, 3, 3) if transposed else torch.randn(4, 3, 3, 3)),
        )
        self.bias = nn.Parameter(torch.zeros(4))

    def forward(self, x):
        kernel = getattr(self, self.name)
        if self.transposed:
            return nn.functional.conv_transpose2d(x, kernel, self.bias, stride=2)
        return nn.functional.conv2d(x, kernel, self.bias)


@pytest.mark.parametrize("name", ["kernel", "weight"])
@pytest.mark.parametrize("transposed", [False, True])
def test_a_leaf_modules_own_convolutions_count_every_position(name, transposed):
    """Such a leaf counted 0 (`kernel`) or its parameters once per sample (`weight`)."""
    ours = summarize(OwnConvolution(name, transposed), [(2, 3, 6, 6)])
    if transposed:  # the kernel (4 x 3 x 3 per input channel) at each of the 2 x 3 x 6 x 6 inputs
        weights, outputs = 2 * 3 * 36 * (4 * 9), 2 * 4 * 13 * 13
    else:  # 27 weights at each of the 2 x 4 x 4 x 4 outputs
        weights, outputs = 2 * 4 * 16 * 27, 2 * 4 * 16
    assert ours.total_mult_adds == weights + outputs  # and the bias at every output
    assert ours.flops == 2 * weights


class UncalledChild(nn.Module):
    """A module whose only child never runs: its own output is the activation."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(6, 3))
        self.unused = nn.Identity()

    def forward(self, x):
        return x @ self.w


def test_outputs_of_calls_without_module_calls_inside_count_as_activations():
    """MultiheadAttention calls no submodule (out_proj runs as F.linear): its outputs took no
    memory in the forward/backward size, nor did UncalledChild's (0 bytes)."""
    assert summarize(UncalledChild(), [(2, 6)]).forward_backward_mb == 2 * (2 * 3 * 4) / 1e6
    attention = nn.MultiheadAttention(16, 4, batch_first=True)
    ours = summarize(attention, [(2, 5, 16)] * 3)
    # the output (2, 5, 16) and the head-averaged weights (2, 5, 5), kept and their gradients
    assert ours.forward_backward_mb == 2 * (2 * 5 * 16 + 2 * 5 * 5) * 4 / 1e6


class TokenIntoBlock(nn.Module):
    """A class token expanded to the batch and passed to a submodule, as timm's CaiT does."""

    def __init__(self) -> None:
        super().__init__()
        self.token = nn.Parameter(torch.zeros(1, 1, 8))
        self.block = nn.Linear(8, 8)

    def forward(self, x):
        return self.block(self.token.expand(x.shape[0], -1, -1)) + x


@pytest.mark.parametrize("on_meta", [True, False])
def test_a_parameter_view_passed_to_a_module_is_counted(on_meta):
    """Under no_grad such a view requires grad without a grad_fn, on which the module tracker
    of FlopCounterMode failed: 'Cait cannot run on an input of shape ...: Expected gradient
    function to be set' (exit 2) for a model that runs, in summary and benchmark alike."""
    ours = summarize(TokenIntoBlock(), [(3, 1, 8)], on_meta=on_meta)
    assert ours.flops == 2 * 3 * 8 * 8
    assert ours.total_mult_adds == 3 * (8 * 8 + 8)


class TiedLanguageModel(nn.Module):
    """The head's weight is the embedding's (a tied-weights language model)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        return self.head(self.embed(tokens))


def test_tied_weights_are_counted_once():
    model = TiedLanguageModel()
    ours = summarize(model, [(2, 3)], dtype=torch.long)
    assert ours.total_params == 10 * 4 + 10  # embedding matrix once, plus the head's bias
    assert ours.params_mb == 50 * 4 / 1e6
    assert [(r.name, r.params) for r in ours.layers] == [("", 50), ("embed", 40), ("head", 50)]
    info = torchinfo.summary(model, input_size=(2, 3), dtypes=[torch.long], verbose=0)
    assert info.total_params == 90  # torchinfo counts the shared matrix twice


class SharedLayer(nn.Module):
    """One Linear held by two parents and called twice."""

    def __init__(self) -> None:
        super().__init__()
        shared = nn.Linear(4, 4)
        self.a = nn.Sequential(shared, nn.ReLU())
        self.b = nn.Sequential(shared)

    def forward(self, x):
        return self.b(self.a(x))


def test_shared_module_appears_per_call_and_counts_once():
    ours = summarize(SharedLayer(), [(2, 4)])
    assert ours.total_params == 20
    rows = [(r.depth, r.name, r.type, r.call, r.mult_adds) for r in ours.layers]
    assert rows == [
        (0, "", "SharedLayer", 1, 2 * 2 * 20),
        (1, "a", "Sequential", 1, 2 * 20),
        (2, "a.0", "Linear", 1, 2 * 20),
        (2, "a.1", "ReLU", 1, 0),
        (1, "b", "Sequential", 1, 2 * 20),
        (2, "a.0", "Linear", 2, 2 * 20),  # the second call, under b
    ]
    assert ours.total_mult_adds == 80  # the work is done twice
    assert torchinfo.summary(SharedLayer(), input_size=(2, 4), verbose=0).total_params == 60


class ScaledConv(nn.Module):
    """A parameter held by the parent itself, a frozen layer, and buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.BatchNorm2d(8)
        self.scale = nn.Parameter(torch.ones(8, 1, 1))
        self.act = nn.ReLU(inplace=True)
        self.flat = nn.Flatten()
        self.norm.requires_grad_(False)

    def forward(self, x):
        return self.flat(self.act(self.norm(self.conv(x)) * self.scale))


def test_hand_counts_of_parameters_mult_adds_and_memory():
    ours = summarize(ScaledConv(), [(2, 3, 5, 5)])
    conv_params = 8 * 3 * 9 + 8
    assert ours.total_params == conv_params + 16 + 8
    assert ours.trainable_params == conv_params + 8 and ours.non_trainable_params == 16
    assert ours.layers[0].trainable is False  # the frozen norm: not every parameter trains
    assert ours.layers[0].trainable_params == conv_params + 8
    assert trainable_label(ours.layers[0]) == "partial"
    conv, norm = ours.layers[1], ours.layers[2]
    assert conv.mult_adds == 2 * 5 * 5 * conv_params  # every output position of every sample
    assert norm.mult_adds == 2 * 16  # torchinfo: once per sample
    assert (norm.trainable, norm.trainable_params, trainable_label(norm)) == (False, 0, "no")
    assert (conv.trainable, trainable_label(conv)) == (True, "yes")
    act = next(row for row in ours.layers if row.type == "ReLU")
    assert (act.trainable, act.trainable_params, trainable_label(act)) == (None, 0, None)
    assert ours.total_mult_adds == conv.mult_adds + norm.mult_adds
    assert ours.flops == 2 * (2 * 8 * 5 * 5) * (3 * 9)  # torch counts the convolution only
    assert ours.input_mb == 2 * 3 * 5 * 5 * 4 / 1e6
    assert ours.params_mb == ours.total_params * 4 / 1e6
    assert ours.buffers_mb == (8 + 8) * 4 / 1e6 + 8 / 1e6  # running mean/var + int64 counter
    # New activations: conv and norm outputs (the in-place ReLU and the Flatten view allocate
    # nothing), kept for backward and matched by their gradients.
    assert ours.forward_backward_mb == 2 * 2 * (2 * 8 * 5 * 5 * 4) / 1e6
    assert ours.total_mb == pytest.approx(
        ours.input_mb + ours.forward_backward_mb + ours.params_mb + ours.buffers_mb
    )


class Attention(nn.Module):
    """Matmuls without parameters: only FlopCounterMode sees them."""

    def forward(self, x):
        weights = torch.softmax(x @ x.transpose(1, 2), dim=-1)
        return weights @ x


def test_attention_flops_come_from_the_flop_counter():
    ours = summarize(Attention(), [(2, 6, 4)])
    assert ours.total_mult_adds == 0
    assert ours.flops == 2 * (2 * 2 * 6 * 6 * 4)  # two (6x4)(4x6)-sized products per sample
    assert summarize(Attention(), [(2, 6, 4)], count_flops=False).flops is None


class ReturnsWeightOrig(nn.Module):
    """No operation: the forward returns a parameter, named as a pruned layer's would be."""

    def __init__(self) -> None:
        super().__init__()
        self.weight_orig = nn.Parameter(torch.ones(8, 16))

    def forward(self, x):
        return self.weight_orig


def test_a_parameter_returned_without_an_operation_adds_no_mult_adds():
    """It reported 16,384 mult-adds beside 0 FLOPs: FlopCounterMode's alias of each call's
    output was taken for a read of the parameter."""
    for count_flops in (True, False):
        ours = summarize(ReturnsWeightOrig(), [(3, 4, 4)], count_flops=count_flops)
        assert ours.total_mult_adds == 0 and ours.layers[0].mult_adds == 0
        assert ours.flops == (0 if count_flops else None)


class MultiOutput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.left = nn.Linear(3, 2)
        self.right = nn.Linear(5, 2)

    def forward(self, a, b):
        return {"out": self.left(a), "aux": (self.right(b), None)}


def test_multiple_inputs_and_structured_outputs():
    ours = summarize(MultiOutput(), [(1, 3), (1, 5)])
    assert ours.input_shapes == [[1, 3], [1, 5]]
    assert ours.layers[0].input_shape == [[1, 3], [1, 5]]
    assert ours.layers[0].output_shape == {"out": [1, 2], "aux": [[1, 2], None]}


# --- the user's model is left as it was ------------------------------------------------------


@pytest.mark.parametrize("on_meta", [True, False])
def test_model_is_not_changed_moved_or_kept(on_meta):
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Dropout(), nn.Flatten())
    model.train()
    model[2].eval()  # mixed modes must come back as they were
    modes = [m.training for m in model.modules()]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()

    ours = summarize(model, [(2, 3, 6, 6)], on_meta=on_meta)

    assert [m.training for m in model.modules()] == modes
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert ours.device == "cpu"
    reference = weakref.ref(model)
    del model
    gc.collect()
    assert reference() is None  # the summary holds no reference to it


class ValueDependent(nn.Module):
    """Reads a tensor value, which the meta device cannot give."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x):
        y = self.linear(x)
        return y if y.sum().item() > -1e9 else -y


@pytest.mark.parametrize("make", [ScaledConv, Attention, TiedLanguageModel, SharedLayer])
def test_meta_pass_gives_what_running_the_model_gives(make):
    torch.manual_seed(0)
    model = make()
    shape, dtype = {
        ScaledConv: ((2, 3, 5, 5), None),
        Attention: ((2, 6, 4), None),
        TiedLanguageModel: ((2, 3), torch.long),
        SharedLayer: ((2, 4), None),
    }[make]
    assert summarize(model, [shape], dtype=dtype) == summarize(
        model, [shape], dtype=dtype, on_meta=False
    )


class Lookup(nn.Module):
    """Looks rows up by index, through nn.Embedding or index_select."""

    def __init__(self, through_embedding: bool) -> None:
        super().__init__()
        self.table = nn.Embedding(10, 4)
        self.through_embedding = through_embedding

    def forward(self, indices):
        if self.through_embedding:
            return self.table(indices)
        return self.table.weight.index_select(0, indices.flatten())


@pytest.mark.parametrize("through_embedding", [True, False])
def test_meta_pass_refuses_float_indices_as_running_the_model_does(through_embedding):
    # The meta kernels of index_select (and of embedding on torch 2.11) accept float indices,
    # so the summary of a model that cannot run once exited 0.
    model = Lookup(through_embedding)
    for on_meta in (True, False):
        with pytest.raises(UsageError, match="cannot run on an input of shape") as caught:
            summarize(model, [(2, 5)], dtype=torch.float32, on_meta=on_meta)
        assert "int" in str(caught.value).lower()
    assert summarize(model, [(2, 5)], dtype=torch.long).total_params == 40


def test_value_dependent_model_runs_for_real_and_lazy_model_stays_lazy():
    ours = summarize(ValueDependent(), [(2, 3)])
    assert ours.total_params == 12 and ours.total_mult_adds == 2 * 12
    assert ours.flops == 2 * 2 * 3 * 3
    lazy = nn.Sequential(nn.LazyLinear(4), nn.ReLU())
    ours = summarize(lazy, [(2, 3)])
    assert ours.total_params == 16 and ours.layers[1].params == 16
    assert ours.layers[1].mult_adds == 2 * 16
    # the user's lazy layer is not initialised behind their back
    assert isinstance(lazy[0].weight, nn.parameter.UninitializedParameter)


def test_a_named_model_is_built_on_the_meta_device(monkeypatch):
    # Random weights need no values: vit_h_14's summary took 56 s and 3.2 GB building them
    # (0.5 s and no weight memory on the meta device), for the same numbers.
    devices = []
    kaiming = nn.init.kaiming_normal_

    def spy(tensor, *args, **kwargs):
        devices.append(tensor.device.type)
        return kaiming(tensor, *args, **kwargs)

    monkeypatch.setattr(nn.init, "kaiming_normal_", spy)
    ours = summarize_model("resnet18", input_sizes=[(3, 32, 32)], num_classes=7)
    assert devices and set(devices) == {"meta"}
    real = resolve_model("resnet18", num_classes=7).model
    expected = summarize(real, [(1, 3, 32, 32)]).to_dict()
    assert ours.to_dict() == expected and ours.device == "cpu"
    tree = summarize_model("resnet18", params_only=True).to_dict()
    assert tree["device"] == "cpu" and tree["totals"]["total_params"] == 11_689_512


def test_a_named_model_that_cannot_run_on_the_meta_device_is_built_for_real(monkeypatch):
    monkeypatch.setattr(summary_run, "_named_architecture", lambda spec: True)
    ours = summarize_model(f"{__name__}:ValueDependent", input_sizes=[(3,)], batch_size=2)
    assert ours.total_params == 12 and ours.total_mult_adds == 2 * 12 and ours.device == "cpu"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_model_on_gpu_stays_there():
    model = nn.Sequential(nn.Linear(3, 2)).cuda()
    ours = summarize(model, [(4, 3)])
    assert ours.device.startswith("cuda") and next(model.parameters()).is_cuda


def test_a_failing_forward_pass_is_a_usage_error_and_leaves_no_hooks():
    model = nn.Sequential(nn.Linear(3, 2))
    with pytest.raises(UsageError, match=r"cannot run on an input of shape \(1, 4\)"):
        summarize(model, [(1, 4)])
    assert not model[0]._forward_hooks and not model[0]._forward_pre_hooks


# --- input sizes ---------------------------------------------------------------------------


def test_input_size_parsing_and_batch():
    assert parse_input_size("3,224,224") == parse_input_size("3x224x224") == (3, 224, 224)
    assert parse_input_size("(1, 3, 8, 8)") == (1, 3, 8, 8)
    with pytest.raises(UsageError):
        parse_input_size("3,a,4")
    with pytest.raises(UsageError):
        parse_input_size("3,0,4")
    with pytest.raises(UsageError):
        parse_input_size("3,x,4")
    assert full_shapes([(3, 8, 8)], None, image_model=True) == [(1, 3, 8, 8)]
    assert full_shapes([(2, 3, 8, 8)], None, image_model=True) == [(2, 3, 8, 8)]
    assert full_shapes([(3, 8, 8)], 4, image_model=True) == [(4, 3, 8, 8)]
    assert full_shapes([(5,)], 2, image_model=False) == [(2, 5)]
    with pytest.raises(UsageError, match="contradicts"):
        full_shapes([(2, 3, 8, 8)], 4, image_model=True)
    with pytest.raises(UsageError, match="C,H,W or N,C,H,W"):
        full_shapes([(8, 8)], None, image_model=True)


# --- the command ---------------------------------------------------------------------------


def invoke_json(runner, *args):
    result = runner.invoke(app, ["summary", *args, "--format", "json"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_json_output_of_a_named_model(runner):
    data = invoke_json(runner, "resnet18", "--input-size", "3", "32", "32", "--depth", "1")
    assert set(data) == {
        "model", "input_shapes", "inputs", "dtype", "device", "layers", "totals", "notes"
    }  # fmt: skip
    assert data["input_shapes"] == [[1, 3, 32, 32]] and data["dtype"] == "float32"
    assert data["inputs"] == [{"name": None, "shape": [1, 3, 32, 32], "dtype": "float32"}]
    assert data["notes"] == []
    assert set(data["totals"]) == {
        "total_params",
        "trainable_params",
        "non_trainable_params",
        "total_mult_adds",
        "flops",
        "input_mb",
        "forward_backward_mb",
        "attention_mb",
        "largest_attention_mb",
        "params_mb",
        "buffers_mb",
        "total_mb",
    }
    assert data["totals"]["total_params"] == 11_689_512  # torchvision's documented count
    assert max(layer["depth"] for layer in data["layers"]) == 1
    assert [layer["name"] for layer in data["layers"][:3]] == ["", "conv1", "bn1"]
    assert data["layers"][1] == {
        "index": 1,
        "depth": 1,
        "name": "conv1",
        "type": "Conv2d",
        "input_shape": [1, 3, 32, 32],
        "output_shape": [1, 64, 16, 16],
        "params": 9408,
        "trainable_params": 9408,
        "trainable": True,
        "mult_adds": 9408 * 16 * 16,
        "call": 1,
        "leaf": True,
    }
    # N,C,H,W is taken as it is: a batch of 2 doubles the work
    double = invoke_json(runner, "resnet18", "-i", "2,3,32,32", "--depth", "0")
    assert double["input_shapes"] == [[2, 3, 32, 32]] and len(double["layers"]) == 1
    assert double["totals"]["total_mult_adds"] == 2 * data["totals"]["total_mult_adds"]


def test_json_types_of_every_field(runner):
    """Booleans are booleans, counts integers, sizes floats, an unmeasured value null."""
    data = invoke_json(runner, "convnet", "-i", "1,12,12", "--no-flops")
    assert isinstance(data["model"], str) and isinstance(data["dtype"], str)
    assert data["input_shapes"] == [[1, 1, 12, 12]]
    layer_types = {
        "index": int, "depth": int, "name": str, "type": str, "params": int,
        "trainable_params": int, "mult_adds": int, "call": int, "leaf": bool,
    }  # fmt: skip
    for layer in data["layers"]:
        assert set(layer) == {*layer_types, "trainable", "input_shape", "output_shape"}
        for key, kind in layer_types.items():
            assert type(layer[key]) is kind, (key, layer)
        assert layer["trainable"] in (True, False, None)
        assert (layer["trainable"] is None) == (layer["params"] == 0)
        assert isinstance(layer["output_shape"], list)
    assert any(layer["trainable"] is True for layer in data["layers"])
    totals = data["totals"]
    for key in ("total_params", "trainable_params", "non_trainable_params", "total_mult_adds"):
        assert type(totals[key]) is int, key
    for key in ("input_mb", "forward_backward_mb", "params_mb", "buffers_mb", "total_mb"):
        assert type(totals[key]) is float, key
    assert totals["flops"] is None  # --no-flops: not measured
    listing = json.loads(runner.invoke(app, ["summary", "--list", "--format", "json"]).stdout)
    assert all(isinstance(name, str) for name in listing["models"])


def test_a_frozen_layer_is_false_in_json_and_no_in_the_table(runner, tmp_path, monkeypatch):
    (tmp_path / "frozen_net.py").write_text(
        "from torch import nn\n"
        "def build():\n"
        "    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten())\n"
        "    net[1].requires_grad_(False)\n"
        "    return net\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    data = invoke_json(runner, "frozen_net:build", "-i", "3,5,5")
    by_name = {layer["name"]: layer for layer in data["layers"]}
    assert by_name[""]["trainable"] is False and by_name[""]["trainable_params"] == 4 * 27 + 4
    assert by_name["0"]["trainable"] is True and by_name["1"]["trainable"] is False
    assert by_name["2"]["trainable"] is None  # Flatten has no parameters
    table = runner.invoke(app, ["summary", "frozen_net:build", "-i", "3,5,5"])
    assert table.exit_code == 0, table.stderr
    rows = {line.split("│")[1].strip(): line for line in table.stdout.splitlines() if "│" in line}
    assert "partial" in rows["Sequential"] and " no " in rows["1 (BatchNorm2d)"]
    assert " yes " in rows["0 (Conv2d)"]


def test_table_and_csv_output(runner, tmp_path):
    table = runner.invoke(app, ["summary", "convnet", "-i", "1,12,12", "--num-classes", "3"])
    assert table.exit_code == 0, table.stderr
    for text in ("ConvNet on input 1×1×12×12", "Total params", "FLOPs", "Linear", "1×3"):
        assert text in table.stdout
    out = tmp_path / "layers.csv"
    result = runner.invoke(app, ["summary", "convnet", "--format", "csv", "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    lines = out.read_text().splitlines()
    assert lines[0] == "depth,name,type,input_shape,output_shape,params,trainable,mult_adds,call"
    assert lines[1].startswith('0,"",ConvNet,"[1, 3, 28, 28]","[1, 10]",')  # the root: name ''
    params = sum(p.numel() for p in resolve_model("convnet").model.parameters())
    assert lines[-1].startswith(f",(total),,,,{params},")
    again = runner.invoke(app, ["summary", "convnet", "--format", "csv", "-o", str(out)])
    assert again.exit_code == 1 and "already exists" in again.stderr


def test_a_total_a_hair_under_a_million_reads_one_million(runner, tmp_path, monkeypatch):
    """999,997 mult-adds (a Linear of 999,996 inputs and its bias) read "(1000.00 k)"."""
    (tmp_path / "wide_net.py").write_text(
        "from torch import nn\ndef build():\n    return nn.Linear(999_996, 1)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    table = runner.invoke(app, ["summary", "wide_net:build", "-i", "999996", "--no-flops"])
    assert table.exit_code == 0, table.stderr
    assert "999,997 (1.00 M)" in table.stdout


def test_a_total_under_a_thousand_is_shown_once(runner, tmp_path, monkeypatch):
    """A Linear(4, 3) of 15 mult-adds and 24 FLOPs: its totals read "15 (15)", "24 (24)"."""
    (tmp_path / "small_net.py").write_text(
        "from torch import nn\ndef build():\n    return nn.Linear(4, 3)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    table = runner.invoke(app, ["summary", "small_net:build", "-i", "4"])
    assert table.exit_code == 0, table.stderr
    totals = {
        cells[1].strip(): cells[2].strip()
        for cells in (line.split("│") for line in table.stdout.splitlines())
        if len(cells) == 4
    }
    assert (totals["Total mult-adds"], totals["FLOPs (FlopCounterMode)"]) == ("15", "24")


class OptionalTargets(nn.Module):
    """Passes None beside a tensor, as a detection model passes its absent targets."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Identity()

    def forward(self, x):
        return self.inner((x, None))


def test_none_inside_a_shape_is_shown_in_the_table(runner):
    table = runner.invoke(app, ["summary", f"{__name__}:OptionalTargets", "-i", "3"])
    assert table.exit_code == 0, table.stderr
    assert "[1×3, None]" in table.stdout and "[1×3, ]" not in table.stdout


def test_checkpoint_model_uses_its_image_size(runner, tmp_path):
    path = tmp_path / "best.pt"
    model = write_convnet_checkpoint(path, in_channels=1, image_size=10, classes="abcd")
    data = invoke_json(runner, str(path))
    assert data["input_shapes"] == [[1, 1, 10, 10]]
    assert data["layers"][0]["output_shape"] == [1, 4]
    state_dict = tmp_path / "weights.pt"
    torch.save(model.state_dict(), state_dict)
    refused = runner.invoke(app, ["summary", str(state_dict)])
    assert refused.exit_code == 2 and f"MODEL --weights {state_dict}" in refused.stderr
    loaded = invoke_json(
        runner, "convnet", "--weights", str(state_dict), "--num-classes", "4", "-i", "1,10,10"
    )
    assert loaded["totals"]["total_params"] == data["totals"]["total_params"]


def test_a_checkpoint_on_another_input_size_names_the_one_it_was_trained_on(runner, tmp_path):
    """The convnet's classifier is sized for the images it was trained on: another size failed
    with 'mat1 and mat2 shapes cannot be multiplied' and 'check --input-size (and --dtype)'."""
    path = tmp_path / "best.pt"
    write_convnet_checkpoint(path, in_channels=1, image_size=10, classes="abcd")
    hint = f"({path}'s convnet was trained on 1,10,10 inputs: give -i 1,10,10, or leave out "
    hint += "--input-size for them)"
    for given in (["-i", "1,10,14"], ["--image-size", "12"]):
        result = runner.invoke(app, ["summary", str(path), *given])
        assert result.exit_code == 2
        assert "mat1 and mat2 shapes cannot be multiplied" in result.stderr
        assert error_line(result.stderr).endswith(hint)
    assert invoke_json(runner, str(path), "-i", "1,10,10")["input_shapes"] == [[1, 1, 10, 10]]
    # the wrong channels are told as such, not as the size
    channels = runner.invoke(app, ["summary", str(path), "-i", "3,10,10"])
    assert error_line(channels.stderr).endswith("give C,H,W as 1,10,10)")


def two_inputs() -> nn.Module:
    return MultiOutput()


def test_callable_model_with_two_inputs_and_dtype(runner):
    data = invoke_json(runner, f"{__name__}:two_inputs", "-i", "3", "-i", "5", "--dtype", "float64")
    assert data["input_shapes"] == [[1, 3], [1, 5]] and data["dtype"] == "float64"
    assert data["totals"]["params_mb"] == (3 * 2 + 2 + 5 * 2 + 2) * 8 / 1e6
    # no input size known: parameters only, with a note on stderr saying what -i would add
    tree = runner.invoke(app, ["summary", f"{__name__}:two_inputs", "--format", "json"])
    assert tree.exit_code == 0 and "mult-adds" in tree.stderr and "--input-size" in tree.stderr
    tree_data = json.loads(tree.stdout)
    assert tree_data["totals"]["total_params"] == 3 * 2 + 2 + 5 * 2 + 2
    assert tree_data["totals"]["total_mult_adds"] is None and tree_data["inputs"] == []


def test_list_models(runner):
    data = json.loads(runner.invoke(app, ["summary", "--list", "--format", "json"]).stdout)
    assert {"resnet50", "vit_b_16", "convnet"} <= set(data["models"])


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["resnet19"], 2, "unknown model 'resnet19'"),
        ([], 2, "give a MODEL"),
        (["convnet", "-i", "3,x,4"], 2, "invalid input size"),
        (["convnet", "-i", "3,,4"], 2, "invalid input size"),
        (["convnet", "-i", "3", "5", "-i", "4"], 2, "which input size"),
        (["convnet", "-i", "2,3,28,28", "-b", "4"], 2, "contradicts"),
        (["resnet18", "-i", "1,32,32"], 2, "cannot run on an input of shape (1, 1, 32, 32)"),
        (["convnet", "--dtype", "float8"], 2, "unknown dtype"),
        (["missing/best.pt"], 1, "checkpoint not found"),
    ],
)
def test_errors_are_one_line(runner, args, code, message):
    result = runner.invoke(app, ["summary", *args])
    assert result.exit_code == code, result.stderr
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_random_weights_are_a_note_after_the_summary(runner, tmp_path):
    """Before: nothing said the model had random weights (export warned, predict refused)."""
    random = runner.invoke(app, ["summary", "convnet", "--params-only", "--format", "json"])
    assert random.exit_code == 0, random.stderr
    assert random.stderr.splitlines() == [
        "Note: convnet has random weights (no --weights given): fine for a summary (shapes and "
        "counts do not depend on them)"
    ]
    assert json.loads(random.stdout)["notes"] == []  # a remark on the run, not the summary's
    weights = tmp_path / "weights.pt"
    torch.save(resolve_model("convnet").model.state_dict(), weights)
    trained = runner.invoke(app, ["summary", "convnet", "--weights", str(weights)])
    assert trained.exit_code == 0, trained.stderr
    assert "random weights" not in trained.stderr


def test_d_is_no_longer_listed_but_old_scripts_still_run(runner, _torchkit_command):
    """-d is --data in train and eval: --depth lists no short flag, and `-d N` (its short flag
    before) still means --depth N, unlisted. Before: --help listed -d for --depth."""
    params = _torchkit_command.commands["summary"].params
    (depth,) = [p for p in params if "--depth" in p.opts]
    assert depth.opts == ["--depth"]
    assert all(p.hidden for p in params if "-d" in p.opts)
    args = ["summary", "convnet", "--params-only", "--format", "json"]
    short = runner.invoke(app, [*args, "-d", "0"])
    assert short.exit_code == 0, short.stderr
    assert short.stdout == runner.invoke(app, [*args, "--depth", "0"]).stdout
    assert len(json.loads(short.stdout)["layers"]) == 1  # the model's own row only
    both = runner.invoke(app, [*args, "-d", "0", "--depth", "1"])
    assert both.exit_code == 2
    message = "Error: --depth is given twice (also as -d) (give --depth once)"
    assert error_line(both.stderr) == message


def test_truncated_checkpoint(runner, tmp_path):
    path = tmp_path / "cut.pt"
    torch.save({"model": {"w": torch.ones(100)}}, path)
    path.write_bytes(path.read_bytes()[:50])
    result = runner.invoke(app, ["summary", str(path)])
    assert result.exit_code == 1 and "cannot read checkpoint" in result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_cuda_device_without_cuda(runner):
    result = runner.invoke(app, ["summary", "convnet", "--device", "cuda"])
    assert result.exit_code == 1 and "CUDA is not available" in result.stderr


def test_a_head_num_classes_replaces_is_a_warning_on_stderr(runner, tmp_path):
    """--num-classes on a checkpoint of another class count summarised a model with a new,
    random head and said nothing: its figures were not those of the checkpoint's model."""
    path = tmp_path / "best.pt"
    write_convnet_checkpoint(path, in_channels=1, image_size=10, classes="abcd")
    result = runner.invoke(app, ["summary", str(path), "--num-classes", "7", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["layers"][0]["output_shape"] == [1, 7]
    assert result.stderr.count("Warning: --num-classes 7 replaced the head of ") == 1
    assert "(4 outputs)" not in result.stderr and ": 4 outputs) with a new" in result.stderr
    same = runner.invoke(app, ["summary", str(path), "--num-classes", "4", "--format", "json"])
    assert same.exit_code == 0 and "Warning" not in same.stderr
