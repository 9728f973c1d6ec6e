"""`torchkit train`'s pieces against the library pieces timm's train.py is built from, on the
same inputs: the weight-decay split (`create_optimizer_v2`), the learning rate of every update
(`CosineLRScheduler`, `StepLRScheduler`, `MultiStepLRScheduler`), mixup and cutmix (`Mixup`, fed
the random draws torchkit made), the label-smoothed and mixed losses (`LabelSmoothingCrossEntropy`,
`SoftTargetCrossEntropy`), the EMA (`ModelEmaV3`) and a checkpoint written by timm's own
`CheckpointSaver`. Where torchkit differs by design (train.md, "Coming from timm's train.py"),
the test says how and checks exactly that difference."""

from __future__ import annotations

import argparse
import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

timm = pytest.importorskip("timm")

from timm.data import Mixup  # noqa: E402
from timm.data import mixup as timm_mixup  # noqa: E402
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy  # noqa: E402
from timm.optim import create_optimizer_v2  # noqa: E402
from timm.scheduler import (  # noqa: E402
    CosineLRScheduler,
    MultiStepLRScheduler,
    StepLRScheduler,
)
from timm.utils import CheckpointSaver, ModelEmaV3  # noqa: E402

from torchkit.core.train import mixing  # noqa: E402
from torchkit.core.train.class_weights import training_loss  # noqa: E402
from torchkit.core.train.config import TrainConfig  # noqa: E402
from torchkit.core.train.ema import ModelEMA  # noqa: E402
from torchkit.core.train.optim import LRSchedule, param_groups  # noqa: E402

# -- weight decay --------------------------------------------------------------------------------


def _timm_decayed(model: nn.Module) -> set[str]:
    """The parameters timm's train.py decays: `create_optimizer_v2` with a weight decay."""
    optimizer = create_optimizer_v2(model, "sgd", lr=0.1, weight_decay=0.05)
    ids = {id(p) for g in optimizer.param_groups if g["weight_decay"] for p in g["params"]}
    return {name for name, p in model.named_parameters() if id(p) in ids}


def _torchkit_decayed(model: nn.Module, **options) -> set[str]:
    groups = param_groups(model, TrainConfig(lr=0.1, weight_decay=0.05, **options))
    return {name for g in groups if g.weight_decay for name in g.names}


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("test_resnet", {}),
        ("test_convnext", {}),
        ("test_efficientnet", {}),
        ("test_vit", {}),  # no_weight_decay(): pos_embed, cls_token, reg_token, dist_token
        ("test_maxvit", {}),  # no_weight_decay(): every relative position bias table by name
        ("xcit_nano_12_p16_224", {"depth": 1}),  # no_weight_decay(): the pattern pos_embed.*
    ],
)
def test_weight_decay_falls_on_the_parameters_timm_decays(name, kwargs):
    """Biases, every 1-D parameter and what `no_weight_decay()` names (full names, or fnmatch
    patterns: XCiT's `pos_embed.*` covers its positional encoding's convolution, which torchkit
    decayed before) get none; the rest gets --weight-decay, as in timm."""
    model = timm.create_model(name, num_classes=3, **kwargs)
    decayed = _torchkit_decayed(model)
    assert decayed == _timm_decayed(model)
    assert decayed and decayed != {n for n, _ in model.named_parameters()}
    if name.startswith("xcit"):
        assert "pos_embed.token_projection.weight" not in decayed


def test_torchvision_and_torchkit_models_split_as_timm_splits_them():
    """timm's rule (1-D or `.bias`) on a torchvision ResNet: its BatchNorm weights and biases,
    the linear layer's bias."""
    import torchvision

    model = torchvision.models.resnet18(num_classes=3)
    assert _torchkit_decayed(model) == _timm_decayed(model)


class Scaled(nn.Module):
    """A block with a 2-D parameter `scale` that the model's `no_weight_decay()` names by its
    last part only."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Linear(4, 4)
        self.block.scale = nn.Parameter(torch.ones(4, 1))
        self.head = nn.Linear(4, 3)

    def no_weight_decay(self) -> set[str]:
        return {"scale"}


def test_a_last_name_in_no_weight_decay_is_spared_where_timm_decays_it():
    """By design: torchkit also reads a name of `no_weight_decay()` as the last part of a
    parameter's name (`scale` spares `block.scale`); timm matches it against full names only
    and decays `block.scale`. `--decay-all` decays everything, as timm's `--weight-decay` with
    `weight_decay_exclude_1d=False` and no `no_weight_decay()`."""
    model = Scaled()
    assert _timm_decayed(model) - _torchkit_decayed(model) == {"block.scale"}
    assert _torchkit_decayed(model) == {"block.weight", "head.weight"}
    everything = {name for name, _ in model.named_parameters()}
    assert _torchkit_decayed(model, decay_all=True) == everything


# Hyperparameters set by the options or by where the step runs, not defaults of the algorithm.
RUN_KEYS = {"lr", "weight_decay", "foreach", "fused", "differentiable", "capturable", "maximize"}


@pytest.mark.parametrize(
    ("timm_opt", "options"),
    [
        ("sgd", {"optimizer": "sgd", "nesterov": True}),  # timm's sgd is Nesterov's
        ("momentum", {"optimizer": "sgd"}),
        ("adam", {"optimizer": "adam"}),
        ("adamw", {"optimizer": "adamw"}),
        ("rmsprop", {"optimizer": "rmsprop"}),
    ],
)
def test_optimizers_are_timms_with_its_defaults(timm_opt, options):
    """`--optimizer` builds the torch optimiser timm's `--opt` builds, with the same defaults
    (betas, eps, RMSprop's alpha 0.9, the momentum): timm's `--opt sgd` (its default) is
    Nesterov SGD, torchkit's `--optimizer sgd --nesterov`; timm's `--opt momentum` is plain
    `--optimizer sgd`."""
    from torchkit.core.train.optim import build_optimizer

    model = timm.create_model("test_resnet", num_classes=3)
    theirs = create_optimizer_v2(model, timm_opt, lr=0.1, momentum=0.9, weight_decay=0.05)
    config = TrainConfig(lr=0.1, momentum=0.9, weight_decay=0.05, **options)
    ours = build_optimizer(param_groups(model, config), config)
    assert type(ours) is type(theirs)
    for key, value in theirs.defaults.items():
        if key not in RUN_KEYS:
            assert ours.defaults[key] == value, key


# -- learning-rate schedules ---------------------------------------------------------------------

LR, PER_EPOCH, EPOCHS = 0.4, 5, 6


def _torchkit_lrs(**options) -> list[float]:
    """The lr of every update (0-based) of an `--epochs EPOCHS` run of PER_EPOCH updates."""
    config = TrainConfig(lr=LR, epochs=EPOCHS, **options)
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=LR)
    optimizer.param_groups[0]["base_lr"] = LR
    schedule = LRSchedule(optimizer, config, PER_EPOCH)
    lrs = []
    for _ in range(EPOCHS * PER_EPOCH):
        lrs.append(schedule.current_lr())
        schedule.step()
    return lrs


def _timm_lrs(make, *, per_update: bool = True) -> list[float]:
    """The lr timm's train.py trains every update with: the lr set at construction, then after
    update n `step_update(n)` (`--sched-on-updates`) or after epoch e `step(e + 1)`."""
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=LR)
    scheduler = make(optimizer)
    lrs, update = [], 0
    for epoch in range(EPOCHS):
        for _ in range(PER_EPOCH):
            lrs.append(optimizer.param_groups[0]["lr"])
            update += 1
            if per_update:
                scheduler.step_update(update)
        if not per_update:
            scheduler.step(epoch + 1)
    return lrs


def test_cosine_is_timms_with_warmup_prefix_per_update_one_update_ahead_in_the_warmup():
    """`--scheduler cosine --warmup-epochs W --min-lr M` is timm's `--sched cosine
    --sched-on-updates --warmup-prefix --warmup-lr 0 --warmup-epochs W --min-lr M` with
    `--epochs` less the W warm-up epochs (timm's warm-up prefix adds them): the cosine of every
    update after the warm-up is timm's; in the warm-up, update u runs at lr x (u + 1) / W
    (W counted in updates), the lr timm sets for update u + 1: timm's first update runs at
    --warmup-lr, torchkit's last warm-up update at the full lr."""
    warmup = 2 * PER_EPOCH
    ours = _torchkit_lrs(scheduler="cosine", warmup_epochs=2, min_lr=0.01)
    theirs = _timm_lrs(
        lambda o: CosineLRScheduler(
            o,
            t_initial=(EPOCHS - 2) * PER_EPOCH,
            lr_min=0.01,
            warmup_t=warmup,
            warmup_lr_init=0.0,
            warmup_prefix=True,
            t_in_epochs=False,
        )  # fmt: skip
    )
    assert ours[:warmup] == pytest.approx(theirs[1 : warmup + 1], rel=1e-12, abs=0)
    assert ours[warmup:] == pytest.approx(theirs[warmup:], rel=1e-12, abs=0)
    assert theirs[0] == 0.0 and ours[0] == pytest.approx(LR / warmup)
    assert ours[warmup - 1] == ours[warmup] == pytest.approx(LR)
    assert ours[-1] > 0.01  # the last update's lr: one update before the cosine's end


def test_timms_default_steps_per_epoch_torchkit_per_update():
    """timm steps its schedule per epoch by default (`t_in_epochs`): every update of an epoch
    runs at that epoch's lr, which is torchkit's schedule of an epoch of one update, with the
    same shift in the warm-up. torchkit anneals and warms up on every update."""
    per_epoch = _timm_lrs(
        lambda o: CosineLRScheduler(
            o,
            t_initial=EPOCHS - 1,
            lr_min=0.0,
            warmup_t=1,
            warmup_lr_init=0.0,
            warmup_prefix=True,
        ),  # fmt: skip
        per_update=False,
    )
    epochs = [per_epoch[e * PER_EPOCH : (e + 1) * PER_EPOCH] for e in range(EPOCHS)]
    assert all(len(set(lrs)) == 1 for lrs in epochs)  # one lr per epoch
    ours = _torchkit_lrs(scheduler="cosine", warmup_epochs=1)
    assert len(set(ours[PER_EPOCH : 2 * PER_EPOCH])) == PER_EPOCH  # a new lr every update
    config = TrainConfig(lr=LR, epochs=EPOCHS, scheduler="cosine", warmup_epochs=1)
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=LR)
    optimizer.param_groups[0]["base_lr"] = LR
    one_update_epochs = LRSchedule(optimizer, config, updates_per_epoch=1)
    by_epoch = [one_update_epochs.factor(e) * LR for e in range(EPOCHS)]
    # the warm-up epoch runs at the full lr, as timm's epoch 1; then timm's cosine
    assert by_epoch[0] == pytest.approx(epochs[1][0], rel=1e-12)
    assert by_epoch[1:] == pytest.approx([lrs[0] for lrs in epochs[1:]], rel=1e-12)


def test_timms_cosine_without_warmup_prefix_spans_the_warmup():
    """timm's default (no `--warmup-prefix`) runs the cosine over all --epochs, the warm-up
    overlapping its start: after a warm-up of W epochs it jumps to the cosine at W, below the
    lr. torchkit's cosine starts at the full lr after the warm-up and ends at --epochs, as
    timm's with `--warmup-prefix` and --epochs less W."""
    warmup = PER_EPOCH
    theirs = _timm_lrs(
        lambda o: CosineLRScheduler(
            o,
            t_initial=EPOCHS * PER_EPOCH,
            warmup_t=warmup,
            warmup_lr_init=0.0,
            warmup_prefix=False,
            t_in_epochs=False,
        )  # fmt: skip
    )
    ours = _torchkit_lrs(scheduler="cosine", warmup_epochs=1)
    cosine_at_warmup_end = 0.5 * LR * (1 + math.cos(math.pi * warmup / (EPOCHS * PER_EPOCH)))
    assert theirs[warmup] == pytest.approx(cosine_at_warmup_end, rel=1e-12) and theirs[warmup] < LR
    assert ours[warmup] == pytest.approx(LR)


@pytest.mark.parametrize(
    ("options", "timm_schedule"),
    [
        (
            {"scheduler": "step", "step_size": 2, "gamma": 0.5},
            lambda o, warmup: StepLRScheduler(
                o, decay_t=2 * PER_EPOCH, decay_rate=0.5, warmup_t=warmup,
                warmup_lr_init=0.0, warmup_prefix=False, t_in_epochs=False,
            ),
        ),
        (  # timm has no exponential schedule: a step of one epoch is one
            {"scheduler": "exponential", "gamma": 0.8},
            lambda o, warmup: StepLRScheduler(
                o, decay_t=PER_EPOCH, decay_rate=0.8, warmup_t=warmup,
                warmup_lr_init=0.0, warmup_prefix=False, t_in_epochs=False,
            ),
        ),
        (  # timm's constant: warm-up, then the lr
            {"scheduler": "none"},
            lambda o, warmup: StepLRScheduler(
                o, decay_t=1, decay_rate=1.0, warmup_t=warmup,
                warmup_lr_init=0.0, warmup_prefix=False, t_in_epochs=False,
            ),
        ),
    ],
    ids=["step", "exponential", "none"],
)  # fmt: skip
def test_step_exponential_and_none_are_timms_step_per_update(options, timm_schedule):
    """`--scheduler step --step-size S --gamma G` is timm's `--sched step --decay-epochs S
    --decay-rate G` (counted from the run's first epoch, the warm-up included, as timm without
    `--warmup-prefix`); `--scheduler exponential --gamma G` is timm's step with `--decay-epochs
    1`; `--scheduler none` (warm-up kept) is timm's `constant`. Equal on every update after
    the warm-up; in the warm-up torchkit's update u runs at lr x (u + 1) / W, timm's at
    lr x u / W (with `--warmup-lr 0`)."""
    warmup = PER_EPOCH
    ours = _torchkit_lrs(warmup_epochs=1, **options)
    theirs = _timm_lrs(lambda o: timm_schedule(o, warmup))
    assert ours[:warmup] == pytest.approx([LR * (u + 1) / warmup for u in range(warmup)])
    assert theirs[:warmup] == pytest.approx([LR * u / warmup for u in range(warmup)])
    assert ours[warmup:] == pytest.approx(theirs[warmup:], rel=1e-12, abs=0)
    assert min(ours[warmup:]) < LR * 0.5 or options["scheduler"] == "none"  # it did decay


def test_multistep_decays_at_the_milestone_timm_one_epoch_before():
    """By design: `--milestones 2,4` decays at the start of epochs 2 and 4 (0-based, as
    torch's MultiStepLR); timm's `--decay-milestones 2 4` applies a milestone m at epoch
    m - 1 (its convention), per epoch and, per update, one update before the epoch."""
    ours = _torchkit_lrs(scheduler="multistep", milestones=(2, 4), gamma=0.5, warmup_epochs=0)
    per_epoch = _timm_lrs(
        lambda o: MultiStepLRScheduler(o, decay_t=[2, 4], decay_rate=0.5), per_update=False
    )
    per_update = _timm_lrs(
        lambda o: MultiStepLRScheduler(
            o, decay_t=[2 * PER_EPOCH, 4 * PER_EPOCH], decay_rate=0.5, t_in_epochs=False
        )
    )
    assert [ours[e * PER_EPOCH] for e in range(EPOCHS)] == pytest.approx(
        [LR, LR, LR / 2, LR / 2, LR / 4, LR / 4]
    )
    assert [per_epoch[e * PER_EPOCH] for e in range(EPOCHS)] == pytest.approx(
        [LR, LR / 2, LR / 2, LR / 4, LR / 4, LR / 4]
    )
    # per update: timm's drop comes at the last update of the epoch before, torchkit's at the
    # epoch's first
    assert per_update[2 * PER_EPOCH - 1] == pytest.approx(LR / 2)
    assert ours[2 * PER_EPOCH - 1] == LR and ours[2 * PER_EPOCH] == pytest.approx(LR / 2)
    assert per_update[:-1] == pytest.approx(ours[1:], rel=1e-12)  # one update ahead


# -- mixup, cutmix and the losses ----------------------------------------------------------------


class Draws:
    """numpy's random module as timm's Mixup reads it, returning given draws in order:
    `rand` for its mix-or-not (always under --mixup-prob 1) and cutmix-or-mixup choices, `beta`
    for lam, `randint` for the cutmix box's centre (row, then column)."""

    def __init__(self, switch: float, lam: float, centre: tuple[int, int] = (0, 0)) -> None:
        self.rands = [0.0, switch]
        self.lam = lam
        self.centre = list(centre)

    def rand(self):
        return self.rands.pop(0)

    def beta(self, a, b):
        return self.lam

    def randint(self, low, high, size=None):
        value = self.centre.pop(0)
        assert low <= value < high
        return value


def _torchkit_draws():
    """Recorders of the draws torchkit's `mix_batch` makes from torch's generator (the switch
    between the two, lam, the box's centre), and the dict they fill."""
    drawn: dict = {}
    beta, randint, rand = mixing._beta, torch.randint, torch.rand

    def recording_beta(alpha):
        drawn["lam"] = beta(alpha)
        return drawn["lam"]

    def recording_randint(high, size, **kwargs):
        value = randint(high, size, **kwargs)
        drawn.setdefault("centre", []).append(int(value))
        return value

    def recording_rand(*args, **kwargs):
        drawn["switch"] = rand(*args, **kwargs)
        return drawn["switch"]

    return drawn, recording_beta, recording_randint, recording_rand


@pytest.mark.parametrize("kind", ["mixup", "cutmix"])
def test_mixup_and_cutmix_are_timms_mixup_on_the_same_draws(monkeypatch, kind):
    """timm's `Mixup` (mode batch, --mixup-prob 1, --mixup-switch-prob 0.5) fed the draws
    torchkit made: the same choice, lam and pixels, the batch paired with itself reversed; the
    soft-target loss timm trains with (`SoftTargetCrossEntropy` on `mixup_target` with the
    smoothing) is torchkit's lam x CE(y) + (1 - lam) x CE(y reversed), within rounding.
    Cutmix's box is timm's where its sides are even (the next test: an odd side)."""
    torch.manual_seed(0)
    images, labels = torch.randn(6, 3, 16, 16), torch.tensor([0, 1, 2, 3, 4, 0])
    drawn, beta, randint, rand = _torchkit_draws()
    monkeypatch.setattr(mixing, "_beta", beta)
    monkeypatch.setattr(torch, "randint", randint)
    monkeypatch.setattr(torch, "rand", rand)
    want_cutmix = kind == "cutmix"
    for seed in range(200):  # the first seed whose choice is `kind`, for cutmix an even cut
        torch.manual_seed(seed)
        drawn.clear()
        mixed = mixing.mix_batch(images, labels, 0.4, 1.0)
        if mixed.kind == kind and (not want_cutmix or int(16 * (1 - drawn["lam"]) ** 0.5) % 2 == 0):
            break
    else:  # pragma: no cover
        pytest.fail(f"no seed drew {kind}")
    monkeypatch.undo()
    fake = Draws(float(drawn["switch"]), drawn["lam"], tuple(drawn.get("centre", (0, 0))))
    monkeypatch.setattr(timm_mixup.np, "random", fake)
    mixer = Mixup(mixup_alpha=0.4, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=5)
    theirs, targets = mixer(images.clone(), labels)
    assert torch.equal(mixed.images, theirs)
    assert torch.equal(mixed.labels_b, labels.flip(0))
    outputs = torch.randn(6, 5)
    criterion = training_loss(None, 0.1, "cpu")
    ours = mixed.lam * criterion(outputs, mixed.labels_a) + (1 - mixed.lam) * criterion(
        outputs, mixed.labels_b
    )
    assert float(ours) == pytest.approx(float(SoftTargetCrossEntropy()(outputs, targets)), rel=1e-6)


@pytest.mark.parametrize(("lam", "side"), [(0.75, 8), (0.5, 11), (0.9, 5)])
def test_cutmix_box_is_timms_less_a_pixel_on_an_odd_side(monkeypatch, lam, side):
    """By design: torchkit's box is torchvision's reference formula, `cut // 2` either side
    of the centre (cut = int(16 x sqrt(1 - lam))); timm's rounds the far half up and covers
    `cut` exactly. Even cuts: the same box; odd: timm's reaches one pixel further down and
    right. Either corrects lam to its own box's area."""
    centre = (7, 8)  # row, column
    draws = iter(centre * 2)
    monkeypatch.setattr(torch, "randint", lambda high, size: torch.tensor(next(draws)))
    top, bottom, left, right = mixing.cutmix_box(16, 16, lam)
    monkeypatch.setattr(timm_mixup.np, "random", Draws(0.0, lam, centre))
    (yl, yh, xl, xh), timm_lam = timm_mixup.cutmix_bbox_and_lam((2, 3, 16, 16), lam)
    assert int(16 * math.sqrt(1 - lam)) == side
    assert (top, left) == (yl, xl)
    assert (yh - bottom, xh - right) == (side % 2, side % 2)
    assert timm_lam == 1 - (yh - yl) * (xh - xl) / 256
    mixed = mixing.cutmix(torch.randn(4, 3, 16, 16), torch.arange(4), lam)  # the same centre
    assert mixed.lam == 1 - (bottom - top) * (right - left) / 256


def test_an_odd_batch_is_mixed_where_timm_refuses_it():
    """By design: a batch of an odd size (the last of an epoch) is mixed, its middle image with
    itself; timm's `Mixup` asserts an even batch (its loader drops the last one)."""
    images, labels = torch.randn(5, 3, 8, 8), torch.arange(5)
    torch.manual_seed(0)
    mixed = mixing.mix_batch(images, labels, 0.4, 0.0)
    assert torch.allclose(mixed.images[2], images[2], atol=1e-6) and mixed.labels_b[2] == 2
    with pytest.raises(AssertionError, match="even"):
        Mixup(mixup_alpha=0.4, num_classes=5)(images.clone(), labels)


def test_mixup_blends_normalised_images_timms_prefetcher_rounded_pixels(monkeypatch):
    """By design: mixup blends the normalised float images (as timm's `Mixup`, with
    `--no-prefetcher`); timm's default prefetcher mixes the 8-bit pixels in its collate
    (`FastCollateMixup`) and rounds them to 8 bits before normalising: the two differ by at most
    half a grey level."""
    from timm.data import FastCollateMixup

    mean, std = torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225])
    generator = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8, generator=generator)

    def normalise(images):
        return (images.float() / 255 - mean[:, None, None]) / std[:, None, None]

    lam = 0.3
    ours = mixing.mixup(normalise(pixels), torch.arange(4), lam).images
    monkeypatch.setattr(timm_mixup.np, "random", Draws(0.0, lam))
    collate = FastCollateMixup(mixup_alpha=1.0, label_smoothing=0.0, num_classes=4)
    batch = [(pixels[i].numpy(), i) for i in range(4)]
    theirs, _ = collate(batch)
    half_level = 0.5 / 255 / std.min()
    difference = (ours - normalise(theirs)).abs().max()
    assert 0 < difference <= half_level + 1e-6


def test_random_erasing_fills_with_zeros_where_timm_fills_with_noise():
    """By design: `--random-erasing P` is torchvision's `RandomErasing` after normalisation, a
    box of zeros (the mean colour); timm's `--reprob P` with its default `--remode pixel` fills
    the box with normal noise."""
    import numpy as np
    from PIL import Image
    from timm.data.random_erasing import RandomErasing

    from torchkit.core.data.preprocessing import Preprocess
    from torchkit.core.data.transforms import train_transform

    pixels = np.random.default_rng(0).integers(0, 256, (24, 24, 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    plain = train_transform(Preprocess(image_size=24, resize_size=24), augment="none")(image)
    torch.manual_seed(0)
    erased = train_transform(
        Preprocess(image_size=24, resize_size=24), augment="none", random_erasing=1.0
    )(image)
    changed = erased != plain
    assert changed.any() and bool((erased[changed] == 0).all())
    torch.manual_seed(0)
    noisy = RandomErasing(probability=1.0, mode="pixel", device="cpu")(plain.clone())
    changed = noisy != plain
    assert changed.any() and bool((noisy[changed] != 0).all())


def test_label_smoothing_is_timms_loss():
    """`--label-smoothing S` (torch's cross-entropy) is timm's `LabelSmoothingCrossEntropy`
    (`--smoothing S` without mixup), within float rounding; at 0, plain cross-entropy."""
    torch.manual_seed(0)
    outputs, labels = torch.randn(16, 7), torch.randint(7, (16,))
    for smoothing in (0.1, 0.3):
        ours = training_loss(None, smoothing, "cpu")(outputs, labels)
        theirs = LabelSmoothingCrossEntropy(smoothing=smoothing)(outputs, labels)
        assert float(ours) == pytest.approx(float(theirs), rel=1e-6)
    assert float(training_loss(None, 0.0, "cpu")(outputs, labels)) == pytest.approx(
        float(F.cross_entropy(outputs, labels)), rel=1e-7
    )


# -- EMA -----------------------------------------------------------------------------------------


def _steps(model: nn.Module, count: int):
    """`count` SGD steps of `model` on random batches, yielding after each."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(count):
        loss = model(torch.randn(8, 3, 8, 8)).logsumexp(1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        yield


def _net() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(144, 3)
    )


def test_ema_is_model_ema_v3_at_torchkits_decay():
    """torchkit's EMA is `ModelEmaV3` (parameters and floating buffers averaged, BatchNorm's
    integer counter copied) updated at the decay torchkit uses for each update, within
    rounding (timm lerps, torchkit multiplies and adds)."""
    torch.manual_seed(0)
    model = _net()
    ours, theirs = ModelEMA(model, decay=0.99), ModelEmaV3(model, decay=0.99)
    for _ in _steps(model, 12):
        decay = ours.current_decay()
        ours.update()
        theirs.apply_update_(model, decay)
    mine, timms = ours.state_dict(), theirs.module.state_dict()
    assert mine.keys() == timms.keys()
    for key, value in mine.items():
        assert torch.allclose(value.float(), timms[key].float(), rtol=1e-5, atol=1e-6), key
    assert int(mine["1.num_batches_tracked"]) == 12 == int(timms["1.num_batches_tracked"])


def test_ema_warmup_differs_from_timms_by_design():
    """By design: torchkit's decay at update n (0-based) is min(d, (1 + n) / (10 + n))
    (TensorFlow's warm-up by the update count); timm's train.py calls `update(model,
    step=n + 1)`: its first update copies the weights (decay 0), then d from the second, or
    with `--model-ema-warmup` min(d, 1 - (1 + n) ^ -2/3)."""
    ours, plain = ModelEMA(_net(), 0.999), ModelEmaV3(_net(), 0.999)
    warm = ModelEmaV3(_net(), 0.999, use_warmup=True)
    mine = []
    for _ in range(5):
        mine.append(ours.current_decay())
        ours.updates += 1
    assert mine == [1 / 10, 2 / 11, 3 / 12, 4 / 13, 5 / 14]
    assert [plain.get_decay(n + 1) for n in range(5)] == [0.0] + [0.999] * 4
    assert [warm.get_decay(n + 1) for n in range(3)] == [
        0.0,
        1 - 2 ** (-2 / 3),
        1 - 3 ** (-2 / 3),
    ]


# -- a checkpoint of timm's train.py ------------------------------------------------------------


@pytest.fixture
def timm_train_checkpoint(tmp_path):
    """last.pth.tar as timm's train.py writes it with --model-ema: its `CheckpointSaver` over
    the model, the optimiser, `ModelEmaV3` and the argparse Namespace (`epoch`, `arch`,
    `state_dict`, `state_dict_ema`, `optimizer`, `args`, `metric`, `saver`)."""
    torch.manual_seed(0)
    model = timm.create_model("test_resnet", num_classes=2)
    optimizer = create_optimizer_v2(model, "sgd", lr=0.1, weight_decay=2e-5)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    optimizer.step()  # momentum buffers in the optimiser's state
    ema = ModelEmaV3(model, decay=0.9)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.01)
    ema.update(model, step=2)
    args = argparse.Namespace(model="test_resnet", model_ema=True, lr=0.1, epochs=3)
    saver = CheckpointSaver(
        model, optimizer, args=args, model_ema=ema, checkpoint_dir=str(tmp_path / "timm"),
        recovery_dir=str(tmp_path / "timm"), max_history=2,
    )  # fmt: skip
    (tmp_path / "timm").mkdir()
    saver.save_checkpoint(epoch=2, metric=50.0)
    path = tmp_path / "timm" / "last.pth.tar"
    saved = torch.load(path, weights_only=False)
    assert {"epoch", "state_dict", "state_dict_ema", "optimizer", "args"} <= saved.keys()
    return path, copy.deepcopy(model.state_dict()), copy.deepcopy(ema.module.state_dict())


def test_a_timm_train_checkpoint_fine_tunes_and_evaluates(timm_train_checkpoint, tmp_path):
    """`train --weights last.pth.tar` of timm's saver starts from its `state_dict` (a note
    says so and names the way to its EMA weights), without --trust-checkpoint; `eval` takes
    its `state_dict`, and `--ema` its `state_dict_ema`. `--resume` refuses it: it continues
    a torchkit run."""
    from image_folders import write_image_folder
    from processes import run_torchkit_in_process

    from torchkit.core.models.resolver import resolve_model

    path, weights, averaged = timm_train_checkpoint
    for ema, expected in ((False, weights), (True, averaged)):
        model = resolve_model("timm/test_resnet", weights=str(path), ema=ema).model.state_dict()
        assert all(torch.equal(model[k], v) for k, v in expected.items())
    data = write_image_folder(tmp_path / "images", {"a": 3, "b": 3}, size=40)
    common = ("--device", "cpu", "-j", "0", "--image-size", "32", "--batch-size", "3")
    trained = run_torchkit_in_process(
        "train", "--model", "timm/test_resnet", "--weights", path, "--data", data,
        "--val-split", "0.5", "--epochs", "1", "--out", tmp_path / "run", *common,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    assert "loaded state_dict; to fine-tune the EMA weights" in " ".join(trained.stderr.split())
    for flags in ((), ("--ema",)):
        evaluated = run_torchkit_in_process(
            "eval", "timm/test_resnet", "--weights", path, "--data", data, *common, *flags,
            "--format", "json",
        )  # fmt: skip
        assert evaluated.returncode == 0, evaluated.stderr
    resumed = run_torchkit_in_process("train", "--resume", path, "--data", data, *common)
    assert resumed.returncode != 0
    assert (
        "is not a torchkit training checkpoint (--resume continues a `torchkit train` run; "
        "use --model ARCH --weights FILE for other weights)" in " ".join(resumed.stderr.split())
    )


def test_drop_path_through_a_callable_that_builds_the_timm_model(tmp_path, monkeypatch):
    """timm's `--drop-path` (and `--drop`, `--model-kwargs`) have no option: a
    `package.module:Callable` in the working directory that passes them to
    `timm.create_model` is the model, called with the data's `num_classes`."""
    from torchkit.core.models.resolver import resolve_model

    (tmp_path / "droppy.py").write_text(
        "import timm\n\n\ndef net(num_classes):\n"
        "    return timm.create_model('test_vit', num_classes=num_classes, drop_path_rate=0.1)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    model = resolve_model("droppy:net", num_classes=4).model
    rates = [m.drop_prob for m in model.modules() if type(m).__name__ == "DropPath"]
    assert rates and max(rates) == pytest.approx(0.1)
    assert model.num_classes == 4


def _timm_section() -> str:
    from suite_paths import REPO

    text = (REPO / "docs" / "commands" / "train.md").read_text(encoding="utf-8")
    return text.split("## Coming from timm's train.py", 1)[1].split("\n## ", 1)[0]


def test_the_pages_timm_section_names_only_options_train_has(_torchkit_command):
    """The torchkit column of "Coming from timm's train.py" (its first table) names only
    options `train` has (the page test leaves sections about other programs out)."""
    import re

    train = _torchkit_command.commands["train"]
    known = {spelling for p in train.params for spelling in (*p.opts, *p.secondary_opts)}
    rows = [line for line in _timm_section().splitlines() if line.startswith("| `")]
    named = set()
    for row in rows[: rows.index(next(r for r in rows if "distributed_train" in r)) + 1]:
        torchkit_column = row.rsplit(" | ", 1)[1]
        named |= set(re.findall(r"(?<![\w-])--?[a-zA-Z][\w-]*", torchkit_column))
    assert len(named) > 40
    assert named - known - {"--nproc_per_node", "-m"} == set()
