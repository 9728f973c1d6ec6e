"""`torchkit split ROOT OUT`: a stratified, seeded train/val/test split of an image dataset."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from torchkit.cli import console
from torchkit.cli.options import (
    AllClassesOption,
    ForceOption,
    FormatOption,
    ImageSetArgument,
    ImageSetOption,
    OutOption,
    OutputOption,
    seed_in_range,
    strict_reading_callback,
)
from torchkit.cli.out_beside_data import argument_as_out, data_and_out
from torchkit.cli.progress import progress_bar
from torchkit.cli.render import (
    ClassRows,
    ReportAtSwap,
    Table,
    check_all_classes,
    report_file,
    resolve_format,
)
from torchkit.core.io.wording import counted


class SplitMode(str, Enum):
    copy = "copy"
    symlink = "symlink"
    hardlink = "hardlink"
    move = "move"
    manifest = "manifest"


def _table(result, *, all_classes: bool = False) -> Table:
    rows = [
        [name or "(unlabelled)", *row, sum(row)]
        for name, row in zip(result.classes, result.counts, strict=True)
    ]
    rows.append(["total", *result.totals, sum(result.totals)])
    columns = ["class", *result.names, "total"]
    if result.repeats is not None:  # --oversample: the extra copies in the first split
        repeats = f"{result.names[0]} repeats"
        columns.append(repeats)
        for row, extra in zip(rows, [*result.repeats, sum(result.repeats)], strict=True):
            row.append(extra)
    return Table(
        columns,
        rows,
        align_right=set(columns) - {"class"},
        # The table format: the largest and smallest classes, or all of them.
        per_class=None if all_classes else ClassRows("total", totals=1),
    )


def _describe(result) -> str:
    done = {"copy": "copied", "symlink": "linked", "hardlink": "hard-linked", "move": "moved"}
    if result.fixed is not None:
        per = " per class" if result.stratified else ""
        sizes = ", ".join(
            f"{n} in {name}" for n, name in zip(result.fixed, result.names[1:], strict=True)
        )
        ratio = f"fixed: {sizes}{per}"
    else:
        ratio = "ratio " + ":".join(f"{r:g}" for r in result.ratio)
    how = "stratified" if result.stratified else "not stratified"
    group = f", {result.groups} groups by --group" if result.groups else ""
    files = sum(result.totals)
    if result.mode == "manifest":
        action = f"listed {counted(files, 'file')}"
    elif result.already_done:  # moved by the run before: this one moved nothing
        action = f"{counted(files, 'file')} in {result.out}"
    else:
        action = f"{done[result.mode]} {counted(files, 'file')} into {result.out}"

    resumed = "finished the interrupted move: " if result.resumed else ""
    repeats = (
        f", {sum(result.repeats)} repeats balance {result.names[0]}"
        if result.repeats is not None
        else ""
    )
    return (
        f"{resumed}{action} ({ratio}, seed {result.seed}, {how}{group}{repeats}); "
        f"the split is in {result.manifest}"
    )


def _dedup_note(result) -> str | None:
    if not result.dedup or not result.dedup_groups:
        return None
    return (
        f"kept {result.dedup_groups} group(s) of byte-identical files ({result.dedup_files} "
        "files) in one split each; --no-dedup-groups splits them like other files"
    )


def split(
    root: ImageSetArgument = None,
    out: Annotated[
        Optional[Path],
        typer.Argument(
            help="Output folder: OUT/<split>/<class>/<image> and OUT/split.csv (or --out).",
            metavar="OUT",
            show_default=False,
        ),
    ] = None,
    out_option: OutOption = None,
    data: ImageSetOption = None,
    ratio: Annotated[
        Optional[str],
        typer.Option(
            "--ratio",
            help="Two or three parts: proportions like 8:1:1 or 70:30, or fractions like 0.7,0.3 "
            "(default: 8:1:1).",
            show_default=False,
        ),
    ] = None,
    fixed: Annotated[
        Optional[str],
        typer.Option(
            "--fixed",
            metavar="N[,M]",
            help="Instead of --ratio: N images of each class in val (and M in test), the rest "
            "in train.",
            show_default=False,
        ),
    ] = None,
    oversample: Annotated[
        bool,
        typer.Option(
            "--oversample",
            help="Balance the train classes by repeating images up to the largest class "
            "(extra copies or links with their own names, repeated rows with --mode manifest; "
            "numbered in split.csv's repeat column). With --group a group's files are repeated "
            "together.",
        ),
    ] = False,
    names: Annotated[
        Optional[str],
        typer.Option(
            "--names",
            help="Split folder names, one per part (default: train,val,test).",
            show_default=False,
        ),
    ] = None,
    stratify: Annotated[
        bool,
        typer.Option(
            "--stratify/--no-stratify",
            help="Split every class in the same proportions, or the files as one pool.",
        ),
    ] = True,
    seed: Annotated[
        int,
        typer.Option(
            "--seed",
            callback=seed_in_range,
            help="Seed of the shuffle: same seed, same split, anywhere.",
        ),
    ] = 0,
    group: Annotated[
        Optional[str],
        typer.Option(
            "--group",
            metavar="REGEX|stem",
            help="Keep files in the same split when REGEX, searched in their file names, "
            r"captures the same group, e.g. '^(patient\d+)_' (no leakage between splits); "
            "stem: the files of one folder whose names differ only in the extension.",
            show_default=False,
        ),
    ] = None,
    dedup_groups: Annotated[
        bool,
        typer.Option(
            "--dedup-groups/--no-dedup-groups",
            help="Keep byte-identical files in the same split (with --group too), so no copy "
            "of a training image lands in val or test.",
        ),
    ] = True,
    mode: Annotated[
        SplitMode,
        typer.Option(
            "--mode",
            help="copy, symlink or hardlink the files; move them (verified, resumable); or "
            "write only OUT/split.csv (manifest).",
            case_sensitive=False,
        ),
    ] = SplitMode.copy,
    strict: Annotated[
        bool,
        typer.Option(
            "--strict",
            help="Refuse a CSV index that lists a file that is not an image, or a folder "
            "that cannot be listed, instead of leaving it out with a warning.",
            callback=strict_reading_callback,
        ),
    ] = False,
    all_classes: AllClassesOption = False,
    force: ForceOption = False,
    fmt: FormatOption = None,
    output: OutputOption = None,
) -> None:
    r"""Split a dataset into OUT/train, OUT/val and OUT/test (8:1:1 by default), stratified by
    class and reproducible, and write OUT/split.csv (path, label, split, source).

    Byte-identical files always land in the same split (--no-dedup-groups: not). --fixed N,M
    takes N images per class for val and M for test instead of a ratio; --oversample repeats
    train images until every class has as many as the largest.

    ROOT is never modified except by --mode move. OUT may not be ROOT, lie inside it or hold
    it. A non-empty OUT needs --force, which replaces only an earlier split in it (its split
    folders and split.csv) and is refused for any other folder, and where those folders hold
    files the earlier split did not write. Rerunning an interrupted move finishes it; rerunning
    a finished one says so and changes nothing.

    ROOT and OUT may be given as --data and --out instead. With --data the argument is OUT:
    `split raw --data raw2` splits raw2 into raw, and a refusal of raw (a folder that already
    exists) names --data and says what to write.

    Examples:

      torchkit split data/raw data/split  (copy, 8:1:1, seed 0)

      torchkit split data/raw data/split --ratio 0.7,0.3 --mode symlink

      torchkit split data/raw out --mode manifest  (only out/split.csv)

      torchkit split data/raw data/split --group '^(patient\d+)_' --seed 3

      torchkit split data/raw data/split --fixed 20,20 --oversample --mode symlink

      torchkit split --data data/raw data/split  (ROOT as --data: the argument is OUT)
    """
    from torchkit.core.io.option_lists import list_items
    from torchkit.core.split import check_report_file, split_dataset

    fmt = resolve_format(fmt, output)
    check_all_classes(all_classes, fmt)
    root, out, argument = data_and_out(root, out, data, out_option, data_name="ROOT")
    split_names = (
        None if names is None else list_items(names, "--names", hint="e.g. --names train,val,test")
    )
    if report_file(output) is not None:
        check_report_file(output, force, root, out, split_names)

    # An -o file is written before the new split replaces an earlier one in OUT (ReportAtSwap).
    def rendered(result) -> tuple[list[Table], dict]:
        return [_table(result, all_classes=all_classes)], result.to_dict()

    with ReportAtSwap(rendered, fmt=fmt, output=output, force=force) as report:
        with (
            progress_bar(f"Splitting ({mode.value})") as update,
            argument_as_out(argument, data, data_name="ROOT", doing="split", command=["split"]),
        ):
            result = split_dataset(
                root,
                out,
                ratio=ratio,
                names=split_names,
                seed=seed,
                stratify=stratify,
                group=group,
                mode=mode.value,
                force=force,
                progress=update,
                dedup=dedup_groups,
                fixed=fixed,
                oversample=oversample,
                strict=strict,
                before_keep=report.before_keep,
            )
        if result.already_done:
            console.note(
                f"the move of {result.source} into {result.out} is already done: nothing to move"
            )
        console.note(_describe(result))
        for note in result.notes:
            console.note(note)
        kept = _dedup_note(result)
        if kept:
            console.note(kept)
        report.after(result)
    incomplete = result.incomplete()  # as `cp -r`: the rest is placed, the command failed
    if incomplete is not None:
        raise incomplete


def register(app: typer.Typer) -> None:
    app.command("split")(split)
