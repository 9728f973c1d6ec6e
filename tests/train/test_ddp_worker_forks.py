"""Under torchrun every command forks its DataLoader workers before the process group starts
Gloo's threads (gloo_tcp_loop, pt_gloo_runloop; rank 0's TCPStore server without torchrun's
agent): a process forked beside a thread may deadlock in the child on a lock that thread held
(the rule of one process: test_train_worker_forks.py, test_inference_worker_forks.py). They
were forked after `init_process_group`, beside those threads. One Gloo world of two ranks per
command, all started at once; each rank's sitecustomize notes the threads at each fork."""

from __future__ import annotations

import os
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from checkpoints import write_convnet_checkpoint
from gloo_ranks import finish, start_ranks, stderr_of
from image_folders import write_image_folder
from suite_paths import HELPERS

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or not os.path.isdir("/proc/self/task"),
    reason="torch.distributed and Linux forks (the process's threads in /proc)",
)

# Each fork of a rank appends a line to TORCHKIT_TEST_FORK_LOG.RANK: the names of the threads
# of the process as it forks (OpenMP's and Gloo's too: threading knows only Python's).
FORK_WATCH = textwrap.dedent(
    """
    import os

    _log = os.environ.get("TORCHKIT_TEST_FORK_LOG")

    def _note_fork():
        names = []
        for task in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{task}/comm") as comm:
                    names.append(comm.read().strip())
            except OSError:  # the thread ended meanwhile
                pass
        with open(f"{_log}.{os.environ.get('RANK')}", "a") as log:
            log.write(" ".join(sorted(names)) + "\\n")

    if _log:
        os.register_at_fork(before=_note_fork)
    """
)

COMMANDS = ("train", "eval", "predict")


@dataclass
class World:
    forks: dict[str, list[list[str]]]  # command -> one line a fork: the threads then
    errors: dict[str, str]  # command -> the ranks' stderr where a rank failed


@pytest.fixture(scope="module")
def worlds(tmp_path_factory) -> World:
    root = tmp_path_factory.mktemp("ddp-forks")
    data = root / "data"
    for split, seed in (("train", 1), ("val", 2), ("test", 3)):
        write_image_folder(data / split, {"a": 2, "b": 2}, seed=seed)
    model = root / "model.pt"
    write_convnet_checkpoint(model, in_channels=3, image_size=8, classes="ab")
    (root / "site").mkdir()
    (root / "site" / "sitecustomize.py").write_text(FORK_WATCH)
    common = ["--device", "cpu", "-j", "1"]
    args = {
        "train": [
            "train", "--data", data, "--model", "nets:TinyNet", "--image-size", "8",
            "--batch-size", "2", "--epochs", "1", "--out", root / "run", *common,
        ],
        "eval": ["eval", model, "--data", data, "-o", root / "eval.json", *common],
        "predict": ["predict", model, data / "test", "-o", root / "predictions.csv", *common],
    }  # fmt: skip
    started = {
        command: start_ranks(
            *args[command],
            env={
                "PYTHONPATH": f"{root / 'site'}{os.pathsep}{HELPERS}",
                "TORCHKIT_TEST_FORK_LOG": str(root / command),
            },
        )
        for command in COMMANDS
    }
    forks, errors = {}, {}
    for command, ranks in started.items():
        done = [finish(rank, timeout=180) for rank in ranks]
        if any(rank.returncode for rank in done):
            errors[command] = stderr_of(done)
        forks[command] = [_forks(root / f"{command}.{rank}") for rank in range(len(done))]
    return World(forks, errors)


def _forks(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize(
    ("command", "workers"),
    [("train", 3), ("eval", 1), ("predict", 1)],  # train: its train, val and test loaders
)
def test_every_rank_forks_its_workers_before_the_process_group_starts_a_thread(
    worlds, command, workers
):
    assert command not in worlds.errors, worlds.errors.get(command, "")[-3000:]
    for rank, forks in enumerate(worlds.forks[command]):
        # One worker a loader, each forked with the main thread alone.
        assert len(forks) == workers, (rank, forks)
        assert all(len(threads.split()) == 1 for threads in forks), (rank, forks)
