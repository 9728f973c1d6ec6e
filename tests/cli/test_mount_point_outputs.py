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
from mount_namespaces import in_mount_namespace
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
    convert = ("convert", "tensor", images / "a", "--to", "npy")
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
        return [
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
    code, stderr, listed, left, still_mounted, forced_code, forced_stderr, untouched = answer
    assert code == 0, stderr
    assert listed == [".torchkit", "a_0.npy", "a_1.npy"]
    assert left == [] and still_mounted
    assert forced_code == 1 and error_line(forced_stderr) == (
        f"Error: output folder {full} is a mount point, which cannot be renamed to set the "
        f"earlier output in it aside (give a new folder inside it, or empty {full} yourself)"
    )
    assert untouched
    assert sorted(os.listdir(tmp_path)) == ["earlier", "failed", "full", "images", "volume"]
