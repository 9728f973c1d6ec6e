"""How commands name an unreadable image: --strict's error is one line in every command that
reads images (the same words, the same hint, the file named by the path the user reaches it by
from the working folder, why in the same words: `unreadable_reason`); a shard's image also by
the file its KEY.json records."""

from __future__ import annotations

import os
from pathlib import Path

from checkpoints import write_convnet_checkpoint
from image_folders import write_image_folder
from output_checks import error_line
from processes import run_torchkit_in_process

SAID = (
    "Error: unreadable image data/b/empty.png: {reason} (fix or remove it, or {off} to skip "
    "unreadable images)"
)


def commands_reading(data: str) -> dict[str, list[str]]:
    """The commands that read the images of `data`, by name, with m.pt as their model."""
    return {
        "train": [
            "train", "--data", data, "--model", "nets:TinyNet", "--image-size", "8",
            "--val-split", "0.34", "--epochs", "1", "--out", "run",
        ],
        "eval": ["eval", "m.pt", "--data", data],
        "predict": ["predict", "m.pt", data, "--output", "p.csv"],
        "extract-features": ["extract-features", "m.pt", "--data", data, "--out", "f"],
        "convert shards": ["convert", "shards", data, "shards"],
        "dataset-stats": ["dataset-stats", data],
    }  # fmt: skip


def assert_each_refuses_under_strict(commands: dict[str, list[str]], said: str, cwd: Path) -> None:
    """Each command run with --strict in `cwd` ends with exit 1 and the one error line `said`
    of an empty file."""
    for name, args in commands.items():
        result = run_torchkit_in_process(*args, "--strict", "-j", "0", cwd=cwd)
        assert result.returncode == 1, (name, result.stderr)
        off = "pass --no-strict" if name == "train" else "leave out --strict"
        assert error_line(result.stderr) == said.format(reason="empty file", off=off), name


def test_every_command_says_the_same_of_an_unreadable_image_under_strict(tmp_path: Path):
    write_image_folder(tmp_path / "data", {"a": 3, "b": 3})
    (tmp_path / "data" / "b" / "empty.png").write_bytes(b"")
    write_convnet_checkpoint(tmp_path / "m.pt", in_channels=3, image_size=8, classes="ab")
    before = sorted(path.name for path in (tmp_path / "data").rglob("*"))
    commands = {
        **commands_reading("data"),
        "convert tensor": ["convert", "tensor", "data", "tensors", "--to", "npy"],
    }
    assert_each_refuses_under_strict(commands, SAID, tmp_path)
    assert sorted(path.name for path in (tmp_path / "data").rglob("*")) == before


def test_every_command_names_an_unreadable_member_of_a_tar_of_a_folder_alike(tmp_path: Path):
    """A `.tar` of an image folder: every command's error names the member as the archive
    and its path in it (`data.tar/b/empty.png`, as a shard's sample is named), and every
    report's `path` column its path in the archive alone (`b/empty.png`), as docs/data.md
    promises."""
    import csv
    import io
    import json
    import tarfile

    write_image_folder(tmp_path / "data", {"a": 3, "b": 3})
    (tmp_path / "data" / "b" / "empty.png").write_bytes(b"")
    with tarfile.open(tmp_path / "data.tar", "w") as archive:
        for name in ("a", "b"):
            archive.add(tmp_path / "data" / name, name)
    write_convnet_checkpoint(tmp_path / "m.pt", in_channels=3, image_size=8, classes="ab")
    said = SAID.replace("data/b/", "data.tar/b/")
    assert_each_refuses_under_strict(commands_reading("data.tar"), said, tmp_path)
    predicted = run_torchkit_in_process(
        "predict", "m.pt", "data.tar", "--format", "csv", "-j", "0", cwd=tmp_path
    )
    assert "data.tar/b/empty.png: empty file" in predicted.stderr
    rows = csv.DictReader(io.StringIO(predicted.stdout))
    assert {r["path"]: r["error"] for r in rows if r["error"]} == {"b/empty.png": "empty file"}
    stats = run_torchkit_in_process("dataset-stats", "data.tar", "--format", "json", cwd=tmp_path)
    unreadable = json.loads(stats.stdout)["unreadable"]
    assert unreadable == [{"path": "b/empty.png", "error": "empty file"}]


def test_an_unreadable_shard_image_is_named_with_the_path_its_json_records(tmp_path: Path):
    """A shard's member name (shard-000000.tar/sample_00000003.jpg) names no file the user has:
    where the sample's KEY.json records the file it was made from (convert shards writes it),
    the warning and --strict's error name that too."""
    import io

    import numpy as np
    from PIL import Image

    write_image_folder(tmp_path / "data", {"a": 3, "b": 3})
    whole = io.BytesIO()
    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(noise).save(whole, "JPEG")  # cut past its header: convert takes it
    (tmp_path / "data" / "a" / "cut.jpg").write_bytes(whole.getvalue()[: whole.tell() // 2])
    made = run_torchkit_in_process(
        "convert", "shards", "data", "shards", "--no-shuffle", "-j", "0", cwd=tmp_path
    )
    assert made.returncode == 0, made.stderr
    write_convnet_checkpoint(tmp_path / "m.pt", in_channels=3, image_size=8, classes="ab")
    skipped = run_torchkit_in_process("eval", "m.pt", "--data", "shards", "-j", "0", cwd=tmp_path)
    assert skipped.returncode == 0, skipped.stderr
    assert "sample_00000003.json records its path: a/cut.jpg)" in skipped.stderr
    strict = run_torchkit_in_process(
        "eval", "m.pt", "--data", "shards", "--strict", "-j", "0", cwd=tmp_path
    )
    assert strict.returncode == 1
    line = error_line(strict.stderr)
    assert line.startswith("Error: unreadable image shard-000000.tar/sample_00000003.jpg: ")
    assert "(sample_00000003.json records its path: a/cut.jpg) (fix or remove it" in line


def test_the_first_unreadable_images_are_named_a_warning_each_and_the_rest_counted(tmp_path):
    """extract-features and convert shards name `UNREADABLE_WARNINGS` unreadable images one
    warning each (train's count has its own test), the rest counted: 12 here."""
    from torchkit.core.data.image_files import UNREADABLE_WARNINGS

    write_image_folder(tmp_path / "data", {"a": 3, "b": 3})
    for i in range(UNREADABLE_WARNINGS + 2):
        (tmp_path / "data" / "a" / f"empty_{i:02d}.png").write_bytes(b"")
    write_convnet_checkpoint(tmp_path / "m.pt", in_channels=3, image_size=8, classes="ab")
    commands = {
        "extract-features": ["extract-features", "m.pt", "--data", "data", "--out", "f"],
        "convert shards": ["convert", "shards", "data", "shards"],
    }
    for name, args in commands.items():
        result = run_torchkit_in_process(*args, "-j", "0", cwd=tmp_path)
        # convert shards fails once the rest is written: the images are in no shard
        assert result.returncode == (1 if name == "convert shards" else 0), (name, result.stderr)
        named = [line for line in result.stderr.splitlines() if "unreadable image data/a/" in line]
        assert len(named) == UNREADABLE_WARNINGS, (name, result.stderr)
        assert len(set(named)) == len(named), (name, named)  # each image once
        assert all(line.endswith(": empty file") for line in named), (name, named)


def test_every_command_gives_the_same_reason_for_each_kind_of_unreadable_file(tmp_path: Path):
    """An empty file, a cut JPEG and a text file named .png are skipped by every command with
    the same reason in its report (and warning, where it names each); a folder named x.jpg is
    no file to any."""
    import csv
    import io
    import json

    import numpy as np
    from PIL import Image

    data = write_image_folder(tmp_path / "data", {"a": 3, "b": 3})
    (data / "a" / "empty.png").write_bytes(b"")
    whole = io.BytesIO()
    Image.fromarray(np.full((64, 64, 3), 90, np.uint8)).save(whole, "JPEG")
    (data / "a" / "cut.jpg").write_bytes(whole.getvalue()[: len(whole.getvalue()) // 2])
    (data / "b" / "text.png").write_text("not an image\n")
    (data / "b" / "x.jpg").mkdir()
    write_convnet_checkpoint(tmp_path / "m.pt", in_channels=3, image_size=8, classes="ab")
    expected = {
        "a/empty.png": "empty file",
        "a/cut.jpg": "truncated file",
        "b/text.png": "not an image PIL can read",
    }

    def ran(*args: object, warned: bool = False) -> str:
        result = run_torchkit_in_process(*args, "-j", "0", cwd=tmp_path)
        assert result.returncode in (0, 1), result.stderr  # convert tensor: 1 where any failed
        for path, reason in expected.items() if warned else ():  # a warning each, its reason
            assert f"{path}: {reason}" in result.stderr, (args, path, result.stderr)
        return result.stdout

    def rows(path: Path) -> dict[str, str]:
        with open(path, newline="") as handle:
            return {r["path"]: r["error"] for r in csv.DictReader(handle) if r["error"]}

    stats = json.loads(ran("dataset-stats", "data", "--format", "json"))
    reports = {"dataset-stats": {u["path"]: u["error"] for u in stats["unreadable"]}}
    evaluated = json.loads(ran("eval", "m.pt", "--data", "data", "--format", "json"))
    reports["eval"] = dict(line.split(": ", 1) for line in evaluated["skipped_files"])
    reports["eval"] = {os.path.relpath(p, "data"): r for p, r in reports["eval"].items()}
    ran("predict", "m.pt", "data", "--output", "p.csv")
    reports["predict"] = rows(tmp_path / "p.csv")
    ran("extract-features", "m.pt", "--data", "data", "--out", "f", warned=True)
    reports["extract-features"] = rows(tmp_path / "f" / "index.csv")
    ran("convert", "shards", "data", "shards", "--verify", warned=True)
    manifest = json.loads((tmp_path / "shards" / "manifest.json").read_text())
    reports["convert shards"] = {u["path"]: u["reason"] for u in manifest["unreadable_images"]}
    converted = json.loads(
        ran("convert", "tensor", "data", "t", "--to", "npy", "--format", "json", warned=True)
    )
    reports["convert tensor"] = {u["path"]: u["error"] for u in converted["failures"]}
    for name, found in reports.items():
        assert {p.replace(os.sep, "/"): r for p, r in found.items()} == expected, name
