"""The manifests `convert shards` reads back in OUT (to resume an interrupted run, to tell its
own files from yours under --force) are read only where they are regular files: a FIFO under
such a name hung the run, waiting for a writer that never came."""

from __future__ import annotations

from pathlib import Path

import pytest
from disks import fifo_never_opened
from processes import run_torchkit_in_process


@pytest.mark.parametrize("name", ["manifest.partial.json", "manifest.json"])
def test_a_fifo_named_as_a_manifest_in_out_is_never_opened(tmp_path: Path, make_image_folder, name):
    data = make_image_folder(tmp_path / "data", {"cat": 2, "dog": 2})
    out = tmp_path / "shards"
    assert run_torchkit_in_process("convert", "shards", data, out).returncode == 0
    (out / "manifest.json").unlink()  # as an interrupted run leaves it: a marker, shards
    with fifo_never_opened(out / name, seconds=2):
        result = run_torchkit_in_process("convert", "shards", data, out, "--force")
    assert result.returncode == 1  # not a file torchkit wrote: refused, named
    assert "that torchkit did not write, which --force would delete" in result.stderr
