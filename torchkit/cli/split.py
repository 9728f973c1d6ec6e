"""`torchkit split ROOT OUT`: a stratified, seeded train/val/test split of an image dataset."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from torchkit.cli import console
from torchkit.cli.options import ForceOption, FormatOption, ImageSetArgument, OutputOption
from torchkit.cli.progress import progress_bar
from torchkit.cli.render import OutputFormat, Table, emit


class SplitMode(str, Enum):
    copy = "copy"
    symlink = "symlink"
    hardlink = "hardlink"
    move = "move"
    manifest = "manifest"


def _table(result) -> Table:
    rows = [
        [name or "(unlabelled)", *row, sum(row)]
        for name, row in zip(result.classes, result.counts, strict=True)
    ]
    rows.append(["total", *result.totals, sum(result.totals)])
    return Table(["class", *result.names, "total"], rows, align_right={*result.names, "total"})


def _describe(result) -> str:
    done = {"copy": "copied", "symlink": "linked", "hardlink": "hard-linked", "move": "moved"}
    ratio = ":".join(f"{r:g}" for r in result.ratio)
    how = "stratified" if result.stratified else "not stratified"
    group = f", {result.groups} groups by --group" if result.groups else ""
    files = sum(result.totals)
    action = (
        f"listed {files} files"
        if result.mode == "manifest"
        else f"{done[result.mode]} {files} files into {result.out}"
    )
    resumed = "finished the interrupted move: " if result.resumed else ""
    return (
        f"{resumed}{action} (ratio {ratio}, seed {result.seed}, {how}{group}); "
        f"the split is in {result.manifest}"
    )


def split(
    root: ImageSetArgument,
    out: Annotated[
        Path,
        typer.Argument(
            help="Output folder: OUT/<split>/<class>/<image> and OUT/split.csv.",
            show_default=False,
        ),
    ],
    ratio: Annotated[
        str,
        typer.Option(
            "--ratio",
            help="Two or three parts: proportions like 8:1:1 or 70:30, or fractions like 0.7,0.3.",
        ),
    ] = "8:1:1",
    names: Annotated[
        Optional[str],  # noqa: UP045 - typer needs Optional on Python 3.10
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
        int, typer.Option("--seed", help="Seed of the shuffle: same seed, same split, anywhere.")
    ] = 0,
    group: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--group",
            metavar="REGEX",
            help="Keep files in the same split when REGEX, searched in their file names, "
            r"captures the same group, e.g. '^(patient\d+)_' (no leakage between splits).",
            show_default=False,
        ),
    ] = None,
    mode: Annotated[
        SplitMode,
        typer.Option(
            "--mode",
            help="copy, symlink or hardlink the files; move them (verified, resumable); or "
            "write only OUT/split.csv (manifest).",
            case_sensitive=False,
        ),
    ] = SplitMode.copy,
    force: ForceOption = False,
    fmt: FormatOption = OutputFormat.table,
    output: OutputOption = None,
) -> None:
    r"""Split a dataset into OUT/train, OUT/val and OUT/test (8:1:1 by default), stratified by
    class and reproducible, and write OUT/split.csv (path, label, split, source).

    ROOT is never modified except by --mode move. OUT may not be ROOT, lie inside it or hold
    it. A non-empty OUT needs --force, which replaces only an earlier split in it (its split
    folders and split.csv) and is refused for any other folder. Rerunning an interrupted move
    finishes it; rerunning a finished one says so and changes nothing.

    Examples:

      torchkit split data/raw data/split  (copy, 8:1:1, seed 0)

      torchkit split data/raw data/split --ratio 0.7,0.3 --mode symlink

      torchkit split data/raw out --mode manifest  (only out/split.csv)

      torchkit split data/raw data/split --group '^(patient\d+)_' --seed 3
    """
    from torchkit.core.split import check_report_file, split_dataset

    split_names = None if names is None else names.split(",")
    if output is not None:
        check_report_file(output, force, root, out, split_names)
    with progress_bar(f"Splitting ({mode.value})") as update:
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
        )
    if result.already_done:
        console.note(
            f"the move of {result.source} into {result.out} is already done: nothing to move"
        )
    console.note(_describe(result))
    emit(tables=[_table(result)], data=result.to_dict(), fmt=fmt, output=output, force=force)


def register(app: typer.Typer) -> None:
    app.command("split")(split)
