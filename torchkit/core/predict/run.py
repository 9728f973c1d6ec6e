"""Running a classifier over images and streaming one row per image, in input order.

Rows come out batch by batch (memory stays flat however many images there are). Under torchrun
rank r takes batches r, r + world_size, ...; at every step the ranks gather their batches on
rank 0, which yields them in order: one output, the same rows as one process.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torchkit.core.data.batches import none_read
from torchkit.core.data.image_files import strict_unreadable_error
from torchkit.core.data.sources.samples import shown_class_names
from torchkit.core.inference.options import (
    InferenceOptions,
    check_inference_options,
    check_torch_options_apply,
)
from torchkit.core.io.errors import InputError, TorchkitError, UsageError, on_every_rank
from torchkit.core.io.files import STDIN
from torchkit.core.io.redaction import redact_url
from torchkit.core.io.wording import counted
from torchkit.core.predict.inputs import (
    LoaderPass,
    PathKey,
    StreamedSamples,
    collect_images,
    streamed_images,
    streams_stdin,
)
from torchkit.core.runtime.device import to_channels_last

if TYPE_CHECKING:
    from torchkit.core.models import ModelSpec

log = logging.getLogger("torchkit")

Progress = Callable[[int, int], None]


@dataclass
class PredictRequest:
    """What `torchkit predict` is asked to do, and how it runs the model (`run`)."""

    # MODEL, --weights, --ema, --trust-checkpoint, --allow-untrained (random weights: a model
    # built by code, a test), --classes and the preprocessing options (`spec.stats`: the --stats
    # file mean and std were read from)
    spec: ModelSpec
    images: list[str]
    run: InferenceOptions = field(default_factory=InferenceOptions)
    split: str | None = None
    # > 1 adds class_1..class_K and probability_1..probability_K (JSON: class_index_K beside
    # class_K), K clipped to the classes as eval clips it (a 1-class model still gets class_1:
    # the columns follow the request)
    topk: int = 1
    logits: bool = False
    tta: str = "none"
    strict: bool = False  # the first unreadable image (or non-finite output) is an error
    skip_errors: bool = False  # leave unreadable images out instead of an error row
    # Classes named as tables and CSV show them (`shown_class_names`: `crane (#134)` for a
    # name two classes share), else by their names alone (JSON, beside class_index,
    # class_index_K and label_index).
    names_shown: bool = True


@dataclass
class PredictSummary:
    images: int = 0
    predicted: int = 0
    unreadable: int = 0
    nonfinite: int = 0
    first_error: str = ""
    seconds: float = 0.0

    @property
    def images_per_second(self) -> float:
        return self.predicted / self.seconds if self.seconds > 0 else float("nan")


@dataclass
class PredictRun:
    """`setup()` resolves the model and the images (all checks, before any output); `rows()`
    streams the predictions; `summary` is complete once `rows()` is exhausted."""

    request: PredictRequest
    stdin: Iterable[str] | None = None
    # Called with the paths on stdin as they are read, before they are predicted (with -o FILE:
    # no listed image may be the output). A lone `-` is read as it comes.
    check_listed: Callable[[list[str]], None] | None = None
    summary: PredictSummary = field(default_factory=PredictSummary)
    notes: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    def setup(self) -> None:
        from torchkit.core.data.preprocessing import image_mode
        from torchkit.core.inference.scoring import TTA_MODES
        from torchkit.core.runtime.distributed import (
            JoinedAfterForks,
            broadcast_from_main,
            launched_by_torchrun,
            place,
        )
        from torchkit.core.runtime.threads import until_workers_forked

        request = self.request
        if request.tta not in TTA_MODES:
            raise UsageError(f"unknown --tta {request.tta!r}", "use none or flip")
        check_inference_options(request.run)
        if request.topk < 1:
            raise UsageError(f"--topk must be at least 1, not {request.topk}")
        if request.strict and request.skip_errors:
            raise UsageError("--strict and --skip-errors contradict each other")
        from torchkit.core.models import resolve_spec

        # A checkpoint's model is built without the random weights it replaces (random_init.py),
        # on one thread: its weights' copies start no OpenMP thread before the loader's workers
        # are forked (`rows`).
        with until_workers_forked():
            self.resolved = resolve_spec(
                request.spec, command="predict", exported="runtime", predicting=True
            )
        check_torch_options_apply(request.run, self.resolved.exported_format)
        outputs = self.resolved.num_outputs
        preprocess = self.resolved.preprocess
        self.mode = image_mode(preprocess.in_channels)
        self._listed: tuple | None = None
        if STDIN in request.images and launched_by_torchrun():
            # torchrun's ranks share one stdin: rank 0 read the list (the CLI), the others
            # take it from rank 0 (each reading it too left all but one with none), through
            # the process group. Its threads start as it is joined, after the loader's
            # workers are forked: before the list is known, they find each path in its key.
            self.ctx = place(request.run.device)
            self._join = JoinedAfterForks(self.ctx)
            with self._join:
                self._listed = self._start_loader(StreamedSamples())
            self.stdin = broadcast_from_main(self.ctx, self.stdin if self.ctx.is_main else None)
        if streams_stdin(request.images):
            self.image_set = streamed_images(self.stdin, request.split)
            # The first paths checked before any output is opened (the rest as they come).
            self._first_paths = self.image_set.stream.take(request.run.batch_size)
            self._check_listed(self._first_paths)
        else:
            self.image_set = collect_images(
                request.images,
                split=request.split,
                stdin=self.stdin,
                recorded=self.resolved.data_record,
            )
        self.notes += self.image_set.notes
        self._name_outputs(outputs)
        if getattr(self, "ctx", None) is None:  # after the images: a missing one said first
            # The process group is joined once the loader's workers are forked (`_records`).
            self.ctx = place(request.run.device)
        self._join = JoinedAfterForks(self.ctx)
        self.device = self.ctx.device
        self.info = {
            "model": request.spec.model,
            "weights": request.spec.weights,
            "ema": request.spec.ema,
            "arch": self.resolved.arch,
            "model_source": self.resolved.weights_source or self.resolved.source,
            "classes": self.classes,
            "root": self.image_set.root,
            "images": None if self.image_set.stream else len(self.image_set.samples),
            "device": str(self.device),
            "world_size": self.ctx.world_size,
            "tta": request.tta,
            "preprocess": preprocess.to_dict(),
        }

    def _name_outputs(self, outputs: int | None) -> None:
        """`self.classes`: the model's class names, else the data's as eval names them, else
        ImageNet-1k's for 1,000 outputs of weights a file or library gave (timm's names for a
        timm model, which names its larger ImageNet heads too), else each output's index
        (`core.inference.class_names`)."""
        from torchkit.core.inference.class_names import output_names_from_data
        from torchkit.core.models.resolver import has_random_weights
        from torchkit.core.predict.inputs import classes_naming_outputs

        request = self.request
        image_set = self.image_set
        if self.resolved.classes:
            self.classes = list(self.resolved.classes)
        else:
            # Several IMAGES name the outputs as one input of all their images would.
            data_classes, given, order_unknown = classes_naming_outputs(image_set, self.data_name)
            self.classes, note = output_names_from_data(
                data_classes,
                outputs,
                self.data_name,
                given=given,
                order_unknown=order_unknown,
                several=image_set.input_classes is not None,
                # random weights (a name without --weights) were trained on nothing
                imagenet=not has_random_weights(self.resolved),
                timm=self.resolved.source == "timm",  # timm's ImageNet names, where it has them
            )
            self.notes.append(note)
        # Named as the rows name them (`names_shown`), once for every batch.
        names = shown_class_names if request.names_shown else list
        self._output_names = names(self.classes)
        self._label_names = names(self.image_set.samples.classes)
        if self._k(outputs) < request.topk:
            k = self._k(outputs)
            classes = counted(k, "class", "classes")
            self.notes.append(f"--topk {request.topk} is more than the {classes}; using {k}")

    @property
    def data_name(self) -> str:
        """IMAGES as messages name them: the one input as typed (a URL redacted), else IMAGES."""
        images = self.request.images
        return redact_url(images[0]) if len(images) == 1 else "IMAGES"

    def _check_listed(self, paths: list[str]) -> None:
        if self.check_listed is not None:
            self.check_listed(paths)

    @property
    def is_main(self) -> bool:
        return self.ctx.is_main

    def columns(self, num_outputs: int | None = None) -> list[str]:
        """The columns of every row, in order."""
        columns = ["path"]
        if self.image_set.samples.splits:
            columns.append("split")
        # The one vocabulary of outputs that name images (eval's predictions.csv too): label
        # the true class name ("" when unknown), class the predicted one, class_index its index.
        columns.append("label")
        if not self.request.names_shown:  # JSON names a class as it is: which of two of a name
            columns.append("label_index")
        columns += ["class", "class_index", "probability"]
        if self.ranked:
            for rank in range(1, self._k(num_outputs) + 1):
                columns.append(f"class_{rank}")
                if not self.request.names_shown:  # as class_index beside class
                    columns.append(f"class_index_{rank}")
                columns.append(f"probability_{rank}")
        if self.request.logits:
            columns += [f"logit_{i}" for i in range(num_outputs or len(self.classes))]
        columns.append("error")
        return columns

    @property
    def ranked(self) -> bool:
        """Whether rows carry class_K/probability_K: --topk above 1 asked for them, whatever
        the classes clip K to."""
        return self.request.topk > 1

    def _k(self, num_outputs: int | None = None) -> int:
        outputs = num_outputs or len(self.classes) or self.request.topk
        return min(self.request.topk, outputs)

    def close(self, ok: bool = False) -> None:
        """Tear down the process group this run made. After a run that ended well on every
        rank, the ranks first wait for each other: Gloo torn down on one rank while another
        still talks to it aborts that process ("terminate called without an active
        exception"). After a failure nobody waits (a rank that never got here would hang it).
        A rank that fails before it joined the group (before its workers were forked) joins
        it first, unless Ctrl-C or SIGTERM ends it: the others learn of the failure instead
        of waiting for it to join (`JoinedAfterForks`)."""
        self._listed = None  # a loader `rows` never took: its workers stop
        if getattr(self, "ctx", None) is not None:
            from torchkit.core.runtime.distributed import teardown

            join = getattr(self, "_join", None)
            if join is not None and not ok:
                join.ended(sys.exc_info()[1] or RuntimeError("the run ended early"))
            teardown(self.ctx, wait=ok)

    def rows(self, progress: Progress | None = None) -> Iterator[dict[str, Any]]:
        """The rows, in input order, on rank 0 (other ranks yield nothing but take part), as
        dicts: an unreadable image's row has only `path` (`split`) and `error`."""
        class_at = self.columns().index("class")
        for keys, values in self._records(progress):
            row = dict(zip(keys, values, strict=True))
            if values[class_at] is None:  # an unreadable image: its path, split and error
                row = {key: value for key, value in row.items() if value is not None}
            yield row

    def records(self, progress: Progress | None = None) -> Iterator[list[Any]]:
        """The rows as lists of values in the order of `columns(resolved.num_outputs)` (None
        where a row has no value): what a CSV writer takes, with no dict per row."""
        header = self.columns(self.resolved.num_outputs)
        for keys, values in self._records(progress):
            if keys is not self._header:
                values = _aligned(keys, values, header)
            yield values

    def _records(self, progress: Progress | None) -> Iterator[tuple[list[str], list[Any]]]:
        """(the columns, the values) of every row, batch by batch."""
        import torch

        from torchkit.core.data.decode import NormalizedPixels
        from torchkit.core.data.device_decode import decoded_with_indices
        from torchkit.core.runtime.threads import (
            compute_threads,
            torch_threads,
            until_workers_forked,
        )

        request, samples, ctx = self.request, self.image_set.samples, self.ctx
        preprocess = self.resolved.preprocess
        on_device = request.run.decode == "device"  # JPEGs decoded on the device, batch by batch
        dataset, collate, workers = self._loader_parts(samples)
        normalized = NormalizedPixels(preprocess.mean, preprocess.std)
        if self._listed is not None:
            batches = self._batches(self._listed_loader)
            total = len(samples)
        elif self.image_set.stream is not None:
            batches = self._streamed_batches(workers)
            total = None  # known once the list ends
        else:
            batches = self._batches(
                lambda own: _loader(dataset, own, workers, self.device, collate)
            )
            total = len(samples)
        memory_format = (
            torch.channels_last if request.run.channels_last else torch.contiguous_format
        )
        amp_dtype = self._amp_dtype()
        summary = self.summary
        summary.images = len(samples)
        self._header = self.columns(self.resolved.num_outputs)
        self._keys_by_outputs = {self.resolved.num_outputs: self._header}
        start = time.perf_counter()
        first = True
        done = 0
        # The loader's workers are forked first, before the model is moved or run (which may
        # start threads beside them: OpenMP's, a GPU driver's).
        with until_workers_forked():
            next(batches)  # its first yield: the workers are forked
        try:
            self._join()  # Gloo's threads start: after the forks
        except BaseException:
            # The workers stop now, not whenever the traceback that holds this frame is
            # collected (whose join of them then waited torch's 5 s for each).
            batches.close()
            raise
        with torch_threads(compute_threads(workers, tiny_inputs=samples.images is not None)):
            try:
                model = self.resolved.model.eval().to(self.device)
                if request.run.channels_last:
                    to_channels_last(model)
                for batch in batches:
                    local = None
                    if batch is not None:
                        try:
                            if on_device:
                                batch = decoded_with_indices(batch, self.device)
                            local = self._score(
                                model, batch, amp_dtype, memory_format, normalized, first=first
                            )
                        # every rank stops with it, none waits forever
                        except TorchkitError as error:
                            local = {"failure": error}
                        first = False
                    parts = _gather(local, ctx)
                    failures = [p["failure"] for p in parts if p is not None and "failure" in p]
                    if failures:  # gathered: the same on every rank, which rank 0 reports
                        raise on_every_rank(failures[0])
                    records: list[tuple[list[str], list[Any]]] = []
                    failure = None
                    if ctx.is_main:
                        try:
                            for part in parts:
                                if part is not None:
                                    records += self._records_of(part)
                                    done += len(part["order"])
                        except TorchkitError as error:  # --strict: rank 0 decides for everyone
                            failure = error
                    failure = _from_rank_zero(failure, ctx)
                    if failure is not None:
                        raise on_every_rank(failure)
                    yield from records
                    if progress is not None and ctx.is_main:
                        progress(done, total)
            finally:
                batches.close()  # the loader's workers stop (_batches)
        summary.images = len(samples)
        summary.seconds = time.perf_counter() - start
        # Error rows alone are no result: a script must not take them for one (rank 0 counts).
        failure = _none_read(summary, self.data_name) if ctx.is_main else None
        failure = _from_rank_zero(failure, ctx)
        if failure is not None:
            raise on_every_rank(failure)

    def _loader_parts(self, samples) -> tuple[Any, Any, int]:
        """(the dataset, the collate function, the workers) of the loader over `samples`."""
        from torchkit.core.data.dataset import inference_dataset, inference_workers
        from torchkit.core.data.device_decode import collate_encoded_with_failures

        run = self.request.run
        dataset = inference_dataset(
            samples, self.resolved.preprocess, mode=self.mode, decode=run.decode
        )
        collate = collate_encoded_with_failures if run.decode == "device" else _collate
        return dataset, collate, inference_workers(samples, run.workers)

    def _start_loader(self, samples: StreamedSamples) -> tuple[Any, LoaderPass]:
        """A loader over `samples`, whose paths come with their keys, its persistent workers
        forked now (on one torch thread), before the paths are known; and its batch sampler,
        whose batches each pass of the loader reads."""
        from torchkit.core.runtime.threads import until_workers_forked

        dataset, collate, workers = self._loader_parts(samples)
        passes = LoaderPass()
        loader = _loader(dataset, passes, workers, self.ctx.device, collate, persistent=True)
        with until_workers_forked():
            iter(loader)  # no batch yet: the persistent workers are forked, and stay
        return loader, passes

    def _listed_loader(self, batches: _InterleavedBatches) -> Any:
        """The loader `_start_loader` made before the list came (torchrun with `-`), set to
        `batches` as the keys of their paths."""
        loader, passes = self._listed
        self._listed = None  # the loader goes with `_batches`
        passes.batches = _KeyedBatches(batches, self.image_set.samples.paths)
        return loader

    def _batches(self, loader_of: Callable[[_InterleavedBatches], Any]) -> Iterator[Any]:
        """This rank's batch of every step (None for a step past its last batch), after a
        first None yielded once the loader's workers are forked; `loader_of(batches)` is the
        loader of this rank's batches (lists of indices)."""
        from torchkit.core.data.dataset import stop_workers

        batch_size, ctx = self.request.run.batch_size, self.ctx
        size = len(self.image_set.samples)
        loader = loader_of(_InterleavedBatches(size, batch_size, ctx.rank, ctx.world_size))
        own = iter(loader)
        try:
            yield None  # started
            for _ in range(_steps(size, batch_size, ctx.world_size)):
                yield next(own, None)
        finally:
            # Workers stop now: not only when it is exhausted, but also when an error leaves
            # the caller's frame (or, an error of a worker, the iterator's) in a traceback.
            stop_workers(own)
            del own, loader

    def _streamed_batches(self, workers: int) -> Iterator[Any]:
        """The batches of the paths on stdin as they come (one process): each pass of the
        loader takes the paths piped so far (enough to keep its workers busy, at most), and
        its workers stay from one pass to the next. A first None is yielded once they are
        forked."""
        from torchkit.core.data.dataset import stop_workers

        batch_size = self.request.run.batch_size
        samples, stream = self.image_set.samples, self.image_set.stream
        # A pass ends with its workers idle while the last batch is read: with 32 batches a
        # worker in a pass (when the list is piped faster than it is read), a few per cent.
        most = batch_size * max(2, 32 * workers)
        loader, passes = self._start_loader(samples)
        paths = self._first_paths
        try:
            yield None  # started
            while paths:
                keys = samples.keys(paths)
                passes.batches = [
                    keys[at : at + batch_size] for at in range(0, len(keys), batch_size)
                ]
                yield from loader
                paths = stream.take(most)
                self._check_listed(paths)
        finally:
            stop_workers(loader)  # its persistent workers (see `_batches`)
            del loader

    def _amp_dtype(self):
        from torchkit.core.runtime.device import check_amp_dtype, resolve_amp_dtype

        check_amp_dtype(self.request.run.amp, self.request.run.amp_dtype)
        if not self.request.run.amp:
            return None
        return resolve_amp_dtype(self.request.run.amp_dtype, self.device)

    def _score(self, model, batch, amp_dtype, memory_format, normalized, *, first: bool) -> dict:
        """One batch's results as plain CPU values (they travel between ranks)."""
        import torch

        from torchkit.core.data.decode import model_input
        from torchkit.core.inference.scoring import score_batch
        from torchkit.core.models.image_size import trained_input
        from torchkit.core.topk import ranked_classes

        stacked, indices, failed = batch
        result: dict[str, Any] = {
            "order": sorted([*indices, *(index for index, _ in failed)]),
            "failed": failed,
        }
        if indices:
            images = model_input(stacked, self.device, normalized, memory_format)
            with torch.inference_mode():
                scored = score_batch(
                    model,
                    images,
                    self.device,
                    tta=self.request.tta,
                    amp=self.request.run.amp,
                    amp_dtype=amp_dtype,
                    first=first,
                    trained=trained_input(self.resolved),
                )
                k = self._k(scored.scores.shape[1])
                top = ranked_classes(scored.scores, k)
                probs = scored.probs.gather(1, top)
            result.update(
                indices=indices,
                top=top.cpu().tolist(),
                probs=probs.float().cpu().tolist(),
                finite=scored.finite.tolist(),
                logits=scored.logits.cpu().tolist() if self.request.logits else None,
                outputs=int(scored.scores.shape[1]),
            )
        return result

    def _keys(self, outputs: int) -> list[str]:
        """The columns of the rows of a batch with `outputs` outputs per image: one list
        shared by all its rows, the header itself when the model's head said as much."""
        keys = self._keys_by_outputs.get(outputs)
        if keys is None:
            keys = self.columns(outputs)
            if keys == self._header:
                keys = self._header
            self._keys_by_outputs[outputs] = keys
        return keys

    def _records_of(self, part: dict) -> list[tuple[list[str], list[Any]]]:
        """One batch's rows, in input order: values lists, built once per batch from the
        per-batch lists of classes and probabilities (no dict per row)."""
        samples, summary, request = self.image_set.samples, self.summary, self.request
        ids, splits, classes = samples.ids, samples.splits, self._output_names
        paths = samples.paths  # what an unreadable image's message names it by
        labels, label_names = samples.labels, self._label_names
        # JSON: label_index beside label, class_index_K beside class_K
        with_indices = not request.names_shown
        own_labels = self.image_set.own_labels or labels
        errors = dict(part["failed"])
        indices = part.get("indices", [])
        position_of = {index: position for position, index in enumerate(indices)}
        if indices:
            tops, probs, finite = part["top"], part["probs"], part["finite"]
            logits = part.get("logits")
            keys = self._keys(part["outputs"])
            names = [classes[i] if i < len(classes) else str(i) for i in range(part["outputs"])]
        records = []
        for index in part["order"]:
            values: list[Any] = [ids[index] if ids else str(index)]
            if splits:
                values.append(splits[index])
            # No true label (unlabelled images, whose one class is ""): None, an empty CSV field.
            label = (label_names[labels[index]] or None) if labels else None
            values.append(label)
            if with_indices:
                values.append(None if label is None else own_labels[index])
            if index in errors:
                summary.unreadable += 1
                message = errors[index]
                summary.first_error = summary.first_error or message
                if request.strict:
                    raise strict_unreadable_error(message)
                if request.skip_errors:
                    continue
                header = self._header
                values += [None] * (len(header) - len(values) - 1)
                values.append(_reason(message, str(paths[index]) if paths else str(index)))
                records.append((header, values))
                continue
            position = position_of[index]
            top, prob, ok = tops[position], probs[position], finite[position]
            if not ok:
                summary.nonfinite += 1
                if request.strict:
                    raise InputError(
                        f"the model's outputs for {values[0]} are not finite (NaN or inf)",
                        "check the weights, or drop --amp",
                    )
            summary.predicted += 1
            if ok:
                prob = [_digits(p) for p in prob]
                values += (names[top[0]], top[0], prob[0])
                if self.ranked:
                    for ranked, p in zip(top, prob, strict=True):  # a class index, not a label
                        values += (names[ranked], ranked, p) if with_indices else (names[ranked], p)
            else:  # NaN ranks first: its "class" would read as a prediction the model never made
                per_rank = 3 if with_indices else 2
                values += [None] * (3 + (per_rank * len(top) if self.ranked else 0))
            if logits:
                values += [_digits(v) for v in logits[position]]
            values.append(None if ok else "non-finite output")
            records.append((keys, values))
        return records


def _none_read(summary: PredictSummary, data: str) -> InputError | None:
    """The error of a run whose every image was unreadable (the rule of every command that
    reads many images: some unreadable ones are counted, none readable is a failure)."""
    if not summary.images or summary.unreadable < summary.images:
        return None
    return none_read(summary.images, data, f"the first, {summary.first_error}")


def _digits(value: float) -> float:
    """9 significant digits, as eval's predictions.csv writes them: a float32 round-trips."""
    return float(f"{value:.9g}")


def _aligned(keys: list[str], values: list[Any], header: list[str]) -> list[Any]:
    """A row whose columns differ from the header (a model with more or fewer outputs than it
    has classes), in the header's order; values without a column are an error, not dropped."""
    row = dict(zip(keys, values, strict=True))
    extra = [key for key, value in row.items() if key not in header and value is not None]
    if extra:
        raise InputError(
            f"the model gives outputs that have no column ({', '.join(extra[:3])})",
            "give --classes with one name per output",
        )
    return [row.get(column) for column in header]


def _reason(message: str, path: str) -> str:
    """The reason part of "path: reason", `path` the image's as its reader named it: a name
    may hold ": " itself (`x: y.png`, whose reason read "y.png: not an image ...")."""
    if message.startswith(f"{path}: "):
        return message[len(path) + 2 :]
    return message.split(": ", 1)[1] if ": " in message else message


class _InterleavedBatches:
    """Rank `rank`'s batches of indices (batches rank, rank + world, ...), each made as the
    loader asks for it: a list of every batch made at the start held an int and a pointer for
    every image (40 MB and 0.4 s of CPU at a million images)."""

    def __init__(self, size: int, batch_size: int, rank: int, world: int) -> None:
        self.size, self.batch_size = size, batch_size
        self.starts = range(rank * batch_size, size, batch_size * world)

    def __len__(self) -> int:
        return len(self.starts)

    def __iter__(self) -> Iterator[list[int]]:
        for start in self.starts:
            yield list(range(start, min(start + self.batch_size, self.size)))


class _KeyedBatches:
    """`batches` of indices as the keys of their `paths` (torchrun with `-`), each batch made
    as the loader asks for it: a list of them all held a key object for every image of the
    rank (about 250 bytes an image) before the first batch was read."""

    def __init__(self, batches: _InterleavedBatches, paths: Sequence[str]) -> None:
        self.batches, self.paths = batches, paths

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[list[PathKey]]:
        paths = self.paths
        for batch in self.batches:
            yield [PathKey(index, paths[index]) for index in batch]


def _steps(size: int, batch_size: int, world: int) -> int:
    batches = -(-size // batch_size)
    return -(-batches // world)


def _loader(dataset, batches, workers: int, device, collate, *, persistent: bool = False):
    import torch

    from torchkit.core.data.dataset import worker_options

    return torch.utils.data.DataLoader(
        dataset,
        batch_sampler=batches,
        num_workers=workers,
        collate_fn=collate,
        pin_memory=device.type == "cuda",
        persistent_workers=persistent and workers > 0,
        **worker_options(workers),
    )


def _collate(items: list) -> tuple[Any, list[int], list[tuple[int, str]]]:
    """(the readable images stacked, in the worker; their indices; (index, error) of the
    unreadable ones). default_collate stacks a worker's batch straight into shared memory, where
    torch.stack would need a second copy to send it to the main process."""
    from torch.utils.data import default_collate

    good = [item for item in items if item[0] is not None]
    stacked = default_collate([item[0] for item in good]) if good else None
    failed = [(item[2], item[3]) for item in items if item[0] is None]
    return stacked, [item[2] for item in good], failed


def _gather(local: dict | None, ctx) -> list[dict | None]:
    """Every rank's batch of this step, in rank order (the input order of interleaved
    batches), on every rank (so a failure on one rank stops all)."""
    if ctx.world_size == 1:
        return [local]
    import torch.distributed as dist

    gathered: list = [None] * ctx.world_size
    dist.all_gather_object(gathered, local)
    return gathered


def _from_rank_zero(value: Any, ctx) -> Any:
    if ctx.world_size == 1:
        return value
    import torch.distributed as dist

    holder = [value]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]
