"""The attention matrices summary's counter finds (core/summary/attention.py), and the memory
checks of `export` and `benchmark` that count them: heads x tokens x tokens per sample at each
attention call, a tensor that is no layer's output."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from output_checks import error_line
from torch import nn

from torchkit.core.benchmark import run as bench_run
from torchkit.core.benchmark.run import BenchmarkOptions, benchmark_model
from torchkit.core.export import run as export_run
from torchkit.core.io.errors import TorchkitError, UsageError
from torchkit.core.runtime import memory
from torchkit.core.summary import summarize

# A ViT's blocks in four ways to compute attention: the ways torch's modules and functions do
# it, and by hand, as many users' and timm's models write it.
BLOCKS = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, how, channels, heads):
        super().__init__()
        self.how, self.heads = how, heads
        self.attention = nn.MultiheadAttention(channels, heads, batch_first=True)
        self.qkv = nn.Linear(channels, 3 * channels)

    def forward(self, tokens):
        if self.how == "mha":  # torchvision's ViT
            return tokens + self.attention(tokens, tokens, tokens, need_weights=False)[0]
        if self.how == "mha-weights":
            return tokens + self.attention(tokens, tokens, tokens)[0]
        batch, count, channels = tokens.shape
        q, k, v = self.qkv(tokens).reshape(batch, count, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        if self.how == "sdpa":
            mixed = nn.functional.scaled_dot_product_attention(q, k, v)
        else:  # by hand: a scaled product of queries and keys, then a softmax
            scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
            mixed = scores.softmax(dim=-1) @ v
        return tokens + mixed.transpose(1, 2).reshape(batch, count, channels)


class Vit(nn.Module):
    """8 px patches of 8 channels, `depth` blocks of 2 heads."""

    def __init__(self, how="by-hand", depth=2):
        super().__init__()
        self.patches = nn.Conv2d(3, 8, 8, stride=8)
        self.blocks = nn.Sequential(*[Block(how, 8, 2) for _ in range(depth)])
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        tokens = self.patches(x).flatten(2).transpose(1, 2)
        return self.head(self.blocks(tokens).mean(1))


def by_hand():
    return Vit("by-hand")
'''
HEADS = 2
# benchmarks/bench_export_memory.py's thin ViTs (its MODELS), as measured there
_BENCHMARK_VITS = (
    (Path(__file__).parents[2].joinpath("benchmarks", "bench_export_memory.py").read_text())
    .split('MODELS = """', 1)[1]
    .split('"""', 1)[0]
)
KINDS = {"mha": "mha", "mha-weights": "explicit", "sdpa": "sdpa", "by-hand": "explicit"}


@pytest.fixture(scope="module")
def vits(tmp_path_factory) -> dict:
    """The module's namespace, and its folder (importable as `attentionvits`)."""
    root = tmp_path_factory.mktemp("vits")
    (root / "attentionvits.py").write_text(textwrap.dedent(BLOCKS), encoding="utf-8")
    namespace: dict = {}
    exec(BLOCKS, namespace)
    return {"root": root, **namespace}


def matrix_bytes(side: int, batch: int = 1) -> int:
    """One call's matrix by hand: batch x heads x tokens^2 x 4 bytes (8 px patches)."""
    tokens = (side // 8) ** 2
    return batch * HEADS * tokens * tokens * 4


@pytest.mark.parametrize("how", list(KINDS))
def test_each_attention_call_makes_one_matrix_the_counter_finds(vits, how):
    """Before: export counted the matrices of F.scaled_dot_product_attention and
    nn.MultiheadAttention only, and attention written by hand (`q @ k.transpose(-2, -1)`, a
    scale, a softmax) not at all: its product is no layer's output. Now every way, once per
    call (the softmax's input and output are the same matrix, counted once), at 2 images."""
    model = vits["Vit"](how, depth=3).eval()
    counted = summarize(model, [(2, 3, 64, 64)], count_flops=False)
    matrix = matrix_bytes(64, batch=2)  # 64 tokens: 2 x 2 x 64 x 64 x 4 = 65,536 bytes
    assert [(m.bytes, m.kind) for m in counted.attention.matrices] == [(matrix, KINDS[how])] * 3
    assert counted.attention.total() == 3 * matrix
    assert counted.attention.largest() == matrix


def test_a_real_run_counts_the_fused_kernels_matrix_from_its_shapes(vits):
    """A model the meta device cannot run is run for real, where F.scaled_dot_product_attention
    is one fused operation: its matrix from the query's and key's shapes, as on meta."""
    model = vits["Vit"]("sdpa", depth=2).eval()
    counted = summarize(model, [(2, 3, 32, 32)], count_flops=False, on_meta=False)
    assert counted.attention.total() == 2 * matrix_bytes(32, batch=2)


def test_a_product_of_activations_without_a_softmax_is_no_attention_matrix():
    """A Gram matrix (features x features^T) is a product of activations, not softmaxed."""

    class Gram(nn.Module):
        def forward(self, x):
            features = x.flatten(2)
            return (features @ features.transpose(1, 2)).flatten(1)

    assert summarize(Gram(), [(2, 3, 8, 8)], count_flops=False).attention.total() == 0


def _refusal_of_benchmark(model, side, batch, mode="infer"):
    opts = BenchmarkOptions(batch_sizes=(batch,), mode=mode, device="cpu", warmup=0, iters=1)
    with pytest.raises(TorchkitError) as refused:
        benchmark_model(model, (3, side, side), opts)
    return refused.value


def test_benchmark_counts_the_matrix_an_inference_holds(vits, monkeypatch):
    """Before: a ViT at a large input passed benchmark's check with the images and one layer's
    call alone, while its inference holds a heads x N x N matrix at each block (torchvision's
    vit at 768 px, 64 channels, 2,305 tokens, -b 2: a peak of 201 MB, 170 MB of it the
    matrix) and so ran into the kernel's OOM killer. At 512 px, 4,096 tokens: 134 MB an
    image of matrix, beside 3.1 MB of image and 1.6 MB of layer call."""
    side, batch = 512, 8
    model = vits["by_hand"]().eval()
    image = 3 * side * side * 4
    matrix = matrix_bytes(side)
    counted = summarize(model, [(1, 3, side, side)], count_flops=False)
    assert counted.largest_call_mb * 1e6 < matrix / 50
    needed = batch * (image + matrix)  # 1.1 GB
    monkeypatch.setattr(bench_run, "available_memory", lambda: needed - 1)
    refusal = _refusal_of_benchmark(model, side, batch)
    assert refusal.message == (
        f"Vit in infer mode at batch {batch} needs at least {needed / 1e9:,.1f} GB (the input "
        "batch and its largest attention matrix), more than the 1.1 GB of memory available"
    )
    assert refusal.hint == (
        "give a smaller --batch-size, or find the largest that fits with --find-batch-size"
    )
    assert refusal.exit_code == 2  # a usage error, as export's refusal


@pytest.mark.parametrize(("how", "kept"), [("by-hand", True), ("sdpa", False)])
def test_benchmark_training_counts_the_matrices_autograd_keeps(vits, monkeypatch, how, kept):
    """Attention by hand keeps each block's softmax for the backward pass (measured, 768 px,
    -b 2: +175 MB a block, one matrix); F.scaled_dot_product_attention's fused CPU kernel
    keeps none (its peak did not grow with them), and is not counted."""
    side, batch = 256, 8
    model = vits["Vit"](how, depth=2)
    counted = summarize(model, [(1, 3, side, side)], count_flops=False)
    activations = counted.input_mb * 1e6 + counted.forward_backward_mb * 1e6 / 2
    matrices = 2 * matrix_bytes(side)  # two blocks
    needed = batch * (activations + (matrices if kept else 0))
    monkeypatch.setattr(bench_run, "available_memory", lambda: needed - 1)
    refusal = _refusal_of_benchmark(model, side, batch, mode="train")
    what = "the activations kept for backward" + (" and their attention matrices" if kept else "")
    assert refusal.message.startswith(
        f"Vit in train mode at batch {batch} needs at least {needed / 1e9:,.1f} GB ({what})"
    )


def test_export_and_benchmark_count_the_same_matrix(vits, runner, monkeypatch):
    """One counter for both: at 512 px and 10 images, benchmark's infer check and torch.export's
    count name the same largest attention matrix, 10 x 2 heads x 4,096^2 x 4 bytes (1.3 GB).
    Before: benchmark counted none, and .pt2 every block's at once."""
    from torchkit.cli import app

    side, largest = 512, 10
    matrix = matrix_bytes(side, batch=largest)
    monkeypatch.setattr(memory, "available_memory", lambda: 1_000_000_000)
    monkeypatch.setattr(bench_run, "available_memory", lambda: 1_000_000_000)
    monkeypatch.chdir(vits["root"])
    monkeypatch.syspath_prepend(str(vits["root"]))
    out = vits["root"] / "vit.pt2"
    # -b 8 verifies at 8 and 10 images: 10 counted
    args = ["export", "attentionvits:by_hand", str(out), "--image-size", str(side), "-b", "8"]
    exported = runner.invoke(app, args)
    assert exported.exit_code == 2, exported.stdout
    assert f"plus 2 x {matrix / 1e9:,.1f} GB for their largest attention matrix" in (
        error_line(exported.stderr)
    )
    assert not out.exists()
    refusal = _refusal_of_benchmark(vits["by_hand"]().eval(), side, largest)
    images = largest * 3 * side * side * 4
    assert f"needs at least {(images + matrix) / 1e9:,.1f} GB (the input batch and its " in (
        refusal.message
    )


@pytest.mark.parametrize("depth", [1, 4, 12])
def test_a_pt2_export_counts_one_blocks_matrix_at_any_depth(vits, depth):
    """Before: torch.export's count took every block's matrix with the largest call, while its
    peak grows little with depth: a thin ViT (64 channels, 4 heads, 224 px, -b 64) held 1.78x
    the count at 1 block, 0.89x at 4, 0.41x at 12. Now 1.6 x (images and one layer's call) and
    4 x the largest matrix, the same at every depth: 0.88x, 0.82x, 0.76x (docs/commands/
    export.md); then the matrix of nn.MultiheadAttention once (its inference fast path in the
    reference pass holds one; see the next test)."""
    side, largest = 64, 66
    model = vits["Vit"]("mha", depth=depth).eval()
    call, attention, outputs = export_run._per_image_bytes(model, (3, side, side))
    assert attention.total() == depth * matrix_bytes(side)
    needed = export_run.export_memory_needed(
        (3, side, side),
        largest,
        call,
        fmt="exported-program",
        attention_bytes=attention.total(),
        output_bytes=outputs,
        largest_attention_bytes=attention.largest(),
        held_matrices=export_run.pt2_held_matrices(attention),
    )
    image = 3 * side * side * 4
    assert needed.bytes == pytest.approx(
        2.5 * largest * (image + call)  # a model with attention matrices
        + 1.4 * largest * image
        + 1 * largest * matrix_bytes(side)
        + export_run.pt2_fixed_bytes()  # what the run takes at any batch
    )


@pytest.mark.parametrize(("how", "held"), [("by-hand", 2), ("mha", 1), ("sdpa", 0)])
def test_a_pt2_export_counts_what_its_runs_hold_of_the_matrix(vits, how, held):
    """torch.export traces with fake tensors; its real runs (PyTorch's reference pass, the
    file's verification) hold a matrix as the model computes it: by hand the scores and their
    softmax at once, nn.MultiheadAttention's inference fast path one, the fused kernel of
    F.scaled_dot_product_attention none. Before: 4 x the largest matrix for all, while the
    peaks were 0.35-0.65x that count at 784 tokens (thin ViTs, 64 channels, 4 blocks, -b 16
    and 64), refusing batches that fit; now 0.87-0.95x (docs/commands/export.md)."""
    side, largest = 64, 66
    model = vits["Vit"](how, depth=2).eval()
    call, attention, _ = export_run._per_image_bytes(model, (3, side, side))
    assert export_run.pt2_held_matrices(attention) == (held, matrix_bytes(side))
    needed = export_run.export_memory_needed(
        (3, side, side),
        largest,
        call,
        fmt="exported-program",
        largest_attention_bytes=attention.largest(),
        held_matrices=export_run.pt2_held_matrices(attention),
    )
    image = 3 * side * side * 4
    batch = 2.5 * largest * (image + call) + 1.4 * largest * image  # and the other batches
    fixed = export_run.pt2_fixed_bytes()  # what the run takes at any batch
    assert needed.bytes == pytest.approx(batch + held * largest * matrix_bytes(side) + fixed)
    assert ("for their largest attention matrix" in needed.held) == bool(held)


# torchvision's models exported to .pt2 (random weights, 224 px): -b, the images counted (the
# verification's B + 2), summary's figures an image (one layer's call; .pt2's rate and bytes of
# the matrix it holds), the weights' bytes, and the peak RSS measured past the check
# (benchmarks/bench_export_memory.py, 2026-12-02; docs/performance.md)
MEASURED_PT2 = {
    "resnet18-1": (1, 3, 6_422_528, (0.0, 0), 46_796_608, 137e6),
    "resnet18-16": (16, 18, 6_422_528, (0.0, 0), 46_796_608, 305e6),
    "efficientnet_b0-1": (1, 3, 9_633_792, (0.0, 0), 21_322_648, 137e6),
    "efficientnet_b0-16": (16, 18, 9_633_792, (0.0, 0), 21_322_648, 412e6),
    "vit_b_16-1": (1, 3, 4_841_472, (1.0, 1_862_832), 346_270_624, 466e6),
    "vit_b_16-8": (8, 10, 4_841_472, (1.0, 1_862_832), 346_270_624, 567e6),
    "swin_t-1": (1, 3, 9_633_792, (2.0, 1_843_968), 113_383_912, 264e6),
    "swin_t-16": (16, 18, 9_633_792, (2.0, 1_843_968), 113_383_912, 726e6),
    "convnext_tiny-1": (1, 3, 9_633_792, (0.0, 0), 114_356_512, 237e6),
    "convnext_tiny-16": (16, 18, 9_633_792, (0.0, 0), 114_356_512, 495e6),
}


@pytest.mark.parametrize("case", list(MEASURED_PT2))
def test_a_pt2_count_is_at_or_a_little_above_the_measured_peak(monkeypatch, case):
    """Before: the weights at 3.5 copies (vit_b_16's 346 MB counted 1.2 GB, while its export
    held 466 MB at -b 1: refused on a machine with 1 GB free), nothing for the 50-100 MB a
    run takes whatever its batch (efficientnet_b0 at -b 16 held 1.07x its count), and a
    transformer's peak grew 1.3-1.5x the count per image (swin_t). Now 1.2 copies, 80 MB, and
    2.5 x the batch for a model with attention: 1.04-1.27x the peaks. (torchvision's builders
    import torch.export's machinery before the check: counted as imported.)"""
    monkeypatch.setitem(sys.modules, "torch._dynamo", sys.modules.get("torch._dynamo"))
    batch, largest, call, held, weights, peak = MEASURED_PT2[case]
    matrix = held[1]
    needed = export_run.export_memory_needed(
        (3, 224, 224),
        largest,
        call,
        fmt="exported-program",
        weight_bytes=weights,
        attention_bytes=matrix,
        largest_attention_bytes=matrix,
        held_matrices=held,
    )
    assert peak <= needed.bytes <= 1.3 * peak


def test_a_pt2_count_takes_torch_exports_imports_where_they_are_not_made_yet(vits, monkeypatch):
    """torch.export's machinery (torch._dynamo, sympy: 154 MB of RSS) is imported by the export
    where nothing imported it before the check, as for a `module:Callable` model: a thin ViT
    (64 channels, 4 heads, 4 blocks, attention by hand, 196 tokens) at -b 16 held 289 MB past
    the check, counted 164 MB without it (benchmarks/bench_export_memory.py)."""
    namespace: dict = {}
    exec(_BENCHMARK_VITS, namespace)
    model = namespace["by_hand_16"]().eval()
    call, attention, outputs = export_run._per_image_bytes(model, (3, 224, 224))

    def count() -> float:
        return export_run.export_memory_needed(
            (3, 224, 224),
            18,
            call,
            fmt="exported-program",
            weight_bytes=sum(p.numel() * 4 for p in model.parameters()),
            attention_bytes=attention.total(),
            output_bytes=outputs,
            largest_attention_bytes=attention.largest(),
            held_matrices=export_run.pt2_held_matrices(attention),
        ).bytes

    monkeypatch.setitem(sys.modules, "torch._dynamo", None)
    monkeypatch.delitem(sys.modules, "torch._dynamo")
    assert export_run.pt2_fixed_bytes() == 240_000_000
    assert 289e6 <= count() <= 1.3 * 289e6
    monkeypatch.setitem(sys.modules, "torch._dynamo", object())
    assert export_run.pt2_fixed_bytes() == 80_000_000
    assert count() < 289e6  # short of the peak: as counted before


def test_the_export_refusal_names_the_matrix(monkeypatch):
    with_matrix = {"attention_bytes": 10_000_000, "largest_attention_bytes": 1_000_000}
    monkeypatch.setattr(memory, "available_memory", lambda: 100_000)
    with pytest.raises(UsageError) as refused:
        export_run._check_batch_memory(
            (3, 8, 8), 100, 98, 1000, fmt="exported-program", **with_matrix
        )
    fixed = export_run.pt2_fixed_bytes()  # 80 MB, and 160 MB where torch.export's imports wait
    needed = 2.5 * 176_800 + 1.4 * 76_800 + 4 * 100_000_000 + fixed
    assert refused.value.message == (
        f"--batch-size 98 needs about {needed / 1e9:.1f} GB to export to exported-program (2.5 x "
        "0.0 GB for a batch of 100 3x8x8 inputs and one layer's inputs and output, plus 1.4 x "
        "0.0 GB for the other batches, plus 4 x 0.1 GB for their largest attention matrix, plus "
        f"{fixed / 1e9:.1f} GB that torch.export takes at any batch), more than the 0.0 GB free"
    )


class _SequenceFirst(nn.Module):
    """8 px patches of 8 channels, 2 blocks of nn.MultiheadAttention (2 heads) without weights
    that cannot take its inference fast path: sequence first (`batch_first=False`, the
    default), or batch first with queries that are not the keys."""

    def __init__(self, batch_first: bool = False):
        super().__init__()
        self.batch_first = batch_first
        self.patches = nn.Conv2d(3, 8, 8, stride=8)
        self.blocks = nn.ModuleList(
            nn.MultiheadAttention(8, HEADS, batch_first=batch_first) for _ in range(2)
        )
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        tokens = self.patches(x).flatten(2).transpose(1, 2)  # (batch, tokens, channels)
        if not self.batch_first:
            tokens = tokens.transpose(0, 1)
        for block in self.blocks:
            keys = tokens if not self.batch_first else tokens * 1.0  # another tensor
            tokens = tokens + block(tokens, keys, keys, need_weights=False)[0]
        return self.head(tokens.mean(0 if not self.batch_first else 1))


@pytest.mark.parametrize("batch_first", [False, True], ids=["sequence-first", "cross"])
def test_multihead_attention_off_its_fast_path_holds_no_matrix_in_inference(
    monkeypatch, batch_first
):
    """nn.MultiheadAttention without weights makes the matrix in inference only on its fast
    path (batch_first, self-attention...); otherwise it calls F.scaled_dot_product_attention,
    whose fused CPU kernel makes none (measured, 64 channels, 4 blocks, 1,024 tokens, -b 8:
    a peak of 41 MB in infer mode, as with F.scaled_dot_product_attention, 188 MB on the fast
    path). Before: counted as the fast path's, so benchmark refused a batch that fits (it
    counted 141 MB, 3.4x that peak)."""
    side, batch = 512, 8
    model = _SequenceFirst(batch_first).eval()
    counted = summarize(model, [(1, 3, side, side)], count_flops=False)
    assert [m.kind for m in counted.attention.matrices] == ["sdpa", "sdpa"]
    assert counted.attention.largest() == matrix_bytes(side)  # still counted, for export
    image = 3 * side * side * 4
    with_matrix = batch * (image + matrix_bytes(side))  # 1.1 GB: what the check counted
    monkeypatch.setattr(bench_run, "available_memory", lambda: with_matrix - 1)
    opts = BenchmarkOptions(batch_sizes=(batch,), mode="infer", device="cpu", warmup=0, iters=1)
    bench_run._check_fits_in_memory("m", bench_run._per_image(counted, 1), opts, None)


class _Encoder(nn.Module):
    """8 px patches of 8 channels through nn.TransformerEncoder: 2 layers of 2 heads, with
    its default dropout of 0.1."""

    def __init__(self, batch_first: bool):
        super().__init__()
        self.batch_first = batch_first
        self.patches = nn.Conv2d(3, 8, 8, stride=8)
        layer = nn.TransformerEncoderLayer(8, HEADS, 16, batch_first=batch_first)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        tokens = self.patches(x).flatten(2).transpose(1, 2)
        if not self.batch_first:
            tokens = tokens.transpose(0, 1)
        return self.head(self.encoder(tokens).mean(1 if self.batch_first else 0))


@pytest.mark.parametrize(("batch_first", "kind"), [(False, "dropout"), (True, "mha-dropout")])
def test_training_with_attention_dropout_keeps_the_matrices(monkeypatch, batch_first, kind):
    """F.scaled_dot_product_attention's fused CPU kernel takes no dropout: nn.MultiheadAttention
    with dropout (nn.TransformerEncoderLayer's default) trains through the math path and keeps
    each matrix, three times over (measured, 4 blocks of 64 channels, 1,024 tokens, -b 8: a
    training peak of 1.87 GB, 0.13 GB without dropout). Before: counted as held in inference
    only, so benchmark's train check counted 0.03 GB of it and let any batch through; then
    once (0.54 GB), and still once where the module takes its inference fast path (batch
    first), which training never does. In inference the fast path holds one matrix, the other
    none."""
    side, batch = 256, 8
    model = _Encoder(batch_first)
    counted = summarize(model, [(1, 3, side, side)], count_flops=False)
    assert [m.kind for m in counted.attention.matrices] == [kind, kind]
    held = matrix_bytes(side) if batch_first else 0
    assert counted.attention.held_in_inference() == held
    activations = counted.input_mb * 1e6 + counted.forward_backward_mb * 1e6 / 2
    kept = 3  # the softmax, dropout's mask, their product
    needed = batch * (activations + kept * 2 * matrix_bytes(side))
    monkeypatch.setattr(bench_run, "available_memory", lambda: needed - 1)
    refusal = _refusal_of_benchmark(model, side, batch, mode="train")
    assert refusal.message.startswith(
        f"_Encoder in train mode at batch {batch} needs at least {needed / 1e9:,.1f} GB (the "
        "activations kept for backward and their attention matrices)"
    )


class _TimmDropout(nn.Module):
    """Attention as timm writes it: F.scaled_dot_product_attention with dropout in training
    only (`dropout_p=self.attn_drop.p if self.training else 0.`), 8 px patches of 8 channels,
    2 blocks of 2 heads; `in_eval`: with dropout in eval mode too."""

    def __init__(self, p: float = 0.1, in_eval: bool = False):
        super().__init__()
        self.p, self.in_eval = p, in_eval
        self.patches = nn.Conv2d(3, 8, 8, stride=8)
        self.qkv = nn.ModuleList(nn.Linear(8, 24) for _ in range(2))
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        tokens = self.patches(x).flatten(2).transpose(1, 2)
        batch, count, channels = tokens.shape
        for qkv in self.qkv:
            q, k, v = qkv(tokens).reshape(batch, count, 3, HEADS, -1).permute(2, 0, 3, 1, 4)
            mixed = nn.functional.scaled_dot_product_attention(
                q, k, v, dropout_p=self.p if self.training or self.in_eval else 0.0
            )
            tokens = tokens + mixed.transpose(1, 2).reshape(batch, count, channels)
        return self.head(tokens.mean(1))


@pytest.mark.parametrize("p", [0.1, 0.0])
def test_scaled_dot_product_attention_with_dropout_in_training_keeps_its_matrices(monkeypatch, p):
    """F.scaled_dot_product_attention with dropout_p > 0 runs the math path in training, the
    fused CPU kernel taking no dropout, and keeps each block's matrix three times over (the
    softmax, dropout's mask of floats, their product; measured, 4 blocks of 64 channels, 4
    heads, 1,024 tokens, -b 8: a training peak of 1.83 GB, 67 MB with dropout_p=0). Before:
    a model passing dropout_p in training only, as timm's do, showed none in summary's eval
    pass, and benchmark's train check let through a batch 3.4x what it counted. Without
    dropout the fused kernel keeps none, and none is counted."""
    side, batch = 256, 8
    model = _TimmDropout(p)
    in_eval = summarize(model, [(1, 3, side, side)], count_flops=False)
    assert [m.kind for m in in_eval.attention.matrices] == ["sdpa", "sdpa"]
    in_training = summarize(model, [(1, 3, side, side)], count_flops=False, train_mode=True)
    kind = "sdpa-dropout" if p else "sdpa"
    assert [m.kind for m in in_training.attention.matrices] == [kind, kind]
    activations = in_eval.input_mb * 1e6 + in_eval.forward_backward_mb * 1e6 / 2
    kept = 3 * 2 * matrix_bytes(side) if p else 0
    needed = batch * (activations + kept)
    monkeypatch.setattr(bench_run, "available_memory", lambda: needed - 1)
    refusal = _refusal_of_benchmark(model, side, batch, mode="train")
    what = "the activations kept for backward" + (" and their attention matrices" if p else "")
    assert refusal.message.startswith(
        f"_TimmDropout in train mode at batch {batch} needs at least {needed / 1e9:,.1f} GB "
        f"({what})"
    )
    assert model.training  # the module's own mode is put back


def test_scaled_dot_product_attention_with_dropout_in_inference_holds_three_matrices(
    monkeypatch,
):
    """F.scaled_dot_product_attention called with dropout_p > 0 in eval mode too drops out
    through the math path there: an inference holds the softmax, dropout's mask and their
    product at once (measured: 797 MB for a 268 MB matrix). Before: counted as training's
    alone, none in inference, so benchmark's infer check and .pt2's count took none of it.
    Now 3 x the largest matrix, in both (2 blocks: the same at any depth)."""
    side, batch = 256, 8
    model = _TimmDropout(0.1, in_eval=True).eval()
    counted = summarize(model, [(1, 3, side, side)], count_flops=False)
    assert [m.kind for m in counted.attention.matrices] == ["sdpa-dropout"] * 2
    matrix = matrix_bytes(side)  # 2 heads x 1,024 tokens^2 x 4 bytes: 8.4 MB an image
    assert counted.attention.held_in_inference() == 3 * matrix
    assert export_run.pt2_held_matrices(counted.attention) == (3, matrix)
    image = 3 * side * side * 4
    layer = counted.largest_call_mb * 1e6
    assert layer < matrix
    needed = batch * (image + 3 * matrix)  # 0.21 GB
    monkeypatch.setattr(bench_run, "available_memory", lambda: needed - 1)
    refusal = _refusal_of_benchmark(model, side, batch)
    assert refusal.message == (
        f"_TimmDropout in infer mode at batch {batch} needs at least {needed / 1e9:,.1f} GB "
        "(the input batch and its largest attention matrix), more than the 0.2 GB of memory "
        "available"
    )


def test_summary_shows_the_matrices_it_counts(vits, runner, monkeypatch):
    """summary counted the matrices for export and benchmark, and showed none of them. Now
    its totals hold them (JSON keys attention_mb and largest_attention_mb; table rows where
    the pass made any): 2 blocks at 64 px and 2 images, 2 x 2 heads x 64^2 x 4 bytes each."""
    from torchkit.cli import app

    monkeypatch.chdir(vits["root"])
    monkeypatch.syspath_prepend(str(vits["root"]))
    args = ["summary", "attentionvits:by_hand", "-i", "3,64,64", "-b", "2"]
    shown = runner.invoke(app, [*args, "--format", "json"])
    assert shown.exit_code == 0, shown.stderr
    totals = json.loads(shown.stdout)["totals"]
    matrix = matrix_bytes(64, batch=2)  # 65,536 bytes
    counted = summarize(vits["by_hand"]().eval(), [(2, 3, 64, 64)], count_flops=False)
    assert totals["attention_mb"] == counted.attention.total() / 1e6 == 2 * matrix / 1e6
    assert totals["largest_attention_mb"] == counted.attention.largest() / 1e6 == matrix / 1e6
    table = runner.invoke(app, args, terminal_width=200)
    assert table.exit_code == 0, table.stderr
    rows = {
        line.split("│")[1].strip(): line.split("│")[2].strip()
        for line in (table.stdout.splitlines())
        if line.count("│") == 3
    }
    assert rows["Attention matrices (MB)"] == f"{2 * matrix / 1e6:,.2f}"  # 0.13
    assert rows["Largest attention matrix (MB)"] == f"{matrix / 1e6:,.2f}"  # 0.07
    # a model without attention: 0 in JSON, no rows in the table
    plain = runner.invoke(app, ["summary", "convnet", "--format", "json"])
    assert json.loads(plain.stdout)["totals"]["attention_mb"] == 0
    assert "Attention" not in runner.invoke(app, ["summary", "convnet"]).stdout


def test_a_score_at_the_address_of_one_a_softmax_took_is_followed():
    """The counter follows score matrices by their storage's address, which a softmax's input
    frees for the next tensor: before, the freed one's place in the order of those followed
    stayed, and its turn to go dropped the new score at that address (torch 2.4: 3 matrices
    of a 4-block ViT). Addresses given by hand here: 1 comes back after 7 others."""
    import torch

    from torchkit.core.summary.attention import AttentionCounter

    counter = AttentionCounter(lambda tensor: tensor.address, nn.Module())
    bmm, softmax = torch.ops.aten.bmm.default, torch.ops.aten._softmax.default

    def at(address):
        tensor = torch.zeros(1, 2, 2)
        tensor.address = address
        return tensor

    def product(address):
        result = at(address)
        counter.dispatched(bmm, (at(-1), at(-2)), result)
        return result

    counter.dispatched(softmax, (product(1), -1, False), at(100))
    for address in range(2, 9):
        product(address)
    counter.dispatched(softmax, (product(1), -1, False), at(101))
    assert len(counter.found().matrices) == 2


class _WeightsAndDropout(nn.Module):
    """8 px patches of 8 channels through 2 nn.MultiheadAttention of 2 heads with dropout 0.1,
    called as many models call it: asking for the weights (the default)."""

    def __init__(self):
        super().__init__()
        self.patches = nn.Conv2d(3, 8, 8, stride=8)
        self.blocks = nn.ModuleList(
            nn.MultiheadAttention(8, HEADS, dropout=0.1, batch_first=True) for _ in range(2)
        )
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        tokens = self.patches(x).flatten(2).transpose(1, 2)
        for block in self.blocks:
            tokens = tokens + block(tokens, tokens, tokens)[0]
        return self.head(tokens.mean(1))


def test_multihead_attention_with_weights_and_dropout_keeps_three_matrices_in_training(
    monkeypatch,
):
    """nn.MultiheadAttention asked for its weights, with dropout, trains through its softmax,
    dropout's mask and their product and keeps all three (measured, 64 channels, 4 heads,
    1,024 tokens, -b 8: 3.38 matrices kept after the forward pass, 1.38 without dropout).
    Before: counted `explicit`, kept once, so benchmark's train check let through a batch
    whose matrices are three times what it counted. In inference it holds one, as before."""
    side, batch = 256, 8
    model = _WeightsAndDropout()
    counted = summarize(model, [(1, 3, side, side)], count_flops=False)
    assert [m.kind for m in counted.attention.matrices] == ["explicit-dropout"] * 2
    matrix = matrix_bytes(side)
    assert counted.attention.held_in_inference() == matrix
    assert counted.attention.kept_in_training() == 3 * 2 * matrix
    activations = counted.input_mb * 1e6 + counted.forward_backward_mb * 1e6 / 2
    needed = batch * (activations + 3 * 2 * matrix)
    monkeypatch.setattr(bench_run, "available_memory", lambda: needed - 1)
    refusal = _refusal_of_benchmark(model, side, batch, mode="train")
    assert refusal.message.startswith(
        f"_WeightsAndDropout in train mode at batch {batch} needs at least "
        f"{needed / 1e9:,.1f} GB (the activations kept for backward and their attention matrices)"
    )
    # .pt2's runs are in eval mode, without dropout: the scores and their softmax, as by hand
    assert export_run.pt2_held_matrices(counted.attention) == (2.0, matrix)
