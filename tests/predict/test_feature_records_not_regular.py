"""The records extract-features and every output folder keep (meta.json, .partial/progress.json,
.partial/errors.jsonl, a --force run's `.torchkit-written`) are read only where they are regular
files: a FIFO under such a name blocked the read for ever, waiting for a writer that never came."""

from __future__ import annotations

import os
from pathlib import Path

from checkpoints import write_convnet_checkpoint
from disks import fifo_never_opened
from image_folders import write_image_folder
from output_checks import error_line
from processes import run_torchkit_in_process

from torchkit.core.features import store
from torchkit.core.io import outputs
from torchkit.core.io.output_paths import WRITTEN_JOURNAL


def test_a_fifo_as_meta_json_in_out_is_no_record_of_a_run(tmp_path: Path):
    """Before: `extract-features ... --force` on that OUT waited for ever (`known_files`)."""
    write_image_folder(tmp_path / "data", {"a": 1, "b": 1})
    write_convnet_checkpoint(tmp_path / "m.pt", in_channels=3, image_size=8, classes="ab")
    out = tmp_path / "out"
    out.mkdir()
    with fifo_never_opened(out / "meta.json", seconds=2):
        assert store.known_files(out) == ()
        result = run_torchkit_in_process(
            "extract-features", "m.pt", "data", out, "--force", "-j", "0", cwd=tmp_path
        )
        assert result.returncode == 1
        assert "was not written by torchkit" in error_line(result.stderr)


def test_a_fifo_as_the_progress_record_or_errors_log_is_never_opened(tmp_path: Path):
    partial = tmp_path / "out" / ".partial"
    partial.mkdir(parents=True)
    (partial / "logits.npy").write_bytes(b"")
    with fifo_never_opened(partial / "progress.json", seconds=2):
        assert not store.is_recorded_array(partial / "logits.npy")
        assert store.known_files(tmp_path / "out") == ()
    from torchkit.core.features import extract

    with fifo_never_opened(partial / "errors.jsonl", seconds=2):
        assert not extract._is_errors_log(partial / "errors.jsonl")


def test_a_fifo_as_a_killed_runs_list_of_names_is_never_opened(tmp_path: Path):
    """The names a killed --force run wrote, which the next run removes: a FIFO there waited."""
    folder = tmp_path / "out"
    folder.mkdir()
    with fifo_never_opened(folder / WRITTEN_JOURNAL, seconds=2):
        names = outputs._killed_runs_names(folder)
    assert [os.path.basename(name) for name in names] == [".torchkit", WRITTEN_JOURNAL]
