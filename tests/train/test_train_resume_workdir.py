"""--resume of a run whose relative --data is read in the working directory its checkpoint
records (`data.workdir`): never silently, a record made by hand one error line, and the
folder kept out of checkpoints that do not need it and of exported files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
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


def test_the_working_directory_is_recorded_only_for_a_relative_data(tmp_path, runner, monkeypatch):
    """An absolute --data needs no working directory to be found again: none is recorded
    (a home folder, a user name) in a checkpoint users share. A relative one records it."""
    write_image_folder(tmp_path / "data", {"a": 4, "b": 4}, seed=1)
    monkeypatch.chdir(tmp_path)
    for data, out in ((str(tmp_path / "data"), "absolute"), ("data", "relative")):
        trained = runner.invoke(
            app, ["train", "--data", data, *OPTIONS, "--epochs", "1", "--out", out]
        )
        assert trained.exit_code == 0, trained.stderr
    workdir = {
        out: torch.load(tmp_path / out / "last.pt", weights_only=True)["data"]["workdir"]
        for out in ("absolute", "relative")
    }
    assert workdir == {"absolute": "", "relative": str(tmp_path)}


def test_an_exported_file_does_not_carry_the_working_directory():
    from torchkit.core.data.preprocessing import Preprocess
    from torchkit.core.models.exported.metadata import build_metadata

    record = {"spec": "data", "root": "/home/ann/p/data", "workdir": "/home/ann/p", "sizes": {}}
    fields = build_metadata(
        fmt="onnx",
        arch="convnet",
        classes=["a", "b"],
        preprocess=Preprocess(image_size=8),
        input_shape=(1, 3, 8, 8),
        batch_size=None,
        dtype="float32",
        opset=None,
        weights_source=None,
        data=record,
    )
    assert fields["data"] == {"spec": "data", "root": "/home/ann/p/data", "sizes": {}}


def test_shards_in_part_where_the_run_trained_are_read_there_for_the_reader_to_name(
    tmp_path, monkeypatch
):
    """One shard of two gone from where the run trained, none here: 'dataset not found ...
    (give --data again where the data is now)', where the data still was; its reader names
    the missing shard, as it does from that folder."""
    start, here = tmp_path / "start", tmp_path / "here"
    (start / "shards").mkdir(parents=True)
    (start / "shards" / "s-0.tar").write_bytes(b"")
    here.mkdir()
    monkeypatch.chdir(here)
    record = {"root": str(start / "shards"), "workdir": str(start)}
    spec = "shards/s-{0..1}.tar"
    assert recorded_data_from_here(spec, record, "r/last.pt") == f"{start}/{spec}"
