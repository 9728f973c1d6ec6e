"""eval's metrics scored by a helper process that imports scikit-learn beside eval's own start-up
(core/runtime/helper_process.py, core/evaluate/metrics.py): the same numbers as in the process, the
process's own scoring whenever the helper gives no answer, and eval starts it before the model
and data load and ends it with the command."""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pytest
from image_folders import write_image_folder

from torchkit.core.evaluate import metrics
from torchkit.core.evaluate.metrics import compute_metrics
from torchkit.core.runtime.helper_process import HelperProcess


def _case(seed: int = 0, n: int = 200, num_classes: int = 6):
    rng = np.random.default_rng(seed)
    y_true = rng.integers(0, num_classes - 1, size=n)  # the last class has no images
    scores = rng.normal(size=(n, num_classes))
    scores[np.arange(n), y_true] += 1.0
    order = np.argsort(-scores, axis=1, kind="stable")
    return y_true, order[:, 0], order[:, :3], num_classes


def _equal(a, b) -> None:
    for field in dataclasses.fields(a):
        left, right = getattr(a, field.name), getattr(b, field.name)
        if isinstance(left, np.ndarray):
            np.testing.assert_array_equal(left, right)
            assert left.dtype == right.dtype, field.name
        else:
            assert left == right, field.name


@pytest.fixture
def scorer():
    helper = HelperProcess.spawn(metrics.SERVICE)
    assert helper is not None
    yield helper
    helper.close()


def test_a_dead_helper_leaves_the_scoring_to_the_process(scorer):
    scorer.process.kill()
    scorer.process.wait()
    y_true, y_pred, topk, num_classes = _case(1)
    got = compute_metrics(y_true, y_pred, topk, num_classes, 3, scorer=scorer)
    _equal(got, compute_metrics(y_true, y_pred, topk, num_classes, 3))
    assert scorer.process is None  # given up: no second try


class _Recorder:
    """Stands for the helper: records what eval asks and answers as the service would."""

    def __init__(self, events: list[str]) -> None:
        self.events, self.requests, self.closed = events, [], False

    def call(self, request):
        self.requests.append(request)
        return metrics.answer(request)

    def close(self) -> None:
        self.closed = True


def test_eval_starts_the_scorer_before_the_model_and_closes_it(monkeypatch, tmp_path):
    from torchkit.core.evaluate import EvalOptions, ModelSpec, evaluate, runner
    from torchkit.core.inference.options import InferenceOptions

    events: list[str] = []
    recorder = _Recorder(events)

    def start(**_):
        events.append("scorer")
        return recorder

    resolve = runner.resolve_spec

    def resolve_logged(*args, **kwargs):
        events.append("model")
        return resolve(*args, **kwargs)

    monkeypatch.setattr(runner, "start_scorer", start)
    monkeypatch.setattr(runner, "resolve_spec", resolve_logged)
    spec = ModelSpec(model="convnet", allow_untrained=True, image_size=8)
    options = EvalOptions(data="digits", run=InferenceOptions(workers=0, device="cpu"))
    result = evaluate(spec, options)
    assert events[:2] == ["scorer", "model"]
    assert len(recorder.requests) == 1 and recorder.closed
    assert len(recorder.requests[0]["y_true"]) == result.metrics.num_samples == 179


def test_eval_out_draws_its_plots_in_the_scorers_process_which_scores_as_this_one(
    monkeypatch, tmp_path
):
    """eval --out starts ONE helper, serving the metrics and the plots (a second process would
    compete with it and eval for two cores), and its PNGs are those eval draws itself. The
    helper's scores are exactly the process's own (asked of it, beside eval's request, for a
    case with a class of no images), and it ends with 0 when eval closes its stdin."""
    from torchkit.core.evaluate import EvalOptions, ModelSpec, evaluate, runner
    from torchkit.core.inference.options import InferenceOptions
    from torchkit.core.runtime import plot_helper

    started, scorers = [], []
    spawn = HelperProcess.spawn

    def spawn_logged(*services):
        started.append(services)
        return spawn(*services)

    def compute_metrics_checked(*args, scorer=None, **kwargs):
        if scorer is not None:  # the one helper process, before eval's own request
            scorers.append((scorer, scorer.process))
            y_true, y_pred, topk, num_classes = _case()
            there = compute_metrics(y_true, y_pred, topk, num_classes, 3, scorer=scorer)
            assert scorer.answered  # the helper did answer: the numbers came from it
            _equal(there, compute_metrics(y_true, y_pred, topk, num_classes, 3))
        return compute_metrics(*args, scorer=scorer, **kwargs)

    monkeypatch.setattr(HelperProcess, "spawn", staticmethod(spawn_logged))
    monkeypatch.setattr(runner, "compute_metrics", compute_metrics_checked)
    # As in a fresh eval process (this one may have drawn or scored in-process before).
    monkeypatch.delitem(sys.modules, "sklearn.metrics", raising=False)
    monkeypatch.setattr(plot_helper, "wanted", lambda: True)
    spec = ModelSpec(model="convnet", num_classes=3, allow_untrained=True, image_size=8)
    # Eight images of three classes: both PNGs have something in them to draw (digits' 179
    # images and 10 classes drew 16 mistakes and a larger matrix twice, in two processes).
    data = write_image_folder(tmp_path / "data", {"a": 3, "b": 3, "c": 2})

    def run(out):
        import torch

        torch.manual_seed(0)  # the untrained model's weights: the same mistakes each time
        options = EvalOptions(
            data=str(data), out_dir=out, run=InferenceOptions(workers=0, device="cpu")
        )
        return evaluate(spec, options)

    with_helper = run(tmp_path / "helper")
    assert 0 < with_helper.metrics.accuracy < 1  # mistakes for errors.png, and right answers
    assert started == [(metrics.SERVICE, plot_helper.SERVICE)]
    [(scorer, process)] = scorers
    assert scorer.process is None and process.returncode == 0  # ended as its stdin closed
    monkeypatch.setattr(plot_helper, "wanted", lambda: False)  # drawn in this process
    monkeypatch.setattr(runner, "start_scorer", lambda **_: None)
    started.clear()
    in_process = run(tmp_path / "process")
    assert started == [] and len(scorers) == 1
    _equal(with_helper.metrics, in_process.metrics)
    for name in ("confusion_matrix.png", "errors.png"):
        drawn = (tmp_path / "helper" / name).read_bytes()
        assert drawn == (tmp_path / "process" / name).read_bytes(), name


def test_the_answer_grows_with_the_classes_not_their_square():
    """What the helper sends back is per-class (scores, not a C x C matrix as Python lists,
    which took 14 s and GBs at 8,000 classes); the matrix is counted in the process, equal to
    scikit-learn's."""
    import json

    from sklearn.metrics import confusion_matrix

    sizes = {}
    for num_classes in (250, 1000):
        rng = np.random.default_rng(num_classes)
        y_true = rng.integers(0, num_classes, size=2 * num_classes)
        y_pred = rng.integers(0, num_classes, size=2 * num_classes)
        request = {"y_true": y_true.tolist(), "y_pred": y_pred.tolist(), "num_classes": num_classes}
        sizes[num_classes] = len(json.dumps(metrics.answer(request)))
        got = compute_metrics(y_true, y_pred, y_pred[:, None], num_classes, 1).confusion
        expected = confusion_matrix(y_true, y_pred, labels=np.arange(num_classes))
        np.testing.assert_array_equal(got, expected)
        assert got.dtype == np.int64
    assert sizes[1000] < 6 * sizes[250]  # 4x the classes: about 4x, not 16x


def test_most_confused_reads_only_the_pairs_confused(monkeypatch):
    """Asked for every class (eval's per-class table), it sorts the non-zero cells once, never
    looking at every class of every row (C x C steps: 10 s at 5,000 classes) or building the
    matrix (3.2 GB at 20,000 classes)."""
    import tracemalloc

    monkeypatch.setattr(metrics.ConfusionPairs, "dense", None)  # any use of it fails
    num_classes = 20_000
    y_true = np.concatenate([np.arange(num_classes), [7, 7, 7, 7, 7, 7, 7]])
    y_pred = np.concatenate([np.arange(num_classes), [3, 3, 9, 9, 9, 9, 9]])
    tracemalloc.start()
    try:
        pairs = metrics.ConfusionPairs.counted(y_true, y_pred, num_classes)
        found = pairs.most_confused()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert found[7] == [(9, 5), (3, 2)]
    assert sum(map(len, found)) == 2
    assert peak < 20 * num_classes * 8 + 5_000_000  # per class and per pair, far from C x C
