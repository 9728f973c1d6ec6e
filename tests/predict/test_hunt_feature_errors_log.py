"""extract-features' progress record with many unreadable images: each commit (every
COMMIT_INTERVAL_S) rewrote every error found so far into `.partial/progress.json`, so a run
whose unreadable images add up spent time that grew with the square of their number (200,000
errors: 11 MB and about 1.8 s a commit, every 2 s). The errors are now appended to
`.partial/errors.jsonl`, once each, and the record counts them; `--resume` reads them back."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from image_folders import write_image_folder

from torchkit.cli import app
from torchkit.core.features import FeatureRequest, extract_features
from torchkit.core.features import extract as feature_extract
from torchkit.core.features import store as feature_store
from torchkit.core.inference.options import InferenceOptions
from torchkit.core.models import ModelSpec

OPTIONS = ["--image-size", "8", "-l", "penultimate", "-b", "2", "--device", "cpu"]


def folder_mostly_unreadable(root: Path) -> Path:
    """12 images, 9 of them unreadable, spread so that every batch of 2 holds one."""
    write_image_folder(root, {"a": 6, "b": 6}, size=8)
    for name in ("a/a_0", "a/a_1", "a/a_3", "a/a_4", "a/a_5", "b/b_0", "b/b_2", "b/b_3", "b/b_5"):
        (root / f"{name}.png").write_bytes(b"broken")
    return root


def request(root: Path, out: Path) -> FeatureRequest:
    return FeatureRequest(
        ModelSpec("convnet", image_size=8, allow_untrained=True), str(root), str(out),
        layers=["penultimate"], run=InferenceOptions(batch_size=2, workers=0, device="cpu"),
    )  # fmt: skip


def test_each_commit_writes_the_new_errors_only(tmp_path, monkeypatch):
    root = folder_mostly_unreadable(tmp_path / "imgs")
    out = tmp_path / "out"
    record = out / ".partial" / "progress.json"
    log = out / ".partial" / "errors.jsonl"
    written = []  # per commit: (errors so far, bytes of the record, bytes the log grew by)
    commit = feature_store.FeatureStore.commit

    def measured_commit(store) -> None:
        logged = log.stat().st_size if log.exists() else 0
        commit(store)
        if record.exists():
            grown = (log.stat().st_size if log.exists() else 0) - logged
            written.append((len(store.progress.errors), record.stat().st_size, grown))

    monkeypatch.setattr(feature_extract, "COMMIT_INTERVAL_S", 0.0)  # a commit every batch
    monkeypatch.setattr(feature_store.FeatureStore, "commit", measured_commit)
    monkeypatch.setattr(feature_store.FeatureStore, "finish", lambda *args: {})  # keep .partial
    extract_features(request(root, out))

    errors = [count for count, _record, _grown in written]
    assert errors[-1] == 9 and errors[0] < 5, written
    records = [size for _count, size, _grown in written]
    assert max(records) - min(records) <= 8, written  # the counts' digits, not the errors
    # Each error reaches the disk once, in the commit after it was found.
    for (before, _, _), (after, _, grown) in zip(written, written[1:], strict=False):
        assert (grown > 0) == (after > before), written
    assert log.stat().st_size == sum(grown for _count, _record, grown in written)


def test_resume_reads_the_errors_back_and_drops_a_stopped_commits_tail(runner, tmp_path):
    root = folder_mostly_unreadable(tmp_path / "imgs")
    full = tmp_path / "full"
    result = runner.invoke(app, ["extract-features", "convnet", str(root), str(full), *OPTIONS,
                                 "--allow-untrained", "-j", "0"])  # fmt: skip
    assert result.exit_code == 0, result.stderr

    class Stop(Exception):
        pass

    def stop_after_three_batches(done: int, total: int) -> None:
        if done >= 6:
            raise Stop

    part = tmp_path / "part"
    with pytest.raises(Stop):
        extract_features(request(root, part), progress=stop_after_three_batches)
    log = part / ".partial" / "errors.jsonl"
    assert len(log.read_text().splitlines()) == 5  # a_0, a_1, a_3, a_4, a_5
    # A commit stopped after appending, before its record: bytes the record does not count.
    with log.open("a") as handle:
        handle.write('[7, "not recorded"]\n[8, "not rec')

    resumed = runner.invoke(app, ["extract-features", "convnet", str(root), str(part), *OPTIONS,
                                  "--allow-untrained", "--resume", "-j", "0"])  # fmt: skip
    assert resumed.exit_code == 0, resumed.stderr
    assert "resumed at image 7" in resumed.stderr
    assert (part / "index.csv").read_text() == (full / "index.csv").read_text()
    assert np.array_equal(np.load(part / "penultimate.npy"), np.load(full / "penultimate.npy"))
    assert not (part / ".partial").exists()


def test_a_record_whose_errors_file_is_short_is_one_error_line(runner, tmp_path):
    root = folder_mostly_unreadable(tmp_path / "imgs")
    part = tmp_path / "part"

    def stop(done: int, total: int) -> None:
        if done >= 6:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        extract_features(request(root, part), progress=stop)
    log = part / ".partial" / "errors.jsonl"
    log.write_bytes(log.read_bytes()[:-5])  # cut short (a copy of OUT, a damaged disk)
    resumed = runner.invoke(app, ["extract-features", "convnet", str(root), str(part), *OPTIONS,
                                  "--allow-untrained", "--resume", "-j", "0"])  # fmt: skip
    assert resumed.exit_code == 1
    assert resumed.stderr.startswith("Error: cannot read ")
    assert "errors.jsonl" in resumed.stderr and "pass --force to start over" in resumed.stderr
    assert "Traceback" not in resumed.stderr


def test_an_older_record_with_its_errors_inline_still_resumes(tmp_path):
    """A run stopped by an earlier torchkit kept its errors in progress.json: they are read
    from there, and the first commit of the resumed run logs them with the new ones."""
    partial = tmp_path / ".partial"
    partial.mkdir()
    older = {"fingerprint": "f", "total": 12, "done": 4, "rows": 1,
             "errors": {"0": "broken", "1": "broken \udcff"}, "layers": {}}  # fmt: skip
    progress = feature_store.Progress.from_json(older, partial)
    assert progress.errors == {0: "broken", 1: "broken \udcff"}
    store = feature_store.FeatureStore.__new__(feature_store.FeatureStore)
    store.partial, store.progress = partial, progress
    progress.errors[3] = "also broken"
    store._log_new_errors()
    record = progress.to_json("f", 12)
    assert "errors" not in record and record["errors_logged"] == 3
    again = feature_store.Progress.from_json(json.loads(json.dumps(record)), partial)
    assert again.errors == {0: "broken", 1: "broken \udcff", 3: "also broken"}
