"""A file output written anew over an existing file keeps that file's permissions, as `>` and
`cp` keep them: `-o report.json --force`, `benchmark -o log.csv --append`, a checkpoint
replaced in place. A new file, or one written over a symbolic link, gets the umask's. An output
folder that `--force` replaces keeps its permissions too (the owner's rwx added)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from processes import run_torchkit_in_process

from torchkit.core.io.files import atomic_path, atomic_write_bytes, atomic_write_text
from torchkit.core.io.output_paths import MARKER
from torchkit.core.io.outputs import OutputFolder


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _through_atomic_path(path: Path, text: str) -> None:  # writers that want a name
    with atomic_path(path) as temporary:
        temporary.write_text(text)


WRITERS = {
    "text": atomic_write_text,
    "bytes": lambda path, text: atomic_write_bytes(path, text.encode()),
    "named": _through_atomic_path,
}


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("mode", [0o600, 0o640, 0o444, 0o755])
def test_a_file_written_over_keeps_its_permissions(tmp_path, writer, mode):
    target = tmp_path / "report.json"
    target.write_text("old")
    target.chmod(mode)
    WRITERS[writer](target, "new")
    assert target.read_text() == "new"
    assert _mode(target) == mode


@pytest.mark.parametrize("writer", WRITERS)
def test_a_new_file_and_a_replaced_link_get_the_umasks_permissions(tmp_path, writer):
    WRITERS[writer](tmp_path / "new.json", "new")
    assert _mode(tmp_path / "new.json") == _umask_mode()

    private = tmp_path / "private.txt"
    private.write_text("mine")
    private.chmod(0o600)
    link = tmp_path / "link.json"
    link.symlink_to(private)
    WRITERS[writer](link, "new")  # the link is replaced, never followed
    assert not link.is_symlink() and _mode(link) == _umask_mode()
    assert private.read_text() == "mine" and _mode(private) == 0o600


def test_set_id_bits_are_not_carried_over(tmp_path):
    target = tmp_path / "tool.sh"
    target.write_text("old")
    target.chmod(0o4755)
    atomic_write_text(target, "new")
    assert _mode(target) == 0o755


def test_force_keeps_a_private_report_private(tmp_path):
    report = tmp_path / "summary.json"
    report.write_text("{}\n")
    report.chmod(0o600)
    result = run_torchkit_in_process("summary", "convnet", "-i", "1,8,8", "-o", report, "--force")
    assert result.returncode == 0, result.stderr
    assert report.read_text() != "{}\n"
    assert _mode(report) == 0o600  # was 0o644: readable by every user


def test_benchmark_append_keeps_the_logs_permissions(tmp_path):
    log = tmp_path / "bench.csv"
    args = ["benchmark", "convnet", "-i", "1,8,8", "-b", "1", "--device", "cpu"]
    args += ["--warmup", "0", "--iters", "1", "-o", log, "--append", "-q"]
    assert run_torchkit_in_process(*args).returncode == 0
    log.chmod(0o640)
    result = run_torchkit_in_process(*args)
    assert result.returncode == 0, result.stderr
    assert len(log.read_text().splitlines()) == 3  # the header and two runs' rows
    assert _mode(log) == 0o640  # was 0o644


def _write_output(out: Path, *, atomic: bool, force: bool = False) -> None:
    with OutputFolder(out, command="eval", force=force, atomic=atomic) as output:
        output.begin()
        atomic_write_text(output.path / "metrics.json", "{}\n")
        output.keep()


@pytest.mark.parametrize("atomic", [True, False], ids=["atomic", "in-place"])
@pytest.mark.parametrize("mode", [0o700, 0o750, 0o555])
def test_a_folder_replaced_by_force_keeps_its_permissions(tmp_path, atomic, mode):
    out = tmp_path / "report"
    _write_output(out, atomic=atomic)
    out.chmod(mode)
    _write_output(out, atomic=atomic, force=True)
    assert _mode(out) == mode | 0o700  # was 0o755; the owner keeps writing into it
    assert sorted(os.listdir(out)) == [MARKER, "metrics.json"]


@pytest.mark.parametrize("atomic", [True, False], ids=["atomic", "in-place"])
def test_a_new_folder_gets_the_umasks_permissions_and_an_empty_one_its_own(tmp_path, atomic):
    _write_output(tmp_path / "new", atomic=atomic)
    mask = os.umask(0)
    os.umask(mask)
    assert _mode(tmp_path / "new") == 0o777 & ~mask
    empty = tmp_path / "empty"
    empty.mkdir()
    empty.chmod(0o700)
    _write_output(empty, atomic=atomic)
    assert _mode(empty) == 0o700


def test_eval_force_keeps_a_private_report_folder_private(tmp_path):
    out = tmp_path / "report"
    args = ["eval", "convnet", "--allow-untrained", "--data", "digits", "--out", out, "-q"]
    assert run_torchkit_in_process(*args).returncode == 0
    out.chmod(0o700)
    result = run_torchkit_in_process(*args, "--force")
    assert result.returncode == 0, result.stderr
    assert (out / "metrics.json").is_file()
    assert _mode(out) == 0o700  # was 0o755: listable by every user


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root")
@pytest.mark.parametrize("writer", WRITERS)
def test_a_file_written_over_keeps_its_owner_and_group_where_allowed(tmp_path, writer):
    target = tmp_path / "shared.csv"
    target.write_text("old")
    target.chmod(0o660)
    os.chown(target, 65534, 65534)  # another user's file, in another group
    WRITERS[writer](target, "new")
    status = os.lstat(target)
    assert (status.st_uid, status.st_gid, _mode(target)) == (65534, 65534, 0o660)
