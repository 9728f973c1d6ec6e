"""SIGHUP (the terminal closed, an ssh connection lost) stops a command as SIGTERM does; a SIGHUP
the process was started ignoring (nohup) stays ignored."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

from checkpoints import write_convnet_checkpoint
from image_folders import write_image_folder
from PIL import Image
from processes import run_torchkit_process, signal_and_wait, start_torchkit_process, wait_until
from signal_placement import signalled_on_first_import
from suite_paths import HELPERS


@contextlib.contextmanager
def inherited_as_ignored(signum: int) -> Iterator[None]:
    """`signum` ignored in this process for the block: a torchkit process started in it
    inherits it ignored, as from nohup or a shell's background job."""
    before = signal.signal(signum, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signum, before)


def model_image_and_out(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A checkpoint, an image for `predict -` to read and an empty folder for its report."""
    checkpoint = tmp_path / "m.pt"
    write_convnet_checkpoint(checkpoint, in_channels=3, image_size=8, classes="ab")
    (tmp_path / "images").mkdir()
    image = tmp_path / "images" / "a.png"
    Image.new("RGB", (8, 8), (200, 10, 10)).save(image)
    out = tmp_path / "out"
    out.mkdir()
    return checkpoint, image, out


def predict_waiting_for_more_paths(checkpoint: Path, image: Path, out: Path) -> subprocess.Popen:
    """`predict -` given `image` on a list left open, so that it waits for more paths, its
    report's temporary file made in `out`."""
    process = start_torchkit_process(
        "predict", "--device", "cpu", str(checkpoint), "-", "-o", str(out / "preds.csv"),
        "-j", "0", stdin=subprocess.PIPE,
    )  # fmt: skip
    try:
        process.stdin.write(f"{image}\n")
        process.stdin.flush()  # the list stays open: the command waits for more paths
        wait_until(lambda: os.listdir(out), process=process, what="the report's temporary")
    except BaseException:
        process.kill()
        raise
    return process


def test_a_hang_up_stops_a_command_as_sigterm_does_leaving_no_file(tmp_path):
    """Before: SIGHUP killed the process outright (exit 129 in a shell, no line), leaving the
    report's temporary file (and a run folder's lock file) behind."""
    checkpoint, image, out = model_image_and_out(tmp_path)
    process = predict_waiting_for_more_paths(checkpoint, image, out)
    try:
        code, stdout, stderr = signal_and_wait(process, signal.SIGHUP)
    finally:
        process.kill()
    assert code == 143, stderr
    assert stderr.strip().splitlines()[-1] == "Terminated." and "Traceback" not in stderr
    assert os.listdir(out) == [] and stdout == ""


def test_a_hang_up_while_torchkit_starts_ends_it_with_one_line(tmp_path):
    # SIGHUP while the CLI's command modules are imported: before a command's handlers are set
    hang_up_while_starting = signalled_on_first_import(tmp_path, "torchkit.cli.split", "SIGHUP")
    done = run_torchkit_process("env", env=hang_up_while_starting)
    assert done.returncode == 143
    assert done.stderr.splitlines() == ["Terminated."] and done.stdout == ""


def test_a_hang_up_ignored_at_start_stays_ignored(tmp_path):
    """`nohup torchkit ...`: the command runs to its end through a SIGHUP."""
    hang_up_while_starting = signalled_on_first_import(tmp_path, "torchkit.cli.split", "SIGHUP")
    with inherited_as_ignored(signal.SIGHUP):
        done = run_torchkit_process("env", "--format", "json", env=hang_up_while_starting)
    assert done.returncode == 0, done.stderr
    assert "python" in json.loads(done.stdout)


def test_a_signal_ignored_at_start_stays_ignored_while_the_command_runs(tmp_path):
    """A shell starts a background job (`torchkit ... &` in a script) with SIGINT ignored, so
    that a Ctrl-C meant for the script leaves it running; torchkit kept it ignored while it
    started. Before: the command's own handlers took it back (a Ctrl-C then gave exit 130)."""
    checkpoint, image, out = model_image_and_out(tmp_path)
    with inherited_as_ignored(signal.SIGINT):
        process = predict_waiting_for_more_paths(checkpoint, image, out)
    try:
        process.send_signal(signal.SIGINT)
        process.stdin.close()  # the list ends: the command finishes
        assert process.wait(timeout=120) == 0, process.stderr.read()
    finally:
        process.kill()
    assert os.listdir(out) == ["preds.csv"]
    assert (out / "preds.csv").read_text().count(str(image)) == 1


def test_a_ctrl_c_ignored_at_start_stays_ignored_while_train_trains(tmp_path):
    """train's own handlers (StopOnSignal) keep an inherited SIG_IGN too: the background job's
    run trains to its end through a Ctrl-C sent on its 3rd update. Before: the Ctrl-C
    stopped it (last.pt of epoch 1, exit 130)."""
    data = write_image_folder(tmp_path / "data", {"a": 4, "b": 4})
    out = tmp_path / "run"
    with inherited_as_ignored(signal.SIGINT):
        done = run_torchkit_process(
            "train", "--data", str(data), "--model", "nets:NoisyNet", "--image-size", "8",
            "--epochs", "2", "--batch-size", "2", "-j", "0", "--device", "cpu",
            "--out", str(out), "--format", "json",
            env={"PYTHONPATH": str(HELPERS), "TORCHKIT_TEST_SIGINT_AT": "3"},
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(json.loads(done.stdout)["history"]) == 2 and "Interrupted" not in done.stderr
