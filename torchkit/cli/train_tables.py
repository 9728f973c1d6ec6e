"""The tables `torchkit train` prints at the end: the run's summary, or the range test's."""

from __future__ import annotations

from torchkit.cli.render import Table, format_rate, to_json_value


def lr_find_table(result) -> Table:
    """The range test's outcome."""
    suggested = (
        "none (the loss never fell)"
        if result.suggested_lr is None
        else (f"{result.suggested_lr:.3g}")
    )
    rows = [
        ("Suggested --lr", suggested),
        ("Steps", result.lr_find_iterations),
        ("Stopped on a diverging loss", result.lr_find_diverged),
        ("Files", f"{result.out_dir / 'lr_find.csv'}, {result.out_dir / 'lr_find.png'}"),
    ]
    return Table(["Learning-rate range test", "Value"], rows, title="Range test")


def csv_row_table(data: dict) -> Table:
    """`--format csv`: the JSON report's keys as the header and its plain values as one row
    (the nested history and config left out: they are metrics.csv and config.json)."""
    scalars = {key: to_json_value(value) for key, value in data.items()}
    scalars = {key: value for key, value in scalars.items() if not isinstance(value, dict | list)}
    return Table(list(scalars), [list(scalars.values())])


def summary_table(result) -> Table:
    """The end-of-run table for people (JSON gets `result.to_dict()`, with every epoch's
    metrics; CSV its plain values, `csv_row_table`)."""
    from torchkit.core.topk import topk_informative

    shows_topk = topk_informative(result.topk, result.num_classes)
    sizes = f"{result.train_size} train / {result.val_size} val"
    if result.test_size:
        sizes += f" / {result.test_size} test"
    best_by = result.best_metric + (", EMA weights" if result.best_by_ema else "")
    of_weights = " (EMA weights)" if result.best_by_ema else ""
    rows: list[tuple[str, object]] = [
        ("Model", result.model),
        ("Data", f"{result.data} ({sizes})"),
        ("Epochs", result.epochs),
        ("Best epoch", f"{result.best_epoch} (by val {best_by})"),
        (f"Best val top-1{of_weights}", result.best_val_top1),
    ]
    if shows_topk:
        rows.append((f"Best val top-{result.topk}{of_weights}", result.best_val_top5))
    if result.test_weights:
        weights = result.test_weights
        rows.append((f"Test top-1 ({weights})", result.test_top1))
        if shows_topk:
            rows.append((f"Test top-{result.topk} ({weights})", result.test_top5))
        rows.append((f"Test loss ({weights})", result.test_loss))
        if result.test_ema_top1 is not None:
            rows.append((f"Test top-1, EMA weights ({weights})", result.test_ema_top1))
    rows += [
        ("Last train loss", result.last_train_loss),
        ("Train images/s", format_rate(result.images_per_s)),
        ("Time", f"{result.total_seconds:.1f} s"),
    ]
    if result.skipped_images:
        rows.append(("Skipped (unreadable)", result.skipped_images))
    if result.stopped_early:
        rows.append(("Stopped early", True))
    if result.interrupted:
        rows.append(("Interrupted", True))
    rows.append(("Run folder", str(result.out_dir)))
    return Table(["Metric", "Value"], rows, title="Training", align_right={"Value"})
