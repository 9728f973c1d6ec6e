"""`convert tensor` of a folder listed it with `rglob`, making a `Path`, a `relative_to` and an
`os.stat` (`is_file`) for every file: about 16 times as long as the one `os.scandir` a folder
the data commands list with (minutes of listing for a million files). The listing now asks the
directory entries, which know their type: no stat for a plain file, the same files in the same
order."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from disks import deny_listing

from torchkit.core.convert import tensor
from torchkit.core.io.errors import InputError


def test_a_folder_is_listed_without_a_stat_a_file(tmp_path: Path, monkeypatch):
    for folder in ("a/b", "a-c", ".hidden"):
        (tmp_path / folder).mkdir(parents=True)
    names = [f"a/b/{i}.png" for i in range(40)] + ["a-c/x.npy", "a/notes.txt", ".hidden/h.png"]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    os.symlink(tmp_path / "a-c" / "x.npy", tmp_path / "a" / "link.npy")  # a link to a file counts
    stats = []
    stat = os.stat

    def counted(*args, **kwargs):
        stats.append(args[0])
        return stat(*args, **kwargs)

    monkeypatch.setattr(os, "stat", counted)
    convertible, skipped = tensor._scan(tmp_path)
    monkeypatch.undo()
    # pathlib's order (by parts: a/b/... before a-c/...), hidden names left out.
    expected = sorted(
        (Path(n) for n in [*names[:41], "a/link.npy"] if not n.startswith(".")),
    )
    assert convertible == expected
    assert skipped == [Path("a/notes.txt")]
    assert len(stats) <= 1, stats  # the link's target at most; before: 47, one an entry


def test_a_linked_folder_is_converted_as_the_dataset_readers_read_it(tmp_path: Path):
    """A class folder linked from elsewhere (`cat -> /mnt/big/cat`) was left out without a word
    (converted 1 of the 2 images train reads); a link back into the data is not entered."""
    from PIL import Image
    from typer.testing import CliRunner

    from torchkit.cli import app

    (tmp_path / "data" / "dog").mkdir(parents=True)
    (tmp_path / "elsewhere" / "cat").mkdir(parents=True)
    Image.new("RGB", (3, 2)).save(tmp_path / "data" / "dog" / "a.png")
    Image.new("RGB", (3, 2)).save(tmp_path / "elsewhere" / "cat" / "b.png")
    os.symlink(tmp_path / "elsewhere" / "cat", tmp_path / "data" / "cat")
    os.symlink("..", tmp_path / "data" / "dog" / "loop")
    out = tmp_path / "out"
    args = ["convert", "tensor", str(tmp_path / "data"), str(out), "--to", "npy", "-j", "0"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.stderr
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*.npy"))
    assert written == ["cat/b.npy", "dog/a.npy"]
    assert "linked folder(s) in" in result.stderr and "dog/loop" in result.stderr
    # A linked folder read is an input: a --force run into the folder it links to is refused.
    os.symlink(out, tmp_path / "data" / "prev")
    again = CliRunner().invoke(app, [*args, "--force"])
    assert again.exit_code == 1
    assert "is the linked source folder" in again.stderr
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*.npy")) == written


def test_image_names_that_are_no_file_are_unreadable_images(tmp_path: Path):
    """An image link to nothing and a FIFO named like an image were left out without a word
    (converted 1 of 1, exit 0); every other reader counts them as unreadable images. They are
    failures, named, and so are a .npy link to nothing and a .npy FIFO (never opened: that
    waited for good); --strict stops at the first; a link to nothing of another name is
    warned of as the readers warn of one."""
    from PIL import Image
    from typer.testing import CliRunner

    from torchkit.cli import app

    source = tmp_path / "src"
    source.mkdir()
    Image.new("RGB", (3, 2)).save(source / "a.png")
    os.symlink(tmp_path / "gone.png", source / "dead.png")
    os.mkfifo(source / "f.png")
    os.symlink("gone.npy", source / "lost.npy")
    os.mkfifo(source / "g.npy")
    os.symlink("gone", source / "more")
    os.mkfifo(source / "zz.txt")  # skipped by its name, as a file notes.txt is: it was not counted
    args = ["convert", "tensor", str(source), str(tmp_path / "out"), "--to", "npy", "-j", "0"]
    result = CliRunner().invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["skipped"] == 1 and report["skipped_files"] == ["zz.txt"], report
    assert "failed to convert dead.png: not a regular file (a symbolic link to nothing)" in (
        result.stderr
    )
    assert "failed to convert f.png: not a regular file (a FIFO)" in result.stderr
    for name, kind in (("lost.npy", "a symbolic link to nothing"), ("g.npy", "a FIFO")):
        assert (
            f"failed to convert {name}: cannot read {source / name}: not a regular file ({kind})"
        ) in result.stderr
    assert "4 of 5 files could not be converted" in result.stderr
    assert f"1 symbolic link(s) in {source} point nowhere and are not read: more -> gone" in (
        result.stderr
    )
    assert [p.name for p in (tmp_path / "out").glob("*.npy")] == ["a.npy"]
    strict = CliRunner().invoke(app, [*args[:3], str(tmp_path / "strict"), *args[4:], "--strict"])
    assert strict.exit_code == 1
    assert (
        f"Error: unreadable image {source / 'dead.png'}: not a regular file (a symbolic link "
        "to nothing)"
    ) in strict.stderr
    assert not (tmp_path / "strict").exists()


def test_a_folder_it_cannot_list_is_warned_of_and_fails_the_run(tmp_path: Path, monkeypatch):
    """A subfolder without read permission was passed over without a word: its files are not
    converted, and the run said nothing of them. It is one warning naming it, as the dataset
    readers give, and the run, which converts the rest, exits 1 as `cp -r` does (it exited 0:
    `convert tensor src dst --to npy && rm -r src` deleted the files never converted); with
    --strict an error before DST is written (root is not denied: its listing is made to
    fail)."""
    from PIL import Image
    from typer.testing import CliRunner

    from torchkit.cli import app

    source = tmp_path / "src"
    (source / "sub").mkdir(parents=True)
    Image.new("RGB", (3, 2)).save(source / "a.png")
    Image.new("RGB", (3, 2)).save(source / "sub" / "b.png")
    deny_listing(monkeypatch, source / "sub")
    args = ["convert", "tensor", str(source), str(tmp_path / "out"), "--to", "npy", "-j", "0"]
    result = CliRunner().invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 1, result.stderr
    said = " ".join(result.stderr.split())
    assert (
        f"1 folder(s) in {source} cannot be listed, their files not read: sub (permission "
        "denied) (make them readable)"
    ) in said
    assert (
        f"Error: 1 folder in {source} could not be listed: their files were not converted into "
        f"{tmp_path / 'out'} (make them readable and convert again; --strict stops before "
        "converting any)"
    ) in said
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [".torchkit", "a.npy"]
    report = json.loads(result.stdout)
    assert report["converted"] == 1 and report["unlisted_folders"] == ["sub"]
    strict = CliRunner().invoke(app, [*args[:3], str(tmp_path / "strict"), *args[4:], "--strict"])
    assert strict.exit_code == 1
    assert (
        f"Error: cannot list folder {source / 'sub'}: permission denied (make it readable, or "
        "leave out --strict to read the data without its images)"
    ) in " ".join(strict.stderr.split())
    assert not (tmp_path / "strict").exists()
    # The Python API's strict says so too
    with pytest.raises(InputError, match="cannot list folder"):
        tensor.convert_tensor(source, tmp_path / "api", tensor.TensorOptions(to="npy"), strict=True)


def test_files_that_fail_beside_a_folder_it_cannot_list_are_said_in_one_error():
    report = tensor.TensorReport("src", "dst", folder=True, converted=3, failed=1)
    report.unlisted_folders = ["a", "b/c"]
    error = report.incomplete()
    assert error is not None and str(error).startswith(
        "1 of 4 files could not be converted into dst, and 2 folders in src could not be listed "
        "(the warnings above say which and why"
    )
    assert tensor.TensorReport("src", "dst", folder=True, converted=3).incomplete() is None


@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
def test_a_source_folder_it_cannot_list_is_one_error_naming_it(tmp_path: Path, monkeypatch, strict):
    """Before: a warning naming the folder as `.`, then `Error: no convertible files in SRC`;
    with --strict the hint said to leave it out, which read nothing either."""
    from PIL import Image
    from processes import run_torchkit_in_process

    source = tmp_path / "src"
    source.mkdir()
    Image.new("RGB", (3, 2)).save(source / "a.png")
    deny_listing(monkeypatch, source)
    args = ("convert", "tensor", source, tmp_path / "out", "--to", "npy", "-j", "0")
    result = run_torchkit_in_process(*args, *(["--strict"] if strict else []))
    assert result.returncode == 1
    assert (
        result.stderr
        == f"Error: cannot list folder {source}: permission denied (make it readable)\n"
    )
    assert not (tmp_path / "out").exists()
