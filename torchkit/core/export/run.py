"""`export_model`: MODEL -> a verified ONNX / TorchScript / torch.export file at OUT.

Order: every option and output checked (no work yet), the model resolved and run once in
PyTorch (its reference outputs), the file written under a temporary name beside OUT, loaded
back with its own runtime and compared, and only then renamed to OUT. A failure at any step
leaves OUT as it was (absent, or the old file that --force would have replaced).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from torchkit.core.export import formats as fm
from torchkit.core.export.verification import (
    OutputMismatch,
    Verification,
    VerificationError,
    matching_batches,
    reference_outputs,
    require_comparable,
    require_repeatable,
    verification_batches,
    verify,
)
from torchkit.core.export.writing import (
    ExportError,
    parameter_bytes,
    write_exported_program,
    write_onnx,
    write_torchscript,
)
from torchkit.core.inference.options import check_batch_fits
from torchkit.core.io.errors import OutputWriteError, UsageError, first_line
from torchkit.core.io.file_outputs import check_output_file
from torchkit.core.io.files import atomic_path
from torchkit.core.io.overlap import InputPath, check_distinct_outputs
from torchkit.core.io.sizes import gigabytes_text
from torchkit.core.io.special_files import is_special_file
from torchkit.core.models import model_inputs, require_model_files
from torchkit.core.models.exported.metadata import build_metadata
from torchkit.core.models.image_size import (
    image_size_refusal,
    trained_input,
    trained_size_hint,
)
from torchkit.core.models.resolver import has_random_weights
from torchkit.core.runtime import memory
from torchkit.core.summary.attention import (
    ATTENTION_MATRICES,
    DROPOUT,
    DROPOUT_KEPT,
    EXPLICIT,
    EXPLICIT_DROPOUT,
    LARGEST_ATTENTION_MATRIX,
    MHA,
    MHA_DROPOUT,
    SDPA,
    SDPA_DROPOUT,
    AttentionMatrices,
)

Progress = Callable[[int, int], None]
STEPS = 4  # model, reference, export, verification


@dataclass
class ExportRequest:
    model: str
    out: str
    to: str | None = None  # onnx | torchscript | exported-program; default: OUT's extension
    weights: str | None = None
    num_classes: int | None = None
    trust_checkpoint: bool = False
    ema: bool = False
    image_size: int | None = None  # default: the model's (checkpoint, weights, builder)
    image_channels: int | None = None  # the C of --image-size C,N,N
    batch_size: int = 1
    static_batch: bool = False
    opset: int | None = None  # ONNX only; default formats.DEFAULT_OPSET
    dtype: str = "float32"
    atol: float | None = None  # default: formats.DEFAULT_TOLERANCES[dtype]
    rtol: float | None = None
    verify: bool = True
    force: bool = False


@dataclass
class ExportResult:
    format: str
    path: str
    arch: str
    runtime: str
    opset: int | None
    dtype: str
    dynamic_batch: bool
    batch_size: int | None  # None: any batch size
    input_shape: list[int]  # one sample: C, H, W
    num_classes: int | None
    classes_stored: bool
    preprocess_source: str
    metadata: str  # where the classes and preprocessing are stored
    file_bytes: int
    verified: bool  # verified and conclusive: the outputs match and depend on the input
    max_abs_diff: float | None
    tolerance: float | None
    atol: float
    rtol: float
    verified_batch_sizes: list[int] = field(default_factory=list)
    seconds: float = 0.0
    random_weights: bool = False  # no weights file or pretrained weights: a model to try, not use
    # passed | inconclusive (PyTorch's outputs barely depend on the input, so an export that
    # ignored it would pass too) | skipped (--no-verify)
    verification: str = "skipped"
    output_spread: float | None = None  # the most one output differs between distinct inputs
    # "file.py:LINE" where the traced model turned a value computed from its input into a
    # Python value (`if x.mean() > 0:`): the file keeps the example's way there, so a passing
    # check is inconclusive (ONNX, TorchScript; torch.export refuses such a model)
    traced_input_values: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_outputs(
    model: str,
    out: str | os.PathLike,
    report: str | os.PathLike | None = None,
    *,
    weights: str | None = None,
    force: bool = False,
) -> None:
    """OUT and the `-o` report, before any work: neither is a file the model is read from, the
    report is not OUT, and an existing file is replaced only with `force`. A missing model file
    is said first."""
    require_model_files(model, weights)
    inputs = model_inputs(model, weights)
    _check_out(out, inputs, force)
    if report is not None and os.fspath(report) != "-":
        check_output_file(
            report, force, [*inputs, InputPath.of(out, "exported model")], what="report"
        )
        check_distinct_outputs((out, "OUT"), (report, "report"))  # one FIFO, or stdout


def _check_out(out: str | os.PathLike, inputs: list[InputPath], force: bool) -> Path:
    target = check_output_file(out, force, inputs, what="output")
    if is_special_file(target):  # a FIFO, /dev/stdout, /dev/null: verified, then written into
        return target
    parent = target.absolute().parent
    existing = parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise OutputWriteError(
            f"cannot write {target}: {existing} is a file, not a folder", "choose another output"
        )
    return target  # (check_output_file found a folder that takes no file: before a slow export)


def export_model(request: ExportRequest, progress: Progress | None = None) -> ExportResult:
    """Export, verify and write; see the module's docstring for the order of things."""
    import torch

    from torchkit.core.models import ModelSpec, resolve_spec

    started = time.perf_counter()
    fmt = fm.choose_format(request.out, request.to)
    opset = fm.check_opset(fmt, request.opset)
    dtype = fm.check_dtype(request.dtype)
    tolerance = fm.tolerance_for(dtype, request.atol, request.rtol)
    if not request.verify and (request.atol is not None or request.rtol is not None):
        # the report would show a tolerance no check used
        option = "--atol" if request.atol is not None else "--rtol"
        raise UsageError(
            f"{option} sets the verification's tolerance, and --no-verify skips the verification",
            f"drop {option} or --no-verify",
        )
    if request.batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, not {request.batch_size}")
    check_batch_fits(request.batch_size)
    if request.image_size is not None and request.image_size < 1:
        raise UsageError(f"--image-size must be positive, not {request.image_size}")
    require_model_files(request.model, request.weights)
    target = _check_out(request.out, model_inputs(request.model, request.weights), request.force)
    _require_runtime(fmt, request.verify)
    step = _stepper(progress)

    spec = ModelSpec(
        model=request.model,
        weights=request.weights,
        trust_checkpoint=request.trust_checkpoint,
        num_classes=request.num_classes,
        ema=request.ema,
        image_size=request.image_size,
        image_channels=request.image_channels,
    )
    # seeded: a model without weights is written with the same random weights in every run
    resolved = resolve_spec(spec, command="export", seeded=True)
    model = resolved.model.to("cpu").float().eval()
    arch = resolved.arch
    random_weights = has_random_weights(resolved)  # a note, as summary's and benchmark's
    step()

    preprocess, sample = _input_of(resolved, request.image_size)
    dynamic = not request.static_batch
    sizes = [request.batch_size]
    # a second size shows the batch is not fixed; a fixed one is run on a second batch, so
    # that even at batch 1 there are distinct inputs whose outputs must differ
    sizes.append(request.batch_size + 2 if dynamic else request.batch_size)
    example_size = max(2, request.batch_size) if dynamic else request.batch_size
    call_bytes, attention, output_bytes = _per_image_bytes(model, sample)
    if fmt == fm.EXPORTED_PROGRAM:
        import_pt2_machinery()  # in the memory the check reads (`_PT2_IMPORTS`)
    _check_batch_memory(
        sample,
        max(sizes),
        request.batch_size,
        call_bytes,
        fmt=fmt,
        weight_bytes=parameter_bytes(model),
        attention_bytes=attention.total(),
        output_bytes=output_bytes,
        largest_attention_bytes=attention.largest(),
        held_matrices=pt2_held_matrices(attention),
    )
    batches = verification_batches(sample, sizes if request.verify else sizes[:1])
    references = _reference(model, batches, arch=arch, trained=trained_input(resolved))
    if request.verify:
        require_comparable(references, arch)
    example = verification_batches(sample, [example_size], seed=1)[0]
    if dtype == "float16":
        model = model.to(torch.float16)
        example = example.to(torch.float16)
        _check_float16(model, example, arch)
    step()

    metadata = build_metadata(
        fmt=fmt,
        arch=arch,
        classes=resolved.classes,
        preprocess=preprocess,
        input_shape=sample,
        batch_size=None if dynamic else request.batch_size,
        dtype=dtype,
        opset=opset,
        weights_source=resolved.weights_source,
        num_outputs=resolved.num_outputs,
        data=resolved.data_record,
    )
    verification: Verification | None = None
    traced_input_values: list[str] = []
    with _parents_removed_on_failure(target), atomic_path(target) as temporary:
        kwargs = {"target": target, "dynamic": dynamic, "metadata": metadata}
        if fmt == fm.ONNX:
            traced_input_values = write_onnx(model, example, temporary, opset=opset, **kwargs)
        elif fmt == fm.TORCHSCRIPT:
            traced_input_values = write_torchscript(model, example, temporary, **kwargs)
        else:
            write_exported_program(model, example, temporary, **kwargs)
        step()
        if request.verify:
            try:
                verification = verify(temporary, fmt, batches, references, tolerance)
            except OutputMismatch as mismatch:
                require_repeatable(model, batches[0], references[0], tolerance, arch)
                if traced_input_values:
                    raise VerificationError(
                        mismatch.message,
                        f"the model reads a value of its input at {traced_input_values[0]}, "
                        "perhaps in a branch, which the trace fixed to the example input's way; "
                        "nothing was written",
                    ) from mismatch
                if dynamic:
                    traced = (example_size, model, tolerance)
                    _require_batch_free(temporary, fmt, batches, references, mismatch, traced)
                raise
        file_bytes = temporary.stat().st_size
    step()

    return ExportResult(
        format=fmt,
        path=os.fspath(target),
        arch=arch,
        runtime=fm.RUNTIMES[fmt],
        opset=opset,
        dtype=dtype,
        dynamic_batch=dynamic,
        batch_size=None if dynamic else request.batch_size,
        input_shape=list(sample),
        num_classes=int(references[0].shape[1]) if references[0].ndim == 2 else None,
        classes_stored=bool(resolved.classes),
        preprocess_source=resolved.preprocess_source,
        metadata=fm.METADATA_PLACES[fmt],
        file_bytes=file_bytes,
        verified=_verdict(verification, traced_input_values) == "passed",
        max_abs_diff=verification.max_abs_diff if verification else None,
        tolerance=verification.tolerance if verification else None,
        atol=tolerance.atol,
        rtol=tolerance.rtol,
        verified_batch_sizes=verification.batch_sizes if verification else [],
        seconds=time.perf_counter() - started,
        random_weights=random_weights,
        verification=_verdict(verification, traced_input_values),
        output_spread=verification.output_spread if verification else None,
        traced_input_values=traced_input_values,
    )


def _require_batch_free(
    path: Path,
    fmt: str,
    batches: list[Any],
    references: list[Any],
    mismatch: OutputMismatch,
    traced: tuple[int, Any, fm.Tolerance],
) -> None:
    """After an output mismatch of a file whose batch is dynamic: refuse, saying so, a file that
    is right at the batch size it was traced at and wrong at the others. The model turns its
    batch size into a Python number (`float(x.shape[0])`), which the trace keeps as a constant:
    --atol/--rtol, which the mismatch suggests, cannot help, --static-batch can. `traced`: the
    batch size the file was traced at, the model (its dtype now the file's) and the tolerance.

    The evidence is the same images at two batch sizes, both against the model as it is now:
    a file merely less precise than the float32 references (float16's rounding) is as far off
    at the traced size as at the others, and is left to the mismatch's own hint."""
    import torch

    traced_at, model, tolerance = traced
    other = next((b for b in batches if int(b.shape[0]) != traced_at), None)
    if other is None:
        return
    same_images = other[torch.arange(traced_at) % int(other.shape[0])]  # at the traced size
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    with torch.no_grad():
        own = [model(b.to(dtype)).float() for b in (other, same_images)]
    matches = matching_batches(
        path, fmt, [*batches, other, same_images], [*references, *own], tolerance
    )
    if matches is None or all(matches[: len(batches)]) or matches[-2] or not matches[-1]:
        return
    wrong = sorted({int(b.shape[0]) for b, ok in zip(batches, matches, strict=False) if not ok})
    raise VerificationError(
        f"{mismatch.message}, at batch {' and '.join(map(str, wrong))} but not at batch "
        f"{traced_at}, the size it was traced at: the model turns its batch size into a Python "
        "number, as `float(x.shape[0])` does, which the trace kept as a constant",
        "keep the batch size a tensor, `x.shape[0]` without `int()` or `float()`, or export "
        "one batch size with --static-batch --batch-size N; nothing was written",
    ) from mismatch


def _require_runtime(fmt: str, verifying: bool) -> None:
    """ONNX's packages, before any work: a missing onnxruntime was found after the model was
    built and traced, in an error naming the temporary file instead of OUT."""
    from torchkit.core.runtime.extras import require_extra

    if fmt == fm.ONNX:
        require_extra("onnx", "export", "exporting to ONNX")
        if verifying:
            require_extra(
                "onnxruntime", "export", "verifying an ONNX export (--no-verify skips it)"
            )


def _verdict(verification: Verification | None, traced_input_values: list[str]) -> str:
    """passed only when the outputs match and the check could tell: not when they barely
    depend on the input, nor when the trace fixed what the model did with an input's value
    (the random inputs may all have gone the example's way)."""
    if verification is None:
        return "skipped"
    if not verification.conclusive or traced_input_values:
        return "inconclusive"
    return "passed"


def _per_image_bytes(model: Any, sample: tuple[int, ...]) -> tuple[int, AttentionMatrices, int]:
    """For one image, from summary's count on the meta device (no real forward pass): what one
    layer holds at once (its inputs and its output), the attention matrices (heads x N x N at
    each attention call: no layer's output, though the tracers hold each), and the new outputs
    of every layer (what a tracer with autograd on keeps, with those matrices); zeros where the
    meta pass cannot count them."""
    from torchkit.core.summary.counting import MB, is_script_module, summarize

    if is_script_module(model):  # summary would run it for real
        return 0, AttentionMatrices(), 0
    try:
        counted = summarize(model, [(1, *sample)], count_flops=False, run_for_real=False)
    except Exception:  # noqa: BLE001 - no estimate; the reference pass reports a real failure
        return 0, AttentionMatrices(), 0
    outputs = (counted.forward_backward_mb or 0) * MB / 2  # the outputs, and their gradients
    return int((counted.largest_call_mb or 0) * MB), counted.attention, int(outputs)


# What an export holds at its peak beyond what was in memory before it: a multiple of the batch
# `_check_batch_memory` counts, and one of the model's weights (copies: ONNX's constant folding
# and its serialised model, the file loaded to verify). Measured as max RSS past the RSS at the
# check, resnet18 (224 px) and convnet (128 px) at -b 16 and 48, CPU: TorchScript's and ONNX's
# tracers run with autograd on (ONNX needs it: no_grad takes nn.MultiheadAttention's fast path,
# which ONNX cannot export), keeping every layer's output: 3.3x the batch count (resnet18),
# 1.1x (convnet); torch.export traces with fake tensors: 1.3x and 1.5x. Weights: 3.8-4.1x
# (ONNX), 2.8-3.3x (.pt2), 0.4-2.7x (TorchScript). A deep model keeps more than its largest
# call shows, in every block: ONNX's and TorchScript's count is at least `_KEPT_PER_BATCH`
# times the images, every layer's new outputs and the attention matrices (heads x N x N at
# each call, no layer's output, each kept once). ONNX, then: mobilenet_v2 (-b 8 and 32)
# 0.80-0.91x the count, resnet50 (-b 2 and 10) 0.61-0.63x, vit_b_16 (-b 1 and 8) 0.74-0.78x;
# ViTs of 64 channels and 4 heads at 224 px, 4, 12 and 24 blocks (torchvision's and timm's),
# -b 64, ONNX and TorchScript: 0.44-0.76x. Counted with the largest call alone (the matrices
# with it, 3.5 times over), mobilenet_v2 held 1.8-2.1x, resnet50 1.2-1.9x and vit_b_16 grew
# 1.24x that count per image, while the thin ViTs held 0.36-0.51x. .pt2's peak grows little
# with depth: with every block's matrix beside the largest call, the thin ViTs held 1.78x that
# count (1 block), 0.89x (4), 0.41x (12), 0.09x (24). It holds about one block's: its count is
# `_PEAK_PER_MATRIX` times the largest matrix beside the batch's, 0.88x, 0.82x, 0.76x and
# 0.79x the measured peak at -b 64, the rest ~80 MB that does not grow with the batch (from -b
# 16 to 64 the peak grew 0.89-1.11x the count per image).
# That flat 4 times the largest matrix was the same for every way of computing attention, while
# .pt2's tracer holds none (fake tensors) and what holds them are its real runs, PyTorch's
# reference pass and the verification of the file: attention by hand holds the scores and their
# softmax at once, nn.MultiheadAttention's inference fast path one matrix, and the fused kernel
# of F.scaled_dot_product_attention none. Measured (thin ViTs of 64 channels, 4 heads, 4 blocks
# with their MLPs, 224 px, -b 16 and 64, the peak's growth per image against the count's): at
# 784 tokens (9.8 MB of matrix an image) by hand 24.5 MB, nn.MultiheadAttention 13.8 MB,
# F.scaled_dot_product_attention 5.4 MB, where the flat rate counted 42.9 MB for each (batches
# that fit refused). So `PT2_MATRICES_HELD` per kind, the largest of them counted
# (`pt2_held_matrices`), with `_IMAGES_HELD` below: the count's growth is then 24.1, 14.2 and
# 4.4 MB (at 196 tokens 3.7 and 3.1 MB against 3.9 and 3.8; swin_t 20.9 against 27.4).
# torchvision's models (random weights, 224 px, -b 1 and 16, 8 for vit_b_16; 2026-12-02,
# docs/performance.md) showed the rest of .pt2's count off: the weights counted 3.5 times where
# an export takes about one copy more (vit_b_16's 346 MB counted 1.2 GB: an export that took
# 0.47 GB in all was refused on a machine with 1 GB free), 50-60 MB a run that no batch makes
# (`_PT2_FIXED`) not counted at all, and a transformer's peak growing 1.3-1.5x the count per
# image (vit_b_16 14.4 MB an image, swin_t 30.8 MB: its blocks hold their queries, keys and
# values and the attention call's copies beside the largest call), the CNNs' 0.93-1.06x. So
# `_PT2_PER_BATCH_WITH_ATTENTION` for a model with attention matrices, 1.7 for the others, 1.2
# copies of the weights and `_PT2_FIXED` (and `_PT2_IMPORTS`): 1.02-1.37x the peaks.
_PEAK_PER_BATCH = {fm.ONNX: 3.5, fm.TORCHSCRIPT: 3.5, fm.EXPORTED_PROGRAM: 1.7}
_PT2_PER_BATCH_WITH_ATTENTION = 2.5
_PT2_FIXED = 80_000_000
# What torch.export's machinery takes once imported (torch._dynamo, sympy: 154 MB of RSS, torch
# 2.15), where nothing has imported it before the check: a model built by name has (torchvision's
# builders import it), a `module:Callable` may not (thin ViTs at 196 tokens, -b 16: 289 MB held,
# 164 MB counted without it). What it takes differs with the version (torch 2.4: 60 MB, sympy
# imported already, a tiny model's export 98 MB past the check, counted 240), so export_model
# imports it before the check (`import_pt2_machinery`), which then reads the memory free
# without it: this rule is left for a count made before that import.
_PT2_IMPORTS = 160_000_000


def pt2_fixed_bytes() -> int:
    """What a .pt2 export takes whatever its batch: `_PT2_FIXED`, and `_PT2_IMPORTS` where
    torch.export's machinery is not imported yet."""
    return _PT2_FIXED + (0 if "torch._dynamo" in sys.modules else _PT2_IMPORTS)


def import_pt2_machinery() -> None:
    """torch.export's machinery (torch._dynamo, sympy), imported before .pt2's memory check:
    the export imports it anyway, and the check then sees what it took in the memory free."""
    import torch._dynamo  # noqa: F401


_KEPT_PER_BATCH = {fm.ONNX: 1.6, fm.TORCHSCRIPT: 1.6}
_PEAK_PER_MATRIX = {fm.EXPORTED_PROGRAM: 4.0}  # without `held_matrices`: the flat rate
# The same ViTs showed the images short: .pt2's runs hold the verification's batches (B and B+2
# images) and the example's at once, about 3 x the largest batch's images, which 1.6 x (images
# and one layer's call) covers where that call is several times the images (a CNN's first
# convolution), not where it is smaller than them (a ViT's, 0.4 MB an image beside 0.6 MB). So
# `_IMAGES_HELD` x the images beside: the ViTs' peaks grew 0.97-1.25x the count's growth per
# image (196 and 784 tokens, by hand, nn.MultiheadAttention, F.scaled_dot_product_attention;
# docs/commands/export.md).
_IMAGES_HELD = {fm.EXPORTED_PROGRAM: 1.4}
# F.scaled_dot_product_attention called with dropout runs its math path in the reference pass:
# the softmax, dropout's mask and their product at once (summary/attention.py)
PT2_MATRICES_HELD = {
    EXPLICIT: 2.0,
    EXPLICIT_DROPOUT: 2.0,  # its runs are in eval mode: no dropout
    MHA: 1.0,
    MHA_DROPOUT: 1.0,
    SDPA: 0.0,
    DROPOUT: 0.0,
    SDPA_DROPOUT: float(DROPOUT_KEPT),
}


def pt2_held_matrices(attention: AttentionMatrices) -> tuple[float, int]:
    """What torch.export's export holds of the attention matrices at its peak: the rate and
    bytes of the matrix whose rate x bytes is largest (`PT2_MATRICES_HELD`; the runs hold one
    call's at a time)."""
    return max(
        ((PT2_MATRICES_HELD[m.kind], m.bytes) for m in attention.matrices),
        key=lambda held: held[0] * held[1],
        default=(0.0, 0),
    )


_PEAK_PER_WEIGHTS = {fm.ONNX: 4.0, fm.TORCHSCRIPT: 3.0, fm.EXPORTED_PROGRAM: 1.2}


def _check_batch_memory(
    sample: tuple[int, ...],
    largest: int,
    batch_size: int,
    call_bytes: int = 0,
    *,
    fmt: str,
    weight_bytes: int = 0,
    attention_bytes: int = 0,
    output_bytes: int = 0,
    largest_attention_bytes: int | None = None,
    held_matrices: tuple[float, int] | None = None,
) -> None:
    """What exporting to `fmt` holds at its peak fits in the memory free: the example batches
    it traces and verifies with, up to `largest` samples of `sample` in float32, and what one
    layer holds at once for them (`call_bytes` an image: a first convolution's output is
    several times the images), each format's multiple of them and of the weights (see
    `_PEAK_PER_BATCH`); for ONNX and TorchScript, at least what their tracers keep of each
    image (`_KEPT_PER_BATCH` times the image, every layer's new outputs, `output_bytes`, and
    every attention matrix, `attention_bytes`); torch.export's counts the largest attention
    matrix (`largest_attention_bytes`; None: all of them) with the layer's call instead, or
    what its runs hold of them (`held_matrices`, `pt2_held_matrices`'s rate and bytes). A
    --batch-size past it (2**30) failed in torch's allocator with a traceback's last line
    instead of one error, one whose images fit but layers did not (resnet18 at 4096) ended in
    the kernel's OOM killer, and one flat half of the free memory let ONNX and TorchScript
    batches that need 1.7x it through while it refused .pt2 batches that fit."""
    counting = functools.partial(
        export_memory_needed,
        sample,
        call_bytes=call_bytes,
        fmt=fmt,
        weight_bytes=weight_bytes,
        attention_bytes=attention_bytes,
        output_bytes=output_bytes,
        largest_attention_bytes=largest_attention_bytes,
        held_matrices=held_matrices,
    )
    needed = counting(largest)
    free = memory.available_memory()
    if free is None or needed.bytes <= free:
        return
    weights = (
        f", plus {_PEAK_PER_WEIGHTS[fmt]:g} x {gigabytes_text(weight_bytes)} for the weights"
        if weight_bytes
        else ""
    )
    if needed.fixed:
        weights += f", plus {gigabytes_text(needed.fixed)} that torch.export takes at any batch"
    # --batch-size 1's count: where it does not fit either (the weights, or what .pt2 takes at
    # any batch, past the memory free), a smaller --batch-size is no way out
    smallest = counting(largest - batch_size + 1).bytes
    digits = _distinct_digits(needed.bytes, free)
    if smallest <= free:
        hint = (
            "give a smaller --batch-size: the exported model takes any batch size unless "
            "--static-batch"
        )
    else:
        smaller = (
            "no smaller batch"
            if batch_size == 1
            else f"--batch-size 1 needs about {gigabytes_text(smallest, digits)} too"
        )
        # under a container's limit the machine may well have more: the limit is the way out
        more = (
            f"raise the {memory.CGROUP_LIMIT}"
            if getattr(free, "bound", memory.MACHINE) == memory.CGROUP
            else "export on a machine with more"
        )
        hint = f"{smaller}: free some memory, or {more}"
    raise UsageError(
        f"--batch-size {batch_size} needs about {gigabytes_text(needed.bytes, digits)} to "
        f"export to {fmt} ({needed.rate:g} x {gigabytes_text(needed.counted)} for a batch of "
        f"{largest} {'x'.join(map(str, sample))} inputs{needed.held}{weights}), more than the "
        f"{gigabytes_text(free, digits)} free{memory.limit_words(free)}",
        hint,
    )


def _distinct_digits(needed: float, free: float) -> int:
    """The decimals (1 to 3) of GB at which `needed` and `free` read differently: a refusal
    read 'needs about 0.2 GB ..., more than the 0.2 GB free' (240 MB against 200 MB)."""
    digits = 1
    while digits < 3 and f"{needed / 1e9:.{digits}f}" == f"{free / 1e9:.{digits}f}":
        digits += 1
    return digits


@dataclass(frozen=True)
class MemoryNeeded:
    """An export's count: `bytes` in all, `rate` x `counted` of them for the batch, `held`
    what the batch's count is made of beside the inputs (words for the refusal)."""

    bytes: float
    rate: float
    counted: int
    held: str
    fixed: int = 0  # what the run takes whatever the batch (`_PT2_FIXED`)


def export_memory_needed(
    sample: tuple[int, ...],
    largest: int,
    call_bytes: int = 0,
    *,
    fmt: str,
    weight_bytes: int = 0,
    attention_bytes: int = 0,
    output_bytes: int = 0,
    largest_attention_bytes: int | None = None,
    held_matrices: tuple[float, int] | None = None,
) -> MemoryNeeded:
    """What `_check_batch_memory` counts an export to `fmt` of `largest` samples to need."""
    image_bytes = math.prod(sample) * 4
    kept_rate = _KEPT_PER_BATCH.get(fmt)
    batch = largest * (image_bytes + call_bytes)
    kept = largest * (image_bytes + output_bytes + attention_bytes)
    batch_rate = _PEAK_PER_BATCH[fmt]
    attention = attention_bytes or largest_attention_bytes or (held_matrices or (0, 0))[1]
    if fmt == fm.EXPORTED_PROGRAM and attention:
        batch_rate = _PT2_PER_BATCH_WITH_ATTENTION
    by_kept = kept_rate is not None and kept_rate * kept > batch_rate * batch
    rate, counted = (kept_rate, kept) if by_kept else (batch_rate, batch)
    if by_kept:
        held = " and every layer's outputs for them" + (
            f" and their {ATTENTION_MATRICES}" if attention_bytes else ""
        )
    else:
        held = " and one layer's inputs and output" if call_bytes else ""
    needed = rate * counted + _PEAK_PER_WEIGHTS[fmt] * weight_bytes
    matrix_rate = _PEAK_PER_MATRIX.get(fmt)
    matrix = attention_bytes if largest_attention_bytes is None else largest_attention_bytes
    if matrix_rate is not None and held_matrices is not None:
        matrix_rate, matrix = held_matrices
    images_rate = _IMAGES_HELD.get(fmt)
    if images_rate is not None:
        needed += images_rate * largest * image_bytes
        other_batches = gigabytes_text(largest * image_bytes)
        held += f", plus {images_rate:g} x {other_batches} for the other batches"
    if matrix_rate and matrix:  # (F.scaled_dot_product_attention's in .pt2: none held)
        needed += matrix_rate * largest * matrix
        held += (
            f", plus {matrix_rate:g} x {gigabytes_text(largest * matrix)} for their "
            f"{LARGEST_ATTENTION_MATRIX}"
        )
    fixed = pt2_fixed_bytes() if fmt == fm.EXPORTED_PROGRAM else 0
    return MemoryNeeded(needed + fixed, rate, counted, held, fixed)


def _stepper(progress: Progress | None) -> Callable[[], None]:
    done = 0

    def step() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, STEPS)

    return step


def _input_of(resolved: Any, image_size: int | None) -> tuple[Any, tuple[int, ...]]:
    """The preprocessing stored with the export (--image-size applied by `resolve_spec`) and one
    sample's input shape (C, H, W): --image-size, else the model's own size (its checkpoint's,
    its builder's)."""
    from torchkit.core.models.resolver import plain_preprocess, stem_channels

    preprocess = resolved.preprocess or plain_preprocess(stem_channels(resolved.model))
    known = tuple(resolved.sample_shape) if resolved.sample_shape else None
    channels = known[0] if known else preprocess.in_channels
    if image_size is not None:
        return preprocess, (channels, image_size, image_size)
    if known is not None and len(known) == 3:
        return preprocess, known
    return preprocess, (channels, preprocess.image_size, preprocess.image_size)


def _reference(
    model: Any, batches: list[Any], *, arch: str, trained: tuple[int, ...] | None = None
) -> list[Any]:
    """The PyTorch outputs every exported output is compared with; the model must give one
    tensor with the batch first. `trained`: the input (C, H, W) a checkpoint's model was
    trained on, which the hint of a model that does not run names."""
    import torch

    shape = "x".join(map(str, batches[0].shape))
    try:
        outputs = reference_outputs(model, batches)
    except Exception as error:
        first = batches[0]
        refusal = image_size_refusal(model, arch, first.shape, error, dtype=first.dtype)
        if refusal is not None:
            raise refusal from error
        hint = (
            "give the image size it was trained at with --image-size; a model that fixes its "
            "batch size needs --static-batch --batch-size N"
        )
        hint = trained_size_hint(trained, first.shape) or hint
        raise ExportError(
            f"{arch} does not run on an input of shape {shape}: "
            f"{first_line(error, with_type=True)}",
            hint,
        ) from error
    for batch, output in zip(batches, outputs, strict=True):
        if not isinstance(output, torch.Tensor):
            raise ExportError(
                f"{arch} returns a {type(output).__name__}, not one tensor of logits",
                "export needs a model whose forward returns a single tensor",
            )
        if output.ndim == 0 or output.shape[0] != batch.shape[0]:
            raise ExportError(
                f"{arch} gives an output of shape {tuple(output.shape)} for a batch of "
                f"{batch.shape[0]}: not one row per image"
            )
    return [output.float() for output in outputs]


def _check_float16(model: Any, example: Any, arch: str) -> None:
    import torch

    try:
        with torch.no_grad():
            model(example)
    except Exception as error:
        raise ExportError(
            f"{arch} cannot run in float16 on the CPU with this torch: "
            f"{first_line(error, with_type=True)}",
            "export float32: drop --dtype float16",
        ) from error


@contextlib.contextmanager
def _parents_removed_on_failure(target: Path):
    """The folders `atomic_path` makes for OUT are removed again if the export fails."""
    missing: list[Path] = []
    folder = target.absolute().parent
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    try:
        yield
    except BaseException:
        for made in missing:  # deepest first
            with contextlib.suppress(OSError):
                made.rmdir()
        raise
