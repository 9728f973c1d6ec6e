"""train's own handlers (StopOnSignal) record a signal whose stop they raise, as every command's
handler does: a SIGTERM handled inside a finalizer before training starts, whose exception
Python drops (every later signal then ignored), ended the run with exit 0 and Python's report
of the dropped exception; it ends with 143 and `Terminated.` as every other command does."""

from __future__ import annotations

import textwrap

from image_folders import write_image_folder
from processes import run_torchkit_process

# A model whose build runs a finalizer that sends SIGTERM: the handler raises inside it.
MODEL_MODULE = """
import signal
import weakref

from torch import nn


class _Finalized:
    pass


def build(num_classes=2, **kwargs):
    target = _Finalized()
    weakref.finalize(target, signal.raise_signal, signal.SIGTERM)
    del target  # the finalizer runs now: the stop raised in it is dropped
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, num_classes))
"""


def test_a_stop_dropped_before_training_still_ends_train_with_143(tmp_path):
    (tmp_path / "dropping_model.py").write_text(textwrap.dedent(MODEL_MODULE))
    data = write_image_folder(tmp_path / "data", {"a": 2, "b": 2})
    result = run_torchkit_process(
        "train", "--model", "dropping_model:build", "--data", data, "--val-split", "0.5",
        "--epochs", "1", "--batch-size", "2", "--image-size", "8", "--out", tmp_path / "run",
        "-j", "0", "--device", "cpu", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 143, result.stderr
    assert result.stderr.strip().splitlines()[-1] == "Terminated.", result.stderr
    assert "Exception ignored" not in result.stderr and "Traceback" not in result.stderr
