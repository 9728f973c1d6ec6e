"""`torchkit split` at its edges: an OUT whose file system ignores case, `--oversample` with
small classes and groups, and moves out of overlapping ROOTs."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import pytest
from output_checks import error_line
from processes import run_torchkit_in_process
from split_moves import stop_move_after

from torchkit.core.data.sources import moving
from torchkit.core.data.sources.moving import source_folders
from torchkit.core.io import files
from torchkit.core.io.files import case_twins, folds_case
from torchkit.core.io.output_locks import OutputLockedError
from torchkit.core.split import files as split_files
from torchkit.core.split import plan as split_plan
from torchkit.core.split.run import split_dataset


def write_images(root: Path, names: list[str]) -> Path:
    """ROOT/<name> for each `class/file` name, each file's bytes its own name."""
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(name.encode() * 3)
    return root


def tree(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_the_case_probe_tells_this_file_system_apart_and_leaves_nothing(tmp_path):
    assert folds_case(tmp_path) is False  # the suite's tmp folders are Linux file systems
    assert list(tmp_path.iterdir()) == []


def test_the_case_probe_sees_a_folding_file_system_that_makes_up_inode_numbers(
    tmp_path, monkeypatch
):
    # A case-insensitive FUSE file system (tried by hand over one) answers the other-case name
    # with an inode number of its own: the folder listing tells that it is the same entry.
    real_lstat = os.lstat

    def lstat(path, *args, **kwargs):
        folder, name = os.path.split(path)
        if name.startswith(".TORCHKIT-CASE-PROBE-"):
            return real_lstat(folder)  # found, under another inode number
        return real_lstat(path, *args, **kwargs)

    monkeypatch.setattr(os, "lstat", lstat)
    assert folds_case(tmp_path) is True
    assert list(tmp_path.iterdir()) == []


def test_case_twins_are_files_and_folders_that_differ_only_by_case():
    assert case_twins(["train/cat/a.png", "train/dog/a.png", "val/cat/a.png"]) is None
    assert case_twins(["train/Cat/a.png", "train/cat/b.png"]) == ("train/Cat", "train/cat")
    assert case_twins(["train/x/a.JPG", "train/x/a.jpg"]) == ("train/x/a.JPG", "train/x/a.jpg")


@pytest.mark.parametrize("mode", ["copy", "move"])
def test_an_out_that_ignores_case_is_refused_before_one_class_overwrites_another(
    tmp_path, monkeypatch, mode
):
    # Cat/ and cat/ are two classes on Linux; on an exFAT disk, macOS or a Samba share they are
    # one folder, where cat's a.png would overwrite Cat's (and the rest mix two classes).
    root = write_images(tmp_path / "root", [f"{c}/{i}.png" for c in ("Cat", "cat") for i in "ab"])
    before = tree(root)
    monkeypatch.setattr(files, "folds_case", lambda folder: True)
    out = tmp_path / "out"
    result = run_torchkit_in_process("split", root, out, "--ratio", "1:1", "--mode", mode)
    assert result.returncode == 1, result.stderr
    line = error_line(result.stderr)
    assert "Cat and" in line and "cat" in line and "upper and lower case" in line, line
    assert tree(root) == before
    assert not out.exists()


def test_oversample_names_the_classes_it_cannot_balance_having_no_train_image(tmp_path):
    # At 1:8:1 a class of one file goes to val: train has none of it to repeat, so train is
    # not balanced whatever the note's count of repeats says.
    root = write_images(tmp_path / "root", [*(f"a/{i}.png" for i in range(10)), "b/0.png"])
    out = tmp_path / "out"
    args = ("split", root, out, "--ratio", "1:8:1", "--oversample", "--mode", "manifest")
    result = run_torchkit_in_process(*args, "--format", "json")
    assert result.returncode == 0, result.stderr
    warned = [line for line in result.stderr.splitlines() if "--oversample cannot" in line]
    assert warned == [
        "Warning: --oversample cannot balance train for 1 class with no image in it: b"
    ], result.stderr


def split_while_moving(monkeypatch, first: tuple, second: tuple):
    """Run split_dataset(*first, mode="move") and, as it places its third file,
    split_dataset(*second, mode="move") at the same time: (the first's counts, the second's
    counts or its error)."""
    place = split_files.move_file
    seen: list = []

    def move_file(source, dest, links=None):
        seen.append(None)
        if len(seen) == 3:
            try:
                seen.append(split_dataset(*second, mode="move", ratio="1:1").counts)
            except OutputLockedError as error:
                seen.append(str(error))
        return place(source, dest, links)

    monkeypatch.setattr(split_files, "move_file", move_file)
    counts = split_dataset(*first, mode="move", ratio="1:1").counts
    return counts, seen[3]


def pngs(root: Path) -> list[str]:
    return sorted(d for name, d in tree(root).items() if name.endswith(".png"))


@pytest.mark.parametrize("first, second", [("root", "root/cat"), ("root/cat", "root")])
def test_a_move_out_of_a_folder_inside_or_holding_a_moving_root_is_refused(
    tmp_path, monkeypatch, first, second
):
    """Before: a move out of ROOT/cat while a move out of ROOT ran (or the other way round) was
    not refused: it took the first one's files, which stopped half-way (`disappeared during the
    move`), and its rerun left them out as deleted by another process."""
    root = write_images(
        tmp_path / "root", [f"{c}/{i}.png" for c in ("cat", "dog") for i in range(4)]
    )
    taken = pngs(root if first == "root" else root / "cat")
    counts, refused = split_while_moving(
        monkeypatch, (tmp_path / first, tmp_path / "out1"), (tmp_path / second, tmp_path / "out2")
    )
    assert isinstance(refused, str) and "another torchkit split is moving" in refused, refused
    assert str(root) in refused
    assert sum(map(sum, counts)) == len(taken)
    assert pngs(tmp_path / "out1") == taken and not (tmp_path / "out2").exists()


def test_a_move_out_of_a_split_folder_being_written_is_refused(tmp_path, monkeypatch):
    """Before: `split OUT1/train OUT2 --mode move` while `split ROOT OUT1 --mode move` wrote
    OUT1 took the files placed so far: OUT1 ended (exit 0) without them, its split.csv listing
    files that were gone."""
    root = write_images(
        tmp_path / "root", [f"{c}/{i}.png" for c in ("cat", "dog") for i in range(4)]
    )
    taken, out1 = pngs(root), tmp_path / "out1"
    counts, refused = split_while_moving(
        monkeypatch, (root, out1), (out1 / "train", tmp_path / "out2")
    )
    assert isinstance(refused, str) and f"into {out1}, which holds" in refused, refused
    assert pngs(out1) == taken and sum(map(sum, counts)) == 8
    assert not (tmp_path / "out2").exists()


def test_a_move_refuses_a_file_named_like_its_temporary_copies(tmp_path):
    """Before: `cat/.torchkit-move-a.png` was moved like any image; a rerun after a stop before
    `cat/a.png` moved deleted it from OUT, where it was the only copy, taking it for the
    unverified copy of a.png (and said another process had deleted it from ROOT)."""
    hidden = ".TorchKit-Move-a.png"  # any case: one name where OUT ignores case
    root = write_images(tmp_path / "root", ["cat/a.png", f"cat/{hidden}", "cat/b.png"])
    before = tree(root)
    result = run_torchkit_in_process("split", root, tmp_path / "out", "--mode", "move")
    assert result.returncode == 1
    assert error_line(result.stderr).startswith(
        f"Error: {root / 'cat' / hidden} is named like the temporary copies a move makes"
    )
    assert tree(root) == before and not (tmp_path / "out").exists()
    copied = run_torchkit_in_process("split", root, tmp_path / "copy", "--mode", "copy")
    assert copied.returncode == 0, copied.stderr


def test_force_replaces_an_earlier_split_named_in_another_case_where_out_ignores_case(
    tmp_path, monkeypatch
):
    """Before: on an OUT that ignores case, `--force` over an earlier split named `Train,Val`
    set `Train` aside, then failed to set aside `train` (the same folder, gone already):
    `Error: FileNotFoundError: ... train -> .torchkit-split-replaced/train`, exit 1."""
    root = write_images(tmp_path / "root", [f"{c}/{i}.png" for c in ("cat", "dog") for i in "ab"])
    out = tmp_path / "out"
    first = run_torchkit_in_process("split", root, out, "--ratio", "1:1", "--names", "Train,Val")
    assert first.returncode == 0, first.stderr
    real_lexists, real_replace = os.path.lexists, os.replace

    def on_disk(path) -> str:  # the spelling a case-insensitive file system finds for `path`
        folder, name = os.path.split(os.fspath(path))
        found = [n for n in os.listdir(folder) if n.casefold() == name.casefold()]
        return os.path.join(folder, (found or [name])[0]) if os.path.isdir(folder) else path

    monkeypatch.setattr(os.path, "lexists", lambda path: real_lexists(on_disk(path)))
    monkeypatch.setattr(os, "replace", lambda a, b, **kw: real_replace(on_disk(a), b, **kw))
    result = run_torchkit_in_process("split", root, out, "--ratio", "1:1", "--force")
    monkeypatch.undo()
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == [".torchkit", "split.csv", "train", "val"]
    assert len(tree(out / "train")) + len(tree(out / "val")) == 4


@pytest.mark.parametrize("first, second", [("index", "data"), ("data", "index")])
def test_a_move_out_of_a_csv_index_and_one_out_of_the_folder_it_lists_are_refused_at_once(
    tmp_path, monkeypatch, first, second
):
    """Before: a move out of `data/` while a move out of `lists/index.csv` (which lists the files
    of data/) ran was not refused: it took the index's files, which stopped half-way. The other
    way round the index's move was refused only by luck, when its files were gone already."""
    data = write_images(tmp_path / "data", [f"{c}/{i}.png" for c in ("cat", "dog") for i in "abcd"])
    (tmp_path / "lists").mkdir()
    rows = [f"../data/{p.parent.name}/{p.name},{p.parent.name}" for p in data.rglob("*.png")]
    (tmp_path / "lists" / "index.csv").write_text("path,label\n" + "\n".join(sorted(rows)) + "\n")
    taken = pngs(data)
    roots = {"index": tmp_path / "lists" / "index.csv", "data": data}
    counts, refused = split_while_moving(
        monkeypatch, (roots[first], tmp_path / "out1"), (roots[second], tmp_path / "out2")
    )
    assert isinstance(refused, str) and "another torchkit split is moving" in refused, refused
    assert sum(map(sum, counts)) == 8
    assert pngs(tmp_path / "out1") == taken and not (tmp_path / "out2").exists()


def test_a_csv_move_locks_a_few_folders_however_many_it_lists(tmp_path):
    # One descriptor a locked folder: 500 folders of one image each are locked as their parent.
    sources = [f"{tmp_path}/data/f{i}/img.png" for i in range(500)] + [f"{tmp_path}/b/c/z.png"]
    index = tmp_path / "lists" / "index.csv"
    assert source_folders(sources, index) == [f"{tmp_path}/b", f"{tmp_path}/data"]
    assert source_folders([f"{tmp_path}/lists/a.png", f"{tmp_path}/lists/x/b.png"], index) == [
        f"{tmp_path}/lists/x"  # the index's own folder is held through the index
    ]


@pytest.mark.parametrize("interrupted", [False, True])
def test_a_csv_move_into_the_folder_holding_the_folders_it_lists_is_not_refused(
    tmp_path, monkeypatch, interrupted
):
    """Before: where the index lists more folders than a move holds open (here more than one),
    their parent was locked in their place, and OUT inside that parent (beside the folders)
    then refused by the move's own lock: 'another torchkit split is moving files out of or
    into DATA, which holds DATA/out', exit 1; so was the rerun that finishes such a move."""
    monkeypatch.setattr(moving, "_MOST_LOCKS", 1)
    data = write_images(tmp_path / "data", [f"{c}/{i}.png" for c in ("cat", "dog") for i in "ab"])
    (tmp_path / "lists").mkdir()
    index = tmp_path / "lists" / "index.csv"
    rows = [f"../data/{p.parent.name}/{p.name},{p.parent.name}" for p in data.rglob("*.png")]
    index.write_text("path,label\n" + "\n".join(sorted(rows)) + "\n")
    taken = pngs(data)
    out = data / "out"
    if interrupted:  # stopped after one file: the rerun finishes the move
        stop_move_after(1, monkeypatch, index, out, ratio="1:1")
        assert '"state": "moving"' in (out / ".torchkit-split.json").read_text()
    result = run_torchkit_in_process("split", index, out, "--mode", "move", "--ratio", "1:1")
    assert result.returncode == 0, result.stderr
    assert pngs(out) == taken and not pngs(data / "cat") and not pngs(data / "dog")


def test_a_file_split_cannot_read_is_one_error_naming_it_and_why(tmp_path: Path, monkeypatch):
    """A file of the data without read permission (chmod 000) ended a copy split in
    "Error: PermissionError: [Errno 13] ...": it is named with why, in the words every command
    uses for a file it cannot read, and nothing of the split is kept."""
    write_images(tmp_path / "raw", [f"{c}/{i}.png" for c in "ab" for i in range(5)])
    real_open = os.open

    def refusing(path, flags, *args, **kwargs):  # as the kernel answers for a chmod 000 file
        if os.fspath(path).endswith(os.path.join("b", "3.png")):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(split_files.os, "open", refusing)
    result = run_torchkit_in_process("split", "raw", "out", "-q", cwd=tmp_path)
    assert result.returncode == 1
    line = error_line(result.stderr)
    assert line.startswith("Error: cannot copy ") and line.endswith(
        f"{os.path.join('raw', 'b', '3.png')}: permission denied (make it readable, or move it "
        "out of the data)"
    ), line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("mode", ["hardlink", "move"])
def test_a_file_a_link_or_move_cannot_read_is_the_copys_one_error(
    tmp_path: Path, monkeypatch, mode
):
    """A file of the data without read permission ended a hard-link split (the system refuses
    to link another user's file this one may not read) and a move onto another file system
    (which copies it) in "Error: PermissionError: [Errno ...]": the one line a copy says; the
    move's files are each in ROOT or OUT, for its rerun."""
    write_images(tmp_path / "raw", [f"{c}/{i}.png" for c in "ab" for i in range(5)])
    unreadable = os.path.join("b", "3.png")
    real_open, real_link = os.open, os.link

    def refusing(path, flags, *args, **kwargs):  # as the kernel answers for a chmod 000 file
        if os.fspath(path).endswith(unreadable):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, flags, *args, **kwargs)

    def protected(source, target, *args, **kwargs):  # Linux's protected_hardlinks
        if os.fspath(source).endswith(unreadable):
            raise PermissionError(1, "Operation not permitted", source, None, target)
        return real_link(source, target, *args, **kwargs)

    def other_file_system(source, target):
        raise OSError(errno.EXDEV, "Invalid cross-device link", source, None, target)

    monkeypatch.setattr(split_files.os, "open", refusing)
    monkeypatch.setattr(split_files.os, "link", protected)
    if mode == "move":
        monkeypatch.setattr(split_files.os, "rename", other_file_system)
    result = run_torchkit_in_process("split", "raw", "out", "-q", "--mode", mode, cwd=tmp_path)
    assert result.returncode == 1
    verb = {"hardlink": "link", "move": "move"}[mode]
    line = error_line(result.stderr, besides="warnings")
    assert line.startswith(f"Error: cannot {verb} ") and line.endswith(
        f"{os.path.join('raw', unreadable)}: permission denied (make it readable, or move it "
        "out of the data)"
    ), line
    if mode == "hardlink":
        assert not (tmp_path / "out").exists()
    else:  # the file left where it was; every other one in ROOT or OUT, none lost
        assert (tmp_path / "raw" / unreadable).exists()
        kept = list((tmp_path / "raw").rglob("*.png"))
        moved = list((tmp_path / "out").rglob("*.png"))
        assert len(kept) + len(moved) == 10


def test_a_file_the_system_will_not_hard_link_is_one_error_naming_it(tmp_path: Path, monkeypatch):
    """Another user's file that this one may read but not write to: Linux's
    protected_hardlinks refuses the link (EPERM), said with the modes that need none."""
    write_images(tmp_path / "raw", [f"{c}/{i}.png" for c in "ab" for i in range(5)])
    real_link = os.link

    def protected(source, target, *args, **kwargs):
        if os.fspath(source).endswith(os.path.join("b", "3.png")):
            raise PermissionError(1, "Operation not permitted", source, None, target)
        return real_link(source, target, *args, **kwargs)

    monkeypatch.setattr(split_files.os, "link", protected)
    result = run_torchkit_in_process(
        "split", "raw", "out", "-q", "--mode", "hardlink", cwd=tmp_path
    )
    assert result.returncode == 1
    line = error_line(result.stderr, besides="nothing")
    assert line.startswith("Error: cannot link ") and line.endswith(
        f"{os.path.join('raw', 'b', '3.png')}: the system lets a user hard-link only the files "
        "it owns or may write to (use --mode copy or symlink)"
    ), line
    assert not (tmp_path / "out").exists()


def test_fixed_with_groups_meets_counts_that_whole_groups_can_meet(tmp_path, caplog):
    """Dealt in seeded order, the pair came last, when train was full: it went to val (2, for
    --fixed 1,1) while a single stayed in train. Swapped, the counts are met (4/1/1) and no
    warning says that whole groups cannot meet them; the pair stays together."""
    names = ["cat/p.jpg", "cat/p.png", *(f"cat/s{i}.png" for i in range(4))]
    root = write_images(tmp_path / "raw", names)
    with caplog.at_level("WARNING", logger="torchkit"):
        result = split_dataset(
            root, tmp_path / "out", fixed="1,1", group="stem", seed=1, mode="manifest"
        )
    assert result.counts == [[4, 1, 1]] and "--fixed" not in caplog.text
    rows = (tmp_path / "out" / "split.csv").read_text().splitlines()[1:]
    assert len({row.split(",")[2] for row in rows if "/p." in row}) == 1
    # Counts the dealing met already are left as they were.
    parts = [[[0, 1]], [[2]], [[3]]]
    split_plan._closer_to_counts(parts, [2, 1, 1])
    assert parts == [[[0, 1]], [[2]], [[3]]]


def test_fixed_with_many_group_sizes_trades_without_trying_every_size(monkeypatch):
    """A class of groups of 150 sizes: each step looks up the sizes nearest the counts, where
    trying every pair given against every size taken back was 150^3 tries a step (a class of
    400 sizes took minutes). The counts are met still, the same way each time."""
    tried = []
    best_step = split_plan._best_step

    def counted(best, moves, *args):
        tried.append(len(moves))
        return best_step(best, moves, *args)

    monkeypatch.setattr(split_plan, "_best_step", counted)
    sizes = [1 + (i * 7919) % 150 for i in range(600)]
    starts = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    units = [list(range(starts[i], starts[i + 1])) for i in range(len(sizes))]
    targets = [starts[-1] - 2 * 1201, 1201, 1201]
    dealt = [units[:-20], units[-20:-10], units[-10:]]  # held-out 765 and 665: far too few
    again = [list(part) for part in dealt]
    split_plan._closer_to_counts(dealt, targets)
    assert [sum(len(unit) for unit in units) for units in dealt] == targets
    assert sum(tried) < 150**2 * 10, sum(tried)
    split_plan._closer_to_counts(again, targets)
    assert again == dealt
