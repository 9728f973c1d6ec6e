"""Training under torchrun: what DistributedDataParallel needs beyond the shared process setup
(`torchkit.core.runtime.distributed`): the devices DDP trains on, SyncBatchNorm, the DDP wrapper,
and the one error line of a collective that gave up (--dist-timeout).
"""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torchkit import deferred_signals
from torchkit.core.io.errors import (
    DeviceError,
    Terminated,
    TorchkitError,
    UsageError,
    first_and_more,
    on_every_rank,
)
from torchkit.core.io.shell_words import shell_word
from torchkit.core.runtime import distributed
from torchkit.core.runtime.distributed import DEFAULT_TIMEOUT_S, DistContext
from torchkit.core.runtime.launch import under_torchrun_agent

log = logging.getLogger("torchkit")


def check_ddp_device(ctx: DistContext) -> None:
    """DDP trains with NCCL on CUDA GPUs and with Gloo on CPUs, on nothing else."""
    if ctx.is_distributed and ctx.device.type not in ("cuda", "cpu"):
        raise UsageError(
            f"distributed training on {ctx.device.type} is not supported", "use cuda or cpu"
        )


def check_sync_bn(ctx: DistContext, sync_bn: bool, resumed_from: Path | None = None) -> bool:
    """Whether to convert BatchNorm to SyncBatchNorm. SyncBatchNorm cannot train on CPU tensors
    (torch raises "expected input tensor to be on GPU"), so that is refused before training;
    a single process has nothing to synchronise with, which gets a warning.

    A resumed run (`resumed_from`, its checkpoint) cannot drop --sync-bn: it may resume on a
    GPU, or continue on this device from a copy of the checkpoint reverted to BatchNorm (the
    same weights: the state_dict keys are the same, only the recorded option changes)."""
    if not sync_bn:
        return False
    if ctx.device is None or ctx.device.type != "cuda":
        if resumed_from is not None:
            raise UsageError(
                f"{resumed_from} was trained with --sync-bn, which needs CUDA GPUs: "
                "SyncBatchNorm cannot train on CPU tensors",
                "resume it on a GPU, or on several under torchrun; or continue on this device "
                "from a copy without it: torchkit convert-syncbn --revert "
                f"{shell_word(resumed_from)} NEW/last.pt, then torchkit train --resume NEW/last.pt",
            )
        raise UsageError(
            "--sync-bn needs CUDA GPUs: SyncBatchNorm cannot train on CPU tensors",
            "drop --sync-bn, or train on GPUs with torchrun --nproc_per_node=N",
        )
    if not ctx.is_distributed:
        log.warning("--sync-bn has no effect in a single process; BatchNorm is kept as it is")
        return False
    return True


def convert_sync_bn(model: Any) -> Any:
    """BatchNorm -> SyncBatchNorm with the shared conversion of `torchkit convert-syncbn`."""
    from torchkit.core.convert.syncbn import convert_batchnorm

    converted, rows = convert_batchnorm(model, to="sync")
    log.info("--sync-bn: converted %d BatchNorm layers to SyncBatchNorm", len(rows))
    return converted


def wrap_ddp(model: Any, ctx: DistContext, *, compiled: bool = False) -> Any:
    """`model` in DistributedDataParallel. Unless it will be `compiled`, without importing
    torch._dynamo (inductor, sympy: seconds of every rank's start): DDP's constructor asks
    dynamo's config which reducer to use, and its forward's `_inside_ddp_forward`, wrapped in
    `torch._disable_dynamo`, imports dynamo on its first call. Both run once under the stand-ins
    of `without_dynamo`, whose answers are those of a dynamo never configured (the C++ reducer)
    and a deferred `disable` (the context itself while nothing compiles), which the wrapper
    caches for every later call."""
    from torch.nn.parallel import DistributedDataParallel

    from torchkit.torchvision_without_dynamo import without_dynamo

    devices = {"device_ids": [ctx.device.index]} if ctx.device.type == "cuda" else {}
    if compiled:
        return DistributedDataParallel(model, **devices)
    with without_dynamo():
        wrapped = DistributedDataParallel(model, **devices)
        inside_forward = getattr(wrapped, "_inside_ddp_forward", None)
        if inside_forward is not None:  # (a torch without it has nothing to cache)
            with inside_forward():
                pass
    return wrapped


def refuse_untrained_parameters(ctx: DistContext, module: Any) -> None:
    """DDP (without find_unused_parameters, which would cost every step a search of the graph)
    waits for a gradient of every trainable parameter: one that takes no part in the output
    gets none, and the next step failed with torch's "Expected to have finished reduction in
    the prior iteration", printed by every rank, whose advice names DDP's own arguments.
    Checked after the run's first backward, on every rank together (one all-reduce)."""
    names = [name for name, p in module.named_parameters() if p.requires_grad and p.grad is None]
    if not distributed.any_rank(ctx, bool(names)):
        return
    shown = first_and_more(names, 5)
    what = f"the model's parameters {shown}" if names else "some of the model's parameters"
    raise on_every_rank(
        UsageError(
            f"{what} take no part in its output, so they get no gradient, and distributed "
            "training (DDP) needs one for every trainable parameter",
            "remove them from the model, or freeze them with requires_grad=False; or train in "
            "one process",
        )
    )


@contextlib.contextmanager
def one_line_per_failure(ctx: DistContext) -> Iterator[None]:
    """A rank that fails with its own error records it in the process group's store
    (`distributed.record_failure`) before it ends. Under torchrun's agent, a rank stopped by
    that failure (the agent's SIGTERM to the group, or a collective that lost the failed rank),
    rank 0 included, then ends with the failed rank's exit code and prints nothing: the failed
    rank's line and torchrun's report say what happened, once. A SIGTERM while no rank has
    failed (a user's `kill`, a scheduler) still ends the rank with `Terminated.`, as in every
    command. A rank that ends at once on its own Ctrl-C or SIGTERM records that too
    (`distributed.record_stop`, read by `stop_that_lost_a_peer`)."""
    try:
        yield
    except BaseException as error:
        if isinstance(error, KeyboardInterrupt) and not isinstance(error, Terminated):
            _record_stop(ctx, signal.SIGINT)
            raise
        if isinstance(error, Terminated) or _lost_a_peer(error):
            code = distributed.peer_failure_code(ctx) if under_torchrun_agent() else None
            if code is not None:
                # The agent's SIGTERM may come while this rank ends: it ends as it is.
                deferred_signals.ignore_later((signal.SIGTERM, signal.SIGINT))
                stopped = DeviceError(f"rank {ctx.rank}: stopped after another rank failed")
                stopped.exit_code = code
                stopped.reported_by_another_rank = True
                raise stopped from None
            if isinstance(error, Terminated):
                _record_stop(ctx, signal.SIGTERM)
        else:
            code = error.exit_code if isinstance(error, TorchkitError) else 1
            distributed.record_failure(ctx, code)
        raise


def _lost_a_peer(error: BaseException) -> bool:
    """Whether `error` is a collective's that lost its connection to another rank."""
    text = str(error).lower() if isinstance(error, RuntimeError) else ""
    return any(words in text for words in ("closed by peer", "reset by peer", "broken pipe"))


def _record_stop(ctx: DistContext, signum: int) -> None:
    # Only the agent's store outlives the rank that serves it (rank 0's goes with rank 0).
    if under_torchrun_agent():
        distributed.record_stop(ctx, signum)


def stop_that_lost_a_peer(
    ctx: DistContext, error: BaseException, signum: int
) -> KeyboardInterrupt | None:
    """How this rank ends where it was itself asked to stop (`signum`: its Ctrl-C or SIGTERM,
    0 for none) and a collective then lost a peer that ended on its own stop: a signal to
    torchrun (Ctrl-C in its terminal, `kill`, a scheduler) reaches every rank, and one that
    comes after training (in the test evaluation) ends rank 0 at once while this rank waits
    for it in a collective. Rank 0 ended on the same stop, not by a failure: this rank ends
    stopped too (`Terminated.`, as any rank sent SIGTERM), not with "another process of the
    run ended". None where this rank was not asked to stop, lost no peer, or lost one that
    recorded no stop (`distributed.record_stop`): a rank killed outright (the kernel's OOM
    killer, a crash) is followed by the agent's SIGTERM to the others, which is no reason to
    hide it."""
    if not signum or not _lost_a_peer(error) or not distributed.peer_stopped(ctx):
        return None
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def describe_collective_failure(
    ctx: DistContext, error: BaseException, timeout_s: float | None
) -> TorchkitError | None:
    """The error to report when a collective gave up under torchrun: it timed out
    (--dist-timeout) or lost a peer (another rank died); None for any other error."""
    if not ctx.is_distributed or not isinstance(error, RuntimeError):
        return None
    text = str(error).lower()
    if "timed out" in text or "timeout" in text:
        seconds = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
        return DeviceError(
            f"rank {ctx.rank}: another process of the run did not answer within {seconds:g} s",
            "look at the other ranks' output; raise --dist-timeout if one of them "
            "legitimately works alone that long",
        )
    if _lost_a_peer(error):
        return DeviceError(
            f"rank {ctx.rank}: another process of the run ended",
            "its own output says why; torchrun's report names one that was killed outright",
        )
    return None
