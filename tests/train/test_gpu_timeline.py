"""What the GPU did in `train --profile-steps`' steps (core/train/gpu_timeline.py), read from a
Chrome trace: figures checked by hand on a made-up trace, the file the profiler writes beside
its trace on a GPU (none on a CPU: train/test_train_profile.py), and a real profile on CUDA."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from torchkit.core.train.gpu_timeline import gpu_timeline, render_timeline
from torchkit.core.train.step_profiler import StepProfiler


def _device(name, start, end, stream, cat="kernel", correlation=None):
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": start,
            "dur": end - start,
            "args": {"device": 0, "stream": stream, "correlation": correlation}}  # fmt: skip


def _host(name, start, length, tid, correlation=None):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 99, "tid": tid, "ts": start,
            "dur": length, "args": {"correlation": correlation}}  # fmt: skip


# Times in microseconds. Stream 7 (the training steps') busy over [0, 2000], [4000, 5500] and
# [5600, 6000]; stream 13 (a decoder) over [2100, 3100] and [6000, 7000].
TRACE = {
    "traceEvents": [
        {"ph": "M", "name": "thread_name", "pid": 99, "tid": 11, "args": {"name": "decode"}},
        _device("conv", 0, 1000, 7, correlation=1),
        _device("conv", 500, 2000, 7, correlation=2),  # overlaps the one before: counted once
        _device("gemm", 4000, 5000, 7, cat="Kernel"),  # older Kineto's capitals
        _device("Memcpy HtoD (Pinned -> Device)", 5000, 5500, 7, cat="gpu_memcpy"),
        _device("relu", 5600, 6000, 7, correlation=3),  # the decode thread's crop kernel
        _device("nvjpeg_decode", 2100, 3100, 13),
        _device("nvjpeg_decode", 6000, 7000, 13),
        _device("broken", 100, float("nan"), 7),  # no time: skipped
        _host("cudaStreamSynchronize", 100, 300, 11),
        _host("cudaStreamSynchronize", 3000, 700, 11),
        _host("cudaMemcpy", 10, 50, 12),
        _host("cudaLaunchKernel", 0, 5000, 12, correlation=1),  # not a wait
        _host("cudaLaunchKernel", 400, 10, 12, correlation=2),
        _host("cudaLaunchKernel", 5500, 10, 11, correlation=3),
        _host("cudaMemcpyAsync", 0, 5000, 12),  # not a wait
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 99, "tid": 12, "ts": 0, "dur": 9},
    ]
}


def test_busy_idle_and_waits_match_the_hand_count():
    timeline = gpu_timeline(TRACE)
    assert timeline is not None
    assert timeline.window_ms == pytest.approx(7.0)
    # the union of every stream: 2000 + 1000 + 1500 + 1400 us
    assert timeline.busy_ms == pytest.approx(5.9)
    main, decoder = timeline.streams
    assert (main.stream, main.activities, main.busy_ms) == ("cuda:0 stream 7", 5, 3.9)
    assert main.top[0] == ("conv", pytest.approx(2.5), 2)
    assert (decoder.stream, decoder.busy_ms) == ("cuda:0 stream 13", 2.0)
    assert decoder.top == [("nvjpeg_decode", 2.0, 2)]
    # stream 7's gaps: [2000, 4000], [5500, 5600], [6000, 7000]
    assert timeline.main_idle_ms == pytest.approx(3.1)
    assert (timeline.main_gaps, timeline.main_long_gaps) == (3, 2)
    assert timeline.main_long_gaps_ms == pytest.approx(3.0)
    assert timeline.others_while_main_idle_ms == pytest.approx(2.0)
    sync, copy = timeline.waits
    assert (sync.thread, sync.call, sync.count) == ("decode (11)", "cudaStreamSynchronize", 2)
    assert (sync.ms, sync.longest_ms) == (pytest.approx(1.0), pytest.approx(0.7))
    assert (copy.thread, copy.call, copy.count) == ("thread 12", "cudaMemcpy", 1)
    # kernels by launching thread: 1000 + 1500 us from thread 12, 400 from the decode thread,
    # the rest (no launch in the trace) unknown: 1000 + 500 + 1000 + 1000
    assert [(t.thread, t.activities, t.ms) for t in timeline.launchers] == [
        ("unknown", 4, pytest.approx(3.5)),
        ("thread 12", 2, pytest.approx(2.5)),
        ("decode (11)", 1, pytest.approx(0.4)),
    ]


def test_the_text_names_the_figures():
    text = render_timeline(gpu_timeline(TRACE), "heading")
    assert text.startswith("heading\n")
    assert "some stream busy 5.9 ms (84.3%), none 1.1 ms" in text
    assert "the busiest stream (cuda:0 stream 7) idle 3.1 ms (44.3%) in 3 gaps" in text
    assert "3.0 ms of it in 2 gaps of 1 ms or more; other streams busy 2.0 ms" in text
    assert "- cuda:0 stream 13: busy 2.0 ms (28.6%), 2 kernels, copies and memsets" in text
    assert "- decode (11): cudaStreamSynchronize 2x, 1.0 ms (longest 0.70 ms)" in text
    assert "- decode (11): 0.4 ms in 1 kernels, copies and memsets" in text


def test_a_trace_without_device_activity_has_no_timeline():
    cpu_only = {"traceEvents": [e for e in TRACE["traceEvents"] if e.get("cat") == "cpu_op"]}
    assert gpu_timeline(cpu_only) is None
    assert gpu_timeline({}) is None


class _RecordedProfile:
    """What `StepProfiler.write` asks of a stopped torch.profiler profile."""

    def key_averages(self):
        return SimpleNamespace(table=lambda **_: "operators")

    def export_chrome_trace(self, path):
        # Kineto's trace begins with its schemaVersion key, which the check of a whole trace reads
        Path(path).write_text(json.dumps({"schemaVersion": 1, **TRACE}))


def test_a_cuda_profile_writes_the_gpu_timeline_beside_its_trace(tmp_path, caplog):
    profiler = StepProfiler(tmp_path / "profile", 2, 5, torch.device("cuda"))
    profiler.recorded, profiler.updates = _RecordedProfile(), 5
    with caplog.at_level("INFO", logger="torchkit"):
        profiler.write()
    assert (
        "epoch-2.txt, epoch-2.json, epoch-2-gpu.txt; the GPU's busiest stream sat idle 3 ms of 7 "
        "(44%)" in caplog.text
    )
    names = sorted(path.name for path in (tmp_path / "profile").iterdir())
    assert names == ["epoch-2-gpu.txt", "epoch-2.json", "epoch-2.txt"]
    text = (tmp_path / "profile" / "epoch-2-gpu.txt").read_text()
    assert text.startswith("torchkit train --profile-steps: epoch 2, its first 5 optimiser steps")
    assert "the busiest stream (cuda:0 stream 7) idle 3.1 ms" in text


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_real_cuda_profile_has_a_busy_stream(runner, tmp_path, make_image_folder):
    from torchkit.cli import app

    data = make_image_folder(tmp_path / "data", {"a": 8, "b": 8})
    out = tmp_path / "run"
    args = ["train", "--model", "convnet", "--image-size", "16", "-b", "4", "--epochs", "1",
            "--device", "cuda", "--workers", "0", "--profile-steps", "2", "--data", str(data),
            "--out", str(out)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    text = (out / "profile" / "epoch-1-gpu.txt").read_text()
    assert "the busiest stream (cuda:" in text and "kernels, copies and memsets" in text


def test_an_unreadable_trace_keeps_the_table_and_trace_and_says_so(tmp_path, caplog):
    class BadTrace(_RecordedProfile):
        def export_chrome_trace(self, path):
            # written to its end, but not JSON inside (a cut-off trace is a write error:
            # tests/train/test_profile_trace_written_whole.py)
            Path(path).write_text('{"schemaVersion": 1, "traceEvents": [{"ph": "X", "dur": }]}')

    profiler = StepProfiler(tmp_path / "profile", 1, 5, torch.device("cuda"))
    profiler.recorded, profiler.updates = BadTrace(), 5
    profiler.write()
    names = sorted(path.name for path in (tmp_path / "profile").iterdir())
    assert names == ["epoch-1.json", "epoch-1.txt"]
    assert "the trace could not be read for the GPU's timeline" in caplog.text
