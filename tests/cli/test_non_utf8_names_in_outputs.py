"""A file name that is not UTF-8 (bytes such as b"\\xff.png") in every JSON a command writes is
one text, written by one helper (`render_json`): each byte that is not UTF-8 as Python's
surrogateescape holds it, the escape "\\udcff" (json.loads then os.fsencode give the bytes back),
and every other character as itself ("é", not "\\u00e9"). A CSV holds the name's own bytes,
and read back as `--data file.csv` names the same files."""

from __future__ import annotations

import json
import os

from image_folders import write_image_folder
from processes import run_torchkit_in_process


def _folder(tmp_path):
    """café/café_0.png, and b/<byte ff>.png, the same image: dataset-stats lists both names as
    exact duplicates."""
    root = write_image_folder(tmp_path / "data", {"café": 1})
    (root / "b").mkdir()
    with open(os.fsencode(root / "b") + b"/\xff.png", "wb") as handle:
        handle.write((root / "café" / "café_0.png").read_bytes())
    return root


def test_predict_writes_names_in_json_as_every_command_does(tmp_path):
    root = _folder(tmp_path)
    options = ("--image-size", "8", "--allow-untrained", "-j", "0")
    stats = run_torchkit_in_process("dataset-stats", root, "-j", "0", "--format", "json")
    assert stats.returncode == 0, stats.stderr
    assert '"b/\\udcff.png"' in stats.stdout and '"café/café_0.png"' in stats.stdout
    for fmt in ("json", "jsonl"):
        done = run_torchkit_in_process("predict", "convnet", root, "--format", fmt, *options)
        assert done.returncode == 0, done.stderr
        # Before: json.dumps' ASCII escapes, "caf\\u00e9/caf\\u00e9_0.png", unlike the others.
        assert '"path": "b/\\udcff.png"' in done.stdout, fmt
        assert '"path": "café/café_0.png"' in done.stdout, fmt
        lines = done.stdout.splitlines()
        rows = json.loads(done.stdout) if fmt == "json" else [json.loads(x) for x in lines]
        assert sorted(os.fsencode(r["path"]) for r in rows) == [
            b"b/\xff.png",
            b"caf\xc3\xa9/caf\xc3\xa9_0.png",
        ]


def test_a_csv_naming_such_a_file_reads_back_as_the_same_file(tmp_path):
    root = _folder(tmp_path)
    done = run_torchkit_in_process("split", root, tmp_path / "out", "--mode", "manifest")
    assert done.returncode == 0, done.stderr
    assert b"/\xff.png," in (tmp_path / "out" / "split.csv").read_bytes()  # the name's bytes
    stats = run_torchkit_in_process(
        "dataset-stats", tmp_path / "out" / "split.csv", "--split", "all", "-j", "0",
        "--strict", "--format", "json",
    )  # fmt: skip
    assert stats.returncode == 0, stats.stderr
    assert '\\udcff.png"' in stats.stdout
