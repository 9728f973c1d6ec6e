"""`torchkit train`'s recipe options against torchvision's references/classification/train.py,
step by step. A plain PyTorch loop written as the reference's (its weight-decay split with
`--norm-weight-decay 0 --bias-weight-decay 0`, torch's own LR schedulers, cross-entropy with
label smoothing on mixup/cutmix's soft targets, `clip_grad_norm_` over the model's parameters,
torch's `AveragedModel` for the EMA) trains on the batches torchkit fed its model, and the
learning rates, the weights before every step, the EMA weights and metrics.csv's lr and
train_loss must agree with torchkit's. Where torchkit differs by design (train.md, "Against
torchvision's reference recipe"), the loop takes torchkit's side: warm-up and schedules step per
update, the EMA updates after every step with its warmed-up decay, mixup and cutmix pair the
batch with itself reversed. (The data recipe, transforms and policies, is checked against the
reference's presets in test_train_augment.py.)"""

from __future__ import annotations

import copy
import csv
import json
import math
from dataclasses import dataclass, field

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchkit.core.train.loop as train_loop
import torchkit.core.train.mixing as mixing
from torchkit.cli import app

EPOCHS, BATCH = 2, 64
# The reference's `norm_classes` of `set_weight_decay`.
NORM_CLASSES = (
    nn.modules.batchnorm._BatchNorm,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.modules.instancenorm._InstanceNorm,
    nn.LocalResponseNorm,
)


@dataclass
class Recorded:
    """What torchkit's training steps saw: the model before the first step, and per batch
    the images and labels, the mixed batch, the lr of every group, the weights before the
    step and the random state the forward (dropout) drew from."""

    initial: nn.Module | None = None
    decayed: set[str] = field(default_factory=set)  # parameters torchkit decays
    batches: list = field(default_factory=list)
    lrs: list[list[float]] = field(default_factory=list)
    weights_before: list[dict] = field(default_factory=list)
    mixed: list = field(default_factory=list)
    rng: list = field(default_factory=list)


@pytest.fixture
def recorded(monkeypatch) -> Recorded:
    record = Recorded()
    to_device, mix_batch = train_loop.to_device, mixing.mix_batch

    def recording_to_device(batch, ctx):
        images, labels = to_device(batch, ctx)
        if ctx.module.training:  # not validation's batches
            if record.initial is None:
                record.initial = copy.deepcopy(ctx.module)
                ids = {
                    id(p)
                    for g in ctx.optimizer.param_groups
                    if g["weight_decay"]
                    for p in g["params"]
                }
                record.decayed = {n for n, p in ctx.module.named_parameters() if id(p) in ids}
            record.batches.append((images.clone(), labels.clone()))
            record.lrs.append([g["lr"] for g in ctx.optimizer.param_groups])
            record.weights_before.append({k: v.clone() for k, v in ctx.module.state_dict().items()})
        return images, labels

    def recording_mix_batch(*args, **kwargs):
        mixed = mix_batch(*args, **kwargs)
        record.mixed.append(
            None if mixed is None else (mixed.images.clone(), mixed.lam, mixed.kind)
        )
        record.rng.append(torch.get_rng_state())  # what the forward's dropout draws from
        return mixed

    monkeypatch.setattr(train_loop, "to_device", recording_to_device)
    monkeypatch.setattr(mixing, "mix_batch", recording_mix_batch)
    return record


def _reference_weight_decay(model: nn.Module, weight_decay: float) -> tuple[list, list]:
    """(decayed, not decayed) parameters as the reference's `set_weight_decay` splits them
    with `--norm-weight-decay 0 --bias-weight-decay 0`: biases and the parameters of
    normalisation layers get none."""
    decayed, undecayed = [], []
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            skip = name == "bias" or isinstance(module, NORM_CLASSES)
            (undecayed if skip else decayed).append(param)
    return decayed, undecayed


def _torch_schedule_lrs(options: dict, per_epoch: int) -> list[float]:
    """The lr of every update by torch's own schedulers, stepped per update (torchkit's
    choice; the reference steps them per epoch): a linear warm-up from lr / W to lr over W
    updates, then the schedule (cosine over the updates after the warm-up, as the reference's
    T_max = epochs - warmup epochs; step counted from the run's first epoch)."""
    S = torch.optim.lr_scheduler
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=options["lr"])
    total = EPOCHS * per_epoch
    warmup = round(options["warmup_epochs"] * per_epoch)
    ramp = S.LinearLR(optimizer, start_factor=1 / warmup, total_iters=warmup - 1)
    if options["scheduler"] == "cosine":
        cosine = S.CosineAnnealingLR(optimizer, T_max=total - warmup, eta_min=options["min_lr"])
        schedule = S.SequentialLR(optimizer, [ramp, cosine], milestones=[warmup])
    else:  # step; exponential: a step of one epoch (ExponentialLR stepped per epoch)
        epochs = options["step_size"] if options["scheduler"] == "step" else 1
        step = S.StepLR(optimizer, epochs * per_epoch, gamma=options["gamma"])
        schedule = S.ChainedScheduler([ramp, step])
    lrs = []
    for _ in range(total):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    return lrs


def _check_mixed_batch(images, mixed) -> None:
    """Mixup blends as the reference's RandomMixup (x * lam + partner * (1 - lam), bit for
    bit); cutmix pastes one box of the partner image, lam corrected to its area, as its
    RandomCutmix. The partner: the batch reversed (the reference's: the batch rolled by 1)."""
    pasted, lam, kind = mixed
    partner = images.flip(0)
    if kind == "mixup":
        assert torch.equal(pasted, images.mul(lam).add(partner.mul(1.0 - lam)))
        return
    changed = (pasted != images).any(0).any(0)
    rows, columns = changed.any(1).nonzero(), changed.any(0).nonzero()
    top, bottom = int(rows.min()), int(rows.max()) + 1
    left, right = int(columns.min()), int(columns.max()) + 1
    height, width = images.shape[-2:]
    assert torch.equal(pasted[..., top:bottom, left:right], partner[..., top:bottom, left:right])
    assert lam == pytest.approx(1 - (bottom - top) * (right - left) / (height * width), abs=1e-12)


def _reference_loop(record: Recorded, options: dict, classes: int) -> dict:
    """Train a copy of torchkit's initial model on the recorded batches as the reference's
    `train_one_epoch` does, checking the weights before every step; the lr of each step is
    the one torchkit used (compared with torch's schedulers apart)."""
    model = copy.deepcopy(record.initial).train()
    decayed, undecayed = _reference_weight_decay(model, options["weight_decay"])
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[id(p)] for p in decayed} == record.decayed
    groups = [
        {"params": decayed, "weight_decay": options["weight_decay"]},
        {"params": undecayed, "weight_decay": 0.0},
    ]
    # fused: torchkit steps SGD and AdamW with torch's fused kernels on CPU, which round
    # otherwise than the for-loop step (an ulp in a weight, which training then amplifies).
    if options["optimizer"] == "sgd":
        optimizer = torch.optim.SGD(
            groups, lr=options["lr"], momentum=options["momentum"],
            nesterov=options["nesterov"], fused=True,
        )  # fmt: skip
    elif options["optimizer"] == "rmsprop":
        # torch's eps, as timm's rmsprop (the reference's: 0.0316); not fused, as torchkit's.
        optimizer = torch.optim.RMSprop(
            groups, lr=options["lr"], momentum=options["momentum"], alpha=0.9
        )
    else:
        optimizer = torch.optim.AdamW(groups, lr=options["lr"], fused=True)
    decay = options["ema_decay"]

    def ema_average(average, weights, averaged):
        # torchkit's decay warm-up, min(decay, (1 + n) / (10 + n)) at its update n.
        n = int(averaged) - 1
        d = min(decay, (1 + n) / (10 + n))
        return d * average + (1 - d) * weights

    ema = torch.optim.swa_utils.AveragedModel(model, avg_fn=ema_average, use_buffers=True)
    ema.n_averaged.fill_(1)  # average from the first update on, not copy (the reference's n=0)
    smoothing = options["label_smoothing"]
    losses = []
    for step, (images, labels) in enumerate(record.batches):
        before = model.state_dict()
        for name, value in record.weights_before[step].items():
            assert torch.equal(before[name], value), (step, name)
        lr = record.lrs[step][0]
        assert all(group_lr == lr for group_lr in record.lrs[step])
        for group in optimizer.param_groups:
            group["lr"] = lr
        mixed = record.mixed[step]
        if mixed is not None:
            _check_mixed_batch(images, mixed)
            images, lam = mixed[0], mixed[1]
        torch.set_rng_state(record.rng[step])
        outputs = model(images)
        loss = F.cross_entropy(outputs, labels, label_smoothing=smoothing)
        if mixed is not None:
            # The reference's criterion on the soft target; torchkit's lam-weighted sum of two
            # criteria is the same number summed in another order, and trains on.
            soft = lam * F.one_hot(labels, classes) + (1 - lam) * F.one_hot(labels.flip(0), classes)
            reference = F.cross_entropy(outputs, soft, label_smoothing=smoothing)
            loss = lam * loss + (1 - lam) * F.cross_entropy(
                outputs, labels.flip(0), label_smoothing=smoothing
            )
            assert loss.item() == pytest.approx(reference.item(), rel=1e-6)
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), options["clip_grad"])
        optimizer.step()
        ema.update_parameters(model)
        losses.append((loss.item(), len(labels)))
    return {"model": model.state_dict(), "ema": ema.module.state_dict(), "losses": losses}


CASES = {
    "sgd-step": [
        "--optimizer", "sgd", "--nesterov", "--lr", "0.1", "--weight-decay", "1e-3",
        "--warmup-epochs", "0.5", "--scheduler", "step", "--step-size", "1", "--gamma", "0.5",
    ],
    "adamw-cosine-mixup-cutmix": [
        "--optimizer", "adamw", "--lr", "0.003", "--weight-decay", "0.05",
        "--warmup-epochs", "1", "--scheduler", "cosine", "--min-lr", "1e-4",
        "--mixup-alpha", "0.2", "--cutmix-alpha", "1.0",
    ],
    "rmsprop-exponential": [
        "--optimizer", "rmsprop", "--lr", "0.001", "--weight-decay", "1e-4",
        "--warmup-epochs", "0.3", "--scheduler", "exponential", "--gamma", "0.9",
    ],
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_the_recipe_options_train_as_the_reference_loop_does(case, recorded, runner, tmp_path):
    out = tmp_path / "run"
    args = [
        "train", "--model", "nets:NoisyNet", "--device", "cpu", "--workers", "0",
        "--epochs", str(EPOCHS), "--batch-size", str(BATCH), "--label-smoothing", "0.1",
        "--clip-grad", "0.5", "--ema", "--ema-decay", "0.99", "--out", str(out), *CASES[case],
    ]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    options = json.loads((out / "config.json").read_text())["options"]
    per_epoch = -(-1438 // BATCH)  # digits' training images, the last batch short
    assert len(recorded.batches) == EPOCHS * per_epoch

    # Learning rates: torchkit's of every update against torch's schedulers (their lr is
    # computed from the one before, torchkit's from the update count: 1e-12 apart).
    used = [lrs[0] for lrs in recorded.lrs]
    assert used == pytest.approx(_torch_schedule_lrs(options, per_epoch), rel=1e-12)
    if case == "sgd-step":  # the warm-up's first update, its end, the decay after epoch 1
        assert used[0] == pytest.approx(0.1 / 12) and used[11] == used[12] == 0.1
        assert used[per_epoch] == pytest.approx(0.05)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the digits run's (--threads): the same sums in the same order
    try:
        loop = _reference_loop(recorded, options, classes=10)
    finally:
        torch.set_num_threads(threads)
    if "mixup" in case:
        kinds = [mixed[2] for mixed in recorded.mixed]
        assert {"mixup", "cutmix"} == set(kinds)  # one or the other, chosen per batch

    checkpoint = torch.load(out / "last.pt", weights_only=True)
    for name, value in checkpoint["model"].items():
        assert torch.equal(loop["model"][name], value), name
    # The EMA: d * ema + (1 - d) * w, where torchkit adds (1 - d) * w in one fused op; the
    # reference averages BatchNorm's integer batch counter too, torchkit copies it.
    for name, value in checkpoint["model_ema"].items():
        if value.is_floating_point():
            torch.testing.assert_close(loop["ema"][name], value, rtol=1e-6, atol=1e-6)

    # metrics.csv: lr is each epoch's last update's, train_loss the mean over its images
    # (the reference logs the mean of the batches' means), the same float64 sums.
    with (out / "metrics.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == EPOCHS
    for epoch, row in enumerate(rows):
        assert float(row["lr"]) == used[(epoch + 1) * per_epoch - 1]
        part = loop["losses"][epoch * per_epoch : (epoch + 1) * per_epoch]
        mean = sum(loss * n for loss, n in part) / sum(n for _, n in part)
        assert float(row["train_loss"]) == pytest.approx(mean, rel=1e-12)


def _reference_box(height: int, width: int, lam: float, cy: int, cx: int) -> tuple[int, ...]:
    """The reference's RandomCutmix box around (cy, cx): half sides of int(r * side), r = 0.5
    * sqrt(1 - lam), clipped to the image; as (top, bottom, left, right)."""
    r = 0.5 * math.sqrt(1.0 - lam)
    half_w, half_h = int(r * width), int(r * height)
    return (
        max(cy - half_h, 0),
        min(cy + half_h, height),
        max(cx - half_w, 0),
        min(cx + half_w, width),
    )


@pytest.mark.parametrize("alpha", [0.2, 1.0])
def test_mixing_draws_lam_and_boxes_as_the_reference_does(alpha):
    # The same draw of lam as the reference's torch._sample_dirichlet([alpha, alpha])[0] from
    # the same generator state, and the same box for the same lam and centre (torchkit draws
    # the centre's row, then its column; the reference the column first: another box, drawn
    # alike).
    for seed in range(20):
        torch.manual_seed(seed)
        lam = mixing._beta(alpha)
        torch.manual_seed(seed)
        assert lam == float(torch._sample_dirichlet(torch.tensor([alpha, alpha]))[0])
        for height, width in ((12, 12), (7, 16), (224, 224)):
            torch.manual_seed(seed)
            box = mixing.cutmix_box(height, width, lam)
            torch.manual_seed(seed)
            cy, cx = int(torch.randint(height, ())), int(torch.randint(width, ()))
            assert box == _reference_box(height, width, lam, cy, cx), (seed, height, width)


@pytest.mark.parametrize("kind", ["mixup", "cutmix"])
def test_an_odd_batchs_middle_image_is_paired_with_itself_and_left_unmixed(kind):
    """The batch is paired with itself reversed (the reference rolls it by one): in a batch of
    5, image 2 is its own partner, so it (up to mixup's rounding of x * lam + x * (1 - lam))
    and its loss stay as they were; the others change."""
    torch.manual_seed(0)
    images, labels = torch.rand(5, 3, 16, 16), torch.tensor([0, 1, 2, 3, 4])
    alphas = (1.0, 0.0) if kind == "mixup" else (0.0, 1.0)
    mixed = mixing.mix_batch(images, labels, *alphas)
    assert mixed.kind == kind and 0 < mixed.lam < 1
    assert torch.equal(mixed.labels_b, torch.tensor([4, 3, 2, 1, 0]))
    torch.testing.assert_close(mixed.images[2], images[2], rtol=1e-6, atol=1e-6)
    assert all(not torch.equal(mixed.images[i], images[i]) for i in (0, 1, 3, 4))
