"""Worker processes started as new interpreters (`map_chunks(start_fresh=True)`, video-info's
pool): what other threads of the command hold is not copied into them, and they end with the
command however it ends. Forked workers (convert's, dataset-stats') do not wait for threads the
fork left behind."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading

from processes import processes_in_group, wait_until

from torchkit.core.runtime.pool import map_chunks

_held = threading.Lock()


def _takes_the_lock(_chunk: int) -> bool:
    taken = _held.acquire(timeout=3)
    if taken:
        _held.release()
    return taken


def test_freshly_started_workers_take_a_lock_another_thread_holds_and_leave_the_preload():
    """A fork copies a lock that another thread holds as held (OpenCV's and FFmpeg's threads in a
    process that read videos before): the worker that takes it waits forever. Workers started
    fresh take it at once. `preload` imports what forked workers then share; workers started
    fresh import it themselves, so the command does not run it (video-info imported OpenCV, a
    quarter of a second, for nothing). (One pool for both: each worker is a Python start.)"""
    holding, done = threading.Event(), threading.Event()

    def hold() -> None:
        with _held:
            holding.set()
            done.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait(5)
    taken: list[bool] = []
    preloaded: list[bool] = []
    try:
        map_chunks(
            _takes_the_lock,
            [1, 2],
            workers=2,
            on_result=taken.append,
            preload=lambda: preloaded.append(True),
            start_fresh=True,
        )
    finally:
        done.set()
        holder.join()
    assert taken == [True, True]
    assert preloaded == []


def _multiplies_a_large_tensor(_chunk: int) -> bool:
    import torch

    return bool((torch.ones(1_000_000) * 2).sum() == 2_000_000)  # in torch's OpenMP threads


def test_forked_workers_compute_after_the_parent_used_torchs_threads():
    """A fork does not copy torch's OpenMP threads, but libgomp still counts on them: the first
    parallel op of a worker forked from a thread that had used them waited forever (a library
    user's training, then `convert_tensor` on a folder of bfloat16 .pt files)."""
    import torch

    before = torch.get_num_threads()
    results: list[bool] = []
    failed: list[BaseException] = []
    done = threading.Event()

    def compute_then_map() -> None:  # forked from the thread whose OpenMP threads exist
        try:
            torch.set_num_threads(2)
            (torch.ones(1_000_000) * 2).sum()
            map_chunks(_multiplies_a_large_tensor, [1, 2], workers=2, on_result=results.append)
        except BaseException as error:  # noqa: BLE001 - reported by the test
            failed.append(error)
        finally:
            done.set()

    threading.Thread(target=compute_then_map, daemon=True).start()
    try:
        finished = done.wait(30)
        if not finished:  # hung workers: killed, so that the pool breaks and the thread returns
            for process in multiprocessing.active_children():
                process.kill()
            done.wait(30)
    finally:
        torch.set_num_threads(before)
    assert finished, "the workers waited for torch's threads"
    assert not failed and results == [True, True]


def test_freshly_started_workers_end_when_the_command_is_killed():
    script = textwrap.dedent(
        f"""
        import sys, time
        sys.path[:0] = {sys.path!r}
        from torchkit.core.runtime.pool import map_chunks
        map_chunks(time.sleep, [60] * 4, workers=2, on_result=print, start_fresh=True)
        """
    )
    process = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    try:
        # The command and its two workers.
        wait_until(
            lambda: len(processes_in_group(process.pid)) >= 3,
            process=process,
            timeout=60,
            what="the workers to start",
        )
        process.send_signal(signal.SIGKILL)
        process.wait(60)
        # However long it takes on a loaded machine (PR_SET_PDEATHSIG ends them at once): only
        # a worker left for good fails.
        wait_until(lambda: not processes_in_group(process.pid), what="the workers to end")
    finally:
        for pid in processes_in_group(process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_script_without_a_main_guard_runs_once_and_its_workers_work(tmp_path):
    """Spawned workers ran the caller's `__main__` again first: a script without an `if
    __name__ == "__main__"` guard died in each (a "worker process died" error) or started
    again."""
    script = tmp_path / "unguarded.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys
            sys.path[:0] = {sys.path!r}
            from torchkit.core.runtime.pool import map_chunks
            print("started", flush=True)
            done = []
            map_chunks(abs, [-1, -2, -3], workers=2, on_result=done.append, start_fresh=True)
            print(sorted(done))
            """
        )
    )
    ran = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split("\n") == ["started", "[1, 2, 3]", ""]
