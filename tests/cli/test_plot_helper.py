"""Plots drawn by one helper process that imports matplotlib beside a command's start-up
(core/runtime/plot_helper.py, core/plotting.py): each kind of plot the same file as the command
draws itself, arrays passed as .npy files that never outlive the request, the command's own
drawing whenever the helper gives no answer, and eval --out, dataset-stats --plot and
train --find-lr start it before their real work."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from image_folders import write_image_folder
from output_checks import error_line

from torchkit.cli import app
from torchkit.core.evaluate.reports import draw_errors, plot_confusion_matrix
from torchkit.core.runtime import plot_helper
from torchkit.core.runtime.helper_process import HelperProcess
from torchkit.core.runtime.plot_helper import ARRAY_KEY, PlotHelper
from torchkit.core.stats.plot import draw_dataset_stats
from torchkit.core.train.lr_find import LRFindResult, write_lr_find


def _spawned() -> PlotHelper:
    helper = PlotHelper.spawn()
    assert helper is not None
    return helper


@pytest.fixture(scope="module")
def helper_process():
    """The module's running helper process, started again once a test has ended it: each
    start imports matplotlib (a second or two of CPU), and a helper answers any number of
    requests, whoever sends them. Its `answered` starts False for each test."""
    started: list[HelperProcess] = []

    def running() -> HelperProcess:
        if not started or started[-1].process is None:
            helper = HelperProcess.spawn(plot_helper.SERVICE)
            assert helper is not None
            started.append(helper)
        started[-1].answered = False
        return started[-1]

    yield running
    for helper in started:
        helper.close()


@pytest.fixture
def live_helper(helper_process) -> PlotHelper:
    return PlotHelper(helper_process())


@pytest.fixture
def lent_helper(helper_process):
    """`lent_helper(PlotHelper or CurvesPainter)`: one on the module's helper process whose
    `close()` a command calls is counted in `closes`, not done (the next test draws with it)."""

    def lent(kind: type[PlotHelper]) -> PlotHelper:
        class Lent(kind):
            closes = 0

            def close(self) -> None:
                self.closes += 1

        return Lent(helper_process())

    return lent


@pytest.fixture
def dead_helper():
    helper = _spawned()
    helper.process.kill()
    helper.process.wait()
    yield helper
    helper.close()


def _leftovers(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


CANVAS = np.random.default_rng(0).integers(0, 256, size=(190, 360, 3), dtype=np.uint8)
TEXTS = [
    {"x": 0.5, "y": 0.96, "s": "The 1 most confident of 3 mistakes", "ha": "center", "va": "top",
     "fontsize": 11},
    {"x": 0.2, "y": 0.5, "s": "pred: 3 (0.91)", "ha": "center", "va": "bottom", "fontsize": 8,
     "color": "#b00020"},
]  # fmt: skip
STATS = {
    "names": ["cat", "dog", "(unlabelled)"],
    "counts": [5, 3, 1],
    "images": 9,
    "sizes": np.array([[8, 8], [32, 24], [640, 480], [7, 9]] * 2 + [[5, 5]], dtype=np.int64),
    "classes": 2,
}
LR_FIND = LRFindResult(
    lrs=[1e-4 * 1.5**i for i in range(20)],
    losses=[2.0 - i / 20 + (i / 15) ** 4 for i in range(20)],
    smoothed=[2.0 - i / 25 + (i / 16) ** 4 for i in range(20)],
    suggested_lr=1e-4 * 1.5**7,
)


def test_the_helper_draws_every_kind_as_the_process_does(live_helper, tmp_path):
    # The same pictures (pixels and sizes): the same bytes, as the same matplotlib draws them.
    helper, there, here = live_helper, tmp_path / "helper", tmp_path / "process"
    there.mkdir()
    here.mkdir()
    cm = np.array([[5, 1, 0], [2, 7, 0], [0, 0, 0]])
    for folder, painter in ((there, helper), (here, None)):
        plot_confusion_matrix(cm, ["a", "b", "c"], folder / "cm.png", painter=painter)
        plot_confusion_matrix(
            cm, ["a", "b", "c"], folder / "n.png", normalize=True, painter=painter
        )
        write_lr_find(folder, LR_FIND, painter=painter)
    assert helper.draw("errors", there / "errors.png", canvas=CANVAS, texts=TEXTS)
    draw_errors(here / "errors.png", CANVAS, TEXTS)
    assert helper.draw("dataset_stats", there / "stats.svg", **STATS)  # any format of --plot
    draw_dataset_stats(here / "stats.svg", **STATS)
    assert helper.draw("dataset_stats", there / "stats.png", **STATS)
    draw_dataset_stats(here / "stats.png", **STATS)
    assert helper.answered and helper.process is not None  # no answer would have closed it
    names = sorted(p.name for p in here.iterdir())
    assert names == ["cm.png", "errors.png", "lr_find.csv", "lr_find.png", "n.png", "stats.png",
                     "stats.svg"]  # fmt: skip
    assert sorted(p.name for p in there.iterdir()) == names  # no .npy left beside them
    for name in names:
        if name.endswith(".svg"):  # an SVG records its date and random ids: never the same
            assert (there / name).read_bytes().startswith(b"<?xml")
        else:
            assert (there / name).read_bytes() == (here / name).read_bytes(), name


def test_arrays_travel_as_npy_files_beside_the_output_and_are_removed(tmp_path):
    requests = []

    def call(request, service=None):
        requests.append(json.loads(json.dumps(request)))  # what goes down the pipe
        saved = request["values"]["canvas"][ARRAY_KEY]
        assert saved.startswith(str(tmp_path) + "/.errors.") and saved.endswith(".npy")
        np.testing.assert_array_equal(np.load(saved), CANVAS)
        return answers.pop(0)

    helper = PlotHelper(SimpleNamespace(process="running", call=call))  # the pipe's two ends
    answers = ["ok", None]  # drawn; then no answer (the caller draws)
    assert helper.draw("errors", tmp_path / "errors.png", canvas=CANVAS, texts=TEXTS)
    assert not helper.draw("errors", tmp_path / "errors.png", canvas=CANVAS, texts=TEXTS)
    assert requests[0]["values"]["texts"] == TEXTS and requests[0]["kind"] == "errors"
    assert list(tmp_path.iterdir()) == []  # removed, whether the helper answered or not
    # A FIFO or /dev/stdout: the helper's own stdout is its answer pipe, never asked.
    assert not helper.draw("errors", "/dev/stdout", canvas=CANVAS, texts=TEXTS)
    assert len(requests) == 2


def test_a_dead_helper_leaves_the_plots_to_the_process(dead_helper, tmp_path):
    write_lr_find(tmp_path, LR_FIND, painter=dead_helper)
    plot_confusion_matrix(
        np.eye(3, dtype=int), list("abc"), tmp_path / "cm.png", painter=dead_helper
    )
    assert (tmp_path / "lr_find.png").stat().st_size > 1000
    assert (tmp_path / "cm.png").stat().st_size > 1000
    assert dead_helper.process is None and _leftovers(tmp_path) == []


def test_a_folder_the_helper_cannot_use_leaves_the_error_to_the_process(live_helper, tmp_path):
    # An output folder that is a file: the helper cannot write there, nor can the process,
    # which reports it with the error of its own drawing. (A helper that answers an error is
    # given up: test_a_full_disk_is_the_commands_own_error, the last on the module's helper.)
    helper = live_helper
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    with pytest.raises(OSError) as own:
        draw_dataset_stats(blocked / "stats.png", **STATS)
    # No folder for the temporary .npy: the helper is not even asked.
    assert not helper.draw("dataset_stats", blocked / "stats.png", **STATS)
    assert helper.process is not None and not helper.answered
    assert isinstance(own.value, OSError) and blocked.read_text() == ""


def test_no_helper_where_matplotlib_is_imported(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", object())
    assert PlotHelper.start() is None
    with plot_helper.plot_helper() as painter:
        assert painter is None


class _Logged:
    """The helper's start, logged: what the command started first."""

    def __init__(self, events: list[str], helper: PlotHelper | None) -> None:
        self.events, self.helper = events, helper

    def __call__(self):
        self.events.append("plots")
        return self.helper


def _logging(events: list[str], name: str, function):
    def logged(*args, **kwargs):
        events.append(name)
        return function(*args, **kwargs)

    return logged


def _evaluate(monkeypatch, out, events, helper):
    import torch

    from torchkit.core.evaluate import EvalOptions, ModelSpec, evaluate, runner
    from torchkit.core.inference.options import InferenceOptions

    torch.manual_seed(0)  # the untrained model's weights: the same mistakes each time
    monkeypatch.setattr(plot_helper, "start_plot_helper", _Logged(events, helper))
    monkeypatch.setattr(runner, "resolve_spec", _logging(events, "model", runner.resolve_spec))
    monkeypatch.setattr(runner, "start_scorer", lambda **_: None)
    spec = ModelSpec(model="convnet", allow_untrained=True, image_size=8)
    options = EvalOptions(data="digits", out_dir=out, run=InferenceOptions(workers=0, device="cpu"))
    return evaluate(spec, options)


def test_eval_out_starts_the_helper_before_the_model_and_draws_its_pngs(
    monkeypatch, lent_helper, tmp_path
):
    events: list[str] = []
    helper = lent_helper(PlotHelper)
    _evaluate(monkeypatch, tmp_path / "helper", events, helper)
    assert events[:2] == ["plots", "model"]
    assert helper.answered and helper.closes == 1  # drawn by it, then closed
    _evaluate(monkeypatch, tmp_path / "process", [], None)
    for name in ("confusion_matrix.png", "errors.png"):
        drawn = (tmp_path / "helper" / name).read_bytes()
        assert drawn == (tmp_path / "process" / name).read_bytes(), name
    assert _leftovers(tmp_path / "helper") == [".torchkit"]
    # Without --out there is nothing to draw: no helper.
    events.clear()
    monkeypatch.setattr(plot_helper, "start_plot_helper", _Logged(events, None))
    from torchkit.core.evaluate import EvalOptions, ModelSpec, evaluate
    from torchkit.core.inference.options import InferenceOptions

    evaluate(
        ModelSpec(model="convnet", allow_untrained=True, image_size=8),
        EvalOptions(data="digits", run=InferenceOptions(workers=0, device="cpu")),
    )
    assert "plots" not in events


def test_eval_with_a_dead_helper_draws_its_pngs_itself(monkeypatch, dead_helper, tmp_path):
    _evaluate(monkeypatch, tmp_path / "out", [], dead_helper)
    for name in ("confusion_matrix.png", "errors.png"):
        assert (tmp_path / "out" / name).read_bytes()[:4] == b"\x89PNG"
    assert _leftovers(tmp_path / "out") == [".torchkit"]


def test_dataset_stats_plot_starts_the_helper_before_the_pass(
    runner, monkeypatch, lent_helper, tmp_path
):
    import torchkit.core.stats as stats

    data = write_image_folder(tmp_path / "data", {"a": 3, "b": 2})
    events: list[str] = []
    helper = lent_helper(PlotHelper)
    monkeypatch.setattr(plot_helper, "start_plot_helper", _Logged(events, helper))
    monkeypatch.setattr(
        stats, "compute_dataset_stats", _logging(events, "pass", stats.compute_dataset_stats)
    )
    args = ["dataset-stats", str(data), "-j", "0", "--plot"]
    result = runner.invoke(app, [*args, str(tmp_path / "helper.png")])
    assert result.exit_code == 0, result.stderr
    assert events == ["plots", "pass"] and helper.answered and helper.closes == 1
    monkeypatch.setattr(plot_helper, "start_plot_helper", _Logged(events, None))
    result = runner.invoke(app, [*args, str(tmp_path / "process.png")])
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "helper.png").read_bytes() == (tmp_path / "process.png").read_bytes()
    events.clear()
    assert runner.invoke(app, ["dataset-stats", str(data), "-j", "0"]).exit_code == 0
    assert events == ["pass"]  # no --plot: no helper


def test_find_lr_starts_the_helper_before_torch_and_draws_with_it(
    runner, monkeypatch, lent_helper, tmp_path
):
    from torchkit.core.train import run_folder
    from torchkit.core.train import runner as train_runner
    from torchkit.core.train.curves_painter import CurvesPainter

    events: list[str] = []
    painter = lent_helper(CurvesPainter)

    def start():
        events.append("plots")
        return painter

    monkeypatch.setattr(run_folder.CurvesPainter, "start", staticmethod(start))
    monkeypatch.setattr(
        train_runner, "_run_with_torch", _logging(events, "torch", train_runner._run_with_torch)
    )
    out = tmp_path / "run"
    result = runner.invoke(
        app,
        ["train", "--data", "digits", "--find-lr", "--find-lr-iters", "5", "--out", str(out),
         "-j", "0", "-q"],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert events == ["plots", "torch"] and painter.answered  # lr_find.png is its drawing
    assert (out / "lr_find.png").read_bytes()[:4] == b"\x89PNG"
    assert not [p for p in out.iterdir() if p.suffix == ".npy"]


# Last of the tests on the module's helper, which it ends: another would import matplotlib again.
def test_a_full_disk_is_the_commands_own_error(
    runner, monkeypatch, live_helper, small_tmpfs, tmp_path
):
    # A real helper (as a command started without matplotlib starts one): it fails to write the
    # plot (its small .npy fits), answers an error and is given up; the command draws the plot
    # itself and reports the full disk as it always did.
    data = write_image_folder(tmp_path / "data", {"a": 3, "b": 2})
    disk = small_tmpfs(16)
    answers: list = []
    call = live_helper.helper.call

    def recorded(request, service=None):
        answer = call(request, service)
        # given up at once (process None), before the command's own close at its end
        answers.append((answer, live_helper.process is None))
        return answer

    monkeypatch.setattr(live_helper.helper, "call", recorded)

    def start():
        return live_helper

    monkeypatch.setattr(plot_helper, "start_plot_helper", start)
    args = ["dataset-stats", str(data), "-j", "0", "--plot", str(disk / "p.png")]
    result = runner.invoke(app, args)
    assert result.exit_code == 1
    # The helper was asked and could not draw it (drawn here); it answered an error: given up,
    # no second try.
    assert answers == [(None, True)]
    line = error_line(result.stderr)
    assert f"cannot write {disk / 'p.png'}" in line and "No space left" in line
    assert list(disk.iterdir()) == []
