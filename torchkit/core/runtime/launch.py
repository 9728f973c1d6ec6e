"""torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) of this process,
read and checked in one place for every command; standard library only, below the device and
the process group modules that use them."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from torchkit.core.io.errors import UsageError
from torchkit.core.runtime.signals import stopped_within


class Placed:
    """A process's place in its world: rank 0 writes and reports; a world of one is a plain
    run."""

    rank: int
    world_size: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


@dataclass(frozen=True)
class LaunchEnv(Placed):
    """Where torchrun put this process: its variables RANK, WORLD_SIZE, LOCAL_RANK and
    LOCAL_WORLD_SIZE, as numbers (a plain run: rank 0 of a world of one)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1


_LAUNCH_VARIABLES = {  # name: (smallest value, what torchrun sets it to)
    "RANK": (0, "the process's rank"),
    "WORLD_SIZE": (1, "the number of processes"),
    "LOCAL_RANK": (0, "the process's rank on its node"),
    "LOCAL_WORLD_SIZE": (1, "the number of processes on the node"),
}


def _launch_variable(name: str) -> int | None:
    """The whole number in $NAME (None when unset or empty); anything else is refused."""
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    smallest, meaning = _LAUNCH_VARIABLES[name]
    if not text.isdecimal() or not text.isascii() or int(text) < smallest:
        raise UsageError(
            f"{name} is set to {os.environ[name]!r}",
            f"torchrun sets it to {meaning}; unset it to run one process",
        )
    return int(text)


def launch_env() -> LaunchEnv:
    """torchrun's variables of this process, read and checked in one place for every command.

    A value that is not a whole number (at least 0 for the ranks, 1 for the sizes), a WORLD_SIZE
    above 1 without RANK, and a RANK outside the world are a UsageError naming the variable.
    Unset or empty variables take a plain run's values; surrounding blanks and leading zeros
    are read as int() reads them (as torch does), so every reader agrees on who is rank 0."""
    rank, world_size = _launch_variable("RANK"), _launch_variable("WORLD_SIZE")
    local_rank, local_world_size = (
        _launch_variable("LOCAL_RANK"),
        _launch_variable("LOCAL_WORLD_SIZE"),
    )
    if rank is None and world_size is not None and world_size > 1:
        raise UsageError(
            f"WORLD_SIZE is set to {os.environ['WORLD_SIZE']!r} but RANK is not set",
            "torchrun sets both; unset WORLD_SIZE to run one process",
        )
    if rank is not None and rank >= (world_size or 1):
        world = "not set" if world_size is None else f"{world_size}"
        raise UsageError(
            f"RANK is set to {os.environ['RANK']!r} but WORLD_SIZE is {world}",
            "torchrun sets RANK from 0 to WORLD_SIZE - 1; unset RANK to run one process",
        )
    return LaunchEnv(
        rank=0 if rank is None else rank,
        world_size=1 if world_size is None else world_size,
        local_rank=0 if local_rank is None else local_rank,
        local_world_size=1 if local_world_size is None else local_world_size,
    )


def is_main_process() -> bool:
    """Whether this process is rank 0 as torchrun's RANK says (True in a plain run): the one
    that writes files and reports."""
    return launch_env().is_main


# Set by torchrun's agent in every rank it starts. The agent stops a node's other ranks
# (SIGTERM) as soon as one of them fails.
_AGENT_VARIABLE = "TORCHELASTIC_RUN_ID"
# How long a rank waits for that before it reports the error itself: well beyond the ranks'
# start-up skew (importing torch on a busy node), short beside the rendezvous' wait.
LOCAL_RANK_0_WAIT_S = 10.0


def under_torchrun_agent() -> bool:
    """Whether torchrun's agent started this process (and stops it, SIGTERM, when another rank
    of its group fails)."""
    return bool(os.environ.get(_AGENT_VARIABLE))


def _ranks_connected() -> bool:
    dist = sys.modules.get("torch.distributed")  # never imported here: only asked
    return dist is not None and dist.is_available() and dist.is_initialized()


def leave_to_local_rank_0() -> bool:
    """Whether this rank ends without reporting an error every rank of its node raises alike
    before the ranks connect (`from_shared_inputs`: its options and files), leaving the one line
    to local rank 0, which reports it without waiting.

    Only under torchrun's agent, for a rank other than local rank 0: it waits up to
    `LOCAL_RANK_0_WAIT_S` for the agent to stop it, which the agent does once another rank has
    ended with its error. A rank that is not stopped reports the error itself: local rank 0 did
    not fail (the error was this rank's own), or not yet. Nothing is ever left unreported by
    every rank; at worst (a rank failing with another error meanwhile) that rank's is shown."""
    if not under_torchrun_agent() or _ranks_connected():
        return False
    try:
        place = launch_env()
    except UsageError:
        return False
    if place.local_rank == 0 or place.local_world_size < 2:
        return False
    return stopped_within(LOCAL_RANK_0_WAIT_S)
