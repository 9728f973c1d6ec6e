"""`train -v` says where each epoch's time went before it ran at speed (core/train/timeline.py):
the first batch, the first steps, the rest, and how long the loop waited for batches; at the end,
where the whole run's time went; nothing without -v."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import torch

from torchkit.cli import app

# 16 images, 12 of them training images in batches of 2: 6 steps an epoch.
ARGS = ["train", "--model", "convnet", "--epochs", "2", "--image-size", "8", "-b", "2",
        "--val-split", "0.25", "--device", "cpu", "--workers", "0"]  # fmt: skip
LINE = re.compile(
    r"epoch (\d): first batch after (\d+\.\d\d) s, 5 steps done after (\d+\.\d\d) s, "
    r"the other (\d+) steps took (\d+\.\d\d) s; (\d+\.\d\d) s of (\d+\.\d\d) s waiting for batches$"
)


def test_verbose_training_logs_each_epochs_timeline(runner, tmp_path, make_image_folder):
    data = make_image_folder(tmp_path / "data", {"a": 8, "b": 8})
    result = runner.invoke(app, [*ARGS, "--data", str(data), "--out", str(tmp_path / "run"), "-v"])
    assert result.exit_code == 0, result.stderr
    found = [LINE.search(line) for line in result.stderr.splitlines()]
    found = [match for match in found if match]
    assert [match[1] for match in found] == ["1", "2"]
    for match in found:
        first_batch, first_steps = float(match[2]), float(match[3])
        assert 0 <= first_batch <= first_steps and int(match[4]) == 1
        assert float(match[6]) <= float(match[7])  # waited within the epoch
    # and the rest of each epoch: validation, then the checkpoints (and plot) it saved
    after = [re.search(r"epoch (\d): validation took (\d+\.\d\d) s, saving (\d+\.\d\d) s$", line)
             for line in result.stderr.splitlines()]  # fmt: skip
    assert [match[1] for match in after if match] == ["1", "2"]
    # and the whole run's line: the phases add up to its total, the epochs' split to theirs
    (run,) = [line[line.index("run: ") :] for line in result.stderr.splitlines() if "run: " in line]
    total, phases = _run_phases(run)
    # in-process (the CLI is not the program): from the call; this data has no test split
    assert run.startswith("run: ") and " s since the run began: " in run
    assert [name for name, _, _ in phases] == [
        "importing torch", "set-up", "2 epochs", "closing",
    ], run  # fmt: skip
    assert abs(sum(seconds for _, seconds, _ in phases) - total) <= 0.04, run
    _, epochs, split = phases[2]
    parts = [float(x) for x in re.findall(r"(\d+\.\d\d) s", split)]
    assert len(parts) == 4 and abs(sum(parts) - epochs) <= 0.03, run
    # the set-up's split: its steps, in order, add up to it
    _, setup, split = phases[1]
    steps = re.findall(r"([a-z ]+) (\d+\.\d\d) s", split)
    assert [name.strip() for name, _ in steps] == [
        "seeds and data", "loaders", "starting the workers", "model",
        "the model to the device", "optimiser and the rest", "the run folder",
    ], run  # fmt: skip
    assert abs(sum(float(seconds) for _, seconds in steps) - setup) <= 0.03, run


def _run_phases(line: str) -> tuple[float, list[tuple[str, float, str]]]:
    """The total and the (name, seconds, details) phases of the run's line."""
    head, body = line.removeprefix("run: ").split(": ", 1)
    parts, depth, current = [], 0, ""
    for char in body + ",":  # split at the commas outside parentheses
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    phases = []
    for part in parts:
        match = re.fullmatch(r"(.*?) ?(\d+\.\d\d) s(?: ([^(]+?))?(?: \((.*)\))?", part)
        name = match[1] or match[3]
        phases.append((name, float(match[2]), match[4] or ""))
    return float(head.split()[0]), phases


def test_without_verbose_there_is_no_timeline(runner, tmp_path, make_image_folder):
    data = make_image_folder(tmp_path / "data", {"a": 8, "b": 8})
    result = runner.invoke(app, [*ARGS, "--data", str(data), "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.stderr
    assert "first batch after" not in result.stderr and "validation took" not in result.stderr
    assert "run: " not in result.stderr


def test_the_wait_for_batches_is_the_time_spent_in_the_loaders_next(monkeypatch):
    # A fake clock: each batch takes 2 s to come, and the loop works 5 s on each.
    from torchkit.core.train import timeline as module

    clock = [100.0]
    monkeypatch.setattr(module.time, "perf_counter", lambda: clock[0])

    def loader():
        for index in range(3):
            clock[0] += 2.0
            yield index

    line = module.EpochTimeline(torch.device("cpu"), clock[0])
    seen = []
    for batch in line.timed(loader()):
        line.batch_arrived()
        seen.append(batch)
        clock[0] += 5.0
    assert seen == [0, 1, 2] and line.waited == 6.0 and line.first_batch == 2.0


def test_with_the_decode_thread_the_line_says_how_it_spent_its_time(caplog):
    # `--decode device` on a GPU: the DecodedAhead's own counters end the epoch's line.
    import logging
    from types import SimpleNamespace

    from torchkit.core.train.timeline import EpochTimeline

    line = EpochTimeline(torch.device("cpu"), 0.0)
    line.first_batch, line.waited = 0.5, 0.25
    ahead = SimpleNamespace(
        jpeg_seconds=1.25, crop_seconds=0.5, loader_seconds=0.75, ready_at_start=3, most_ready=5
    )
    with caplog.at_level(logging.INFO, logger="torchkit"):
        line.report(2, 3.0, ahead)
    assert caplog.messages == [
        "epoch 2: first batch after 0.50 s; 0.25 s of 3.00 s waiting for batches (decoding "
        "ahead: 1.25 s in the JPEG decoder, 0.50 s on the crops, 0.75 s waiting for the loader; "
        "3 batches ready when the epoch began, at most 5 waiting)"
    ]


def test_the_process_age_is_the_time_since_the_process_started():
    # Bounded by the parent's own clock around the child's whole life, and by the child's own
    # clock from its first line of code to the figure.
    code = (
        "import time; t = time.perf_counter(); "
        "from torchkit.core.train.timeline import process_age; "
        "print(process_age(), time.perf_counter() - t)"
    )
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lived = time.perf_counter() - started
    age, importing = (float(x) for x in out.stdout.split())
    assert importing <= age + 0.02 and age <= lived + 0.02


def test_the_run_line_adds_its_phases_and_says_when_the_start_is_unknown(monkeypatch):
    from torchkit.core.train import timeline as module

    clock = [10.0]
    monkeypatch.setattr(module.time, "perf_counter", lambda: clock[0])
    line = module.RunTimeline(clock[0], 1.5)
    clock[0] += 2.0
    line.mark("importing torch")
    clock[0] += 3.25
    line.mark("3 epochs", "training steps 3.00 s, validation 0.25 s")
    assert line.line() == (
        "run: 6.75 s since the process started: 1.50 s before the run began (starting Python, "
        "imports), importing torch 2.00 s, 3 epochs 3.25 s (training steps 3.00 s, "
        "validation 0.25 s)"
    )
    line.before = None
    assert line.line().startswith("run: 5.25 s since the run began: importing torch 2.00 s")
