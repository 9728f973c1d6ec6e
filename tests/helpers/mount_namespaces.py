"""Mounts for a test, seen by no one else: `in_mount_namespace` runs a function in a forked
child in a mount namespace of its own (as `unshare -m` makes it, every mount private), handing
it a `mount` call (libc's mount(2)); `in_bind_mounts` bind-mounts the folders it is given before
it calls the function. The function's JSON answer comes back to the test. The child is a fork
of pytest's process: torch and torchkit are imported already, and commands run in-process
(`run_torchkit_in_process`) see the mounts."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import pytest

CLONE_NEWNS = 0x00020000
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 0x4000, 1 << 18
_NO_NAMESPACE = "no mount namespace"


class Mount(Protocol):
    def __call__(
        self,
        source: str | os.PathLike | None,
        target: str | os.PathLike,
        kind: str | None = None,
        flags: int = 0,
        data: str | None = None,
    ) -> None: ...


def in_mount_namespace(work: Callable[[Mount], object], timeout: float = 120) -> object:
    """`work(mount)`'s answer (JSON), run in a forked child (a session of its own, killed with
    its workers after `timeout` s) in a mount namespace of its own, where `mount(source,
    target, kind, flags, data)` is mount(2) (`mount("tmpfs", at, "tmpfs", 0, "size=16k")`,
    `mount(folder, at, flags=MS_BIND)`); skips the test where no mount namespace can be made
    (not root)."""
    import ctypes
    import traceback

    def encoded(value: str | os.PathLike | None) -> bytes | None:
        return None if value is None else os.fsencode(value)

    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # the child: never returns into pytest
        status = 0
        try:
            os.setsid()
            os.close(read_end)
            libc = ctypes.CDLL(None, use_errno=True)

            def mount(source, target, kind=None, flags=0, data=None) -> None:
                done = libc.mount(
                    encoded(source), encoded(target), encoded(kind), ctypes.c_ulong(flags),
                    encoded(data),
                )  # fmt: skip
                if done != 0:
                    raise OSError(ctypes.get_errno(), f"cannot mount {target} ({data})")

            if libc.unshare(CLONE_NEWNS) != 0:
                answer: object = _NO_NAMESPACE
            else:
                mount(None, "/", flags=MS_REC | MS_PRIVATE)  # before anything is mounted
                answer = work(mount)
        except BaseException:  # noqa: BLE001 - told to the test
            answer, status = traceback.format_exc(), 1
        finally:
            with contextlib.suppress(BaseException), os.fdopen(write_end, "w") as out:
                json.dump(answer, out)
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end) as answers:
        if not select.select([answers], [], [], timeout)[0]:
            os.killpg(child, signal.SIGKILL)
        told = answers.read()
    _, status = os.waitpid(child, 0)
    answer = json.loads(told) if told else f"no answer: the child ended with status {status}"
    if answer == _NO_NAMESPACE:
        pytest.skip("cannot make a mount namespace here (needs root)")
    assert os.waitstatus_to_exitcode(status) == 0, answer
    return answer


def in_bind_mounts(
    binds: Sequence[tuple[Path, Path]], work: Callable[[], object], timeout: float = 120
) -> object:
    """`work()`'s answer (JSON), run as `in_mount_namespace` runs it, after each (folder, at)
    of `binds` is bind-mounted (`mount --bind folder at`)."""

    def bound(mount: Mount) -> object:
        for folder, at in binds:
            mount(folder, at, flags=MS_BIND)
        return work()

    return in_mount_namespace(bound, timeout)
