"""extract-features named the unreadable images of a run by reading the index.csv it had just
written back whole (2.6 s of CPU at a million rows, for errors it held in memory): the result now
gives them from the run itself, as index.csv's `path` and `error` columns do; only a complete OUT
found again (nothing to do) reads them from its index.csv."""

from __future__ import annotations

import csv
from pathlib import Path

from image_folders import write_image_folder

from torchkit.core.features import FeatureRequest, extract_features
from torchkit.core.features import extract as feature_extract
from torchkit.core.inference.options import InferenceOptions
from torchkit.core.models import ModelSpec


def _request(images: str, out: Path) -> FeatureRequest:
    return FeatureRequest(
        ModelSpec("convnet", image_size=8, allow_untrained=True), images, str(out),
        layers=["penultimate"], run=InferenceOptions(batch_size=2, workers=0, device="cpu"),
    )  # fmt: skip


def _errors_in_index(out: Path) -> list[tuple[str, str]]:
    with open(out / "index.csv", encoding="utf-8", newline="") as handle:
        return [(row["path"], row["error"]) for row in csv.DictReader(handle) if row["error"]]


def test_the_unreadable_images_of_a_run_come_from_the_run_not_its_index_read_back(
    tmp_path, monkeypatch
):
    root = write_image_folder(tmp_path / "imgs", {"a": 3, "b": 2}, size=8)
    for name in ("a/a_1", "b/b_0"):
        (root / f"{name}.png").write_bytes(b"broken")
    opened: list[str] = []
    open_text = feature_extract.open_text
    monkeypatch.setattr(
        feature_extract,
        "open_text",
        lambda path, *args, **kwargs: (
            opened.append(Path(path).name) or open_text(path, *args, **kwargs)
        ),
    )
    listed = extract_features(_request(str(root), tmp_path / "listed"))
    paths = sorted(str(p) for p in root.rglob("*.png"))
    streamed = extract_features(_request("-", tmp_path / "streamed"), stdin=iter(paths))
    assert "index.csv" not in opened
    assert [path for path, _why in listed.skipped] == ["a/a_1.png", "b/b_0.png"]
    assert listed.skipped == _errors_in_index(tmp_path / "listed")
    assert [Path(path).name for path, _why in streamed.skipped] == ["a_1.png", "b_0.png"]
    assert streamed.skipped == _errors_in_index(tmp_path / "streamed")
    complete = _request(str(root), tmp_path / "listed")
    complete.resume = True
    again = extract_features(complete)  # complete: nothing to do
    assert again.already_complete and again.skipped == listed.skipped
