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
