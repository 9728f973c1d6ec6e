"""`train --resume RUN` on a run folder whose last.pt is gone but whose best.pt is there: the
error says how to go on from best.pt, with the options train takes for it."""

from __future__ import annotations

from checkpoints import write_convnet_checkpoint
from processes import run_torchkit_in_process


def test_a_run_with_best_pt_alone_names_the_ways_on(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    write_convnet_checkpoint(run / "best.pt", in_channels=3, image_size=8, classes="ab")
    result = run_torchkit_in_process("train", "--resume", run)
    assert result.returncode == 1, result.stdout
    best = run / "best.pt"
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


def test_the_ways_on_quote_a_run_folder_whose_name_has_a_space(tmp_path):
    """`--resume my run/best.pt` would be two words: the commands shown are pasted as they are."""
    run = tmp_path / "my run"
    run.mkdir()
    write_convnet_checkpoint(run / "best.pt", in_channels=3, image_size=8, classes="ab")
    result = run_torchkit_in_process("train", "--resume", run)
    assert result.returncode == 1, result.stdout
    best = run / "best.pt"
    assert result.stderr.strip() == (
        f"Error: no last.pt in {run} (to go on from best.pt's epoch, pass --resume '{best}' "
        f"--out NEW; to fine-tune from its weights, start a run with --weights '{best}' --out NEW)"
    )
