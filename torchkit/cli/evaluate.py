"""`torchkit eval`: accuracy, top-k, per-class precision/recall/F1, confusion matrix, reports."""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from torchkit.cli import console
from torchkit.cli.options import (
    AllowUntrainedOption,
    EmaOption,
    EvalModelOption,
    ForceOption,
    FormatOption,
    OutputOption,
    StrictOption,
    TrustCheckpointOption,
    WeightsOption,
    data_option,
    model_argument,
)
from torchkit.cli.progress import progress_bar
from torchkit.cli.render import (
    MOST_CLASS_ROWS,
    ReportAtSwap,
    Table,
    check_all_classes,
    format_rate,
    report_file,
    resolve_format,
)
from torchkit.cli.run_options import DEFAULT_PREPROCESS, DEFAULT_RUN, with_inference_options
from torchkit.core.inference.options import InferenceOptions, PreprocessOverrides

# With more classes than this, the terminal's per-class table leaves out the classes that have
# no images and were never predicted (per_class.csv and JSON always list every class).
COMPACT_TABLE_ABOVE = 50
# The per-class table shows at most MOST_CLASS_ROWS classes, every command's bound (render.py),
# but eval picks its own: those of the lowest F1 (1,000 ImageNet classes printed 1,000 rows);
# --all-classes shows every class, and CSV, JSON and --out's per_class.csv always list them.
# Where the table leaves classes out, its last line says how to see them.
SEE_ALL_CLASSES = (
    "--all-classes shows them all, and --format csv or json, or --out's per_class.csv, list them"
)


class TTA(str, Enum):
    none = "none"
    flip = "flip"


@with_inference_options()
def eval_command(
    model: Annotated[Optional[str], model_argument("runtime")] = None,
    data: Annotated[
        Optional[str],
        data_option(
            "Image folder ROOT/<class>/<image>, a split root with test/, a CSV index "
            "(path,label) or `digits`. Default: the data a torchkit checkpoint was trained on "
            "(scored on its held-out split)."
        ),
    ] = None,
    split: Annotated[
        Optional[str],
        typer.Option(
            "--split",
            help="train, val, test or all: a split of a split root, of a CSV index with a split "
            "column or of digits, or the val split a training run held out of unsplit data. "
            "Default: test; on the data a checkpoint was trained on without a test split, the "
            "val split its run held out.",
        ),
    ] = None,
    model_option: EvalModelOption = None,
    num_classes: Annotated[
        Optional[int],
        typer.Option(
            "--num-classes",
            min=1,
            help="Outputs of the model, checked against its weights (default: those of the "
            "weights, else the number of classes in the data).",
        ),
    ] = None,
    weights: WeightsOption = None,
    classes: Annotated[
        Optional[str],
        typer.Option(
            "--classes",
            help="Class names in label order: a text file (one per line) or a,b,c. Default: "
            "from the checkpoint, else the data's class folders in sorted order.",
        ),
    ] = None,
    preprocess: PreprocessOverrides = DEFAULT_PREPROCESS,
    ema: EmaOption = False,
    topk: Annotated[
        Optional[int],
        typer.Option(
            "--topk",
            "-k",
            min=1,
            help="k of the top-k accuracy, named top{k} (default 5): null, and left out of "
            "tables, where there are k classes or fewer (every class is then in the top k).",
        ),
    ] = None,
    tta: Annotated[
        TTA,
        typer.Option(
            "--tta",
            help="Test-time augmentation: flip averages the image and its mirror.",
            case_sensitive=False,
        ),
    ] = TTA.none,
    run: InferenceOptions = DEFAULT_RUN,
    out: Annotated[
        Optional[Path],
        typer.Option(
            "--out",
            help="Write metrics.json, per_class.csv, confusion_matrix.csv/.png (above 2,000 "
            "classes confusion_pairs.csv), predictions.csv and errors.png into this folder.",
            file_okay=False,
        ),
    ] = None,
    normalize: Annotated[
        bool,
        typer.Option(
            "--normalize", help="Normalise confusion_matrix.png per true class (with --out)."
        ),
    ] = False,
    show_errors: Annotated[
        Optional[int],
        typer.Option(
            "--show-errors",
            min=1,
            help="Most confident mistakes drawn in errors.png (with --out). [default: 25]",
            show_default=False,
        ),
    ] = None,
    all_classes: Annotated[
        bool,
        typer.Option(
            "--all-classes",
            help=f"Show every class in the per-class table (by default, above "
            f"{MOST_CLASS_ROWS} classes, the {MOST_CLASS_ROWS} of lowest F1, and only classes "
            "with images or predictions); --format csv or json always list every class.",
        ),
    ] = False,
    strict: StrictOption = False,
    trust_checkpoint: TrustCheckpointOption = False,
    allow_untrained: AllowUntrainedOption = False,
    fmt: FormatOption = None,
    output: OutputOption = None,
    force: ForceOption = False,
) -> None:
    """Evaluate a classifier: top-1/top-k accuracy, precision, recall, F1, loss and a confusion
    matrix, overall and per class.

    Examples:

      torchkit eval runs/best.pt --data digits

      torchkit eval best.pt --data dataset/ --split val --tta flip --out report/

      torchkit eval resnet18 --weights finetuned.pth --data test.csv

      torchrun --nproc_per_node=2 -m torchkit eval best.pt --data dataset/
    """
    from torchkit.core.evaluate import EvalOptions, evaluate, parse_class_names
    from torchkit.core.evaluate.runner import check_report_file
    from torchkit.core.evaluate.source import recorded_data
    from torchkit.core.runtime.launch import is_main_process

    fmt = resolve_format(fmt, output)
    check_all_classes(all_classes, fmt)  # an option that would do nothing is refused
    spec = preprocess.model_spec(
        model,
        arch=model_option,
        num_classes=num_classes,
        weights=weights,
        classes=parse_class_names(classes) if classes else None,
        trust_checkpoint=trust_checkpoint,
        ema=ema,
        allow_untrained=allow_untrained,
    )
    options = EvalOptions(
        data=data if data is not None else _recorded_data(recorded_data, spec),
        split=split,
        run=run,
        tta=tta.value,
        topk=topk,
        strict=strict,
        out_dir=None if out is None else str(out),
        normalize=normalize,
        force=force,
        max_errors_shown=show_errors,
        stats_file=preprocess.stats,
        classes_file=classes if classes and os.path.isfile(classes) else None,
        notify=console.note,
    )
    if report_file(output) is not None:
        check_report_file(output, spec, options)  # before any work, not after it

    def render(result) -> tuple[list[Table], dict]:
        if fmt == "csv":  # per_class.csv's columns and plain numbers, with the overall rows
            tables = [Table(result.per_class_columns(), result.per_class_rows(with_summary=True))]
        else:
            tables = [summary_table(result), per_class_table(result, all_classes=all_classes)]
        return tables, result.to_dict()

    # An -o file is written before the new reports replace an old --out folder (ReportAtSwap).
    with ReportAtSwap(render, fmt=fmt, output=output, force=force) as report:
        # Under torchrun only rank 0 shows progress (it evaluates its share of the images).
        with progress_bar(
            "evaluating", refresh_in_thread=True, hidden=not is_main_process()
        ) as advance:
            result = evaluate(spec, options, progress=advance, before_keep=report.before_keep)
        if result is None:  # a torchrun rank other than 0: rank 0 reports
            return
        if result.written:
            console.note(
                f"wrote {len(result.written)} reports to {out} in {result.report_seconds:.2f} s"
            )
        report.after(result)


def _recorded_data(find, spec) -> str:
    data, note = find(spec)
    console.note(note)
    return data


def summary_table(result) -> Table:
    m = result.metrics
    rows = [("Accuracy (top-1)", m.accuracy)]
    if result.topk_accuracy is not None and result.topk > 1:  # none where k >= the classes
        rows.append((f"Top-{result.topk} accuracy", result.topk_accuracy))
    rows += [
        ("Precision (macro)", m.precision_macro),
        ("Recall (macro)", m.recall_macro),
        ("F1 (macro)", m.f1_macro),
        ("Precision (weighted)", m.precision_weighted),
        ("Recall (weighted)", m.recall_weighted),
        ("F1 (weighted)", m.f1_weighted),
        ("F1 (micro)", m.f1_micro),
        ("Balanced accuracy", m.balanced_accuracy),
        ("Loss", result.loss),
        ("Images", result.num_images),
        ("Skipped (unreadable)", len(result.skipped)),
        ("Images/s", format_rate(result.images_per_second)),
    ]
    if result.num_nonfinite:  # NaN or inf outputs: those predictions mean nothing
        rows.insert(-1, ("Non-finite outputs", result.num_nonfinite))
    if result.num_masked:  # a -inf true-class logit: left out of the loss, as train does
        after_loss = [name for name, _ in rows].index("Loss") + 1
        rows.insert(after_loss, ("Masked (not in loss)", result.num_masked))
    return Table(["Metric", "Value"], rows, title="Evaluation", align_right={"Value"})


def per_class_table(result, *, all_classes: bool = False) -> Table:
    """The per-class rows of the table format: every class with `all_classes`, else above
    COMPACT_TABLE_ABOVE classes those with images or predictions, at most MOST_CLASS_ROWS."""
    m = result.metrics
    rows = []
    compact = len(result.classes) > COMPACT_TABLE_ABOVE and not all_classes
    for label in range(len(result.classes)):
        if compact and m.support[label] == 0 and m.predicted[label] == 0:
            continue
        confused = " ".join(
            f"{result.shown_class(other)}:{count}" for other, count in result.confused_with(label)
        )
        rows.append(
            [
                result.shown_class(label),
                label,
                int(m.support[label]),
                float(m.precision[label]),
                float(m.recall[label]),
                float(m.f1[label]),
                confused,
            ]
        )
    title = "Per class (a precision or recall with nothing to divide by is 0)"
    note = None
    hidden = len(result.classes) - len(rows)
    if len(rows) > MOST_CLASS_ROWS and not all_classes:
        # The classes worth a look first: lowest F1, then the most images, then label order.
        rows = sorted(rows, key=lambda row: (row[5], -row[2], row[1]))[:MOST_CLASS_ROWS]
        hidden = len(result.classes) - len(rows)
        title = (
            f"Per class, the {len(rows)} with the lowest F1 (a precision or recall with nothing "
            "to divide by is 0)"
        )
        note = f"{hidden:,} of {len(result.classes):,} classes not shown: {SEE_ALL_CLASSES}"
    elif hidden:
        note = (
            f"{hidden:,} of {len(result.classes):,} classes, without images or predictions, not "
            f"shown: {SEE_ALL_CLASSES}"
        )
    return Table(
        ["Class", "Index", "Support", "Precision", "Recall", "F1", "Confused with"],
        rows,
        title=title,
        align_right={"Index", "Support", "Precision", "Recall", "F1"},
        note=note,
    )


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_command)
