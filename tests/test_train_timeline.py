"""`train -v` says where each epoch's time went before it ran at speed (core/train/timeline.py):
the first batch, the first steps, the rest, and how long the loop waited for batches; nothing
without -v."""

from __future__ import annotations

import re

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


def test_without_verbose_there_is_no_timeline(runner, tmp_path, make_image_folder):
    data = make_image_folder(tmp_path / "data", {"a": 8, "b": 8})
    result = runner.invoke(app, [*ARGS, "--data", str(data), "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.stderr
    assert "first batch after" not in result.stderr and "validation took" not in result.stderr


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
    ahead = SimpleNamespace(decode_seconds=1.5, loader_seconds=0.75)
    with caplog.at_level(logging.INFO, logger="torchkit"):
        line.report(2, 3.0, ahead)
    assert caplog.messages == [
        "epoch 2: first batch after 0.50 s; 0.25 s of 3.00 s waiting for batches (the decode "
        "thread: 1.50 s decoding, 0.75 s waiting for the loader)"
    ]
