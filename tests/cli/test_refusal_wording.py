"""Refusals that said something beside the point, each now one line saying what is wrong and
what to write instead: a NaN for a bounded number (`train --min-lr nan`), `-` as convert
tensor's DST, an integer `summary --dtype` for a model of float layers, and an output folder
whose lock the folder above cannot hold (`split raw /proc/self --force`)."""

from __future__ import annotations

import os

import pytest
from image_folders import make_class_files, write_image_folder
from output_checks import error_line
from processes import run_torchkit_in_process


@pytest.mark.parametrize(
    ("option", "value", "bounds"),
    [("--min-lr", "nan", ">= 0"), ("--warmup-epochs", "NaN", ">= 0")],
)
def test_nan_for_a_bounded_number_says_it_is_not_a_number(tmp_path, option, value, bounds):
    # Was: "Invalid value for '--min-lr': Input should be greater than or equal to 0".
    done = run_torchkit_in_process(
        "train", "--data", "digits", "--model", "convnet", option, value, "--out", tmp_path / "r"
    )
    assert done.returncode == 2
    assert error_line(done.stderr) == (
        f"Error: {option} must be a finite number, not {value} (give a number {bounds})"
    )
    assert not (tmp_path / "r").exists()


def test_dash_as_convert_tensors_dst_says_how_to_write_to_stdout(tmp_path):
    # Was: "output folder cannot go to standard output", of a DST that names a file.
    write_image_folder(tmp_path / "images", {"a": 1})
    image = tmp_path / "images" / "a" / "a_0.png"
    done = run_torchkit_in_process("convert", "tensor", image, "-", cwd=tmp_path)
    assert done.returncode == 2
    line = error_line(done.stderr)
    assert line == (
        "Error: DST cannot go to standard output: '-' is stdout only for -o (for stdout give "
        '/dev/stdout with --to npy, pt, safetensors, png...; else a file name, "$PWD/-" for '
        "one called '-')"
    )
    done = run_torchkit_in_process("convert", "tensor", tmp_path / "images", "-", cwd=tmp_path)
    assert error_line(done.stderr).endswith("""(give a folder name, "$PWD/-" for one called '-')""")
    assert sorted(os.listdir(tmp_path)) == ["images"]


def test_an_integer_dtype_for_a_float_model_says_which_dtypes_it_takes():
    # Was: "... Input type (long int) and bias type (float) should be the same (check
    # --input-size (and --dtype))".
    done = run_torchkit_in_process("summary", "convnet", "--dtype", "int64")
    assert done.returncode == 2
    line = error_line(done.stderr)
    assert line.startswith("Error: ConvNet cannot run on an input of shape (1, 3, 28, 28): ")
    assert line.endswith(
        "(its layers take floating-point inputs, not int64: give --dtype float32, float16, "
        "bfloat16 or float64; an integer --dtype is for inputs that are indices, such as an "
        "Embedding's)"
    )


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_an_output_folder_whose_lock_cannot_be_made_names_the_folder_that_refused(tmp_path):
    # /proc takes no new file (the lock .self.torchkit-lock): was "cannot write /proc/self: No
    # such file or directory (free some space, check the permissions, ...)".
    make_class_files(tmp_path / "raw", {"a": 2, "b": 2})
    done = run_torchkit_in_process("split", "raw", "/proc/self", "--force", cwd=tmp_path)
    assert done.returncode == 1
    assert error_line(done.stderr) == (
        "Error: output folder /proc/self cannot be written: /proc takes no new files, not even "
        "the lock torchkit keeps beside it (.self.torchkit-lock) (choose an output folder on a "
        "disk that holds files)"
    )


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_a_report_in_a_folder_that_takes_no_file_is_refused_before_any_work(tmp_path):
    # The check of -o's folder made its probe file in /proc: was "Error: FileNotFoundError:
    # [Errno 2] No such file or directory: '/proc/.r.XXXX.tmp' (set TORCHKIT_DEBUG=1 ...)".
    make_class_files(tmp_path / "raw", {"a": 2})
    done = run_torchkit_in_process(
        "convert", "shards", "raw", "out", "-o", "/proc/r.json", cwd=tmp_path
    )
    assert done.returncode == 1
    assert error_line(done.stderr) == (
        "Error: cannot write /proc/r.json: /proc takes no new files (choose another output, "
        "on a disk that holds files)"
    )
    assert sorted(os.listdir(tmp_path)) == ["raw"]


def test_an_existing_folder_as_a_file_output_is_one_usage_error_in_every_command(tmp_path):
    # Was: exit 2 "Invalid value for 'OUT': file 'dst' is a directory" (export, summary, predict,
    # benchmark) but exit 1 "DST is a folder, not a file: dst" (convert-syncbn, convert).
    import torch

    torch.save({"w": torch.zeros(1)}, tmp_path / "c.pt")
    (tmp_path / "d.pt").mkdir()
    cases = [
        (["convert-syncbn", "c.pt", "d.pt"], "DST"),
        (["convert-syncbn", "c.pt", "--out", "d.pt"], "--out"),
        (["convert", "checkpoint", "c.pt", "d.pt"], "output"),
        (["export", "resnet18", "d.pt"], "OUT"),
        (["summary", "resnet18", "-o", "d.pt"], "--output"),
    ]
    for args, name in cases:
        done = run_torchkit_in_process(*args, cwd=tmp_path)
        assert done.returncode == 2, (args, done.stderr)
        assert error_line(done.stderr) == (
            f"Error: {name} d.pt is a folder, not a file (give a file name)"
        ), args
    assert sorted(os.listdir(tmp_path)) == ["c.pt", "d.pt"] and not os.listdir(tmp_path / "d.pt")
