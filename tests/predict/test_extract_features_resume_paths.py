"""`extract-features --resume` continues a run on the same images however IMAGES is spelled
(`./a/`, an absolute path, a link to the folder), and refuses the same names in another
folder rather than mixing its rows with the first folder's."""

from __future__ import annotations

import os
import shutil

import numpy as np
from feature_runs import extract_stopped_after_one_batch
from image_folders import write_image_folder
from output_checks import error_line

from torchkit.cli import app
from torchkit.core.features import FeatureRequest
from torchkit.core.inference.options import InferenceOptions
from torchkit.core.models import ModelSpec

OPTIONS = ["--image-size", "8", "-l", "penultimate", "-b", "2", "-j", "0", "--device", "cpu"]


def interrupted(out: str) -> None:
    """A run on `a` stopped once its first batch is recorded (2 of 6 images)."""
    request = FeatureRequest(
        ModelSpec("convnet", image_size=8, allow_untrained=True), "a", out,
        layers=["penultimate"], run=InferenceOptions(batch_size=2, workers=0, device="cpu"),
    )  # fmt: skip
    extract_stopped_after_one_batch(request)


def extract(runner, images: str, out: str, *more: str):
    return runner.invoke(
        app, ["extract-features", "convnet", images, out, "--allow-untrained", *OPTIONS, *more]
    )


def test_resume_takes_any_spelling_of_the_folder_and_refuses_another(runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_image_folder(tmp_path / "a", {"x": 3, "y": 3}, size=8)
    shutil.copytree(tmp_path / "a", tmp_path / "c")  # the same names, other images
    os.symlink("a", tmp_path / "link")
    assert extract(runner, "a", "full").exit_code == 0
    spellings = ["./a/", str(tmp_path / "a"), "link"]
    for number, spelling in enumerate(spellings):
        out = f"out{number}"
        interrupted(out)
        resumed = extract(runner, spelling, out, "--resume")
        assert resumed.exit_code == 0, (spelling, resumed.stderr)
        assert "resumed at image 3" in resumed.stderr, spelling
        assert (tmp_path / out / "index.csv").read_text() == (
            tmp_path / "full/index.csv"
        ).read_text()
        assert np.array_equal(
            np.load(tmp_path / out / "penultimate.npy"), np.load("full/penultimate.npy")
        )

    interrupted("other")
    progress = (tmp_path / "other/.partial/progress.json").read_bytes()
    refused = extract(runner, "c", "other", "--resume")
    assert refused.exit_code == 2, refused.stderr
    assert error_line(refused.stderr) == (
        f"Error: other holds an interrupted extraction of the images in {tmp_path / 'a'}, not "
        f"{tmp_path / 'c'} (resume with the IMAGES it was started with, or pass --force to "
        "start over)"
    )
    assert (tmp_path / "other/.partial/progress.json").read_bytes() == progress
    assert not (tmp_path / "other/index.csv").exists()

    # A finished run: complete for its own folder, refused for another one.
    assert "already complete" in extract(runner, "link/", "full", "--resume").stderr
    finished = extract(runner, "c", "full", "--resume")
    assert finished.exit_code == 2, finished.stderr
    assert "Error: full holds a finished extraction of the images in " in finished.stderr
