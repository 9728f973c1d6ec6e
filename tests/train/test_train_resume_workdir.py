"""--resume of a run whose relative --data is read in the working directory its checkpoint
records (`data.workdir`): never silently, and a record made by hand is no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from image_folders import write_image_folder

from torchkit.cli import app
from torchkit.core.data.sources.required import recorded_data_from_here
from torchkit.core.io.errors import InputError

OPTIONS = ["--model", "nets:TinyNet", "--image-size", "8", "--batch-size", "4", "--workers", "0"]


def test_a_copied_run_reads_other_data_in_its_recorded_folder_with_a_note(
    tmp_path, runner, monkeypatch
):
    """A run folder copied where its recorded working directory holds other data of the same
    relative name, and nothing of that name here: the data is read there (the classes match,
    the image count too) but never without a word; it was trained on without one."""
    write_image_folder(tmp_path / "start" / "data", {"a": 4, "b": 4}, seed=1)
    monkeypatch.chdir(tmp_path / "start")
    trained = runner.invoke(
        app, ["train", "--data", "data", *OPTIONS, "--epochs", "1", "--out", "../run"]
    )
    assert trained.exit_code == 0, trained.stderr
    # Another machine's folder of that name: other images of the same classes and count.
    write_image_folder(tmp_path / "start" / "data", {"a": 4, "b": 4}, seed=7)
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    resumed = runner.invoke(
        app, ["train", "--resume", "../run", "--epochs", "2", "--trust-checkpoint"]
    )
    assert resumed.exit_code == 0, resumed.stderr
    assert resumed.stderr.startswith(
        f"Note: --data data, which {Path('../run/last.pt')} records, is read in "
        f"{tmp_path / 'start'}, where the run trained, not here\n"
    )


@pytest.mark.parametrize("workdir", [5, ["/x"], {"a": 1}, "relative/dir", "/bad\0dir"])
def test_a_recorded_working_directory_that_is_no_absolute_path_is_not_read(
    tmp_path, monkeypatch, workdir
):
    """A checkpoint made or edited by hand: `workdir` an int (which os.stat reads as a file
    descriptor), a list, a relative path, a NUL in it was 'Error: TypeError: ...' or read
    from somewhere; it is passed over as a checkpoint that records none."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    record = {"root": str(tmp_path / "data"), "workdir": workdir}
    assert recorded_data_from_here("data", record, "r/last.pt") == "data"
    with pytest.raises(InputError) as missing:
        recorded_data_from_here("gone", record, "r/last.pt")
    assert missing.value.hint == (
        "resume from the folder the run started in, or give --data again as a path from here"
    )
    assert recorded_data_from_here("data", "not a record", "r/last.pt") == "data"
