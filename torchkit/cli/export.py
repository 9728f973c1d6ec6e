"""`torchkit export`: a model -> ONNX, TorchScript or torch.export, verified against PyTorch."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from torchkit.cli import console
from torchkit.cli.options import (
    EmaOption,
    FileOutOption,
    ForceOption,
    FormatOption,
    ModelOption,
    OutputOption,
    TrustCheckpointOption,
    WeightsOption,
    image_size_option,
    model_and_rest,
    model_argument,
    product_path,
)
from torchkit.cli.render import OutputFormat, Table, emit, resolve_format


class ExportFormat(str, Enum):
    onnx = "onnx"
    torchscript = "torchscript"
    exported_program = "exported-program"


class ExportDtype(str, Enum):
    float32 = "float32"
    float16 = "float16"


def export(
    model: Annotated[Optional[str], model_argument()] = None,
    out: Annotated[
        Optional[Path],
        typer.Argument(
            help="The file to write: .onnx (ONNX), .ts or .pt (TorchScript), .pt2 "
            "(torch.export); any other name with --to. Or --out.",
            metavar="OUT",
            show_default=False,
            dir_okay=False,
        ),
    ] = None,
    out_option: FileOutOption = None,
    model_option: ModelOption = None,
    to: Annotated[
        Optional[ExportFormat],
        typer.Option(
            "--to",
            case_sensitive=False,
            show_default=False,
            help="The format. Default: from OUT's extension.",
        ),
    ] = None,
    weights: WeightsOption = None,
    num_classes: Annotated[
        Optional[int],
        typer.Option("--num-classes", min=1, help="Classifier outputs of a model built here."),
    ] = None,
    ema: EmaOption = False,
    image_size: Annotated[
        Optional[str],
        image_size_option(
            "Input height and width. Default: the model's (its checkpoint's, its weights', "
            "28 for convnet, 224 otherwise)."
        ),
    ] = None,
    batch_size: Annotated[
        int,
        typer.Option(
            "--batch-size",
            "-b",
            min=1,
            help="The batch size fixed by --static-batch; without it, the first batch size "
            "verified.",
        ),
    ] = 1,
    static_batch: Annotated[
        bool,
        typer.Option(
            "--static-batch",
            help="Fix the batch dimension to --batch-size (default: any batch size).",
        ),
    ] = False,
    opset: Annotated[
        Optional[int],
        typer.Option("--opset", min=1, show_default=False, help="ONNX opset. [default: 17]"),
    ] = None,
    dtype: Annotated[
        ExportDtype,
        typer.Option(
            "--dtype",
            case_sensitive=False,
            help="Weights and input dtype of the exported model.",
        ),
    ] = ExportDtype.float32,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify/--no-verify",
            help="Load the file with its runtime and compare its outputs with PyTorch's.",
        ),
    ] = True,
    atol: Annotated[
        Optional[float],
        typer.Option(
            "--atol",
            min=0,
            show_default=False,
            help="Absolute tolerance of the verification. [default: 1e-4 float32, 1e-2 float16]",
        ),
    ] = None,
    rtol: Annotated[
        Optional[float],
        typer.Option(
            "--rtol",
            min=0,
            show_default=False,
            help="Tolerance relative to the largest PyTorch output: outputs pass within "
            "atol + rtol x max |output|. [default: 1e-3 float32, 2e-2 float16]",
        ),
    ] = None,
    trust_checkpoint: TrustCheckpointOption = False,
    fmt: FormatOption = None,
    output: OutputOption = None,
    force: ForceOption = False,
) -> None:
    """Export a model to ONNX, TorchScript or torch.export, verified against PyTorch.

    The file is loaded back with its own runtime (onnxruntime, torch.jit.load,
    torch.export.load) and run on seeded random batches: outputs farther from
    PyTorch's than the tolerance fail the export, and nothing is left at OUT.
    The classes and preprocessing are stored in the file (ONNX metadata_props
    torchkit.*; torchkit.json inside TorchScript and torch.export archives).

    Examples:

      torchkit export runs/exp1/best.pt model.onnx

      torchkit export runs/exp1/best.pt model.pt2 --static-batch -b 8

      torchkit export resnet50 --weights DEFAULT r50.onnx --dtype float16
    """
    from torchkit.cli.progress import progress_bar
    from torchkit.core.export import ExportRequest, check_outputs, export_model
    from torchkit.core.input_size import image_shape_channels, parse_image_side
    from torchkit.core.io.errors import UsageError
    from torchkit.core.io.file_outputs import ReplacedFiles

    fmt = resolve_format(fmt, output)
    model, rest = model_and_rest(model, model_option, [out] if out is not None else [])
    if len(rest) > 1:
        raise UsageError(f"unexpected extra argument: {rest[1]}", "give MODEL and OUT")
    out = product_path(rest[0] if rest else None, out_option)
    check_outputs(model, out, output, weights=weights, force=force)
    request = ExportRequest(
        model=model,
        out=str(out),
        to=to.value if to else None,
        weights=weights,
        num_classes=num_classes,
        trust_checkpoint=trust_checkpoint,
        ema=ema,
        image_size=parse_image_side(image_size),
        image_channels=image_shape_channels(image_size),
        batch_size=batch_size,
        static_batch=static_batch,
        opset=opset,
        dtype=dtype.value,
        atol=atol,
        rtol=rtol,
        verify=verify,
        force=force,
    )
    # An old OUT and report replaced with --force are set aside until both new ones are in
    # place: a report that cannot be written (a full disk) leaves both old files as they were.
    with ReplacedFiles() as replaced:
        replaced.set_aside(out)  # before export_model checks OUT again
        with progress_bar("Exporting") as progress:
            result = export_model(request, progress=progress)
        replaced.wrote(out)
        data = result.to_dict()
        if fmt == OutputFormat.csv:
            # One row, the JSON keys as columns: easy to append to a log of exports.
            row = [_csv_cell(key, value) for key, value in data.items()]
            tables = [Table(columns=list(data), rows=[row])]
        else:
            tables = [_result_table(data)]
        emit(
            tables=tables,
            data=data,
            fmt=fmt,
            output=output,
            force=force,
            written=[out],
            replaced=replaced,
        )
    if result.verification == "skipped":
        console.warn(f"{result.path} was not verified (--no-verify)")
    elif result.traced_input_values:
        places = result.traced_input_values
        more = f" (and {len(places) - 1} more)" if len(places) > 1 else ""
        console.warn(
            f"the verification of {result.path} is inconclusive: the model turns a value of "
            f"its input into a Python value at {places[0]}{more}, perhaps in a branch, which the "
            "file keeps fixed to what the example input gave, so inputs that would go another "
            "way there may get wrong outputs (write it with tensor operations such as "
            "torch.where to export it whole)"
        )
    elif result.verification == "inconclusive":
        console.warn(
            f"the verification of {result.path} is inconclusive: PyTorch's outputs for distinct "
            f"inputs differ by at most {result.output_spread:.3g}, within twice the tolerance "
            f"{result.tolerance:.3g}, so an export that ignored its input would pass too "
            "(untrained or zero-initialised weights?)"
        )
    if result.random_weights:
        from torchkit.core.models.resolver import untrained_note

        console.note(untrained_note(model, "export"))


def _shape(data: dict) -> str:
    batch = "N" if data["dynamic_batch"] else str(data["batch_size"])
    return "x".join([batch, *map(str, data["input_shape"])])


def _csv_cell(key: str, value):
    """A list as one CSV cell: the input shape as the table shows it (3x224x224), numbers
    separated by spaces (as video-info's frame_indices), places in the model's code by `; `."""
    if key == "input_shape":
        return "x".join(map(str, value))
    if isinstance(value, list):
        separator = " " if all(isinstance(v, int) for v in value) else "; "
        return separator.join(map(str, value))
    return value


def _verified_cell(data: dict) -> str:
    batches = ", ".join(map(str, data["verified_batch_sizes"]))
    if data["verification"] == "passed":
        return f"yes, in {data['runtime']} at batch {batches}"
    if data["verification"] == "inconclusive" and data["traced_input_values"]:
        return (
            f"inconclusive: the trace fixed a value read from the input "
            f"({data['runtime']} at batch {batches})"
        )
    if data["verification"] == "inconclusive":
        return f"inconclusive: the outputs barely depend on the input ({data['runtime']})"
    return "no (--no-verify)"


def _result_table(data: dict) -> Table:
    diff = data["max_abs_diff"]
    rows = [
        ["format", data["format"]],
        ["path", data["path"]],
        ["model", data["arch"]],
        ["opset", data["opset"]],
        ["dtype", data["dtype"]],
        ["dynamic batch", data["dynamic_batch"]],
        ["input shape", _shape(data)],
        ["classes", data["num_classes"]],
        ["class names stored", data["classes_stored"]],
        ["metadata", data["metadata"]],
        ["file size (bytes)", f"{data['file_bytes']:,}"],
        ["verified", _verified_cell(data)],
        ["max abs diff", f"{diff:.3g}" if diff is not None else None],
        [
            "tolerance",
            f"{data['tolerance']:.3g} (atol {data['atol']:g} + rtol {data['rtol']:g} x max "
            "|output|)"
            if data["tolerance"] is not None
            else None,
        ],
        ["seconds", f"{data['seconds']:.2f}"],
    ]
    return Table(columns=["quantity", "value"], rows=rows, title=f"Exported {data['path']}")


def register(app: typer.Typer) -> None:
    app.command("export")(export)
