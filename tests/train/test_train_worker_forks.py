"""Every DataLoader worker of a training run is forked before any thread of the run exists: a
process forked beside a thread may deadlock in the child on a lock that thread held (Python
3.12+ warns of it: "This process is multi-threaded, use of fork() may lead to deadlocks")."""

from __future__ import annotations

import os
import threading

import pytest
from image_folders import write_image_folder

from torchkit.core.train import TrainConfig, run_training

pytestmark = pytest.mark.skipif(not hasattr(os, "register_at_fork"), reason="POSIX forks")

_watch: dict = {}  # while a test watches: "before" (the threads then) and "forks"


def _note_fork() -> None:
    if "forks" in _watch:
        started = [t.name for t in threading.enumerate() if t.ident not in _watch["before"]]
        _watch["forks"].append(started)


if hasattr(os, "register_at_fork"):  # once per process; idle unless a test watches
    os.register_at_fork(before=_note_fork)


def test_every_worker_is_forked_before_the_run_starts_a_thread(tmp_path):
    """The validation workers were forked at the first evaluation, beside the feeder threads
    of the train workers' queues, and the test workers beside the checkpoint writer's too."""
    root = tmp_path / "data"
    for split, seed in (("train", 1), ("val", 2), ("test", 3)):
        write_image_folder(root / split, {"ant": 2, "bee": 2}, seed=seed)
    config = TrainConfig(
        data=str(root), out=str(tmp_path / "run"), model="nets:TinyNet", image_size=8,
        batch_size=2, workers=1, epochs=1,
    )  # fmt: skip
    _watch.update(before={t.ident for t in threading.enumerate()}, forks=[])
    try:
        result = run_training(config)
    finally:
        forks = _watch.pop("forks")
    assert result.test_top1 is not None  # the test loader's workers were forked too
    assert forks == [[], [], []], forks  # train, val, test: one worker each, no thread beside


def test_a_run_resumed_mid_epoch_forks_every_worker_before_the_process_group(tmp_path, monkeypatch):
    """Every worker is forked before the process group is joined (`distributed.join`; under
    torchrun Gloo's threads start there): the train workers of an epoch resumed in its middle
    were forked as that epoch began, after the join, beside Gloo's threads."""
    from torchkit.core.runtime import distributed
    from torchkit.core.train import TrainCallbacks

    class StopAfterOneUpdate(TrainCallbacks):
        def should_stop(self) -> bool:  # polled after each optimiser update
            return True

    root = tmp_path / "data"
    for split, seed in (("train", 1), ("val", 2), ("test", 3)):
        write_image_folder(root / split, {"ant": 2, "bee": 2}, seed=seed)
    out = tmp_path / "run"
    config = TrainConfig(
        data=str(root), out=str(out), model="nets:TinyNet", image_size=8, batch_size=2,
        workers=1, epochs=1,
    )  # fmt: skip
    stopped = run_training(config, StopAfterOneUpdate())
    assert stopped.interrupted and (out / "last.pt").is_file()

    join = distributed.join

    def noted_join(*args, **kwargs):
        _watch["forks"].append("join")
        return join(*args, **kwargs)

    monkeypatch.setattr(distributed, "join", noted_join)
    _watch.update(before={t.ident for t in threading.enumerate()}, forks=[])
    try:
        resumed = TrainConfig(resume=str(out / "last.pt"), trust_checkpoint=True)
        result = run_training(resumed, overrides=["trust_checkpoint"])
    finally:
        forks = _watch.pop("forks")
    assert result.epochs == 1 and result.test_top1 is not None
    assert forks == [[], [], [], "join"], forks  # val, test, the resumed epoch's train workers
