"""Issue #13 for `torchkit eval`: --out and -o never replace, contain or land inside an input
(the data, a CSV index and its images, the checkpoint, --stats), --force replaces only an earlier
eval's folder, SIGTERM stops the DataLoader workers and leaves an old --out as it was, a second
run on the same --out is refused while the first runs, and a full disk is one `Error: cannot
write` line with nothing half-written under --out. Every check is a real `python -m torchkit`."""

from __future__ import annotations

import hashlib
import json
import os
import signal
from pathlib import Path

import pytest
import torch
from conftest import (
    processes_in_group,
    run_torchkit_process,
    signal_and_wait,
    start_torchkit_process,
    wait_until,
    write_image_folder,
)

from torchkit.core.checkpoint import FORMAT_VERSION, save_checkpoint
from torchkit.core.data import Preprocess
from torchkit.core.models import build_model

REPORTS = (
    "metrics.json",
    "per_class.csv",
    "confusion_matrix.csv",
    "predictions.csv",
    "confusion_matrix.png",
    "errors.png",
)

# A model whose forward pass, when GATE_FILE is set, creates that file at its GATE_AT-th batch
# and then waits there until the test stops the run: a deterministic "in the middle of the
# work" without timing guesses. `float(...)` also keeps torch.fx from tracing it.
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


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """Every input eval reads, made once: an image folder `ds`, a CSV index naming its images,
    a torchkit checkpoint `run/best.pt`, a stats file, and a gated model's weights."""
    root = tmp_path_factory.mktemp("eval-safety")
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
    gated = {
        "body.1.weight": torch.randn(16, 192) * 0.05,
        "body.1.bias": torch.zeros(16),
        "head.weight": torch.randn(2, 16) * 0.1,
        "head.bias": torch.zeros(2),
    }
    torch.save(gated, root / "gated.pt")
    return root


def tree(folder: Path) -> dict[str, str]:
    """Every name under `folder` (hidden ones too) with a hash of its bytes."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if "__pycache__" in path.parts:
            continue
        name = str(path.relative_to(folder))
        found[name] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def older_eval_output(folder: Path, *, marker: bool) -> None:
    """An eval --out folder as an earlier torchkit wrote it (with or before the marker)."""
    folder.mkdir()
    for name in REPORTS:
        (folder / name).write_bytes(f"earlier {name}\n".encode())
    if marker:
        (folder / ".torchkit").write_text('{"written_by": "torchkit", "command": "eval"}\n')


def leftovers(parent: Path, name: str) -> list[str]:
    """Hidden siblings of an output (a lock, a set-aside or partial folder)."""
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}."))


EVAL = ["eval", "run/best.pt", "--data", "ds", "--workers", "0", "--format", "json"]

OVERLAPS = [
    (["--out", "ds", "--force"], "output folder ds is the data folder ds"),
    (["--out", "ds/a", "--force"], "output folder ds/a lies inside the data folder ds"),
    (["--out", "run", "--force"], "output folder run contains the checkpoint run/best.pt"),
    (["--out", ".", "--force"], "output folder . is the working directory"),
    (["--out", "..", "--force"], "output folder .. is a parent of the working directory"),
    (["-o", "run/best.pt", "--force"], "output run/best.pt is the checkpoint run/best.pt"),
    (["-o", "ds/a/new.json"], "output ds/a/new.json lies inside the data folder ds"),
    (["--stats", "stats.json", "-o", "stats.json", "--force"], "is the stats file stats.json"),
    (["--out", "rep", "-o", "rep/m.json"], "output rep/m.json lies inside the --out folder rep"),
    # A CSV index: the index itself and the folders of the images it names.
    (["--data", "index.csv", "-o", "index.csv", "--force"], "is the data file index.csv"),
    (["--data", "index.csv", "--out", "ds", "--force"], "contains the images of index.csv"),
]


def test_outputs_that_overlap_an_input_are_refused_and_nothing_changes(world):
    before = tree(world)
    # All at once: each is refused before torch is imported, so this takes about a second.
    processes = [start_torchkit_process(*EVAL, *args, cwd=world) for args, _ in OVERLAPS]
    for process, (args, message) in zip(processes, OVERLAPS, strict=True):
        out, err = process.communicate(timeout=120)
        assert process.returncode == 1, (args, err)
        assert err.startswith("Error: ") and message in err, (args, err)
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert out == ""
    assert tree(world) == before  # the inputs' bytes, and no new file anywhere


def test_force_replaces_an_earlier_eval_folder_and_nothing_else(world, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")
    (mine / "metrics.json").write_text("{}")
    mine_before = tree(mine)
    refused = run_torchkit_process(*EVAL, "--out", str(mine), "--force", cwd=world)
    assert refused.returncode == 1
    assert "Error: output folder" in refused.stderr
    assert "was not written by torchkit" in refused.stderr
    assert tree(mine) == mine_before

    older = tmp_path / "older"
    older_eval_output(older, marker=False)  # written before the .torchkit marker existed
    done = run_torchkit_process(*EVAL, "--out", str(older), "--force", cwd=world)
    assert done.returncode == 0, done.stderr
    metrics = json.loads((older / "metrics.json").read_text())
    assert metrics["accuracy"] == json.loads(done.stdout)["accuracy"]
    assert sorted(p.name for p in older.iterdir()) == sorted([".torchkit", *REPORTS])
    assert leftovers(tmp_path, "older") == []


def test_sigterm_stops_the_workers_and_a_second_run_is_refused(world, tmp_path):
    previous = tmp_path / "previous"
    older_eval_output(previous, marker=True)
    before = tree(previous)
    started = tmp_path / "started"
    gated = [
        "eval", "gated.pt", "--model", "gatemod:Gated", "--num-classes", "2", "--data", "ds",
        "--image-size", "8", "--workers", "2", "--batch-size", "2", "--out", str(previous),
        "--force",
    ]  # fmt: skip
    process = start_torchkit_process(*gated, cwd=world, env={"GATE_FILE": str(started)})
    try:
        wait_until(started.exists, process=process, what="the first batch")
        assert len(processes_in_group(process.pid)) >= 3  # eval and its two DataLoader workers

        second = run_torchkit_process(*EVAL, "--out", str(previous), "--force", cwd=world)
        assert second.returncode == 1
        assert "is being written by another torchkit process" in second.stderr
        assert f"PID {process.pid}" in second.stderr
    finally:
        code, _, err = signal_and_wait(process, signal.SIGTERM)
    assert code == 143, err
    assert "Terminated." in err and "Traceback" not in err
    wait_until(lambda: not processes_in_group(process.pid), what="the workers to exit")
    assert tree(previous) == before
    assert leftovers(tmp_path, "previous") == []  # no lock, no half-written folder


def test_full_disk_is_an_error_and_leaves_nothing_under_out(world, small_tmpfs):
    disk = small_tmpfs(16)  # too small for the two PNGs
    result = run_torchkit_process(*EVAL, "--out", str(disk / "rep"), cwd=world)
    assert result.returncode == 1, result.stderr
    assert "Error: cannot write " in result.stderr and "No space left" in result.stderr
    assert f"{disk / 'rep'}" in result.stderr  # named as --out, not its hidden temporary folder
    assert "Traceback" not in result.stderr
    assert os.listdir(disk) == []  # no report, no partial folder, no lock
