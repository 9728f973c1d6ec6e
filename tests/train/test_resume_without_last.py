"""`train --resume RUN` on a run folder whose last.pt is gone but whose best.pt is there: the
error says how to go on from best.pt, with the options train takes for it."""

from __future__ import annotations

import pytest
from checkpoints import write_convnet_checkpoint
from processes import run_torchkit_in_process


@pytest.mark.parametrize(("name", "quote"), [("run", ""), ("my run", "'")])
def test_a_run_with_best_pt_alone_names_the_ways_on(tmp_path, name, quote):
    """The commands shown are pasted as they are: `--resume my run/best.pt` would be two words."""
    run = tmp_path / name
    run.mkdir()
    write_convnet_checkpoint(run / "best.pt", in_channels=3, image_size=8, classes="ab")
    result = run_torchkit_in_process("train", "--resume", run)
    assert result.returncode == 1, result.stdout
    best = f"{quote}{run / 'best.pt'}{quote}"
    assert result.stderr.strip() == (
        f"Error: no last.pt in {run} (to go on from best.pt's epoch, pass --resume {best} "
        f"--out NEW; to fine-tune from its weights, start a run with --weights {best} --out NEW)"
    )


def test_a_folder_without_checkpoints_keeps_its_hint(tmp_path):
    result = run_torchkit_in_process("train", "--resume", tmp_path)
    assert result.returncode == 1, result.stdout
    assert result.stderr.strip() == (
        f"Error: no last.pt in {tmp_path} (give the run folder of an earlier `torchkit train`)"
    )
