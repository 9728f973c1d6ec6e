"""`torchkit convert tensor|cifar|checkpoint|shards`: the Typer layer over `core.convert`."""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from torchkit.cli import console
from torchkit.cli.app import TorchkitGroup, given_words
from torchkit.cli.options import (
    FileOutOption,
    ForceOption,
    FormatOption,
    OutOption,
    OutputOption,
    StrictOption,
    TrustCheckpointOption,
    WorkersOption,
    data_option,
    product_path,
    seed_in_range,
)
from torchkit.cli.progress import progress_bar
from torchkit.cli.render import (
    ReportAtSwap,
    Table,
    emit,
    format_rate,
    report_file,
    resolve_format,
)
from torchkit.core.io.sizes import SIZE_RULE
from torchkit.core.io.wording import counted

convert_app = typer.Typer(
    cls=TorchkitGroup,
    help="""Convert images, arrays and tensors; CIFAR batches to PNG folders; checkpoints;
    datasets to WebDataset shards.

    Examples:

      torchkit convert tensor photo.jpg photo.pt

      torchkit convert cifar cifar-10-python.tar.gz data/cifar10

      torchkit convert checkpoint ddp_epoch90.pth resnet50.safetensors

      torchkit convert shards data/imagenet shards/imagenet --shard-size 1GB
    """,
    no_args_is_help=True,
    rich_markup_mode="rich",
)


class TargetFormat(str, Enum):
    png = "png"
    jpg = "jpg"
    jpeg = "jpeg"
    bmp = "bmp"
    webp = "webp"
    tif = "tif"
    tiff = "tiff"
    npy = "npy"
    pt = "pt"
    pth = "pth"
    safetensors = "safetensors"


class CheckpointFormat(str, Enum):
    safetensors = "safetensors"
    pt = "pt"


class Layout(str, Enum):
    chw = "chw"
    hwc = "hwc"


class ArrayDtype(str, Enum):
    uint8 = "uint8"
    float32 = "float32"
    float16 = "float16"


class Scale(str, Enum):
    one = "1"
    full = "255"


class LabelType(str, Enum):
    fine = "fine"
    coarse = "coarse"


class CifarVariant(str, Enum):
    cifar10 = "cifar10"
    cifar100 = "cifar100"


class WeightDtype(str, Enum):
    float16 = "float16"
    bfloat16 = "bfloat16"
    float32 = "float32"


def _shape(shape) -> str:
    return "x".join(str(n) for n in shape)


def tensor(
    ctx: typer.Context,
    src: Annotated[
        Path, typer.Argument(help="An image, .npy, .pt/.pth or .safetensors file, or a folder.")
    ],
    dst: Annotated[
        Optional[Path],
        typer.Argument(
            help="The output file (format from its extension) or folder (see --to); or --out.",
            metavar="DST",
            show_default=False,
        ),
    ] = None,
    out_option: OutOption = None,
    to: Annotated[
        Optional[TargetFormat],
        typer.Option(
            "--to",
            metavar="FORMAT",
            help="Output format when DST is a folder: "
            + ", ".join(f.value for f in TargetFormat)
            + ".",
            case_sensitive=False,
            show_default=False,
        ),
    ] = None,
    layout: Annotated[
        Optional[Layout],
        typer.Option(
            "--layout",
            help="Axis order of the array/tensor side [default: hwc for .npy, chw for .pt and "
            ".safetensors].",
            case_sensitive=False,
            show_default=False,
        ),
    ] = None,
    dtype: Annotated[
        Optional[ArrayDtype],
        typer.Option(
            "--dtype",
            help="dtype of a written array/tensor [default: uint8 for .npy (uint16 for 16-bit "
            "images), float32 for .pt and .safetensors].",
            case_sensitive=False,
            show_default=False,
        ),
    ] = None,
    scale: Annotated[
        Optional[Scale],
        typer.Option(
            "--scale",
            help="Float values in [0, 1] or [0, 255] (implies float32 for .npy) [default: 1].",
            show_default=False,
        ),
    ] = None,
    key: Annotated[
        Optional[str],
        typer.Option(
            "--key",
            help="The tensor to read from a dict in a .pt/.safetensors file (and the "
            "name written to .safetensors; default 'image').",
        ),
    ] = None,
    grid: Annotated[
        bool,
        typer.Option("--grid", help="Tile a batch into one image, as torchvision's make_grid."),
    ] = False,
    nrow: Annotated[
        Optional[int],
        typer.Option("--nrow", help="With --grid: images per grid row. [default: 8]", min=1),
    ] = None,
    no_exif: Annotated[
        bool, typer.Option("--no-exif", help="Ignore the EXIF orientation of images.")
    ] = False,
    quality: Annotated[
        Optional[int],
        typer.Option("--quality", help="JPEG/WebP quality. [default: 95]", min=1, max=100),
    ] = None,
    workers: WorkersOption = None,
    strict: StrictOption = False,
    force: ForceOption = False,
    fmt: FormatOption = None,
    output: OutputOption = None,
) -> None:
    """Convert between image files, NumPy .npy, torch .pt and .safetensors, by extension. A
    tensor is CHW float32 in [0, 1] (like to_tensor), an array HWC uint8 (like
    np.asarray(Image.open(...))); 8-bit pixels survive round trips exactly. A folder is converted
    recursively, in parallel, keeping its layout; a file that cannot be converted is reported
    and the others are converted, with exit code 1 (as cp -r).

    Examples:

      torchkit convert tensor photo.jpg photo.pt

      torchkit convert tensor photo.pt photo.png

      torchkit convert tensor samples.pt grid.png --key images --grid --nrow 4

      torchkit convert tensor images/ arrays/ --to npy -j 4
    """
    from torchkit.core.convert.report_file import check_report_output
    from torchkit.core.convert.tensor import TensorOptions, convert_tensor, writes_file
    from torchkit.core.io.special_files import names_a_folder

    fmt = resolve_format(fmt, output)
    dst = product_path(dst, out_option, name="DST")
    typed = given_words(ctx, "dst") or given_words(ctx, "out_option")
    if typed and names_a_folder(typed[-1]):  # `out.pt/` is a folder: its Path drops the slash
        dst = os.fspath(dst) + os.sep
    writes = writes_file(to.value if to else None)
    check_report_output(output, force, source=src, destination=dst, writes=writes)

    options = TensorOptions(
        to=to.value if to else None,
        layout=layout.value if layout else None,
        dtype=dtype.value if dtype else None,
        scale=int(scale.value) if scale else None,
        key=key,
        exif=not no_exif,
        grid=grid,
        nrow=nrow,
        quality=quality,
    )
    # The files a file SRC writes (DST, or into a folder DST) that --force replaces are set
    # aside until the report is written too (export's rule), and a folder SRC's new DST
    # (OutputFolder's) is swapped in only after an -o file is written (ReportAtSwap): a report
    # the disk has no room for leaves the old DST and report as they were.
    with ReportAtSwap(
        _tensor_rendered,
        fmt=fmt,
        output=output,
        force=force,
        swapped_in=dst if os.path.isdir(src) else None,  # a folder SRC's DST is put in place
        written=[dst],
    ) as reporting:
        with progress_bar("converting") as progress:
            report = convert_tensor(
                src,
                dst,
                options,
                force=force,
                workers=workers,
                strict=strict,
                progress=progress,
                before_keep=reporting.before_keep,
                replaced=reporting.replaced,
                report_file=report_file(output),
            )
        reporting.after(report)
    incomplete = report.incomplete()  # as `cp -r`: the others are converted, the command failed
    if incomplete is not None:
        raise incomplete


def _tensor_rendered(report) -> tuple[list[Table], dict]:
    if report.folder:
        table = Table(
            ["converted", "skipped", "failed", "files written", "destination"],
            [
                [
                    report.converted,
                    report.skipped,
                    report.failed,
                    len(report.written),
                    report.destination,
                ]
            ],
            align_right={"converted", "skipped", "failed", "files written"},
        )
    else:
        table = Table(
            ["file", "shape", "dtype"],
            [[w.path, _shape(w.shape), w.dtype] for w in report.written],
        )
    return [table], report.to_dict()


def cifar(
    src: Annotated[
        Path,
        typer.Argument(
            help="cifar-10-python.tar.gz, cifar-100-python.tar.gz or the folder extracted from it."
        ),
    ],
    out: Annotated[
        Optional[Path],
        typer.Argument(help="The output folder; or --out.", metavar="OUT", show_default=False),
    ] = None,
    out_option: OutOption = None,
    label_type: Annotated[
        Optional[LabelType],
        typer.Option(
            "--label-type",
            help="CIFAR-100 class folders from the fine (100) or coarse (20) labels "
            "[default: fine].",
            case_sensitive=False,
            show_default=False,
        ),
    ] = None,
    variant: Annotated[
        Optional[CifarVariant],
        typer.Option(
            "--variant",
            help="The dataset to convert where the source holds both CIFAR-10's and "
            "CIFAR-100's files [default: the only one there].",
            case_sensitive=False,
            show_default=False,
        ),
    ] = None,
    workers: WorkersOption = None,
    force: ForceOption = False,
    fmt: FormatOption = None,
    output: OutputOption = None,
) -> None:
    """Write CIFAR-10/100 python batches as PNG folders: OUT/{train,test}/<class>/<index>.png,
    with exactly the pickled pixels; <index> is the image's position in its split, as
    torchvision's CIFAR10/CIFAR100 number them. Archives are read without extracting them and
    pickles with a restricted unpickler: a file that tries to build anything but data is refused.

    Examples:

      torchkit convert cifar cifar-10-python.tar.gz data/cifar10

      torchkit convert cifar cifar-100-python/ data/cifar100-coarse --label-type coarse
    """
    from torchkit.core.convert.cifar import convert_cifar, writes_file
    from torchkit.core.convert.report_file import check_report_output

    fmt = resolve_format(fmt, output)
    out = product_path(out, out_option)
    check_report_output(output, force, source=src, destination=out, writes=writes_file)

    # An -o file is written before the new PNGs replace an old OUT (ReportAtSwap), one inside
    # OUT after.
    with ReportAtSwap(
        _cifar_rendered, fmt=fmt, output=output, force=force, swapped_in=out
    ) as written:
        with progress_bar("writing PNGs") as progress:
            report = convert_cifar(
                src,
                out,
                label_type=label_type.value if label_type else None,
                variant=variant.value if variant else None,
                force=force,
                workers=workers,
                progress=progress,
                before_keep=written.before_keep,
                report_file=report_file(output),
            )
        written.after(report)
    if report.seconds:
        console.note(
            f"{counted(report.images, 'image')} in {report.seconds:.1f} s "
            f"({format_rate(report.images / report.seconds)} images/s)"
        )


def _cifar_rendered(report) -> tuple[list[Table], dict]:
    rows = [
        [split, count, len(report.classes), str(Path(report.output) / split)]
        for split, count in report.counts.items()
    ]
    title = report.dataset + (f" ({report.label_type} labels)" if report.label_type else "")
    table = Table(
        ["split", "images", "classes", "folder"], rows, title=title, align_right={"images"}
    )
    return [table], report.to_dict()


def checkpoint(
    ctx: typer.Context,
    paths: Annotated[
        list[Path],
        typer.Argument(
            help="SRC DST: a checkpoint (.pt, .pth, .bin, .safetensors...) and the output "
            "(.safetensors, or .pt/.pth for a plain state dict). With --average: two or more "
            "checkpoints, then DST.",
            metavar="SRC... DST",
            show_default=False,
        ),
    ],
    out_option: FileOutOption = None,
    average: Annotated[
        bool,
        typer.Option(
            "--average",
            help="Average the weights of the SRC checkpoints (timm's avg_checkpoints: floats "
            "in float64, integer buffers from the last) into DST: .pt, a checkpoint eval reads, "
            "or .safetensors, the weights alone.",
        ),
    ] = False,
    allow_nonfinite: Annotated[
        bool,
        typer.Option(
            "--allow-nonfinite",
            help="With --average: average checkpoints holding NaN or infinite values (refused "
            "by default: the average would not be finite either).",
        ),
    ] = False,
    key: Annotated[
        Optional[str],
        typer.Option(
            "--key",
            help="Where the state dict is (model, state_dict, net, model_ema...) "
            "[default: found automatically when unambiguous].",
            show_default=False,
        ),
    ] = None,
    strip_prefix: Annotated[
        Optional[str],
        typer.Option(
            "--strip-prefix",
            help="Remove this prefix from the keys that have it; '' keeps every key "
            "[default: 'module.' when every key has it].",
            show_default=False,
        ),
    ] = None,
    add_prefix: Annotated[
        str, typer.Option("--add-prefix", help="Prepend this to every key.", show_default=False)
    ] = "",
    dtype: Annotated[
        Optional[WeightDtype],
        typer.Option(
            "--dtype", help="Cast floating-point tensors.", case_sensitive=False, show_default=False
        ),
    ] = None,
    to: Annotated[
        Optional[CheckpointFormat],
        typer.Option(
            "--to",
            help="The format of DST [default: from its extension]; for a name without one "
            "(/dev/stdout, /dev/null).",
            case_sensitive=False,
            show_default=False,
        ),
    ] = None,
    trust_checkpoint: TrustCheckpointOption = False,
    force: ForceOption = False,
    fmt: FormatOption = None,
    output: OutputOption = None,
) -> None:
    """Turn a checkpoint saved on any device into a plain CPU state dict (.pt or .safetensors):
    the state dict is picked out of a training checkpoint, a DataParallel/DDP 'module.' prefix
    is stripped, tensors are optionally cast. Loading is weights_only unless --trust-checkpoint.

    Examples:

      torchkit convert checkpoint ddp_epoch90.pth resnet50.safetensors

      torchkit convert checkpoint last.pth ema.pt --key model_ema --dtype float16

      torchkit convert checkpoint model.pth backbone.safetensors --add-prefix backbone.

      torchkit convert checkpoint --average run/epoch-01[89].pt run/last.pt avg.pt
    """
    from torchkit.core.convert.checkpoint import convert_checkpoint
    from torchkit.core.convert.report_file import check_report_output
    from torchkit.core.io.errors import UsageError
    from torchkit.core.io.file_outputs import ReplacedFiles
    from torchkit.core.io.special_files import check_not_folder_name

    fmt = resolve_format(fmt, output)
    if out_option is not None:  # --out DST: every path given is a source
        paths = [*paths, out_option]
    elif len(paths) > 1 and (typed := given_words(ctx, "paths")):  # DST as typed: `new/`
        check_not_folder_name(typed[-1], "DST")
    if average:
        # By name: ten options in a row, where a positional slip (one added in the middle)
        # would pass silently.
        _average(
            paths,
            key=key,
            strip_prefix=strip_prefix,
            add_prefix=add_prefix,
            dtype=dtype,
            force=force,
            fmt=fmt,
            output=output,
            allow_nonfinite=allow_nonfinite,
            trust_checkpoint=trust_checkpoint,
            to=to.value if to else None,
        )
        return
    if allow_nonfinite:
        raise UsageError("--allow-nonfinite applies to --average only", "add --average")
    if len(paths) == 1:  # was "not 1 paths (... add --average)": DST left out, not too many
        product_path(None, None, name="DST")  # as every command says a missing output
    if len(paths) != 2:
        if out_option is not None and len(paths) == 3:  # SRC DST --out DST2
            product_path(paths[1], out_option, name="DST")
        raise UsageError(
            f"convert checkpoint takes SRC and DST, not {len(paths)} paths",
            "to average several checkpoints, add --average",
        )
    src, dst = paths
    check_report_output(output, force, source=src, destination=dst)
    # An old DST and report replaced with --force are set aside until both new ones are in
    # place (export's rule): a report the disk has no room for leaves both as they were.
    with ReplacedFiles() as replaced:
        replaced.set_aside(dst)  # before convert_checkpoint checks DST again
        report = convert_checkpoint(
            src,
            dst,
            key=key,
            strip_prefix=strip_prefix,
            add_prefix=add_prefix,
            dtype=dtype.value if dtype else None,
            trust_checkpoint=trust_checkpoint,
            force=force,
            to=to.value if to else None,
        )
        replaced.wrote(dst)
        _emit_checkpoint_report(report, fmt, output, force, dst, replaced)


def _emit_checkpoint_report(report, fmt, output, force, dst, replaced) -> None:
    if report.not_taken:
        from torchkit.cli import console

        others = ", ".join(report.not_taken)
        console.note(
            f"took state_dict (as timm's tools do); the checkpoint also holds {others}: "
            f"--key {report.not_taken[0]} for those weights"
        )
    rows = [
        ["source", report.source],
        ["destination", report.destination],
        ["state dict key", report.key or "(top level)"],
        ["tensors", report.tensors],
        ["values (parameters and buffers)", report.values],
        ["tensor bytes before", report.bytes_before],
        ["tensor bytes after", report.bytes_after],
        ["file bytes before", report.file_bytes_before],
        ["file bytes after", report.file_bytes_after],
        ["keys renamed", report.keys_renamed],
        ["prefix stripped", report.prefix_stripped or None],
        ["prefix added", report.prefix_added or None],
        ["dtype", report.dtype or "unchanged"],
        ["tensors cast", report.tensors_cast],
        ["values cast to infinity", report.values_overflowed],
        ["shared tensors copied", report.shared_tensors_copied],
        ["entries left out", len(report.skipped_entries)],
    ]
    table = Table(["quantity", "value"], rows)
    emit(tables=[table], data=report.to_dict(), fmt=fmt, output=output, force=force,
         written=[dst], replaced=replaced)  # fmt: skip


def _average(
    paths,
    *,
    key,
    strip_prefix,
    add_prefix,
    dtype,
    force,
    fmt,
    output,
    allow_nonfinite=False,
    trust_checkpoint=False,
    to=None,
) -> None:
    from torchkit.core.convert.averaging import write_average
    from torchkit.core.convert.report_file import check_report_output
    from torchkit.core.io.errors import UsageError
    from torchkit.core.io.file_outputs import ReplacedFiles

    if len(paths) < 3:
        raise UsageError(
            "--average needs two or more checkpoints and DST",
            "e.g. convert checkpoint --average epoch-018.pt epoch-019.pt epoch-020.pt avg.pt",
        )
    if key is not None or strip_prefix is not None or add_prefix or dtype is not None:
        raise UsageError(
            "--average writes the averaged checkpoint as it is",
            "convert the result afterwards for --key, --strip-prefix, --add-prefix or --dtype",
        )
    *sources, destination = paths
    for source in sources:
        check_report_output(output, force, source=source, destination=destination)
    with ReplacedFiles() as replaced:  # as a single conversion's DST and report
        replaced.set_aside(destination)
        report = write_average(
            sources,
            destination,
            force=force,
            allow_nonfinite=allow_nonfinite,
            trust_checkpoint=trust_checkpoint,
            to=to,
        )
        replaced.wrote(destination)
        _emit_average_report(report, fmt, output, force, destination, replaced)


def _emit_average_report(report, fmt, output, force, destination, replaced) -> None:
    rows = [
        ["sources", ", ".join(report["sources"])],
        ["destination", report["destination"]],
        ["kind", report["kind"]],
        ["checkpoints averaged", report["checkpoints"]],
        ["tensors", report["tensors"]],
        ["values (parameters and buffers)", report["values"]],
        ["tensors averaged (floating point)", report["averaged_tensors"]],
    ]
    emit(tables=[Table(["quantity", "value"], rows)], data=report, fmt=fmt, output=output,
         force=force, written=[destination], replaced=replaced)  # fmt: skip


def shards(
    src: Annotated[
        Optional[str],  # text: a URL must keep its `//`
        typer.Argument(
            help="The data: an image folder, split root, flat folder, CSV index, digits, or "
            "anything else --data reads; or --data.",
            metavar="SRC",
            show_default=False,
        ),
    ] = None,
    out: Annotated[
        Optional[Path],
        typer.Argument(help="The output folder; or --out.", metavar="OUT", show_default=False),
    ] = None,
    data: Annotated[Optional[str], data_option(argument="SRC")] = None,
    out_option: OutOption = None,
    shard_size: Annotated[
        Optional[str],
        typer.Option(
            "--shard-size",
            metavar="SIZE",
            help=f"Close a shard before it would pass SIZE: {SIZE_RULE}; a larger image gets "
            "a shard of its own [default: 1GB unless --per-shard is given].",
            show_default=False,
        ),
    ] = None,
    per_shard: Annotated[
        Optional[int],
        typer.Option(
            "--per-shard",
            metavar="N",
            min=1,
            help="At most N samples a shard (with --shard-size: whichever limit comes first).",
            show_default=False,
        ),
    ] = None,
    seed: Annotated[
        int,
        typer.Option(
            "--seed",
            callback=seed_in_range,
            help="Seed of the shuffle: the same seed, the same shards, byte for byte.",
        ),
    ] = 0,
    shuffle: Annotated[
        bool,
        typer.Option(
            "--shuffle/--no-shuffle",
            help="Shuffle each split, or keep the order the source lists its images in.",
        ),
    ] = True,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify",
            help="Decode every image in full, so that truncated files are skipped too "
            "(slower; by default each image's header is checked).",
        ),
    ] = False,
    workers: Annotated[
        Optional[int],
        typer.Option(
            "--workers",
            "-j",
            help="Threads that read images ahead (default: a sensible number for this "
            "machine; 0 reads in the main thread).",
            min=0,
        ),
    ] = None,
    strict: StrictOption = False,
    force: ForceOption = False,
    fmt: FormatOption = None,
    output: OutputOption = None,
) -> None:
    """Write a dataset as shuffled WebDataset shards: OUT/{train,val,test}-000000.tar, ...
    (OUT/shard-000000.tar, ... for data without splits), OUT/classes.txt and OUT/manifest.json
    (counts per split and class, each shard's size and SHA-256). Each sample is KEY.EXT with
    the image's bytes as the source file has them (digits: PNG), KEY.cls (the class index) and
    KEY.json (label and original path). Unreadable images are skipped with a warning. A shard
    appears only when complete; run the same command again to finish an interrupted run.

    Examples:

      torchkit convert shards data/imagenet shards/imagenet

      torchkit convert shards index.csv shards/ --per-shard 10000 --seed 1

      torchkit convert shards digits shards/digits --no-shuffle

      torchkit convert shards --data flowers/ shards/flowers  (SRC as --data: the argument is OUT)
    """
    from torchkit.cli.out_beside_data import argument_as_out, data_and_out
    from torchkit.core.convert.shards import check_report, convert_shards, shard_options

    fmt = resolve_format(fmt, output)
    src, out, argument = data_and_out(src, out, data, out_option, data_name="SRC")
    options = shard_options(
        shard_size=shard_size, per_shard=per_shard, seed=seed, shuffle=shuffle, verify=verify
    )
    check_report(output, force, source=src, destination=out)

    # An -o file is written before manifest.json completes OUT (ReportAtSwap): a report that
    # cannot be written (a full disk) leaves OUT an interrupted run, which the same command
    # finishes, rather than a complete OUT that only --force could write again.
    with ReportAtSwap(_shards_rendered, fmt=fmt, output=output, force=force) as written:
        with (
            progress_bar("writing shards") as progress,
            argument_as_out(
                argument,
                data,
                data_name="SRC",
                doing="write shards of",
                command=["convert", "shards"],
            ),
        ):
            report = convert_shards(
                src,
                out,
                options=options,
                strict=strict,
                force=force,
                workers=workers,
                progress=progress,
                status=progress.status,
                before_keep=written.before_keep,
                report_file=output,
            )
        written.after(report)
    if report.kept_shards:
        console.note(f"kept {report.kept_shards} complete shard(s) of an interrupted run")
    unreadable = sum(
        counts["unreadable"] for counts in report.split_counts(per_class=False).values()
    )
    if unreadable and not verify:
        # Data with broken files often holds truncated ones too, which a header passes: they
        # went into the shards, and every run reading them skips them then.
        console.note(
            "each image's header alone was checked, which a truncated image passes (it goes "
            "into the shards); --verify decodes every image in full and skips those too"
        )
    incomplete = report.incomplete()  # as `cp -r`: the rest is written, the command failed
    if incomplete is not None:
        raise incomplete


def _shards_rendered(report) -> tuple[list[Table], dict]:
    counts = report.split_counts()
    rows = [
        [name, c["shards"], c["samples"], c["bytes"], c["unreadable"]] for name, c in counts.items()
    ]
    table = Table(
        ["split", "shards", "samples", "bytes", "unreadable"],
        rows,
        title=f"{report.source} -> {report.output}",
        align_right={"shards", "samples", "bytes", "unreadable"},
    )
    return [table], report.to_dict()


def register(app: typer.Typer) -> None:
    convert_app.command("tensor")(tensor)
    convert_app.command("cifar")(cifar)
    convert_app.command("checkpoint")(checkpoint)
    convert_app.command("shards")(shards)
    app.add_typer(convert_app, name="convert")
