"""`convert shards SRC OUT -o REPORT`: a report that cannot be written (a full disk) is written
before manifest.json completes OUT, so its failure leaves OUT an interrupted run that the same
command finishes, every shard kept, never a complete-looking OUT beside an error that only
--force could write again."""

from __future__ import annotations

import json

from disks import fill_disk
from image_folders import write_image_folder
from output_checks import error_line
from processes import run_torchkit_in_process


def test_a_report_the_full_disk_refuses_leaves_out_to_be_finished(tmp_path, small_tmpfs):
    data = write_image_folder(tmp_path / "data", {"a": 2, "b": 2})
    out = tmp_path / "out"
    disk = fill_disk(small_tmpfs(16))
    report = disk / "report.json"
    command = ("convert", "shards", data, out, "-o", report, "-j", "0")
    done = run_torchkit_in_process(*command)
    assert done.returncode == 1
    assert error_line(done.stderr).startswith(f"Error: cannot write {report}: No space left")
    # Before: manifest.json was there (OUT complete), and the run again said "output folder
    # already exists (pass --force to overwrite it)".
    assert sorted(p.name for p in out.iterdir()) == [
        ".torchkit", "classes.txt", "manifest.partial.json", "shard-000000.tar"
    ]  # fmt: skip
    shard = (out / "shard-000000.tar").read_bytes()
    (disk / "filler").unlink()
    done = run_torchkit_in_process(*command)
    assert done.returncode == 0, done.stderr
    assert "kept 1 complete shard(s) of an interrupted run" in done.stderr
    assert (out / "shard-000000.tar").read_bytes() == shard
    written = json.loads(report.read_text())
    assert written["samples"] == 4 and written["kept_shards"] == 1
    assert json.loads((out / "manifest.json").read_text())["complete"] is True
    assert not (out / "manifest.partial.json").exists()
