"""`torchkit export` of the same model twice gives the same bytes, in one process and in two:
users check artefacts by their hash."""

from __future__ import annotations

import hashlib
import zipfile

import pytest
from processes import run_torchkit_in_process, run_torchkit_process

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:FutureWarning")

MODEL = ("--model", "convnet", "--num-classes", "3", "--image-size", "16", "--no-verify")


def _exported(out, run=run_torchkit_in_process) -> bytes:
    result = run("export", *MODEL, "--out", out, "--force")
    assert result.returncode == 0, result.stderr
    return out.read_bytes()


@pytest.mark.parametrize("suffix", [".ts", ".onnx", ".pt2"])
def test_the_same_model_exported_twice_in_one_process_is_the_same_bytes(tmp_path, suffix):
    """TorchScript named the types of a second export `___torch_mangle_N` (N counting every
    type the process had made), so its code and bytes differed from the first's."""
    first, second = (_exported(tmp_path / f"{n}{suffix}") for n in (1, 2))
    assert hashlib.sha256(first).digest() == hashlib.sha256(second).digest()
    if suffix == ".ts":
        # a repeated type is renamed within the file (convnet holds two Conv2d) and numbered
        # from 0, as in a new process: counted in this export alone
        code = [n for n in zipfile.ZipFile(tmp_path / "2.ts").namelist() if n.endswith(".py")]
        numbers = sorted(int(n.split("___torch_mangle_")[1][:-3]) for n in code if "mangle" in n)
        assert numbers == list(range(len(numbers))) and numbers


def test_the_same_model_exported_in_two_processes_is_the_same_bytes(tmp_path):
    first, second = (_exported(tmp_path / f"{n}.ts", run=run_torchkit_process) for n in (1, 2))
    assert first == second
