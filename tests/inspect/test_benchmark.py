"""`torchkit benchmark` and `torchkit.core.benchmark`: the JSON it reports, warm-up excluded from
the timing, --iters/--seconds, batch-size lists, the training step, --find-batch-size, appending
to a CSV, bad options, the CUDA paths (mocked: synchronisation, peak memory, out of memory), and
agreement with a hand-written timing loop."""

from __future__ import annotations

import contextlib
import csv
import gc
import importlib
import io
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import types
import uuid
from pathlib import Path

import pytest
import torch
from nets import TinyNet
from output_checks import error_line
from processes import signal_and_wait, start_torchkit_process, wait_until
from torch import nn

from torchkit.cli import app
from torchkit.core.benchmark import (
    COLUMNS,
    BenchmarkOptions,
    Trial,
    benchmark_model,
    parse_batch_sizes,
    percentile,
    search_batch_size,
    time_steps,
)
from torchkit.core.benchmark import memory as bench_memory
from torchkit.core.benchmark import run as bench_run
from torchkit.core.benchmark.memory import MemoryProbe, parse_memory_limit
from torchkit.core.benchmark.search import OUT_OF_MEMORY, OVER_LIMIT, PREDICTED_OVER, TOO_SMALL
from torchkit.core.io.errors import OutputExistsError, TorchkitError, UsageError
from torchkit.core.summary import summarize

FAST = ["--device", "cpu", "--warmup", "1", "--iters", "2"]


@pytest.fixture(autouse=True)
def collections_skip_what_the_test_found():
    """A CPU memory probe collects garbage before each trial: a full collection walks every
    object the test process holds (torch, the command tree, earlier tests' leftovers), 0.1 to
    0.3 s each, ten per --find-batch-size run. The objects there before the test are frozen (out
    of the collector's sight) while it runs. Afterwards the test's garbage is collected and what
    survives is frozen too; never unfrozen: gc.unfreeze() would hand back the million objects
    the suite froze after collection (tests/conftest.py), and every later full collection in
    this worker would walk them again."""
    gc.freeze()
    yield
    gc.collect()
    gc.freeze()


def tiny_conv(channels: int = 1) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(channels, 4, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4, 3),
    )


class Recorder(nn.Module):
    """Counts its calls per input shape, records the mode and grad state of each, and can sleep
    on the first `slow_calls` calls of each shape (a cold start, as cuDNN's autotuning)."""

    def __init__(self, slow_calls: int = 0, delay: float = 0.0, per_call: float = 0.0) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.slow_calls, self.delay, self.per_call = slow_calls, delay, per_call
        self.calls: dict[tuple[int, ...], int] = {}
        self.seen: list[tuple[int, bool, bool, bool]] = []

    def forward(self, x):
        if x.device.type != "meta":
            key = tuple(x.shape)
            self.calls[key] = self.calls.get(key, 0) + 1
            self.seen.append(
                (x.shape[0], self.training, torch.is_inference_mode_enabled(), x.requires_grad)
            )
            if self.calls[key] <= self.slow_calls:
                time.sleep(self.delay)
            if self.per_call:
                time.sleep(self.per_call)
        return self.fc(x)


def options(**kwargs) -> BenchmarkOptions:
    kwargs.setdefault("device", "cpu")
    kwargs.setdefault("warmup", 1)
    if "seconds" not in kwargs:
        kwargs.setdefault("iters", 2)
    return BenchmarkOptions(**kwargs)


@pytest.fixture
def model_module(tmp_path, monkeypatch):
    """Write `package.module:Callable` code to a fresh module in tmp_path (the working
    directory); returns its spec."""
    monkeypatch.chdir(tmp_path)
    names = []

    def write(code: str, attr: str = "build") -> str:
        name = f"benchmodel_{uuid.uuid4().hex[:8]}"
        (tmp_path / f"{name}.py").write_text(code)
        importlib.invalidate_caches()
        names.append(name)
        return f"{name}:{attr}"

    yield write
    for name in names:
        sys.modules.pop(name, None)


SLOW_START = """
import time
from torch import nn

class SlowStart(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.calls = {}

    def forward(self, x):
        if x.device.type != "meta":
            key = tuple(x.shape)
            self.calls[key] = self.calls.get(key, 0) + 1
            if self.calls[key] <= 3:  # the first 3 calls of each input shape are slow
                time.sleep(0.2)
        return self.fc(x)

def build():
    return SlowStart()
"""


# --- the JSON -------------------------------------------------------------------------------------


def test_json_structure_and_types(runner):
    args = ["benchmark", "convnet", "-i", "1,28,28", "-b", "1,4", "--mode", "both", *FAST]
    result = runner.invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["model"] == "convnet" and data["source"] == "built-in"
    assert data["input_size"] == [1, 28, 28] and data["device"] == "cpu"
    assert data["threads"] == torch.get_num_threads()
    counted = summarize(bench_run_model("convnet", (1, 28, 28)), [(1, 1, 28, 28)])
    assert data["mult_adds_per_image"] == counted.total_mult_adds > 0
    assert data["flops_per_image"] == counted.flops > 0
    assert data["params"] == counted.total_params
    assert data["batch_size_search"] == []
    assert data["settings"]["modes"] == ["infer", "train"]
    assert data["settings"]["iters"] == 2 and data["settings"]["warmup"] == 1

    rows = data["results"]
    assert [(r["mode"], r["batch_size"]) for r in rows] == [
        ("infer", 1),
        ("infer", 4),
        ("train", 1),
        ("train", 4),
    ]
    types = {
        "model": str,
        "mode": str,
        "batch_size": int,
        "input_size": str,
        "device": str,
        "device_name": str,
        "dtype": str,
        "amp": bool,
        "channels_last": bool,
        "compile": bool,
        "threads": int,
        "warmup": int,
        "iters": int,
        "timed_s": float,
        "images_per_s": float,
        "latency_median_ms": float,
        "latency_p90_ms": float,
        "peak_memory_mb": float,
        "memory_kind": str,
        "mult_adds_per_image": int,
        "flops_per_image": int,
        "step_flops_per_image": int,
        "tflops": float,
        "torch_version": str,
        "timestamp": str,
        "spec": str,
    }
    assert list(types) == list(COLUMNS)
    for row in rows:
        assert list(row) == list(COLUMNS)
        for key, kind in types.items():
            assert type(row[key]) is kind, (key, row[key])
        assert row["input_size"] == "1x28x28" and row["dtype"] == "float32"
        assert row["iters"] == 2 and row["memory_kind"] == "cpu_rss_growth"
        assert row["peak_memory_mb"] >= 0
        assert 0 < row["latency_median_ms"] <= row["latency_p90_ms"] * 1.0001
        assert math.isclose(
            row["images_per_s"], row["batch_size"] * row["iters"] / row["timed_s"], rel_tol=0.01
        )
        factor = 3 if row["mode"] == "train" else 1
        assert row["step_flops_per_image"] == factor * row["flops_per_image"]
        expected = row["step_flops_per_image"] * row["images_per_s"] / 1e12
        assert math.isclose(row["tflops"], expected, rel_tol=0.01, abs_tol=1e-6)
        assert row["timestamp"].endswith("Z")


def bench_run_model(spec: str, sample: tuple[int, ...]) -> nn.Module:
    from torchkit.core.models import resolve_model

    return resolve_model(spec, in_channels=sample[0], image_size=sample[1:]).model


def test_table_and_csv_formats(runner):
    args = ["benchmark", "convnet", "-i", "1,28,28", "-b", "2", *FAST]
    table = runner.invoke(app, args)
    assert table.exit_code == 0, table.stderr
    assert "Images/s" in table.stdout and "TFLOP/s" in table.stdout and "convnet" in table.stdout
    as_csv = runner.invoke(app, [*args, "--format", "csv"])
    assert as_csv.exit_code == 0, as_csv.stderr
    rows = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert len(rows) == 1 and list(rows[0]) == list(COLUMNS)
    assert rows[0]["mode"] == "infer" and rows[0]["batch_size"] == "2"


def test_random_weights_are_a_note_after_the_results(runner, tmp_path):
    """Before: nothing said the model had random weights (export warned, predict refused)."""
    args = ["benchmark", "convnet", "-i", "1,12,12", "-b", "1", *FAST, "--format", "json"]
    random = runner.invoke(app, args)
    assert random.exit_code == 0, random.stderr
    assert random.stderr.splitlines() == [
        "Note: convnet has random weights (no --weights given): fine for a benchmark (speeds do "
        "not depend on them)"
    ]
    weights = tmp_path / "weights.pt"
    torch.save(bench_run_model("convnet", (1, 12, 12)).state_dict(), weights)
    trained = runner.invoke(app, [*args, "--weights", str(weights)])
    assert trained.exit_code == 0, trained.stderr
    assert "random weights" not in trained.stderr


def test_train_mode_of_a_traced_torchscript_file_warns_it_runs_as_exported(runner, tmp_path):
    """Before: `--mode train` of a traced file timed it silently, though tracing fixed its
    dropout (and BatchNorm) in eval mode: the "train" step was not the model's training."""
    model = nn.Sequential(tiny_conv(1), nn.Dropout(0.9)).eval()
    sample = torch.randn(2, 1, 8, 8)
    traced = torch.jit.trace(model, sample)
    traced.train()
    assert torch.equal(traced(sample), traced(sample))  # no dropout in train mode: as traced
    path = tmp_path / "traced.pt"
    torch.jit.save(traced, str(path))
    args = ["benchmark", str(path), "--trust-checkpoint", "-i", "1,8,8", "-b", "2", *FAST]
    train = runner.invoke(app, [*args, "--mode", "train", "--format", "json"])
    assert train.exit_code == 0, train.stderr
    assert json.loads(train.stdout)["results"][0]["mode"] == "train"
    assert train.stderr.splitlines() == [
        f"Warning: {path} is TorchScript: --mode train times it as it was exported (a traced "
        "model keeps the eval-mode BatchNorm and dropout it was traced with), not as the model "
        "trains; benchmark the checkpoint it came from for training figures"
    ]
    infer = runner.invoke(app, [*args, "--format", "json"])
    assert infer.exit_code == 0 and "Warning" not in infer.stderr, infer.stderr


def test_a_torchscript_file_of_a_fixed_batch_is_timed_at_its_batch_also_unasked_others_refused(
    runner, tmp_path
):
    """Before: the FLOP count ran the file at batch 1, which `export --static-batch -b 3` files
    refuse: every --batch-size ended in 'ShapeChecked cannot run on an input of shape (1, ...):
    expected a batch of 3, got 1 (check --input-size)'. Now batch 3 is timed, its counts per
    image (as the model's own), and another batch or a search is one usage error. Without
    --batch-size it was then refused ('takes batches of 3 only ..., not 32': the default batch
    taken as asked for); it is timed at 3, as summary counts it."""
    path = tmp_path / "fixed.ts"
    exported = runner.invoke(
        app,
        ["export", "nets:TinyNet", str(path), "--image-size", "8", "--static-batch", "-b", "3"],
    )
    assert exported.exit_code == 0, exported.stderr
    args = ["benchmark", str(path), "--trust-checkpoint", "--device", "cpu", "--iters", "1"]
    timed = runner.invoke(app, [*args, "-b", "3", "--warmup", "0", "--format", "json"])
    assert timed.exit_code == 0, timed.stderr
    data = json.loads(timed.stdout)
    counted = summarize(TinyNet(), [(1, 3, 8, 8)], count_flops=True)
    assert data["flops_per_image"] == counted.flops
    assert [row["batch_size"] for row in data["results"]] == [3]
    hint = "(give --batch-size 3, or export it without --static-batch)"
    other = runner.invoke(app, [*args, "-b", "1,3"])
    assert other.exit_code == 2 and other.stdout == ""
    assert error_line(other.stderr) == (
        f"Error: {path} takes batches of 3 only (exported with --static-batch), not 1 {hint}"
    )
    search = runner.invoke(app, [*args, "--find-batch-size"])
    assert search.exit_code == 2
    assert error_line(search.stderr) == (
        f"Error: --find-batch-size cannot search {path}: it takes batches of 3 only {hint}"
    )
    unasked = runner.invoke(app, [*args, "--warmup", "0", "--format", "json"])
    assert unasked.exit_code == 0, unasked.stderr
    assert [row["batch_size"] for row in json.loads(unasked.stdout)["results"]] == [3]


def traced_conv_benchmark(path: Path, dtype: torch.dtype) -> tuple[Path, list[str]]:
    """A traced tiny convnet in `dtype` saved at `path`, and the benchmark arguments that time
    it briefly on 1x8x8 images."""
    traced = torch.jit.trace(tiny_conv(1).eval().to(dtype), torch.randn(2, 1, 8, 8, dtype=dtype))
    torch.jit.save(traced, str(path))
    return path, ["benchmark", str(path), "--trust-checkpoint", "-i", "1,8,8", "-b", "2", *FAST]


def test_a_float16_torchscript_file_is_timed_on_float16_images(runner, tmp_path):
    """`export --dtype float16` writes float16 weights; benchmark fed the file float32 images
    and ended in 'torchscript fails in infer mode at batch 2 ...: RuntimeError: Input type
    (torch.FloatTensor) and weight type (torch.HalfTensor) should be the same', in both modes,
    though its row says float16."""
    path, args = traced_conv_benchmark(tmp_path / "half.ts", torch.float16)
    result = runner.invoke(app, [*args, "--mode", "both", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    rows = json.loads(result.stdout)["results"]
    assert [(row["mode"], row["dtype"]) for row in rows] == [
        ("infer", "float16"),
        ("train", "float16"),
    ]


def test_amp_of_weights_in_another_half_precision_is_a_usage_error(runner, tmp_path):
    """Autocast casts float32 tensors only: `--amp` (bfloat16 on the CPU) of a float16 file
    ended in 'fails in infer mode ...: Input type (CPUBFloat16Type) and weight type
    (torch.HalfTensor) should be the same (check --input-size, --batch-size and --mode)'."""
    path, args = traced_conv_benchmark(tmp_path / "half.ts", torch.float16)
    refused = runner.invoke(app, [*args, "--amp"])
    assert refused.exit_code == 2, refused.stderr
    assert error_line(refused.stderr) == (
        f"Error: --amp runs in bfloat16, but the weights of {path} are float16 already: "
        "autocast casts float32 only (drop --amp, as the model runs in float16 already, or "
        "give --amp-dtype fp16)"
    )
    same = runner.invoke(app, [*args, "--amp", "--amp-dtype", "fp16", "--format", "json"])
    assert same.exit_code == 0, same.stderr
    assert json.loads(same.stdout)["results"][0]["dtype"] == "float16"


def test_compile_of_a_torchscript_file_is_a_usage_error(runner, tmp_path):
    """`--compile` of a TorchScript file ended in torch's own refusal, as an unexpected error:
    'Error: RuntimeError: torch.compile does not support compiling torch.jit.script ... (set
    TORCHKIT_DEBUG=1 to see the traceback)', exit 1."""
    path, args = traced_conv_benchmark(tmp_path / "traced.ts", torch.float32)
    result = runner.invoke(app, [*args, "--compile"])
    assert result.exit_code == 2, result.stderr
    assert error_line(result.stderr) == (
        f"Error: --compile cannot compile {path}: it is TorchScript, which torch.compile "
        "refuses (drop --compile; TorchScript runs through its own JIT)"
    )


def test_compile_goes_through_the_filter_of_torchs_no_cuda_runtime_warning(runner, monkeypatch):
    # benchmark --compile called torch.compile itself, so a CPU run on a machine with a CUDA
    # toolkit printed torch's "No CUDA runtime is found" (train already dropped it).
    import logging

    compiled = []
    monkeypatch.setattr(torch, "compile", lambda model, **kw: compiled.append(kw) or model)
    logger = logging.getLogger("torch.utils.cpp_extension")
    monkeypatch.setattr(logger, "filters", [])
    args = ["benchmark", "convnet", "-i", "1,12,12", "-b", "2", *FAST, "--compile"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    assert compiled == [{"dynamic": False}]
    record = logger.makeRecord(logger.name, logging.WARNING, "", 0, "No CUDA runtime is found, "
                               "using CUDA_HOME='/usr/local'", (), None)  # fmt: skip
    assert not logger.filter(record)


def test_ctrl_c_shows_the_configurations_already_timed(runner, monkeypatch, tmp_path):
    # Interrupted in the third of four configurations: the two timed ones were lost with it
    # (only "Interrupted." was printed).
    real_time_steps, calls, interrupt_at = bench_run.time_steps, [], [3]

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == interrupt_at[0]:
            raise KeyboardInterrupt
        return real_time_steps(*args, **kwargs)

    monkeypatch.setattr(bench_run, "time_steps", interrupted)
    monkeypatch.setattr(bench_memory, "release_free_memory", lambda: None)  # 0.4 s a gc
    args = ["benchmark", "convnet", "-i", "1,12,12", "-b", "1,2,3,4", *FAST]
    result = runner.invoke(app, [*args, "--format", "csv"])
    assert result.exit_code == 130
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [(row["mode"], row["batch_size"]) for row in rows] == [("infer", "1"), ("infer", "2")]
    assert "interrupted: the 2 of 4 configuration(s) timed so far are shown" in result.stderr
    assert result.stderr.splitlines()[-1] == "Interrupted."

    calls.clear()  # interrupted before the first configuration was timed: -o FILE not written
    interrupt_at[0] = 1
    report = tmp_path / "bench.json"
    assert runner.invoke(app, [*args, "-o", str(report)]).exit_code == 130
    assert not report.exists()


def test_a_stopped_run_writes_what_it_timed_to_its_output_file(runner, monkeypatch, tmp_path):
    """With -o FILE the configurations timed before Ctrl-C or an error were lost (the file was
    not written, and nothing shown): they are written, JSON saying the run is not complete,
    and the command still ends as it would have."""
    real_time_steps, calls, stop = bench_run.time_steps, [], {}

    def stopping(*args, **kwargs):
        calls.append(1)
        if len(calls) == stop["at"]:
            raise stop["with"]
        return real_time_steps(*args, **kwargs)

    monkeypatch.setattr(bench_run, "time_steps", stopping)
    monkeypatch.setattr(bench_memory, "release_free_memory", lambda: None)  # 0.4 s a gc
    args = ["benchmark", "convnet", "-i", "1,12,12", "-b", "1,2,3", *FAST]
    report = tmp_path / "bench.json"

    calls.clear()
    stop.update({"at": 3, "with": KeyboardInterrupt})
    result = runner.invoke(app, [*args, "-o", str(report)])
    assert result.exit_code == 130
    data = json.loads(report.read_text())
    assert [row["batch_size"] for row in data["results"]] == [1, 2]
    assert (data["complete"], data["stopped"], data["error"]) == (False, "interrupted", None)
    assert f"the 2 of 3 configuration(s) timed so far are written to {report}" in result.stderr

    calls.clear()
    stop.update({"at": 2, "with": TorchkitError("the disk caught fire", "put it out")})
    result = runner.invoke(app, [*args, "-o", str(report), "--force"])
    assert result.exit_code == 1
    data = json.loads(report.read_text())
    assert [row["batch_size"] for row in data["results"]] == [1]
    assert data["complete"] is False and data["stopped"] == "failed"
    assert data["error"] == "the disk caught fire (put it out)"
    assert error_line(result.stderr) == "Error: the disk caught fire (put it out)"

    table = tmp_path / "bench.txt"  # the table says so in its title
    calls.clear()
    result = runner.invoke(app, [*args, "-o", str(table)])
    assert result.exit_code == 1
    assert "failed after 1 of 3 configurations" in " ".join(table.read_text().split())

    log = tmp_path / "bench.csv"  # --append adds the rows timed
    calls.clear()
    stop.update({"at": 3, "with": KeyboardInterrupt})
    assert runner.invoke(app, [*args, "-o", str(log), "--append"]).exit_code == 130
    rows = list(csv.DictReader(io.StringIO(log.read_text())))
    assert [row["batch_size"] for row in rows] == ["1", "2"]

    calls.clear()  # a run that is not stopped says it is complete
    stop["at"] = 0
    assert runner.invoke(app, [*args, "-o", str(report), "--force"]).exit_code == 0
    data = json.loads(report.read_text())
    assert (data["complete"], data["stopped"], data["error"]) == (True, None, None)
    assert len(data["results"]) == 3


STALLS_AT_BATCH_2 = """
import os
import time
from torch import nn

class StallsAtBatch2(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        if x.device.type != "meta" and x.shape[0] == 2:
            open(os.environ["BENCH_STALLED"], "w").close()
            time.sleep(600)  # until the test's SIGTERM
        return self.fc(x)

def build():
    return StallsAtBatch2()
"""


def test_sigterm_writes_the_configurations_timed_to_the_output_file(tmp_path):
    """A scheduler's SIGTERM in the second configuration: the first one's row is in -o FILE,
    marked as not complete, and the command exits 143 as every terminated command does."""
    (tmp_path / "stalls.py").write_text(STALLS_AT_BATCH_2)
    stalled, report = tmp_path / "stalled", tmp_path / "bench.json"
    args = ["benchmark", "stalls:build", "-i", "8", "-b", "1,2", *FAST, "-o", str(report)]
    process = start_torchkit_process(*args, cwd=tmp_path, env={"BENCH_STALLED": str(stalled)})
    wait_until(stalled.exists, process=process, what="the second configuration")
    code, _, err = signal_and_wait(process, signal.SIGTERM, timeout=60)
    assert code == 143, err
    assert err.splitlines()[-1] == "Terminated." and "Traceback" not in err
    data = json.loads(report.read_text())
    assert [row["batch_size"] for row in data["results"]] == [1]
    assert (data["complete"], data["stopped"]) == (False, "terminated")


# --- timing -----------------------------------------------------------------------------------


def test_timing_loop_excludes_the_warmup_and_syncs_after_each_step():
    now = [0.0]
    calls = []

    def step():
        calls.append("step")
        now[0] += 10.0 if calls.count("step") <= 2 else 1.0  # two slow warm-up steps

    def sync():
        calls.append("sync")

    timings = time_steps(step, warmup=2, iters=3, sync=sync, clock=lambda: now[0])
    assert timings.steps == (1.0, 1.0, 1.0) and timings.total == 3.0
    assert calls == ["step", "step", "sync"] + ["step", "sync"] * 3
    assert timings.per_second(8) == 8.0


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--iters", "99999999999999999999"], "Error: --iters 99999999999999999999 is out of "
         "range (give a whole number from 1 to 10,000,000)"),
        (["--warmup", "10000001"], "Error: --warmup 10000001 is out of range (give a whole "
         "number from 0 to 10,000,000)"),
        (["--seconds", "1e20"], "Error: --seconds 1e+20 is more than a day of timing (give a "
         "number up to 86,400)"),
    ],
)  # fmt: skip
def test_a_budget_no_benchmark_could_finish_is_a_usage_error(runner, args, said):
    # --iters 99999999999999999999 (or --warmup, --seconds 1e20) timed on and on, never ending.
    refused = runner.invoke(app, ["benchmark", "nets:TinyNet", "--input-size", "3,8,8", *args])
    assert refused.exit_code == 2, refused.stdout
    assert error_line(refused.stderr) == said
    assert time_steps(lambda: None, warmup=0, iters=3).per_second(1) > 0
    with pytest.raises(UsageError, match="is out of range"):
        time_steps(lambda: None, warmup=0, iters=10_000_001)


def test_seconds_budget_runs_until_enough_timed_work():
    now = [0.0]

    def step():
        now[0] += 0.25

    timings = time_steps(step, warmup=4, seconds=1.0, clock=lambda: now[0])
    assert timings.iters == 4 and timings.total == 1.0
    assert time_steps(step, warmup=0, seconds=0.01, clock=lambda: now[0]).iters == 1
    with pytest.raises(UsageError):
        time_steps(step, warmup=0, iters=2, seconds=1.0)


def test_percentile_interpolates_like_numpy():
    import numpy as np

    values = [5.0, 1.0, 3.0, 2.0, 4.0, 10.0]
    for q in (0, 50, 90, 100):
        assert percentile(values, q) == pytest.approx(np.percentile(values, q))


def test_warmup_excluded_with_a_model_whose_first_calls_sleep(runner, model_module):
    spec = model_module(SLOW_START)
    args = ["benchmark", spec, "-i", "8", "-b", "4", "--device", "cpu", "--iters", "5"]
    warm = runner.invoke(app, [*args, "--warmup", "3", "--format", "json"])
    assert warm.exit_code == 0, warm.stderr
    (row,) = json.loads(warm.stdout)["results"]
    assert row["latency_median_ms"] < 100 and row["latency_p90_ms"] < 100, row
    # The same model without a warm-up: the slow calls are timed (so the check above is real).
    cold = runner.invoke(app, [*args, "--warmup", "0", "--format", "json"])
    assert cold.exit_code == 0, cold.stderr
    (row,) = json.loads(cold.stdout)["results"]
    assert row["latency_median_ms"] >= 190, row


def test_iters_counts_timed_steps_and_infer_runs_in_eval_and_inference_mode():
    model = Recorder()
    result = benchmark_model(model, (8,), options(batch_sizes=(4,), warmup=2, iters=3))
    (row,) = result.results
    assert row.iters == 3 and model.calls[(4, 8)] == 5  # 2 warm-up + 3 timed
    at_batch = [seen for seen in model.seen if seen[0] == 4]
    assert all(not training and inference for _, training, inference, _ in at_batch)


def test_seconds_runs_for_the_time_asked():
    model = Recorder(per_call=0.02)
    result = benchmark_model(model, (8,), options(batch_sizes=(2,), warmup=1, seconds=0.2))
    (row,) = result.results
    assert row.timed_s >= 0.2 and 2 <= row.iters <= 11, row
    assert model.calls[(2, 8)] == row.iters + 1


def test_batch_size_lists(runner):
    assert parse_batch_sizes("1,8,32") == (1, 8, 32)
    assert parse_batch_sizes(["2", "8,2", "16"]) == (2, 8, 16)
    args = ["benchmark", "convnet", "-i", "1,28,28", *FAST, "--format", "json"]
    result = runner.invoke(app, [*args, "-b", "3", "-b", "1,3"])
    assert result.exit_code == 0, result.stderr
    assert [r["batch_size"] for r in json.loads(result.stdout)["results"]] == [3, 1]


def test_a_batch_size_beyond_a_tensor_shape_is_a_usage_error(runner):
    # was exit 1: "convnet fails in infer mode at batch ...: TypeError: rand(): ... Overflow"
    args = ["benchmark", "convnet", "-i", "1,28,28", *FAST, "-b", f"2,{2**70}"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.stderr
    assert error_line(result.stderr) == (
        f"Error: --batch-size {2**70} is more than a batch can hold ({sys.maxsize})"
    )


def test_train_mode_includes_backward_and_the_optimizer_step():
    from torch.optim.optimizer import register_optimizer_step_post_hook

    steps = []

    def slow_step(optimizer, args, kwargs):
        steps.append(type(optimizer).__name__)
        time.sleep(0.03)

    model = Recorder()
    before = model.fc.weight.detach().clone()
    handle = register_optimizer_step_post_hook(slow_step)
    try:
        result = benchmark_model(model, (8,), options(batch_sizes=(4,), mode="train", iters=3))
    finally:
        handle.remove()
    (row,) = result.results
    assert row.mode == "train"
    # one step at batch 2 before the run (not measured), 1 warm-up, 3 timed: every one an SGD step
    assert steps == ["SGD"] * 5
    assert row.latency_median_ms >= 30  # the optimizer step is inside the timed region
    assert not torch.equal(before, model.fc.weight)  # ...and it really updated the weights
    at_batch = [seen for seen in model.seen if seen[0] == 4]
    assert at_batch and all(training and not inference for _, training, inference, _ in at_batch)
    assert model.fc.weight.grad is None  # gradients and optimizer state dropped afterwards


def test_train_mode_builds_and_steps_its_optimizer_without_torch_dynamo(monkeypatch):
    """The train step built and stepped torch.optim.SGD itself, whose decorated methods import
    torch._dynamo (and inductor and sympy: about 3 s of CPU a run) in a process that compiles
    nothing: now it takes the optimiser's own step as `train` does (core.runtime.dynamo_free).
    While the train step is built and while it runs, dynamo is a tripwire that records every
    name asked of it, as a process without dynamo would have imported it then (the rest of the
    run sees this process's own); the update is still taken (the weights move)."""
    from torchkit.core.runtime import dynamo_free

    monkeypatch.setattr(dynamo_free, "dynamo_loaded", lambda: False)
    asked, compiled = [], []

    class Tripwire(types.ModuleType):
        def __getattr__(self, name):
            asked.append(name)
            raise AttributeError(name)

    @contextlib.contextmanager
    def armed():
        with pytest.MonkeyPatch.context() as patch:
            tripwire = Tripwire("torch._dynamo")
            patch.setitem(sys.modules, "torch._dynamo", tripwire)
            patch.setattr(torch, "_dynamo", tripwire, raising=False)
            yield

    real_make = bench_run.make_train_step

    def make_armed(model, images, settings):
        compiled.append(settings.compile)
        with armed():
            train = real_make(model, images, settings)
        step = train.step

        def armed_step():
            with armed():
                return step()

        train.step = armed_step
        return train

    monkeypatch.setattr(bench_run, "make_train_step", make_armed)
    model = Recorder()
    before = model.fc.weight.detach().clone()
    result = benchmark_model(model, (8,), options(batch_sizes=(4,), mode="train", iters=2))
    assert asked == []
    assert compiled == [False, False]  # the step before the run (batch 2), then batch 4's
    assert [row.mode for row in result.results] == ["train"]
    assert not torch.equal(before, model.fc.weight)


def test_train_loss_covers_auxiliary_outputs_and_models_without_a_classifier():
    from torchkit.core.benchmark.steps import training_loss

    logits = torch.randn(4, 5, requires_grad=True)
    aux = torch.randn(4, 5, requires_grad=True)
    features = torch.randn(4, 3, 7, 7, requires_grad=True)
    labels = torch.tensor([0, 1, 2, 3])
    loss = training_loss((logits, aux, features), 4, lambda width: labels)
    loss.backward()
    assert logits.grad is not None and aux.grad is not None and features.grad is not None
    with pytest.raises(UsageError):
        training_loss(torch.zeros(4, dtype=torch.long), 4, lambda width: labels)


class ArgmaxOnly(nn.Module):
    """Answers class indices: nothing floating-point to train on."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(x).argmax(1)


def frozen() -> nn.Module:
    return Recorder().requires_grad_(False)


@pytest.mark.parametrize(
    ("build", "reason"),
    [(frozen, "no trainable parameters"), (ArgmaxOnly, "no floating-point tensor")],
)
def test_mode_both_of_a_model_that_cannot_train_stops_before_timing_infer(build, reason):
    """`--mode both` timed every infer configuration first, then stopped with the train mode's
    usage error (exit 2), the infer figures lost: the error comes before any timing."""
    timed = []
    with pytest.raises(UsageError, match=reason):
        benchmark_model(build(), (8,), options(mode="both", batch_sizes=(2, 4)), timed=timed.append)
    assert timed == []


# --- --find-batch-size -----------------------------------------------------------------------


def synthetic(limit_mb: float, per_image_mb: float = 1.0, fixed_mb: float = 5.0):
    def try_batch(batch: int, trials: list) -> Trial:
        peak = fixed_mb + per_image_mb * batch
        fits = peak <= limit_mb
        return Trial(batch, fits, peak, "fits" if fits else OVER_LIMIT)

    return try_batch


def test_search_doubles_then_bisects_to_the_largest_batch_that_fits():
    found, stopped_by, trials = search_batch_size(
        synthetic(105.0), start=1, max_batch=4096, precision=0
    )
    assert found == 100 and stopped_by == OVER_LIMIT
    tried = [t.batch_size for t in trials]
    assert tried[:8] == [1, 2, 4, 8, 16, 32, 64, 128]
    assert tried[8:] == [96, 112, 104, 100, 102, 101]


def test_search_stops_at_out_of_memory_and_at_the_max_batch():
    def oom_above_48(batch: int, trials: list) -> Trial:
        return Trial(batch, batch <= 48, None, "fits" if batch <= 48 else OUT_OF_MEMORY)

    assert search_batch_size(oom_above_48, start=4, max_batch=1000)[:2] == (48, OUT_OF_MEMORY)
    found, stopped_by, trials = search_batch_size(synthetic(1e9), start=3, max_batch=20)
    assert (found, stopped_by) == (20, "max batch size")
    assert [t.batch_size for t in trials] == [3, 6, 12, 20]
    with pytest.raises(TorchkitError, match="batch 8 does not fit"):
        search_batch_size(synthetic(1.0), start=8, max_batch=64)


def test_find_batch_size_on_cpu_with_a_memory_limit(runner):
    args = ["benchmark", "convnet", "-i", "1,28,28", *FAST, "--find-batch-size"]
    result = runner.invoke(
        app, [*args, "--memory-limit", "10MB", "--max-batch-size", "1024", "--format", "json"]
    )
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    (search,) = data["batch_size_search"]
    (row,) = data["results"]
    assert search["mode"] == "infer" and search["memory_limit_mb"] == 10.0
    assert row["batch_size"] == search["batch_size"] >= 1
    assert search["stopped_by"] in (OVER_LIMIT, "max batch size")
    trials = search["trials"]
    assert trials[0]["batch_size"] == 1  # the search starts at 1 without --batch-size
    chosen = [t for t in trials if t["batch_size"] == search["batch_size"]]
    assert chosen and chosen[-1]["fits"] and chosen[-1]["peak_memory_mb"] <= 10.0
    larger = [t for t in trials if t["batch_size"] > search["batch_size"]]
    assert all(not t["fits"] for t in larger)
    for trial in trials:
        assert set(trial) == {"batch_size", "fits", "peak_memory_mb", "reason"}


def test_find_batch_size_stops_at_out_of_memory():
    class OutOfMemoryAbove48(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 4)

        def forward(self, x):
            if x.shape[0] > 48:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return self.fc(x)

    opts = options(batch_sizes=(4,), find_batch_size=True, memory_limit="100%")
    result = benchmark_model(OutOfMemoryAbove48(), (8,), opts)
    (search,) = result.batch_size_search
    assert (search.batch_size, search.stopped_by) == (48, OUT_OF_MEMORY)
    assert result.results[0].batch_size == 48


def test_find_batch_size_in_train_mode_goes_past_a_batch_too_small_for_batchnorm():
    # One image through BatchNorm1d: 1 value per channel, which training refuses.
    model = nn.Sequential(nn.Linear(8, 4), nn.BatchNorm1d(4), nn.Linear(4, 3))
    opts = options(mode="train", batch_sizes=(1,), find_batch_size=True, max_batch_size=2)
    result = benchmark_model(model, (8,), opts)
    (search,) = result.batch_size_search
    assert [(t.batch_size, t.reason) for t in search.trials] == [(1, TOO_SMALL), (2, "fits")]
    assert (search.batch_size, search.stopped_by, search.not_fitting) == (2, "max batch size", None)
    assert result.results[0].batch_size == 2

    def too_small(batch: int, trials: list) -> Trial:
        return Trial(batch, False, None, TOO_SMALL)

    with pytest.raises(TorchkitError, match="batch 1 does not fit: too small to train"):
        search_batch_size(too_small, start=1, max_batch=1)


class OneTimeCache(nn.Module):
    """Keeps 30 MB it fills on its first call, as oneDNN's kernels and caches are made once in a
    process: memory no batch size changes."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.cache = None

    def forward(self, x):
        if x.device.type != "meta" and self.cache is None:
            self.cache = torch.ones(30 * 10**6 // 4)
        return self.fc(x)


def test_find_batch_size_with_warmup_0_does_not_count_one_time_memory_against_the_limit():
    """With --warmup 0 nothing primed the process before the search, so its first trial counted
    the one-time allocations: 'batch 1 does not fit: over the memory limit (30.0 MB)' at a
    20 MB limit where --warmup 1 found a batch. The search's trials run untimed anyway."""
    opts = options(warmup=0, batch_sizes=(1,), find_batch_size=True, memory_limit="20MB")
    opts.max_batch_size = 4
    result = benchmark_model(OneTimeCache(), (8,), opts)
    (search,) = result.batch_size_search
    assert (search.batch_size, search.stopped_by) == (4, "max batch size")
    assert result.results[0].warmup == 0


def test_find_batch_size_does_not_run_a_batch_predicted_not_to_fit(monkeypatch):
    monkeypatch.setattr(bench_run, "available_memory", lambda: 400 * 10**6)
    tried = []

    def trial(self, mode, batch, limit):
        tried.append(batch)
        return Trial(batch, True, 100.0 * batch, "fits")  # 100 MB per image

    monkeypatch.setattr(bench_run._Context, "trial", trial)
    opts = options(batch_sizes=(1,), find_batch_size=True, memory_limit="10GB")
    result = benchmark_model(Recorder(), (8,), opts)
    (search,) = result.batch_size_search
    assert tried == [1, 2, 3]  # 4 would need 400 MB > 90% of the 400 MB available
    assert search.batch_size == 3 and search.stopped_by == PREDICTED_OVER


def test_memory_limit_sizes_and_percentages(monkeypatch):
    assert parse_memory_limit("2GB").bytes == 2 * 10**9
    assert parse_memory_limit("512MiB").bytes == 512 * 2**20
    assert parse_memory_limit("1.5g").bytes == 3 * 2**29  # as every size option: 1.5 GiB
    assert parse_memory_limit("1000000").bytes == 10**6
    half = parse_memory_limit("50%")
    assert half.fraction == 0.5
    monkeypatch.setattr(bench_memory, "available_memory", lambda: 8 * 10**9)
    assert half.resolve(torch.device("cpu")) == 4 * 10**9
    for bad in ("lots", "0", "-1GB", "150%", "0%", "5XB", "1e400GB", "1e400"):  # > 2^63-1
        with pytest.raises(UsageError):
            parse_memory_limit(bad)


def test_cpu_peak_memory_sees_a_large_temporary_tensor():
    class Hungry(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 4)

        def forward(self, x):
            if x.device.type != "meta":
                scratch = torch.ones(50_000_000)  # 200 MB, freed at once
                del scratch
            return self.fc(x)

    if bench_memory.rss_bytes() is None:
        pytest.skip("no /proc/self/statm here")
    result = benchmark_model(Hungry(), (8,), options(batch_sizes=(2,)))
    assert result.results[0].peak_memory_mb >= 150


# --- CUDA, mocked ----------------------------------------------------------------------------


def test_cuda_probe_reports_max_memory_allocated(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty"))
    monkeypatch.setattr(
        torch.cuda, "reset_peak_memory_stats", lambda device=None: calls.append("reset")
    )
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 123_456_789)
    probe = MemoryProbe(torch.device("cuda", 0))
    assert probe.kind == "cuda_max_allocated"
    probe.start()
    assert calls == ["sync", "empty", "reset"]
    assert probe.stop() == 123_456_789 and calls[-1] == "sync"


def test_mps_peak_is_the_memory_allocated_on_the_gpu_not_the_cpus_rss(monkeypatch):
    """On --device mps the rows reported the growth of the CPU process's RSS as their peak
    (memory_kind cpu_rss_growth): MPS keeps no peak, so the GPU's allocation is sampled."""
    readings, calls, sampled = iter([100 * 10**6, 700 * 10**6]), [], threading.Event()

    def allocated() -> int:
        value = next(readings, None)
        if value is None:  # both read: the probe's own thread has seen the peak
            sampled.set()
            return 150 * 10**6
        return value

    monkeypatch.setattr(torch.mps, "current_allocated_memory", allocated)
    monkeypatch.setattr(torch.mps, "synchronize", lambda: calls.append("sync"))
    monkeypatch.setattr(torch.mps, "empty_cache", lambda: calls.append("empty"))
    monkeypatch.setattr(bench_memory, "rss_bytes", lambda: pytest.fail("read the CPU's RSS"))
    probe = MemoryProbe(torch.device("mps"))
    assert probe.kind == "mps_allocated_sampled"
    probe.start()
    assert calls == ["sync", "empty"]
    assert sampled.wait(timeout=30)
    assert probe.stop() == 700 * 10**6 and calls[-1] == "sync"


def test_cpu_peak_is_sampled_where_the_rss_peak_cannot_be_reset(monkeypatch):
    readings, sampled = iter([50 * 10**6, 60 * 10**6, 400 * 10**6]), threading.Event()

    def rss() -> int:
        value = next(readings, None)
        if value is None:
            sampled.set()
            return 70 * 10**6
        return value

    monkeypatch.setattr(bench_memory, "rss_bytes", rss)
    monkeypatch.setattr(bench_memory, "_reset_rss_peak", lambda: False)  # not Linux's VmHWM
    monkeypatch.setattr(bench_memory, "release_free_memory", lambda: None)
    probe = MemoryProbe(torch.device("cpu"))
    probe.start()
    assert sampled.wait(timeout=30)
    assert probe.stop() == 350 * 10**6  # the peak less the RSS at the start


def test_cuda_steps_are_synchronised(monkeypatch):
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    sync = bench_run._sync(torch.device("cuda", 1))
    sync()
    assert synced == [torch.device("cuda", 1)]
    assert bench_run._sync(torch.device("cpu")) is None


def test_cuda_percentage_limit_is_of_the_gpu_memory(monkeypatch):
    class Properties:
        total_memory = 80 * 10**9

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Properties())
    limit = parse_memory_limit("25%").resolve(torch.device("cuda", 0))
    assert limit == 20 * 10**9
    assert bench_run._limit_bytes(None, torch.device("cuda", 0)) is None  # OOM decides


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_real_gpu(runner):
    args = ["benchmark", "convnet", "--device", "cuda", "-b", "8", "--mode", "both"]
    result = runner.invoke(app, [*args, "--amp", "--iters", "3", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    for row in json.loads(result.stdout)["results"]:
        assert row["memory_kind"] == "cuda_max_allocated" and row["peak_memory_mb"] > 0
        assert row["device"].startswith("cuda") and row["amp"] is True


# --- --append ---------------------------------------------------------------------------------


def test_append_adds_rows_under_one_header(runner, tmp_path):
    out = tmp_path / "bench.csv"
    args = ["benchmark", "convnet", "-i", "1,28,28", "-b", "1,2", *FAST, "-o", str(out)]
    first = runner.invoke(app, [*args, "--append"])
    assert first.exit_code == 0, first.stderr
    second = runner.invoke(app, [*args, "--append", "--mode", "train"])
    assert second.exit_code == 0, second.stderr
    rows = list(csv.DictReader(out.open()))
    assert [(r["mode"], r["batch_size"]) for r in rows] == [
        ("infer", "1"),
        ("infer", "2"),
        ("train", "1"),
        ("train", "2"),
    ]
    assert out.read_text().count("model,mode,batch_size") == 1
    # Without --append an existing file is refused (and left alone), as everywhere.
    refused = runner.invoke(app, args)
    assert refused.exit_code == 1 and "already exists" in error_line(refused.stderr)
    assert len(list(csv.DictReader(out.open()))) == 4


def test_append_follows_the_files_column_order(runner, tmp_path):
    out = tmp_path / "bench.csv"
    shuffled = list(reversed(COLUMNS))
    out.write_text(",".join(shuffled) + "\n")
    args = ["benchmark", "convnet", "-i", "1,28,28", "-b", "2", *FAST, "-o", str(out)]
    result = runner.invoke(app, [*args, "--append"])
    assert result.exit_code == 0, result.stderr
    (row,) = list(csv.DictReader(out.open()))
    assert list(row) == shuffled and row["batch_size"] == "2" and row["model"] == "convnet"


def test_append_to_a_file_with_other_columns_is_refused_before_any_work(runner, tmp_path):
    out = tmp_path / "other.csv"
    out.write_text("model,images_per_s,gpu\nresnet50,100.0,A100\n")
    before = out.read_bytes()
    args = ["benchmark", "convnet", "-i", "1,28,28", *FAST, "-o", str(out), "--append"]
    start = time.perf_counter()
    result = runner.invoke(app, args)
    assert result.exit_code == 1
    line = error_line(result.stderr)
    assert "columns differ" in line and "missing mode" in line and "gpu" in line
    assert line.endswith(
        "(write to a new file with -o NEW.csv, or compare with the torchkit that wrote it)"
    )
    assert out.read_bytes() == before
    assert time.perf_counter() - start < 5  # refused before the model was benchmarked


def test_append_to_a_file_with_other_hard_links_is_refused(runner, tmp_path):
    """Appending replaces the file whole: its other hard links kept the old rows (`>>` adds to
    every name). Refused before any work, and under the lock (another link made meanwhile)."""
    from torchkit.core.benchmark.report import append_csv

    out = tmp_path / "bench.csv"
    out.write_text(",".join(COLUMNS) + "\n")
    os.link(out, tmp_path / "other-name.csv")
    before = out.read_bytes()
    args = ["benchmark", "convnet", "-i", "1,28,28", *FAST, "-o", str(out), "--append"]
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.stderr
    line = error_line(result.stderr)
    assert f"cannot append to {out}: it has 2 hard links" in line, line
    assert line.endswith("(write to a new file with -o NEW.csv)")
    with pytest.raises(OutputExistsError, match="it has 2 hard links"):
        append_csv(out, ",".join(COLUMNS) + "\n" + "," * (len(COLUMNS) - 1) + "\n")
    assert out.read_bytes() == before and os.stat(out).st_nlink == 2


def test_append_leaves_the_file_whole_when_the_write_fails(runner, tmp_path, monkeypatch):
    import errno

    out = tmp_path / "bench.csv"
    args = ["benchmark", "convnet", "-i", "1,28,28", "-b", "1", *FAST, "-o", str(out), "--append"]
    assert runner.invoke(app, args).exit_code == 0
    before = out.read_bytes()

    def full_disk(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device", str(dst))

    monkeypatch.setattr(os, "replace", full_disk)
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and "No space left" in error_line(result.stderr)
    monkeypatch.undo()
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.csv"]  # no temporary left


BUILT_MARKER = """
from pathlib import Path
from torch import nn

def build():
    Path("built").touch()  # in the working directory: the test's tmp_path
    return nn.Linear(8, 4)
"""


@pytest.mark.parametrize("where", ["read-only", "missing-in-read-only", "existing", "folder"])
def test_an_output_it_cannot_write_is_refused_before_the_model_is_built(
    runner, tmp_path, small_tmpfs, model_module, where
):
    """-o FILE in a folder that takes no file (a read-only disk, or a folder to be made on one)
    was found only when the results of the whole run were written: it is refused with the
    other checks of -o (an existing file without --force, a folder), before the model is built
    and anything timed. --append is held to the same rules."""
    spec = model_module(BUILT_MARKER)
    if where in ("read-only", "missing-in-read-only"):
        disk = small_tmpfs(64)
        (disk / "old.csv").write_text("x\n")
        done = subprocess.run(["mount", "-o", "remount,ro", str(disk)], capture_output=True)
        if done.returncode != 0:
            pytest.skip("cannot remount the tmpfs read-only")
        out = disk / ("bench.csv" if where == "read-only" else "new/bench.csv")
        expected, code = "Read-only file system", 1
    elif where == "existing":
        out = tmp_path / "bench.csv"
        out.write_text("x\n")
        expected, code = "already exists", 1
    else:
        out = tmp_path / "folder"
        out.mkdir()
        expected, code = "is a folder, not a file", 2
    args = ["benchmark", spec, "-i", "8", *FAST, "-o", str(out)]
    for extra in ([], ["--append"]) if where != "existing" else ([],):
        result = runner.invoke(app, [*args, *extra])
        assert result.exit_code == code, (extra, result.stderr)
        assert expected in error_line(result.stderr, besides="nothing"), extra
        assert "benchmarking" not in result.stderr
        assert not (tmp_path / "built").exists(), extra  # the model was never built
    if where == "existing":
        assert out.read_text() == "x\n"
    elif where != "folder":
        assert os.listdir(disk) == ["old.csv"]  # no probe nor folder left


# --- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [
        ["--iters", "0"],
        ["--iters", "2", "--seconds", "1"],
        ["--seconds", "0"],
        ["-b", "0"],
        ["-b", "a,b"],
        ["--mode", "fast"],
        ["--amp-dtype", "fp16"],
        ["--memory-limit", "1GB"],
        ["--max-batch-size", "8"],  # only --find-batch-size reads it
        ["--find-batch-size", "-b", "1,2"],
        ["--find-batch-size", "--memory-limit", "lots"],
        ["--find-batch-size", "-b", "64", "--max-batch-size", "32"],
        ["--append"],
        ["--append", "-o", "x.csv", "--format", "json"],
        ["--compile", "--warmup", "0"],
        ["-i", "3,28"],
        ["-i", "3,x,28"],
    ],
)
def test_bad_options_exit_2_with_one_error_line(runner, extra):
    result = runner.invoke(app, ["benchmark", "convnet", "--device", "cpu", *extra])
    assert result.exit_code == 2, (extra, result.stdout, result.stderr)
    error_line(result.stderr, besides="nothing")


def test_compile_without_warmup_says_why_warmup_is_needed(runner):
    result = runner.invoke(app, ["benchmark", "convnet", "--compile", "--warmup", "0"])
    assert result.exit_code == 2
    assert error_line(result.stderr, besides="nothing") == (
        "Error: --compile with --warmup 0 would time the compilation (give --warmup 1 or more: "
        "the first steps compile)"
    )


def test_a_model_that_fails_is_one_error_line(runner, model_module):
    spec = model_module(
        "from torch import nn\n"
        "class Broken(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = nn.Linear(8, 4)\n"
        "    def forward(self, x):\n"
        "        if x.device.type != 'meta' and x.shape[0] == 4:\n"
        "            raise RuntimeError('shapes do not match\\nmore detail')\n"
        "        return self.fc(x)\n"
        "def build():\n"
        "    return Broken()\n"
    )
    result = runner.invoke(app, ["benchmark", spec, "-i", "8", "-b", "4", *FAST])
    assert result.exit_code == 1
    line = error_line(result.stderr)
    assert "fails in infer mode at batch 4" in line and "shapes do not match" in line


# --- agreement with a hand-written loop --------------------------------------------------------


def hand_written_images_per_s(
    model, batch: int, side: int, mode: str, warmup: int, iters: int
) -> float:
    images = torch.rand(batch, 3, side, side)
    labels = torch.randint(0, 10, (batch,))
    if mode == "infer":
        model.eval()
        with torch.inference_mode():
            for _ in range(warmup):
                model(images)
            start = time.perf_counter()
            for _ in range(iters):
                model(images)
            return batch * iters / (time.perf_counter() - start)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)

    def step():
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(images), labels).backward()
        optimizer.step()

    for _ in range(warmup):
        step()
    start = time.perf_counter()
    for _ in range(iters):
        step()
    return batch * iters / (time.perf_counter() - start)


@pytest.mark.parametrize("mode", ["infer", "train"])
def test_agrees_with_a_hand_written_timing_loop(mode):
    """A generous tolerance (0.5x to 2x) that holds on a noisy 2-core machine; the precise
    comparison is benchmarks/bench_benchmark.py. Best of 3 interleaved rounds each, on one
    thread: two OpenMP threads on two busy cores make either figure swing by 3x. The convnet
    at 16 px (a quarter of the work of its 28 px, steps of a few milliseconds still)."""
    from torchkit.core.models import resolve_model

    side = 16
    model = resolve_model("convnet", image_size=side).model
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ours, theirs = [], []
        for _ in range(3):
            opts = options(batch_sizes=(16,), mode=mode, iters=8)
            ours.append(benchmark_model(model, (3, side, side), opts).results[0].images_per_s)
            theirs.append(hand_written_images_per_s(model, 16, side, mode, warmup=1, iters=8))
    finally:
        torch.set_num_threads(threads)
    # The median of each round's own ratio: a round's two figures share that moment's load,
    # and one round sped up or slowed down by another process (3,730 img/s beside 790 and
    # 990 on a loaded machine) moves neither a median nor the other rounds.
    ratio = statistics.median(a / b for a, b in zip(ours, theirs, strict=True))
    assert 0.5 <= ratio <= 2.0, (ours, theirs)


def test_a_cpu_batch_beyond_the_available_memory_is_refused_before_any_run(runner, monkeypatch):
    """Before: the run started, and a batch the machine could not hold was not an out-of-memory
    error but the kernel's OOM killer (exit 137, every figure lost); now one error line before
    any configuration runs, a usage error (exit 2) as export's refusal of a batch that would not
    fit is (it exited 1)."""
    sample = (1, 28, 28)
    counted = summarize(bench_run_model("convnet", sample), [(1, *sample)], count_flops=True)
    train_image = (counted.input_mb + counted.forward_backward_mb / 2) * 1e6
    infer_image = (counted.input_mb + counted.largest_call_mb) * 1e6
    assert infer_image < train_image
    # batch 1000 fits in infer mode, not in train mode
    available = int(1000 * (infer_image + train_image) / 2)
    monkeypatch.setattr(bench_run, "available_memory", lambda: available)
    args = ["benchmark", "convnet", "-i", "1,28,28", *FAST, "--mode", "both"]
    refused = runner.invoke(app, [*args, "-b", "2,1000"])
    assert refused.exit_code == 2, refused.stdout
    assert refused.stdout == ""
    line = error_line(refused.stderr)
    assert line.startswith("Error: convnet in train mode at batch 1000 needs at least")
    assert line.endswith(
        "(give a smaller --batch-size, or find the largest that fits with --find-batch-size)"
    )
    fits = runner.invoke(app, [*args, "-b", "2,50", "--warmup", "0", "--iters", "1"])
    assert fits.exit_code == 0, fits.stderr


def test_an_infer_batch_whose_first_layer_outgrows_the_memory_is_refused_before_any_run(
    monkeypatch,
):
    """Before: infer mode counted the input batch alone, but a first convolution to 32 channels
    makes an output ~11 times the images (resnet18's conv1 and bn1 hold ~11x at 224 px): a batch
    whose images fit but whose first layer did not ran, into the kernel's OOM killer. Now the
    input and one layer's inputs and output are counted: refused, before any run."""
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    image_bytes = 3 * 16 * 16 * 4
    monkeypatch.setattr(bench_run, "available_memory", lambda: 1000 * image_bytes)
    with pytest.raises(TorchkitError, match=r"infer mode at batch 500 needs at least") as refused:
        benchmark_model(model, (3, 16, 16), options(batch_sizes=(2, 500), warmup=0, iters=1))
    assert "one layer's inputs and output" in refused.value.message
    # per image: 3 KB of images, and the pooling's 32 KB input and 128 B output: 85 fit, 86 not
    fits = benchmark_model(model, (3, 16, 16), options(batch_sizes=(85,), warmup=0, iters=1))
    assert [row.batch_size for row in fits.results] == [85]
    with pytest.raises(TorchkitError, match=r"at batch 86 needs at least"):
        benchmark_model(model, (3, 16, 16), options(batch_sizes=(86,), warmup=0, iters=1))


class _Shift(nn.Module):
    def forward(self, x, shift):
        return x + shift


class _Shifted(nn.Module):
    """A parameter handed to a leaf call as an argument (a position embedding added by a
    module of its own): memory held once, not per image."""

    def __init__(self) -> None:
        super().__init__()
        self.shift = nn.Parameter(torch.zeros(1, 64, 100))
        self.add = _Shift()

    def forward(self, x):
        return self.add(x, self.shift).mean((1, 2))


def test_a_parameter_a_layer_is_handed_is_not_counted_per_image():
    """Before: the infer check's per-image figure counted the 25.6 KB parameter as a layer
    input, once per image of the batch."""
    counted = summarize(_Shifted(), [(1, 64, 100)], count_flops=False)
    assert round(counted.largest_call_mb * 1e6) == 64 * 100 * 4  # the sum it makes, alone


# --- --find-batch-size: what is shown, where it cannot measure, a later mode's failure --------


def test_small_limits_and_peaks_are_shown_with_their_digits(runner, monkeypatch):
    """`--memory-limit 300KB` was titled 'limit 0 MB' beside a peak of 0.4 marked over it, and
    a CPU peak of a few pages showed as 0.0."""
    peaks = iter([100_000, 400_000, 4_096])  # trials at batch 1 and 2, then the timed batch 1
    monkeypatch.setattr(MemoryProbe, "start", lambda self: None)
    monkeypatch.setattr(MemoryProbe, "stop", lambda self: next(peaks))
    args = ["benchmark", "convnet", "-i", "1,12,12", *FAST, "--find-batch-size"]
    result = runner.invoke(app, [*args, "--memory-limit", "300KB", "--max-batch-size", "4"])
    assert result.exit_code == 0, result.stderr
    text = " ".join(result.stdout.split())  # as one line, however the title wraps
    assert "limit 0.300 MB" in text
    cells = [line.split("│") for line in result.stdout.splitlines() if "│" in line]
    cells = [[cell.strip() for cell in line[1:-1]] for line in cells]
    assert ["infer", "1", "0.100", "fits"] in cells
    assert ["infer", "2", "0.400", "over the memory limit"] in cells
    (row,) = [line for line in cells if len(line) == 8]
    assert row[:2] == ["infer", "1"] and row[5] == "0.00400"


def test_find_batch_size_is_refused_where_no_peak_can_be_measured(runner, monkeypatch):
    """Without /proc (macOS) every trial's peak was None and counted as fitting: the CPU search
    doubled up to --max-batch-size unchecked."""
    monkeypatch.setattr(bench_memory, "rss_bytes", lambda: None)
    args = ["benchmark", "convnet", "-i", "1,12,12", *FAST, "--find-batch-size"]
    result = runner.invoke(app, [*args, "--max-batch-size", "8"])
    assert result.exit_code == 2, result.stdout
    line = error_line(result.stderr, besides="nothing")
    assert "--find-batch-size cannot measure peak memory here" in line and "/proc" in line
    with pytest.raises(UsageError, match="cannot measure"):  # the core entry checks it too
        benchmark_model(tiny_conv(), (1, 8, 8), options(find_batch_size=True, batch_sizes=(1,)))
    with pytest.raises(UsageError, match="on mps the peak is only sampled"):
        bench_memory.check_search_measures(torch.device("mps"))
    bench_memory.check_search_measures(torch.device("cuda", 0))  # max_memory_allocated


def test_mode_both_shows_infers_rows_when_the_train_search_finds_no_batch(runner, monkeypatch):
    """A train search that failed ('batch 1 does not fit') threw away the infer search and the
    infer configuration already timed."""

    def trial(self, mode, batch, limit):
        if mode == "train":
            return Trial(batch, False, 0.8, OVER_LIMIT)
        return Trial(batch, True, 0.1, "fits")

    monkeypatch.setattr(bench_run._Context, "trial", trial)
    monkeypatch.setattr(bench_memory, "release_free_memory", lambda: None)  # 0.4 s a gc
    args = ["benchmark", "convnet", "-i", "1,12,12", *FAST, "--mode", "both"]
    args += ["--find-batch-size", "--max-batch-size", "2", "--memory-limit", "300KB"]
    result = runner.invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert [(row["mode"], row["batch_size"]) for row in data["results"]] == [("infer", 2)]
    assert [search["mode"] for search in data["batch_size_search"]] == ["infer"]
    assert "failed: the 1 of 2 configuration(s) timed before the error are shown" in result.stderr
    last = result.stderr.splitlines()[-1]
    assert last.startswith(
        "Error: batch 1 does not fit: over the memory limit (peak 0.800 MB, limit 0.300 MB)"
    )


def test_a_first_batch_over_the_limit_names_its_peak_and_the_limit(runner, monkeypatch):
    """'batch 1 does not fit: over the memory limit (0.800 MB)' gave the peak, not the limit
    it was over (a percentage's limit is known only once resolved)."""
    monkeypatch.setattr(MemoryProbe, "start", lambda self: None)
    monkeypatch.setattr(MemoryProbe, "stop", lambda self: 1_234_567_890)
    monkeypatch.setattr(bench_memory, "available_memory", lambda: 2 * 10**9)
    args = ["benchmark", "convnet", "-i", "1,12,12", *FAST, "--find-batch-size"]
    result = runner.invoke(app, [*args, "--memory-limit", "25%"])
    assert result.exit_code == 1, result.stdout
    line = error_line(result.stderr, besides="nothing")
    assert line.startswith(
        "Error: batch 1 does not fit: over the memory limit (peak 1,234.6 MB, limit 500.0 MB)"
    )
    with pytest.raises(TorchkitError, match=r"limit \(peak 2\.00 MB\) \("):  # no limit given
        search_batch_size(lambda b, t: Trial(b, False, 2.0, OVER_LIMIT), start=1, max_batch=4)


def test_a_head_num_classes_replaces_is_a_warning_on_stderr(runner, tmp_path):
    """--num-classes on weights of another size timed a model with a new, random head and
    said nothing: the figures were not those of the model the weights describe."""
    weights = tmp_path / "weights.pt"
    torch.save(bench_run_model("convnet", (1, 12, 12)).state_dict(), weights)
    args = ["benchmark", "convnet", "--weights", str(weights), "-i", "1,12,12", "-b", "1", *FAST]
    replaced = runner.invoke(app, [*args, "--num-classes", "3", "--format", "json"])
    assert replaced.exit_code == 0, replaced.stderr
    assert json.loads(replaced.stdout)["params"]  # stdout: the data alone
    (warning,) = [line for line in replaced.stderr.splitlines() if "--num-classes" in line]
    assert warning.startswith(
        f"Warning: --num-classes 3 replaced the head of {weights} (classifier.4: 10 outputs) "
        "with a new, randomly initialised one of 3 outputs"
    ), warning


@pytest.mark.parametrize(
    ("given", "hint", "trained"),
    [
        (
            ["--image-size", "12"],
            "(it was trained on 8x8 images: give --image-size 8, or leave it out)",
            ["--image-size", "8"],
        ),
        (
            ["-i", "3,12,12"],
            "(it was trained on 3,8,8 inputs: give -i 3,8,8, or leave out --input-size)",
            ["-i", "3,8,8"],
        ),
    ],
    ids=["image-size", "input-size"],
)
def test_a_checkpoint_at_another_size_names_the_input_it_was_trained_on(
    runner, tmp_path, given, hint, trained
):
    """The hint gives the input as the option given takes it, and works when followed. Before:
    'check --input-size', an option the user may not have given, without the size."""
    from checkpoints import write_convnet_checkpoint

    path = tmp_path / "ck.pt"
    write_convnet_checkpoint(path, in_channels=3, image_size=8, classes="ab")
    args = ["benchmark", str(path), "--device", "cpu", "--iters", "1", "--warmup", "0"]
    result = runner.invoke(app, [*args, *given])
    assert result.exit_code == 2 and result.stdout == ""
    line = error_line(result.stderr)
    assert "cannot run on an input of shape (1, 3, 12, 12)" in line
    assert line.endswith(hint), line
    followed = runner.invoke(app, [*args, *trained])
    assert followed.exit_code == 0, followed.stderr
