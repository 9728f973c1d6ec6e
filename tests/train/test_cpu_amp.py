"""--amp on a CPU that emulates its autocast dtype (no AVX512-BF16 or AMX for bfloat16) ran 4.3x
slower than float32 without a word: one `Warning:` line says so, in every command that takes
--amp; a CPU that computes the dtype natively gets none."""

from __future__ import annotations

import pytest
import torch
from image_folders import write_image_folder

from torchkit.cli import app

NATIVE_BF16_PROBES = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
WARNING = "Warning: this CPU has no AVX512-BF16 or AMX, so --amp computes bfloat16 by emulation"


@pytest.fixture
def cpu_bf16(monkeypatch):
    """`cpu_bf16(native)`: the CPU as torch's probes report it, on an x86 machine."""

    def set_native(native: bool) -> None:
        monkeypatch.setattr("platform.machine", lambda: "x86_64")
        for probe in NATIVE_BF16_PROBES:
            monkeypatch.setattr(torch.cpu, probe, lambda: native)

    return set_native


@pytest.mark.parametrize("native", [False, True])
def test_train_warns_once_when_the_cpu_emulates_bf16(runner, tmp_path, cpu_bf16, native):
    cpu_bf16(native)
    data = tmp_path / "data"  # every split a run computes in: train, val and test
    for split, seed in (("train", 1), ("val", 2), ("test", 3)):
        write_image_folder(data / split, {"a": 2, "b": 2}, seed=seed)
    result = runner.invoke(
        app,
        ["train", "--data", str(data), "--model", "convnet", "--image-size", "8", "--epochs",
         "1", "--batch-size", "2", "-j", "0", "--device", "cpu", "--amp",
         "--out", str(tmp_path / "run")],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert result.stderr.count(WARNING) == (0 if native else 1), result.stderr


def test_eval_and_benchmark_warn_too_and_not_without_amp(runner, tmp_path, cpu_bf16):
    cpu_bf16(False)
    images = write_image_folder(tmp_path / "images", {"a": 2, "b": 2})
    base = ["convnet", "--allow-untrained", "--num-classes", "2", "--device", "cpu"]
    base += ["--image-size", "8", "-j", "0"]  # the warning's path is the same at any size
    evaluated = runner.invoke(app, ["eval", *base, "--data", str(images), "--amp"])
    benchmarked = runner.invoke(
        app,
        ["benchmark", "convnet", "--input-size", "3,8,8", "-b", "1", "--iters", "1",
         "--warmup", "0", "--device", "cpu", "--amp"],
    )  # fmt: skip
    plain = runner.invoke(app, ["eval", *base, "--data", str(images)])
    for result in (evaluated, benchmarked):
        assert result.exit_code == 0, result.stderr
        assert result.stderr.count(WARNING) == 1, result.stderr
    assert plain.exit_code == 0 and WARNING not in plain.stderr, plain.stderr
