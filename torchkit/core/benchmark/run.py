"""From a model spec and the options to a `BenchmarkResult`: build the model with the one
resolver, count its mult-adds and FLOPs with `summary`'s counter, then time each (mode, batch
size) configuration, or search the largest batch that fits first (`--find-batch-size`)."""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from torchkit.core.benchmark import search as batch_search
from torchkit.core.benchmark.memory import (
    CPU_DEFAULT_LIMIT,
    MemoryLimit,
    MemoryProbe,
    check_search_measures,
    parse_memory_limit,
)
from torchkit.core.benchmark.report import (
    MB,
    BenchmarkResult,
    BenchmarkRow,
    utc_timestamp,
)
from torchkit.core.benchmark.steps import (
    MODES,
    StepSettings,
    make_infer_step,
    make_train_step,
    trainable_parameters,
)
from torchkit.core.benchmark.timing import Timings, check_budget, time_steps
from torchkit.core.inference.options import check_batch_fits
from torchkit.core.io.errors import InputError, TorchkitError, UsageError, first_line, short_repr
from torchkit.core.io.option_lists import number_items
from torchkit.core.io.progress import Progress
from torchkit.core.io.sizes import gigabytes_text
from torchkit.core.models.exported.formats import TORCHSCRIPT
from torchkit.core.models.image_size import (
    ImageSizeError,
    one_value_per_channel,
    trained_input,
    trained_size_hint,
)
from torchkit.core.models.inputs import make_inputs
from torchkit.core.runtime.compiled import compile_module
from torchkit.core.runtime.device import is_out_of_memory, to_channels_last
from torchkit.core.runtime.memory import available_memory, limit_words
from torchkit.core.summary.attention import (
    ATTENTION_MATRICES,
    LARGEST_ATTENTION_MATRIX,
    SDPA,
)

log = logging.getLogger("torchkit")

DEFAULT_BATCH_SIZE = 32
DEFAULT_WARMUP = 5
DEFAULT_ITERS = 20
DEFAULT_MAX_BATCH_SIZE = 4096
TRAIN_FLOPS_FACTOR = 3  # forward + backward (about twice the forward): the usual estimate
SEARCH_STEPS = 2  # steps per --find-batch-size trial: the first allocates gradients and state
PRIME_BATCH = {"infer": 1, "train": 2}  # train: BatchNorm needs 2 samples
SAFE_FRACTION = 0.9  # of the available memory: a CPU trial predicted above it is not run


@dataclass
class BenchmarkOptions:
    """The options of `torchkit benchmark`, as core takes them."""

    input_size: tuple[int, ...] | None = None  # one sample (C, H, W); None: the model's own
    image_size: int | None = None  # --image-size N: the sample C,N,N, C the model's channels
    batch_sizes: tuple[int, ...] = (DEFAULT_BATCH_SIZE,)
    # batch_sizes is the default, not asked for (no --batch-size): an exported file of a fixed
    # batch (`export --static-batch -b N`) is timed at N, the only batch it runs
    default_batch_sizes: bool = False
    mode: str = "infer"  # infer, train or both
    device: str = "auto"
    amp: bool = False
    amp_dtype: str = "auto"  # auto, bf16 or fp16
    channels_last: bool = False
    compile: bool = False
    warmup: int = DEFAULT_WARMUP
    iters: int | None = None  # None (and no seconds): DEFAULT_ITERS
    seconds: float | None = None
    find_batch_size: bool = False
    memory_limit: str | None = None  # see core.benchmark.memory; CPU default 50%
    max_batch_size: int | None = None  # with find_batch_size; None: DEFAULT_MAX_BATCH_SIZE
    num_classes: int | None = None
    weights: str | None = None
    trust_checkpoint: bool = False
    modes: tuple[str, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        self.modes = MODES if self.mode == "both" else (self.mode,)

    @property
    def search_limit(self) -> int:
        """Where --find-batch-size stops."""
        return DEFAULT_MAX_BATCH_SIZE if self.max_batch_size is None else self.max_batch_size


def parse_batch_sizes(values: Sequence[str] | str | None) -> tuple[int, ...]:
    """'1,8,32' (or several values of a repeated option) -> (1, 8, 32); repeats dropped."""
    if values is None:
        return (DEFAULT_BATCH_SIZE,)
    if isinstance(values, str):
        values = [values]
    sizes: list[int] = []
    for value in values:
        # Commas (with or without spaces around them) or spaces separate sizes.
        hint = "give positive integers separated by commas, e.g. 1,8,32"
        try:
            parts = number_items(str(value), "--batch-size", int, spaces=True, hint=hint)
        except ValueError:
            parts = [0]
        for size in parts:
            if size < 1:
                raise UsageError(
                    f"invalid --batch-size {short_repr(value)}",
                    "give positive integers, e.g. 1,8,32",
                )
            if size not in sizes:
                sizes.append(size)
    if not sizes:
        raise UsageError("--batch-size is empty", "give positive integers, e.g. 1,8,32")
    return tuple(sizes)


def check_options(options: BenchmarkOptions) -> MemoryLimit | None:
    """Everything that can be checked before the model is built; the parsed memory limit."""
    from torchkit.core.runtime.device import check_amp_dtype

    if options.mode not in (*MODES, "both"):
        raise UsageError(f"unknown --mode {options.mode!r}", "use infer, train or both")
    check_budget(options.iters, options.seconds, options.warmup)
    check_amp_dtype(options.amp, options.amp_dtype)
    if options.warmup < 0:
        raise UsageError(f"--warmup {options.warmup}: give 0 or more")
    if options.compile and options.warmup < 1:
        raise UsageError(
            "--compile with --warmup 0 would time the compilation",
            "give --warmup 1 or more: the first steps compile",
        )
    if not options.batch_sizes or min(options.batch_sizes) < 1:
        raise UsageError("--batch-size must be positive")
    check_batch_fits(max(options.batch_sizes))
    if options.input_size is not None and (not options.input_size or min(options.input_size) < 1):
        raise UsageError(f"invalid input size {options.input_size}")
    if options.input_size is not None and options.image_size is not None:
        raise UsageError("--image-size and --input-size both give the input", "give one")
    if options.image_size is not None and options.image_size < 1:
        raise UsageError(f"invalid image size {options.image_size}")
    if options.find_batch_size:
        if len(options.batch_sizes) > 1:
            raise UsageError(
                "--find-batch-size searches one batch size; --batch-size gives several",
                "give one --batch-size to start the search from, or none",
            )
        if options.search_limit < options.batch_sizes[0]:
            raise UsageError(
                f"--max-batch-size {options.search_limit} is below the start batch "
                f"{options.batch_sizes[0]}"
            )
    else:
        # Both only shape the search: without it they would be accepted and do nothing.
        for value, option in (
            (options.memory_limit, "--memory-limit"),
            (options.max_batch_size, "--max-batch-size"),
        ):
            if value is not None:
                raise UsageError(f"{option} goes with --find-batch-size", "add --find-batch-size")
    if options.memory_limit is None:
        return None
    return parse_memory_limit(options.memory_limit)


def run_benchmark(
    spec: str,
    options: BenchmarkOptions,
    progress: Progress | None = None,
    search_progress: batch_search.SearchProgress | None = None,
    notify: Callable[[str], None] | None = None,
    timed: Callable[[BenchmarkResult], None] | None = None,
    warn: Callable[[str], None] | None = None,
) -> BenchmarkResult:
    """Benchmark the model `spec` names (any spec of `resolve_model`). `search_progress` hears
    of each `--find-batch-size` trial before it runs; `notify`, that the model has random
    weights and which size of a timm model's config it runs at (notes, not part of the
    result); `timed`, the result so far after each configuration (what an interrupted run can
    still show); `warn`, that `num_classes` replaced the head the model's weights have.

    A timm model runs at its config's test size where it has one, as timm's benchmark.py
    runs it (with or without timm's weights; resolve_model's `timm_test_size`), unless a size
    is given or a checkpoint records one."""
    from torchkit.core.input_size import square_sample
    from torchkit.core.models import ModelSpec, resolve_spec
    from torchkit.core.models.resolver import (
        has_random_weights,
        replaced_head_warning,
        untrained_note,
    )
    from torchkit.core.runtime.device import resolve_amp_dtype, select_device
    from torchkit.core.runtime.threads import compute_threads, torch_threads

    limit = check_options(options)
    device = select_device(options.device)
    if options.find_batch_size:  # before the model is built
        check_search_measures(device)
    amp_dtype = resolve_amp_dtype(options.amp_dtype, device) if options.amp else None
    sample = tuple(options.input_size) if options.input_size else None
    model_spec = ModelSpec(
        model=spec,
        weights=options.weights,
        trust_checkpoint=options.trust_checkpoint,
        num_classes=options.num_classes,
        sample_shape=sample,
        image_size=options.image_size,
    )
    resolved = resolve_spec(
        model_spec,
        command="benchmark",
        exported="module",
        new_head=True,  # --num-classes sizes the head as fine-tuning would
        timm_test_size=True,
    )
    if notify is not None and has_random_weights(resolved):
        notify(untrained_note(spec, "benchmark"))
    replaced = replaced_head_warning(resolved)
    if warn is not None and replaced is not None:
        warn(replaced)
    size_note = timm_size_note(spec, resolved.model, resolved.timm_size)
    if notify is not None and size_note is not None:
        notify(size_note)
    if options.image_size is not None:
        sample = square_sample(resolved.sample_shape, options.image_size)
    if sample is None:
        sample = resolved.sample_shape
        if sample is None:
            raise UsageError(
                f"the input size of {resolved.arch} is not known",
                "pass --input-size, e.g. 3,224,224",
            )
    if resolved.image_model and len(sample) != 3:
        raise UsageError(
            f"{resolved.arch} takes images: give --input-size as C,H,W, not "
            f"{','.join(map(str, sample))}",
            "the batch comes from --batch-size",
        )
    if resolved.exported_format == TORCHSCRIPT and "train" in options.modes:
        # Tracing (what `torchkit export` does) records BatchNorm and dropout in the mode the
        # model was in, eval: model.train() cannot switch them back on.
        log.warning(
            f"{spec} is TorchScript: --mode train times it as it was exported (a traced "
            "model keeps the eval-mode BatchNorm and dropout it was traced with), not as the "
            "model trains; benchmark the checkpoint it came from for training figures"
        )
    fixed_batch = resolved.exported_batch_size
    if fixed_batch is not None:
        if options.default_batch_sizes and not options.find_batch_size:
            options = replace(options, batch_sizes=(fixed_batch,))
        _require_fixed_batch(spec, fixed_batch, options)
    model = resolved.model
    name, source = resolved.arch, resolved.source
    trained = trained_input(resolved)
    del resolved
    with torch_threads(compute_threads()):  # no loader: every usable core
        return benchmark_model(
            model,
            sample,
            options,
            device=device,
            amp_dtype=amp_dtype,
            memory_limit=limit,
            name=name,
            spec=spec if options.weights is None else f"{spec} --weights {options.weights}",
            source=source,
            progress=progress,
            search_progress=search_progress,
            timed=timed,
            fixed_batch=fixed_batch,
            trained=trained,
        )


def timm_size_note(spec: str, model: Any, taken: str | None) -> str | None:
    """Which of the two sizes of a timm model's pretrained config it runs at (`taken`: `test`
    or `train`, ResolvedModel.timm_size) and why, with the option that gives the other, for a
    user comparing timm's benchmark.py: resnet50 at 288 px, its test size, not at its train
    size, 224. None where no such choice was made."""
    from torchkit.core.models.timm_models import timm_config_sizes

    sizes = timm_config_sizes(model) if taken is not None else None
    if sizes is None or sizes.test is None:
        return None
    if taken == "test":
        return (
            f"{spec}: {_pixels(sizes.test)}, its test size, as timm's benchmark.py takes it; "
            f"{_size_option(sizes.train, model)} for its train size"
        )
    return (
        f"{spec}: {_pixels(sizes.train)}, its train size: it is built for that size alone "
        f"(fixed_input_size), where timm's benchmark.py takes its test size "
        f"({_pixels(sizes.test)})"
    )


def _pixels(size: tuple[int, int]) -> str:
    height, width = size
    return f"{height} px" if height == width else f"{height}x{width} px"


def _size_option(size: tuple[int, int], model: Any) -> str:
    """The option that gives `size`: --image-size N for a square one."""
    height, width = size
    if height == width:
        return f"--image-size {height}"
    config = getattr(model, "pretrained_cfg", None) or {}
    channels = int((config.get("input_size") or (3,))[0])
    return f"--input-size {channels},{height},{width}"


def _require_fixed_batch(spec: str, fixed_batch: int, options: BenchmarkOptions) -> None:
    """An exported file of a fixed batch (`export --static-batch`) runs batches of that size
    only: another --batch-size, or a search, is refused before any work."""
    hint = f"give --batch-size {fixed_batch}, or export it without --static-batch"
    if options.find_batch_size:
        raise UsageError(
            f"--find-batch-size cannot search {spec}: it takes batches of {fixed_batch} only",
            hint,
        )
    others = [size for size in options.batch_sizes if size != fixed_batch]
    if others:
        raise UsageError(
            f"{spec} takes batches of {fixed_batch} only (exported with --static-batch), not "
            f"{', '.join(map(str, others))}",
            hint,
        )


def benchmark_model(
    model: Any,
    sample_shape: Sequence[int],
    options: BenchmarkOptions,
    *,
    device: Any = None,
    amp_dtype: Any = None,
    memory_limit: MemoryLimit | None = None,
    name: str | None = None,
    spec: str | None = None,
    source: str = "module",
    progress: Progress | None = None,
    search_progress: batch_search.SearchProgress | None = None,
    timed: Callable[[BenchmarkResult], None] | None = None,
    fixed_batch: int | None = None,
    trained: tuple[int, ...] | None = None,
) -> BenchmarkResult:
    """Benchmark an `nn.Module` on random inputs of `sample_shape` (one sample, no batch).
    `timed` hears the result so far after each configuration; `fixed_batch`: the only batch
    size the model runs (an exported file's), which its counts and warm-up use; `trained`:
    the input a checkpoint's model was trained on, which a model that fails on another names.

    The model is moved to `device` (default: the one `options.device` names), and trained in
    place in train mode (its weights take SGD steps): pass a copy to keep them."""
    import torch

    from torchkit.core.runtime.device import resolve_amp_dtype, select_device
    from torchkit.core.summary import summarize

    if memory_limit is None:
        memory_limit = check_options(options)
    if device is None:
        device = select_device(options.device)
        if options.amp and amp_dtype is None:
            amp_dtype = resolve_amp_dtype(options.amp_dtype, device)
    if options.find_batch_size:
        check_search_measures(device)
    sample = tuple(int(n) for n in sample_shape)
    if options.channels_last and len(sample) != 3:
        raise UsageError(
            "--channels-last needs images (an input size C,H,W)", "drop --channels-last"
        )
    name = name or type(model).__name__
    spec = spec or name
    if options.compile and isinstance(model, torch.jit.ScriptModule):
        raise UsageError(
            f"--compile cannot compile {spec}: it is TorchScript, which torch.compile refuses",
            "drop --compile; TorchScript runs through its own JIT",
        )
    if "train" in options.modes:  # before any configuration is timed, not after infer's
        trainable_parameters(model)

    # summary's counter, on a meta-device copy at batch 1: per-image figures at no cost.
    count_batch = fixed_batch or 1
    try:
        counted = _per_image(
            summarize(model, [(count_batch, *sample)], count_flops=True), count_batch
        )
    except ImageSizeError as error:  # its hint names the smallest size and the option
        sized_by_input = options.input_size is not None  # -i, which --image-size contradicts
        raise (error.for_input_size() if sized_by_input else error) from error.__cause__
    except UsageError as error:  # the model does not take this input: say which option
        by_input = options.input_size is not None
        hint = trained_size_hint(trained, sample, input_size=by_input) or "check --input-size"
        raise UsageError(error.message, hint) from error
    if device.type == "cpu" and not options.find_batch_size:  # the search predicts its own
        attention = _trained_attention(model, (count_batch, *sample), counted, options)
        _check_fits_in_memory(name, counted, options, amp_dtype, attention)
    model.to(device)
    if options.channels_last:
        to_channels_last(model)
    # One graph per batch size and mode (dynamic=False): what a fixed-shape loop would run.
    runnable = compile_module(model, dynamic=False) if options.compile else model
    weights_dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
    _refuse_autocast_of_low_precision(spec, weights_dtype, amp_dtype)
    dtype = amp_dtype or weights_dtype or torch.float32
    context = _Context(
        name=name,
        spec=spec,
        model=runnable,
        sample=sample,
        options=options,
        settings=StepSettings(device, amp_dtype, options.channels_last, options.compile),
        device_name=_device_name(device),
        dtype=str(dtype).removeprefix("torch."),
        mult_adds=counted.total_mult_adds,
        flops=counted.flops,
        fixed_batch=fixed_batch,
    )
    result = BenchmarkResult(
        model=name,
        source=source,
        input_size=list(sample),
        device=str(device),
        device_name=context.device_name,
        threads=torch.get_num_threads(),
        torch_version=torch.__version__,
        params=counted.total_params,
        mult_adds_per_image=counted.total_mult_adds,
        flops_per_image=counted.flops,
        settings=_settings(options, context.dtype),
    )
    with _cudnn_benchmark(device):
        # --warmup 0: nothing runs untimed, but a search's trials run untimed anyway, and the
        # first one must not count the process's one-time allocations against the limit.
        if (options.warmup or options.find_batch_size) and not options.compile:
            context.prime()
        if options.find_batch_size:
            limit_bytes = _limit_bytes(memory_limit, device)
            for done, mode in enumerate(options.modes):
                found = _search(context, mode, limit_bytes, search_progress)
                result.batch_size_search.append(found)
                result.results.append(context.run(mode, found.batch_size))
                if timed is not None:
                    timed(result)
                if progress is not None:
                    progress(done + 1, len(options.modes))
        else:
            total = len(options.modes) * len(options.batch_sizes)
            for mode in options.modes:  # infer first: train changes the weights
                for batch in options.batch_sizes:
                    result.results.append(context.run(mode, batch))
                    if timed is not None:
                        timed(result)
                    if progress is not None:
                        progress(len(result.results), total)
    return result


def _refuse_autocast_of_low_precision(spec: str, weights_dtype: Any, amp_dtype: Any) -> None:
    """Autocast casts float32 tensors only: weights in another half precision than --amp's
    (a float16 file of `export --dtype float16` under the CPU's bfloat16) meet images in
    --amp's, and every configuration failed with a dtype mismatch."""
    import torch

    halves = (torch.float16, torch.bfloat16)
    if amp_dtype is None or weights_dtype not in halves or weights_dtype == amp_dtype:
        return
    held = str(weights_dtype).removeprefix("torch.")
    wanted = str(amp_dtype).removeprefix("torch.")
    raise UsageError(
        f"--amp runs in {wanted}, but the weights of {spec} are {held} already: autocast "
        f"casts float32 only",
        f"drop --amp, as the model runs in {held} already, or give --amp-dtype "
        f"{'fp16' if weights_dtype == torch.float16 else 'bf16'}",
    )


@dataclass
class _Context:
    name: str
    spec: str  # the model spec as given, for the rows
    model: Any
    sample: tuple[int, ...]
    options: BenchmarkOptions
    settings: StepSettings
    device_name: str
    dtype: str
    mult_adds: int
    flops: int | None
    fixed_batch: int | None = None  # the only batch the model runs (an exported file's)

    @property
    def device(self) -> Any:
        return self.settings.device

    def run(self, mode: str, batch: int) -> BenchmarkRow:
        """Time one configuration; its peak memory spans the warm-up and the timed steps."""
        import torch

        options = self.options
        iters = options.iters
        if iters is None and options.seconds is None:
            iters = DEFAULT_ITERS
        probe = MemoryProbe(self.device)
        log.info("%s: %s at batch %d", self.name, mode, batch)
        with self._failures(mode, batch, probe):
            probe.start()
            step, release = self._step(mode, batch)
            try:
                timings = time_steps(
                    step,
                    warmup=options.warmup,
                    iters=iters,
                    seconds=options.seconds,
                    sync=_sync(self.device),
                )
                peak = probe.stop()
            finally:
                release()
                del step
        _free(self.device)
        return self._row(mode, batch, timings, peak, probe.kind, torch.get_num_threads())

    def prime(self) -> None:
        """One step of each mode at a small batch, not measured: what the first step of a
        process loads once (oneDNN's kernels and caches, cuBLAS handles, autograd's engine)
        does not count as the first configuration's memory. A failure here shows again,
        reported, in the run itself; a model the mode cannot run at any batch (nothing to
        train on) stops here, before infer's configurations are timed and lost."""
        for mode in self.options.modes:
            step = release = None
            try:
                step, release = self._step(mode, self.fixed_batch or PRIME_BATCH[mode])
                step()
            except UsageError:
                raise
            except Exception:  # the run itself reports it
                pass
            finally:
                if release is not None:
                    release()
                step = release = None
                _free(self.device)

    def trial(self, mode: str, batch: int, limit_bytes: int | None) -> batch_search.Trial:
        """A few steps at `batch`: does it fit (no out-of-memory, peak within the limit)?"""
        probe = MemoryProbe(self.device)
        out_of_memory = too_small = False
        try:
            with self._failures(mode, batch, probe, out_of_memory_is_error=False):
                probe.start()
                step, release = self._step(mode, batch)
                try:
                    for _ in range(SEARCH_STEPS):
                        step()
                    peak = probe.stop()
                finally:
                    release()
                    del step
        except _OutOfMemory:
            out_of_memory = True  # freed below, once the exception and its frames are gone
        except _TooSmall:
            too_small = True
        _free(self.device)
        if too_small:
            log.info("batch %d: too small to train", batch)
            return batch_search.Trial(batch, False, None, batch_search.TOO_SMALL)
        if out_of_memory:
            log.info("batch %d: out of memory", batch)
            return batch_search.Trial(batch, False, None, batch_search.OUT_OF_MEMORY)
        fits = limit_bytes is None or peak is None or peak <= limit_bytes
        peak_mb = None if peak is None else _round(peak / MB, 3)
        log.info("batch %d: peak %s MB, %s", batch, peak_mb, "fits" if fits else "too much")
        reason = batch_search.FITS if fits else batch_search.OVER_LIMIT
        return batch_search.Trial(batch, fits, peak_mb, reason)

    def _step(self, mode: str, batch: int):
        import torch

        if self.options.compile:
            # A fresh compilation per configuration, made during its warm-up: the graphs of
            # earlier ones would otherwise fill dynamo's cache until it falls back to eager.
            torch.compiler.reset()
        settings = self.settings
        # In the weights' dtype (a float16 TorchScript file of `export --dtype float16`
        # refuses float32 images); autocast casts float32 ones under --amp.
        dtype = None if settings.amp_dtype is not None else getattr(torch, self.dtype)
        (images,) = make_inputs(
            [(batch, *self.sample)],
            dtype,
            device=settings.device,
            channels_last=settings.channels_last,
        )
        if mode == "infer":
            return make_infer_step(self.model, images, self.settings), lambda: None
        train = make_train_step(self.model, images, self.settings)
        return train.step, lambda: train.release(self.model)

    @contextlib.contextmanager
    def _failures(self, mode: str, batch: int, probe: MemoryProbe, out_of_memory_is_error=True):
        """Errors of a configuration as one clear line; in a search trial, out of memory as
        `_OutOfMemory` and a batch of 1 BatchNorm cannot train on as `_TooSmall`."""
        try:
            yield
        except (TorchkitError, KeyboardInterrupt):
            probe.cancel()
            raise
        except Exception as error:
            probe.cancel()
            if is_out_of_memory(error):
                if not out_of_memory_is_error:
                    raise _OutOfMemory() from None
                raise TorchkitError(
                    f"out of memory in {mode} mode at batch {batch} on {self.device}",
                    "use a smaller --batch-size, --amp, or --find-batch-size",
                ) from None
            if not out_of_memory_is_error and mode == "train" and one_value_per_channel(error):
                raise _TooSmall() from None
            shape = "x".join(map(str, self.sample))
            hint = "check --input-size, --batch-size and --mode"
            if self.options.compile:
                hint += ", or drop --compile"
            raise InputError(
                f"{self.name} fails in {mode} mode at batch {batch} on {shape} inputs: "
                f"{first_line(error, with_type=True)}",
                hint,
            ) from error

    def _row(
        self, mode: str, batch: int, timings: Timings, peak: int | None, kind: str, threads: int
    ) -> BenchmarkRow:
        import torch

        images_per_s = timings.per_second(batch)
        factor = TRAIN_FLOPS_FACTOR if mode == "train" else 1
        step_flops = None if self.flops is None else self.flops * factor
        tflops = None
        if step_flops is not None and math.isfinite(images_per_s):
            tflops = step_flops * images_per_s / 1e12
        return BenchmarkRow(
            model=self.name,
            spec=self.spec,
            mode=mode,
            batch_size=batch,
            input_size="x".join(map(str, self.sample)),
            device=str(self.device),
            device_name=self.device_name,
            dtype=self.dtype,
            amp=self.settings.amp_dtype is not None,
            channels_last=self.options.channels_last,
            compile=self.options.compile,
            threads=threads,
            warmup=self.options.warmup,
            iters=timings.iters,
            timed_s=_round(timings.total, 6),
            images_per_s=_round(images_per_s, 3),
            latency_median_ms=_round(timings.median * 1000, 4),
            latency_p90_ms=_round(timings.p90 * 1000, 4),
            peak_memory_mb=_round(None if peak is None else peak / MB, 3),
            memory_kind=kind,
            mult_adds_per_image=self.mult_adds,
            flops_per_image=self.flops,
            step_flops_per_image=step_flops,
            tflops=_significant(tflops, 6),  # a small model's 1e-7 TFLOP/s is not 0
            torch_version=torch.__version__,
            timestamp=utc_timestamp(),
        )


class _OutOfMemory(Exception):
    pass


class _TooSmall(Exception):
    pass


def _per_image(counted: Any, batch: int) -> Any:
    """summary's counts at `batch`, made per image (they grow linearly with the batch)."""
    if batch == 1:
        return counted
    for name in ("total_mult_adds", "flops"):
        value = getattr(counted, name)
        if value is not None:
            setattr(counted, name, value // batch)
    for name in ("input_mb", "largest_call_mb", "forward_backward_mb"):
        value = getattr(counted, name)
        if value is not None:
            setattr(counted, name, value / batch)
    counted.attention = counted.attention.per_sample(batch)
    return counted


def _trained_attention(
    model: Any, shape: tuple[int, ...], counted: Any, options: BenchmarkOptions
) -> Any:
    """The attention matrices of a training-mode pass of `shape` (the eval pass's), per image,
    where train mode is asked and the eval pass saw F.scaled_dot_product_attention without
    dropout: a model that passes `dropout_p` in training only (timm's `dropout_p=
    self.attn_drop.p if self.training else 0.`) runs the math path there and keeps its
    matrices (summary/attention.py), which the eval pass cannot show. Otherwise the eval
    pass's (its counts hold for training)."""
    from torchkit.core.summary import summarize

    if "train" not in options.modes or not counted.attention.total(SDPA):
        return counted.attention
    try:
        trained = summarize(model, [shape], count_flops=False, train_mode=True).attention
        return trained.per_sample(shape[0])
    except Exception:  # noqa: BLE001 - the eval pass's count; the run reports a real failure
        return counted.attention


def _check_fits_in_memory(
    name: str,
    counted: Any,
    options: BenchmarkOptions,
    amp_dtype: Any,
    trained: Any = None,
) -> None:
    """Refuse, before any configuration runs, a CPU batch whose least memory is more than the
    machine has available: the kernel overcommits, so such a run is not an out-of-memory error
    but the OOM killer's SIGKILL (or a swapping machine). The least memory is the input batch
    and what one layer holds at once (its inputs and its output: a first convolution's output
    is several times the images), or the largest attention matrix where that is more, in infer
    mode; in train mode the input batch and the layers' outputs autograd keeps for the
    backward pass, with the attention matrices it keeps (`trained`: a training-mode pass's,
    else `counted`'s). Both are summary's counts at batch 1 (the matrices:
    summary/attention.py; the fused kernel of F.scaled_dot_product_attention holds none,
    nn.MultiheadAttention's without weights only on its inference fast path; with dropout,
    training keeps each DROPOUT_KEPT times over, and F.scaled_dot_product_attention called
    with dropout holds that many in inference too), activations halved for a 16-bit
    --amp; a real step takes about twice them."""
    available = available_memory()
    if available is None or counted.input_mb is None:
        return
    halved = 2 if amp_dtype is not None and amp_dtype.itemsize == 2 else 1
    layer = (counted.largest_call_mb or 0) * MB
    matrix = counted.attention.held_in_inference()
    per_image = {
        "infer": counted.input_mb * MB + max(layer, matrix) / halved,
        "train": counted.input_mb * MB,
    }
    trained = counted.attention if trained is None else trained
    kept_matrices = trained.kept_in_training()
    if counted.forward_backward_mb is not None:
        kept = counted.forward_backward_mb * MB / 2  # summary counts forward + backward
        per_image["train"] += (kept + kept_matrices) / halved
    for mode in options.modes:
        batch = max(options.batch_sizes)
        needed = batch * per_image[mode]
        if needed > available:
            if mode == "train":
                what = "the activations kept for backward" + (
                    f" and their {ATTENTION_MATRICES}" if kept_matrices else ""
                )
            elif matrix > layer:
                what = f"the input batch and its {LARGEST_ATTENTION_MATRIX}"
            else:
                what = "the input batch and one layer's inputs and output"
            # a value this machine cannot run, refused before any work: a usage error, as
            # export's, summary's and --num-classes' memory refusals are (conventions.md)
            raise UsageError(
                f"{name} in {mode} mode at batch {batch} needs at least "
                f"{gigabytes_text(needed)} ({what}), more than the "
                f"{gigabytes_text(available)} of memory available{limit_words(available)}",
                "give a smaller --batch-size, or find the largest that fits with --find-batch-size",
            )


def _search(
    context: _Context,
    mode: str,
    limit_bytes: int | None,
    search_progress: batch_search.SearchProgress | None = None,
) -> batch_search.BatchSearch:
    options = context.options
    on_cpu = context.device.type != "cuda"
    available = available_memory() if on_cpu else None

    def try_batch(batch: int, trials: list[batch_search.Trial]) -> batch_search.Trial:
        if search_progress is not None:
            search_progress(mode, batch, trials, True)
        predicted = batch_search.predicted_peak(batch, trials)
        too_big = available is not None and predicted is not None
        if too_big and predicted * MB > SAFE_FRACTION * available:
            log.info("batch %d: predicted %.0f MB, not run", batch, predicted)
            return batch_search.Trial(batch, False, None, batch_search.PREDICTED_OVER)
        return context.trial(mode, batch, limit_bytes)

    limit_mb = None if limit_bytes is None else _round(limit_bytes / MB, 6)
    found, stopped_by, trials = batch_search.search_batch_size(
        try_batch,
        start=options.batch_sizes[0],
        max_batch=options.search_limit,
        precision=batch_search.PRECISION,
        limit_mb=limit_mb,
    )
    if search_progress is not None:
        search_progress(mode, found, trials, False)
    not_fitting = [t.batch_size for t in trials if t.too_big]
    return batch_search.BatchSearch(
        mode=mode,
        batch_size=found,
        memory_limit_mb=limit_mb,
        stopped_by=stopped_by,
        trials=trials,
        precision=batch_search.PRECISION,
        not_fitting=min(not_fitting) if not_fitting else None,
    )


def _limit_bytes(limit: MemoryLimit | None, device: Any) -> int | None:
    """The search's limit: --memory-limit; on the CPU 50% of the available memory without one
    (on CUDA running out of memory is the limit)."""
    if limit is None and device.type != "cuda":
        limit = parse_memory_limit(CPU_DEFAULT_LIMIT)
    return None if limit is None else limit.resolve(device)


def _sync(device: Any):
    """What waits for the device's queued work: CUDA and MPS run asynchronously."""
    import torch

    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    if device.type == "mps":
        return torch.mps.synchronize
    return None


def _free(device: Any) -> None:
    """Give the GPU's cached blocks back after a configuration (the next one, or a search
    trial after an out-of-memory, starts clean). On the CPU the next `MemoryProbe.start`
    collects and trims anyway."""
    if device.type == "cuda":
        import gc

        import torch

        gc.collect()
        torch.cuda.empty_cache()


@contextlib.contextmanager
def _cudnn_benchmark(device: Any):
    """cuDNN picks its fastest algorithms per input shape (during the warm-up), as a tuned
    training or inference loop would."""
    import torch

    if device.type != "cuda":
        yield
        return
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = before


def _device_name(device: Any) -> str:
    if device.type == "cuda":
        import torch

        return torch.cuda.get_device_name(device)
    from torchkit.core.env import cpu_model

    return cpu_model()


def _settings(options: BenchmarkOptions, dtype: str) -> dict[str, Any]:
    return {
        "modes": list(options.modes),
        "batch_sizes": list(options.batch_sizes),
        "warmup": options.warmup,
        "iters": options.iters
        if options.iters is not None or options.seconds is not None
        else DEFAULT_ITERS,
        "seconds": options.seconds,
        "amp": options.amp,
        "dtype": dtype,
        "channels_last": options.channels_last,
        "compile": options.compile,
        "find_batch_size": options.find_batch_size,
        "memory_limit": options.memory_limit,
        "max_batch_size": options.search_limit if options.find_batch_size else None,
    }


def _round(value: float | None, digits: int) -> float | None:
    if value is None or not math.isfinite(value):
        return value
    return round(value, digits)


def _significant(value: float | None, digits: int) -> float | None:
    """`value` to `digits` significant digits (decimals would round a small one to 0)."""
    if value is None or not math.isfinite(value) or value == 0:
        return value
    return float(f"{value:.{digits}g}")
