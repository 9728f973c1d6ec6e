"""A folder in the data that cannot be listed (permission denied on a subfolder, `chmod 000
cat/more`) left its images out without a word, in every reader. It is one warning naming it,
and with --strict an error, as an unreadable image is. The suite runs as root, whom chmod does
not deny: the listing of that one folder is made to fail instead, and one real run as an
unprivileged user is made where this machine allows it."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from disks import deny_listing
from image_folders import write_image_folder
from output_checks import error_line
from processes import run_torchkit_in_process

WARNED = "folder(s) in {} cannot be listed, their images not read: "


@pytest.fixture
def data(tmp_path: Path) -> Path:
    root = write_image_folder(tmp_path / "data", {"cat": 2, "dog": 2})
    write_image_folder(root / "cat" / "more", {"deep": 1})
    return root


def test_an_image_folder_names_the_folder_it_cannot_list(data, monkeypatch, caplog):
    from torchkit.core.data.sources import open_data

    deny_listing(monkeypatch, data / "cat" / "more")
    with caplog.at_level(logging.WARNING, logger="torchkit"):
        read = open_data(data)
    assert read.whole.ids == ["cat/cat_0.png", "cat/cat_1.png", "dog/dog_0.png", "dog/dog_1.png"]
    assert [r.getMessage() for r in caplog.records if "cannot be listed" in r.getMessage()] == [
        "1 " + WARNED.format(data) + "cat/more (permission denied) (make them readable, or "
        "--strict makes this an error)"
    ]


def test_a_flat_folder_and_a_split_root_name_it_too(tmp_path, monkeypatch, caplog):
    from torchkit.core.data.sources import open_data

    flat = write_image_folder(tmp_path / "flat", {"a": 1, "b": 1})
    split = tmp_path / "split"
    write_image_folder(split / "train", {"cat": 1, "dog": 2})
    write_image_folder(split / "val", {"cat": 1, "dog": 1})
    deny_listing(monkeypatch, flat / "b", split / "train" / "dog")
    with caplog.at_level(logging.WARNING, logger="torchkit"):
        assert open_data(flat, allow_unlabelled=True).whole.ids == ["a/a_0.png"]
        open_data(split)
    warned = sorted(r.getMessage() for r in caplog.records if "cannot be listed" in r.getMessage())
    assert len(warned) == 2
    assert warned[0].startswith("1 " + WARNED.format(flat) + "b (permission denied)")
    assert warned[1].startswith("1 " + WARNED.format(split / "train") + "dog (permission denied)")


def test_strict_makes_it_an_error_in_every_command(data, monkeypatch):
    deny_listing(monkeypatch, data / "cat" / "more")
    report = run_torchkit_in_process("dataset-stats", data, "--format", "json")
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["images"] == 4
    assert "cat/more (permission denied)" in report.stderr
    strict = run_torchkit_in_process("dataset-stats", data, "--strict")
    assert strict.returncode == 1
    assert error_line(strict.stderr) == (
        f"Error: cannot list folder {data / 'cat' / 'more'}: permission denied (make it "
        "readable, or leave out --strict to read the data without its images)"
    )
    split = run_torchkit_in_process("split", data, data.parent / "out", "--strict")
    assert split.returncode == 1 and "cannot list folder" in error_line(split.stderr)
    assert not (data.parent / "out").exists()
    # --strict ends with its command: the Python API (and the next command) warns again.
    from torchkit.core.data.strict_reading import strict_reading

    assert not strict_reading()


@pytest.fixture
def shared_folder():
    """A folder every user may read (pytest's own lie in a folder only root may enter)."""
    folder = Path(tempfile.mkdtemp(prefix="torchkit-unlistable-"))
    folder.chmod(0o755)
    yield folder
    for inner in folder.rglob("*"):
        if inner.is_dir():
            inner.chmod(0o755)
    shutil.rmtree(folder)


def test_an_unprivileged_user_is_warned_of_a_folder_it_may_not_list(shared_folder):
    """The real thing: `chmod 000` read by a user other than root (skipped where there is
    none to run as, or this Python is out of its reach)."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv to run as another user")
    nobody = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
    data = write_image_folder(shared_folder / "data", {"cat": 2, "dog": 2})
    write_image_folder(data / "cat" / "more", {"deep": 1})
    for inner in data.rglob("*"):
        inner.chmod(0o755 if inner.is_dir() else 0o644)
    data.chmod(0o755)
    (data / "cat" / "more").chmod(0)
    code = "import sys; from torchkit.cli import main; sys.argv[0] = 'torchkit'; main()"
    ran = subprocess.run(
        [*nobody, sys.executable, "-c", code, "dataset-stats", str(data), "--strict"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=shared_folder,
        env={**os.environ, "HOME": str(shared_folder)},
    )
    # setpriv that cannot run this Python, or this Python that cannot import torchkit (the
    # CLI itself shows no traceback)
    if ran.returncode not in (0, 1, 2) or "setpriv:" in ran.stderr or "Traceback" in ran.stderr:
        pytest.skip(f"this Python cannot be run as an unprivileged user here: {ran.stderr}")
    assert ran.returncode == 1, ran.stderr
    assert error_line(ran.stderr) == (
        f"Error: cannot list folder {data / 'cat' / 'more'}: permission denied (make it "
        "readable, or leave out --strict to read the data without its images)"
    )


def test_data_behind_a_folder_this_user_may_not_enter_is_one_error_naming_it(
    data, tmp_path, monkeypatch
):
    """`chmod 700` of a folder above the data, another user's: each command ended in
    `Error: PermissionError: [Errno 13] Permission denied: 'data'`."""
    stat = os.stat

    def denied(path, *args, **kwargs):  # as the kernel answers below a folder not searchable
        if os.fspath(path).startswith(str(data)):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", denied)
    expected = (
        f"Error: cannot reach {data}: permission denied (this user may not enter a folder on "
        "its way: check them with ls -ld)"
    )
    for command in (
        ("dataset-stats", data),
        ("split", data, tmp_path / "out"),
        ("convert", "shards", data, tmp_path / "shards"),
    ):
        result = run_torchkit_in_process(*command)
        assert (result.returncode, error_line(result.stderr)) == (1, expected), command
    # every other input a command checks (extract-features' IMAGES, a checkpoint)
    from torchkit.core.io.errors import InputError
    from torchkit.core.io.files import require_input

    with pytest.raises(InputError, match=f"^cannot reach {data / 'cat'}: permission denied"):
        require_input(data / "cat", what="IMAGES")


def test_strict_ends_with_a_command_line_that_fails_to_parse(tmp_path: Path):
    """--strict parsed, then a later option refused: the command never runs, and the next
    in-process command (or the Python API) does not read strictly."""
    from torchkit.core.data.strict_reading import strict_reading

    refused = run_torchkit_in_process("dataset-stats", tmp_path, "--strict", "--workers", "x")
    assert refused.returncode == 2 and "--workers" in error_line(refused.stderr)
    assert not strict_reading()


def test_train_strict_makes_it_an_error_whose_hint_is_no_strict(data, monkeypatch):
    """train's --strict is its own option (a recipe or a resumed run may set it): it warned
    only, where every other command's --strict made the folder an error."""
    deny_listing(monkeypatch, data / "cat" / "more")
    out = data.parent / "run"
    args = ("train", "--data", data, "--model", "convnet", "--image-size", "8", "--epochs", "1")
    strict = run_torchkit_in_process(*args, "--out", out, "--strict")
    assert strict.returncode == 1
    assert error_line(strict.stderr) == (
        f"Error: cannot list folder {data / 'cat' / 'more'}: permission denied (make it "
        "readable, or pass --no-strict to read the data without its images)"
    )
    assert not out.exists()
