"""The JSON files torchkit writes inside its output folders (eval's metrics.json,
extract-features' meta.json, convert shards' manifest.json and each sample's KEY.json) are
written as every command's JSON on stdout and `-o x.json` is: UTF-8, "café" as itself (they
held json.dumps' ASCII escapes, "caf\\u00e9"), and a name that is not UTF-8 as its escape
("\\udcff"), which reads back to the same bytes."""

from __future__ import annotations

import json
import os
import tarfile
import unicodedata
from pathlib import Path

import pytest
from checkpoints import write_convnet_checkpoint
from image_folders import write_image_folder
from processes import run_torchkit_in_process

CAFE = unicodedata.normalize("NFC", "café")
BAD_CLASS = os.fsdecode(b"bad\xffcls")  # a class folder whose name is not UTF-8


def _ok(*args: object) -> None:
    done = run_torchkit_in_process(*args)
    assert done.returncode == 0, done.stderr


def _json_file(path: Path):
    """The file's JSON, checked to be what stdout's JSON is: valid UTF-8 with "café" as its
    own bytes, never an ASCII escape, and the name that is not UTF-8 as its escape."""
    data = path.read_bytes()
    text = data.decode("utf-8")  # strict: valid UTF-8
    assert CAFE in text and "\\u00e9" not in text, path.name
    assert "\\udcff" in text and b"\xff" not in data, path.name
    return json.loads(text)


def test_json_files_in_outputs_are_utf8_with_non_utf8_names_escaped(tmp_path):
    data = tmp_path / "data"
    try:
        (data / BAD_CLASS).mkdir(parents=True)
    except OSError:
        pytest.skip("this file system refuses names that are not UTF-8")
    write_image_folder(data, {CAFE: 1, BAD_CLASS: 1})
    model = tmp_path / "model.pt"
    write_convnet_checkpoint(model, in_channels=3, image_size=8, classes=[BAD_CLASS, CAFE])
    classes = [BAD_CLASS, CAFE]

    # --format json: the in-process stdout takes no undecodable byte (a real one does).
    _ok("eval", model, "--data", data, "-j", "0", "--out", tmp_path / "ev", "--format", "json")
    metrics = _json_file(tmp_path / "ev" / "metrics.json")
    assert metrics["classes"] == classes
    assert os.fsencode(metrics["classes"][0]) == b"bad\xffcls"  # the folder's own bytes

    features = tmp_path / "features"
    _ok("extract-features", model, data, features, "-j", "0", "-q")
    assert _json_file(features / "meta.json")["classes"] == classes
    # Read back by the command itself: a finished OUT with the same images is done already.
    _ok("extract-features", model, data, features, "-j", "0", "-q", "--resume")

    shards = tmp_path / "shards"
    _ok("convert", "shards", data, shards, "--format", "json")
    assert _json_file(shards / "manifest.json")["classes"] == classes
    with tarfile.open(next(shards.glob("*.tar"))) as tar:
        members = [tar.extractfile(m).read() for m in tar if m.name.endswith(".json")]
    labels = {json.loads(member)["label"] for member in members}
    assert labels == set(classes)
    assert any(f'"label": "{CAFE}"'.encode() in member for member in members)
    assert not any(b"\\u00e9" in member for member in members)


def test_the_marker_names_a_set_aside_folder_in_utf8(tmp_path):
    """The `.torchkit` marker of an output that replaced another names the set-aside folder
    (`replaces`) as the other JSON files name things: "café" as itself, not "caf\\u00e9"."""
    data = tmp_path / "data"
    write_image_folder(data, {"a": 1, "b": 1})
    out = tmp_path / CAFE
    # Written whole, then put in place; converted in this process (-j 0): no pool to fork.
    _ok("convert", "tensor", data, out, "--to", "npy", "-q", "-j", "0")
    _ok("convert", "tensor", data, out, "--to", "npy", "--force", "-q", "-j", "0")
    text = (out / ".torchkit").read_bytes().decode("utf-8")
    assert json.loads(text)["replaces"].startswith(f".{CAFE}."), text
    assert "\\u00e9" not in text
