"""Bind mounts for a test, seen by no one else: `in_bind_mounts` runs a function in a forked
child in a mount namespace of its own (as `unshare -m` makes it, every mount private), after
bind-mounting the folders it is given; the function's JSON answer comes back to the test."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

CLONE_NEWNS = 0x00020000
MS_BIND, MS_REC, MS_PRIVATE = 4096, 0x4000, 1 << 18
_NO_NAMESPACE = "no mount namespace"


def in_bind_mounts(
    binds: Sequence[tuple[Path, Path]], work: Callable[[], object], timeout: float = 120
) -> object:
    """`work()`'s answer (JSON), run in a forked child (a session of its own, killed after
    `timeout` s) in which each (folder, at) of `binds` is bind-mounted (`mount --bind folder
    at`); skips the test where no mount namespace can be made (not root)."""
    import ctypes
    import traceback

    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # the child: never returns into pytest
        status = 0
        try:
            os.setsid()
            os.close(read_end)
            libc = ctypes.CDLL(None, use_errno=True)

            def mount(source: bytes | None, target: bytes, flags: int) -> None:
                if libc.mount(source, target, None, ctypes.c_ulong(flags), None) != 0:
                    raise OSError(ctypes.get_errno(), f"cannot mount {target!r}")

            if libc.unshare(CLONE_NEWNS) != 0:
                answer: object = _NO_NAMESPACE
            else:
                mount(None, b"/", MS_REC | MS_PRIVATE)  # before anything is mounted
                for folder, at in binds:
                    mount(os.fsencode(folder), os.fsencode(at), MS_BIND)
                answer = work()
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
