"""DistributedDataParallel under torchrun: process group, device per rank, reductions.

`torchrun --nproc_per_node=N -m torchkit train ...` sets RANK, WORLD_SIZE and LOCAL_RANK; a
plain run is a world of one and every function here is then a no-op. NCCL drives GPUs, Gloo
CPUs. Only rank 0 writes files and reports; metrics are summed over ranks.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from torchkit.core.errors import DeviceError, UsageError

log = logging.getLogger("torchkit")


@dataclass
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: Any = None
    backend: str | None = None
    initialised_here: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def launched_by_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def setup(device_spec: str) -> DistContext:
    """The device of this process and, under torchrun, the initialised process group."""
    import torch
    import torch.distributed as dist

    from torchkit.core.device import resolve_device

    if not launched_by_torchrun():
        return DistContext(device=resolve_device(device_spec))
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_spec)
    if device.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise DeviceError(
                f"rank {rank} needs cuda:{local_rank} but {torch.cuda.device_count()} GPU(s) "
                "are visible",
                "use --nproc_per_node no larger than the number of GPUs",
            )
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    elif device.type == "cpu":
        backend = "gloo"
    else:
        raise UsageError(
            f"distributed training on {device.type} is not supported", "use cuda or cpu"
        )
    initialised_here = False
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size)
        initialised_here = True
    return DistContext(rank, world_size, local_rank, device, backend, initialised_here)


def teardown(ctx: DistContext) -> None:
    import torch.distributed as dist

    if ctx.initialised_here and dist.is_initialized():
        dist.destroy_process_group()


def _reduce_device(ctx: DistContext):
    import torch

    return ctx.device if ctx.backend == "nccl" else torch.device("cpu")


def all_reduce_sum(ctx: DistContext, values: list[float]) -> list[float]:
    """Element-wise sum of `values` over all ranks (float64)."""
    if not ctx.is_distributed:
        return list(values)
    import torch
    import torch.distributed as dist

    tensor = torch.tensor(values, dtype=torch.float64, device=_reduce_device(ctx))
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor.tolist()


def any_rank(ctx: DistContext, flag: bool) -> bool:
    """True on every rank if `flag` is true on any rank (for stopping together)."""
    if not ctx.is_distributed:
        return flag
    return all_reduce_sum(ctx, [1.0 if flag else 0.0])[0] > 0


def broadcast_from_main(ctx: DistContext, value: Any) -> Any:
    """Rank 0's `value` on every rank (a picklable object)."""
    if not ctx.is_distributed:
        return value
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0, device=_reduce_device(ctx))
    return box[0]


def barrier(ctx: DistContext) -> None:
    if ctx.is_distributed:
        import torch.distributed as dist

        if ctx.backend == "nccl":
            dist.barrier(device_ids=[ctx.local_rank])
        else:
            dist.barrier()


def check_sync_bn(ctx: DistContext, sync_bn: bool) -> bool:
    """Whether to convert BatchNorm to SyncBatchNorm. SyncBatchNorm cannot train on CPU tensors
    (torch raises "expected input tensor to be on GPU"), so that is refused before training;
    a single process has nothing to synchronise with, which gets a warning."""
    if not sync_bn:
        return False
    if ctx.device is None or ctx.device.type != "cuda":
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
    from torchkit.core.syncbn import convert_batchnorm

    converted, rows = convert_batchnorm(model, to="sync")
    log.info("--sync-bn: converted %d BatchNorm layers to SyncBatchNorm", len(rows))
    return converted


def wrap_ddp(model: Any, ctx: DistContext) -> Any:
    from torch.nn.parallel import DistributedDataParallel

    if ctx.device.type == "cuda":
        return DistributedDataParallel(model, device_ids=[ctx.device.index])
    return DistributedDataParallel(model)
