"""`torchkit predict`: the class and probability of every image, streamed in input order."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import IO, Annotated, Any, Optional

import typer

from torchkit.cli import console
from torchkit.cli.options import (
    AllowUntrainedOption,
    EmaOption,
    ForceOption,
    ModelOption,
    NullOption,
    StrictOption,
    TrustCheckpointOption,
    WeightsOption,
    data_option,
    model_and_rest,
    model_argument,
    piped_paths,
)
from torchkit.cli.render import StreamedOutputFormat
from torchkit.cli.run_options import DEFAULT_PREPROCESS, DEFAULT_RUN, with_inference_options
from torchkit.core.inference.options import InferenceOptions, PreprocessOverrides


class TTA(str, Enum):
    none = "none"
    flip = "flip"


# The streamed formats and Parquet, a file's alone (an Enum cannot be extended: one made of
# StreamedOutputFormat's members, so the list lives in one place).
PredictFormat = Enum(
    "PredictFormat",
    {**{f.name: f.value for f in StreamedOutputFormat}, "parquet": "parquet"},
    type=str,
)


@with_inference_options()
def predict_command(
    model: Annotated[Optional[str], model_argument("runtime")] = None,
    images: Annotated[
        Optional[list[str]],
        typer.Argument(
            help="Image folders (searched recursively, labelled or not), split roots, CSV "
            "indexes, image files, or - for paths on stdin (one per line; with --null, "
            "NUL-separated); or --data.",
            metavar="IMAGES...",
            show_default=False,
        ),
    ] = None,
    model_option: ModelOption = None,
    data: Annotated[Optional[list[str]], data_option(argument="IMAGES", several=True)] = None,
    weights: WeightsOption = None,
    ema: EmaOption = False,
    classes: Annotated[
        Optional[str],
        typer.Option(
            "--classes",
            help="Class names in label order: a text file (one per line) or a,b,c. Default: the "
            "checkpoint's, else the labelled data's classes in sorted order (as eval names them, "
            "when they are as many as the outputs), else the output index.",
        ),
    ] = None,
    split: Annotated[
        Optional[str],
        typer.Option(
            "--split",
            help="The split of a split root or split CSV to predict (train, val, test; default: "
            "all, with a split column).",
        ),
    ] = None,
    topk: Annotated[
        int,
        typer.Option(
            "--topk",
            "-k",
            min=1,
            help="Also give the K most likely classes: class_1..class_K, probability_1..K "
            "(JSON and JSONL: class_index_1..K too).",
        ),
    ] = 1,
    logits: Annotated[
        bool, typer.Option("--logits", help="Add the raw outputs: logit_0, logit_1, ...")
    ] = False,
    tta: Annotated[
        TTA,
        typer.Option("--tta", help="flip averages the image and its mirror.", case_sensitive=False),
    ] = TTA.none,
    preprocess: PreprocessOverrides = DEFAULT_PREPROCESS,
    run: InferenceOptions = DEFAULT_RUN,
    skip_errors: Annotated[
        bool,
        typer.Option(
            "--skip-errors", help="Leave unreadable images out (default: a row with an error)."
        ),
    ] = False,
    strict: StrictOption = False,
    trust_checkpoint: TrustCheckpointOption = False,
    allow_untrained: AllowUntrainedOption = False,
    fmt: Annotated[
        Optional[PredictFormat],
        typer.Option(
            "--format",
            help="Output format; csv and jsonl stream one row per image, parquet (with -o FILE) "
            "a row group at a time. [default: that of -o FILE.csv, FILE.json, FILE.jsonl or "
            "FILE.parquet, else table]",
            case_sensitive=False,
            show_default=False,
        ),
    ] = None,
    output: Annotated[
        Optional[Path],
        typer.Option(
            "--output", "-o", help="Write the rows to FILE instead of stdout.", dir_okay=False
        ),
    ] = None,
    force: ForceOption = False,
    null: NullOption = False,
) -> None:
    """Predict the class of every image: path, label (the true class, when known), class,
    class_index and probability, one row per image in input order; unreadable images get a row
    with an error.

    Examples:

      torchkit predict runs/best.pt photos/ --format csv -o predictions.csv

      torchkit predict runs/best.pt photos/ -o predictions.parquet

      find photos -name '*.jpg' | torchkit predict best.pt - --topk 3 --format jsonl

      find photos -name '*.jpg' -print0 | torchkit predict best.pt - --null --format csv

      torchkit predict best.pt dataset/ --split test --tta flip --format json

      torchkit predict resnet18 --weights finetuned.pth cat.jpg dog.jpg --classes cat,dog

      torchkit predict model.onnx photos/ --format csv  (classes from the exported file)
    """
    from torchkit.cli.render import report_file, resolve_format
    from torchkit.core.evaluate.source import parse_class_names
    from torchkit.core.io.file_outputs import check_output_file
    from torchkit.core.io.files import read_path_list
    from torchkit.core.models import require_model_files
    from torchkit.core.predict import PredictRequest, PredictRun
    from torchkit.core.predict.inputs import listed_images_check, require_images, streams_stdin
    from torchkit.core.runtime.launch import launch_env

    fmt = resolve_format(fmt, output, PredictFormat)
    if fmt == PredictFormat.parquet:
        _check_parquet_output(output)
    model, images = model_and_rest(model, model_option, list(images or []))
    images += data or []  # --data adds to IMAGES, after them: rows come in input order
    request = PredictRequest(
        spec=preprocess.model_spec(
            model,
            weights=weights,
            ema=ema,
            trust_checkpoint=trust_checkpoint,
            allow_untrained=allow_untrained,
            classes=parse_class_names(classes) if classes else None,
        ),
        images=list(images),
        split=split,
        topk=topk,
        logits=logits,
        run=run,
        tta=tta.value,
        strict=strict,
        skip_errors=skip_errors,
        # JSON (and Parquet) give a class's name as it is, beside its index (class_index,
        # label_index)
        names_shown=fmt in (PredictFormat.table, PredictFormat.csv),
    )
    to_file = report_file(output) is not None
    # `-` alone is read as the paths come; with other IMAGES (or under torchrun) the paths
    # piped for it first. Either way -o may not be one of those images (it may lie beside them,
    # as beside image files given as arguments).
    streamed = streams_stdin(request.images)
    # Under torchrun every rank has the same stdin: rank 0 reads it and hands the list on.
    reads_list = "-" in images and not streamed and launch_env().rank == 0
    stdin = piped_paths(images, null)
    listed = read_path_list(stdin, "image") if reads_list else None
    if to_file:  # before any work, and after the inputs: a missing one is not "-o exists"
        require_model_files(request.spec.model, request.spec.weights)
        require_images(request.images)
        check_output_file(output, force, _inputs(request, preprocess.stats, classes))
        listed_images_check(output)(listed or [])
    predicting = PredictRun(
        request,
        stdin=stdin if streamed else listed,
        check_listed=listed_images_check(output) if to_file and streamed else None,
    )
    ok = False
    try:
        predicting.setup()
        for note in predicting.notes:
            console.note(note)
        columns = predicting.columns(predicting.resolved.num_outputs)
        if not predicting.is_main:
            for _ in predicting.rows():  # rank 0 writes; the others only compute their batches
                pass
            ok = True
            return
        _write(predicting, columns, fmt, output if to_file else None)
        ok = True
    finally:
        predicting.close(ok)
    _report(predicting, output if to_file else None)


def _inputs(request, stats: str | None, classes: str | None) -> list:
    """What -o may not be, hold nor lie in: the model's files, IMAGES (but `-`'s, checked one
    by one: `listed_images_check`), the --stats and --classes files."""
    import os

    from torchkit.core.data.sources.inputs import data_inputs
    from torchkit.core.io.overlap import InputPath
    from torchkit.core.models import model_inputs

    inputs = model_inputs(request.spec.model, request.spec.weights)
    for item in request.images:
        if item != "-":
            inputs += data_inputs(item, "IMAGES")
    for path, what in ((stats, "--stats file"), (classes, "--classes file")):
        if path is not None and os.path.isfile(path):
            inputs.append(InputPath.of(path, what))
    return inputs


def _check_parquet_output(output: Path | None) -> None:
    """Parquet is a binary file: written to -o FILE, never to stdout; pyarrow must be there."""
    from torchkit.cli.render import report_file
    from torchkit.core.io.errors import UsageError
    from torchkit.core.predict.parquet_rows import require_pyarrow

    if report_file(output) is None:
        raise UsageError(
            "--format parquet writes a binary file, not rows for stdout",
            "give -o FILE.parquet, or --format csv or jsonl for stdout",
        )
    require_pyarrow()


def _write(run, columns: list[str], fmt: PredictFormat, output: Path | None) -> None:
    from torchkit.cli.progress import progress_bar
    from torchkit.core.io.files import atomic_write

    with progress_bar("predicting") as advance:
        if fmt == PredictFormat.parquet:
            from torchkit.core.predict.parquet_rows import write_parquet_rows

            with atomic_write(output, "wb") as handle:
                write_parquet_rows(run.records(progress=advance), columns, handle)
        elif output is None:
            stdout = console.stdout.file

            def advance_and_flush(done: int, total: int | None) -> None:
                # Each batch's rows out at once: a reader of the pipe gets them while the
                # list on stdin is still being written.
                stdout.flush()
                advance(done, total)

            _render(run, columns, fmt, stdout, advance_and_flush)
            stdout.flush()
        else:
            with atomic_write(output, "w", encoding="utf-8", newline="") as handle:
                _render(run, columns, fmt, handle, advance)


def _render(run, columns: list[str], fmt: PredictFormat, handle: IO[str], progress) -> None:
    from torchkit.cli.render import (
        JsonArrayWriter,
        Table,
        print_on_terminal,
        render_json,
        render_plain_tables,
        streamed_rows,
    )

    if fmt == PredictFormat.csv:
        write_csv(run.records(progress=progress), columns, handle)
        return
    from torchkit.core.io.errors import TorchkitError

    rows = run.rows(progress=progress)
    # Each row one line of JSON, as every command writes JSON (`render_json`: a name that is
    # not UTF-8 as its "\udcXX" escapes, other characters as themselves where `handle` takes
    # them).
    encoding = getattr(handle, "encoding", None) if handle is console.stdout.file else None
    if fmt == PredictFormat.jsonl:
        for row in rows:
            handle.write(render_json(_full(row, columns), encoding, indent=None))
    elif fmt == PredictFormat.json:
        # Each row a line of its own as its batch is done (JsonArrayWriter); a failure the run
        # reports (none of the images read, --strict): the rows written are a JSON list, as
        # CSV's and JSON Lines' are whole rows; a stopped run's are not.
        array = JsonArrayWriter(handle, encoding)

        def write_rows() -> None:
            for row in rows:
                array.add(_full(row, columns))

        streamed_rows(write_rows, array.close)
    else:
        shown = [c for c in columns if not c.startswith("logit_")]
        cells: list[list[Any]] = []

        def show() -> None:
            table = Table(
                shown,
                cells,
                title="Predictions",
                align_right={c for c in shown if c.startswith(("probability", "class_index"))},
            )
            if handle is console.stdout.file and console.stdout.is_terminal:
                print_on_terminal([table])
            else:
                handle.write(
                    render_plain_tables([table], encoding=getattr(handle, "encoding", None))
                )

        try:
            for row in rows:
                cells.append([row.get(c) for c in shown])
        except TorchkitError:
            if cells:  # the rows before the failure, as CSV gives them (none read: error rows)
                show()
            raise
        show()


def _full(row: dict[str, Any], columns: list[str]) -> dict[str, Any]:
    """Every column in every row: what is not known is null (an error row's class, the true
    label of an image outside any class folder; core gives None for both), as the CSV's empty
    field."""
    return {column: row.get(column) for column in columns}


def write_csv(records, columns: list[str], handle: IO[str]) -> None:
    """The header, then one line per record (a list of values in column order): floats as
    repr writes them (shortest round-trip), None as an empty field."""
    from torchkit.core.io.csv_rows import CsvWriter

    writer = CsvWriter(handle)
    writer.writerow(columns)
    for record in records:  # one at a time: rows stream as images are predicted
        writer.writerow(record)


def _report(run, output: Path | None) -> None:
    from torchkit.cli.render import format_rate

    summary = run.summary
    line = (
        f"predicted {summary.predicted} of {summary.images} images in {summary.seconds:.2f} s"
        + (f" ({format_rate(summary.images_per_second)} images/s)" if summary.predicted else "")
    )
    if summary.unreadable:  # "predicted 0 of 3 images ...; 3 unreadable": no success implied
        line += f"; {summary.unreadable} unreadable"
    if output is not None:
        line += f"; wrote {output}"
    console.note(line)
    if summary.unreadable:
        kept = "left out (--skip-errors)" if run.request.skip_errors else "rows with an error"
        console.warn(
            f"{summary.unreadable} unreadable image(s), {kept} (first: {summary.first_error}); "
            "--strict makes this an error"
        )
    if summary.nonfinite:
        console.warn(f"{summary.nonfinite} image(s) with non-finite (NaN or inf) outputs")


def register(app: typer.Typer) -> None:
    app.command("predict")(predict_command)
