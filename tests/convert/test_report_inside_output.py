"""`convert tensor` (a folder SRC) and `convert cifar` with their `-o` report inside the output
folder they put in place: the report was written before the swap, into the old folder the swap
then deleted (`--force`: "wrote DST/report.json", and no such file), or where the new folder was
to go (no old one: "made or changed by another process"). It is written after the swap now, and
a rerun's --force takes it for the run's own."""

from __future__ import annotations

import json

from image_folders import write_image_folder
from processes import run_torchkit_in_process
from test_safety_convert import write_cifar10


def _report_kept(out, *command) -> None:
    for force in ((), ("--force",), ("--force",)):  # new, replaced, replaced again
        done = run_torchkit_in_process(*command, "-o", out / "report.json", "-q", *force)
        assert done.returncode == 0, done.stderr
        assert json.loads((out / "report.json").read_text())  # there, and whole
        assert (out / ".torchkit").is_file()


def test_convert_tensor_writes_a_report_inside_its_new_folder_after_the_swap(tmp_path):
    source = tmp_path / "src"
    write_image_folder(source, {"a": 1, "b": 1})
    out = tmp_path / "arrays"
    _report_kept(out, "convert", "tensor", source, out, "--to", "npy", "-j", "0")
    assert len(list(out.rglob("*.npy"))) == 2


def test_convert_cifar_writes_a_report_inside_its_new_folder_after_the_swap(tmp_path):
    source = write_cifar10(tmp_path / "cifar", train=2, test=2)
    out = tmp_path / "pngs"
    _report_kept(out, "convert", "cifar", source, out, "-j", "0")
    assert len(list(out.rglob("*.png"))) == 4
