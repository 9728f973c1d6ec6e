"""The output-overlap check across bind mounts: a folder shown at a second path (OUT mounted
inside the data, the data's folder mounted inside OUT) is the same folder, which realpath
cannot tell. Real mounts in a mount namespace of the test's own (`mount_namespaces`), and the
mount table read from a mountinfo file where no mount can be made."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from image_folders import make_class_files
from mount_namespaces import in_bind_mounts, in_mount_namespace
from output_checks import error_line, tree_digest
from processes import run_torchkit_in_process

from torchkit.core.io.mounts import MountTable
from torchkit.core.io.overlap import InputPath, OutputOverlapError, check_overlap

pytestmark = pytest.mark.skipif(os.name != "posix", reason="Linux's mount table")


def test_the_other_places_of_a_folder_are_read_from_the_mount_table(tmp_path):
    """mountinfo's fields (a space written `\\040`): a mount of the folder or of one above it
    shows it whole, a mount of a folder inside it shows a part; another file system's mount
    of the same path names another folder."""
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
        "40 27 254:0 /srv/runs /data/my\\040runs rw - ext4 /dev/vda rw\n"  # runs, elsewhere
        "41 27 254:0 /srv/runs/out/train /mnt/train rw - ext4 /dev/vda rw\n"  # a part of out
        "42 27 0:50 /srv/runs/out /mnt/other rw - tmpfs tmpfs rw\n"  # another file system
        "43 27 254:0 /srv/data /srv/runs/out/in rw - ext4 /dev/vda rw\n"  # data inside out
    )
    table = MountTable.read(str(mountinfo))
    assert table.places("/srv/runs/out") == (["/data/my runs/out"], ["/mnt/train"])
    assert table.places("/srv/elsewhere") == ([], [])
    assert table.points_below("/srv/runs/out") == ["/srv/runs/out/in"]
    assert table.places("/srv/runs/out/in") == (["/srv/data"], [])
    assert MountTable.read(str(tmp_path / "none")).places("/srv/runs/out") == ([], [])


def test_an_output_and_an_input_joined_by_a_bind_mount_are_refused_and_nothing_is_lost(
    tmp_path,
):
    """OUT mounted inside the data (split wrote its split.csv into the data it read), the
    data's class folder mounted inside an earlier split (`--force` emptied it through the
    mount, deleting the images), and a folder of OUT mounted inside the data: refused before
    any work, as a second path to one folder is. `--force` over a folder holding a mount of
    a folder that is no input is refused too: it deleted that folder's files."""
    data = make_class_files(tmp_path / "data", {"cat": 3, "dog": 3})
    other = make_class_files(tmp_path / "other", {"cat": 3, "dog": 3})
    (data / "mounted").mkdir()
    out, earlier = tmp_path / "out", tmp_path / "earlier"
    out.mkdir()
    assert run_torchkit_in_process("split", data, earlier, "--mode", "copy").returncode == 0
    (tmp_path / "view" / "x").mkdir(parents=True)
    again = Path(shutil.copytree(earlier, tmp_path / "again"))  # the same split again
    shutil.copytree(earlier / "train" / "cat", tmp_path / "kept" / "cat")  # as split wrote it

    def work() -> object:
        runs = [
            ("split", data, out, "--mode", "manifest"),  # out is data/mounted too
            ("split", other, earlier, "--force"),  # earlier/train/cat is other/cat
            ("split", tmp_path / "view", earlier, "--force"),  # view/x is earlier/train
            ("split", data, again, "--force"),  # again/train/cat is kept/cat, no input
            ("split", data, again),  # the same without --force: its hint, not "pass --force"
        ]
        answer: list[object] = []
        for args in runs:
            result = run_torchkit_in_process(*args)
            answer.append([result.returncode, result.stderr])
        # an input inside a part of OUT shown elsewhere: OUT contains it
        try:
            check_overlap(earlier, "--out", [InputPath(tmp_path / "view" / "x" / "cat", "data")])
        except OutputOverlapError as error:
            answer.append(str(error))
        return answer

    binds = [
        (out, data / "mounted"),
        (other / "cat", earlier / "train" / "cat"),
        (earlier / "train", tmp_path / "view" / "x"),
        (tmp_path / "kept" / "cat", again / "train" / "cat"),
    ]
    before = tree_digest(tmp_path)
    first, second, third, fourth, fifth, core = in_bind_mounts(binds, work)  # type: ignore[misc]
    assert first[0] == 1 and error_line(first[1]) == (
        f"Error: output folder {out} lies inside the data folder {data} (it is mounted at "
        f"{data / 'mounted'} too) (choose an output outside the inputs, or unmount what "
        "joins them)"
    )
    assert second[0] == 1 and error_line(second[1]) == (
        f"Error: output folder {earlier} contains a folder of the data folder {other} "
        f"({earlier / 'train' / 'cat'} in it is a mount of {other / 'cat'}) (choose an output "
        "outside the inputs, or unmount what joins them)"
    )
    assert third[0] == 1 and error_line(third[1]) == (
        f"Error: output folder {earlier} lies partly inside the data folder {tmp_path / 'view'} "
        f"(a folder in it is mounted at {tmp_path / 'view' / 'x'}) (choose an output outside "
        "the inputs, or unmount what joins them)"
    )
    assert fourth[0] == 1 and error_line(fourth[1]) == (
        f"Error: output folder {again} holds a mount at {again / 'train' / 'cat'}, whose "
        f"files --force would delete with it (unmount it, or choose another folder than "
        f"{again})"
    )
    assert fifth[0] == 1 and error_line(fifth[1]) == (
        f"Error: output folder already exists: {again} (it holds a mount at "
        f"{again / 'train' / 'cat'}, whose files --force would delete with it: unmount it, or "
        "choose another folder)"
    )
    assert core.startswith(f"--out {earlier} contains the data {tmp_path / 'view' / 'x'}")
    assert tree_digest(tmp_path) == before  # not a byte written, nothing deleted


def test_mounts_out_of_sight_are_no_places(tmp_path):
    """mountinfo lists mounts that a later mount hides: one stacked on the same point, one
    inside a folder another file system was mounted over later (`mount -t tmpfs tmpfs A` over
    an A holding a mount at A/out/x). No path leads there: they are no place and no mount
    inside a folder (`--force` over A/out was refused, naming A/out/x)."""
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "27 27 254:0 / / rw - ext4 /dev/vda rw\n"  # a root listed as its own parent
        "40 27 0:40 / /a rw - tmpfs tmpfs rw\n"
        "41 40 0:41 / /a/out/x rw - tmpfs tmpfs rw\n"  # hidden by 42, mounted over /a later
        "42 40 0:42 / /a rw - tmpfs tmpfs rw\n"  # stacked on 40, which it hides
        "43 42 0:43 / /a/out/y rw - tmpfs tmpfs rw\n"  # in 42: in sight
        "44 27 254:0 /srv/data /b rw - ext4 /dev/vda rw\n"
        "45 27 254:0 /srv/other /b rw - ext4 /dev/vda rw\n"  # over 44 at the same point
        "46 27 254:0 /srv /c rw - ext4 /dev/vda rw\n"
    )
    table = MountTable.read(str(mountinfo))
    assert table.points_below("/a/out") == ["/a/out/y"]
    assert table.mount_of("/a/out/x/f").device == "0:42"
    assert table.places("/srv/data/f") == (["/c/data/f"], [])  # not /b/f: 44 is covered
    assert table.places("/srv/other/f") == (["/b/f", "/c/other/f"], [])


def test_force_over_a_folder_with_a_hidden_mount_inside_is_not_refused(tmp_path):
    """`split DATA A/out --force`, A/out holding an earlier split, where a mount at A/out/x
    was hidden by a tmpfs mounted over A later: no folder is at A/out/x, nothing of another
    folder would go with A/out. It was refused ('holds a mount at A/out/x')."""
    data = make_class_files(tmp_path / "data", {"cat": 3, "dog": 3})
    earlier, volume = tmp_path / "earlier", tmp_path / "a"
    assert run_torchkit_in_process("split", data, earlier, "--mode", "copy").returncode == 0
    volume.mkdir()

    def work(mount) -> object:
        mount("tmpfs", volume, "tmpfs", 0, "size=1m")
        (volume / "out" / "x").mkdir(parents=True)
        mount("tmpfs", volume / "out" / "x", "tmpfs", 0, "size=1m")
        mount("tmpfs", volume, "tmpfs", 0, "size=1m")  # over A: A/out/x out of sight
        shutil.copytree(earlier, volume / "out")
        result = run_torchkit_in_process("split", data, volume / "out", "--force")
        return [result.returncode, result.stderr, sorted(os.listdir(volume / "out"))]

    code, stderr, listed = in_mount_namespace(work)  # type: ignore[misc]
    assert code == 0, stderr
    assert listed == [".torchkit", "split.csv", "test", "train", "val"]


def test_a_mount_table_without_devices_tells_no_places(tmp_path, monkeypatch):
    """A mountinfo whose mounts all say device 0:0 (kernels that emulate Linux's; Linux gives
    no file system 0:0) seemed to show every mount's root at every mount point: `--out
    VOLUME` was refused as containing `--data DATA`, another mount ('it is mounted at /
    too'). Nothing is known there: no place, no refusal."""
    from torchkit.core.io import overlap

    results, data = tmp_path / "results", tmp_path / "data"
    results.mkdir(), data.mkdir()
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "1 0 0:0 / / rw - rootfs rootfs rw\n"
        f"2 1 0:0 / {results} rw - 9p results rw\n"
        f"3 1 0:0 / {data} rw - 9p data rw\n"
    )
    table = MountTable.read(str(mountinfo))
    assert table.places(str(results / "run")) == ([], [])
    monkeypatch.setattr(overlap.MountTable, "read", classmethod(lambda cls: table))
    check_overlap(results, "--out", [InputPath(data, "data folder")])


def test_without_a_mount_table_every_check_goes_on_and_knows_no_mount(tmp_path, monkeypatch):
    """Where /proc/self/mountinfo cannot be read (macOS, Windows, a container without /proc)
    the table is empty: no mount is known, no check fails on it, and `split --force` replaces
    an earlier split (the marker, its files) and refuses OUT inside the data, as elsewhere."""
    from torchkit.core.io import mounts
    from torchkit.core.io.mounts import is_mount_point

    monkeypatch.setattr(mounts, "MOUNTINFO", str(tmp_path / "no-proc" / "mountinfo"))
    assert MountTable.read().by_point == {}
    assert not is_mount_point(tmp_path) and is_mount_point("/")  # another file system's, seen
    data = make_class_files(tmp_path / "data", {"cat": 3, "dog": 3})
    assert run_torchkit_in_process("split", data, tmp_path / "out").returncode == 0
    again = run_torchkit_in_process("split", data, tmp_path / "out", "--force", "--seed", "3")
    assert again.returncode == 0, again.stderr
    inside = run_torchkit_in_process("split", data, data / "out")
    assert inside.returncode == 1 and "lies inside the data folder" in error_line(inside.stderr)
