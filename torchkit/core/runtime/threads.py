"""How many CPU threads torch computes with in a command that runs a model: the one policy
train, eval, predict, extract-features, benchmark and summary share.

torch starts one intra-op thread per core. A command whose DataLoader has worker processes then
has more busy threads than cores (each worker decodes on a core of its own), and torch's threads
meet at a barrier after every operation: the one the scheduler left waiting holds all the others
(on 2 cores with one worker, eval of a resnet18 ran at a third of its one-thread speed). So a
command computes on the cores its workers leave free, and at least one.

Until its loader's workers are forked, a command that has any computes on one thread
(`until_workers_forked`): torch's first operation on more threads starts OpenMP's pool (loading
a model's weights is one), whose threads stay for the life of the process, and a process forked
beside a thread may deadlock in the child on a lock that thread held (Python 3.12+ warns at each
such fork: "This process is multi-threaded, use of fork() may lead to deadlocks").
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

from torchkit.core.runtime.cpus import usable_cpus

# The environment variable with which a user sets torch's thread count for every command.
THREADS_VARIABLE = "OMP_NUM_THREADS"


def compute_threads(
    workers: int = 0, requested: int | None = None, *, tiny_inputs: bool = False
) -> int | None:
    """The intra-op threads a command sets, or None to leave torch's count as it is.

    `requested` (train's --threads): N is N, 0 is torch's own count (None). Otherwise
    OMP_NUM_THREADS, where set, is the user's choice (None: torch read it at its start); else 1
    for `tiny_inputs` (the digits: each operation takes microseconds, and a second thread only
    adds a barrier after it), else the usable cores less the loader `workers`, at least 1.
    """
    if requested is not None:
        return requested or None
    if os.environ.get(THREADS_VARIABLE, "").strip():
        return None
    if tiny_inputs:
        return 1
    return max(1, usable_cpus() - max(0, workers))


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """torch computes on `threads` threads inside the block (None: as it is), and on its
    earlier count again afterwards (a command run from Python leaves the process as it was)."""
    import torch

    before = torch.get_num_threads()
    if threads is not None and threads != before:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def until_workers_forked() -> AbstractContextManager[None]:
    """One torch thread inside the block: what a command does before its DataLoader forks its
    workers (resolving the model, reading the data) starts no OpenMP thread beside the fork. The
    block ends once the loader's iterator is made (its workers are forked then)."""
    return torch_threads(1)
