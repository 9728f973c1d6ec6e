"""Running a classifier over a set of images and turning its outputs into `eval`'s results.

Inference is batched, under `torch.inference_mode()`, with optional flip test-time
augmentation, autocast and channels-last. Unreadable images are skipped and counted (or fatal
with `strict`). Under torchrun each process takes every world_size-th image, so the shards cover
the data exactly once, and the predictions are gathered on every rank; only rank 0 returns a
result and writes the reports.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from torchkit.core.data.batches import none_read
from torchkit.core.data.dataset import ShardSampler
from torchkit.core.data.decode import NormalizedPixels, model_input
from torchkit.core.data.image_files import strict_unreadable_error
from torchkit.core.data.preprocessing import image_mode
from torchkit.core.data.sources.inputs import data_inputs
from torchkit.core.data.sources.required import require_data
from torchkit.core.data.sources.samples import Samples
from torchkit.core.evaluate.metrics import NO_PREDICTION, compute_metrics, start_scorer
from torchkit.core.evaluate.reports import (
    CONFUSION_CORNER,
    CONFUSION_PAIRS_COLUMNS,
    REPORT_FILES,
)
from torchkit.core.evaluate.results import EvalResult, Predictions
from torchkit.core.evaluate.source import load_eval_samples
from torchkit.core.inference.options import (
    InferenceOptions,
    check_inference_options,
    check_torch_options_apply,
)
from torchkit.core.inference.scoring import TTA_MODES, score_batch
from torchkit.core.io.errors import InputError, OutputWriteError, UsageError, on_every_rank
from torchkit.core.io.file_outputs import check_output_file
from torchkit.core.io.folder_contents import proven
from torchkit.core.io.force import holds_json_record
from torchkit.core.io.output_proofs import any_of, csv_header, drawn_with, torchkit_png
from torchkit.core.io.outputs import OutputFolder
from torchkit.core.io.overlap import (
    InputPath,
    OutputOverlapError,
    check_not_protected,
    check_overlap,
)
from torchkit.core.io.progress import Progress
from torchkit.core.io.redaction import redact_url
from torchkit.core.io.special_files import is_special_file
from torchkit.core.models import ModelSpec, resolve_spec
from torchkit.core.models.image_size import trained_input
from torchkit.core.runtime.device import (
    amp_dtype_name,
    check_amp_dtype,
    resolve_amp_dtype,
    to_channels_last,
)
from torchkit.core.runtime.distributed import (
    DistContext,
    JoinedAfterForks,
    all_gather,
    place,
    teardown,
)
from torchkit.core.runtime.launch import is_main_process
from torchkit.core.runtime.plot_helper import PlotHelper, plot_helper
from torchkit.core.topk import DEFAULT_TOPK, ranked_classes

log = logging.getLogger("torchkit")

# What an eval --out folder may hold for --force to replace it when it has no `.torchkit`
# marker (written before the marker existed): the reports, and the temporary files of a
# report whose writing was killed.
KNOWN_FILES = (
    *REPORT_FILES,
    *(f".{name}.*.tmp" for name in REPORT_FILES),
    *(f".{Path(name).stem}.*.tmp{Path(name).suffix}" for name in REPORT_FILES),
)


@dataclass
class EvalOptions:
    """How to evaluate: the data, how the model runs and where the reports go."""

    data: str
    run: InferenceOptions = field(default_factory=InferenceOptions)
    split: str | None = None
    tta: str = "none"
    topk: int | None = None  # None: 5 (`core.topk`); predictions rank at most every class
    strict: bool = False
    out_dir: str | None = None
    normalize: bool = False
    force: bool = False
    max_errors_shown: int | None = None  # None: ERRORS_SHOWN
    # Files read by the caller that no output may replace: --stats (its mean and std come in
    # through ModelSpec) and a --classes file.
    stats_file: str | None = None
    classes_file: str | None = None
    notify: Callable[[str], None] | None = None  # notes about the data, for stderr


ERRORS_SHOWN = 25  # errors.png's mistakes without --show-errors


def check_report_options(options: EvalOptions) -> None:
    """--normalize and --show-errors shape the PNGs of --out: without it they would be
    accepted and do nothing."""
    if options.out_dir is not None:
        return
    given = [
        name
        for name, value in (
            ("--normalize", options.normalize),
            ("--show-errors", options.max_errors_shown is not None),
        )
        if value
    ]
    if given:
        raise UsageError(
            f"{' and '.join(given)} shape{'s' if len(given) == 1 else ''} the plots of --out, "
            "which is not given",
            "add --out DIR",
        )


def resolve_topk(topk: int | None, num_classes: int) -> int:
    if topk is None:
        return min(DEFAULT_TOPK, num_classes)
    if topk < 1:
        raise UsageError(f"--topk must be at least 1, not {topk}")
    # `core.topk`: the accuracy is 1 by definition, reported as null; but for the top-1
    # accuracy (k 1 of a 1-class model), which every output reports as it is
    if topk >= num_classes and topk > 1:
        log.warning(
            "--topk %d with %d classes: every class is in the top %d, so its accuracy is left "
            "out (null in JSON and CSV)",
            topk,
            num_classes,
            topk,
        )
    return min(topk, num_classes)


def predict(
    model,
    loader,
    device,
    *,
    k: int,
    tta: str = "none",
    amp: bool = False,
    amp_dtype=None,
    channels_last: bool = False,
    strict: bool = False,
    progress: Progress | None = None,
    normalized: NormalizedPixels | None = None,
    batches: Iterator | None = None,
    trained: tuple[int, ...] | None = None,
) -> tuple[Predictions, list[str], int]:
    """Run `model` over `loader` (batches from `collate_skipping_unreadable`).

    The probabilities are the logits' softmax; with flip TTA those of the image and its mirror
    are averaged (in log space, stably). Ranking uses the raw logits when there is no TTA, so
    the predicted class is exactly `logits.argmax()`. `amp_dtype` is the autocast dtype
    (default: bfloat16 on CPUs, float16 elsewhere). Returns the predictions (with, per image,
    whether all its outputs were finite), the unreadable images and the number of batches with
    a non-finite output; with `strict` it stops at the first unreadable image or the first
    batch with a non-finite output.
    Batches of 8-bit pixels are normalised on the device by `normalized`; batches of JPEG bytes
    (`--decode device`) are decoded there first. `batches`: the loader's iterator, when it
    was made before (its workers forked early), else the loader is iterated here.
    """
    import torch

    from torchkit.core.data.device_decode import decoded_batch

    total = len(loader.sampler) if hasattr(loader, "sampler") else 0
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    parts: dict[str, list] = {
        name: [] for name in ("indices", "labels", "top", "probs", "loss", "finite")
    }
    errors: list[str] = []
    nonfinite_batches = 0
    done = 0
    with torch.inference_mode():
        for batch in loader if batches is None else batches:
            batch = decoded_batch(batch, device)  # as it is unless it holds JPEG bytes
            errors.extend(batch.errors)
            done += len(batch.errors)
            if strict and errors:
                break
            if batch.images is not None:
                images = model_input(batch.images, device, normalized, memory_format)
                labels = batch.labels.to(device, non_blocking=True)
                scored = score_batch(
                    model,
                    images,
                    device,
                    tta=tta,
                    amp=amp,
                    amp_dtype=amp_dtype,
                    first=not parts["top"],
                    trained=trained,
                )
                finite, log_probs = scored.finite, scored.log_probs
                top = ranked_classes(scored.scores, k)
                parts["top"].append(top.cpu())
                parts["probs"].append(scored.probs.gather(1, top).cpu())
                parts["loss"].append(-log_probs.gather(1, labels[:, None]).squeeze(1).cpu())
                parts["indices"].append(batch.indices)
                parts["labels"].append(batch.labels)
                parts["finite"].append(finite)
                done += len(images)
                if not bool(finite.all()):
                    nonfinite_batches += 1
                    if strict:
                        break
            if progress is not None:
                progress(done, total)
    if not parts["indices"]:
        return Predictions.empty(k), errors, nonfinite_batches
    finite = torch.cat(parts["finite"]).numpy()
    topk_labels = torch.cat(parts["top"]).numpy()
    # NaN ranks first: the ranking of an image of non-finite outputs names no class the model
    # chose, so it predicts none (-1): a miss in every figure, in no class's predictions.
    topk_labels[~finite] = NO_PREDICTION
    return (
        Predictions(
            indices=torch.cat(parts["indices"]).numpy(),
            labels=torch.cat(parts["labels"]).numpy(),
            topk_labels=topk_labels,
            topk_probs=torch.cat(parts["probs"]).numpy(),
            loss=torch.cat(parts["loss"]).numpy(),
            finite=finite,
        ),
        errors,
        nonfinite_batches,
    )


def _gather(
    local: Predictions,
    errors: list[str],
    seconds: float,
    nonfinite_batches: int,
    k: int,
    ctx: DistContext,
) -> tuple[Predictions, list[str], float, int]:
    """All ranks' predictions, ordered by sample index, on every rank (with the unreadable
    images, the slowest rank's time and the batches with a non-finite output)."""
    if ctx.world_size == 1:
        return local, errors, seconds, nonfinite_batches
    gathered = all_gather(ctx, (local, errors, seconds, nonfinite_batches))
    merged = Predictions.concatenate([part[0] for part in gathered], k)
    if len(np.unique(merged.indices)) != len(merged):
        raise RuntimeError("an image was evaluated by two ranks")  # ShardSampler's invariant
    all_errors = [error for part in gathered for error in part[1]]
    return (
        merged,
        all_errors,
        max(part[2] for part in gathered),
        sum(part[3] for part in gathered),
    )


def eval_inputs(spec: ModelSpec, options: EvalOptions) -> list[InputPath]:
    """Everything eval reads, which no output may be, contain or lie inside: the checkpoint or
    weights file, the data (folder, or CSV index and the folders of its images), --stats and a
    --classes file. A missing checkpoint or data is said here, before any output is looked at."""
    from torchkit.core.models import model_inputs, require_model_files

    require_model_files(spec.model, spec.weights)
    if options.data is not None:
        require_data(options.data)
    inputs = [
        InputPath.of(path, what)
        for path, what in (
            (spec.model, "checkpoint"),
            (spec.weights, "--weights file"),
            (options.stats_file, "stats file"),
            (options.classes_file, "classes file"),
        )
        if path and os.path.exists(path)
    ]
    # The source of a package.module:Callable, as MODEL or as --model (`FILE --model NAME`).
    for name in (spec.model, spec.arch):
        if name and not os.path.exists(name):  # a file is in `inputs` already
            inputs += model_inputs(name)
    return inputs + data_inputs(options.data)


def check_report_file(output: str | os.PathLike, spec: ModelSpec, options: EvalOptions) -> None:
    """`-o FILE`, before any work: not an input nor inside an input folder, not an existing
    file without --force, and not inside --out (which is replaced as a whole)."""
    target = check_output_file(output, options.force, eval_inputs(spec, options))
    if options.out_dir is None or is_special_file(target):
        return
    real_target = Path(os.path.realpath(target))
    real_out = Path(os.path.realpath(options.out_dir))
    if real_target == real_out or real_out in real_target.parents:
        where = "is" if real_target == real_out else "lies inside"
        raise OutputOverlapError(
            f"output {output} {where} the --out folder {options.out_dir}",
            "write it elsewhere: --out already holds metrics.json",
        )


# The keys of the metrics.json of every eval --out, old or new.
METRICS_KEYS = ("num_images", "num_skipped", "accuracy", "topk_accuracy")


def _is_eval_metrics(path: Path) -> bool:
    return holds_json_record(path, METRICS_KEYS)


# per_class.csv and predictions.csv: the header this version writes, or the one earlier
# versions wrote (before their columns were renamed): a re-run over an earlier eval's folder.
_PREDICTIONS_CSV = any_of(
    csv_header(("path", "label", "label_index", "class"), whole=False),
    csv_header(("path", "true_label", "true_class", "predicted_label"), whole=False),
)
# An eval's plot: its Software text, or (drawn before it) Matplotlib's written with the record
# or predictions.csv: the plots follow predictions.csv, which follows metrics.json (a
# predictions.csv of millions of rows puts minutes between the record and the plots).
_is_eval_plot = any_of(
    torchkit_png(),
    drawn_with({"metrics.json": _is_eval_metrics, "predictions.csv": _PREDICTIONS_CSV}),
)


# What eval writes into --out (`folder_contents` patterns), each only where its content shows
# eval wrote it (another tool's metrics.json or predictions.csv, your own confusion_matrix.png
# is yours: `ProvenPattern`): the record's keys, the CSVs' headers, the plots' Software text.
_REPORT_PROOFS = {
    "metrics.json": _is_eval_metrics,
    "per_class.csv": any_of(
        csv_header(("label", "index", "support", "predicted"), whole=False),
        csv_header(("Class", "Label", "# occurrence", "Precision"), whole=False),
    ),
    "confusion_matrix.csv": csv_header((CONFUSION_CORNER,), whole=False),
    "confusion_pairs.csv": csv_header(CONFUSION_PAIRS_COLUMNS),
    "predictions.csv": _PREDICTIONS_CSV,
    "confusion_matrix.png": _is_eval_plot,
    "errors.png": _is_eval_plot,
}
OWNED_REPORTS = tuple(proven(name, _REPORT_PROOFS[name]) for name in REPORT_FILES)


def _old_report_files(out: Path) -> tuple[str, ...]:
    """KNOWN_FILES where `out` holds an eval's metrics.json, else nothing: a folder without the
    marker is an earlier report only by its record, never by a name another tool uses too."""
    return KNOWN_FILES if holds_json_record(out / "metrics.json", METRICS_KEYS) else ()


def open_report_folder(spec: ModelSpec, options: EvalOptions) -> OutputFolder | None:
    """--out, checked and locked before the model and the data are read (None on torchrun
    ranks other than 0, which only check: rank 0 writes the reports)."""
    inputs = eval_inputs(spec, options)
    if not is_main_process():
        check_not_protected(options.out_dir, "output folder")
        check_overlap(options.out_dir, "output folder", inputs)
        return None
    return OutputFolder(
        options.out_dir,
        command="eval",
        force=options.force,
        inputs=inputs,
        known_files=_old_report_files(Path(options.out_dir)),
        owned=OWNED_REPORTS,  # a folder holding anything else is refused, not deleted with it
        # The reports are written into a hidden folder that replaces --out at the end: an old
        # report stays whole until the new one is complete, and a failed run leaves no trace.
        atomic=True,
    )


def evaluate(
    spec: ModelSpec,
    options: EvalOptions,
    progress: Progress | None = None,
    before_keep: Callable[[EvalResult], None] | None = None,
) -> EvalResult | None:
    """Evaluate a classifier on a labelled image set; write the reports when `out_dir` is set.

    Returns the result on rank 0 (or in a single process) and None on the other ranks. The
    output folder is checked (and locked) before any work; an old one is replaced only once
    the new reports are all written. `before_keep(result)` runs (with `out_dir`) once they
    are, before the new folder replaces the old one: if it raises (the caller's `-o` report
    did not fit on its disk), the old folder stays.
    """
    if options.tta not in TTA_MODES:
        raise UsageError(f"unknown --tta {options.tta!r}", "use none or flip")
    check_report_options(options)
    check_inference_options(options.run)
    check_amp_dtype(options.run.amp, options.run.amp_dtype)
    # scikit-learn imports in a helper process beside the model and data loading (rank 0 only:
    # the others compute no metrics), instead of after the images are scored.
    main = is_main_process()
    plots = main and options.out_dir is not None
    scorer = start_scorer(plots=plots) if main else None
    try:
        # Likewise matplotlib for the PNGs of --out: in the scorer's process where it serves
        # them, else in a helper of its own.
        shared = PlotHelper.sharing(scorer)
        with plot_helper(plots and shared is None) as own:
            painter = shared or own
            folder = open_report_folder(spec, options) if options.out_dir is not None else None
            with folder if folder is not None else contextlib.nullcontext():
                return _evaluate(spec, options, progress, folder, scorer, painter, before_keep)
    finally:
        if scorer is not None:
            scorer.close()


def _evaluate(
    spec: ModelSpec,
    options: EvalOptions,
    progress: Progress | None,
    folder: OutputFolder | None,
    scorer: Any = None,
    painter: PlotHelper | None = None,
    before_keep: Callable[[EvalResult], None] | None = None,
) -> EvalResult | None:
    # The process group is joined once the loader's workers are forked (`JoinedAfterForks`).
    ctx = place(options.run.device)
    previous_level = log.level
    if not ctx.is_main:
        log.setLevel(logging.ERROR)  # only rank 0 warns
    ok = False
    try:
        with JoinedAfterForks(ctx) as join:
            run = _run(spec, options, ctx, progress, scorer, join)
        ok = True
    finally:
        log.setLevel(previous_level)
        teardown(ctx, wait=ok)
    if run is None:
        return None
    result, errors = run
    if errors:
        log.warning(
            "skipped %d unreadable image(s) (first: %s); --strict makes this an error",
            len(errors),
            errors[0],
        )
    if result.nonfinite_batches:
        log.warning(
            "%s (%s)",
            _nonfinite_message(
                result.predictions, result.samples, result.nonfinite_batches, whole=True
            ),
            _nonfinite_hint(result.info["amp_dtype"], strict=False),
        )
    masked = np.flatnonzero(result.predictions.masked)
    if len(masked):  # train's warning of the same images (`core.inference.masked_loss`)
        first = _sample_name(result.predictions, result.samples, masked[0])
        measured = result.predictions.mean_loss()
        log.warning(
            "%s", measured.masked_warning(counted=f"; num_masked counts them; first: {first}")
        )
    if folder is not None:
        from torchkit.core.evaluate.reports import write_reports

        start = time.perf_counter()
        try:
            written = write_reports(
                result,
                folder.begin(),
                normalize=options.normalize,
                max_errors_shown=(
                    ERRORS_SHOWN if options.max_errors_shown is None else options.max_errors_shown
                ),
                painter=painter,
            )
        except OutputWriteError as error:  # name --out, not the hidden folder it fills
            raise OutputWriteError(
                error.message.replace(str(folder.path), str(folder.final)), error.hint
            ) from error
        if before_keep is not None:
            before_keep(result)  # raising: `folder`'s exit puts the old folder back
        folder.keep()  # the new reports replace the old folder
        result.written = [str(folder.final / path.name) for path in written]
        result.report_seconds = time.perf_counter() - start
    return result


def _run(
    spec: ModelSpec,
    options: EvalOptions,
    ctx: DistContext,
    progress: Progress | None,
    scorer: Any = None,
    join: Callable[[], None] | None = None,
) -> tuple[EvalResult, list[str]] | None:
    """The images scored on this rank and gathered on rank 0; `join` joins the process group
    once the loader's workers are forked."""
    from torchkit.core.data.dataset import stop_workers

    setup, batches = _model_and_loader(spec, options, ctx)
    try:
        if join is not None:
            join()  # Gloo's threads start: after the forks
        model = _model_on_device(setup, options, ctx)
        start = time.perf_counter()
        local, errors, nonfinite_batches = _score_here(
            setup, model, batches, options, ctx, progress
        )
    finally:
        # The workers stop now, also after a failed join, an error of the model or a stop:
        # not whenever the traceback that holds this frame (and `predict`'s, which holds the
        # iterator too) is collected, whose join of them then waited torch's 5 s for each.
        stop_workers(batches)
        del batches
    seconds = time.perf_counter() - start
    predictions, errors, seconds, nonfinite_batches = _gather(
        local, errors, seconds, nonfinite_batches, setup.k, ctx
    )
    samples = setup.data.samples
    info_amp_dtype = None if setup.amp_dtype is None else amp_dtype_name(setup.amp_dtype)
    # Counted over every rank's gathered outputs: the same error on each, rank 0 reports it.
    if errors and options.strict:
        raise on_every_rank(strict_unreadable_error(errors[0]))
    if nonfinite_batches and options.strict:
        raise on_every_rank(
            InputError(
                _nonfinite_message(predictions, samples, nonfinite_batches),
                _nonfinite_hint(info_amp_dtype, strict=True),
            )
        )
    if not ctx.is_main:
        return None
    if len(predictions) == 0:
        first = f"the first, {errors[0]}" if errors else None
        raise none_read(len(samples), redact_url(options.data), first)  # not the cache folder
    metrics = compute_metrics(
        predictions.labels,
        predictions.predicted,
        predictions.topk_labels,
        setup.num_classes,
        setup.k,
        scorer=scorer,
    )
    result = EvalResult(
        classes=setup.classes,
        metrics=metrics,
        predictions=predictions,
        samples=samples,
        loss=predictions.mean_loss().loss,
        skipped=errors,
        seconds=seconds,
        info=_run_info(spec, options, setup, ctx, info_amp_dtype),
        nonfinite_batches=nonfinite_batches,
        topk=options.topk or DEFAULT_TOPK,
    )
    return result, errors


@dataclass
class _EvalSetup:
    """What `_model_and_loader` resolved: the model, the data and how they are run."""

    resolved: Any  # the resolved model spec (core.models.resolve_spec)
    data: Any  # the data read (core.evaluate.source.load_eval_samples)
    classes: list[str]
    num_classes: int
    k: int  # the top-k scored
    amp_dtype: Any  # the autocast dtype, None without --amp
    workers: int
    loader: Any


def _model_and_loader(spec: ModelSpec, options: EvalOptions, ctx: DistContext) -> tuple:
    """(the model and data resolved, the loader's batches): the loader's workers are forked
    before any thread of the command exists: the model is loaded and the data read on one
    thread (`until_workers_forked`), moved to its device and run on the command's threads once
    the workers are started."""
    import torch

    from torchkit.core.data.batches import collate_skipping_unreadable
    from torchkit.core.data.dataset import inference_dataset, inference_workers, worker_options
    from torchkit.core.data.device_decode import collate_encoded
    from torchkit.core.runtime.threads import until_workers_forked

    device = ctx.device
    with until_workers_forked():
        resolved = resolve_spec(spec, command="eval", exported="runtime", predicting=True)
        check_torch_options_apply(options.run, resolved.exported_format)
        recorded = resolved.data_record
        data = load_eval_samples(
            options.data, split=options.split, classes=resolved.classes, recorded=recorded
        )
        samples = data.samples
        if ctx.is_main and options.notify is not None:
            for note in data.notes:
                options.notify(note)
        classes = list(resolved.classes or samples.classes)
        num_classes = resolved.num_outputs or len(classes)
        if len(classes) != num_classes:
            raise UsageError(
                f"the model has {num_classes} outputs but the data has {len(classes)} classes "
                f"({', '.join(classes[:5])}{' ...' if len(classes) > 5 else ''})",
                "pass --classes with the model's class names in label order",
            )
        preprocess = resolved.preprocess
        mode = image_mode(preprocess.in_channels)
        k = resolve_topk(options.topk, num_classes)
        amp_dtype = resolve_amp_dtype(options.run.amp_dtype, device) if options.run.amp else None
        # --decode device: JPEGs reach the batch as their bytes, decoded on the device
        collate = collate_encoded if options.run.decode == "device" else collate_skipping_unreadable
        dataset = inference_dataset(samples, preprocess, mode=mode, decode=options.run.decode)
        workers = inference_workers(samples, options.run.workers)
        loader = torch.utils.data.DataLoader(
            dataset,
            batch_size=options.run.batch_size,
            sampler=ShardSampler(len(samples), ctx.rank, ctx.world_size),
            num_workers=workers,
            collate_fn=collate,
            pin_memory=device.type == "cuda",
            **worker_options(workers),
        )
        batches = iter(loader)  # the workers are forked here
    setup = _EvalSetup(resolved, data, classes, num_classes, k, amp_dtype, workers, loader)
    return setup, batches


def _model_on_device(setup: _EvalSetup, options: EvalOptions, ctx: DistContext) -> Any:
    """The model in eval mode on its device (in channels-last memory with --channels-last)."""
    device, resolved, samples = ctx.device, setup.resolved, setup.data.samples
    model = resolved.model
    model.eval()
    model.to(device)
    if options.run.channels_last:
        to_channels_last(model)
    log.info(
        "evaluating %d images of %s with %s on %s",
        len(samples),
        samples.source,
        resolved.arch,
        device,
    )
    return model


def _score_here(
    setup: _EvalSetup,
    model: Any,
    batches: Iterator,
    options: EvalOptions,
    ctx: DistContext,
    progress: Progress | None,
) -> tuple[Predictions, list[str], int]:
    """This rank's images scored: `predict`'s outputs."""
    from torchkit.core.runtime.threads import compute_threads, torch_threads

    samples, preprocess = setup.data.samples, setup.resolved.preprocess
    with torch_threads(compute_threads(setup.workers, tiny_inputs=samples.images is not None)):
        return predict(
            model,
            setup.loader,
            ctx.device,
            k=setup.k,
            tta=options.tta,
            amp=options.run.amp,
            amp_dtype=setup.amp_dtype,
            channels_last=options.run.channels_last,
            strict=options.strict,
            progress=progress if ctx.is_main else None,
            normalized=NormalizedPixels(preprocess.mean, preprocess.std),
            batches=batches,
            trained=trained_input(setup.resolved),
        )


def _run_info(
    spec: ModelSpec,
    options: EvalOptions,
    setup: _EvalSetup,
    ctx: DistContext,
    info_amp_dtype: str | None,
) -> dict[str, Any]:
    """The run's record in metrics.json: the model, the data and the settings."""
    resolved, data = setup.resolved, setup.data
    return {
        "checkpoint": spec.model or spec.weights,
        "arch": resolved.arch,
        "model_source": resolved.weights_source or resolved.source,
        **resolved.details,
        "data": redact_url(options.data),
        "split": data.split,
        "root": data.root,
        "device": str(ctx.device),
        "world_size": ctx.world_size,
        "batch_size": options.run.batch_size,
        "tta": options.tta,
        "amp": options.run.amp,
        "amp_dtype": info_amp_dtype,
        "ema": spec.ema,
        "preprocess": resolved.preprocess.to_dict(),
    }


def _nonfinite_message(
    predictions: Predictions, samples: Samples, batches: int, *, whole: bool = False
) -> str:
    """Which images got a NaN or inf output: how many (`whole`: of how many evaluated), in how
    many batches, and the first of them."""
    bad = np.flatnonzero(~predictions.finite)
    name = _sample_name(predictions, samples, bad[0] if len(bad) else None)
    of = f" of {len(predictions)}" if whole else ""
    return (
        f"the model's outputs are not finite (NaN or inf) for {len(bad)}{of} image(s) in "
        f"{batches} batch(es) (first: {name})"
    )


def _sample_name(predictions: Predictions, samples: Samples, row: int | None) -> str:
    """How the warnings name the image of a row of `predictions` (None: the first sample)."""
    first = int(predictions.indices[row]) if row is not None else 0
    if samples.paths is not None:
        return samples.paths[first]
    return samples.ids[first] if samples.ids else str(first)


def _nonfinite_hint(amp_dtype: str | None, *, strict: bool) -> str:
    """`amp_dtype`: the autocast dtype's name (bf16, fp16), None without --amp."""
    hint = "check whether the weights come from a diverged training run"
    if amp_dtype == "fp16":
        hint += ", or use --amp-dtype bf16 or drop --amp: float16 overflows past 65504"
    if strict:
        return hint + "; without --strict they are counted and reported"
    return hint + "; their predictions and loss mean nothing, and --strict makes this an error"
