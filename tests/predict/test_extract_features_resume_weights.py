"""`extract-features --resume` continues a run only with the weights it was started with: the
command line names a checkpoint by its path, and a training run that rewrites `best.pt` between
the stopped run and its resume would otherwise have two models' rows mixed in one array (or a
finished run's rows given as the new weights')."""

from __future__ import annotations

from checkpoints import write_convnet_checkpoint
from feature_runs import extract_stopped_after_one_batch
from image_folders import write_image_folder
from output_checks import error_line

from torchkit.cli import app
from torchkit.core.features import FeatureRequest
from torchkit.core.inference.options import InferenceOptions
from torchkit.core.models import ModelSpec

OPTIONS = ["-l", "penultimate", "-b", "2", "-j", "0", "--device", "cpu"]


def interrupted(out: str) -> None:
    """A run of model.pt on `a` stopped once its first batch is recorded (2 of 6 images)."""
    request = FeatureRequest(
        ModelSpec("model.pt"), "a", out, layers=["penultimate"],
        run=InferenceOptions(batch_size=2, workers=0, device="cpu"),
    )  # fmt: skip
    extract_stopped_after_one_batch(request)


def extract(runner, out: str, *more: str):
    return runner.invoke(app, ["extract-features", "model.pt", "a", out, *OPTIONS, *more])


def test_resume_refuses_a_checkpoint_rewritten_since(runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_image_folder(tmp_path / "a", {"x": 3, "y": 3}, size=8)
    write_convnet_checkpoint(tmp_path / "model.pt", in_channels=3, image_size=8, classes="xy")
    assert extract(runner, "done").exit_code == 0
    interrupted("stopped")
    finished_meta = (tmp_path / "done/meta.json").read_bytes()
    progress = (tmp_path / "stopped/.partial/progress.json").read_bytes()

    # training writes a new best.pt at the same path: other weights, the same command line
    write_convnet_checkpoint(tmp_path / "model.pt", in_channels=3, image_size=8, classes="xy")
    for out, what in (("stopped", "an interrupted"), ("done", "a finished")):
        refused = extract(runner, out, "--resume")
        assert refused.exit_code == 2, refused.stderr
        assert error_line(refused.stderr) == (
            f"Error: {out} holds {what} extraction with other weights than the model's now "
            "(its file was rewritten since) (pass --force to start over with these weights, "
            "or give another OUT)"
        )
    assert (tmp_path / "stopped/.partial/progress.json").read_bytes() == progress
    assert not (tmp_path / "stopped/index.csv").exists()
    assert (tmp_path / "done/meta.json").read_bytes() == finished_meta


def test_resume_starts_over_a_run_stopped_before_its_first_rows(runner, tmp_path, monkeypatch):
    """A run stopped once its arrays are made, before its first rows are recorded, leaves the
    record it wrote as it made them (no images done): --resume starts it over, with the
    weights of now, as where it left no record; not refused as a run of other weights."""
    import json

    import numpy as np

    monkeypatch.chdir(tmp_path)
    write_image_folder(tmp_path / "a", {"x": 3, "y": 3}, size=8)
    write_convnet_checkpoint(tmp_path / "model.pt", in_channels=3, image_size=8, classes="xy")
    interrupted("stopped")
    record_path = tmp_path / "stopped/.partial/progress.json"
    record = json.loads(record_path.read_text(encoding="utf-8"))
    record_path.write_text(json.dumps({**record, "done": 0, "rows": 0}), encoding="utf-8")
    write_convnet_checkpoint(tmp_path / "model.pt", in_channels=3, image_size=8, classes="xy")

    resumed = extract(runner, "stopped", "--resume")
    assert resumed.exit_code == 0, resumed.stderr
    assert np.load(tmp_path / "stopped/penultimate.npy").shape[0] == 6
    assert not (tmp_path / "stopped/.partial").exists()


def test_resume_of_other_weights_never_says_force_where_force_is_refused(
    runner, tmp_path, monkeypatch
):
    """A finished OUT holding a file of yours, resumed with rewritten weights: the refusal
    says what stops --force too, not "pass --force to start over with these weights"."""
    monkeypatch.chdir(tmp_path)
    write_image_folder(tmp_path / "a", {"x": 3, "y": 3}, size=8)
    write_convnet_checkpoint(tmp_path / "model.pt", in_channels=3, image_size=8, classes="xy")
    assert extract(runner, "done").exit_code == 0
    (tmp_path / "done/notes.txt").write_text("mine", encoding="utf-8")
    write_convnet_checkpoint(tmp_path / "model.pt", in_channels=3, image_size=8, classes="xy")
    refused = extract(runner, "done", "--resume")
    assert refused.exit_code == 2, refused.stderr
    assert error_line(refused.stderr).endswith(
        "(its file was rewritten since) (give another OUT; it holds done/notes.txt that "
        "torchkit did not write, so --force is refused too: move it out first, or choose "
        "another folder)"
    )
    assert extract(runner, "done", "--force").exit_code == 1  # the hint was right
    assert (tmp_path / "done/notes.txt").read_text(encoding="utf-8") == "mine"
