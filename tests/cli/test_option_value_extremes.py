"""Option values at the edges of what the numbers hold: each is one usage error line naming the
option, before any work and with nothing written, never a run whose outputs are all NaN."""

from __future__ import annotations

import pytest
from checkpoints import write_convnet_checkpoint
from image_commands import IMAGE_COMMANDS, image_command
from output_checks import error_line
from processes import run_torchkit_in_process


@pytest.mark.parametrize("command", IMAGE_COMMANDS)
@pytest.mark.parametrize(
    ("values", "named"),
    [
        (["--mean", "1e308"], "--mean 1e+308"),  # inf in float32
        (["--std", "1e308"], "--std 1e+308"),
        (["--std", "1e-40"], "--std 1e-40,1e-40,1e-40 is too small"),  # pixels of 5e39
        (["--mean", "1e38", "--std", "0.2"], "--std 0.2,0.2,0.2 is too small for --mean 1e+38"),
    ],
)
def test_a_mean_or_std_beyond_float32_is_refused(command, values, named, image_folder, tmp_path):
    words = image_command(command, image_folder, tmp_path)
    result = run_torchkit_in_process(*words, *values)
    assert result.returncode == 2, result.stderr
    line = error_line(result.stderr)
    assert named in line and "float32" in line, line
    assert not [path for path in tmp_path.iterdir() if path.name.startswith("out")]


@pytest.mark.parametrize("command", ["eval", "predict", "extract-features"])
@pytest.mark.parametrize("side", ["7", "3"])
def test_an_image_size_a_fixed_size_checkpoint_does_not_take_is_one_line(
    command, side, image_folder, tmp_path
):
    # The convnet's classifier is sized for the 8x8 images it was built for: at 7 its linear
    # layer fails, at 3 its convolution does; either way one line naming the size (exit 1),
    # and the size it was trained on (before: "check --image-size", which did not say it).
    words = image_command(command, image_folder, tmp_path)
    result = run_torchkit_in_process(*words, "--image-size", side)
    assert result.returncode == 1, result.stderr
    line = error_line(result.stderr)
    assert f"fails on {side}x{side} images: " in line, line
    assert line.endswith("(it was trained on 8x8 images: give --image-size 8, or leave it out)")
    assert not [path for path in tmp_path.iterdir() if path.name.startswith("out")]


@pytest.mark.parametrize(
    ("batch", "named"),
    [
        (str(2**40), f"--batch-size {2**40} needs"),  # past memory: torch's allocator failed
        ("99999999999999999999", "--batch-size 99999999999999999999 is more than a batch can"),
    ],
)
def test_export_refuses_a_batch_size_no_example_batch_holds(batch, named, tmp_path):
    ckpt = tmp_path / "ck.pt"
    write_convnet_checkpoint(ckpt, in_channels=3, image_size=8, classes="ab")
    result = run_torchkit_in_process("export", ckpt, tmp_path / "out.ts", "--batch-size", batch)
    assert result.returncode == 2, result.stderr
    assert named in error_line(result.stderr)
    assert not (tmp_path / "out.ts").exists()


@pytest.mark.parametrize("command", ["summary", "benchmark"])
def test_a_num_classes_no_head_can_hold_is_refused_before_it_is_built(command, monkeypatch):
    # Before: torch's "can't allocate memory" (2**31) or "TypeError: empty() ... Overflow"
    # (past int64), exit 1 with the debug hint.
    from torchkit.core.runtime import memory

    monkeypatch.setattr(memory, "available_memory", lambda: 10**8)  # half of it: 50 MB
    past_index = run_torchkit_in_process(command, "convnet", "--num-classes", str(10**20))
    assert past_index.returncode == 2, past_index.stderr
    assert f"--num-classes {10**20} is more than a tensor can index" in error_line(
        past_index.stderr
    )
    # convnet's head takes 128 inputs: 100,000 classes need 51.6 MB, 40,000 fit (20.6 MB).
    past_memory = run_torchkit_in_process(command, "convnet", "--num-classes", "100000")
    assert past_memory.returncode == 2, past_memory.stderr
    assert error_line(past_memory.stderr) == (
        "Error: --num-classes 100000 needs 0.1 GB for a classifier of 128 x 100,000 weights, "
        "more than half the 0.1 GB free (give a smaller --num-classes)"
    )
    if command == "summary":
        fits = run_torchkit_in_process(command, "convnet", "--num-classes", "40000")
        assert fits.returncode == 0, fits.stderr


def test_a_num_classes_is_sized_for_every_classifier_layer_of_the_model(monkeypatch):
    # GoogLeNet classifies three times (fc, aux1.fc2, aux2.fc2; 1,024 inputs each): 10,000
    # classes fit in one (41 MB), not in three (123 MB). Before: built, only the first counted.
    from torchkit.core.runtime import memory

    monkeypatch.setattr(memory, "available_memory", lambda: 10**8)  # half of it: 50 MB
    result = run_torchkit_in_process("summary", "googlenet", "--num-classes", "10000")
    assert result.returncode == 2, result.stderr
    assert error_line(result.stderr) == (
        "Error: --num-classes 10000 needs 0.1 GB for 3 classifiers of (1,024 + 1,024 + 1,024) x "
        "10,000 weights, more than half the 0.1 GB free (give a smaller --num-classes)"
    )


def test_train_names_the_image_size_given_when_its_resize_is_past_memory(image_folder, tmp_path):
    # The resize follows --image-size (the folder's 8/7 ratio). Before: "--resize-size 114286
    # needs ...", an option the user never gave; eval's check names --image-size already.
    out = tmp_path / "out"
    words = [w.format(data=image_folder, ckpt="", out=out) for w in IMAGE_COMMANDS["train"]]
    words[words.index("--image-size") + 1] = "100000"  # 120 GB an image, 156 GB resized
    result = run_torchkit_in_process(*words)
    assert result.returncode == 2, result.stderr
    line = error_line(result.stderr)
    assert line.startswith("Error: --image-size 100000 (resized to 114286 first) needs "), line
    assert not out.exists()


@pytest.mark.parametrize("side", [2**40, 2**63])
def test_dataset_stats_refuses_a_resize_no_image_fits_in(side, image_folder):
    # Before: PIL overflowed resizing each image, counted as damaged ("none of the 5 image
    # files could be read"), exit 1: the images blamed for the option.
    result = run_torchkit_in_process("dataset-stats", image_folder, "--resize", side, "-j", "0")
    assert result.returncode == 2, result.stderr
    assert error_line(result.stderr).startswith(f"Error: --resize {side} needs "), result.stderr


def test_dataset_stats_refuses_a_resize_past_half_the_memory(image_folder, monkeypatch):
    # Before: each image was resized in memory anyway (--resize 100000: 30 GB an 8x8 image,
    # left to the OOM killer). Here the machine has 10 MB, and 2,000 px need 48 MB.
    import os

    sysconf = os.sysconf
    pages = {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 2560}
    monkeypatch.setattr(os, "sysconf", lambda name: pages.get(name) or sysconf(name))
    result = run_torchkit_in_process("dataset-stats", image_folder, "--resize", 2000, "-j", "0")
    assert result.returncode == 2, result.stderr
    line = error_line(result.stderr)
    assert line.startswith("Error: --resize 2000 needs ") and "half this machine's" in line, line


@pytest.mark.parametrize("limit", ["0.5", "1e-9", "0.0001KB"])
def test_benchmark_refuses_a_memory_limit_under_a_byte(limit):
    # Before: taken as a limit of 0 bytes; the search then failed at batch 1 with "does not
    # fit: over the memory limit", after building and running the model.
    args = ["convnet", "--image-size", "8", "--find-batch-size", "--memory-limit", limit]
    result = run_torchkit_in_process("benchmark", *args)
    assert result.returncode == 2, result.stderr
    assert error_line(result.stderr).startswith(f"Error: --memory-limit '{limit}' is ")


@pytest.mark.parametrize("limit", ["\uff13%", "0%", "101%", "half%"])
def test_benchmark_refuses_a_memory_limit_percentage_out_of_range_or_not_in_ascii(limit):
    # A full-width digit was read by float() as 3%: numbers in options are ASCII only.
    args = ["convnet", "--image-size", "8", "--find-batch-size", "--memory-limit", limit]
    result = run_torchkit_in_process("benchmark", *args)
    assert result.returncode == 2, result.stderr
    line = error_line(result.stderr)
    assert line == f"Error: --memory-limit {limit!r} is not a percentage in (0, 100] (e.g. 50%)", (
        line
    )


@pytest.mark.parametrize(
    ("destination", "extra", "shown"),
    [
        ("out.npy", ["--quality", "50"], "Error: --quality 50 has no effect here: "),
        ("out.png", ["--quality", "50"], "Error: --quality 50 has no effect here: "),
        ("out", ["--to", "png", "--quality", "50"], "Error: --quality 50 has no effect here: "),
        ("out.png", ["--nrow", "3"], "Error: --nrow 3 goes with --grid "),
    ],
)
def test_convert_tensor_refuses_image_options_that_would_do_nothing(
    destination, extra, shown, image_folder, tmp_path
):
    # Before: written at full quality and without a grid, exit 0, the option silently ignored
    # (as --key and --dtype for an image output are refused).
    source = image_folder / "a" if destination == "out" else image_folder / "a" / "a_0.png"
    result = run_torchkit_in_process("convert", "tensor", source, tmp_path / destination, *extra)
    assert result.returncode == 2, result.stderr
    assert error_line(result.stderr).startswith(shown), result.stderr
    assert not (tmp_path / destination).exists()


def test_convert_tensor_takes_quality_for_jpeg_and_webp_and_nrow_with_grid(image_folder, tmp_path):
    source = image_folder / "a" / "a_0.png"
    for name in ("q.jpg", "q.webp"):
        result = run_torchkit_in_process(
            "convert", "tensor", source, tmp_path / name, "--quality", 10
        )
        assert result.returncode == 0, result.stderr
    grid = ["--grid", "--nrow", "2"]
    result = run_torchkit_in_process("convert", "tensor", source, tmp_path / "g.png", *grid)
    assert result.returncode == 0, result.stderr
