"""`torchkit extract-features MODEL IMAGES OUT`: features of named layers for a set of images."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from torchkit.cli import console
from torchkit.cli.options import (
    AllowUntrainedOption,
    EmaOption,
    ForceOption,
    ModelOption,
    NullOption,
    OutOption,
    StrictOption,
    TrustCheckpointOption,
    WeightsOption,
    data_and_rest,
    data_option,
    model_and_rest,
    model_argument,
    piped_paths,
    product_path,
    seed_in_range,
)
from torchkit.cli.out_beside_data import argument_as_out, argument_out
from torchkit.cli.progress import progress_bar
from torchkit.cli.render import (
    FORMAT_RULE,
    OutputFormat,
    Table,
    emit,
    format_rate,
    report_file,
    resolve_format,
)
from torchkit.cli.run_options import DEFAULT_PREPROCESS, DEFAULT_RUN, with_inference_options
from torchkit.core.inference.options import InferenceOptions, PreprocessOverrides
from torchkit.core.io.wording import counted


class ArrayFormat(str, Enum):
    npy = "npy"
    pt = "pt"
    safetensors = "safetensors"


ARRAY_FORMATS = tuple(f.value for f in ArrayFormat)
LISTING_FORMATS = tuple(f.value for f in OutputFormat)


class Pool(str, Enum):
    avg = "avg"
    max = "max"
    none = "none"


class Normalize(str, Enum):
    l2 = "l2"


class Dtype(str, Enum):
    float32 = "float32"
    float16 = "float16"


def _complete_format(incomplete: str) -> list[str]:
    return [f for f in LISTING_FORMATS if f.startswith(incomplete)]


@with_inference_options(help_of={"batch_size": "Images per forward pass."})
def extract_features_command(
    model: Annotated[Optional[str], model_argument()] = None,
    images: Annotated[
        Optional[str],  # text: a URL must keep its `//`
        typer.Argument(
            help="An image folder (ROOT/<class>/<image>), a split root, a flat folder of "
            "images, a CSV index with path,label columns, an image file, digits, or - for paths "
            "on stdin (one per line; with --null, NUL-separated); or --data.",
            metavar="IMAGES",
            show_default=False,
        ),
    ] = None,
    out: Annotated[
        Optional[Path],
        typer.Argument(
            help="Output folder: one array file per layer, index.csv, meta.json (or --out).",
            metavar="OUT",
            show_default=False,
        ),
    ] = None,
    out_option: OutOption = None,
    model_option: ModelOption = None,
    data: Annotated[Optional[str], data_option(argument="IMAGES")] = None,
    layer: Annotated[
        Optional[list[str]],
        typer.Option(
            "--layer",
            "-l",
            help="A layer to keep, by node name (layer4.1.relu_1), module name (layer4), "
            "`penultimate` (the classifier's input) or `logits`. Repeat for several; all come "
            "from one forward pass. Default: penultimate.",
            show_default=False,
        ),
    ] = None,
    list_layers: Annotated[
        bool,
        typer.Option("--list-layers", help="Print the layer names of MODEL and exit."),
    ] = False,
    weights: WeightsOption = None,
    ema: EmaOption = False,
    pool: Annotated[
        Optional[Pool],
        typer.Option(
            "--pool",
            help="Reduce (C, H, W) maps over H and W. Default: avg.",
            case_sensitive=False,
            show_default=False,
        ),
    ] = None,
    flatten: Annotated[
        bool, typer.Option("--flatten", help="Store each image's feature as one vector.")
    ] = False,
    normalize: Annotated[
        Optional[Normalize],
        typer.Option(
            "--normalize",
            help="Scale each image's feature to unit L2 norm.",
            case_sensitive=False,
            show_default=False,
        ),
    ] = None,
    dtype: Annotated[
        Dtype, typer.Option("--dtype", help="Stored precision.", case_sensitive=False)
    ] = Dtype.float32,
    array_format: Annotated[
        ArrayFormat,
        typer.Option(
            "--array-format",
            help="The layers' array files: npy, pt or safetensors.",
            case_sensitive=False,
        ),
    ] = ArrayFormat.npy,
    # A str, not a choice: `--format npy|pt|safetensors`, the array format's name before
    # --array-format, still works (with a warning).
    fmt: Annotated[
        Optional[str],
        typer.Option(
            "--format",
            help=f"Format of the --list-layers listing: table, csv or json. {FORMAT_RULE}",
            autocompletion=_complete_format,
            metavar="<table | csv | json>",
            show_default=False,
        ),
    ] = None,
    output: Annotated[
        Optional[Path],
        typer.Option(
            "--output",
            "-o",
            help="Write the --list-layers listing to FILE instead of stdout (FILE.csv or "
            "FILE.json: in that format). The features go to OUT.",
            dir_okay=False,
        ),
    ] = None,
    split: Annotated[
        Optional[str],
        typer.Option(
            "--split",
            help="Of a split root or split CSV: only this split (train, val, test). Default: "
            "every split, with a split column in index.csv.",
            show_default=False,
        ),
    ] = None,
    preprocess: PreprocessOverrides = DEFAULT_PREPROCESS,
    run: InferenceOptions = DEFAULT_RUN,
    resume: Annotated[
        bool,
        typer.Option("--resume", help="Continue an interrupted run into the same OUT."),
    ] = False,
    force: ForceOption = False,
    strict: StrictOption = False,
    trust_checkpoint: TrustCheckpointOption = False,
    allow_untrained: AllowUntrainedOption = False,
    seed: Annotated[
        int,
        typer.Option(
            "--seed",
            callback=seed_in_range,
            help="Seed of the random initialisation of a model without weights "
            "(--allow-untrained).",
        ),
    ] = 0,
    null: NullOption = False,
) -> None:
    """Features of named layers of a model for every image of a folder or CSV index.

    Writes OUT/<layer>.npy (one row per readable image, in the order of OUT/index.csv),
    OUT/index.csv (row, path, label, error; and split for split data) and OUT/meta.json (model,
    layers, shapes, preprocessing). Arrays are filled in place on disk, so datasets bigger than
    RAM work, and --resume continues a run that was stopped. Paths piped for - are read as they
    come, rows written batch by batch (such a run cannot be resumed).

    IMAGES and OUT may be given as --data and --out instead. With --data the argument after
    MODEL is OUT: `extract-features convnet raw --data raw2` writes the features of raw2 into
    raw, and a refusal of raw (a folder that already exists) names --data and says what to
    write.

    Examples:

      torchkit extract-features resnet50 --list-layers

      torchkit extract-features runs/best.pt data/ feats/ -l penultimate -l logits

      torchkit extract-features resnet50 photos/ feats/ --weights DEFAULT --normalize l2

      torchkit extract-features resnet50 big/ feats/ --weights DEFAULT --resume

      torchkit extract-features best.pt --data data/ feats/  (IMAGES as --data: the argument is OUT)
    """
    from torchkit.core.io.errors import OutputWriteError, UsageError

    listing_format, array_format = _formats(fmt, output, array_format, list_layers)
    given = [p for p in (images, out) if p is not None]
    model, rest = model_and_rest(model, model_option, given)
    if data is not None:  # IMAGES given as --data: the first word left is OUT (even with --out)
        data, rest = data_and_rest(data, rest, name="IMAGES", after=1)
        rest = [data, *rest]
    if len(rest) > 2:
        raise UsageError(f"unexpected extra argument: {rest[2]}", "give MODEL, IMAGES and OUT")
    images, out = (list(rest) + [None, None])[:2]
    # `extract-features convnet raw --data raw2`: raw is OUT, whose refusal says why.
    out_argument = argument_out(out, data, out_option)
    out = product_path(out, out_option, required=False, data=data, data_name="IMAGES")
    out = None if out is None else Path(out)  # with --model, OUT came in IMAGES' place, as text
    if list_layers:
        if images is not None or out is not None:
            raise UsageError("--list-layers takes only MODEL", "drop IMAGES and OUT")
        _list_layers(
            model,
            weights,
            ema,
            trust_checkpoint,
            preprocess.image_size,
            preprocess.image_channels,
            listing_format,
            output,
            force,
        )
        return
    if images is None or out is None:
        raise UsageError("IMAGES and OUT are needed", "or pass --list-layers to see the layers")

    from torchkit.core.features import FeatureRequest, extract_features

    request = FeatureRequest(
        spec=preprocess.model_spec(
            model,
            weights=weights,
            ema=ema,
            trust_checkpoint=trust_checkpoint,
            build_seed=seed,
            allow_untrained=allow_untrained,
        ),
        images=str(images),
        out=str(out),
        layers=list(layer or []),
        pool=pool.value if pool else None,
        flatten=flatten,
        normalize=normalize.value if normalize else None,
        dtype=dtype.value,
        file_format=array_format.value,
        run=run,
        strict=strict,
        resume=resume,
        force=force,
        split=split,
    )
    stdin = piped_paths([images] if images is not None else [], null)
    try:
        with (
            progress_bar(
                "extracting",
                rate_unit="img/s",
                keep=True,
                refresh_in_thread=True,
                count_from_first_update=True,  # a resumed run's speed counts from where it starts
            ) as update,
            argument_as_out(
                out_argument,
                data,
                data_name="IMAGES",
                doing="extract features of",
                command=["extract-features", model],
            ),
        ):
            result = extract_features(request, progress=update, stdin=stdin)
    except KeyboardInterrupt as error:
        if _rows_kept(error, out, force):
            console.note(f"the rows done so far are kept in {out}; add --resume to continue")
        raise
    except OutputWriteError as error:
        # A full disk at the end of a long run (the index, a --array-format copy): the rows
        # are on disk, and --resume only finishes them; "choose another output" would redo all.
        if _rows_kept(error, out, force):
            console.note(
                f"the rows done so far are kept in {out}; add --resume to continue once it "
                "can be written"
            )
        raise
    _report(result)


def _rows_kept(error: BaseException, out: Path, force: bool) -> bool:
    """OUT holds rows of this command line that --resume continues. Not where a --force run
    stopped before its first rows: the old OUT it put back holds another run's, which --resume
    with this command line refuses; where the run stopped before it began (the model loading),
    an old OUT's rows are the ones --resume continues, unless --force was to replace them."""
    kept = getattr(error, "extract_rows_kept", None)
    if kept is None:
        kept = not force
    return kept and (out / ".partial").is_dir()


def _formats(
    fmt: str | None, output: Path | None, array_format: ArrayFormat, list_layers: bool
) -> tuple[OutputFormat, ArrayFormat]:
    """The --list-layers listing's format (--format, else -o's name, as every command's) and the
    array files' one; `--format npy|pt|safetensors`, --array-format's old spelling, still works
    for a run."""
    from torchkit.core.io.errors import UsageError

    if fmt is not None and fmt.lower() in ARRAY_FORMATS:
        old = ArrayFormat(fmt.lower())
        if list_layers:
            raise UsageError(
                f"--format {fmt} does not apply to --list-layers", "use table, csv or json"
            )
        if array_format not in (ArrayFormat.npy, old):  # npy: --array-format's default
            raise UsageError(
                f"--format {fmt} and --array-format {array_format.value} contradict each other",
                "give only --array-format",
            )
        console.warn(f"--format {fmt} is deprecated for array files: use --array-format {fmt}")
        fmt, array_format = None, old
    if fmt is not None and fmt.lower() not in LISTING_FORMATS:
        choices = ", ".join(repr(f) for f in LISTING_FORMATS)
        raise typer.BadParameter(f"{fmt!r} is not one of {choices}", param_hint="'--format'")
    if not list_layers and (fmt is not None or output is not None):
        given = f"--format {fmt}" if fmt is not None else "-o/--output"
        raise UsageError(
            f"{given} applies to the --list-layers listing; a run writes its features to OUT",
            "the array files' format is --array-format",
        )
    return resolve_format(None if fmt is None else OutputFormat(fmt.lower()), output), array_format


def _list_layers(
    model: str,
    weights: str | None,
    ema: bool,
    trust_checkpoint: bool,
    image_size: int | None,
    image_channels: int | None,
    fmt: OutputFormat,
    output: Path | None,
    force: bool,
) -> None:
    from torchkit.core.features import list_layers
    from torchkit.core.io.file_outputs import check_output_file
    from torchkit.core.models import model_inputs, require_model_files

    if report_file(output) is not None:
        require_model_files(model, weights)  # a missing model is not "-o already exists"
        # Before the model is built; never the checkpoint, --weights file or model source read.
        check_output_file(output, force, model_inputs(model, weights))
    listing = list_layers(
        model,
        weights=weights,
        ema=ema,
        trust_checkpoint=trust_checkpoint,
        image_size=image_size,
        image_channels=image_channels,
    )
    if fmt == OutputFormat.csv:  # the JSON's names and values (the shape as 512x1x1)
        columns = ["name", "op", "output_shape", "alias_of"]
        rows = [[info.name, info.op, _shape(info.shape), info.alias_of] for info in listing.layers]
    else:
        columns = ["layer", "op", "output_shape"]
        rows = [
            [
                info.name,
                f"alias of {info.alias_of}" if info.alias_of else info.op,
                _shape(info.shape),
            ]
            for info in listing.layers
        ]
    title = f"{listing.arch} layers ({listing.image_size}x{listing.image_size} input)"
    table = Table(columns=columns, rows=rows, title=title)
    data = {
        "model": listing.arch,
        "image_size": listing.image_size,
        "traced": listing.traced,
        "layers": [
            {
                "name": info.name,
                "op": info.op,
                "output_shape": info.shape,
                "alias_of": info.alias_of,
            }
            for info in listing.layers
        ],
    }
    emit(tables=[table], data=data, fmt=fmt, output=output, force=force)


def _shape(shape: tuple[int, ...] | None) -> str | None:
    return "x".join(map(str, shape)) if shape is not None else None


def _report(result) -> None:
    if result.already_complete:
        console.note(f"{result.out} is already complete; nothing to do")
        return
    for layer in result.layers:
        shape = "x".join(map(str, layer.shape))
        console.note(f"{layer.name} ({layer.node}): {shape} {layer.dtype} -> {layer.file}")
    speed = f", {format_rate(result.images_per_second)} images/s" if result.seconds > 0 else ""
    resumed = f" (resumed at image {result.resumed_from + 1})" if result.resumed_from else ""
    console.note(
        f"wrote {counted(result.num_rows, 'row')} for {counted(result.num_images, 'image')} "
        f"to {result.out}"
        f"{resumed}{speed}"
    )
    if result.skipped:
        console.warn(
            f"skipped {len(result.skipped)} unreadable image(s); "
            f"see the error column of {result.out / 'index.csv'}"
        )


def register(app: typer.Typer) -> None:
    app.command("extract-features")(extract_features_command)
