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
