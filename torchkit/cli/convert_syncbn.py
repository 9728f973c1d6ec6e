"""`torchkit convert-syncbn`: BatchNorm <-> SyncBatchNorm for a model or a saved model."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from torchkit.cli import console
from torchkit.cli.options import (
    FileOutOption,
    ForceOption,
    FormatOption,
    OutputOption,
    SquareInputOption,
    TrustCheckpointOption,
    WeightsOption,
    model_argument,
    product_path,
)
from torchkit.cli.render import Table, emit, resolve_format

REPORT_COLUMNS = ["name", "type", "num_features", "affine", "track_running_stats"]
CONVERSION_COLUMNS = [
    "name",
    "from_type",
    "to_type",
    "num_features",
    "affine",
    "track_running_stats",
    "dim_source",
]


def convert_syncbn(
    # SRC, not MODEL: with DST it is the saved model converted (and there is no --model).
    source: Annotated[str, model_argument(metavar="SRC", or_model_option=False)],
    destination: Annotated[
        Optional[str],
        typer.Argument(
            help="Write the converted model here (or --out). Without it, only report the layers.",
            metavar="DST",
            show_default=False,
            dir_okay=False,  # a file: `new/` is refused (cli.app)
        ),
    ] = None,
    out_option: FileOutOption = None,
    revert: Annotated[
        bool,
        typer.Option(
            "--revert",
            help="SyncBatchNorm back to BatchNorm1d/2d/3d, to run a model trained with "
            "SyncBatchNorm on a CPU or one GPU.",
        ),
    ] = False,
    input_size: Annotated[
        Optional[str],
        typer.Option(
            "--input-size",
            "-i",
            metavar="SIZE",
            help="With --revert: one sample's shape (e.g. 3,224,224), to see which BatchNorm "
            "each SyncBatchNorm layer stands for when the file does not say.",
            show_default=False,
        ),
    ] = None,
    image_size: SquareInputOption = None,
    num_classes: Annotated[
        Optional[int],
        typer.Option("--num-classes", min=1, help="Classifier outputs of a named model."),
    ] = None,
    weights: WeightsOption = None,
    trust_checkpoint: TrustCheckpointOption = False,
    fmt: FormatOption = None,
    output: OutputOption = None,
    force: ForceOption = False,
) -> None:
    """Report the BatchNorm layers that would become SyncBatchNorm, or convert a saved model.

    Without DST, the layers are listed. With DST, a torchkit checkpoint is marked so that
    [bold]train --resume[/] rebuilds it with SyncBatchNorm, and a pickled model
    ([bold]--trust-checkpoint[/]) is converted. [bold]--revert[/] goes back to BatchNorm.

    Examples:

      torchkit convert-syncbn resnet50

      torchkit convert-syncbn runs/best.pt runs/best-syncbn.pt

      torchkit convert-syncbn runs/best-syncbn.pt runs/best-bn.pt --revert

      torchkit convert-syncbn net-sync.pt net-bn.pt --trust-checkpoint --revert -i 3,224,224
    """
    from torchkit.core.convert import syncbn
    from torchkit.core.io.file_outputs import ReplacedFiles

    fmt = resolve_format(fmt, output)
    destination = product_path(destination, out_option, required=False, name="DST")
    if destination is not None:
        destination = str(destination)
    # Every output, before any work: not SRC nor the weights, not each other, --force to replace.
    syncbn.check_outputs(source, destination, output, weights=weights, force=force)
    with ReplacedFiles() as replaced:
        if destination is None:
            if input_size is not None or image_size is not None:
                raise typer.BadParameter(
                    "goes with SRC DST --revert", param_hint="'--input-size/--image-size'"
                )
            report = syncbn.batchnorm_report(
                source,
                revert=revert,
                num_classes=num_classes,
                weights=weights,
                trust_checkpoint=trust_checkpoint,
            )
            columns = REPORT_COLUMNS
            title = (
                f"{report['count']} {'SyncBatchNorm' if revert else 'BatchNorm'} layers of "
                f"{report['model']} would become {report['target']}"
            )
        else:
            if weights is not None or num_classes is not None:
                raise typer.BadParameter(
                    "go with a model name, not with SRC DST", param_hint="'--weights/--num-classes'"
                )
            from torchkit.core.input_size import parse_input_size, square_sample
            from torchkit.core.models.image_size import ImageSizeError

            if input_size is not None and image_size is not None:
                raise typer.BadParameter(
                    "--image-size and --input-size both give the sample",
                    param_hint="'--image-size'",
                )
            if not revert and (input_size is not None or image_size is not None):
                # converting to SyncBatchNorm needs no sample: it would be ignored
                raise typer.BadParameter(
                    "goes with SRC DST --revert", param_hint="'--input-size/--image-size'"
                )
            sample_shape = None
            if input_size is not None:
                sample_shape = parse_input_size(input_size)
            elif image_size is not None:
                sample_shape = square_sample(None, image_size)
            # An old DST and report replaced with --force are set aside until both new ones are in
            # place (export's rule): a report the disk has no room for leaves both as they were.
            replaced.set_aside(destination)  # before convert_saved_model checks DST again
            try:
                report = syncbn.convert_saved_model(
                    source,
                    destination,
                    revert=revert,
                    trust_checkpoint=trust_checkpoint,
                    force=force,
                    sample_shape=sample_shape,
                )
            except ImageSizeError as error:  # its hint names -i, which --image-size contradicts
                if input_size is None:
                    raise
                raise error.for_input_size() from error.__cause__
            replaced.wrote(destination)
            columns = CONVERSION_COLUMNS if revert else CONVERSION_COLUMNS[:-1]
            title = f"{report['count']} layers converted to {report['target']} ({report['kind']})"
        table = Table(
            columns=columns,
            rows=[[row[c] for c in columns] for row in report["layers"]],
            title=title,
            align_right={"num_features"},
        )
        emit(
            tables=[table],
            data=report,
            fmt=fmt,
            output=output,
            force=force,
            written=[destination],
            replaced=replaced,
        )
    if destination is not None:
        console.note(f"wrote {report['destination']}")


def register(app: typer.Typer) -> None:
    app.command("convert-syncbn")(convert_syncbn)
