"""`torchkit dataset-stats ROOT`: exact mean/std per channel and a health report of a dataset."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from torchkit.cli import console
from torchkit.cli.options import (
    AllClassesOption,
    DataSplit,
    ForceOption,
    FormatOption,
    ImageSetArgument,
    ImageSetOption,
    OutputOption,
    StrictOption,
    WorkersOption,
    data_and_rest,
    split_option,
)
from torchkit.cli.progress import progress_bar
from torchkit.cli.render import (
    ClassRows,
    OutputFormat,
    Table,
    binary_size,
    check_all_classes,
    emit,
    resolve_format,
)
from torchkit.core.data.neardup import DEFAULT_NEAR_THRESHOLD, MAX_THRESHOLD  # light: no numpy
from torchkit.core.io.wording import counted


class StatsMode(str, Enum):
    rgb = "rgb"
    gray = "gray"
    native = "native"


def _human_bytes(size: int) -> str:
    return binary_size(size) if size < 1024 else f"{binary_size(size)} ({size} bytes)"


def _duplicates_cell(stats) -> str:
    """`3 (in 2 groups)`, `1 (in 1 group)`, and how many of the groups span classes (a label
    conflict)."""
    conflicts = len(stats.label_conflicts)
    across = f"; {conflicts} across classes" if conflicts else ""
    return f"{stats.duplicate_files} (in {counted(len(stats.duplicates), 'group')}{across})"


def _counts(mapping: dict[str, int]) -> str:
    return ", ".join(f"{key} {value}" for key, value in mapping.items())


def _moment_text(value: float) -> str:
    """A mean or std: 4 decimals (values in [0, 1]), 4 significant digits below 0.01, where 4
    decimals would round a float image's std of 1e-5 to 0.0000 (a Normalize dividing by 0), and
    every whole digit of a large one (a 32-bit image's mean of 2e9, not 2e+09)."""
    return f"{value:.4g}" if 0 < abs(value) < 0.01 else f"{value:.4f}"


def _normalize_line(mean: list[float], std: list[float]) -> str:
    def numbers(values: list[float]) -> str:
        return ", ".join(_moment_text(v) for v in values)

    return f"Normalize(mean=[{numbers(mean)}], std=[{numbers(std)}])"


def _tables(stats, *, all_classes: bool = False) -> list[Table]:
    channels = Table(
        ["channel", "mean", "std"],
        [
            [c, _moment_text(m), _moment_text(s)]
            for c, m, s in zip(stats.channels, stats.mean, stats.std, strict=True)
        ],
        title=f"Channels ({stats.mode}"
        + (f", resize {stats.resize}" if stats.resize else "")
        + ")",
        align_right={"mean", "std"},
    )
    width, height = stats.width, stats.height
    summary = Table(
        ["statistic", "value"],
        [
            ["normalize", _normalize_line(stats.mean, stats.std)],
            ["images", f"{stats.images} readable of {stats.files} image files"],
            ["classes", stats.num_classes],
            ["imbalance ratio", stats.imbalance_ratio],
            ["width min / median / max", f"{width.min} / {width.median:g} / {width.max}"],
            ["height min / median / max", f"{height.min} / {height.median:g} / {height.max}"],
            ["colour modes", _counts(stats.modes)],
            ["file formats", _counts(stats.formats)],
            ["total size", _human_bytes(stats.total_bytes)],
            ["pixels per channel", stats.pixels],
            ["unreadable files", len(stats.unreadable)],
            ["duplicate files", _duplicates_cell(stats)],
            *_leakage_rows(stats),
            ["non-image files skipped", len(stats.non_image_files)],
        ],
        title=f"Dataset {stats.source}" + (f" ({stats.split})" if stats.split else ""),
    )
    share = max(stats.images, 1)
    classes = Table(
        ["class", "images", "share"],
        [[c.shown or "(unlabelled)", c.images, c.images / share] for c in stats.classes],
        title="Images per class",
        align_right={"images", "share"},
        # The table format: the largest and smallest classes, or all of them.
        per_class=None if all_classes else ClassRows("images"),
    )
    tables = [summary, channels, classes]
    if stats.unreadable:
        tables.append(
            Table(
                ["file", "error"],
                [[u.path, u.error] for u in stats.unreadable],
                title=f"Unreadable files ({len(stats.unreadable)}, skipped)",
            )
        )
    if stats.duplicates:
        # A group's classes in a table of their own, a row a group: in a column of the file
        # list they padded every file's row to the longest (25,000 copies spread over 125
        # classes: 200,000 rows of 900 characters).
        groups = [
            [number, len(group.paths), ", ".join(group.classes)]
            for number, group in enumerate(stats.duplicates, 1)
        ]
        files = [
            [number, path]
            for number, group in enumerate(stats.duplicates, 1)
            for path in group.paths
        ]
        tables += [
            Table(
                ["group", "files", "classes"],
                groups,
                title="Exact duplicates (same bytes)",
                align_right={"files"},
            ),
            Table(["group", "file"], files, title="Duplicate files"),
        ]
    tables += _pair_tables(stats)
    return tables


SHOWN_PAIRS = 20  # pairs the table shows; JSON and --leakage-csv have all of them


def _leakage_rows(stats) -> list[list]:
    rows = []
    if stats.leakage_checked:
        counts = stats.leakage_counts()
        rows.append(
            [
                "leakage across splits",
                f"{counts['exact']} exact, {counts['near']} near "
                f"(pHash distance <= {stats.near_threshold}; "
                f"{counted(stats.hashed_files, 'image')} hashed)",
            ]
        )
    if stats.within_checked:
        label = "near duplicates within a split" if stats.split else "near duplicates"
        rows.append(
            [
                label,
                f"{len(stats.near_duplicates)} pairs (pHash distance <= {stats.near_threshold})",
            ]
        )
    return rows


def _pair_tables(stats) -> list[Table]:
    tables = []
    for pairs, title in (
        (stats.leakage, "Leakage: the same image in different splits"),
        (
            stats.near_duplicates,
            "Near duplicates within a split" if stats.split else "Near duplicates",
        ),
    ):
        if not pairs:
            continue
        shown = pairs[:SHOWN_PAIRS]
        more = (
            f"; the first {SHOWN_PAIRS}, all in --format json or --leakage-csv FILE"
            if len(pairs) > SHOWN_PAIRS
            else ""
        )
        tables.append(
            Table(
                ["path_a", "split_a", "path_b", "split_b", "kind", "distance", "same_file"],
                [
                    [p.path_a, p.split_a, p.path_b, p.split_b, p.kind, p.distance, p.same_file]
                    for p in shown
                ],
                title=f"{title} ({len(pairs)} pairs{more})",
                align_right={"distance"},
            )
        )
    return tables


def _long_table(stats) -> Table:
    """Everything in one `section,name,value` table for --format csv."""
    rows: list[list] = []
    for channel, mean, std in zip(stats.channels, stats.mean, stats.std, strict=True):
        rows += [["mean", channel, mean], ["std", channel, std]]
    if stats.split:
        rows.append(["summary", "split", stats.split])
    rows += [
        ["summary", "files", stats.files],
        ["summary", "images", stats.images],
        ["summary", "pixels", stats.pixels],
        ["summary", "classes", stats.num_classes],
        ["summary", "imbalance_ratio", stats.imbalance_ratio],
        ["summary", "total_bytes", stats.total_bytes],
        ["summary", "unreadable", len(stats.unreadable)],
        ["summary", "duplicate_files", stats.duplicate_files],
        ["summary", "duplicate_label_conflicts", len(stats.label_conflicts)],
        ["summary", "non_image_files", len(stats.non_image_files)],
    ]
    if stats.leakage_checked:
        counts = stats.leakage_counts()
        rows += [
            ["summary", "leakage_exact", counts["exact"]],
            ["summary", "leakage_near", counts["near"]],
        ]
    if stats.near_threshold is not None:
        rows.append(["summary", "near_threshold", stats.near_threshold])
    if stats.within_checked:  # not looked for without --near-duplicates: no count, not 0
        rows.append(["summary", "near_duplicates", len(stats.near_duplicates)])
    for axis, values in (("width", stats.width), ("height", stats.height)):
        rows += [[axis, key, getattr(values, key)] for key in ("min", "median", "max")]
    rows += [["class", c.shown, c.images] for c in stats.classes]
    rows += [["mode", key, value] for key, value in stats.modes.items()]
    rows += [["format", key, value] for key, value in stats.formats.items()]
    rows += [["unreadable", u.path, u.error] for u in stats.unreadable]
    rows += [
        ["duplicate", path, number]
        for number, group in enumerate(stats.duplicates, 1)
        for path in group.paths
    ]
    return Table(["section", "name", "value"], rows)


def dataset_stats(
    root: ImageSetArgument = None,
    data: ImageSetOption = None,
    split: Annotated[
        Optional[DataSplit],
        split_option(
            "train, as normalisation statistics come from training data only; the "
            "whole of data without splits"
        ),
    ] = None,
    mode: Annotated[
        StatsMode,
        typer.Option(
            "--mode",
            help="rgb: the RGB pixels torchkit's loaders feed a model (16-bit images scaled to "
            "8 bits); gray: grayscale; native: the files' own channels and bit depth (all "
            "images must have the same channels).",
            case_sensitive=False,
        ),
    ] = StatsMode.rgb,
    resize: Annotated[
        Optional[int],
        typer.Option(
            "--resize",
            min=1,
            help="Measure after resizing the shorter side to N pixels, as transforms.Resize(N).",
            show_default=False,
        ),
    ] = None,
    workers: WorkersOption = None,
    strict: StrictOption = False,
    plot: Annotated[
        Optional[Path],
        typer.Option(
            "--plot",
            help="Also draw the class histogram and the image-size scatter to FILE "
            "(.png, .pdf, .svg or .jpg).",
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    leakage: Annotated[
        bool,
        typer.Option(
            "--leakage/--no-leakage",
            help="Of split data, also read the other splits' files (hashed, not measured) and "
            "list exact and near duplicates that lie in different splits.",
        ),
    ] = True,
    near_threshold: Annotated[
        int,
        typer.Option(
            "--near-threshold",
            metavar="BITS",
            min=0,
            max=MAX_THRESHOLD,
            help="Near duplicates: 64-bit pHashes at most this many bits apart (re-encoded and "
            "resized copies are within a few bits, unrelated images about 32).",
        ),
    ] = DEFAULT_NEAR_THRESHOLD,
    near_duplicates: Annotated[
        bool,
        typer.Option(
            "--near-duplicates",
            help="Also list near duplicates within one split (of data without splits: within "
            "the data).",
        ),
    ] = False,
    exact_phash: Annotated[
        bool,
        typer.Option(
            "--exact-phash",
            help="Hash every image from its whole decode: imagededup's PHash bit for bit. By "
            "default an image of 512 px or more a side is first reduced to 256-511 px (a JPEG "
            "decoded at 1/2 to 1/8 scale): several times faster on large JPEGs, a few bits "
            "off imagededup's hash on some.",
        ),
    ] = False,
    leakage_csv: Annotated[
        Optional[Path],
        typer.Option(
            "--leakage-csv",
            help="Write every duplicate pair to FILE: path_a,split_a,path_b,split_b,kind,distance,"
            "same_file (true where the two paths are one file: a link).",
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    all_classes: AllClassesOption = False,
    fmt: FormatOption = None,
    output: OutputOption = None,
    force: ForceOption = False,
) -> None:
    """Per-channel mean and std (exact, for transforms.Normalize), class counts, image sizes,
    colour modes, formats, unreadable files, exact duplicates and leakage between splits of an
    image dataset.

    Of a split root or a CSV index with a split column, the train split by default (--split
    picks another, --split all takes everything); the files of every split are hashed in the
    same pass to find the same image (same bytes, or a pHash within --near-threshold bits) in
    two splits. One pass over the images in worker processes (--workers, default: all cores).

    Examples:

      torchkit dataset-stats data/train

      torchkit dataset-stats data/train --resize 256 -j 4

      torchkit dataset-stats out/split.csv --format json -o stats.json  (train rows only)

      torchkit dataset-stats index.csv --strict --plot stats.png

      torchkit dataset-stats data/split --near-duplicates --leakage-csv pairs.csv
    """
    from functools import partial

    from torchkit.core.io.file_outputs import ReplacedFiles
    from torchkit.core.runtime.plot_helper import plot_helper
    from torchkit.core.stats import (
        check_outputs,
        compute_dataset_stats,
        plot_dataset_stats,
        write_pairs_csv,
    )

    fmt = resolve_format(fmt, output)
    check_all_classes(all_classes, fmt)
    root = _root(root, data)
    # Refuse outputs that would fail before the long pass, not after it.
    check_outputs(root, output, plot, force=force, leakage_csv=leakage_csv)
    # --plot: matplotlib imports in a helper process during the pass over the images.
    with plot_helper(plot is not None) as painter:
        with progress_bar("Reading images") as update:
            stats = compute_dataset_stats(
                root,
                split=None if split is None else split.value,
                mode=mode.value,
                resize=resize,
                workers=workers,
                strict=strict,
                progress=update,
                leakage=leakage,
                near_threshold=near_threshold,
                near_duplicates=near_duplicates,
                pairs_required=leakage_csv is not None,
                exact_phash=exact_phash,
            )
        for note in stats.notes:
            console.note(note)
        # The report, plot and pairs an earlier run wrote are set aside until all the new ones
        # are in place (export's rule): a plot or CSV the disk has no room for leaves every old
        # file as it was, not a new report beside them. The "wrote" notes follow then.
        with ReplacedFiles() as replaced:
            emit(
                tables=[_long_table(stats)]
                if fmt == OutputFormat.csv
                else _tables(stats, all_classes=all_classes),
                data=stats.to_dict(),
                fmt=fmt,
                output=output,
                force=force,
                written=[plot, leakage_csv],  # `--plot /dev/stdout`: the report goes to stderr
                replaced=replaced,
            )
            if plot is not None:
                replaced.set_aside(plot)  # before each writer checks its file again
                written = plot_dataset_stats(stats, plot, force=force, painter=painter)
                replaced.wrote(plot)
                replaced.when_kept(partial(console.note, f"wrote {written}"))
            if leakage_csv is not None:
                replaced.set_aside(leakage_csv)
                written = write_pairs_csv(stats, leakage_csv, force=force)
                replaced.wrote(leakage_csv)
                pairs = len(stats.leakage) + len(stats.near_duplicates)
                replaced.when_kept(partial(console.note, f"wrote {written} ({pairs} pairs)"))


def _root(root: str | None, data: str | None) -> str:
    from torchkit.core.io.errors import UsageError

    root, _ = data_and_rest(data, [root] if root is not None else [], name="ROOT", after=0)
    if root is None:
        raise UsageError("missing ROOT", "give it, or as --data ROOT")
    return root


def register(app: typer.Typer) -> None:
    app.command("dataset-stats")(dataset_stats)
