"""Processes under torchrun: the process group, the device of each rank, and the collectives.

`torchrun --nproc_per_node=N -m torchkit COMMAND ...` sets RANK, WORLD_SIZE and LOCAL_RANK; a
plain run is a world of one and every function here is then a no-op. NCCL drives GPUs, Gloo
everything else. Only rank 0 writes files and reports. Every command that runs under torchrun
(train, eval, predict) starts and ends its process group here, with the same collective
timeout: a rank that stops answering ends the run with an error, not a hang. Each joins it
once its loader's workers are forked (`place`, then `JoinedAfterForks`): the group starts
Gloo's threads, and no worker may be forked beside a thread.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from torchkit.core.io.errors import DeviceError, TorchkitError, first_line, on_every_rank
from torchkit.core.runtime.launch import Placed, launch_env

# How long a collective waits for the other ranks before the run fails (train's --dist-timeout;
# the other commands always wait this long): torch's default for Gloo, and long enough for rank
# 0 to write a large checkpoint alone.
DEFAULT_TIMEOUT_S = 1800.0


@dataclass
class DistContext(Placed):
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: Any = None
    backend: str | None = None
    initialised_here: bool = False  # `setup` made the process group, so `teardown` ends it


def launched_by_torchrun() -> bool:
    return launch_env().is_distributed


def joins_process_group() -> bool:
    """Whether `setup` starts or joins a process group: under torchrun, or where the caller
    made one (which needs torch.distributed imported: without it, nothing is imported here)."""
    if launched_by_torchrun():
        return True
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


def setup(
    device_spec: str, timeout_s: float | None = None, *, timeout_option: str | None = None
) -> DistContext:
    """The device of this process and, under torchrun, the initialised process group, whose
    collectives give up after `timeout_s` seconds (default `DEFAULT_TIMEOUT_S`).

    A process group that already exists (made by the caller) is joined as it is, with its
    ranks. `timeout_option` is the command's option that sets `timeout_s`, named in the hint
    when the ranks do not all join in time."""
    return join(place(device_spec), timeout_s, timeout_option=timeout_option)


def place(device_spec: str) -> DistContext:
    """This process's rank, world and device, without the process group (`join` starts it):
    what a command needs to fork its loader's workers before the group's threads exist."""
    from torchkit.core.runtime.device import select_device

    # One device rule for every command: a CUDA device becomes the current one, and under
    # torchrun each rank takes cuda:LOCAL_RANK (an explicit cuda:N is refused).
    if not joins_process_group():
        return DistContext(device=select_device(device_spec))
    launch = launch_env()
    rank, world_size = launch.rank, launch.world_size
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_initialized():  # made by the caller
        rank, world_size = dist.get_rank(), dist.get_world_size()
    device = select_device(device_spec, local_rank=launch.local_rank, world_size=world_size)
    return DistContext(rank, world_size, launch.local_rank, device)


def join(
    ctx: DistContext, timeout_s: float | None = None, *, timeout_option: str | None = None
) -> DistContext:
    """`ctx` (from `place`) with its process group: started under torchrun (Gloo's threads
    with it), or the caller's, as it is. A world of one has none: `ctx` as it is."""
    if not joins_process_group() or ctx.backend is not None:
        return ctx
    import torch.distributed as dist

    if dist.is_initialized():
        ctx.backend = dist.get_backend()
        return ctx
    rank, world_size = ctx.rank, ctx.world_size
    backend = "nccl" if ctx.device.type == "cuda" else "gloo"
    seconds = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
    started = time.monotonic()
    try:
        dist.init_process_group(
            backend=backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=seconds)
        )
        if backend == "gloo":
            # Gloo's init returns on a rank once its own connections are made, perhaps while
            # another rank still makes its own: a rank that then failed at once (a refused
            # option) and closed them broke that init, which reported a join failure instead
            # of reaching the same error. No rank goes on before every rank has joined.
            dist.barrier()
    except RuntimeError as error:  # (DistStoreError, DistNetworkError...)
        if not _timed_out(error, time.monotonic() - started, seconds):
            raise DeviceError(
                f"rank {rank}: could not connect the {world_size} processes of the run: "
                f"another process ended while they connected ({first_line(error)})",
                "torchrun's report names the rank that failed first; its output says why",
            ) from error
        hint = "start every rank that torchrun's --nproc_per_node and --nnodes count"
        if timeout_option:
            hint += f", or raise {timeout_option}"
        raise DeviceError(
            f"rank {rank}: the {world_size} processes of the run did not all join within "
            f"{seconds:g} s: {first_line(error)}",
            hint,
        ) from error
    ctx.backend, ctx.initialised_here = backend, True
    return ctx


class JoinedAfterForks:
    """The process group joined once a command's loader workers are forked (calling it joins):
    `init_process_group` starts Gloo's threads, and a process forked beside a thread may
    deadlock in the child on a lock that thread held. So everything up to the forks runs
    before the group exists (`place` gives the rank, world and device it needs).

    Used as a context around that work: an error in it before the join joins first, then
    propagates, as it did when the work came after the join: the other ranks learn of it as of
    any rank's failure, where they would wait for this rank to join until the timeout. (A
    failure to join then is left unsaid: the error is the cause.) A block that ends well
    without calling it has joined at its end."""

    def __init__(
        self, ctx: DistContext, timeout_s: float | None = None, *, timeout_option: str | None = None
    ) -> None:
        self.ctx, self.timeout_s, self.timeout_option = ctx, timeout_s, timeout_option
        self.tried = False

    def __call__(self) -> None:
        if not self.tried:
            self.tried = True
            join(self.ctx, self.timeout_s, timeout_option=self.timeout_option)

    def __enter__(self) -> JoinedAfterForks:
        return self

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> None:
        self.ended(error)

    def ended(self, error: BaseException | None) -> None:
        """The work ended (with `error`, or None): the group joined if it is not yet."""
        if error is None:
            self()
        elif isinstance(error, Exception) and not self.tried:  # not Ctrl-C, not SIGTERM
            with contextlib.suppress(Exception):
                self()


# What Gloo and torch's store say when a peer's connection went away (the process crashed or
# was killed while the ranks connected), not that the wait ran out.
_PEER_GONE = ("closed by peer", "reset by peer", "broken pipe", "connection refused", "0 bytes")


def _timed_out(error: BaseException, elapsed: float, seconds: float) -> bool:
    """Whether joining the process group failed because its wait ran out: it came near the
    end of the wait, or the error says it timed out; a peer that closed its connection, or
    another failure long before the timeout, is a process that ended."""
    if elapsed >= 0.9 * seconds:
        return True
    text = str(error).lower()
    if any(words in text for words in _PEER_GONE):
        return False
    return "timed out" in text or "timeout" in text


# Set in the process group's store by a rank that fails with its own error (the value: its exit
# code): the ranks torchrun's agent then stops (SIGTERM) end with that code and print nothing.
_FAILED_KEY = "torchkit/failed_exit_code"
# Set by a rank that ends on its own Ctrl-C or SIGTERM (the value: the signal's number): a rank
# asked to stop as well that then loses it ends stopped, where a lost rank that set nothing (one
# killed outright: the kernel's OOM killer, a crash) is still reported as lost.
_STOPPED_KEY = "torchkit/stopped_by_signal"
_GONE = object()  # the store's server no longer answers


def record_failure(ctx: DistContext, exit_code: int) -> None:
    """Tell the other ranks, through the store, that this rank ends with its own error (its
    line names it). Nothing happens where the store does not answer."""
    _record(ctx, _FAILED_KEY, str(exit_code))


def record_stop(ctx: DistContext, signum: int) -> None:
    """Tell the other ranks, through the store, that this rank ends on its own Ctrl-C or
    SIGTERM (`signum`), not by a failure. Nothing happens where the store does not answer."""
    _record(ctx, _STOPPED_KEY, str(signum))


def _record(ctx: DistContext, key: str, value: str) -> None:
    if not ctx.is_distributed or not ctx.initialised_here:
        return
    from torch.distributed.distributed_c10d import _get_default_store

    with contextlib.suppress(Exception):
        _get_default_store().set(key, value)


def peer_failure_code(ctx: DistContext) -> int | None:
    """The exit code another rank ended with after `record_failure`; 143 (SIGTERM's) when the
    store no longer answers: it is served by rank 0's process unless torchrun's agent serves
    it, so rank 0 has ended (asked by rank 0 itself: None, its agent has ended and no rank
    said it failed). None while the store answers and no rank recorded a failure."""
    value = _recorded(ctx, _FAILED_KEY)
    if value is _GONE:
        return None if ctx.is_main else 143
    return None if value is None else int(value)


def peer_stopped(ctx: DistContext) -> bool:
    """Whether another rank ended on its own Ctrl-C or SIGTERM (`record_stop`); False where
    the store no longer answers (rank 0 served it, and nothing is known)."""
    return isinstance(_recorded(ctx, _STOPPED_KEY), str)


def _recorded(ctx: DistContext, key: str) -> str | None | object:
    """`key`'s value in the process group's store; None where no rank set it (or this process
    did not start the group), `_GONE` where the store's server no longer answers."""
    if not ctx.is_distributed or not ctx.initialised_here:
        return None
    import os
    import socket

    from torch.distributed.distributed_c10d import _get_default_store

    from torchkit.core.io.quiet import output_discarded

    # Asked first whether the store's server is there at all, and asked without output: a
    # request to a store whose server ended (or ends meanwhile) prints torch's warning with a
    # C++ stack to stderr.
    address = (os.environ.get("MASTER_ADDR", ""), int(os.environ.get("MASTER_PORT") or 0))
    try:
        socket.create_connection(address, timeout=2).close()
    except OSError:
        return _GONE
    try:
        with output_discarded():
            store = _get_default_store()
            if not store.check([key]):
                return None
            return store.get(key).decode()
    except Exception:
        return _GONE


def teardown(ctx: DistContext, *, wait: bool = False) -> None:
    """End the process group `setup` made (once; a group it joined stays). With `wait` (a run
    that ended well on every rank) the ranks first wait for each other: Gloo torn down on one
    rank while another still talks to it aborts that process ("terminate called without an
    active exception"). After a failure nobody waits: a rank that never gets here would hang
    the others. A failure to end the group is ignored: the run's own outcome is what counts."""
    if not ctx.initialised_here:
        return
    ctx.initialised_here = False
    import torch.distributed as dist

    with contextlib.suppress(Exception):
        if wait:
            barrier(ctx)
    if not wait and _destroy_hangs_after_a_failure():
        return  # the process is about to exit with its error: the OS ends the group
    with contextlib.suppress(Exception):
        if dist.is_initialized():
            dist.destroy_process_group()


def _destroy_hangs_after_a_failure() -> bool:
    """torch 2.4 (pyproject allows it): `destroy_process_group` on Gloo ranks that failed
    together without a last barrier blocks on every rank, until torchrun's SIGTERM and, 30 s
    later, its SIGKILL (seen with a refused run folder). 2.15 returns at once; the versions in
    between were not tried and are taken as fixed."""
    import torch

    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    return (major, minor) < (2, 5)


def _reduce_device(ctx: DistContext):
    import torch

    return ctx.device if ctx.backend == "nccl" else torch.device("cpu")


def all_reduce_sum(ctx: DistContext, values: list[float]) -> list[float]:
    """Element-wise sum of `values` over all ranks (float64)."""
    return _all_reduce(ctx, values, "SUM")


def all_reduce_max(ctx: DistContext, values: list[float]) -> list[float]:
    """Element-wise maximum of `values` over all ranks (float64)."""
    return _all_reduce(ctx, values, "MAX")


def _all_reduce(ctx: DistContext, values: list[float], op: str) -> list[float]:
    if not ctx.is_distributed:
        return list(values)
    import torch
    import torch.distributed as dist

    tensor = torch.tensor(values, dtype=torch.float64, device=_reduce_device(ctx))
    dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op))
    return tensor.tolist()


def any_rank(ctx: DistContext, flag: bool) -> bool:
    """True on every rank if `flag` is true on any rank (for stopping together)."""
    if not ctx.is_distributed:
        return flag
    return all_reduce_sum(ctx, [1.0 if flag else 0.0])[0] > 0


# StopVote polls the ranks about this often: a collective reads its result on the host, which
# waits for the GPU's queued work, so polling after every step would stall fast steps.
STOP_POLL_EVERY_S = 0.5
STOP_POLL_MAX_UPDATES = 1000


class StopVote:
    """Whether the run stops, agreed by every rank: a Ctrl-C or SIGTERM on any rank (a node
    without rank 0 included) stops all of them at the same optimiser update.

    Called after every update with `wanted`: 0 (go on) or the signal number that asks this rank
    to stop (1 when unknown). Under torchrun the ranks vote only every `interval` updates: one
    all-reduce (MAX) carries each rank's request and each rank's estimate of how many updates
    take `STOP_POLL_EVERY_S`, and the smallest estimate is the next interval, so every rank
    counts the same interval and votes at the same update. `force=True` votes now (between
    epochs). `signal` is the agreed request: SIGTERM (15) outranks Ctrl-C (2)."""

    def __init__(self, ctx: DistContext, every_s: float | None = None) -> None:
        self.ctx = ctx
        self.every_s = STOP_POLL_EVERY_S if every_s is None else every_s
        self.interval = 1
        self.countdown = 1
        self.updates = 0
        self.since = time.perf_counter()
        self.signal = 0
        self.votes = 0  # collectives run (for tests and the curious)

    def __call__(self, wanted: int, *, force: bool = False) -> bool:
        if not self.ctx.is_distributed:
            self.signal = max(self.signal, int(wanted))
            return self.signal > 0
        if not force:
            self.updates += 1
            self.countdown -= 1
            if self.countdown > 0:
                return False
        now = time.perf_counter()
        if self.updates and not force:  # (a vote between epochs would count validation)
            per_update = max((now - self.since) / self.updates, 1e-6)
            estimate = int(min(STOP_POLL_MAX_UPDATES, max(1.0, self.every_s / per_update)))
        else:
            estimate = self.interval
        agreed, minus_interval = all_reduce_max(self.ctx, [float(wanted), -float(estimate)])
        self.votes += 1
        self.interval = self.countdown = max(1, int(-minus_interval))
        self.updates, self.since = 0, time.perf_counter()
        self.signal = max(self.signal, int(agreed))
        return self.signal > 0


def broadcast_from_main(ctx: DistContext, value: Any) -> Any:
    """Rank 0's `value` on every rank (a picklable object)."""
    if not ctx.is_distributed:
        return value
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0, device=_reduce_device(ctx))
    return box[0]


def gather_to_main(ctx: DistContext, value: Any) -> list[Any] | None:
    """Every rank's `value` (picklable), in rank order, on rank 0; None on the others."""
    if not ctx.is_distributed:
        return [value]
    import torch.distributed as dist

    gathered = [None] * ctx.world_size if ctx.is_main else None
    dist.gather_object(value, gathered, dst=0)
    return gathered


def all_gather(ctx: DistContext, value: Any) -> list[Any]:
    """Every rank's `value` (picklable), in rank order, on every rank."""
    if not ctx.is_distributed:
        return [value]
    import torch.distributed as dist

    gathered: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(gathered, value)
    return gathered


def on_main(ctx: DistContext, work: Callable[[], Any]) -> Any:
    """`work()` on rank 0 only, its (picklable) result on every rank; when it fails, the same
    error on every rank instead of the others waiting for rank 0 forever."""
    result: Any = None
    outcome: tuple = ("ok",)
    failure: BaseException | None = None
    if ctx.is_main:
        try:
            result = work()
        except TorchkitError as error:
            failure, outcome = error, ("error", type(error), error.message, error.hint)
        except Exception as error:
            failure = error
            outcome = ("error", TorchkitError, f"rank 0: {first_line(error)}", None)
    outcome, result = broadcast_from_main(ctx, (outcome, result))
    if failure is not None:
        raise failure
    if outcome[0] == "error":
        _, kind, message, hint = outcome
        raise on_every_rank(kind(message, hint))
    return result


def broadcast_tensors(ctx: DistContext, tensors: list[Any]) -> None:
    """Overwrite `tensors` (on this rank's device) with rank 0's, in place: one broadcast per
    dtype, of all tensors of that dtype flattened together."""
    if not ctx.is_distributed or not tensors:
        return
    import torch
    import torch.distributed as dist

    groups: dict[Any, list] = {}
    for tensor in tensors:
        groups.setdefault(tensor.dtype, []).append(tensor)
    device = _reduce_device(ctx)
    for group in groups.values():
        flat = torch.cat([t.detach().reshape(-1).to(device) for t in group])
        dist.broadcast(flat, src=0)
        offset = 0
        with torch.no_grad():
            for tensor in group:
                count = tensor.numel()
                tensor.copy_(flat[offset : offset + count].view_as(tensor))
                offset += count


def broadcast_buffers(ctx: DistContext, module: Any) -> None:
    """Rank 0's buffers (BatchNorm running statistics) on every rank.

    DDP broadcasts rank 0's buffers at the start of every training forward, then each rank
    updates them with its own batch, so after an epoch they differ by the last step. Rank 0's
    are the ones DDP carries into the next step and the ones rank 0 saves in best.pt; giving
    every rank those before validation makes the validation metrics those of the saved model
    (`eval best.pt` reproduces them), and changes nothing about training. (timm's
    `distribute_bn` can average instead, which would make the saved statistics differ from
    what DDP trains on.)"""
    broadcast_tensors(ctx, list(module.buffers()))


def broadcast_module(ctx: DistContext, module: Any) -> None:
    """Rank 0's parameters and buffers on every rank."""
    broadcast_tensors(ctx, [*module.parameters(), *module.buffers()])


def barrier(ctx: DistContext) -> None:
    if ctx.is_distributed:
        import torch.distributed as dist

        if ctx.backend == "nccl":
            dist.barrier(device_ids=[ctx.local_rank])
        else:
            dist.barrier()
