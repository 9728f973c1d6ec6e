"""`split_dataset`, the command's run: options checked, OUT locked, then a new split planned and
written, or an interrupted move finished (see the package doc)."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from torchkit import __version__
from torchkit.core.data.hashing import label_conflicts_said
from torchkit.core.data.sources.discovery import collecting_unlisted, place_in_source
from torchkit.core.data.sources.inputs import data_inputs
from torchkit.core.data.sources.moving import lock_for_reading, moving_here, source_folders
from torchkit.core.data.sources.required import require_data
from torchkit.core.data.sources.splitting import (
    SPLIT_NAMES,
    sample_keys,
    spread_note,
    stratified_split,
)
from torchkit.core.io.claims import reporting_write_errors
from torchkit.core.io.errors import InputError, OutputExistsError, UsageError
from torchkit.core.io.files import absolute_as_opened, refuse_case_twins
from torchkit.core.io.force import (
    check_replaceable,
    force_refusal,
    marker_command,
)
from torchkit.core.io.output_paths import remove_tree
from torchkit.core.io.outputs import OutputFolder
from torchkit.core.io.overlap import check_not_protected, check_overlap
from torchkit.core.io.progress import Progress
from torchkit.core.io.shell_words import shell_line
from torchkit.core.io.wording import counted
from torchkit.core.split.files import (
    MOVE_TEMP,
    LinkTargets,
    check_hardlinks,
    check_room_for_move,
    check_sources_removable,
    finish_rows,
    moving_out_of,
    place_files,
    refuse_temporary_names,
    write_manifest,
)
from torchkit.core.split.options import (
    MANIFEST,
    SPLIT_MODES,
    SplitOptions,
    check_names,
    group_names,
    parse_fixed,
    parse_ratio,
)
from torchkit.core.split.output import (
    JOURNAL,
    WHAT,
    SplitOutput,
    discard_replaced,
    forget_moving,
    note_moving,
    previous_split_names,
    read_journal,
    read_split_rows,
    recover_split_leftovers,
    refuse_files_not_written,
    write_journal,
)
from torchkit.core.split.plan import (
    Plan,
    add_repeats,
    check_csv_sources,
    dedup_units,
    destinations,
    fixed_split,
    label_conflicts,
    listed_images,
    load_split_input,
    oversample_repeats,
    refuse_linked_folders,
    warn_dangling_links,
    warn_fixed_unmet,
    warn_small,
    warn_unbalanced,
)
from torchkit.core.split.report import SplitResult

log = logging.getLogger("torchkit")


def split_dataset(
    source: str | os.PathLike,
    out: str | os.PathLike,
    *,
    ratio: str | Sequence[float] | None = None,
    names: Sequence[str] | None = None,
    seed: int = 0,
    stratify: bool = True,
    group: str | None = None,
    mode: str = "copy",
    force: bool = False,
    progress: Progress | None = None,
    dedup: bool = True,
    fixed: str | Sequence[int] | None = None,
    oversample: bool = False,
    strict: bool = False,
    before_keep: Callable[[SplitResult], None] | None = None,
) -> SplitResult:
    """Split the image folder, flat folder or CSV index `source` into `out`/<split>/... (data
    that is split already is refused: see `load_split_input`).

    `ratio` (8:1:1 by default) or `fixed` (`N[,M]` images per class in val[, test], the rest in
    train) sets the sizes; `dedup` keeps byte-identical files in one split; `oversample`
    balances train's classes by repeating images (not with `mode="move"`); `strict` refuses a
    CSV index that lists a file that is not an image (left out with a warning otherwise).
    `before_keep(result)` runs before a new split replaces the files of an earlier one in `out`
    (a move: before the first file moves): if it raises (the caller's `-o` report did not fit
    on its disk), the earlier split stays. A finished or resumed move does not call it.

    See the module docstring. Raises UsageError for bad options, InputError for bad input,
    OutputOverlapError for an OUT that is, holds or lies inside the dataset (or is `.`),
    OutputExistsError for a non-empty `out` without `force` (or, with it, one that is not an
    earlier split) and OutputLockedError while another process writes `out`.
    """
    if mode not in SPLIT_MODES:
        raise UsageError(f"unknown --mode {mode!r}", "use one of: " + ", ".join(SPLIT_MODES))
    if fixed is not None and ratio is not None:
        raise UsageError("--fixed and --ratio both set the sizes of the splits", "give one of them")
    if oversample and mode == "move":
        raise UsageError(
            "--oversample cannot --mode move: the repeats need the files where they are",
            "use --mode copy, symlink, hardlink or manifest",
        )
    if group is not None and not group:
        # An empty pattern matches every name: one group, nothing left to split.
        raise UsageError(
            "--group '' puts every file in one group",
            r"give a pattern that captures the group, e.g. '^(patient\d+)_'",
        )
    counts = None if fixed is None else parse_fixed(fixed)
    fractions = None if counts is not None else parse_ratio("8:1:1" if ratio is None else ratio)
    parts = len(counts) + 1 if counts is not None else len(fractions)
    sizes = "--ratio" if counts is None else "--fixed"
    names = check_names(SPLIT_NAMES[:parts] if names is None else names, parts, sizes)
    options = SplitOptions(
        fractions, counts, names, seed, stratify, group, mode, dedup, oversample, strict
    )
    # A move empties ROOT: a second move out of it (into another OUT) would find each file
    # gone and report it deleted, and a reader would read part of it, so ROOT is held for the
    # move's whole run (and its own reading of ROOT takes no reader's lock).
    if mode != "move":
        return _split_or_finish(source, Path(out), options, force, progress, before_keep)
    with moving_out_of(source), moving_here(source):
        return _split_or_finish(source, Path(out), options, force, progress, before_keep)


def _split_or_finish(
    source,
    out: Path,
    options: SplitOptions,
    force: bool,
    progress: Progress | None,
    before_keep: Callable[[SplitResult], None] | None,
) -> SplitResult:
    """A new split into `out`, or the interrupted move recorded there finished."""
    mode = options.mode
    inputs = data_inputs(source)
    # Before anything else, even the journal: OUT is never the dataset, in it or around it.
    check_not_protected(out, WHAT)
    check_overlap(out, WHAT, inputs)
    journal = read_journal(out) if out.is_dir() else None
    if journal is not None and journal.get("state") == "moving":
        with OutputFolder(out, command="split", inputs=inputs, what=WHAT, resume=True):
            journal = read_journal(out)  # under the lock: another run may have finished it
            if journal is not None and journal.get("state") == "moving":
                return _resume_move(source, out, journal, mode, progress)
    # (A move killed before its plan was on disk left a "copying" journal: undone below.)
    if journal is not None and journal.get("mode") == "move" and journal.get("state") != "copying":
        # Checked first: a journal without its ROOT was refused as "files moved there from
        # None", and the same move said done from a journal its summary cannot read.
        _check_journal(out, journal)
        if mode == "move" and _same_move(journal, source, options):
            return _move_result(source, out, journal, already_done=True)
        raise OutputExistsError(
            f"{out} holds files moved there from {journal.get('root')}: the only copies",
            "move them elsewhere first, or choose another output folder",
        )

    # Half of it is in OUT1 (or on its way there): a split of what is left would pass for a
    # split of the whole, and a second move would put its files in three places. (A move
    # running now holds ROOT's lock, or a folder's above it: a move is refused there, above.)
    lock_for_reading(Path(source))
    # The dataset before OUT's rules: a missing one is not reported as an OUT that "already
    # exists". (An interrupted or finished move, above, needs no dataset to say so.)
    require_data(source)
    # The lock first (and what a killed split left put back), then the --force rules.
    with OutputFolder(out, command="split", inputs=inputs, what=WHAT, resume=True):
        recover_split_leftovers(out)
        # A split merges into OUT (other files stay), so another command's output folder would
        # become a hybrid: a train run's split.csv, which eval reuses, replaced by this one.
        other = marker_command(out) if out.is_dir() and not out.is_symlink() else None
        if other not in (None, "split"):
            raise OutputExistsError(
                f"{WHAT} {out} holds the output of torchkit {other}, not a split",
                "--force only replaces an earlier split: choose another output folder",
            )
        # What --force would meet, judged once, under the lock: it decides the check below
        # and, only where "already exists" is said, its hint.
        refusal = force_refusal(out, command="split")
        if (refusal is None or not refusal.by_owner) and out.is_dir():
            # Before "already exists": its hint, --force, would be refused for these files.
            refuse_files_not_written(out, set(options.names) | previous_split_names(out))
        check_replaceable(
            out,
            force,
            what=WHAT,
            hint=lambda: (
                "pass --force to replace the split in it" if refusal is None else refusal.hint(out)
            ),
        )
        return _split_into(source, out, options, progress, before_keep)


def _split_into(source, out: Path, options: SplitOptions, progress, before_keep) -> SplitResult:
    with contextlib.ExitStack() as held:  # the locks taken once OUT is made
        return _plan_and_write(source, out, options, progress, held, before_keep)


def _plan_and_write(
    source,
    out: Path,
    options: SplitOptions,
    progress,
    held: contextlib.ExitStack,
    before_keep: Callable[[SplitResult], None] | None = None,
) -> SplitResult:
    names, mode = options.names, options.mode
    root = Path(source)
    with collecting_unlisted() as unlisted:
        samples, sources, is_csv, emptied = _split_input(source, options, held)
    keys = sample_keys(samples)
    units, groups, identical = _grouping(samples, sources, keys, options)
    n_groups = None if groups is None else len(set(groups))
    parts, filled, split_of, counts = _assign_splits(samples, keys, units, options)
    conflicts = label_conflicts(
        identical, samples.labels, samples.classes, names, split_of, samples.ids or sources, sources
    )
    warn_label_conflicts(conflicts)
    # What --force replaces in OUT: set aside now, deleted before a move's first file moves
    doomed = sorted(set(names) | previous_split_names(out) | {MANIFEST})
    plan, extra = _file_plan(
        samples, sources, keys, groups, split_of, counts, is_csv, out, options, doomed
    )
    totals = [sum(row[j] for row in counts) for j in range(len(names))]
    result = SplitResult(
        source=str(root),
        out=str(out),
        mode=mode,
        names=names,
        ratio=options.ratio or [t / max(1, sum(totals)) for t in totals],
        seed=options.seed,
        stratified=options.stratify,
        group=options.group,
        groups=n_groups,
        classes=list(samples.classes),
        counts=counts,
        manifest=str(out / MANIFEST),
        dedup=options.dedup,
        dedup_groups=len(identical),
        dedup_files=sum(len(members) for members in identical),
        label_conflicts=conflicts,
        fixed=options.fixed,
        repeats=extra,
        unlisted_folders=[place_in_source(path, root) for path in unlisted],
        notes=[
            spread_note(names[j], len(parts[j]), len({samples.labels[i] for i in parts[j]}))
            for j in filled
        ],
    )

    writing = SplitOutput(out, doomed)
    noted: list[str] = []
    noting = False  # the move's records are being written beside the data
    try:
        writing.begin(names, mode, plan.dests)
        if mode != "manifest":
            _journal_half_split(writing, plan, out, mode, names, emptied, held)
        if mode == "move" and before_keep is not None:
            before_keep(result)  # while the earlier split can still be put back, as below
        if mode == "move":
            # The plan goes to disk before the first file moves: an interrupted move can be
            # finished, so from here on nothing is undone; the earlier split is discarded.
            # (Killed before its journal says "moving", it has moved nothing: the journal
            # above has the rerun start again, where split.csv alone was a finished split.)
            write_manifest(out, plan, names, mode)
            # The folders files move out of are noted in, named in the journal for the rerun
            # that finishes the move to clear.
            noted = source_folders(sources, root, to_note=True) if is_csv else []
            record = _moving_record(root, result) | {"noted": noted}
            noting = True
            note_moving(root, out, noted)
            write_journal(out, record)
    except BaseException as error:
        try:
            writing.abandon(error)
        finally:
            if noting:  # the journal that names them failed (a full disk, Ctrl-C): no file
                # moved, and records left beside the data would outlive the split undone
                forget_moving(root, noted)
        raise
    if mode == "move":
        writing.keep()
        with _finish_hint(root, out), reporting_write_errors(out):
            place_files(plan, out, mode, progress)
            write_journal(out, record | {"state": "done"})
        forget_moving(root, noted)
        return result
    try:
        with reporting_write_errors(out):
            if mode != "manifest":
                place_files(plan, out, mode, progress)
            write_manifest(out, plan, names, mode)
        if before_keep is not None:
            before_keep(result)
    except BaseException as error:
        writing.abandon(error)
        raise
    writing.keep(finished=mode != "manifest")  # a manifest split wrote no journal
    if progress and mode == "manifest":
        progress(len(samples), len(samples))
    return result


def _split_input(
    source, options: SplitOptions, held: contextlib.ExitStack
) -> tuple[Any, list[str], bool, list]:
    """(the images to split, the paths to read each from, whether `source` is a CSV index, the
    folders a move out of a CSV index empties), warned of what is left out; a move out of a
    CSV index holds those folders (in `held`) from here on."""
    mode = options.mode
    samples, (non_images, dangling), is_csv = load_split_input(source, mode)
    root = Path(source)
    if non_images:
        log.warning(f"skipped {len(non_images)} non-image file(s), e.g. {non_images[0]}")
    empty = [n for n, c in zip(samples.classes, samples.class_counts(), strict=True) if not c]
    if empty:
        log.warning(f"class folder(s) with no images are left out: {', '.join(empty[:10])}")
    warn_dangling_links(dangling, root)
    if not len(samples):
        # Every image name was left out above: a split of none (exit 0, an empty split.csv)
        # let `split data out && rm -r data` go on, where an empty folder is an error.
        raise InputError(
            f"no images in {root} that a split can place: every image name in it is a link to "
            f"nothing or no regular file ({counted(len(dangling), 'name')})",
            "the warnings above name them; a split places regular image files",
        )
    # The folders a move out of a CSV index empties, wherever the index lists them
    emptied = source_folders(samples.paths, root) if is_csv and mode == "move" else []
    if is_csv:
        held.enter_context(moving_out_of(*emptied))
        sources = check_csv_sources(samples, root)
        samples, sources = listed_images(samples, sources, root, options.strict)
    else:  # ids are relative to ROOT: one abspath instead of 100,000
        (base,) = absolute_as_opened([root])
        base += os.sep
        # The paths read are spelled so already where ROOT was given absolute: not copied.
        sources = list(samples.paths)
        if any(path != base + i for path, i in zip(sources, samples.ids, strict=True)):
            sources = [base + i for i in samples.ids]
        if mode == "move":
            refuse_linked_folders(sources, root)
    return samples, sources, is_csv, emptied


def _grouping(
    samples: Any, sources: list[str], keys: Any, options: SplitOptions
) -> tuple[Any, list[str] | None, list[list[int]]]:
    """(the units that go to one split together, or None; the --group group of each file, or
    None; the groups of byte-identical files kept together)."""
    group = options.group
    groups = group_names(samples, keys, group) if group else None
    units, identical = dedup_units(sources, keys, groups) if options.dedup else (groups, [])
    return units, groups, identical


def warn_label_conflicts(conflicts: list[dict]) -> None:
    """One warning for the groups of byte-identical files filed under more than one class
    (`label_conflicts`): how many, and the first few by their paths. Nothing is left out or
    moved for it: which label is right is the user's call (the JSON report lists them all)."""
    if conflicts:
        said = label_conflicts_said([(c["paths"], c["classes"]) for c in conflicts])
        log.warning(
            f"{said}; each group is kept in one split, every file in its own class "
            "(--format json lists them as label_conflicts)"
        )


def _assign_splits(
    samples: Any, keys: Any, units: Any, options: SplitOptions
) -> tuple[list, list[int], list[int], list[list[int]]]:
    """(each split's members, the splits given an image of every class they lacked, each
    image's split, the images of each class in each split), warned of splits too small."""
    names, seed, stratify = options.names, options.seed, options.stratify
    labels = samples.labels if stratify else [0] * len(samples)
    filled: list[int] = []
    if options.fixed is not None:
        parts = fixed_split(
            labels, options.fixed, seed, units or keys, samples.classes, names, stratify
        )
    else:
        parts = stratified_split(
            labels,
            options.fractions,
            seed,
            keys=keys,
            groups=units,
            at_least_one=True,
            filled=filled,
        )
    split_of = [0] * len(samples)
    for j, members in enumerate(parts):
        for index in members:
            split_of[index] = j
    counts = [[0] * len(names) for _ in samples.classes]
    for label, j in zip(samples.labels, split_of, strict=True):
        counts[label][j] += 1
    if options.fixed is None:
        warn_small(samples.classes, counts, names, stratify)
    else:
        warn_fixed_unmet(samples.classes, counts, names, options.fixed, stratify)
    return parts, filled, split_of, counts


def _file_plan(
    samples: Any,
    sources: list[str],
    keys: Any,
    groups: list[str] | None,
    split_of: list[int],
    counts: list[list[int]],
    is_csv: bool,
    out: Path,
    options: SplitOptions,
    doomed: Sequence[str] = (),
) -> tuple[Plan, Any]:
    """(what goes where, with --oversample's repeats, a --group group's files repeated
    together (`groups`); the repeats per class), checked for the mode: hard links possible into
    OUT, a move's sources removable and room for them in OUT, once the names `doomed` there
    (the earlier split) are deleted."""
    mode, names = options.mode, options.names
    plan = Plan(
        sources=sources,
        labels=[samples.classes[label] for label in samples.labels],
        dests=[] if mode == "manifest" else destinations(samples, split_of, names, is_csv),
        splits=split_of,
    )
    extra = None
    if options.oversample:
        repeats, extra = oversample_repeats(
            samples.labels, split_of, keys, options.seed, len(samples.classes), groups
        )
        add_repeats(plan, repeats, mode, groups)
        warn_unbalanced(samples.classes, counts, names, extra)
    if mode == "hardlink":
        check_hardlinks(plan, out)
    if mode == "move":
        check_sources_removable(plan.sources)
        refuse_temporary_names(plan)
        check_room_for_move(
            plan.sources,
            out,
            freed=[out / name for name in doomed],
            folders=len(_folders_of(plan.dests)),  # made anew: the earlier split's set aside
        )
    return plan, extra


def _folders_of(dests: Iterable[str]) -> set[str]:
    """The folders in OUT that hold the "/"-separated places `dests`, and those above them."""
    folders: set[str] = set()
    for folder in {dest.rpartition("/")[0] for dest in dests}:
        while folder and folder not in folders:
            folders.add(folder)
            folder = folder.rpartition("/")[0]
    return folders


def _journal_half_split(
    writing: SplitOutput,
    plan: Plan,
    out: Path,
    mode: str,
    names: list[str],
    emptied: list,
    held: contextlib.ExitStack,
) -> None:
    """Before files go into OUT: OUT held against moves (in `held`), its file names checked on
    its file system, and the journal that marks it a half split written."""
    # Held while files go in: no move takes them out of OUT (or a folder in it).
    held.enter_context(moving_out_of(out, locked=emptied))
    with reporting_write_errors(out):  # the probe writes a file into OUT
        refuse_case_twins(
            plan.dests,
            out,
            "rename one of them in the data, split into a folder on a file system that "
            "tells case apart, or use --mode manifest",
        )
    # Until it is removed (or a move's replaces it), OUT is a half split: readers
    # refuse it, a rerun removes what it lists and redoes it.
    write_journal(
        out,
        {"state": "copying", "mode": mode, "names": names, "marked": writing.marked}
        # What a rerun removes after a kill: these files and no other (`made`: OUT is
        # the split's own, so that anything else in it is someone else's).
        | {"made": not writing.existed, "dests": plan.dests}
        | {"torchkit_version": __version__},
    )


def _moving_record(root: Path, result: SplitResult) -> dict:
    """The journal of a move under way: what a rerun needs to finish it, or to say that the
    same move is finished."""
    return {
        "state": "moving",
        "mode": "move",
        "root": os.path.realpath(root),
        "names": result.names,
        "ratio": result.ratio,
        "fixed": result.fixed,
        "seed": result.seed,
        "stratified": result.stratified,
        "group": result.group,
        "groups": result.groups,
        "dedup": result.dedup,
        "dedup_groups": result.dedup_groups,
        "dedup_files": result.dedup_files,
        "label_conflicts": result.label_conflicts,
        "classes": result.classes,
        "counts": result.counts,
        "torchkit_version": __version__,
    }


@contextlib.contextmanager
def _finish_hint(root: Path, out: Path):
    """A move that stops half-way (an error, Ctrl-C, SIGTERM) says how to finish it."""
    try:
        yield
    except BaseException:
        log.warning(
            f"the move into {out} stopped half-way: every file is in {root} or in {out}; "
            f"finish it with: {shell_line(['torchkit', 'split', root, out, '--mode', 'move'])}"
        )
        raise


def _same_move(journal: dict, source, options: SplitOptions) -> bool:
    """Is this command line the one that made the (finished) move recorded in `journal`?
    (A journal older than --fixed and dedup groups had neither: it matches the defaults.)"""
    return (
        journal.get("root") == os.path.realpath(source)
        and journal.get("names") == list(options.names)
        and journal.get("fixed") == options.fixed
        and (options.fixed is not None or journal.get("ratio") == options.ratio)
        and journal.get("seed") == options.seed
        and journal.get("stratified") == options.stratify
        and journal.get("group") == options.group
        and journal.get("dedup", options.dedup) == options.dedup
    )


def _plan_rows(out: Path, journal: dict) -> list[dict[str, str]]:
    """The move's plan: the rows of OUT/split.csv, written before the first file moved, each
    checked against the (checked) journal before any file moves: a row of a hand-edited plan
    whose split the journal does not name moved the files, then ended in `Error: ValueError:
    'bogus' is not in list` where the summary counted it."""
    rows = read_split_rows(out, ("path", "label", "split", "source"), "the plan")
    names = list(journal["names"])
    classes = None if journal.get("classes") is None else set(journal["classes"])
    paths: set[str] = set()
    sources: set[str] = set()
    outside = _outside_the_move(journal)
    for number, row in enumerate(rows, start=2):  # line 1 is the header
        problem = _plan_row_problem(row, names, classes, paths, sources) or outside(row["source"])
        if problem is not None:
            raise InputError(
                f"cannot read the plan {out / MANIFEST}: row {number} {problem} (a damaged or "
                "hand-edited plan; no file was moved)",
                f"put back the plan the move wrote, or mend row {number} by hand",
            )
        paths.add(row["path"])
        sources.add(row["source"])
    return rows


def _plan_row_problem(
    row: dict[str, str],
    names: list[str],
    classes: set[str] | None,
    paths: set[str],
    sources: set[str],
) -> str | None:
    """What makes one row of a move's plan one the move did not write (None: nothing): a
    split or class its journal does not record, a place outside that split's folder in OUT
    (`../x` would move the file out of OUT), a place or a source named twice."""
    split, path = row["split"], row["path"]
    if split not in names:
        shown = ", ".join(names)
        return f"names the split {_shown_value(split)}, not one of the move's splits ({shown})"
    if classes is not None and row["label"] not in classes:
        return (
            f"names the class {_shown_value(row['label'])}, which the move's journal does not "
            "record"
        )
    parts = path.split("/")
    if parts[0] != split or len(parts) < 2 or any(p in ("", ".", "..") for p in parts):
        return f"puts its file at {_shown_value(path)}, not inside its split's folder {split}/"
    if path in paths:
        return f"puts a second file at {_shown_value(path)}"
    if row["source"] in sources:
        return f"moves {_shown_value(row['source'])} a second time"
    return None


def _outside_the_move(journal: dict) -> Callable[[str], str | None]:
    """What makes a plan's source one the move did not take its files from (None: nothing):
    a path that is not absolute (the move writes each source's absolute path), or one outside
    ROOT (for a CSV index, outside the folders it listed files in, where the journal records
    them): a hand-edited row `ROOT/../elsewhere/x.jpg` or `/home/me/x.jpg` moved that file
    into OUT."""
    root = journal["root"]
    noted = journal.get("noted")
    if os.path.isdir(root):
        folders = [root]
    elif isinstance(noted, list) and noted and all(isinstance(f, str) for f in noted):
        folders = [os.path.realpath(f) for f in noted]
    else:  # a CSV index's move whose journal records no folders (torchkit 0.x): any
        folders = None
    inside: dict[str, bool] = {}  # a folder's: the sources share a few folders

    def problem(source: str) -> str | None:
        if not os.path.isabs(source):
            return f"moves {_shown_value(source)}, not an absolute path as the move writes"
        if folders is None:
            return None
        folder = os.path.dirname(source)
        if folder not in inside:
            real = os.path.realpath(folder)
            inside[folder] = any(
                real == top or real.startswith(top.rstrip(os.sep) + os.sep) for top in folders
            )
        if inside[folder]:
            return None
        where = root if folders == [root] else "the folders the CSV index lists files in"
        return f"moves {_shown_value(source)}, which is not inside {where}"

    return problem


def _move_result(
    source, out: Path, journal: dict, *, rows=None, resumed=False, already_done=False
) -> SplitResult:
    """The summary of the move recorded in `journal`: what the first run reported."""
    names = list(journal["names"])
    classes, counts = journal.get("classes"), journal.get("counts")
    if classes is None or counts is None:  # a journal of torchkit 0.x: count the plan
        rows = _plan_rows(out, journal) if rows is None else rows
        classes = sorted({row["label"] for row in rows})
        index = {name: i for i, name in enumerate(classes)}
        counts = [[0] * len(names) for _ in classes]
        for row in rows:
            counts[index[row["label"]]][names.index(row["split"])] += 1
    return SplitResult(
        source=str(source),
        out=str(out),
        mode="move",
        names=names,
        ratio=list(journal["ratio"]),
        seed=int(journal["seed"]),
        stratified=bool(journal["stratified"]),
        group=journal.get("group"),
        groups=journal.get("groups"),
        classes=list(classes),
        counts=[list(row) for row in counts],
        manifest=str(out / MANIFEST),
        resumed=resumed,
        already_done=already_done,
        dedup=bool(journal.get("dedup", False)),
        dedup_groups=int(journal.get("dedup_groups") or 0),
        dedup_files=int(journal.get("dedup_files") or 0),
        label_conflicts=list(journal.get("label_conflicts") or []),
        fixed=journal.get("fixed"),
    )


def _resume_move(
    source: str | os.PathLike, out: Path, journal: dict, mode: str, progress: Progress | None
) -> SplitResult:
    """Finish a move that was interrupted, following the plan in OUT/split.csv."""
    root = Path(source)
    _refuse_strangers_plan(out)  # another user's journal is refused as theirs, not as damaged
    # Checked once, here, before anything else reads it: the refusal below names its ROOT,
    # the plan's rows are checked against its names and classes, and the summary at the end
    # reads it whole, once files have moved.
    _check_journal(out, journal)
    if mode != "move" or journal["root"] != os.path.realpath(root):
        raise UsageError(
            f"{out} holds an unfinished move from {journal['root']}",
            "finish it with: "
            + shell_line(["torchkit", "split", journal["root"], Path(out), "--mode", "move"]),
        )
    rows = _plan_rows(out, journal)  # the whole plan, before any file moves
    log.warning(f"finishing the interrupted move into {out} (its recorded plan is used)")
    check_sources_removable([row["source"] for row in rows if os.path.lexists(row["source"])])
    with reporting_write_errors(out):
        discard_replaced(out)  # killed before it was discarded: the move had started
        for row in rows:
            # An unverified copy: removed while its source is there, else it may be all
            # that is left of the file.
            if os.path.lexists(row["source"]):
                remove_tree(Path(_move_temp(out, row)), ignore_errors=False)
    sources = [row["source"] for row in rows]
    targets = [os.path.join(out, row["path"]) for row in rows]
    # The files still to move: once the unverified copies above are gone (a copy of a file
    # that is in both places is verified, and takes no more room).
    to_move = [i for i, target in enumerate(targets) if not os.path.lexists(target)]
    check_room_for_move(
        [sources[i] for i in to_move],
        out,
        "free some space on it, then run the same command again to finish the move",
        folders=sum(
            not os.path.isdir(out / f) for f in _folders_of(rows[i]["path"] for i in to_move)
        ),
    )
    links = LinkTargets(sources, targets)
    csv_folders = source_folders(sources, root) if os.path.isfile(root) else []
    # A full disk part-way is `cannot write OUT`, as in the move that began it (it was
    # `Error: OSError: [Errno 28] No space left on device`).
    with _finish_hint(root, out), moving_out_of(out, *csv_folders), reporting_write_errors(out):
        lost = finish_rows(sources, targets, out, links, progress)
    if lost:
        journal, rows = _drop_lost(root, out, journal, rows, lost)
    write_journal(out, journal | {"state": "done"})
    noted = journal.get("noted")
    noted = [f for f in noted if isinstance(f, str)] if isinstance(noted, list) else []
    forget_moving(root, [*csv_folders, *noted])
    return _move_result(root, out, journal, rows=rows, resumed=True)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_lists(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(row, list) and all(_is_int(n) for n in row) for row in value
    )


# What a move's journal holds (`_moving_record`), as its finish and summary read it: a key,
# whether every journal has it, and the test of its value.
_JOURNAL_KEYS: list[tuple[str, bool, Callable[[Any], bool]]] = [
    ("root", True, lambda v: isinstance(v, str) and v != ""),
    ("names", True, lambda v: isinstance(v, list) and v and all(isinstance(n, str) for n in v)),
    (
        "ratio",
        True,
        lambda v: (
            isinstance(v, list)
            and all(isinstance(f, (int, float)) and not isinstance(f, bool) for f in v)
        ),
    ),
    ("seed", True, _is_int),
    ("stratified", True, lambda v: isinstance(v, bool)),
    ("group", False, lambda v: v is None or isinstance(v, str)),
    ("groups", False, lambda v: v is None or _is_int(v)),
    (
        "classes",
        False,
        lambda v: v is None or (isinstance(v, list) and all(isinstance(c, str) for c in v)),
    ),
    ("counts", False, lambda v: v is None or _int_lists(v)),
    ("fixed", False, lambda v: v is None or (isinstance(v, list) and all(_is_int(n) for n in v))),
    ("dedup", False, lambda v: isinstance(v, bool)),
    ("dedup_groups", False, lambda v: v is None or _is_int(v)),
    ("dedup_files", False, lambda v: v is None or _is_int(v)),
    ("label_conflicts", False, lambda v: v is None or isinstance(v, list)),
    ("lost", False, lambda v: isinstance(v, list) and all(isinstance(p, str) for p in v)),
]


def _damaged_journal(out: Path, what: str) -> InputError:
    return InputError(
        f"cannot read {out / JOURNAL}: {what} (a damaged or hand-edited journal; no file was "
        "moved)",
        f"put back the journal the move wrote, or mend it by hand; {out / MANIFEST} lists "
        "each file's source and its place in the split",
    )


def _shown_value(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def _check_journal(out: Path, journal: dict) -> None:
    """The keys of a move's journal and their types, before anything moves: a journal that
    lacked one (hand-edited or damaged) ended in `Error: KeyError: 'ratio'` only once the
    files had moved. Counts of each class in each split, where recorded, fit the names."""
    for key, required, fits in _JOURNAL_KEYS:
        if key not in journal:
            if required:
                raise _damaged_journal(out, f"it has no {key!r}")
            continue
        if not fits(journal[key]):
            raise _damaged_journal(out, f"its {key!r} is {_shown_value(journal[key])}")
    classes, counts = journal.get("classes"), journal.get("counts")
    if classes is None or counts is None:  # counted from the plan (a journal of torchkit 0.x)
        return
    if len(counts) != len(classes) or any(len(row) != len(journal["names"]) for row in counts):
        raise _damaged_journal(out, "its 'counts' do not fit its 'classes' and 'names'")


def _refuse_strangers_plan(out: Path) -> None:
    """A move is finished only from a journal and a plan this user wrote: another user who
    can write a folder above the data (/tmp) could leave there the record of a "stopped move"
    and, in a folder of theirs, a plan naming this user's files as its sources. Readers of the
    data then refuse it and show the command that finishes the move, which moved the files
    into that user's folder."""
    if not hasattr(os, "geteuid"):  # no owners to compare
        return
    me = os.geteuid()
    for name in (JOURNAL, MANIFEST):
        try:
            owner = os.stat(out / name).st_uid
        except OSError:
            continue  # read (and said to be missing) as before
        if owner != me:
            raise InputError(
                f"{out / name} belongs to another user (uid {owner}): torchkit finishes only a "
                "move it started as this user, and moves no file to it",
                f"finish it as the user who started it, or remove {out / name} if that move "
                "is not yours",
            )


def _move_temp(out: Path, row: dict[str, str]) -> str:
    target = os.path.join(out, row["path"])
    return os.path.join(os.path.dirname(target), MOVE_TEMP + os.path.basename(target))


def _drop_lost(
    root: Path, out: Path, journal: dict, rows: list[dict[str, str]], lost: list[int]
) -> tuple[dict, list[dict[str, str]]]:
    """The move without the files another process deleted from ROOT before they were moved:
    they are gone, so their rows leave split.csv and the counts, and the journal lists them
    (written first, so a rerun after a kill here drops them again, never counts them twice)."""
    gone = [rows[i]["source"] for i in lost]
    log.warning(
        f"{len(gone)} file(s) were deleted from {root} before they were moved and are left out "
        f"of the split: {', '.join(gone[:5])}" + (" ..." if len(gone) > 5 else "")
    )
    kept_copies = [t for t in (_move_temp(out, rows[i]) for i in lost) if os.path.lexists(t)]
    if kept_copies:
        log.warning(f"unverified partial copies of them are kept: {', '.join(kept_copies)}")
    dropped = set(lost)
    rows = [row for i, row in enumerate(rows) if i not in dropped]
    names = list(journal["names"])
    journal = journal | {"lost": sorted({*journal.get("lost", []), *gone})}
    if journal.get("classes") is not None and journal.get("counts") is not None:
        index = {name: i for i, name in enumerate(journal["classes"])}
        counts = [[0] * len(names) for _ in index]
        for row in rows:
            counts[index[row["label"]]][names.index(row["split"])] += 1
        journal["counts"] = counts
    plan = Plan(
        sources=[row["source"] for row in rows],
        labels=[row["label"] for row in rows],
        dests=[row["path"] for row in rows],
        splits=[names.index(row["split"]) for row in rows],
    )
    with reporting_write_errors(out):
        write_journal(out, journal)
        write_manifest(out, plan, names, "move")
    return journal, rows
