"""Tiny networks for the `torchkit train` tests, named on the command line as `nets:TinyNet`
(tests/helpers/ is on sys.path under pytest, and on the PYTHONPATH of the processes tests start:
suite_paths.HELPERS).

Some carry fault injection driven by environment variables, so a real `torchkit train` process
can be killed or interrupted at an exact training step without any hook in torchkit itself:
TORCHKIT_TEST_KILL_AT=N sends SIGKILL, TORCHKIT_TEST_SIGINT_AT=N sends SIGINT (Ctrl-C) to the
process on the N-th training forward pass (1-based). GatedNet stops at a gate instead, for a test
to signal the process from outside at an exact step (see `GatedNet`)."""

from __future__ import annotations

import math
import os
import signal
import threading
import time

import torch
from torch import nn

# BNNet's ranks vote on stopping after every update (as they do when updates are slow), so that
# a stop lands inside an epoch at an exact update (train/test_train_ddp_faults.py).
if os.environ.get("TORCHKIT_TEST_VOTE_EVERY_UPDATE"):
    from torchkit.core.runtime import distributed as dist_utils

    dist_utils.STOP_POLL_EVERY_S = 0.0


class TinyNet(nn.Module):
    """conv -> relu -> pool -> linear: no dropout and no BatchNorm, so a run is a pure function
    of the data order (what the reference-loop and DDP comparisons need)."""

    def __init__(self, num_classes: int = 3) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(torch.relu(self.conv(x))).flatten(1))


class DeepNet(nn.Module):
    """conv -> BatchNorm -> relu, then four 2x2 max-pools: images under 16x16 shrink to nothing
    on the way (torch's "Output size is too small"), so the smallest side it takes is 16."""

    def __init__(self, num_classes: int = 3) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.pools = nn.Sequential(*(nn.MaxPool2d(2) for _ in range(4)))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pools(torch.relu(self.bn(self.conv(x)))))


class NoisyNet(nn.Module):
    """BatchNorm (buffers) and dropout (random numbers): what exact resume must restore. Its
    training forward passes are counted for fault injection (see the module docstring)."""

    forwards = 0

    def __init__(self, num_classes: int = 3) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(2)
        )
        self.dropout = nn.Dropout(0.3)
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            NoisyNet.forwards += 1
            _inject_fault(NoisyNet.forwards)
        return self.fc(self.dropout(self.features(x).flatten(1)))


def _inject_fault(count: int) -> None:
    if os.environ.get("TORCHKIT_TEST_KILL_AT") == str(count):
        # The kill lands in a training step, not in the previous epoch's write (which runs on
        # a thread beside it): a test knows which checkpoint survives.
        for thread in threading.enumerate():
            if thread.name == "torchkit-checkpoint-writer":
                thread.join()
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get("TORCHKIT_TEST_SIGINT_AT") == str(count):
        os.kill(os.getpid(), signal.SIGINT)


class GatedNet(TinyNet):
    """With TORCHKIT_TEST_GATE_FILE=PATH and TORCHKIT_TEST_GATE_AT=N, its N-th training forward
    pass (1-based) creates PATH and waits until the test removes it: the test waits for the
    file, signals the process (or reads its state), then opens the gate."""

    forwards = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            GatedNet.forwards += 1
            _wait_at_gate(GatedNet.forwards)
        return super().forward(x)


class GatedBuildNet(TinyNet):
    """TinyNet whose construction waits at the gate (TORCHKIT_TEST_GATE_FILE, with
    TORCHKIT_TEST_GATE_AT=build): a test signals the process while the model is being built,
    after the loaders' workers started reading epoch 1."""

    def __init__(self, num_classes: int = 3) -> None:
        _wait_at_gate("build")
        super().__init__(num_classes)


def _wait_at_gate(count: int | str) -> None:
    gate = os.environ.get("TORCHKIT_TEST_GATE_FILE")
    if not gate or os.environ.get("TORCHKIT_TEST_GATE_AT") != str(count):
        return
    open(gate, "w").close()
    deadline = time.monotonic() + 120
    while os.path.exists(gate):
        if time.monotonic() > deadline:
            raise RuntimeError("the test never opened the gate")
        time.sleep(0.01)


class AutocastProbe(TinyNet):
    """Records the dtype its linear layer computes in during training (bf16 under --amp)."""

    seen: list = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        if self.training:
            AutocastProbe.seen.append(out.dtype)
        return out


class GradProbeNet(DeepNet):
    """Records, at each training forward, whether its backbone's conv has gradients computed
    (`requires_grad`) and holds any (`grad`)."""

    seen: list = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            weight = self.conv.weight
            GradProbeNet.seen.append((weight.requires_grad, weight.grad is not None))
        return super().forward(x)


class OutOfMemoryNet(TinyNet):
    """Raises CUDA's out-of-memory error on the second epoch's first training step."""

    forwards = 0
    after = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            OutOfMemoryNet.forwards += 1
            if OutOfMemoryNet.forwards > OutOfMemoryNet.after:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return super().forward(x)


class _InfiniteGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad * math.inf


class NanNet(nn.Module):
    """TinyNet's layers; the N-th training forward pass returns NaN (see the module doc)."""

    forwards = 0

    def __init__(self, num_classes: int = 3) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc(self.pool(torch.relu(self.conv(x))).flatten(1))
        if self.training:
            NanNet.forwards += 1
            rank = os.environ.get("TORCHKIT_TEST_NAN_RANK")
            if rank in (None, os.environ.get("RANK", "0")) and os.environ.get(
                "TORCHKIT_TEST_NAN_AT"
            ) == str(NanNet.forwards):
                out = out * float("nan")
            if os.environ.get("TORCHKIT_TEST_INF_GRAD_AT") == str(NanNet.forwards):
                out = _InfiniteGradient.apply(out)
        return out


class BNNet(nn.Module):
    """conv -> BatchNorm -> relu -> pool -> dropout -> linear: each rank's BatchNorm statistics
    move with its own batches, and dropout draws each rank's random numbers."""

    forwards = 0

    def __init__(self, num_classes: int = 2) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(), nn.AdaptiveAvgPool2d(2)
        )
        self.dropout = nn.Dropout(0.3)
        self.fc = nn.Linear(24, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            BNNet.forwards += 1
            _inject_rank_fault(BNNet.forwards)
        return self.fc(self.dropout(self.features(x).flatten(1)))


def _inject_rank_fault(count: int) -> None:
    """TORCHKIT_TEST_SIGNAL=RANK:N:SIGNAL and TORCHKIT_TEST_HANG=RANK:N:SECONDS (see
    train/test_train_ddp_faults.py)."""
    rank = os.environ.get("RANK", "0")
    wanted = os.environ.get("TORCHKIT_TEST_SIGNAL", "")
    if wanted:
        at_rank, at, name = wanted.split(":")
        if (at_rank, at) == (rank, str(count)):
            os.kill(os.getpid(), getattr(signal, f"SIG{name}"))
    hang = os.environ.get("TORCHKIT_TEST_HANG", "")
    if hang:
        at_rank, at, seconds = hang.split(":")
        if (at_rank, at) == (rank, str(count)):
            deadline = time.monotonic() + float(seconds)
            while time.monotonic() < deadline:  # a rank that stops answering for a while
                time.sleep(0.05)


# `nets:SeenNet` is built in each torchrun rank (data/test_shards_read.py): it records
# the identity of every training image it sees (each image is one flat grey level) in
# $TORCHKIT_TEST_SEEN_DIR/rank-RANK.txt (TORCHKIT_TEST_*: the rank is still forked from its
# preloaded server).
class SeenNet(nn.Module):
    def __init__(self, num_classes: int = 2) -> None:
        super().__init__()
        self.fc = nn.Linear(3, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            folder = os.environ["TORCHKIT_TEST_SEEN_DIR"]
            with open(os.path.join(folder, f"rank-{os.environ['RANK']}.txt"), "a") as out:
                out.writelines(f"{value:.4f}\n" for value in x[:, 0, 0, 0].tolist())
        return self.fc(x.mean(dim=(2, 3)))


# Models whose outputs are not a classifier's (N, C) logits (eval/test_eval_guards.py): TinyNet's
# logits as a segmentation-like map, a tuple, a dict, or one number per image.
class MapNet(TinyNet):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)[:, :, None, None]


class PairNet(TinyNet):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = super().forward(x)
        return logits, logits


class DictNet(TinyNet):
    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"out": super().forward(x)}


class ScoreNet(TinyNet):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)[:, 0]


class MaskedNet(TinyNet):
    """TinyNet whose last class is masked: its logit is -inf for every image (a model that rules
    classes out), so an image of that class has an infinite loss (eval/test_eval_masked_logits)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = super().forward(x)
        return torch.cat([logits[:, :-1], torch.full_like(logits[:, -1:], -math.inf)], dim=1)


class EvalMaskedNet(MaskedNet):
    """MaskedNet that masks its last class only in eval mode: it trains as TinyNet, and the
    validation images of that class have an infinite loss (train/test_train_masked_logits)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) if not self.training else TinyNet.forward(self, x)


def tiny_vit(num_classes: int = 3, image_size: int = 32) -> nn.Module:
    """torchvision's VisionTransformer at its smallest (one layer, width 16, 8 px patches), for
    the fine-tuning tests (`--model nets:tiny_vit`): built for `image_size`, which torchkit
    passes (its position embeddings follow the size)."""
    from torchvision.models.vision_transformer import VisionTransformer

    return VisionTransformer(
        image_size=image_size,
        patch_size=8,
        num_layers=1,
        num_heads=2,
        hidden_dim=16,
        mlp_dim=32,
        num_classes=num_classes,
    )


class LazyNet(nn.Module):
    """TinyNet with lazy layers (LazyConv2d, LazyBatchNorm2d, LazyLinear): no weight has a shape
    until the first forward pass. The 2x2 max-pool refuses 1x1 images ("Output size is too
    small"). Its 171 parameters: conv 3*4*3*3 + 4, BatchNorm 4 + 4, linear 16*3 + 3."""

    def __init__(self, num_classes: int = 3) -> None:
        super().__init__()
        self.conv = nn.LazyConv2d(4, 3, padding=1)
        self.bn = nn.LazyBatchNorm2d()
        self.pool = nn.Sequential(nn.MaxPool2d(2), nn.AdaptiveAvgPool2d(2))
        self.fc = nn.LazyLinear(num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(torch.relu(self.bn(self.conv(x)))).flatten(1))


class TrainOnlyLazyNet(LazyNet):
    """LazyNet with an auxiliary lazy head (LazyLinear -> LazyBatchNorm1d -> dropout ->
    LazyLinear) that only its training forward runs, added into the logits as deep supervision
    would be: a forward in eval mode never reaches it, so it stays unsized. Its 324 parameters:
    LazyNet's 154 (2 classes), then linear 16*8 + 8, BatchNorm 8 + 8, linear 8*2 + 2."""

    def __init__(self, num_classes: int = 3) -> None:
        super().__init__(num_classes)
        self.aux = nn.Sequential(
            nn.LazyLinear(8), nn.LazyBatchNorm1d(), nn.Dropout(0.5), nn.LazyLinear(num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.pool(torch.relu(self.bn(self.conv(x)))).flatten(1)
        logits = self.fc(features)
        if self.training:
            logits = logits + self.aux(features)
        return logits


class RecordedLazyNet(TrainOnlyLazyNet):
    """TrainOnlyLazyNet that, with TORCHKIT_TEST_WEIGHTS_DIR=DIR, saves its weights as its rank
    holds them to DIR/rank-RANK.pt at each forward in eval mode once they are sized (validation,
    after each epoch's updates): the last file is what the rank trained to, which only rank 0
    writes otherwise (train/test_train_ddp_lazy.py)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        folder = os.environ.get("TORCHKIT_TEST_WEIGHTS_DIR")
        if folder and not self.training:
            state = self.state_dict()
            if not any(torch.nn.parameter.is_lazy(value) for value in state.values()):
                rank = os.environ.get("RANK", "0")
                torch.save(
                    {key: value.detach().clone() for key, value in state.items()},
                    os.path.join(folder, f"rank-{rank}.pt"),
                )
        return super().forward(x)


def tiny_maxvit(num_classes: int = 3, image_size: int = 16) -> nn.Module:
    """torchvision's MaxVit at its smallest (one block of one layer, 8 channels, 2 px
    partitions), built for `image_size` (a multiple of 8), which torchkit passes: its partition
    grids follow the size, its weights do not (`--model nets:tiny_maxvit`)."""
    from torchvision.models.maxvit import MaxVit

    return MaxVit(
        input_size=(image_size, image_size),
        stem_channels=8,
        partition_size=2,
        block_channels=[8],
        block_layers=[1],
        head_dim=4,
        stochastic_depth_prob=0.0,
        num_classes=num_classes,
    )
