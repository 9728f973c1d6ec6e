"""`torchkit benchmark`: images/s, latency, peak memory and TFLOP/s of a model, for inference
and training."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Optional

import typer

from torchkit.cli.options import (
    ForceOption,
    ModelOption,
    OutputOption,
    SquareInputOption,
    TrustCheckpointOption,
    WeightsOption,
    model_and_rest,
    model_argument,
)
from torchkit.cli.render import (
    OutputFormat,
    Table,
    emit,
    fixed_format,
    format_rate,
    readable_number,
    report_file,
    resolve_format,
    small_number,
)
from torchkit.cli.run_options import DEFAULT_RUN, with_inference_options
from torchkit.core.inference.options import InferenceOptions
from torchkit.core.io.sizes import SIZE_RULE, format_megabytes


class BenchmarkMode(str, Enum):
    infer = "infer"
    train = "train"
    both = "both"


# Its --batch-size is its own (a list of sizes to compare), as are its input sizes (a sample's
# shape, not a crop): the options it shares with the other inference commands are these.
@with_inference_options(only=("device", "amp", "amp_dtype", "channels_last"))
def benchmark(
    model: Annotated[Optional[str], model_argument("module")] = None,
    model_option: ModelOption = None,
    input_size: Annotated[
        Optional[str],
        typer.Option(
            "--input-size",
            "-i",
            metavar="C,H,W",
            show_default=False,
            help="One sample's input shape (the batch comes from --batch-size). Default: the "
            "checkpoint's image size; a timm model's test size where its config has one, as "
            "timm's benchmark.py (a note says so), else its train size; else 3,224,224 "
            "(3,28,28 for convnet).",
        ),
    ] = None,
    image_size: SquareInputOption = None,
    batch_size: Annotated[
        Optional[list[str]],
        typer.Option(
            "--batch-size",
            "-b",
            metavar="N[,N...]",
            show_default=False,
            help="Batch size, or a list to compare (1,8,32). With --find-batch-size: where the "
            "search starts. [default: 32; 1 with --find-batch-size; an export --static-batch "
            "file's own]",
        ),
    ] = None,
    mode: Annotated[
        BenchmarkMode,
        typer.Option(
            "--mode",
            case_sensitive=False,
            help="infer: forward passes in eval mode under inference_mode. train: forward, "
            "cross-entropy on random labels, backward and an SGD step. both: one after the "
            "other.",
        ),
    ] = BenchmarkMode.infer,
    run: InferenceOptions = DEFAULT_RUN,
    compile_model: Annotated[
        bool,
        typer.Option(
            "--compile", help="torch.compile the model first (compiled during the warm-up)."
        ),
    ] = False,
    warmup: Annotated[
        int,
        typer.Option("--warmup", min=0, metavar="N", help="Untimed steps before timing."),
    ] = 5,
    iters: Annotated[
        Optional[int],
        typer.Option(
            "--iters",
            min=1,
            metavar="N",
            show_default=False,
            help="Timed steps per configuration. [default: 20]",
        ),
    ] = None,
    seconds: Annotated[
        Optional[float],
        typer.Option(
            "--seconds",
            metavar="S",
            show_default=False,
            help="Time steps until this much timed work instead of --iters.",
        ),
    ] = None,
    find_batch_size: Annotated[
        bool,
        typer.Option(
            "--find-batch-size",
            help="Find the largest batch that fits (doubling, then bisecting) and benchmark "
            "it: until out of memory on a GPU, until --memory-limit on the CPU. The search "
            "stops within 10%: once the smallest batch that did not fit is at most 10% above "
            "the largest that did (JSON: precision, not_fitting).",
        ),
    ] = False,
    memory_limit: Annotated[
        Optional[str],
        typer.Option(
            "--memory-limit",
            metavar="SIZE|N%",
            show_default=False,
            help="With --find-batch-size: the most peak memory a batch may take: a size, "
            f"{SIZE_RULE}; or N% of the memory available at the start on the CPU, of the "
            "GPU's memory on CUDA. Peak memory is the growth of the process's RSS on the CPU, "
            "max_memory_allocated on CUDA. [default: 50% on the CPU; none on CUDA]",
        ),
    ] = None,
    max_batch_size: Annotated[
        Optional[int],
        typer.Option(
            "--max-batch-size",
            min=1,
            metavar="N",
            show_default=False,
            help="Where --find-batch-size stops. [default: 4096]",
        ),
    ] = None,
    num_classes: Annotated[
        Optional[int],
        typer.Option(
            "--num-classes",
            min=1,
            show_default=False,
            help="Classifier outputs. [default: those of --weights; else 1000 for torchvision, "
            "10 for convnet]",
        ),
    ] = None,
    weights: WeightsOption = None,
    trust_checkpoint: TrustCheckpointOption = False,
    fmt: Annotated[
        Optional[OutputFormat],
        typer.Option(
            "--format",
            case_sensitive=False,
            show_default=False,
            help="Output format. [default: json for -o FILE.json, csv for -o FILE.csv or with "
            "--append, else table]",
        ),
    ] = None,
    output: OutputOption = None,
    force: ForceOption = False,
    append: Annotated[
        bool,
        typer.Option(
            "--append",
            help="Add the rows to the CSV file -o names (it must have the same columns; a file "
            "of an earlier torchkit without the spec column takes the rows without it), or "
            "start it.",
        ),
    ] = False,
) -> None:
    """Time a model for inference and training: images/s, latency per batch (median, p90),
    peak memory, mult-adds and FLOPs per image, achieved TFLOP/s.

    Warm-up steps are not timed, CUDA is synchronised around every timed step, and the inputs
    are made on the device beforehand, so the figures are the model's alone.

    Examples:

      torchkit benchmark resnet50 --batch-size 1,8,32

      torchkit benchmark resnet50 --mode both --amp --channels-last --device cuda

      torchkit benchmark convnet --mode train --find-batch-size --memory-limit 2GB

      torchkit benchmark runs/best.pt --seconds 10 -o bench.csv --append
    """
    from torchkit.core.benchmark import (
        COLUMNS,
        BenchmarkOptions,
        check_append_target,
        check_options,
        parse_batch_sizes,
        run_benchmark,
    )
    from torchkit.core.input_size import parse_input_size
    from torchkit.core.io.errors import TorchkitError, UsageError
    from torchkit.core.summary.run import check_output

    model, extra = model_and_rest(model, model_option, [])
    if extra:
        raise UsageError(f"MODEL given twice: {extra[0]} and --model {model}", "give one of them")

    if append:  # CSV rows, added to any name (bench.csv, bench.log)
        fmt = fixed_format(fmt, output, OutputFormat.csv, "--append")
    else:
        fmt = resolve_format(fmt, output)
    output = report_file(output)
    if append and output is None:
        raise UsageError("--append needs -o FILE", "give the CSV file to add the rows to")
    if append and force:
        raise UsageError("--append keeps the file, --force replaces it", "give one of them")
    options = BenchmarkOptions(
        input_size=parse_input_size(input_size) if input_size is not None else None,
        image_size=image_size,
        batch_sizes=parse_batch_sizes(batch_size or (["1"] if find_batch_size else None)),
        default_batch_sizes=not batch_size,
        mode=mode.value,
        device=run.device,
        amp=run.amp,
        amp_dtype=run.amp_dtype,
        channels_last=run.channels_last,
        compile=compile_model,
        warmup=warmup,
        iters=iters,
        seconds=seconds,
        find_batch_size=find_batch_size,
        memory_limit=memory_limit,
        max_batch_size=max_batch_size,
        num_classes=num_classes,
        weights=weights,
        trust_checkpoint=trust_checkpoint,
    )
    check_options(options)
    # Outputs are checked before the model is built: not an input, not replaced without
    # --force; with --append an existing file must have our columns.
    check_output(model, output, weights=weights, force=force or append)
    if append:
        check_append_target(output, COLUMNS)

    from torchkit.cli import console
    from torchkit.cli.progress import progress_bar

    notes: list[str] = []  # noted once the timings are made: an error stays one line
    warnings: list[str] = []
    timed: list[Any] = []  # the result so far, after each configuration
    try:
        with progress_bar("benchmarking") as progress:
            result = run_benchmark(
                model,
                options,
                progress=progress,
                search_progress=_search_status(progress.status),
                notify=notes.append,
                timed=timed.append,
                warn=warnings.append,
            )
    except (KeyboardInterrupt, TorchkitError) as error:
        # Ctrl-C or SIGTERM in a long comparison, or an error in a later configuration (--mode
        # both: a train search that finds no batch): the configurations already timed are
        # shown, or written to -o FILE (JSON: "complete": false), not lost, before the command
        # stops as it would have.
        if timed:
            _keep_timed(timed[-1], error, fmt, output, force, append)
        raise
    for message in warnings:
        console.warn(message)
    for note in notes:
        console.note(note)
    _write(result, fmt, output, force, append)


def _keep_timed(
    result: Any, error: BaseException, fmt: OutputFormat, output: Any, force: bool, append: bool
) -> None:
    """What a stopped run timed, written as a finished run's result is, marked as stopped."""
    from torchkit.cli import console
    from torchkit.core.io.errors import Terminated

    if isinstance(error, Terminated):
        result.mark_stopped("terminated")
    elif isinstance(error, KeyboardInterrupt):
        result.mark_stopped("interrupted")
    else:
        result.mark_stopped("failed", str(error))
    _write(result, fmt, output, force, append)
    when = "before the error" if result.stopped == "failed" else "so far"
    where = "shown" if output is None else f"written to {output}"
    console.note(
        f"{result.stopped}: the {len(result.results)} of {result.planned} configuration(s) "
        f"timed {when} are {where}"
    )


def _write(result: Any, fmt: OutputFormat, output: Any, force: bool, append: bool) -> None:
    """The result as --format, -o and --append ask."""
    from torchkit.cli import console
    from torchkit.cli.render import render_csv
    from torchkit.core.benchmark import COLUMNS, append_csv

    csv_table = Table(columns=list(COLUMNS), rows=result.rows())
    if append:
        left_out = append_csv(output, render_csv(csv_table))
        console.note(f"added {len(result.results)} row(s) to {output}")
        if left_out:
            console.note(
                f"{output} has no {', '.join(left_out)} column (an earlier torchkit wrote it): "
                "the rows were added without it; write a new file (-o NEW.csv) to record it"
            )
        return
    tables = [_results_table(result)]
    if result.batch_size_search:
        tables.append(_search_table(result))
    if fmt == OutputFormat.csv:
        tables = [csv_table]
    emit(tables=tables, data=result.to_dict(), fmt=fmt, output=output, force=force)


def _tflops_text(tflops: float) -> str:
    """4 decimals; 3 significant digits below 0.01, where 4 decimals show a small model's
    achieved 1.4e-5 TFLOP/s (14 MFLOP/s) as 0.0000."""
    rounded = float(f"{tflops:.3g}")  # 0.009999 is 0.0100, not 0.01000
    if rounded == 0 or abs(rounded) >= 0.01:
        return f"{tflops:.4f}"
    return small_number(tflops)


def _results_table(result: Any) -> Table:
    mult_adds, flops = result.mult_adds_per_image, result.flops_per_image
    # None: not counted (a TorchScript module)
    per_image = (
        "unknown mult-adds" if mult_adds is None else readable_number(mult_adds, "mult-adds")
    )
    if flops is not None:
        per_image += f", {readable_number(flops, 'FLOPs')}"
    first = result.results[0] if result.results else None
    dtype = first.dtype if first is not None else ""
    settings = [dtype, f"{result.threads} threads"]
    if first is not None and first.channels_last:
        settings.append("channels-last")
    if first is not None and first.compile:
        settings.append("compiled")
    return Table(
        columns=["Mode", "Batch", "Images/s", "Median ms", "p90 ms", "Peak MB", "TFLOP/s", "Iters"],
        rows=[
            [
                row.mode,
                row.batch_size,
                format_rate(row.images_per_s),
                f"{row.latency_median_ms:,.3f}",
                f"{row.latency_p90_ms:,.3f}",
                None if row.peak_memory_mb is None else format_megabytes(row.peak_memory_mb),
                None if row.tflops is None else _tflops_text(row.tflops),
                row.iters,
            ]
            for row in result.results
        ],
        title=f"{result.model} on {'x'.join(map(str, result.input_size))} inputs, "
        f"{result.device} ({result.device_name}), {', '.join(settings)}; per image: "
        f"{per_image}" + _stopped(result),
        align_right={"Batch", "Images/s", "Median ms", "p90 ms", "Peak MB", "TFLOP/s", "Iters"},
    )


def _stopped(result: Any) -> str:
    """The title's word on a run that stopped before its last configuration."""
    if result.complete:
        return ""
    return f"; {result.stopped} after {len(result.results)} of {result.planned} configurations"


def _search_table(result: Any) -> Table:
    rows = []
    for search in result.batch_size_search:
        for trial in search.trials:
            peak = "" if trial.peak_memory_mb is None else format_megabytes(trial.peak_memory_mb)
            rows.append([search.mode, trial.batch_size, peak, trial.reason])
    limits = [
        f"{s.mode}: batch {s.batch_size} (stopped by {s.stopped_by}"
        + ("" if s.memory_limit_mb is None else f", limit {format_megabytes(s.memory_limit_mb)} MB")
        + ("" if s.not_fitting is None else f"; {s.not_fitting} did not fit")
        + f"; within {s.precision:.0%})"
        for s in result.batch_size_search
    ]
    return Table(
        columns=["Mode", "Batch", "Peak MB", "Result"],
        rows=rows,
        title="--find-batch-size: " + "; ".join(limits),
        align_right={"Batch", "Peak MB"},
    )


def _search_status(status: Any) -> Any:
    """The --find-batch-size callback: which batch runs now and the bracket so far, then the
    timing of the batch found."""

    def show(mode: str, batch: int, trials: list[Any], searching: bool) -> None:
        if not searching:
            status(f"timing the batch found ({mode}, {batch})")
            return
        fitted = [t.batch_size for t in trials if t.fits]
        failed = [t.batch_size for t in trials if t.too_big]
        known = []
        if fitted:
            known.append(f"{max(fitted)} fits")
        if failed:
            known.append(f"{min(failed)} does not")
        status(
            f"finding the batch size ({mode}): trying {batch}"
            + (f" ({', '.join(known)})" if known else "")
        )

    return show


def register(app: typer.Typer) -> None:
    app.command("benchmark")(benchmark)
