"""An output folder that is itself a mount point (a volume mounted at OUT, as `docker run -v
results:/results` gives one): the kernel renames neither it nor a folder onto it (EBUSY), so
an atomic output is written into it in place, and an earlier output in it is refused by
`--force` before any work (it cannot be set aside). Real tmpfs mounts in a mount namespace of
the test's own (`mount_namespaces`)."""

from __future__ import annotations

import os
import shutil

import pytest
from image_folders import write_image_folder
from mount_namespaces import MS_BIND, in_mount_namespace
from output_checks import error_line, tree_digest
from processes import run_torchkit_in_process

from torchkit.core.io.files import atomic_write_text
from torchkit.core.io.outputs import OutputFolder

pytestmark = pytest.mark.skipif(os.name != "posix", reason="Linux's mounts")


def test_an_output_folder_that_is_a_mount_point_is_written_in_place(tmp_path):
    """`convert tensor IMAGES VOL` (an atomic output) into an empty tmpfs at VOL failed after
    all its work with "Error: OSError: [Errno 16] Device or resource busy: '.VOL.*.partial'
    -> 'VOL'"; `train --out VOL --force` over an earlier run in it failed the same way once it
    had read the data. Now the first is written in place (a failed run removes what it wrote,
    the mount stays), the second refused before any work, nothing touched."""
    images = write_image_folder(tmp_path / "images", {"a": 2})
    earlier = tmp_path / "earlier"
    convert = ("convert", "tensor", images / "a", "--to", "npy", "-j", "0")  # no pool forked
    assert run_torchkit_in_process(*convert, earlier).returncode == 0
    volume, failed, full = tmp_path / "volume", tmp_path / "failed", tmp_path / "full"
    for folder in (volume, failed, full):
        folder.mkdir()

    def work(mount) -> list:
        for folder in (volume, failed, full):
            mount("tmpfs", folder, "tmpfs", 0, "size=1m")
        shutil.copytree(earlier, full, dirs_exist_ok=True)
        before = tree_digest(full)
        written = run_torchkit_in_process(*convert, volume)
        output = OutputFolder(failed, command="test", atomic=True)
        atomic_write_text(output.begin() / "half.csv", "x\n")
        output.finish(False)  # a failed run
        forced = run_torchkit_in_process(*convert, full, "--force")
        plain = run_torchkit_in_process(*convert, full)  # its hint: not "pass --force"
        return [
            plain.stderr,
            written.returncode,
            written.stderr,
            sorted(os.listdir(volume)),
            os.listdir(failed),
            os.path.ismount(failed),
            forced.returncode,
            forced.stderr,
            tree_digest(full) == before,
        ]

    answer = in_mount_namespace(work)
    plain, code, stderr, listed, left, still_mounted, forced_code, forced_stderr, untouched = answer
    assert error_line(plain) == (
        f"Error: output folder already exists: {full} (it is a mount point, which cannot be "
        "renamed to set the earlier output in it aside: give a new folder inside it, or empty "
        "it yourself)"
    )
    assert code == 0, stderr
    assert listed == [".torchkit", "a_0.npy", "a_1.npy"]
    assert left == [] and still_mounted
    assert forced_code == 1 and error_line(forced_stderr) == (
        f"Error: output folder {full} is a mount point, which cannot be renamed to set the "
        f"earlier output in it aside (give a new folder inside it, or empty {full} yourself)"
    )
    assert untouched
    assert sorted(os.listdir(tmp_path)) == ["earlier", "failed", "full", "images", "volume"]


def test_a_file_output_that_is_a_mount_point_is_refused_before_any_work(tmp_path):
    """`-o OUT/my report.json` where a file is bind-mounted at that name (`docker run -v
    ./report.json:/out/report.json`): with --force, dataset-stats failed after its work with
    "Error: OSError: [Errno 18] Invalid cross-device link" (the old file linked aside) and env
    with "[Errno 16] Device or resource busy" (the new one renamed over it); without, "pass
    --force" led there. Refused before any work now, the mounted file untouched."""
    images = write_image_folder(tmp_path / "images", {"a": 2})
    kept, report = tmp_path / "kept.json", tmp_path / "out" / "my report.json"
    kept.write_text("yours\n")
    report.parent.mkdir()
    report.write_text("")

    def work(mount) -> list:
        mount(kept, report, flags=MS_BIND)
        runs = [
            ("dataset-stats", images, "-o", report, "--force"),
            ("env", "-o", report, "--force"),
            ("env", "-o", report),
        ]
        results = [run_torchkit_in_process(*args) for args in runs]
        return [[result.returncode, result.stderr] for result in results]

    answers = in_mount_namespace(work)
    for code, stderr in answers:  # type: ignore[union-attr]
        assert code == 1 and error_line(stderr) == (
            f"Error: output {report} is a mount point (a file mounted there), which torchkit "
            "cannot replace (give another file name, and copy the result there yourself)"
        ), stderr
    assert kept.read_text() == "yours\n" and report.read_text() == ""
    assert sorted(os.listdir(tmp_path / "out")) == ["my report.json"]


def test_a_run_folder_that_is_a_mount_point_is_not_offered_force(tmp_path):
    """`train --out VOL` over an earlier run in a volume mounted at VOL said "pass --resume VOL
    to continue that run, --force to overwrite it", and --force then refused VOL as a mount
    point. Now the first refusal says so, and offers --resume and another --out only."""
    import torch

    from torchkit.core.io.force import write_marker

    write_image_folder(tmp_path / "ds", {"a": 4, "b": 4})
    last = tmp_path / "last.pt"
    torch.save({"format_version": 1, "torchkit_version": "0"}, last)  # a run's, by its keys
    train = ("train", "--model", "convnet", "--data", "ds", "--epochs", "1", "--out", "volume")
    volume = tmp_path / "volume"
    volume.mkdir()

    def work(mount) -> list:
        mount("tmpfs", volume, "tmpfs", 0, "size=1m")
        write_marker(volume, "train")  # an earlier run: refused before any work
        shutil.copy(last, volume / "last.pt")
        plain = run_torchkit_in_process(*train, cwd=tmp_path)
        forced = run_torchkit_in_process(*train, "--force", cwd=tmp_path)
        return [plain.stderr, forced.returncode, forced.stderr, sorted(os.listdir(volume))]

    plain, forced_code, forced_stderr, listed = in_mount_namespace(work)
    assert error_line(plain) == (
        "Error: run folder already exists: volume (pass --resume volume to continue that run, "
        "or choose another --out; it is a mount point, which cannot be renamed to set the "
        "earlier output in it aside: give a new folder inside it, or empty it yourself)"
    )
    assert forced_code == 1 and "volume is a mount point" in error_line(forced_stderr)
    assert listed == [".torchkit", "last.pt"]
