"""Every command's single-file output (`-o FILE`, `--plot`, a converted checkpoint or tensor, an
exported model) into a FIFO with a reader waiting, into `/dev/null`, and at a symbolic link to
a regular file: a special file is written into (it stays what it is, and the reader gets the
whole file), `/dev/null` is a discard, and `--force` replaces a link with the new file, leaving
the file it pointed at as it was; a full TMPDIR (where a special file's file is made first) is
named as such, and a Unix socket is refused before any work."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import tempfile
import threading
from pathlib import Path

import pytest
import torch
from checkpoints import write_convnet_checkpoint
from disks import FifoReader, fill_disk
from image_folders import write_image_folder
from output_checks import error_line
from processes import run_torchkit_in_process

# command line with OUT for the output; the output's name (its extension says its format).
# The -o of eval, video-info, train, split, benchmark and extract-features is written as
# summary's is (render.emit, atomic_write); each writer here goes through atomic_write,
# atomic_write_bytes or atomic_path. Images are read in the process (-j 0): loader workers
# write nothing, and starting them cost more than the rest of a run.
WRITERS = {
    "summary -o": (["summary", "ck.pt", "-o", "OUT"], "out.json"),
    "env -o": (["env", "-o", "OUT"], "out.json"),
    "dataset-stats -o": (["dataset-stats", "ds", "-j", "0", "-o", "OUT"], "out.csv"),
    "dataset-stats --plot": (["dataset-stats", "ds", "-j", "0", "--plot", "OUT"], "out.png"),
    "predict -o": (["predict", "ck.pt", "ds", "-j", "0", "-o", "OUT"], "out.jsonl"),
    "convert checkpoint": (["convert", "checkpoint", "ck.pt", "OUT"], "out.safetensors"),
    "convert-syncbn": (["convert-syncbn", "ck.pt", "OUT"], "out.pt"),
    "convert tensor": (["convert", "tensor", "ds/a/a_0.png", "OUT"], "out.npy"),
    "export": (["export", "ck.pt", "OUT", "--to", "torchscript", "--no-verify"], "out.ts"),
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """An image folder `ds` and a torchkit checkpoint `ck.pt` of the convnet for its 8x8
    images."""
    root = tmp_path_factory.mktemp("inputs")
    write_image_folder(root / "ds", {"a": 2, "b": 2})
    torch.manual_seed(0)
    write_convnet_checkpoint(root / "ck.pt", in_channels=3, image_size=8, classes="ab")
    return root


def _run(inputs: Path, writer: str, out: str | Path, *extra: str):
    args, _ = WRITERS[writer]
    return run_torchkit_in_process(
        *[str(out) if arg == "OUT" else arg for arg in args], *extra, cwd=inputs
    )


@pytest.mark.parametrize("writer", WRITERS)
def test_a_fifo_is_written_into_in_full_and_stays_a_fifo(inputs, tmp_path, writer):
    reader = FifoReader(tmp_path / WRITERS[writer][1])
    link = tmp_path / f"link-{reader.path.name}"  # a link to the FIFO: the FIFO gets the file
    link.symlink_to(reader.path)
    done = _run(inputs, writer, link)
    written = reader.result()  # fails if the FIFO was replaced by a regular file
    assert done.returncode == 0, done.stderr
    assert written
    assert link.is_symlink() and sorted(os.listdir(tmp_path)) == sorted(
        [link.name, reader.path.name]
    )


@pytest.mark.parametrize("writer", WRITERS)
def test_dev_null_is_a_discard(inputs, writer):
    # A name without an extension: the formats that come from the name are given with --to.
    to = {"convert tensor": ["--to", "npy"], "convert checkpoint": ["--to", "safetensors"]}
    done = _run(inputs, writer, "/dev/null", *to.get(writer, []))
    assert done.returncode == 0, done.stderr
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


@pytest.mark.parametrize("writer", WRITERS)
def test_force_replaces_a_link_not_the_file_it_points_at(inputs, tmp_path, writer):
    target = tmp_path / "elsewhere.txt"
    target.write_text("precious\n")
    link = tmp_path / WRITERS[writer][1]
    link.symlink_to(target)
    refused = _run(inputs, writer, link)
    assert refused.returncode == 1 and "already exists" in refused.stderr
    done = _run(inputs, writer, link, "--force")
    assert done.returncode == 0, done.stderr
    assert not link.is_symlink() and link.stat().st_size > 0
    assert target.read_text() == "precious\n"


@pytest.mark.parametrize("writer", WRITERS)
def test_a_full_temporary_folder_is_named_not_the_output(inputs, writer, small_tmpfs, monkeypatch):
    """A file for a special file is written in TMPDIR first (its writer may seek): a full
    TMPDIR was reported as "cannot write /dev/null: No space left on device", or as torch's
    "unexpected pos 5632 vs 5584", sending the user to the output's disk."""
    staging = fill_disk(small_tmpfs(64))
    monkeypatch.setattr(tempfile, "tempdir", str(staging))  # what TMPDIR=STAGING sets
    to = {"convert tensor": ["--to", "npy"], "convert checkpoint": ["--to", "safetensors"]}
    done = _run(inputs, writer, "/dev/null", *to.get(writer, []))
    if done.returncode == 0:  # written into /dev/null as it is made: nothing staged
        return
    assert done.returncode == 1, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("Error: cannot write /dev/null: No space left on device in ") and (
        f"in {staging}, " in line and "set TMPDIR to a writable folder with room" in line
    ), line
    assert os.listdir(staging) == ["filler"]


# and the -o of train, which would train first
REFUSED_FIRST = {
    **WRITERS,
    "train -o": (["train", "--data", "ds", "--epochs", "1", "--out", "run", "-o", "OUT"], "o.json"),
}


@pytest.mark.parametrize("writer", REFUSED_FIRST)
def test_a_socket_is_refused_before_any_work(inputs, tmp_path, monkeypatch, writer):
    """A Unix socket cannot be opened to be written into: `train -o SOCKET` trained, then
    failed as "OSError: [Errno 6] No such device or address: 'SOCKET'"."""
    command, name = REFUSED_FIRST[writer]
    monkeypatch.chdir(tmp_path)  # bound by its short relative name (a socket's path is short)
    link = tmp_path / f"link-{name}"
    link.symlink_to(name)
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(name)
        for out in (tmp_path / name, link):
            done = run_torchkit_in_process(
                *[str(out) if arg == "OUT" else arg for arg in command], cwd=inputs
            )
            assert done.returncode == 1, done.stderr
            assert error_line(done.stderr, besides="warnings").endswith(
                f"is a socket, not a file: {out} (torchkit cannot open a socket to write into "
                "it: give a file, a FIFO or a device)"
            )
            assert done.stdout == "" and not (inputs / "run").exists()
    assert sorted(os.listdir(tmp_path)) == sorted([link.name, name])


@pytest.mark.parametrize("writer", ["convert-syncbn", "dataset-stats -o"])
def test_stdout_appended_to_an_input_is_refused_before_any_work(inputs, tmp_path, writer):
    """`convert-syncbn ck.pt /dev/stdout >> ck.pt` appended the new checkpoint to the source
    checkpoint, which no longer loaded; `dataset-stats ds -o /dev/stdout >> ds/notes.txt`
    wrote into the data folder. Written through the descriptor as any file output is checked:
    not an input, nor inside an input folder."""
    shutil.copy(inputs / "ck.pt", tmp_path / "ck.pt")
    write_image_folder(tmp_path / "ds", {"a": 2, "b": 2})
    appended = tmp_path / ("ck.pt" if writer == "convert-syncbn" else "ds/notes.txt")
    appended.touch()
    before = appended.read_bytes()
    fd = os.open(appended, os.O_WRONLY | os.O_APPEND)
    try:
        done = run_torchkit_in_process(
            *[f"/dev/fd/{fd}" if arg == "OUT" else arg for arg in WRITERS[writer][0]],
            cwd=tmp_path,
        )
    finally:
        os.close(fd)
    assert done.returncode == 1, done.stderr
    relation = "is the model file ck.pt" if writer == "convert-syncbn" else "lies inside"
    assert relation in error_line(done.stderr, besides="warnings")
    assert appended.read_bytes() == before


# a file and its -o report (or two reports) given one FIFO
SHARED = {
    "convert tensor": ["convert", "tensor", "ds/a/a_0.png", "OUT", "--to", "npy", "-o", "OUT"],
    "export": ["export", "ck.pt", "OUT", "--to", "torchscript", "--no-verify", "-o", "OUT"],
    "convert-syncbn": ["convert-syncbn", "ck.pt", "OUT", "-o", "OUT"],
    "dataset-stats": ["dataset-stats", "ds", "-j", "0", "--plot", "OUT", "-o", "OUT"],
}


@pytest.mark.parametrize("command", SHARED)
def test_two_outputs_into_one_fifo_are_refused_before_any_work(inputs, tmp_path, command):
    """`convert tensor x.png /dev/stdout --to npy -o /dev/stdout`, or one FIFO for both: the
    reader got the file and the report one after the other, as one stream. /dev/null (a
    device) still takes both."""
    fifo = tmp_path / "shared"
    os.mkfifo(fifo)
    received, stop = [], threading.Event()

    def read_every_writer() -> None:  # each output opens the FIFO anew: none waits forever
        while not stop.is_set():
            with open(fifo, "rb") as handle:
                received.append(handle.read())

    reader = threading.Thread(target=read_every_writer, daemon=True)
    reader.start()
    args = [str(fifo) if arg == "OUT" else arg for arg in SHARED[command]]
    done = run_torchkit_in_process(*args, cwd=inputs)
    stop.set()
    while reader.is_alive():  # its last open let go, whenever it reaches it (ENXIO before)
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(0.01)
    assert not any(received)
    assert done.returncode == 1, done.stderr
    assert "is the same file as" in done.stderr and "give each output its own file" in done.stderr
    discarded = ["/dev/null" if arg == "OUT" else arg for arg in SHARED[command]]
    assert run_torchkit_in_process(*discarded, cwd=inputs).returncode == 0


# Each command that writes a folder, with OUT for the folder.
FOLDER_WRITERS = {
    "train": ["train", "--data", "ds", "--model", "convnet", "--epochs", "1", "--out", "OUT"],
    "split": ["split", "ds", "OUT"],
    "convert tensor": ["convert", "tensor", "ds", "OUT", "--to", "npy"],
    "extract-features": ["extract-features", "ck.pt", "ds", "--out", "OUT"],
}


@pytest.mark.parametrize("writer", FOLDER_WRITERS)
def test_a_fifo_socket_or_device_as_an_output_folder_is_named_for_what_it_is(
    inputs, tmp_path, monkeypatch, writer
):
    """`train --out SOCKET` was refused as "a file, not a folder", and `split ds FIFO` as
    "cannot read FIFO/.torchkit-split.json: Not a directory": the refusal says what OUT is."""
    monkeypatch.chdir(tmp_path)  # the socket bound by its short relative name
    os.mkfifo(tmp_path / "fifo")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind("sock")
        for out, kind in [(tmp_path / "fifo", "a FIFO"), (tmp_path / "sock", "a socket")] + [
            (Path(os.devnull), "a device")
        ]:
            args = [str(out) if arg == "OUT" else arg for arg in FOLDER_WRITERS[writer]]
            done = run_torchkit_in_process(*args, cwd=inputs)
            line = error_line(done.stderr, besides="warnings")
            if writer == "convert tensor":  # a usage error: a folder converts into a folder
                assert done.returncode == 2, done.stderr
                assert line.endswith(f"is a folder but {out} is {kind} (give a folder as DST)")
            else:
                assert done.returncode == 1, done.stderr
                assert line.endswith(f"is {kind}, not a folder: {out} (give a folder name)")
            assert done.stdout == ""
    assert sorted(os.listdir(tmp_path)) == ["fifo", "sock"]  # nothing beside them
