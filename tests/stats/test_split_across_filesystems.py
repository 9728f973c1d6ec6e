"""`split --mode move` onto another file system for real (no os.rename patched to fail): the
rename fails with EXDEV and each file is copied beside its place, verified, renamed in, and only
then removed from ROOT; OUT made inside a world-writable sticky folder (mode 1777, as /tmp and
/dev/shm are) is an ordinary folder of the user's, not one that inherits the sticky bit."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from processes import run_torchkit_in_process
from split_moves import stop_move_after


def write_images(root: Path) -> dict[str, bytes]:
    """ROOT/{a,b}/<i>.png, mode 0640, each file's bytes its own name: {relative path: bytes}."""
    made = {}
    for label in "ab":
        (root / label).mkdir(parents=True)
        for i in range(3):
            path = root / label / f"{i}.png"
            path.write_bytes(f"{label}{i}".encode() * 50)
            path.chmod(0o640)
            made[f"{label}/{i}.png"] = path.read_bytes()
    return made


def test_a_move_onto_another_file_system_into_a_sticky_folder_copies_verifies_and_removes(
    tmp_path, small_tmpfs
):
    data = tmp_path / "data"
    made = write_images(data)
    disk = small_tmpfs(1024)
    disk.chmod(0o1777)  # world-writable with the sticky bit, as /tmp
    assert os.stat(disk).st_dev != os.stat(data).st_dev
    try:  # the file systems differ: a rename between them is refused, which the move falls to
        os.rename(data / "a" / "0.png", disk / "probe.png")
    except OSError as error:
        assert error.errno == errno.EXDEV
    else:
        raise AssertionError("a rename across the two file systems succeeded")
    out = disk / "out"
    result = run_torchkit_in_process("split", data, out, "--mode", "move", "--ratio", "1:1")
    assert result.returncode == 0, result.stderr
    moved = {p.relative_to(out): p for p in out.rglob("*.png")}
    assert sorted(p.read_bytes() for p in moved.values()) == sorted(made.values())
    assert {p.name for p in moved} == {Path(name).name for name in made}
    assert all(stat.S_IMODE(os.stat(p).st_mode) == 0o640 for p in moved.values())  # as they were
    assert not [p for p in data.rglob("*") if p.is_file()]  # removed once verified
    assert not [p for p in out.rglob(".torchkit-move-*")]  # no unverified copy left
    assert not stat.S_IMODE(os.stat(out).st_mode) & (stat.S_ISVTX | stat.S_IWOTH)
    assert sorted(os.listdir(disk)) == ["out"]  # nothing beside OUT in the shared folder


def test_finishing_a_move_onto_a_disk_that_fills_says_it_cannot_write_and_loses_nothing(
    tmp_path, small_tmpfs, monkeypatch
):
    """Before: the rerun that finishes a stopped move ended in `Error: OSError: [Errno 28] No
    space left on device: ...`, where the move that began it said `cannot write OUT`. (The
    disk had room as the rerun began: another process fills it.)"""
    from disks import fill_disk
    from output_checks import error_line

    from torchkit.core.split import run as split_run

    data = tmp_path / "data"
    made = write_images(data)
    disk = small_tmpfs(1024)
    out = disk / "out"
    stop_move_after(1, monkeypatch, data, out, ratio="1:1")
    fill_disk(disk, leave=4096)  # room for one more file, not for the rest
    monkeypatch.setattr(split_run, "check_room_for_move", lambda *args, **kwargs: None)
    args = ("split", data, out, "--mode", "move", "--ratio", "1:1")
    full = run_torchkit_in_process(*args)
    assert full.returncode == 1
    assert error_line(full.stderr, besides="warnings").startswith(
        f"Error: cannot write {out}: No space left on device"
    )
    (disk / "filler").unlink()
    assert run_torchkit_in_process(*args).returncode == 0  # and the rerun finishes it
    moved_files = sorted(p.read_bytes() for p in out.rglob("*.png"))
    assert moved_files == sorted(made.values())
    assert not [p for p in data.rglob("*") if p.is_file()]


def test_a_move_onto_a_disk_without_room_for_it_is_refused_before_any_file_moves(
    tmp_path, small_tmpfs, monkeypatch
):
    """A move onto another file system copies each file before it removes it from ROOT: one
    onto a disk too small stopped half-way, `cannot write OUT: No space left on device`, with
    half the data in OUT until the user made room there. Refused before the first file
    moves, as is the rerun that would finish a stopped move without the room for the rest."""
    from disks import fill_disk
    from output_checks import error_line

    data = tmp_path / "data"
    for label in "ab":
        (data / label).mkdir(parents=True)
        for i in range(3):
            (data / label / f"{i}.png").write_bytes(bytes([i]) * 40_000)
    before = sorted(p.relative_to(data) for p in data.rglob("*.png"))
    disk = small_tmpfs(128)  # room for 3 of the 6 files
    out = disk / "out"
    args = ("split", data, out, "--mode", "move", "--ratio", "1:1")
    refused = run_torchkit_in_process(*args)
    assert refused.returncode == 1
    line = error_line(refused.stderr)
    # 6 files of 40,000 bytes take 10 pages of 4 KiB each; the disk, less its locks and folders
    assert line.startswith(f"Error: cannot write {out}: its disk has 0.1"), line
    assert line.endswith(
        "files to move onto it take 0.246 MB (no file was moved: free some space, or choose an "
        "output folder on a disk with room)"
    ), line
    assert sorted(p.relative_to(data) for p in data.rglob("*.png")) == before
    assert not out.exists()
    # A stopped move, whose rest no longer fits: refused before any more files move
    disk = small_tmpfs(1024)
    out = disk / "out"
    stop_move_after(1, monkeypatch, data, out, ratio="1:1")
    fill_disk(disk, leave=100_000)
    left = sorted(p.relative_to(data) for p in data.rglob("*.png"))
    assert len(left) == 5
    args = ("split", data, out, "--mode", "move", "--ratio", "1:1")
    refused = run_torchkit_in_process(*args)
    assert refused.returncode == 1
    assert error_line(refused.stderr, besides="warnings").endswith(
        "MB (free some space on it, then run the same command again to finish the move)"
    )
    assert sorted(p.relative_to(data) for p in data.rglob("*.png")) == left
    (disk / "filler").unlink()
    assert run_torchkit_in_process(*args).returncode == 0
    assert not list(data.rglob("*.png")) and len(list(out.rglob("*.png"))) == 6


def test_a_forced_move_onto_another_disk_counts_the_room_of_the_split_it_replaces(
    tmp_path, small_tmpfs
):
    """`--force` deletes the earlier split in OUT before the first file moves: a disk that
    holds it and has room for the move once it is gone was refused, `its disk has 0.135 MB
    free, and the files to move onto it take 0.246 MB`, from the free space at the start."""
    from disks import fill_disk
    from output_checks import error_line

    data = tmp_path / "data"
    for label in "ab":
        (data / label).mkdir(parents=True)
        for i in range(3):
            (data / label / f"{i}.png").write_bytes(bytes([i]) * 40_000)
    disk = small_tmpfs(384)  # room for the 6 files once, not twice
    out = disk / "out"
    assert run_torchkit_in_process("split", data, out, "--ratio", "1:1").returncode == 0
    args = ("split", data, out, "--mode", "move", "--ratio", "1:1", "--force")
    moved = run_torchkit_in_process(*args)
    assert moved.returncode == 0, moved.stderr
    assert not list(data.rglob("*.png")) and len(list(out.rglob("*.png"))) == 6
    # Where the room it gives back is not enough, the refusal counts it, and nothing moves
    for label in "ab":
        for i in range(3):
            (data / label / f"{i}.png").write_bytes(bytes([i]) * 40_000)
    disk = small_tmpfs(384)
    out = disk / "out"
    assert run_torchkit_in_process("split", data, out, "--ratio", "1:1").returncode == 0
    (data / "a" / "3.png").write_bytes(b"3" * 40_000)  # one more than the earlier split
    fill_disk(disk, leave=16_384)
    refused = run_torchkit_in_process(*args[:2], out, *args[3:])
    assert refused.returncode == 1
    line = error_line(refused.stderr)
    assert "MB more once the split it replaces is deleted), and the files to move" in line, line
    assert len(list(data.rglob("*.png"))) == 7 and len(list(out.rglob("*.png"))) == 6


def test_a_move_onto_a_disk_without_inodes_for_it_is_refused_before_any_file_moves(
    tmp_path, small_tmpfs, monkeypatch
):
    """A disk with room for the bytes but not for as many files (its inodes: tmpfs, ext4)
    stopped the move half-way, `No space left on device`, with the data half in OUT. Refused
    before the first file moves, as is the rerun that would finish a stopped move; --force
    counts the files of the split it replaces."""
    from output_checks import error_line

    data = tmp_path / "data"
    for label in "ab":
        (data / label).mkdir(parents=True)
        for i in range(10):
            (data / label / f"{i}.png").write_bytes(bytes([i]) * 10)
    disk = small_tmpfs(1024, inodes=20)  # room for the bytes, not for 20 files and 6 folders
    out = disk / "out"
    args = ("split", data, out, "--mode", "move", "--ratio", "1:1")
    refused = run_torchkit_in_process(*args)
    assert refused.returncode == 1
    line = error_line(refused.stderr)
    assert line.startswith(f"Error: cannot write {out}: its disk has room for 1"), line
    assert "more files and folders (inodes), and the move makes 26 there (no file was" in line
    assert len(list(data.rglob("*.png"))) == 20 and not out.exists()
    # A stopped move whose rest no longer fits: refused before any more files move
    disk = small_tmpfs(1024, inodes=40)
    out = disk / "out"
    stop_move_after(2, monkeypatch, data, out, ratio="1:1")
    fillers = []
    for i in range(40):
        try:
            (disk / f"filler{i}").touch()
        except OSError:
            break
        fillers.append(disk / f"filler{i}")
    for filler in fillers[-4:]:  # room for the run's own lock and records, not for the rest
        filler.unlink()
    refused = run_torchkit_in_process("split", data, out, "--mode", "move", "--ratio", "1:1")
    assert refused.returncode == 1
    assert "and the move makes 18 there (free some space on it, then run" in error_line(
        refused.stderr, besides="warnings"
    )
    assert len(list(data.rglob("*.png"))) == 18
    # --force over an earlier split: its 20 files and 6 folders give their inodes back
    data = tmp_path / "more"
    for label in "ab":
        (data / label).mkdir(parents=True)
        for i in range(10):
            (data / label / f"{i}.png").write_bytes(bytes([i]) * 10)
    disk = small_tmpfs(1024, inodes=40)
    out = disk / "out"
    assert run_torchkit_in_process("split", data, out, "--ratio", "1:1").returncode == 0
    moved = run_torchkit_in_process("split", data, out, *args[3:], "--force")
    assert moved.returncode == 0, moved.stderr
    assert not list(data.rglob("*.png")) and len(list(out.rglob("*.png"))) == 20


def test_the_links_a_move_makes_anew_on_another_disk_count_as_files(tmp_path, small_tmpfs):
    """A link in ROOT is made anew in OUT, one more name on OUT's disk: links were counted as
    taking no room, and a disk with inodes for the files alone stopped the move half-way."""
    from output_checks import error_line

    data = tmp_path / "data"
    (data / "a").mkdir(parents=True)
    for i in range(2):
        (data / "a" / f"{i}.png").write_bytes(bytes([i]) * 10)
    for i in range(4):
        (data / "a" / f"link{i}.png").symlink_to(f"{i % 2}.png")
    disk = small_tmpfs(1024, inodes=10)  # 9 free: room for 2 files and 4 folders, not 4 links
    out = disk / "out"
    refused = run_torchkit_in_process("split", data, out, "--mode", "move", "--ratio", "1:1")
    assert refused.returncode == 1
    line = error_line(refused.stderr)
    assert "files and folders (inodes), and the move makes 10 there (no file was moved" in line
    assert len(list(data.rglob("*.png"))) == 6 and not out.exists()
