"""The inputs that `eval` and `extract-features` read in their output-safety tests (issue #13:
test_safety_eval.py, test_safety_features.py), and a model that can be held in mid-run."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

import torch
from image_folders import write_image_folder
from output_checks import error_line
from processes import processes_in_group, run_torchkit_in_process, signal_and_wait, wait_until

from torchkit.core.data.preprocessing import Preprocess
from torchkit.core.io.output_paths import MARKER
from torchkit.core.models import build_model
from torchkit.core.models.checkpoint import FORMAT_VERSION, save_checkpoint

# A model whose forward pass, when GATE_FILE is set, creates that file at its GATE_AT-th batch
# and then waits there until the test stops the run: a deterministic "in the middle of the
# work" without timing guesses. `float(...)` also keeps torch.fx from tracing it, in every run.
GATE_MODULE = """
import os
import time

from torch import nn


class Gated(nn.Module):
    def __init__(self, num_classes=2):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 16))
        self.head = nn.Linear(16, num_classes)
        self.calls = 0

    def forward(self, x):
        real = float(x.abs().sum()) > 0  # images, not a zero example
        gate = os.environ.get("GATE_FILE")
        if gate and real:
            self.calls += 1
            if self.calls >= int(os.environ.get("GATE_AT", "1")):
                open(gate, "w").close()
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    time.sleep(0.01)
                raise RuntimeError("the test never stopped this run")
        return self.head(self.body(x))
"""


def write_world(root: Path) -> Path:
    """ROOT with an image folder `ds` (classes a and b, 3 8x8 images each), a CSV index
    `index.csv` naming them, a torchkit checkpoint `run/best.pt` (convnet), a stats file
    `stats.json` and the gated model `gatemod:Gated` (gatemod.py)."""
    write_image_folder(root / "ds", {"a": 3, "b": 3})
    rows = [f"ds/{c}/{c}_{i}.png,{c}" for c in "ab" for i in range(3)]
    (root / "index.csv").write_text("path,label\n" + "\n".join(rows) + "\n")
    torch.manual_seed(0)
    model = build_model("convnet", 2, image_size=8)
    preprocess = Preprocess(image_size=8, resize_size=8, mean=(0.5,) * 3, std=(0.5,) * 3)
    (root / "run").mkdir()
    save_checkpoint(
        {
            "format_version": FORMAT_VERSION,
            "torchkit_version": "0.1.0",
            "arch": "convnet",
            "num_classes": 2,
            "classes": ["a", "b"],
            "model": model.state_dict(),
            "optimizer": None,
            "scheduler": None,
            "scaler": None,
            "epoch": 1,
            "global_step": 1,
            "best_metric": 0.5,
            "rng_state": None,
            "config": {},
            "preprocess": preprocess.to_dict(),
        },
        root / "run" / "best.pt",
    )
    (root / "stats.json").write_text(json.dumps({"mean": [0.5] * 3, "std": [0.25] * 3}))
    (root / "gatemod.py").write_text(GATE_MODULE)
    return root


def check_locked_then_terminated(
    process: subprocess.Popen, gate: Path, second: Sequence[str], *, cwd: Path
) -> None:
    """Once the gated `process` (with two DataLoader workers) reaches its gate, `second`, a run
    on the same output, is refused naming its PID; SIGTERM then ends it (143) and its workers.
    The refused run is in this process: the lock, not a process boundary, refuses it."""
    try:
        wait_until(gate.exists, process=process, what="the first batch")
        assert len(processes_in_group(process.pid)) >= 3  # the command and its two workers
        refused = run_torchkit_in_process(*second, cwd=cwd)
        assert refused.returncode == 1, refused.stderr
        line = error_line(refused.stderr, besides="nothing")
        assert "is being written by another torchkit process" in line
        assert f"PID {process.pid}" in line
    finally:
        code, _, err = signal_and_wait(process, signal.SIGTERM)
    ended_as_stopped(process, signal.SIGTERM, code, err)


def stop_gated_run(process: subprocess.Popen, gate: Path, signum: int, *, group: bool) -> None:
    """Once the gated `process` reaches its gate with its two DataLoader workers, send `signum`
    to it (with `group`, to its workers too: Ctrl-C in a terminal, `timeout`, `kill -- -PGID`):
    it must end as a stopped command does, and leave no process behind."""
    try:
        wait_until(gate.exists, process=process, what="the first batch")
        assert len(processes_in_group(process.pid)) >= 3  # the command and its two workers
    finally:
        code, _, err = signal_and_wait(process, signum, group=group)
    ended_as_stopped(process, signum, code, err)


def ended_as_stopped(process: subprocess.Popen, signum: int, code: int, stderr: str) -> None:
    """`process` ended as SIGINT (130, `Interrupted.`) or SIGTERM (143, `Terminated.`) ends a
    command: that line last, no traceback nor `Error:` line, and no worker of it left."""
    said = {signal.SIGINT: (130, "Interrupted."), signal.SIGTERM: (143, "Terminated.")}[signum]
    assert (code, stderr.splitlines()[-1:]) == (said[0], [said[1]]), stderr
    assert "Traceback" not in stderr and "Error:" not in stderr, stderr
    wait_until(lambda: not processes_in_group(process.pid), what="the workers to exit")


def marked(folder: Path, command: str, files: dict[str, str | bytes]) -> Path:
    """An earlier output of `command` at `folder`: its marker and `files` (relative path ->
    text or bytes), what torchkit wrote there and what the test adds."""
    folder.mkdir(parents=True)
    (folder / MARKER).write_text(json.dumps({"written_by": "torchkit", "command": command}))
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            (folder / name).write_bytes(data)
        else:
            (folder / name).write_text(data)
    return folder
