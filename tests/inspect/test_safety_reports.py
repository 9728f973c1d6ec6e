"""Issue #13 for the report commands (`summary`, `dataset-stats`, `convert-syncbn`, `env`): no
output (-o, --plot, DST) may replace an input or land inside a data folder, special files are
written into and never replaced, a full or read-only disk is one `Error: cannot write` line, and
SIGTERM stops dataset-stats' workers and writes nothing."""

from __future__ import annotations

import io
import json
import os
import signal
import stat
import subprocess
from pathlib import Path

import pytest
import torch
from disks import FifoReader, fill_disk
from image_folders import write_image_folder
from output_checks import check_refused_untouched, error_line, tree_digest
from processes import (
    processes_in_group,
    run_torchkit_in_process,
    signal_and_wait,
    start_torchkit_process,
    wait_until,
)
from torch import nn

from torchkit.cli import app
from torchkit.core.models.checkpoint import FORMAT_VERSION, save_checkpoint

NETDEF = """from torch import nn


def make():
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten())
"""


@pytest.fixture(scope="module")
def _template(tmp_path_factory) -> Path:
    """Every kind of input these commands read, made once: an image folder `ds`, a CSV index
    naming some of its images, a torchkit checkpoint `ck.pt` (and a symlink to it), the same
    weights as a state dict, a pickled model and a `module:callable` source."""
    from torchkit.core.models import resolve_model

    root = tmp_path_factory.mktemp("template")
    write_image_folder(root / "ds", {"a": 3, "b": 2})
    (root / "index.csv").write_text("path,label\nds/a/a_0.png,a\nds/b/b_0.png,b\n")
    torch.manual_seed(0)
    model = resolve_model("convnet", in_channels=3, image_size=8, num_classes=2).model
    save_checkpoint(
        {
            "format_version": FORMAT_VERSION,
            "arch": "convnet",
            "num_classes": 2,
            "classes": ["a", "b"],
            "model": model.state_dict(),
            "config": {},
            "preprocess": {"image_size": 8, "in_channels": 3},
        },
        root / "ck.pt",
    )
    (root / "ck-link.pt").symlink_to("ck.pt")
    torch.save(model.state_dict(), root / "weights.pt")
    torch.save(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten()), root / "net.pt")
    (root / "netdef.py").write_text(NETDEF)
    return root


# -- outputs that are, or lie inside, an input: refused before any work, nothing touched ------


REFUSED = {
    "summary -o CHECKPOINT": (["summary", "ck.pt", "-o", "ck.pt", "--force"], "is the model file"),
    "summary -o LINK-TARGET": (
        ["summary", "ck-link.pt", "-o", "ck.pt", "--force"],
        "is the model file",
    ),
    "summary -o WEIGHTS": (
        ["summary", "convnet", "--num-classes", "2", "-i", "3,8,8", "--weights", "weights.pt"]
        + ["-o", "weights.pt", "--force"],
        "is the --weights file",
    ),
    "summary -o MODEL-SOURCE": (
        ["summary", "netdef:make", "-i", "3,8,8", "-o", "netdef.py", "--force"],
        "is the model source",
    ),
    "dataset-stats -o INDEX": (
        ["dataset-stats", "index.csv", "-j", "0", "-o", "index.csv", "--force"],
        "is the data file",
    ),
    "dataset-stats -o inside ROOT": (
        ["dataset-stats", "ds", "-j", "0", "-o", "ds/a/stats.json", "--force"],
        "lies inside the data folder",
    ),
    "dataset-stats -o beside indexed images": (
        ["dataset-stats", "index.csv", "-j", "0", "-o", "ds/b/stats.json", "--force"],
        "lies inside the images of index.csv",
    ),
    "dataset-stats --plot inside ROOT": (
        ["dataset-stats", "ds", "-j", "0", "--plot", "ds/plot.png", "--force"],
        "lies inside the data folder",
    ),
    "dataset-stats -o and --plot one file": (
        ["dataset-stats", "ds", "-j", "0", "-o", "out.png", "--plot", "out.png", "--force"],
        "is the same file as output",
    ),
    "convert-syncbn DST=SRC": (
        ["convert-syncbn", "ck.pt", "ck.pt", "--force"],
        "DST ck.pt is the model file",
    ),
    "convert-syncbn DST=SRC through a link": (
        ["convert-syncbn", "ck-link.pt", "ck.pt", "--force"],
        "DST ck.pt is the model file",
    ),
    "convert-syncbn -o SRC": (
        ["convert-syncbn", "net.pt", "out.pt", "--trust-checkpoint", "-o", "net.pt", "--force"],
        "output net.pt is the model file",
    ),
    "convert-syncbn -o DST": (
        ["convert-syncbn", "ck.pt", "out.pt", "-o", "out.pt", "--force"],
        "is the same file as DST",
    ),
    "convert-syncbn -o WEIGHTS": (
        ["convert-syncbn", "convnet", "--num-classes", "2", "--weights", "weights.pt"]
        + ["-o", "weights.pt", "--force"],
        "is the --weights file",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_output_over_an_input_is_refused_and_nothing_changes(work, case):
    check_refused_untouched(*REFUSED[case], cwd=work)


def test_model_inputs_name_what_a_spec_reads(work, monkeypatch):
    from torchkit.core.models import model_inputs

    monkeypatch.chdir(work)
    assert [(str(i.path), i.what) for i in model_inputs("ck.pt")] == [("ck.pt", "model file")]
    assert [str(i.path) for i in model_inputs("netdef:make", "weights.pt")] == [
        "netdef.py",
        "weights.pt",
    ]
    assert model_inputs("resnet18", "DEFAULT") == [] and model_inputs("convnet") == []


# -- special files: written into, never replaced ----------------------------------------------


def _json(data: bytes) -> dict:
    return json.loads(data.decode())


SPECIAL = {
    "env": (["env", "--format", "json", "-o", "{0}"], ["{0}"]),
    "summary": (["summary", "ck.pt", "--format", "json", "-o", "{0}"], ["{0}"]),
    "dataset-stats": (
        ["dataset-stats", "index.csv", "-j", "0", "--format", "json", "-o", "{0}"]
        + ["--plot", "{1}"],
        ["{0}", "{1}"],
    ),
    "convert-syncbn": (
        ["convert-syncbn", "ck.pt", "{1}", "--format", "json", "-o", "{0}"],
        ["{0}", "{1}"],
    ),
}


def _check_special_outputs(command: str, outputs: list[bytes]) -> None:
    if command == "env":
        assert "torchkit_version" in _json(outputs[0])
    elif command == "summary":
        assert _json(outputs[0])["input_shapes"] == [[1, 3, 8, 8]]
    elif command == "dataset-stats":
        assert _json(outputs[0])["images"] == 2
        assert outputs[1].startswith(b"\x89PNG\r\n\x1a\n")
    else:
        assert _json(outputs[0])["kind"] == "torchkit checkpoint"
        converted = torch.load(io.BytesIO(outputs[1]), weights_only=True)
        # the whole checkpoint, its mark written (False: convnet has no BatchNorm to convert)
        assert converted["classes"] == ["a", "b"] and converted["config"] == {"sync_bn": False}


@pytest.mark.parametrize("command", list(SPECIAL))
def test_outputs_to_fifos_are_written_into(runner, work, monkeypatch, command):
    monkeypatch.chdir(work)
    template, _ = SPECIAL[command]
    readers = [FifoReader(work / "out0.fifo"), FifoReader(work / "out1.fifo")]
    args = [a.format("out0.fifo", "out1.fifo") for a in template]
    result = runner.invoke(app, [*args, "--force"])  # --force must not replace them either
    outputs = [reader.result() for reader in readers]
    assert result.exit_code == 0, result.stderr
    _check_special_outputs(command, outputs)


@pytest.mark.parametrize("command", list(SPECIAL))
def test_outputs_to_dev_null_work(runner, work, monkeypatch, command):
    monkeypatch.chdir(work)
    template, _ = SPECIAL[command]
    before = tree_digest(work)
    result = runner.invoke(
        app, [*(a.format("/dev/null", "/dev/null") for a in template), "--force"]
    )
    assert result.exit_code == 0, result.stderr
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert tree_digest(work) == before


# -- a full or read-only disk: one error line, exit 1, nothing half-written ---------------------


@pytest.fixture
def full_disk(small_tmpfs) -> Path:
    """A 64 KiB file system with no byte free."""
    return fill_disk(small_tmpfs(64))


def test_env_on_a_full_disk_is_an_error(full_disk):
    target = full_disk / "env.json"
    done = run_torchkit_in_process("env", "--format", "json", "-o", str(target))
    assert done.returncode == 1
    assert f"Error: cannot write {target}: No space left" in error_line(
        done.stderr, besides="warnings"
    )
    assert os.listdir(full_disk) == ["filler"]  # no half-written file, no temporary


def test_env_on_a_read_only_disk_is_an_error(small_tmpfs):
    mount = small_tmpfs(64)
    remounted = subprocess.run(["mount", "-o", "remount,ro", str(mount)], capture_output=True)
    if remounted.returncode != 0:
        pytest.skip("cannot remount the tmpfs read-only")
    done = run_torchkit_in_process("env", "-o", str(mount / "env.txt"))
    assert done.returncode == 1
    assert "Error: cannot write" in error_line(done.stderr, besides="warnings")
    assert "Read-only file system" in done.stderr
    assert os.listdir(mount) == []


FULL_DISK = {
    "summary -o": ["summary", "ck.pt", "--format", "json", "-o", "{disk}/summary.json"],
    "dataset-stats -o": ["dataset-stats", "ds", "-j", "0", "--format", "json", "-o", "{disk}/s"],
    "dataset-stats --plot": ["dataset-stats", "ds", "-j", "0", "--plot", "{disk}/plot.png"],
    "convert-syncbn DST checkpoint": ["convert-syncbn", "ck.pt", "{disk}/sync.pt"],
    "convert-syncbn DST pickled": [
        "convert-syncbn",
        "net.pt",
        "{disk}/sync.pt",
        "--trust-checkpoint",
    ],
}


@pytest.mark.parametrize("case", list(FULL_DISK))
def test_full_disk_is_one_error_and_leaves_nothing(runner, work, monkeypatch, full_disk, case):
    monkeypatch.chdir(work)
    before = tree_digest(work)
    args = [a.format(disk=full_disk) for a in FULL_DISK[case]]
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.stderr
    assert f"Error: cannot write {full_disk}/" in error_line(result.stderr, besides="warnings")
    assert os.listdir(full_disk) == ["filler"]
    assert tree_digest(work) == before


# The command's main output (written first, then the -o report), its first run and its rerun.
REPORT_LAST = {
    "split": (["split", "ds", "out"], ["--seed", "5"]),
    "convert checkpoint": (["convert", "checkpoint", "ck.pt", "w.pt"], ["--dtype", "float16"]),
    "convert-syncbn": (["convert-syncbn", "net.pt", "s.pt", "--trust-checkpoint"], ["--revert"]),
    "eval --out": (["eval", "ck.pt", "--data", "ds", "-j", "0", "--out", "ev"], ["--topk", "2"]),
}


@pytest.mark.parametrize("case", list(REPORT_LAST))
def test_a_report_on_a_read_only_disk_is_refused_before_the_main_output_is_replaced(
    runner, work, monkeypatch, small_tmpfs, case
):
    disk = small_tmpfs(64)
    if subprocess.run(["mount", "-o", "remount,ro", str(disk)]).returncode != 0:
        pytest.skip("cannot remount the tmpfs read-only")
    monkeypatch.chdir(work)
    first, rerun = REPORT_LAST[case]
    assert runner.invoke(app, first).exit_code == 0
    before = tree_digest(work)
    report = disk / "report.json"
    result = runner.invoke(app, [*first, *rerun, "--force", "--format", "json", "-o", report])
    assert result.exit_code == 1, result.stderr
    line = error_line(result.stderr, besides="warnings")
    assert line.startswith(f"Error: cannot write {report}: Read-only file system"), line
    assert tree_digest(work) == before  # the earlier output as it was, not the rerun's


@pytest.mark.parametrize("case", ["split", "eval --out"])
def test_a_report_the_full_disk_refuses_leaves_the_main_output_as_it_was(
    runner, work, monkeypatch, small_tmpfs, case
):
    """`split ds out --force -o REPORT` and `eval ... --out ev --force -o REPORT` where REPORT's
    disk is full: the new split or reports had replaced the earlier ones while the command
    failed. The earlier output and report are as they were, and nothing is left beside them."""
    monkeypatch.chdir(work)
    first, rerun = REPORT_LAST[case]
    assert runner.invoke(app, first).exit_code == 0
    before = tree_digest(work)
    disk = small_tmpfs(64)
    report = disk / "report.json"
    report.write_text('{"old": "report"}\n')
    fill_disk(disk)
    result = runner.invoke(app, [*first, *rerun, "--force", "--format", "json", "-o", report])
    assert result.exit_code == 1, result.stderr
    line = error_line(result.stderr, besides="warnings")
    assert line.startswith(f"Error: cannot write {report}: No space left"), line
    assert report.read_text() == '{"old": "report"}\n'
    assert sorted(os.listdir(disk)) == ["filler", "report.json"]
    assert tree_digest(work) == before  # the earlier output as it was, not the rerun's


# Commands whose -o report is their only output (a CSV of benchmark's rows, env's report).
REPORT_ONLY = {
    "summary": ["summary", "ck.pt"],
    "benchmark": ["benchmark", "ck.pt", "-b", "1", "--device", "cpu", "--warmup", "1"]
    + ["--iters", "1"],
    "env": ["env"],
}


@pytest.mark.parametrize("case", list(REPORT_ONLY))
def test_a_report_only_output_the_full_disk_refuses_leaves_the_old_report(
    runner, work, monkeypatch, small_tmpfs, case
):
    """`--force -o REPORT` on a full disk for a command with no other output: the old report
    is as it was (the new one is written aside and renamed over it), nothing is left beside
    it, and nothing else changed."""
    monkeypatch.chdir(work)
    before = tree_digest(work)
    disk = small_tmpfs(64)
    report = disk / "report.json"
    report.write_text('{"old": "report"}\n')
    fill_disk(disk)
    result = runner.invoke(app, [*REPORT_ONLY[case], "--force", "--format", "json", "-o", report])
    assert result.exit_code == 1, result.stderr
    line = error_line(result.stderr, besides="anything")
    assert line.startswith(f"Error: cannot write {report}: No space left"), line
    assert report.read_text() == '{"old": "report"}\n'
    assert sorted(os.listdir(disk)) == ["filler", "report.json"]
    assert tree_digest(work) == before


def test_summary_to_a_read_only_disk_is_refused_before_the_model_is_built(
    runner, work, monkeypatch, small_tmpfs
):
    disk = small_tmpfs(64)
    if subprocess.run(["mount", "-o", "remount,ro", str(disk)]).returncode != 0:
        pytest.skip("cannot remount the tmpfs read-only")
    monkeypatch.chdir(work)
    (work / "built_marker.py").write_text(
        "from pathlib import Path\nfrom torch import nn\n\n\ndef make():\n"
        "    Path('built').touch()\n    return nn.Linear(8, 4)\n"
    )
    result = runner.invoke(app, ["summary", "built_marker:make", "-i", "8", "-o", disk / "s.txt"])
    assert result.exit_code == 1, result.stderr
    line = error_line(result.stderr, besides="nothing")
    assert line.startswith(f"Error: cannot write {disk / 's.txt'}: Read-only file system"), line
    assert not (work / "built").exists()  # found with the other -o checks, not at the end


# -- SIGTERM during dataset-stats' pass ---------------------------------------------------------


def _waits_on_a_fifo(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/wchan") as handle:
            return handle.read() == "wait_for_partner"
    except OSError:
        return False


# A sitecustomize that makes reading one image hang, like a file on a dead network share: the
# worker that opens it waits for good on a FIFO nobody writes. (A FIFO named as the image itself
# is no longer opened at all: dataset-stats counts it as unreadable.)
HANG_ON_READ = """
import os

_stuck, _, _fifo = os.environ.get("TORCHKIT_TEST_HANG", "").partition("|")
_fstat = os.fstat


def _hanging_fstat(fd, *args, **kwargs):
    try:
        name = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        name = ""
    if _stuck and name.endswith(_stuck):
        open(_fifo, "rb").close()  # blocks: nobody ever writes
    return _fstat(fd, *args, **kwargs)


if _stuck:
    os.fstat = _hanging_fstat
"""


@pytest.mark.parametrize("when", ["pool starting", "pool busy"])
def test_sigterm_stops_dataset_stats_workers_and_writes_nothing(work, when, tmp_path):
    # Reading stuck.png hangs: the signal surely arrives while the pool is busy.
    hook = tmp_path / "hang-on-read"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HANG_ON_READ)
    os.mkfifo(hook / "never-written")
    (work / "ds" / "a" / "stuck.png").write_bytes((work / "ds" / "a" / "a_0.png").read_bytes())
    (work / "slow.csv").write_text(
        "path,label\nds/a/a_0.png,a\nds/a/stuck.png,a\nds/a/a_1.png,a\nds/b/b_0.png,b\n"
    )
    before = tree_digest(work)
    env = {
        "PYTHONPATH": str(hook),
        "TORCHKIT_TEST_HANG": f"{os.sep}stuck.png|{hook / 'never-written'}",
    }
    process = start_torchkit_process(
        "dataset-stats", "slow.csv", "-j", "2", "-o", "out.json", "--plot", "out.png", cwd=work,
        env=env,
    )  # fmt: skip
    if when == "pool starting":  # the first worker forked: the pool is still being made
        ready = lambda: len(processes_in_group(process.pid)) >= 2  # noqa: E731
    else:
        ready = lambda: any(map(_waits_on_a_fifo, processes_in_group(process.pid)))  # noqa: E731
    wait_until(ready, process=process, what=when)
    code, out, err = signal_and_wait(process, signal.SIGTERM, timeout=60)
    assert code == 143 and "Terminated." in err and "Traceback" not in err
    wait_until(lambda: not processes_in_group(process.pid), what="no process left")
    assert tree_digest(work) == before
