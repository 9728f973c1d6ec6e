"""`extract-features`: the features of named layers for every image of a folder or CSV index."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from torchkit import __version__
from torchkit.core.data.batches import none_read
from torchkit.core.data.decode import NormalizedPixels, model_input
from torchkit.core.data.image_files import (
    UNREADABLE_WARNINGS,
    image_path,
    strict_unreadable_error,
)
from torchkit.core.data.preprocessing import Preprocess, image_mode
from torchkit.core.data.sources.digits import DIGITS
from torchkit.core.data.sources.inputs import data_inputs, listed_check, listed_inputs
from torchkit.core.data.sources.samples import Samples, shown_class_names
from torchkit.core.features.layers import (
    NORMALIZATIONS,
    POOLS,
    FeatureExtractor,
    LayerGraph,
    LayerInfo,
    reduce_feature,
)
from torchkit.core.features.store import (
    DTYPES,
    ERRORS_FILE,
    FILE_FORMATS,
    INDEX_FILE,
    META_FILE,
    PARTIAL_DIR,
    PROGRESS_FILE,
    FeatureStore,
    data_location,
    is_recorded_array,
    known_files,
)
from torchkit.core.inference.options import InferenceOptions, check_inference_options
from torchkit.core.inference.scoring import scorable_rows
from torchkit.core.io.errors import InputError, UsageError
from torchkit.core.io.files import NAME_ERRORS, open_text, require_input
from torchkit.core.io.folder_contents import proven
from torchkit.core.io.force import (
    force_hint,
    holds_json_record,
    is_empty_dir,
)
from torchkit.core.io.output_proofs import (
    any_of,
    csv_header,
    empty_file,
    is_npy,
    is_safetensors,
    is_torch_save,
)
from torchkit.core.io.outputs import OutputFolder
from torchkit.core.io.overlap import InputPath
from torchkit.core.io.progress import Progress
from torchkit.core.io.records import open_regular_file
from torchkit.core.io.redaction import redact_url
from torchkit.core.models import ModelSpec, require_model_files, resolve_spec
from torchkit.core.models.image_size import first_batch_error, trained_input
from torchkit.core.predict.inputs import (
    STDIN,
    ImageSet,
    LoaderPass,
    collect_images,
    streamed_images,
)
from torchkit.core.runtime.device import check_amp_dtype
from torchkit.core.runtime.distributed import launched_by_torchrun
from torchkit.core.runtime.signals import signals_held

logger = logging.getLogger("torchkit")

DEFAULT_LAYERS = ("penultimate",)
# How often the progress record is saved: a killed run redoes at most this much work, and fast
# GPU runs do not wait on an fsync per batch. Ctrl-C and errors save it at once.
COMMIT_INTERVAL_S = 2.0


@dataclass
class FeatureRequest:
    """Everything `torchkit extract-features` is asked to do, and how it runs the model (`run`)."""

    # MODEL, --weights, --ema, --trust-checkpoint, the preprocessing options, --seed as the
    # random weights' `build_seed` and --allow-untrained (features of random weights, refused by
    # default: noise); `spec.stats` is the --stats file, which OUT may not replace.
    spec: ModelSpec
    images: str
    out: str
    run: InferenceOptions = field(default_factory=InferenceOptions)
    layers: list[str] = field(default_factory=lambda: list(DEFAULT_LAYERS))
    pool: str | None = None  # None: avg for 4-D maps
    flatten: bool = False
    normalize: str | None = None
    dtype: str = "float32"
    file_format: str = "npy"
    strict: bool = False
    resume: bool = False
    force: bool = False
    split: str | None = None  # of split data: one split (default: all, with a split column)
    root: str = ""  # set from the data: what index.csv's paths are relative to


@dataclass
class LayerOutput:
    name: str
    node: str
    file: Path
    shape: list[int]  # (rows, ...) as stored
    dtype: str


@dataclass
class ExtractionResult:
    out: Path
    num_images: int
    num_rows: int
    skipped: list[tuple[str, str]]  # (image, why)
    layers: list[LayerOutput]
    resumed_from: int = 0  # images already done when this run started
    already_complete: bool = False
    seconds: float = 0.0
    num_nonfinite: int = 0  # rows with a NaN or inf feature (their values mean nothing)

    @property
    def images_per_second(self) -> float:
        processed = self.num_images - self.resumed_from
        return processed / self.seconds if self.seconds > 0 else 0.0


@dataclass
class LayerListing:
    arch: str
    image_size: int
    traced: bool
    layers: list[LayerInfo]


def list_layers(
    model: str,
    *,
    weights: str | None = None,
    ema: bool = False,
    trust_checkpoint: bool = False,
    image_size: int | None = None,
    image_channels: int | None = None,
) -> LayerListing:
    """The layer names of MODEL (and the aliases), with per-image output shapes."""
    spec = ModelSpec(
        model=model,
        weights=weights,
        ema=ema,
        trust_checkpoint=trust_checkpoint,
        image_size=image_size,
        image_channels=image_channels,
    )
    source = resolve_spec(spec, command="extract-features")
    preprocess = source.preprocess
    graph = LayerGraph(source.model, arch=source.arch)
    rows = graph.describe(preprocess.image_size, preprocess.in_channels)
    return LayerListing(source.arch, preprocess.image_size, graph.traced, rows)


def feature_inputs(request: FeatureRequest, listed: Sequence[str] = ()) -> list[InputPath]:
    """Everything the run reads, which OUT may not be, contain or lie inside: the model or
    weights file, IMAGES (folder, or CSV index and the folders of its images; for `-`, the
    files `listed` on stdin, which OUT may lie beside), --stats."""
    inputs = [
        InputPath.of(path, what)
        for path, what in (
            (request.spec.model, "model file"),
            (request.spec.weights, "--weights file"),
            (request.spec.stats, "stats file"),
        )
        if path and os.path.isfile(path)  # MODEL may also be a name: `convnet`, `resnet18`
    ]
    if str(request.images) == STDIN:
        return inputs + listed_inputs(listed)
    return inputs + data_inputs(request.images, "IMAGES")


def open_output(request: FeatureRequest, listed: Sequence[str] = ()) -> OutputFolder:
    """OUT, checked and locked before any work: --resume continues it in place (when it holds
    something), --force replaces only an earlier extract-features OUT, anything else needs a
    new or empty folder."""
    if request.resume and request.force:
        raise UsageError(
            "--resume and --force contradict each other",
            "--resume continues OUT, --force starts it over",
        )
    out = Path(request.out)
    has_content = out.is_dir() and not out.is_symlink() and any(out.iterdir())

    recorded = known_files(out) if out.is_dir() else ()  # by OUT's own records, read once
    owned = output_names(recorded)  # anything else in OUT is refused, not deleted with it

    def exists_hint() -> str:  # judged once a killed run's leftovers are cleaned up
        if not (out / PARTIAL_DIR).is_dir():
            return ""
        # A file of the user's in OUT (or another command's output): --force refuses it too.
        refused = _force_hint(out, "", recorded)
        if str(request.images) == STDIN:  # --resume with - is refused: stdin cannot be read again
            return "it holds an interrupted extraction, which a list piped on stdin cannot " + (
                f"continue; {refused}" if refused else "continue: pass --force to start over"
            )
        return "it holds an interrupted extraction: pass --resume to continue it" + (
            f"; {refused}" if refused else ", or --force to start over"
        )

    return OutputFolder(
        out,
        command="extract-features",
        force=request.force,
        inputs=feature_inputs(request, listed),
        known_files=recorded,
        owned=owned,
        resume=request.resume and has_content,
        exists_hint=exists_hint,
        # --resume removes OUT/.partial (an interrupted run's rows, started over or moved into
        # OUT at the end): refused where it holds a file the run did not write there.
        resume_removes=(PARTIAL_DIR,),
    )


def _force_hint(out: Path, default: str, recorded: Sequence[str], *, subject: str = "it") -> str:
    """`force_hint` of OUT as `OutputFolder` judges it for extract-features (`recorded`:
    `known_files(OUT)`): `default`, or what stops --force too (a file of yours in OUT)."""
    return force_hint(
        out,
        default,
        known_files=recorded,
        command="extract-features",
        owned=output_names(recorded),
        subject=subject,
    )


def output_names(recorded: Sequence[str]) -> tuple[str, ...]:
    """What a run writes into OUT (`folder_contents` patterns): index.csv, meta.json, an
    interrupted run's `.partial` folder and the layers' files, those its records name where it
    has one (`recorded`: `known_files(OUT)`), else any file of FILE_FORMATS."""
    layers = [n for n in recorded if not n.startswith(".") and n not in (INDEX_FILE, META_FILE)]
    if not recorded:
        layers = [f"*.{extension}" for extension in FILE_FORMATS]
    # Each file only where its content shows a run wrote it (your own index.csv or an array of
    # yours under a layer's name is refused): the index's header, the record's fingerprint, the
    # format of the layer file's extension; in an interrupted run's `.partial` folder likewise
    # (its files empty where a run was stopped as it made them: nothing in them to lose).
    return (
        proven(INDEX_FILE, csv_header(INDEX_COLUMNS, whole=False)),
        proven(META_FILE, lambda path: holds_json_record(path, ("fingerprint", "layers"))),
        *_partial_names(),
        *(_proven_layer(name) for name in layers),
    )


def _partial_names() -> tuple[str, ...]:
    """What an interrupted run keeps in OUT/.partial (`FeatureStore`): its progress record, the
    log of unreadable images, a streamed run's index, an array a layer (one its record names,
    of the layer's dtype and row shape: any .npy of yours there is refused)."""
    return (
        proven(
            f"{PARTIAL_DIR}/{PROGRESS_FILE}",
            lambda path: holds_json_record(path, ("fingerprint", "done", "rows")),
        ),
        proven(f"{PARTIAL_DIR}/{ERRORS_FILE}", any_of(empty_file, _is_errors_log)),
        proven(
            f"{PARTIAL_DIR}/{INDEX_FILE}",
            any_of(empty_file, csv_header(INDEX_COLUMNS, whole=False)),
        ),
        proven(f"{PARTIAL_DIR}/*.npy", any_of(empty_file, is_recorded_array)),
    )


def _is_errors_log(path: Path) -> bool:
    """Whether `path` begins as ERRORS_FILE does: a line `[image index, "why"]`."""
    try:
        with open_regular_file(path) as handle:
            first = json.loads(handle.readline(1 << 16))
    except (OSError, ValueError):
        return False
    return (
        isinstance(first, list)
        and len(first) == 2
        and type(first[0]) is int
        and isinstance(first[1], str)
    )


_LAYER_PROOFS = {"npy": is_npy, "pt": is_torch_save, "safetensors": is_safetensors}


def _proven_layer(pattern: str) -> str:
    """A layer file's pattern, proven by its format (`FILE_FORMATS`); another name as it is."""
    proof = _LAYER_PROOFS.get(pattern.rsplit(".", 1)[-1])
    return pattern if proof is None else proven(pattern, proof)


def extract_features(
    request: FeatureRequest,
    *,
    progress: Progress | None = None,
    stdin: Iterable[str] | None = None,
) -> ExtractionResult:
    """Run the model over every image once, keeping the requested layers; write OUT.

    `progress(done, total)` is called as images are processed (first with the images a resumed
    run had already done). OUT is checked and locked before the model or the images are read;
    a run that stops before its first rows are written leaves an old OUT as it was. IMAGES is
    read as predict reads it (`collect_images`): `digits`, and `-` for paths on `stdin`, read
    as they come (rows are written batch by batch while the list is still piped; memory does not
    grow with it). stdin cannot be read again, so `-` is never resumed.
    """
    _validate(request)
    from torchkit.core.data.sources.http_shards import is_url
    from torchkit.core.data.sources.shards import is_shard_pattern

    # The inputs before OUT: a missing one is not reported as an OUT that "already exists".
    require_model_files(request.spec.model, request.spec.weights)
    images = str(request.images)
    # A URL or a shard pattern names no file: its reader says what is missing.
    if images not in (DIGITS, STDIN) and not is_url(images) and not is_shard_pattern(images):
        require_input(images, what="IMAGES")
    if images == STDIN:
        if request.resume:
            # Without --resume, an OUT holding a run is refused as "already exists".
            out = Path(request.out)
            try:
                holds_a_run = out.is_dir() and not is_empty_dir(out)
            except OSError:  # unreadable: what it holds is told by the run without --resume
                holds_a_run = False
            again = (
                "pass --force in place of --resume to start it over"
                if holds_a_run
                else "run it again without --resume"
            )
            again += ", or save the list as a CSV index and give that"
            if holds_a_run:  # where --force would be refused too: what to do instead
                again = _force_hint(out, again, known_files(out), subject=f"OUT {out}")
            raise UsageError(
                "--resume cannot continue a list piped on stdin (-): it cannot be read again",
                again,
            )
        streamed = streamed_images(stdin, request.split)
        # The first paths checked before OUT is opened, the others as they are read.
        first = streamed.stream.take(request.run.batch_size)  # type: ignore[union-attr]
        with open_output(request, first) as output:
            return _extract(request, output, progress, (streamed, first))
    with open_output(request) as output:
        return _extract(request, output, progress)


def _extract(
    request: FeatureRequest,
    output: OutputFolder,
    progress: Progress | None,
    streamed: tuple[ImageSet, list[str]] | None = None,
) -> ExtractionResult:
    """`streamed`: the paths on stdin still to come, and the first of them (read already)."""

    from torchkit.core.data.dataset import inference_workers
    from torchkit.core.runtime.device import amp_dtype_name, resolve_amp_dtype, select_device
    from torchkit.core.runtime.threads import (
        compute_threads,
        torch_threads,
        until_workers_forked,
    )

    # A randomly initialised model (no --weights) is drawn from --seed, the same again when a
    # run resumes (resolve_spec leaves the caller's RNG state as it was). On one thread: the
    # model is built and loaded starting no OpenMP thread before the loader's workers are
    # forked (below).
    with until_workers_forked():
        source = resolve_spec(request.spec, command="extract-features", needs_training=True)
    # Every split at once (a `split` column tells them apart), unless --split picks one.
    recorded = source.data_record  # a held-out val
    if streamed is None:
        image_set = collect_images([request.images], split=request.split, recorded=recorded)
    else:
        image_set = streamed[0]
    samples = image_set.samples
    for note in image_set.notes:
        logger.info("%s", note)
    request.root = image_set.root
    preprocess = source.preprocess
    mode = image_mode(preprocess.in_channels)  # before any output is made
    with until_workers_forked():  # torch.fx traces the model
        graph = LayerGraph(source.model, arch=source.arch)
        layers = graph.resolve(
            list(request.layers) or list(DEFAULT_LAYERS),
            named=request.spec.model,
            options=_listing_options(request),
        )
    device = select_device(request.run.device)
    amp_dtype = resolve_amp_dtype(request.run.amp_dtype, device) if request.run.amp else None
    settings = {
        "model": request.spec.model,
        "arch": source.arch,
        "weights": request.spec.weights,
        "ema": request.spec.ema,
        "layers": [{"name": layer.name, "node": layer.node} for layer in layers],
        "pool": request.pool or "avg",
        "flatten": request.flatten,
        "normalize": request.normalize,
        "dtype": request.dtype,
        "format": request.file_format,
        "amp": request.run.amp,
        "amp_dtype": None if amp_dtype is None else amp_dtype_name(amp_dtype),
        "seed": request.spec.build_seed,
        "preprocess": preprocess.to_dict(),
        # Other pixels: a store is resumed only with the decode it was started with (named only
        # for `device`, so the fingerprints of stores made before the option are unchanged).
        **({"decode": request.run.decode} if request.run.decode != "exact" else {}),
    }
    with until_workers_forked():
        extractor = FeatureExtractor(graph, layers)  # moved to the device once they are
        extractor.trained = trained_input(source)  # named where it fails at another size
    store = None
    try:
        growing = None  # streamed: the fingerprint, as the paths come
        weights = weights_digest(source.model)
        if streamed is None:
            fingerprint = _fingerprint(settings, samples)
            data = data_location(image_set.root)
            store, finished = FeatureStore.open(output, fingerprint, len(samples), data, weights)
            if store is None:
                return _result_from_meta(Path(request.out), finished)
        else:
            store = FeatureStore.open_streamed(output, weights)
            growing = Fingerprint(settings)
        resumed_from = store.progress.done
        started = time.perf_counter()
        # 8-bit crops normalised on the device; JPEG bytes decoded there with --decode device
        later = listed_check(output.final, output.what) if streamed else None
        loader = _loader(image_set, preprocess, mode, request, device, streamed, later)
        # The loader's workers are forked first, before the model is moved or run (which may
        # start threads beside them: OpenMP's, a GPU driver's).
        with until_workers_forked():
            batches = loader(store.progress.done)
            next(batches)  # its first yield: the workers are forked
        normalized = NormalizedPixels(preprocess.mean, preprocess.std)
        workers = inference_workers(samples, request.run.workers)  # as _loader's
        streamed_skipped: list[tuple[str, str]] = []  # streamed: its errors are not kept
        try:
            with torch_threads(compute_threads(workers, tiny_inputs=samples.images is not None)):
                extractor.to(device, channels_last=request.run.channels_last)
                _extract_rows(
                    store,
                    extractor,
                    batches,
                    samples,
                    request,
                    device,
                    normalized,
                    amp_dtype,
                    progress,
                    growing,
                    streamed_skipped,
                )
        finally:
            # The workers stop now, also after an error (--strict, a stop), not whenever the
            # traceback that holds this frame is collected (torch's join then waits 5 s).
            batches.close()
        seconds = time.perf_counter() - started
        if growing is not None:
            fingerprint = growing.value(len(samples))
        skipped = streamed_skipped if streamed else _skipped(samples, store.progress.errors)
        first_failure = _first_failure(samples, store.progress.errors, streamed_skipped)
        meta = _finish(
            store, request, samples, source, settings, layers, fingerprint, first_failure
        )
    except BaseException as error:
        # What the command line says of the stop: rows of this run that --resume continues
        # are in OUT, or not (a --force run stopped before its first rows put the old OUT
        # back, whose rows are another command line's).
        error.extract_rows_kept = store is not None and store.rows_kept  # type: ignore[attr-defined]
        raise
    finally:
        extractor.close()
        if store is not None:
            store.close()
    if store.progress.nonfinite:
        logger.warning(
            "%d of the %d rows have non-finite features (NaN or inf; first: %s): they mean "
            "nothing (%s; --strict makes this an error)",
            store.progress.nonfinite,
            store.progress.rows,
            store.progress.nonfinite_first,
            _nonfinite_hint(request, amp_dtype),
        )
    result = _result_from_meta(Path(request.out), meta, skipped)
    result.already_complete = False
    result.resumed_from = resumed_from
    result.seconds = seconds
    return result


def _finish(
    store: FeatureStore,
    request: FeatureRequest,
    samples: Samples,
    source,
    settings: dict,
    layers: list,
    fingerprint: str,
    first_failure: str | None = None,
) -> dict:
    """Move the arrays into OUT and write index.csv and meta.json; returns the meta."""
    state = store.progress
    if state.rows == 0:
        raise none_read(
            len(samples),
            redact_url(str(request.images)),
            f"the first, {first_failure}" if first_failure else "check the files",
        )
    index_columns, index_rows = ([], []) if store.streamed else _index_rows(samples, state.errors)
    meta = {
        "torchkit_version": __version__,
        **settings,
        "classes": source.classes,
        "images": redact_url(str(request.images)),
        "root": request.root,  # what index.csv's paths are relative to
        "images_location": store.data,  # the root's real path and (device, inode), for --resume
        **({"weights_digest": store.weights} if store.weights else {}),  # for --resume
        "split": request.split or ("all" if samples.splits else None),
        "num_images": len(samples),
        "num_rows": state.rows,
        "num_skipped": store.skipped if store.streamed else len(state.errors),
        "num_nonfinite": state.nonfinite,
        "preprocess_source": source.preprocess_source,
        "layers": [
            {
                "name": layer.name,
                "node": layer.node,
                "file": f"{state.layers[layer.name]['file']}.{request.file_format}",
                "shape": [state.rows, *state.layers[layer.name]["shape"]],
                "output_shape": state.layers[layer.name]["output_shape"],
                "dtype": request.dtype,
            }
            for layer in layers
        ],
        "fingerprint": fingerprint,
    }
    store.finish(request.file_format, index_columns, index_rows, meta)
    return meta


def _extract_rows(
    store: FeatureStore,
    extractor: FeatureExtractor,
    batches: Iterator,
    samples: Samples,
    request: FeatureRequest,
    device,
    normalized: NormalizedPixels,
    amp_dtype,
    progress: Progress | None,
    streamed: Fingerprint | None = None,
    streamed_skipped: list[tuple[str, str]] | None = None,
) -> None:
    """Fill the store batch by batch from where its progress record says, saving that record
    every COMMIT_INTERVAL_S, at the end, and when anything stops the loop. Rows with a NaN or
    inf feature are counted (with `strict`, the first batch that has one is an error, and is
    not written). Batches of 8-bit pixels are normalised on the device by `normalized`.
    A `streamed` store (paths on stdin) also gets each batch's index.csv lines, and the
    batch's images go into the run's fingerprint (`streamed`), as they come; its unreadable
    images, which the store forgets, into `streamed_skipped` (path, why)."""
    import torch

    state = store.progress
    if state.done:
        logger.info("resuming at image %d of %d", state.done + 1, len(samples))
    # Without --amp autocast is off, and its dtype only has to be a valid one.
    autocast_dtype = amp_dtype or (torch.bfloat16 if device.type == "cpu" else torch.float16)
    memory_format = torch.channels_last if request.run.channels_last else torch.contiguous_format
    last_commit = time.perf_counter()
    total = None if streamed else len(samples)  # a streamed list's is known at its end
    if progress:
        progress(state.done, total)
    try:
        for indices, images, failures in batches:
            for index, reason in failures:
                _skip(samples, index, reason, request.strict, state.errors)
            if images is not None:
                images = model_input(images, device, normalized, memory_format)
                with (
                    torch.inference_mode(),
                    torch.autocast(device.type, dtype=autocast_dtype, enabled=request.run.amp),
                    _image_size_checked(extractor, images, first=not state.rows),
                ):
                    outputs = extractor(images)
                layers = extractor.layers
                arrays = {layer.name: _reduce(outputs, layer, request, images) for layer in layers}
                failed = {index for index, _reason in failures}
                rows = [index for index in indices if index not in failed]
                nonfinite, first = _check_finite(
                    arrays, rows, samples, request, amp_dtype, logits=outputs.get("logits")
                )
                if not store.allocated:
                    for layer in layers:
                        _warn_pool(request.pool, layer.name, list(outputs[layer.name].shape[1:]))
                    store.allocate(_layer_specs(layers, outputs, arrays))
                store.write(state.rows, arrays)
            # The record's rows and images move on together: a Ctrl-C or SIGTERM between the
            # two would be recorded (and resumed) with the batch's rows written twice.
            with signals_held():
                if images is not None:
                    state.rows += len(images)
                    state.nonfinite += nonfinite
                    state.nonfinite_first = state.nonfinite_first or first
                if streamed is not None:
                    skipped = _append_index(store, samples, indices)
                    if streamed_skipped is not None:
                        streamed_skipped += skipped
                    streamed.add(samples, indices)
                state.done = max(indices) + 1
            if time.perf_counter() - last_commit >= COMMIT_INTERVAL_S:
                store.commit()
                last_commit = time.perf_counter()
            if progress:
                progress(state.done, total)
    except BaseException:
        # Ctrl-C, SIGTERM, --strict, a failing layer...: record the batches that are complete,
        # so that --resume goes on from there (the record never counts a batch that is not
        # written). If even that fails (a full disk), the error that stopped the run is the one
        # reported, and OUT is not kept.
        with contextlib.suppress(Exception):
            store.commit()
        raise
    store.commit()


@contextlib.contextmanager
def _image_size_checked(extractor: FeatureExtractor, images, *, first: bool) -> Iterator[None]:
    """A model that fails at its first batch with torch's shape error does not take
    --image-size: that becomes one line (`first_batch_error`), naming the smallest size it takes
    when the images are too small for it."""
    try:
        yield
    except RuntimeError as error:
        if not first:
            raise
        extractor.close()  # its hooks would record the meta-device search's outputs
        raise first_batch_error(
            extractor.module, extractor.arch, images, error, trained=extractor.trained
        ) from error


def _check_finite(
    arrays: dict,
    rows: list[int],
    samples: Samples,
    request: FeatureRequest,
    amp_dtype,
    *,
    logits=None,
) -> tuple[int, str | None]:
    """(how many, the first image) of the rows of a batch that have a NaN or inf value in some
    layer (`rows`: the image index of each row); with --strict any is an error. In the `logits`
    layer (the model's outputs as computed) a -inf is a masked class, as eval and predict score
    it: fine where the model gave it, not where storing overflowed (float16)."""
    import numpy as np

    finite = np.ones(len(rows), dtype=bool)
    bad_layers = []
    for name, values in arrays.items():
        values = values.reshape(len(rows), -1)
        ok = np.isfinite(values)
        if name == "logits" and logits is not None and logits.shape == values.shape:
            # A -inf stored where the model gave it; not the NaN --normalize l2 makes of it.
            ok = (ok | (np.isneginf(values) & np.isneginf(logits.float().cpu().numpy()))).all(1)
            ok &= scorable_rows(logits).cpu().numpy()
        else:
            ok = ok.all(axis=1)
        if not ok.all():
            bad_layers.append(name)
            finite &= ok
    if not bad_layers:
        return 0, None
    first = image_path(samples, rows[int(np.flatnonzero(~finite)[0])])
    count = int((~finite).sum())
    if request.strict:
        raise InputError(
            f"layer {', '.join(bad_layers)} gives non-finite values (NaN or inf) for {count} of "
            f"the {len(rows)} images of a batch (first: {first})",
            _nonfinite_hint(request, amp_dtype) + "; without --strict they are counted",
        )
    return count, first


def _nonfinite_hint(request: FeatureRequest, amp_dtype) -> str:
    import torch

    wider = []
    if request.dtype == "float16":
        wider.append("--dtype float32")
    if amp_dtype == torch.float16:
        wider.append("--amp-dtype bf16 or no --amp")
    hint = "check whether the weights come from a diverged training run"
    if wider:
        hint += f", or use {' or '.join(wider)}: float16 overflows past 65504"
    if request.normalize == "l2" and "logits" in request.layers:
        hint += ", or drop --normalize l2, which makes NaN of a row of logits with a -inf"
    return hint


def _listing_options(request: FeatureRequest) -> list[str]:
    """The options that load MODEL as this run does, for the --list-layers hint."""
    options = [] if request.spec.weights is None else ["--weights", request.spec.weights]
    return options + ["--trust-checkpoint"] * request.spec.trust_checkpoint


def _validate(request: FeatureRequest) -> None:
    choices = {
        "--pool": (request.pool, POOLS),
        "--normalize": (request.normalize, NORMALIZATIONS),
        "--dtype": (request.dtype, DTYPES),
        "--array-format": (request.file_format, FILE_FORMATS),
    }
    for option, (value, allowed) in choices.items():
        if value is not None and value not in allowed:
            raise UsageError(f"{option} must be one of {', '.join(allowed)}, not {value!r}")
    check_amp_dtype(request.run.amp, request.run.amp_dtype)
    if launched_by_torchrun():
        # Every rank would extract every image into the same OUT (the second one refused by
        # its lock, mid-run): say so before anything starts, on every rank.
        raise UsageError(
            "extract-features runs in one process: under torchrun every rank would write the "
            "same OUT",
            "run it without torchrun, on the one device --device names",
        )
    check_inference_options(request.run)


def weights_digest(model) -> str:
    """SHA-256 of the model's parameters and buffers (names, dtypes, shapes, bytes), as loaded:
    the command line names a checkpoint by its path, whose file training may rewrite between
    an interrupted run and its --resume."""
    import torch

    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        if not isinstance(tensor, torch.Tensor):
            continue
        digest.update(f"{name}\t{tensor.dtype}\t{tuple(tensor.shape)}\n".encode())
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        digest.update(flat.view(torch.uint8).numpy())
    return digest.hexdigest()


def _fingerprint(settings: dict, samples: Samples) -> str:
    """The fingerprint of a run over the whole of `samples`."""
    fingerprint = Fingerprint(settings)
    fingerprint.add(samples, range(len(samples)))
    return fingerprint.value(len(samples))


class Fingerprint:
    """What makes two runs' rows interchangeable (--resume continues only a matching run): the
    settings, then each image (`add`, in index order: a streamed run adds them as they come),
    then their count (`value`)."""

    def __init__(self, settings: dict) -> None:
        # Left out at their defaults, as before the options existed: older runs still resume.
        if settings.get("amp_dtype", "") is None:  # no --amp
            settings = {key: value for key, value in settings.items() if key != "amp_dtype"}
        if settings.get("ema") is False:  # no --ema
            settings = {key: value for key, value in settings.items() if key != "ema"}
        self._digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode("utf-8"))

    def add(self, samples: Samples, indices: Iterable[int]) -> None:
        ids = samples.ids or samples.paths
        if not ids:
            return
        for index in indices:
            name = ids[index]
            self._digest.update(f"\n{name}\t{samples.labels[index]}".encode("utf-8", NAME_ERRORS))

    def value(self, count: int) -> str:
        digest = self._digest.copy()
        digest.update(f"\n{count}".encode())
        return digest.hexdigest()


def _loader(
    image_set: ImageSet,
    preprocess: Preprocess,
    mode: str,
    request: FeatureRequest,
    device,
    streamed: tuple[ImageSet, list[str]] | None = None,
    check: Callable[[list[str]], None] | None = None,
):
    """A function start -> iterator of (indices, image batch or None, [(index, why)]): 8-bit
    crops, normalised on the device by the caller; JPEG bytes decoded there with --decode
    device. `streamed` (its first paths read already): the paths on stdin, taken as they come,
    each lot `check`ed before it is read; its start is 0. The iterator yields None first, once
    the loader's workers are forked."""
    import torch
    from torch.utils.data import default_collate

    from torchkit.core.data.dataset import (
        inference_dataset,
        inference_workers,
        stop_workers,
        worker_options,
    )
    from torchkit.core.data.device_decode import collate_encoded_with_failures, decoded_with_indices

    samples = image_set.samples
    dataset = inference_dataset(samples, preprocess, mode=mode, decode=request.run.decode)
    workers = inference_workers(samples, request.run.workers)
    on_device = request.run.decode == "device"

    def collate(items):
        indices = [item[2] for item in items]
        if on_device:  # JPEG bytes, decoded in the main process (`batches`)
            return indices, collate_encoded_with_failures(items)
        good = [item for item in items if item[0] is not None]
        failures = [(item[2], item[3]) for item in items if item[0] is None]
        # default_collate stacks a worker's batch straight into shared memory (one copy).
        images = default_collate([item[0] for item in good]) if good else None
        return indices, images, failures

    def decoded(loader):
        if not on_device:
            yield from loader
            return
        for indices, collated in loader:
            images, _, failures = decoded_with_indices(collated, device)
            yield indices, images, failures

    def batches(start: int):
        loader = torch.utils.data.DataLoader(
            dataset,
            batch_size=request.run.batch_size,
            sampler=range(start, len(samples)),
            num_workers=workers,
            collate_fn=collate,
            pin_memory=device.type == "cuda",
            prefetch_factor=4 if workers else None,
            **worker_options(workers),
        )
        batches = iter(loader)
        try:
            yield None  # started
            yield from decoded(batches)
        finally:
            stop_workers(batches)  # also after an error a worker raised (see stop_workers)

    def streamed_batches(start: int):
        # As predict streams: each pass of the loader takes the paths piped so far (at most
        # enough to keep its workers busy); its workers stay from one pass to the next.
        batch_size = request.run.batch_size
        passes = LoaderPass()
        loader = torch.utils.data.DataLoader(
            dataset,
            batch_sampler=passes,
            num_workers=workers,
            collate_fn=collate,
            pin_memory=device.type == "cuda",
            persistent_workers=workers > 0,
            **worker_options(workers),
        )
        paths, most = streamed[1], batch_size * max(2, 32 * workers)  # type: ignore[index]
        try:
            iter(loader)  # no batch yet: the persistent workers are forked, and stay
            yield None  # started
            while paths:
                keys = samples.keys(paths)  # type: ignore[attr-defined]
                passes.batches = [
                    keys[at : at + batch_size] for at in range(0, len(keys), batch_size)
                ]
                yield from decoded(loader)
                paths = image_set.stream.take(most)  # type: ignore[union-attr]
                if check is not None:
                    check(paths)
        finally:
            stop_workers(loader)  # its persistent workers
            del loader

    return batches if streamed is None else streamed_batches


def _skip(samples: Samples, index: int, reason: str, strict: bool, errors: dict) -> None:
    path = image_path(samples, index)
    why = reason[len(path) + 2 :] if reason.startswith(f"{path}: ") else reason
    if strict:
        raise strict_unreadable_error(f"{path}: {why}")
    if len(errors) < UNREADABLE_WARNINGS:
        logger.warning("skipping unreadable image %s: %s", path, why)
    errors[index] = why


def _reduce(outputs: dict, layer, request: FeatureRequest, images):
    raw = outputs[layer.name]
    _check_batch(raw, layer.name, len(images))
    features = reduce_feature(
        raw,
        name=layer.name,
        pool=request.pool,
        normalize=request.normalize,
        flatten=request.flatten,
        dtype=request.dtype,
    )
    return features.cpu().numpy()


def _check_batch(value, name: str, batch: int) -> None:
    shape = getattr(value, "shape", None)
    if shape is not None and (len(shape) == 0 or shape[0] != batch):
        raise UsageError(
            f"layer {name} gives shape {tuple(shape)}, not one row per image",
            "pick another layer: --list-layers lists them",
        )
    # A (N, 0, ...) output has no feature to store: every row would be empty, and counted as
    # non-finite by the check of the logits.
    if shape is not None and any(size == 0 for size in shape[1:]):
        raise UsageError(
            f"layer {name} gives shape {tuple(shape)}: no values for an image",
            "pick another layer: --list-layers lists them",
        )


def _warn_pool(pool: str | None, name: str, shape: list[int]) -> None:
    if pool in ("avg", "max") and len(shape) != 3:
        logger.warning(
            "layer %s gives %s per image, not a (C, H, W) map: --pool %s does not apply to it",
            name,
            tuple(shape),
            pool,
        )


def _layer_specs(layers, outputs: dict, arrays: dict) -> dict[str, dict]:
    return {
        layer.name: {
            "shape": list(arrays[layer.name].shape[1:]),
            "dtype": str(arrays[layer.name].dtype),
            "output_shape": list(outputs[layer.name].shape[1:]),
        }
        for layer in layers
    }


INDEX_COLUMNS = ["row", "path", "label", "error"]


def _index_rows(samples: Samples, errors: dict[int, str]) -> tuple[list[str], Iterator[list]]:
    """index.csv: one line per image in index order, its row in the arrays (empty if skipped),
    its path (relative to the data root), its class name; and its split for split data. The
    lines come one at a time, as they are written (a million of them: 50 MB of text)."""
    columns = INDEX_COLUMNS + (["split"] if samples.splits else [])
    return columns, _index_lines(samples, range(len(samples)), errors, 0)


def _index_lines(
    samples: Samples, indices: Iterable[int], errors: dict, row: int
) -> Iterator[list]:
    """The index.csv lines of `indices` (in order), whose first readable image is row `row`;
    None (an empty field) where there is no row, label or error."""
    ids = samples.ids or samples.paths
    labelled = samples.classes != [""]  # [""]: unlabelled images
    classes = shown_class_names(samples.classes)  # `crane (#134)`: two classes of one name
    for index in indices:
        name = ids[index] if ids else str(index)
        # Class "" beside class names: a sample of partly labelled data without a label.
        label = (classes[samples.labels[index]] or None) if labelled else None
        if index in errors:
            line = [None, name, label, errors[index]]
        else:
            line = [row, name, label, None]
            row += 1
        if samples.splits:
            line.append(samples.splits[index])
        yield line


def _append_index(
    store: FeatureStore, samples: Samples, indices: list[int]
) -> list[tuple[str, str]]:
    """A streamed batch's index.csv lines (its rows are the last ones written); its errors are
    then forgotten by the store, and given back (path, why) as index.csv names them."""
    errors = store.progress.errors
    failed = {index: errors[index] for index in indices if index in errors}
    first_row = store.progress.rows - (len(indices) - len(failed))
    store.append_index(INDEX_COLUMNS, _index_lines(samples, indices, errors, first_row))
    store.skipped += len(failed)
    for index in indices:
        errors.pop(index, None)
    return _skipped(samples, failed)


def _first_failure(
    samples: Samples, errors: dict[int, str], streamed_skipped: list[tuple[str, str]]
) -> str | None:
    """`path: why` of the first unreadable image, its path from the working folder as every
    warning and error about an image names it."""
    if errors:
        index = min(errors)
        return f"{image_path(samples, index)}: {errors[index]}"
    if streamed_skipped:
        return ": ".join(streamed_skipped[0])
    return None


def _skipped(samples: Samples, errors: dict[int, str]) -> list[tuple[str, str]]:
    """(path, why) of each unreadable image of `errors`, in index order, as index.csv's `path`
    and `error` columns give them."""
    ids = samples.ids or samples.paths
    return [(str(ids[index]) if ids else str(index), errors[index]) for index in sorted(errors)]


def _result_from_meta(
    out: Path, meta: dict, skipped: list[tuple[str, str]] | None = None
) -> ExtractionResult:
    """The result of the run whose meta.json is `meta`; its unreadable images `skipped`, else
    (a complete OUT found again) read from its index.csv."""
    errors = skipped or []
    index_path = out / "index.csv"
    if skipped is None and index_path.is_file():
        import csv

        with open_text(index_path) as handle:
            errors = [(r["path"], r["error"]) for r in csv.DictReader(handle) if r["error"]]
    return ExtractionResult(
        out=out,
        num_images=int(meta["num_images"]),
        num_rows=int(meta["num_rows"]),
        skipped=errors,
        layers=[
            LayerOutput(
                layer["name"], layer["node"], out / layer["file"], layer["shape"], layer["dtype"]
            )
            for layer in meta["layers"]
        ],
        resumed_from=int(meta["num_images"]),
        already_complete=True,
        num_nonfinite=int(meta.get("num_nonfinite", 0)),
    )
