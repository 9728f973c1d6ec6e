"""`convert tensor` of a folder listed it with `rglob`, making a `Path`, a `relative_to` and an
`os.stat` (`is_file`) for every file: about 16 times as long as the one `os.scandir` a folder
the data commands list with (minutes of listing for a million files). The listing now asks the
directory entries, which know their type: no stat for a plain file, the same files in the same
order."""

from __future__ import annotations

import os
from pathlib import Path

from torchkit.core.convert import tensor


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
