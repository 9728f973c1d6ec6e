"""Under torchrun eval and predict fork their DataLoader workers before the process group
starts Gloo's threads (gloo_tcp_loop, pt_gloo_runloop; rank 0's TCPStore server without
torchrun's agent): a process forked beside a thread may deadlock in the child on a lock that
thread held (the rule of one process: test_inference_worker_forks.py). They were forked after
`init_process_group`, beside those threads. One Gloo world of two ranks per command, both
started at once; each rank's sitecustomize notes the threads at each fork
(`gloo_ranks.watching_forks`). train's: test_train_ddp.py; predict's list on stdin:
test_predict.py's torchrun test."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch
from checkpoints import write_convnet_checkpoint
from gloo_ranks import finish, forks_noted, start_ranks, stderr_of, watching_forks
from image_folders import write_image_folder

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or not os.path.isdir("/proc/self/task"),
    reason="torch.distributed and Linux forks (the process's threads in /proc)",
)

COMMANDS = ("eval", "predict")


@dataclass
class World:
    forks: dict[str, list[list[list[str]]]]  # command -> each rank's forks: the threads then
    errors: dict[str, str]  # command -> the ranks' stderr where a rank failed


@pytest.fixture(scope="module")
def worlds(tmp_path_factory) -> World:
    root = tmp_path_factory.mktemp("ddp-forks")
    data = root / "data"
    write_image_folder(data, {"a": 2, "b": 2})
    model = root / "model.pt"
    write_convnet_checkpoint(model, in_channels=3, image_size=8, classes="ab")
    common = ["--device", "cpu", "-j", "1"]
    args = {
        "eval": ["eval", model, "--data", data, "-o", root / "eval.json", *common],
        "predict": ["predict", model, data, "-o", root / "predictions.csv", *common],
    }
    started = {
        command: start_ranks(*args[command], env=watching_forks(root / command))
        for command in COMMANDS
    }
    forks, errors = {}, {}
    for command, ranks in started.items():
        done = [finish(rank, timeout=180) for rank in ranks]
        if any(rank.returncode for rank in done):
            errors[command] = stderr_of(done)
        forks[command] = [forks_noted(root / command, rank) for rank in range(len(done))]
    return World(forks, errors)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_rank_forks_its_workers_before_the_process_group_starts_a_thread(worlds, command):
    assert command not in worlds.errors, worlds.errors.get(command, "")[-3000:]
    for rank, forks in enumerate(worlds.forks[command]):
        # Its one worker, forked with the main thread alone.
        assert len(forks) == 1, (rank, forks)
        assert all(len(threads) == 1 for threads in forks), (rank, forks)
