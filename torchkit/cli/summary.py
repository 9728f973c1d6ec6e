"""`torchkit summary`: a Keras-like layer table with shapes, parameters, mult-adds and memory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from torchkit.cli.options import (
    DeviceOption,
    ForceOption,
    FormatOption,
    ModelOption,
    OutputOption,
    SquareInputOption,
    TrustCheckpointOption,
    WeightsOption,
    former_short_flag,
    model_argument,
)
from torchkit.cli.render import OutputFormat, Table, emit, readable_number, resolve_format

LAYER_COLUMNS = [
    "depth",
    "name",
    "type",
    "input_shape",
    "output_shape",
    "params",
    "trainable",
    "mult_adds",
    "call",
]
TOTAL_LABELS = {
    "total_params": "Total params",
    "trainable_params": "Trainable params",
    "non_trainable_params": "Non-trainable params",
    "total_mult_adds": "Total mult-adds",
    "flops": "FLOPs (FlopCounterMode)",
    "input_mb": "Input size (MB)",
    "forward_backward_mb": "Forward/backward pass size (MB)",
    "attention_mb": "Attention matrices (MB)",
    "largest_attention_mb": "Largest attention matrix (MB)",
    "params_mb": "Params size (MB)",
    "buffers_mb": "Buffers size (MB)",
    "total_mb": "Estimated total size (MB)",
}

# Shown in the table where the pass made attention matrices (JSON has them always)
ATTENTION_KEYS = ("attention_mb", "largest_attention_mb")


def summary(
    ctx: typer.Context,
    model: Annotated[Optional[str], model_argument("module")] = None,
    model_option: ModelOption = None,
    list_models: Annotated[
        bool, typer.Option("--list", help="List the model names and exit.")
    ] = False,
    input_size: Annotated[
        Optional[list[str]],
        typer.Option(
            "--input-size",
            "-i",
            metavar="[NAME=]SHAPE[:DTYPE]",
            help="One input of forward: SHAPE is one sample's shape, C H W or 3,224,224 "
            "(--batch-size is added; an image model's N,C,H,W is taken as is); NAME= passes it "
            "as a keyword argument (input_ids=128:long); :DTYPE sets its dtype (long, int, bool, "
            "float16, bfloat16, float32...); () is a sample with no dimensions. Repeat for "
            "several inputs. Default: the checkpoint's image size, else 3,224,224 (3,28,28 for "
            "convnet); none known (a module:Callable): parameters only.",
            show_default=False,
        ),
    ] = None,
    image_size: SquareInputOption = None,
    batch_size: Annotated[
        Optional[int],
        typer.Option("--batch-size", "-b", min=1, help="Batch size. [default: 1]"),
    ] = None,
    no_batch_dim: Annotated[
        bool,
        typer.Option(
            "--no-batch-dim",
            help="Take every --input-size as the full shape, nothing added: () is a 0-d tensor "
            "(a diffusion timestep), 7 a 1-D one.",
        ),
    ] = False,
    params_only: Annotated[
        bool,
        typer.Option(
            "--params-only",
            help="No forward pass: modules and parameter counts from the module tree "
            "(mult-adds, FLOPs and activation memory need a forward pass).",
        ),
    ] = False,
    train_mode: Annotated[
        bool,
        typer.Option(
            "--train-mode",
            help="Run the forward pass in training mode (e.g. GoogLeNet's auxiliary heads); "
            "the model's modes and buffers are put back.",
        ),
    ] = False,
    depth: Annotated[
        Optional[int],
        typer.Option(
            "--depth",
            min=0,
            show_default=False,
            help="Nesting depth of the rows shown. [default: 3]",
        ),
    ] = None,
    # -d is --data in train and eval: --depth's former short flag works, unlisted.
    depth_short: Annotated[Optional[int], typer.Option("-d", min=0, hidden=True)] = None,
    num_classes: Annotated[
        Optional[int],
        typer.Option(
            "--num-classes",
            min=1,
            help="Classifier outputs. [default: those of --weights; else 1000 for torchvision, "
            "10 for convnet]",
        ),
    ] = None,
    weights: WeightsOption = None,
    dtype: Annotated[
        Optional[str],
        typer.Option(
            "--dtype",
            help="Run in this dtype: float32, float16, bfloat16, float64; an integer dtype "
            "(int64...) makes integer inputs for the model.",
        ),
    ] = None,
    device: DeviceOption = "cpu",
    flops: Annotated[
        bool,
        typer.Option("--flops/--no-flops", help="Measure FLOPs with torch's FlopCounterMode."),
    ] = True,
    trust_checkpoint: TrustCheckpointOption = False,
    fmt: FormatOption = None,
    output: OutputOption = None,
    force: ForceOption = False,
) -> None:
    """Show a model's layers, one row per module call: shapes, parameters, mult-adds, memory.

    Mult-adds follow torchinfo's rule (a Linear layer counted per row of its input); a pruned
    layer (torch.nn.utils.prune) counts the dense operation its forward runs, pruned zeros
    included. A TorchScript module takes no hooks: its rows come from the module tree, without
    mult-adds.

    Examples:

      torchkit summary vit_b_16 --input-size 3 384 384 --depth 2

      torchkit summary runs/best.pt --format json -o summary.json

      torchkit summary mypkg.nets:Bert -i input_ids=128:long -i attention_mask=128:long

      torchkit summary mypkg.nets:UNet --no-batch-dim -i 1,4,32,32 -i "t=():long"
    """
    fmt = resolve_format(fmt, output)
    depth = former_short_flag(depth, depth_short, option="--depth", flag="-d")
    depth = 3 if depth is None else depth
    if list_models:
        _emit_model_list(fmt, output, force)
        return
    if model_option is not None:  # --model NAME: what stands in MODEL's place is a size
        extra = ([model] if model is not None else []) + list(ctx.args)
        named, sizes = _positional_sizes(None, input_size or [], extra)
        if named is not None:
            raise typer.BadParameter(f"unexpected extra argument: {named}", param_hint="MODEL")
        model = model_option
    else:
        model, sizes = _positional_sizes(model, input_size or [], ctx.args)
    if model is None:
        raise typer.BadParameter("give a MODEL, or --list for the names", param_hint="MODEL")

    from torchkit.cli import console
    from torchkit.core.summary.counting import trainable_label
    from torchkit.core.summary.run import check_output, parse_input, summarize_model

    check_output(model, output, weights=weights, force=force)  # before the model is built

    random_weights: list[str] = []  # noted once the summary is made: an error stays one line
    warnings: list[str] = []
    result = summarize_model(
        model,
        input_sizes=[parse_input(size) for size in sizes],
        image_size=image_size,
        batch_size=batch_size,
        num_classes=num_classes,
        weights=weights,
        trust_checkpoint=trust_checkpoint,
        dtype=dtype,
        device=device,
        count_flops=flops,
        no_batch_dim=no_batch_dim,
        params_only=params_only,
        train_mode=train_mode,
        notify=random_weights.append,
        warn=warnings.append,
    )
    for message in warnings:
        console.warn(message)
    for note in [*random_weights, *result.notes]:
        console.note(note)
    rows = result.layers_up_to(depth)
    layer_table = Table(
        columns=["Layer (type)", "Input", "Output", "Params", "Trainable", "Mult-adds"],
        rows=[
            [
                _layer_label(row),
                _compact_shape(row.input_shape),
                _compact_shape(row.output_shape),
                f"{row.params:,}" if row.params else "",
                trainable_label(row),
                f"{row.mult_adds:,}" if row.mult_adds else "",
            ]
            for row in rows
        ],
        title=_title(result),
        align_right={"Params", "Mult-adds"},
    )
    totals = result.totals()
    totals_table = Table(
        columns=["Total", "Value"],
        rows=[
            [TOTAL_LABELS[key], _total_text(key, value)]
            for key, value in totals.items()
            if not (key in ATTENTION_KEYS and value == 0)  # a model without attention
        ],
        align_right={"Value"},
    )
    csv_table = Table(
        columns=LAYER_COLUMNS,
        rows=[
            [
                row.depth,
                row.name,
                row.type,
                _shape_text(row.input_shape),
                _shape_text(row.output_shape),
                row.params,
                trainable_label(row),
                row.mult_adds,
                row.call,
            ]
            for row in rows
        ]
        + [
            [None, "(total)", None, None, None, totals["total_params"], None]
            + [totals["total_mult_adds"], None]
        ],
    )
    if fmt == OutputFormat.csv:
        emit(tables=[csv_table], data=None, fmt=fmt, output=output, force=force)
    else:
        emit(
            tables=[layer_table, totals_table],
            data=result.to_dict(depth),
            fmt=fmt,
            output=output,
            force=force,
        )


def _title(result: Any) -> str:
    """`ResNet on input 1×3×224×224 (float32, cpu)`; named inputs and their own dtypes shown."""
    if not result.inputs:
        return f"{result.model}: parameters only ({result.dtype}, {result.device})"
    shown = []
    for item in result.inputs:
        text = _compact_shape(item["shape"]) or "scalar"
        if item["name"]:
            text = f"{item['name']}={text}"
        if item["dtype"] != result.dtype:
            text += f":{item['dtype']}"
        shown.append(text)
    return f"{result.model} on input {', '.join(shown)} ({result.dtype}, {result.device})"


def _positional_sizes(
    model: str | None, sizes: list[str], extra: list[str]
) -> tuple[str | None, list[str]]:
    """Let `--input-size 3 224 224` work: the shell splits it, so 224 and 224 arrive as extra
    arguments; they belong to the (single) --input-size given."""
    tokens = ([model] if model is not None else []) + list(extra)
    names = [t for t in tokens if not t.strip().isdigit()]
    numbers = [t for t in tokens if t.strip().isdigit()]
    if len(names) > 1:
        raise typer.BadParameter(
            f"unexpected extra arguments: {' '.join(names[1:])}", param_hint="MODEL"
        )
    if numbers:
        if len(sizes) != 1:
            raise typer.BadParameter(
                f"cannot tell which input size {' '.join(numbers)} belongs to",
                param_hint="'--input-size'",
            )
        sizes = [" ".join([sizes[0], *numbers])]
    return (names[0] if names else None), sizes


def _emit_model_list(fmt: OutputFormat, output: Path | None, force: bool) -> None:
    from torchkit.core.models import list_models

    names = list_models()
    emit(
        tables=[Table(columns=["model"], rows=[[name] for name in names])],
        data={"models": names},
        fmt=fmt,
        output=output,
        force=force,
    )


def _layer_label(row: Any) -> str:
    """`conv1 (Conv2d)`, indented by depth; the model's own row is just its type."""
    label = f"{row.name.rsplit('.', 1)[-1]} ({row.type})" if row.name else row.type
    if row.call > 1:
        label += f" call {row.call}"
    return "  " * row.depth + label


def _compact_shape(shape: Any) -> str:
    """1×64×56×56 for a tensor; [a, b] and {key: a} for tuples, lists and dicts of them."""
    if shape is None:
        return ""
    if isinstance(shape, str):
        return shape
    if isinstance(shape, dict):
        return "{" + ", ".join(f"{k}: {_item_shape(v)}" for k, v in shape.items()) + "}"
    if shape and all(isinstance(n, int) for n in shape):
        return "×".join(map(str, shape))
    if not shape:
        return "scalar" if isinstance(shape, list) else ""
    return "[" + ", ".join(_item_shape(item) for item in shape) + "]"


def _item_shape(shape: Any) -> str:
    """One item of a tuple, list or dict: None (no targets given to a detection model's
    transform) is shown, not left blank as in `[1×3×320×320, ]`."""
    return "None" if shape is None else _compact_shape(shape)


def _shape_text(shape: Any) -> str | None:
    if shape is None:
        return None  # no shape: an empty CSV field
    if isinstance(shape, str):
        return shape
    return json.dumps(shape, separators=(", ", ": "))


def _total_text(key: str, value: Any) -> str:
    if value is None:
        return "not measured"
    if key.endswith("_mb"):
        return f"{value:,.2f}"
    if key in ("total_mult_adds", "flops") and abs(value) >= 1000:  # "23", not "23 (23)"
        return f"{value:,} ({readable_number(value)})"
    return f"{value:,}"


def register(app: typer.Typer) -> None:
    app.command(
        "summary",
        context_settings={"allow_extra_args": True},
    )(summary)
