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


def test_finishing_a_move_onto_a_full_disk_says_it_cannot_write_and_loses_nothing(
    tmp_path, small_tmpfs, monkeypatch
):
    """Before: the rerun that finishes a stopped move ended in `Error: OSError: [Errno 28] No
    space left on device: ...`, where the move that began it said `cannot write OUT`."""
    import pytest
    from disks import fill_disk
    from output_checks import error_line

    from torchkit.core.split import files as split_files
    from torchkit.core.split.run import split_dataset

    data = tmp_path / "data"
    made = write_images(data)
    disk = small_tmpfs(1024)
    out = disk / "out"
    move_file, moved = split_files.move_file, []

    def stop_after_one(source, dest, links=None):
        if moved:
            raise KeyboardInterrupt
        move_file(source, dest, links)
        moved.append(source)

    with monkeypatch.context() as patched:
        patched.setattr(split_files, "move_file", stop_after_one)
        with pytest.raises(KeyboardInterrupt):
            split_dataset(data, out, mode="move", ratio="1:1")
    fill_disk(disk, leave=4096)  # room for one more file, not for the rest
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
