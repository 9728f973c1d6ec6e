"""Issue #13 for `torchkit extract-features`: OUT never is, contains or lies inside an input (the
images, a CSV index and its images, the model file, --stats), --force replaces only an earlier
extract-features OUT, SIGTERM before the first rows puts nothing at risk and stops the workers,
SIGTERM after them keeps a resumable OUT, a second run on the same OUT is refused while the
first runs, and a full disk is `Error: cannot write` (exit 1), never SIGBUS, with the old OUT
back in place. Every check is a real `python -m torchkit`."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
from pathlib import Path

import numpy as np
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

# A model whose forward pass, when GATE_FILE is set, creates that file at its GATE_AT-th batch
# and then waits there until the test stops the run: a deterministic "in the middle of the
# work" without timing guesses. `float(...)` keeps torch.fx from tracing it, in every run.
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

FEATURES = ["extract-features", "run/best.pt", "ds", "--workers", "0", "-l", "features.5"]
GATED = [
    "extract-features", "gatemod:Gated", "ds", "-l", "body", "--image-size", "8",
    "--resize-size", "8", "--workers", "2", "--batch-size", "2",
]  # fmt: skip


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """Every input extract-features reads, made once: an image folder `ds` (6 8x8 images), a
    CSV index naming them, a torchkit checkpoint `run/best.pt`, a stats file, a gated model."""
    root = tmp_path_factory.mktemp("features-safety")
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


def tree(folder: Path) -> dict[str, str]:
    """Every name under `folder` (hidden ones too) with a hash of its bytes."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if "__pycache__" in path.parts:
            continue
        name = str(path.relative_to(folder))
        found[name] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def older_output(folder: Path, *, marker: bool) -> None:
    """An OUT as an earlier extract-features wrote it (with or before the `.torchkit` marker)."""
    folder.mkdir()
    np.save(folder / "features.5.npy", np.arange(12, dtype=np.float32).reshape(3, 4))
    (folder / "index.csv").write_text("row,path,label,error\n0,a/a_0.png,a,\n")
    meta = {"fingerprint": "0" * 64, "layers": [{"name": "features.5", "file": "features.5.npy"}]}
    (folder / "meta.json").write_text(json.dumps(meta))
    if marker:
        (folder / ".torchkit").write_text('{"written_by": "torchkit"}\n')


def leftovers(parent: Path, name: str) -> list[str]:
    """Hidden siblings of an output (a lock, a set-aside or partial folder)."""
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}."))


def refused(args: list[str], cwd: Path):
    result = run_torchkit_process(*args, cwd=cwd)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("Error: ") and "Traceback" not in result.stderr
    return result


OVERLAPS = [
    (["ds", "--force"], "output folder ds is the IMAGES folder ds"),
    (["ds/a", "--force"], "output folder ds/a lies inside the IMAGES folder ds"),
    (["ds", "--resume"], "output folder ds is the IMAGES folder ds"),
    (["run", "--force"], "output folder run contains the model file run/best.pt"),
    (["run/best.pt", "--force"], "output folder run/best.pt is the model file run/best.pt"),
    ([".", "--force"], "output folder . is the working directory"),
    (["..", "--force"], "output folder .. is a parent of the working directory"),
    (["stats.json", "--stats", "stats.json", "--force"], "is the stats file stats.json"),
]
CSV_OVERLAPS = [  # IMAGES is a CSV index: the index itself and the folders of its images
    (["index.csv", "--force"], "output folder index.csv is the IMAGES file index.csv"),
    (["ds", "--force"], "output folder ds contains the images of index.csv"),
]


def test_outputs_that_overlap_an_input_are_refused_and_nothing_changes(world):
    before = tree(world)
    commands = [[*FEATURES, *args] for args, _ in OVERLAPS]
    commands += [
        ["extract-features", "run/best.pt", "index.csv", *args] for args, _ in CSV_OVERLAPS
    ]
    # All at once: each is refused before torch is imported, so this takes about a second.
    processes = [start_torchkit_process(*command, cwd=world) for command in commands]
    for process, (args, message) in zip(processes, OVERLAPS + CSV_OVERLAPS, strict=True):
        out, err = process.communicate(timeout=120)
        assert process.returncode == 1, (args, err)
        assert err.startswith("Error: ") and message in err, (args, err)
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert tree(world) == before  # the inputs' bytes, and no new file anywhere


def test_force_replaces_an_earlier_extraction_and_nothing_else(world, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")
    with_extra = tmp_path / "with_extra"  # an earlier OUT the user has added a file to
    older_output(with_extra, marker=False)
    (with_extra / "notes.txt").write_text("mine too")
    for folder in (mine, with_extra):
        before = tree(folder)
        result = refused([*FEATURES, str(folder), "--force"], world)
        assert "was not written by torchkit" in result.stderr
        assert tree(folder) == before

    older = tmp_path / "older"
    older_output(older, marker=False)  # written before the .torchkit marker existed
    done = run_torchkit_process(*FEATURES, str(older), "--force", cwd=world)
    assert done.returncode == 0, done.stderr
    assert np.load(older / "features.5.npy").shape == (6, 64)
    assert json.loads((older / "meta.json").read_text())["num_rows"] == 6
    assert (older / ".torchkit").is_file() and not (older / ".partial").exists()
    assert leftovers(tmp_path, "older") == []


def test_sigterm_before_the_first_rows_leaves_the_old_out_and_no_process(world, tmp_path):
    previous = tmp_path / "previous"
    older_output(previous, marker=True)
    before = tree(previous)
    started = tmp_path / "started"
    process = start_torchkit_process(
        *GATED, str(previous), "--force", cwd=world, env={"GATE_FILE": str(started)}
    )
    try:
        wait_until(started.exists, process=process, what="the first batch")
        assert len(processes_in_group(process.pid)) >= 3  # the command and its two workers
        # A second run on the same OUT is refused at once, naming the first.
        second = refused([*FEATURES, str(previous), "--force"], world)
        assert "is being written by another torchkit process" in second.stderr
        assert f"PID {process.pid}" in second.stderr
    finally:
        code, _, err = signal_and_wait(process, signal.SIGTERM)
    assert code == 143, err
    assert "Terminated." in err and "Traceback" not in err
    wait_until(lambda: not processes_in_group(process.pid), what="the workers to exit")
    assert tree(previous) == before  # byte for byte
    assert leftovers(tmp_path, "previous") == []  # no lock, no set-aside folder


def test_sigterm_after_the_first_rows_keeps_a_resumable_out(world, tmp_path):
    out = tmp_path / "out"
    older_output(out, marker=True)
    started = tmp_path / "started"
    env = {"GATE_FILE": str(started), "GATE_AT": "2"}  # the first batch of 2 gets written
    process = start_torchkit_process(*GATED, str(out), "--force", cwd=world, env=env)
    try:
        wait_until(started.exists, process=process, what="the second batch")
    finally:
        code, _, err = signal_and_wait(process, signal.SIGTERM)
    assert code == 143, err
    assert "add --resume to continue" in err
    wait_until(lambda: not processes_in_group(process.pid), what="the workers to exit")
    progress = json.loads((out / ".partial" / "progress.json").read_text())
    assert (progress["done"], progress["rows"]) == (2, 2)
    assert not (out / "meta.json").exists() and not (out / "features.5.npy").exists()
    assert leftovers(tmp_path, "out") == []  # the replaced OUT is gone, as is the lock

    resumed = run_torchkit_process(*GATED, str(out), "--resume", "--workers", "0", cwd=world)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed at image 3" in resumed.stderr
    assert np.load(out / "body.npy").shape == (6, 16)
    assert not (out / ".partial").exists()


def test_full_disk_is_an_error_not_sigbus_and_the_old_out_comes_back(world, small_tmpfs):
    disk = small_tmpfs(256)
    out = disk / "out"
    older_output(out, marker=True)
    before = tree(out)
    # Leave 16 KiB: less than the 6 x 32 x 6 x 6 float32 maps of the first convolution.
    free = os.statvfs(disk)
    (disk / "filler").write_bytes(bytes(free.f_bavail * free.f_frsize - 16 * 1024))
    args = ["-l", "features.0", "--pool", "none", "--batch-size", "2"]
    result = run_torchkit_process(*FEATURES[:-2], str(out), *args, "--force", cwd=world)
    assert result.returncode == 1, (result.returncode, result.stderr)  # SIGBUS would be -7
    assert "Error: cannot write " in result.stderr and "No space left" in result.stderr
    assert "Traceback" not in result.stderr
    assert tree(out) == before  # nothing half-written under OUT: the old one, as it was
    assert sorted(os.listdir(disk)) == ["filler", "out"]


def test_reserving_the_arrays_falls_back_or_fails_cleanly(tmp_path, monkeypatch):
    """Where posix_fallocate is not supported a new array is filled with zeros instead (its
    header untouched); a full disk while reserving is one OutputWriteError naming OUT."""
    from numpy.lib.format import open_memmap

    from torchkit.core.errors import OutputWriteError
    from torchkit.core.features.store import reserve_space

    path = tmp_path / "layer.npy"
    array = open_memmap(path, mode="w+", dtype="float32", shape=(4096, 16))

    def unsupported(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    reserve_space(path, tmp_path, zero_fill_from=array.offset)
    assert os.stat(path).st_blocks * 512 >= array.nbytes  # every data page is on disk now
    array[:] = 1.5
    array.flush()
    assert np.load(path).shape == (4096, 16) and np.all(np.load(path) == 1.5)

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(OutputWriteError, match=f"cannot write {tmp_path}: No space left"):
        reserve_space(path, tmp_path)
