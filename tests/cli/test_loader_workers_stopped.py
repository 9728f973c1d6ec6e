"""eval, predict and extract-features stopped while their DataLoader workers read: SIGTERM or
SIGINT to the whole process group (a terminal's Ctrl-C, `timeout`, systemd, `kill -- -PGID`),
which ends the workers with the command, ends it as a stop (130 / 143 and its one line), never
as torch's `RuntimeError: DataLoader worker (pid N) is killed by signal`, with no worker left
and nothing written. Real `python -m torchkit` processes: the signals are the subject."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
from processes import start_torchkit_process
from safety_world import stop_gated_run, write_world

from torchkit.core.runtime.signals import (
    quiet_loader_worker_deaths,
    restore_loader_worker_deaths,
)

GATED = ["gatemod:Gated", "--image-size", "8", "--resize-size", "8", "-j", "2", "-b", "2"]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """The safety tests' inputs (an image folder `ds`, the gated model) and `gated.pt`, weights
    of the gated model for eval."""
    root = write_world(tmp_path_factory.mktemp("stopped-workers"))
    shapes = {"body.1.weight": (16, 192), "body.1.bias": (16,), "head.weight": (2, 16)}
    weights = {name: torch.zeros(shape) for name, shape in shapes.items()}
    torch.save(weights | {"head.bias": torch.zeros(2)}, root / "gated.pt")
    return root


def command(name: str, out: Path) -> list[str]:
    """`name` run on `ds` with the gated model, two loader workers, writing under `out`."""
    if name == "eval":
        return ["eval", "gated.pt", "--model", *GATED, "--num-classes", "2", "--data", "ds",
                "--out", str(out / "report"), "-o", str(out / "metrics.json")]  # fmt: skip
    if name == "predict":
        return ["predict", *GATED, "ds", "--allow-untrained", "--classes", "a,b",
                "--format", "csv", "-o", str(out / "predictions.csv")]  # fmt: skip
    return ["extract-features", *GATED, "ds", str(out / "features"), "-l", "body",
            "--allow-untrained"]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "signum"),
    [
        # Before: 'Error: RuntimeError: DataLoader worker (pid N) is killed by signal:
        # Terminated.', exit 1.
        ("eval", signal.SIGTERM),
        # Before: exit 143, but a traceback of that RuntimeError after 'Terminated.'.
        ("predict", signal.SIGTERM),
        ("extract-features", signal.SIGTERM),
        # Ctrl-C: the workers end on their own KeyboardInterrupt (exit 0), which torch accepts.
        ("extract-features", signal.SIGINT),
    ],
)
def test_a_signal_to_the_process_group_stops_the_run_and_its_workers_cleanly(
    world, tmp_path, name, signum
):
    out = tmp_path / "out"
    out.mkdir()
    gate = tmp_path / "gate"
    process = start_torchkit_process(*command(name, out), cwd=world, env={"GATE_FILE": str(gate)})
    stop_gated_run(process, gate, signum, group=True)
    assert os.listdir(out) == []  # no output, report, temporary or lock half-written


def test_the_quiet_child_handler_is_torchs_own_again_for_the_next_command():
    """In someone's Python (a stopped command that does not end the process) the next command's
    loaders report a worker that a signal ended again; another SIGCHLD handler is left alone."""
    from torch.utils.data._utils import signal_handling

    signal_handling._set_SIGCHLD_handler()  # what the first loader with workers installs
    torchs = signal.getsignal(signal.SIGCHLD)
    swapped = quiet_loader_worker_deaths()
    try:
        assert swapped is torchs and signal.getsignal(signal.SIGCHLD) is not torchs
        assert quiet_loader_worker_deaths() is None  # swapped once
    finally:
        restore_loader_worker_deaths(swapped)
    assert signal.getsignal(signal.SIGCHLD) is torchs
