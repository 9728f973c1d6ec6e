"""`summary` against torchinfo 1.8.0 on the models users bring to it: tied weights, a frozen
part, a module called twice, a LazyLinear, LSTM and RNN layers, depthwise and transposed
convolutions, timm's ConvNeXt and ViT; and against the figures torchvision publishes for its
weights (parameters and GFLOPs at the size they were trained at). Where torchkit's figure is not
torchinfo's, the test says which is right and why (docs/commands/summary.md lists them)."""

from __future__ import annotations

import math

import pytest
import torch
import torchinfo
from torch import nn

from torchkit.core.summary import summarize


class TiedLanguageModel(nn.Module):
    """An embedding shared with the output layer (one 10x6 matrix, 60 parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 6)
        self.head = nn.Linear(6, 10, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens))


class FrozenBackbone(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
        self.head = nn.Linear(4, 2)
        self.body.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).mean((2, 3)))


class CalledTwice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(5, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.fc(x)))


class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(6, 5, num_layers=2, batch_first=True)
        self.rnn = nn.RNN(5, 4, batch_first=True)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, _ = self.lstm(x)
        x, _ = self.rnn(x)
        return self.head(x[:, -1])


class DepthwiseUp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.pointwise = nn.Conv2d(8, 4, 1)
        self.up = nn.ConvTranspose2d(4, 2, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(self.pointwise(self.depthwise(x)))


def _both(model: nn.Module, shape: tuple[int, ...], dtype: torch.dtype = torch.float32):
    """torchkit's summary and torchinfo's of `model` on one input of `shape`."""
    if dtype.is_floating_point:
        ours = summarize(model, [shape])
    else:
        ours = summarize(model, inputs=[torch.zeros(shape, dtype=dtype)])
    theirs = torchinfo.summary(model, input_size=shape, dtypes=[dtype], verbose=0, depth=100)
    return ours, theirs


def _leaves(ours, theirs) -> tuple[list, list]:
    """(type, first output shape, parameters) of each leaf call, in call order, of both."""
    mine = []
    for row in ours.layers:
        if row.leaf:
            shape = row.output_shape
            first = shape[0] if isinstance(shape[0], list) else shape  # an RNN's (output, state)
            mine.append((row.type, first, row.params))
    other = [
        (layer.class_name, list(layer.output_size), layer.num_params)
        for layer in theirs.summary_list
        if layer.is_leaf_layer
    ]
    return mine, other


@pytest.mark.parametrize(
    "build, shape",
    [(FrozenBackbone, (2, 3, 8, 8)), (CalledTwice, (2, 5)), (Recurrent, (2, 7, 6))],
)
def test_agrees_with_torchinfo_where_torchinfo_is_right(build, shape):
    """A frozen part, a module called twice (its work counted per call, its parameters once),
    stacked LSTM and RNN layers (every weight at every step of every sample)."""
    model = build()
    ours, theirs = _both(model, shape)
    assert ours.total_params == theirs.total_params == sum(p.numel() for p in model.parameters())
    assert ours.trainable_params == theirs.trainable_params
    assert ours.total_mult_adds == theirs.total_mult_adds
    assert round(ours.params_mb * 1e6) == theirs.total_param_bytes
    mine, other = _leaves(ours, theirs)
    assert mine == other
    if build is FrozenBackbone:
        assert (ours.trainable_params, ours.non_trainable_params) == (10, 120)
    if build is CalledTwice:
        assert [row.call for row in ours.layers if row.leaf] == [1, 2]
        assert ours.total_mult_adds == 2 * 2 * 30
    if build is Recurrent:  # 2 samples x 7 steps x the LSTM's 500 and the RNN's 44, the head
        assert ours.total_mult_adds == 14 * (500 + 44) + 2 * 10


def test_tied_weights_count_once():
    """torchinfo counts the shared matrix under both modules: 120 parameters of 480 bytes;
    `model.parameters()` has 60 (torchinfo issues #303, #377). Its work is counted per call, as
    each layer's: the embedding once per sample (torchinfo's rule), the head once per token
    (torchinfo counts it once per sample, its Linear-on-3-D undercount)."""
    model = TiedLanguageModel()
    ours, theirs = _both(model, (2, 3), torch.long)
    assert ours.total_params == 60 == sum(p.numel() for p in model.parameters())
    assert theirs.total_params == 120 and theirs.total_param_bytes == 480
    assert round(ours.params_mb * 1e6) == 240
    assert ours.total_mult_adds == 2 * 60 + 2 * 3 * 60
    assert theirs.total_mult_adds == 2 * 60 + 2 * 60
    mine, other = _leaves(ours, theirs)
    assert mine == other  # each module's row shows its 60 parameters, in both


def test_lazy_layers_are_counted_as_the_input_sizes_them():
    """An uninitialised LazyLinear and LazyConv2d: their size comes from the input (3 -> 4
    channels, 4 x 4 x 4 -> 3 features); the model itself stays lazy."""
    model = nn.Sequential(nn.LazyConv2d(4, 3), nn.Flatten(), nn.LazyLinear(3))
    ours = summarize(model, [(2, 3, 6, 6)])
    assert type(model[2]) is nn.LazyLinear  # not materialised by the summary
    conv, linear = 3 * 4 * 9 + 4, 64 * 3 + 3
    assert ours.total_params == conv + linear
    assert ours.total_mult_adds == 2 * 16 * conv + 2 * linear
    # torchinfo runs the model for real, which materialises it: its figures then agree
    theirs = torchinfo.summary(model, input_size=(2, 3, 6, 6), verbose=0)
    assert (theirs.total_params, theirs.total_mult_adds) == (
        ours.total_params,
        ours.total_mult_adds,
    )


def test_depthwise_and_transposed_convolutions():
    """The depthwise convolution (groups = channels) agrees; the transposed one's kernel works at
    each of its 6 x 6 input positions, where torchinfo counts its 13 x 13 output positions."""
    model = DepthwiseUp()
    ours, theirs = _both(model, (2, 8, 6, 6))
    assert ours.total_params == theirs.total_params == 80 + 36 + 74
    mine, other = _leaves(ours, theirs)
    assert mine == other  # shapes and parameters, output [2, 2, 13, 13]
    depthwise, pointwise, up = (row.mult_adds for row in ours.layers if row.leaf)
    assert (depthwise, pointwise) == (2 * 36 * 80, 2 * 36 * 36)
    up_weight, up_bias = 4 * 2 * 9, 2
    assert up == 2 * 36 * up_weight + 2 * 169 * up_bias
    torchinfo_up = 2 * 169 * (up_weight + up_bias)
    assert theirs.total_mult_adds == depthwise + pointwise + torchinfo_up
    assert ours.flops == 2 * (2 * 36 * (8 * 9 + 4 * 8) + 2 * 36 * up_weight)


def test_timm_convnext_and_vit():
    """timm's ConvNeXt (its MLP as 1x1 convolutions) agrees exactly; timm's ViT agrees but for
    its Linear layers on (batch, tokens, features), counted once per token (torchinfo: once per
    sample). The parameter bytes count the layer-scale `gamma`s and the class token and position
    embedding, which belong to no leaf module, and which torchinfo leaves out."""
    from timm.models.convnext import ConvNeXt
    from timm.models.vision_transformer import VisionTransformer

    convnext = ConvNeXt(depths=(1, 1, 1, 1), dims=(8, 8, 8, 8), num_classes=3, conv_mlp=True)
    ours, theirs = _both(convnext, (1, 3, 32, 32))
    assert ours.total_params == theirs.total_params
    assert ours.total_mult_adds == theirs.total_mult_adds
    assert _leaves(ours, theirs)[0] == _leaves(ours, theirs)[1]
    gammas = sum(p.numel() for n, p in convnext.named_parameters() if n.endswith("gamma"))
    assert gammas and round(ours.params_mb * 1e6) == theirs.total_param_bytes + 4 * gammas

    vit = VisionTransformer(
        img_size=16, patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=3
    )
    ours, theirs = _both(vit, (2, 3, 16, 16))
    assert ours.total_params == theirs.total_params
    mine, other = _leaves(ours, theirs)
    assert mine == other
    corrected = 0
    for layer in theirs.summary_list:
        if not layer.is_leaf_layer:
            continue
        if isinstance(layer.module, nn.Linear) and len(layer.output_size) == 3:
            corrected += math.prod(layer.output_size[:-1]) * layer.num_params  # every token
        else:
            corrected += layer.macs
    assert ours.total_mult_adds == corrected > theirs.total_mult_adds
    outside_leaves = vit.cls_token.numel() + vit.pos_embed.numel()
    assert round(ours.params_mb * 1e6) == theirs.total_param_bytes + 4 * outside_leaves


# two models of the card figures checked by hand (resnet18, mobilenet_v3_small, efficientnet_b0,
# convnext_tiny and swin_t agree as well): each costs a forward pass at 224
@pytest.mark.parametrize("name", ["squeezenet1_1", "vit_b_16"])
def test_published_torchvision_figures_at_the_trained_size(name):
    """torchvision's model cards give each weight's parameters and GFLOPS (counted as
    multiply-adds of every matmul and convolution, ViT's attention products included) at the
    size it was trained at (224 here): the summary's parameters and FLOPs / 2 are those."""
    import torchvision
    from torchvision.models import get_model_weights

    card = get_model_weights(name).DEFAULT.meta
    with torch.device("meta"):  # shapes only: no 86M values to initialise
        model = torchvision.models.get_model(name)
    ours = summarize(model, [(1, 3, 224, 224)])
    assert ours.total_params == card["num_params"]
    assert round(ours.flops / 2e9, 3) == card["_ops"]
    if name == "vit_b_16":  # per-module counting misses the attention products: 12 layers of
        # q @ k^T and attn @ v over 197 tokens of 768 features
        attention = 12 * 2 * 197 * 197 * 768
        assert ours.flops / 2 - ours.total_mult_adds == pytest.approx(attention, rel=0.05)
