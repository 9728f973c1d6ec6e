"""split from a dataset that changes or cannot be changed under it: --mode move out of folders
that cannot be changed (a read-only mount, no write permission) is refused before anything
moves, also when it finishes an interrupted move; a file deleted while a copy, link or symlink
split runs is one Error line naming it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from output_checks import error_line, tree_digest

from torchkit.cli import app
from torchkit.core.split import files as split_files
from torchkit.core.split import split_dataset


def make_files(root: Path, counts: dict[str, int]) -> Path:
    """ROOT/<class>/<class>_<i>.png with distinct contents (split never decodes them)."""
    for name, count in counts.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            (root / name / f"{name}_{i}.png").write_bytes(f"{name}/{i}".encode() * 3)
    return root


@pytest.fixture
def unchangeable():
    """`unchangeable(folder)`: `folder` and the folders in it made unchangeable in place: no
    write permission for a user; for root (whom permissions do not stop) a read-only bind
    mount of the folder onto itself, undone afterwards (skips where mounting is not allowed)."""
    locked: list[Path] = []
    mounted: list[Path] = []

    def make(folder: Path) -> None:
        if os.geteuid() != 0:
            locked.extend(p for p in [folder, *folder.rglob("*")] if p.is_dir())
            for path in locked:
                path.chmod(0o555)
            return
        for args in (["--bind"], ["-o", "remount,ro,bind"]):
            done = subprocess.run(["mount", *args, str(folder), str(folder)], capture_output=True)
            if done.returncode != 0:
                pytest.skip("cannot make a read-only bind mount here")
            if args == ["--bind"]:
                mounted.append(folder)

    yield make
    for folder in mounted:
        subprocess.run(["umount", str(folder)], check=True)
    for path in locked:
        path.chmod(0o755)


def test_move_out_of_a_folder_that_cannot_be_changed_is_refused_before_anything_moves(
    runner, tmp_path, unchangeable
):
    root = make_files(tmp_path / "data", {"a": 4, "b": 4})
    unchangeable(root)
    before = tree_digest(root)
    out = tmp_path / "out"
    result = runner.invoke(app, ["split", str(root), str(out), "--mode", "move"])
    assert result.exit_code == 1, result.stderr
    line = error_line(result.stderr)
    assert line.startswith(f"Error: --mode move cannot take the files out of {root}/")
    assert "use --mode copy, symlink or manifest" in line
    assert not os.path.lexists(out)  # no half move to finish
    assert tree_digest(root) == before


def test_finishing_a_move_out_of_a_folder_that_became_unchangeable_is_refused_clearly(
    runner, tmp_path, unchangeable, monkeypatch
):
    data = make_files(tmp_path / "data", {"a": 4, "b": 4})
    out = tmp_path / "out"
    real_move = split_files.move_file
    moved: list[str] = []

    def stop_after_two(source, dest, **options):
        if len(moved) == 2:
            raise KeyboardInterrupt
        real_move(source, dest, **options)
        moved.append(source)

    monkeypatch.setattr(split_files, "move_file", stop_after_two)
    with pytest.raises(KeyboardInterrupt):
        split_dataset(data, out, mode="move")
    monkeypatch.setattr(split_files, "move_file", real_move)
    unchangeable(data)
    before = tree_digest(data), tree_digest(out)
    result = runner.invoke(app, ["split", str(data), str(out), "--mode", "move"])
    assert result.exit_code == 1, result.stderr
    assert error_line(result.stderr).startswith(
        f"Error: --mode move cannot take the files out of {data}/"
    )
    assert (tree_digest(data), tree_digest(out)) == before


@pytest.mark.parametrize("mode", ["copy", "hardlink", "symlink"])
def test_a_file_deleted_while_a_split_runs_is_named_and_out_is_left_as_it_was(
    runner, tmp_path, monkeypatch, mode
):
    root = make_files(tmp_path / "data", {"a": 4, "b": 4})
    victim = root / "b" / "b_2.png"
    real_place = split_files._place_files

    def another_process_deletes_one(plan, out, mode, progress):
        victim.unlink()
        real_place(plan, out, mode, progress)

    monkeypatch.setattr(split_files, "_place_files", another_process_deletes_one)
    out = tmp_path / "out"
    result = runner.invoke(app, ["split", str(root), str(out), "--mode", mode])
    assert result.exit_code == 1, result.stderr
    assert error_line(result.stderr) == (
        f"Error: {victim} disappeared during the split (run the same command again: it splits "
        "the files that are there)"
    )
    assert not os.path.lexists(out)


def test_move_out_of_a_csv_index_in_a_folder_that_cannot_be_changed_goes_on(
    runner, tmp_path, unchangeable
):
    """The move's record beside the index (`.INDEX.torchkit-split-moving.json`) cannot be
    written there: the move goes on without it, as it was meant to, where it failed as
    "cannot write .../.index.csv.torchkit-split-moving.json: Read-only file system"."""
    images = make_files(tmp_path / "images", {"a": 3, "b": 3})
    listed = tmp_path / "listed"
    listed.mkdir()
    rows = [f"{path},{path.parent.name}" for path in sorted(images.rglob("*.png"))]
    (listed / "index.csv").write_text("\n".join(["path,label", *rows]) + "\n")
    unchangeable(listed)
    out = tmp_path / "out"
    result = runner.invoke(app, ["split", str(listed / "index.csv"), str(out), "--mode", "move"])
    assert result.exit_code == 0, result.stderr
    assert not list(images.rglob("*.png")) and len(list(out.rglob("*.png"))) == 6
