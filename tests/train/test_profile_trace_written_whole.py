"""`train --profile-steps N` on a disk that fills as the trace is written: a write error, as every
output's is (docs/conventions.md), never an empty or cut-off `epoch-K.json` kept as if written.
Kineto's own export only logs that it could not write."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from disks import fill_disk

from torchkit.core.io.errors import OutputWriteError
from torchkit.core.train.step_profiler import StepProfiler


def test_a_trace_the_disk_has_no_room_for_is_a_write_error(small_tmpfs):
    """Before: `write` returned, leaving `epoch-1.json` of 0 bytes, and the run went on as if
    its profile were written (a later --force refused the run folder for that file)."""
    folder = small_tmpfs(200) / "run" / "profile"
    folder.parent.mkdir()
    profiler = StepProfiler(folder, 1, 1, torch.device("cpu")).start()
    torch.ones(4).add(1)
    profiler.stepped()  # its one step: stopped
    table = len(profiler._table(profiler.recorded))
    fill_disk(folder.parent.parent, leave=table + 6000)  # the table fits, the trace does not
    with pytest.raises(OutputWriteError, match=r"cannot write .*epoch-1\.json: No space left"):
        profiler.write()
    assert not (folder / "epoch-1.json").exists()
    assert [p.name for p in folder.iterdir()] == ["epoch-1.txt"]


def test_a_whole_trace_is_kept(tmp_path: Path):
    profiler = StepProfiler(tmp_path / "profile", 1, 1, torch.device("cpu")).start()
    torch.ones(4).add(1)
    profiler.stepped()
    profiler.write()
    assert (tmp_path / "profile" / "epoch-1.json").read_text().rstrip().endswith("}")
