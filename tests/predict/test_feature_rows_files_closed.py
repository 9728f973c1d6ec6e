"""extract-features writes each layer's rows through a file descriptor of its `.npy` in
`OUT/.partial`. A run that stopped with an error (--strict, a failing layer, Ctrl-C) left those
descriptors open for as long as the process lived: an int is never closed by the garbage
collector, as the memory maps it replaced were. They are now closed however the run ends."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from image_folders import write_image_folder

from torchkit.core.features import FeatureRequest, extract_features
from torchkit.core.inference.options import InferenceOptions
from torchkit.core.io.errors import InputError
from torchkit.core.models import ModelSpec

FDS = Path("/proc/self/fd")


def files_open_under(folder: Path) -> list[str]:
    """The files under `folder` this process holds open."""
    targets = []
    for fd in os.listdir(FDS):
        try:
            targets.append(os.readlink(FDS / fd))
        except OSError:  # the descriptor listdir itself held, closed since
            continue
    return [target for target in targets if target.startswith(f"{folder}{os.sep}")]


@pytest.mark.skipif(not FDS.is_dir(), reason="reads /proc/self/fd (Linux)")
def test_a_run_stopped_by_an_error_leaves_no_array_file_open(tmp_path):
    root = write_image_folder(tmp_path / "imgs", {"a": 3, "b": 2}, size=8)
    (root / "b" / "b_1.png").write_bytes(b"broken")  # the last image: its batch stops the run
    out = tmp_path / "out"
    request = FeatureRequest(
        ModelSpec("convnet", image_size=8, allow_untrained=True), str(root), str(out),
        layers=["features.0", "penultimate"],
        run=InferenceOptions(batch_size=2, workers=0, device="cpu"), strict=True,
    )  # fmt: skip
    with pytest.raises(InputError, match="b_1.png"):
        extract_features(request)
    kept = sorted(path.name for path in (out / ".partial").glob("*.npy"))
    assert kept == ["features.0.npy", "penultimate.npy"]  # the rows before it, for --resume
    assert files_open_under(out) == []
