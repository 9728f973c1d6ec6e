"""The tables `torchkit train` prints at the end: the run's summary, or the range test's."""

from __future__ import annotations

from torchkit.cli.render import Table


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


def summary_table(result) -> Table:
    """The end-of-run table (JSON gets `result.to_dict()`, with every epoch's metrics)."""
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
        (f"Best val top-{result.topk}{of_weights}", result.best_val_top5),
    ]
    if result.test_weights:
        weights = result.test_weights
        rows += [
            (f"Test top-1 ({weights})", result.test_top1),
            (f"Test top-{result.topk} ({weights})", result.test_top5),
            (f"Test loss ({weights})", result.test_loss),
        ]
        if result.test_ema_top1 is not None:
            rows.append((f"Test top-1, EMA weights ({weights})", result.test_ema_top1))
    rows += [
        ("Last train loss", result.last_train_loss),
        ("Train images/s", "" if result.images_per_s is None else f"{result.images_per_s:,.0f}"),
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
