"""`torchkit export` of the same model twice gives the same bytes, in one process and in two:
users check artefacts by their hash."""

from __future__ import annotations

import copy
import hashlib
import os
import zipfile
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from processes import run_torchkit_in_process, run_torchkit_process

from torchkit.core.models.convnet import convnet_class

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


def _torchscript_bytes(model, path) -> bytes:
    from torchkit.core.export.writing import write_torchscript

    example = torch.zeros(2, 3, 16, 16)
    write_torchscript(model, example, path, target=path, dynamic=True, metadata={"arch": "net"})
    return path.read_bytes()


def test_torchscript_exports_in_threads_at_once_are_the_same_bytes_and_leave_torch_as_found(
    tmp_path,
):
    """Each export swapped TorchScript's compilation unit (and file descriptors 1 and 2) for
    the process: exports in four threads at once named their types after each other's (four
    different files) and put back each other's units, leaving the process another's."""
    from torch.jit import _state

    torch.manual_seed(0)
    model = convnet_class()(num_classes=3, image_size=16).eval()
    models = [copy.deepcopy(model) for _ in range(4)]
    shared, stdout = _state._python_cu, os.fstat(1)
    with ThreadPoolExecutor(4) as pool:
        files = list(pool.map(_torchscript_bytes, models, [tmp_path / f"{n}.ts" for n in range(4)]))
    assert len(set(files)) == 1
    assert _state._python_cu is shared
    assert (os.fstat(1).st_ino, os.fstat(1).st_dev) == (stdout.st_ino, stdout.st_dev)


def test_a_torchscript_export_that_fails_leaves_torchs_compilation_unit_as_found(tmp_path):
    from torch.jit import _state

    from torchkit.core.export.writing import ExportError

    class Fails(torch.nn.Module):
        def forward(self, x):
            raise ValueError("no")

    shared = _state._python_cu
    with pytest.raises(ExportError):
        _torchscript_bytes(Fails(), tmp_path / "fails.ts")
    assert _state._python_cu is shared and not (tmp_path / "fails.ts").exists()
