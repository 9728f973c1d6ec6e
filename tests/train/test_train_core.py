"""`torchkit.core.train` pieces checked against independent references: torch's own lr
schedulers, hand-computed mixup/cutmix/EMA, and the config round trip."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from nets import AutocastProbe, GatedNet, NoisyNet, TinyNet
from torch import nn

from torchkit.core.data.dataset import ShardSampler
from torchkit.core.io.errors import CheckpointError, UsageError
from torchkit.core.train.config import TrainConfig
from torchkit.core.train.ema import ModelEMA
from torchkit.core.train.loaders import EpochSampler, SeededDataset, mix_seed
from torchkit.core.train.mixing import cutmix, mix_batch, mixup
from torchkit.core.train.optim import LRSchedule, build_optimizer, no_decay_names, param_groups
from torchkit.core.train.resume_merge import merge_for_resume
from torchkit.core.train.validation import resolve_defaults, validate

pytestmark = pytest.mark.drawn_curves  # reads curves.png's picture (tests/conftest.py)


def test_config_round_trips_through_its_dict():
    config = resolve_defaults(
        TrainConfig(data="digits", milestones=(3, 6), mean=(0.5,), clip_grad=1.0),
        is_digits=True,
    )
    as_dict = config.to_dict()
    assert as_dict["milestones"] == [3, 6] and as_dict["mean"] == [0.5, 0.5, 0.5]
    assert TrainConfig.from_dict(as_dict) == config
    assert TrainConfig.from_dict({**as_dict, "from_a_future_version": 1}) == config


def test_digits_defaults_differ_from_image_folder_defaults_and_are_recorded():
    digits = resolve_defaults(TrainConfig(), is_digits=True)
    folder = resolve_defaults(TrainConfig(data="images/"), is_digits=False)
    assert (digits.model, digits.flip, digits.crop_scale) == ("convnet", False, (0.85, 1.0))
    assert digits.resize_size == digits.image_size  # no centre crop for 8x8 digits
    assert (folder.model, folder.image_size, folder.resize_size, folder.flip) == (
        "resnet18",
        224,
        256,
        True,
    )
    assert folder.crop_scale == (0.08, 1.0)
    assert set(digits.data_defaults) == {
        "model", "image_size", "resize_size", "flip", "crop_scale", "best_metric", "ema",
        "epochs", "batch_size", "channels_last", "threads", "mean", "std",
        "interpolation", "crop_mode",
    }  # fmt: skip
    assert (digits.threads, folder.threads) == (1, None)  # None: core.runtime.threads
    assert (digits.best_metric, folder.best_metric) == ("loss", "top1")
    assert (digits.image_size, digits.batch_size, digits.epochs) == (12, 32, 25)
    assert (folder.batch_size, folder.epochs) == (64, 20)
    assert (digits.channels_last, folder.channels_last) == (True, False)
    assert (digits.ema, folder.ema) == (True, False)
    explicit = resolve_defaults(
        TrainConfig(flip=True, image_size=16, epochs=3, channels_last=False), is_digits=True
    )
    assert explicit.flip is True and explicit.resize_size == 16
    assert (explicit.epochs, explicit.channels_last) == (3, False)
    assert not {"flip", "image_size", "epochs", "channels_last"} & set(explicit.data_defaults)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"backbone_lr": 0.1, "head_lr_mult": 10}, "give one"),
        ({"nesterov": True, "optimizer": "adam"}, "--nesterov"),
        # The example drops within the run: `30,60` never dropped in 4 epochs, and warned so.
        (
            {"scheduler": "multistep", "epochs": 4},
            r"needs --milestones \(e\.g\. --milestones 2,3 for a run of 4 epochs\)",
        ),
        ({"crop_scale": (0.9, 0.1)}, "--crop-scale"),
        ({"image_size": 32, "resize_size": 16}, "smaller than --image-size"),
        ({"label_smoothing": 1.0}, "--label-smoothing"),
        ({"mean": (0.1, 0.2)}, "--mean"),
        ({"best_metric": "top5"}, "--best-metric"),
    ],
)
def test_contradictory_options_are_refused(changes, message):
    with pytest.raises(UsageError, match=message):
        validate(TrainConfig(**changes))


def test_resume_keeps_the_saved_options_but_not_a_different_model():
    saved = resolve_defaults(TrainConfig(lr=0.5, epochs=3), is_digits=True).to_dict()
    merged = merge_for_resume(saved, TrainConfig(epochs=9, resume="run"), overrides=None)
    assert (merged.lr, merged.epochs, merged.model, merged.resume) == (0.5, 9, "convnet", "run")
    with pytest.raises(CheckpointError, match="convnet, not resnet18"):
        merge_for_resume(saved, TrainConfig(model="resnet18", resume="run"), overrides=["model"])


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.ln = nn.LayerNorm(4)
        self.head = nn.Linear(4, 2)


def test_no_weight_decay_patterns_as_timm_reads_them_and_what_is_no_name(monkeypatch):
    """no_weight_decay()'s names are fnmatch patterns (`*`: nothing decayed, as in timm; `[`
    opens a character class); what is not a string names nothing, where fnmatch raised."""
    net = _Net()
    monkeypatch.setattr(net, "no_weight_decay", lambda: {"*"}, raising=False)
    assert no_decay_names(net) == {name for name, _ in net.named_parameters()}
    groups = param_groups(net, TrainConfig(lr=0.1, weight_decay=0.01))
    assert [g.name for g in groups] == ["backbone_no_decay", "head_no_decay"]
    monkeypatch.setattr(net, "no_weight_decay", lambda: {"con[vx].weight", 7, "["})
    assert no_decay_names(net) - no_decay_names(_Net()) == {"conv.weight"}


def test_no_weight_decay_on_biases_and_norms_and_head_gets_its_own_lr():
    net = _Net()
    assert no_decay_names(net) == {
        "conv.bias",
        "bn.weight",
        "bn.bias",
        "ln.weight",
        "ln.bias",
        "head.bias",
    }
    groups = {
        g.name: g
        for g in param_groups(net, TrainConfig(lr=0.1, weight_decay=0.01, head_lr_mult=10))
    }
    assert groups["backbone_decay"].names == ["conv.weight"]
    assert groups["backbone_decay"].weight_decay == 0.01
    assert groups["backbone_no_decay"].weight_decay == 0.0
    assert groups["head_decay"].names == ["head.weight"]
    assert groups["head_decay"].lr == pytest.approx(1.0)
    assert groups["backbone_decay"].lr == pytest.approx(0.1)
    everything = param_groups(net, TrainConfig(decay_all=True, backbone_lr=0.01))
    assert all(g.weight_decay == TrainConfig().weight_decay for g in everything)
    assert {g.name: g.lr for g in everything} == {"backbone_decay": 0.01, "head_decay": 3e-3}


def _lrs_of(schedule: LRSchedule, updates: int, per_epoch: int, metrics=None) -> list[float]:
    lrs = []
    for update in range(updates):
        lrs.append(schedule.current_lr())
        schedule.step()
        if metrics is not None and (update + 1) % per_epoch == 0:
            schedule.epoch_end(metrics[(update + 1) // per_epoch - 1])
    return lrs


def _torch_lrs(make, updates: int, per_epoch: int, per_iteration: bool, metrics=None):
    param = nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.1)
    scheduler = make(optimizer)
    lrs = []
    for update in range(updates):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        if per_iteration:
            scheduler.step()
        elif (update + 1) % per_epoch == 0:
            if metrics is not None:
                scheduler.step(metrics[(update + 1) // per_epoch - 1])
            else:
                scheduler.step()
    return lrs


@pytest.mark.parametrize(
    "options, make, per_iteration",
    [
        (
            {"scheduler": "cosine", "min_lr": 0.001},
            lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=24, eta_min=0.001),
            True,
        ),
        (
            {"scheduler": "step", "step_size": 2, "gamma": 0.5},
            lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5),
            False,
        ),
        (
            {"scheduler": "multistep", "milestones": (1, 4)},
            lambda o: torch.optim.lr_scheduler.MultiStepLR(o, milestones=[1, 4], gamma=0.1),
            False,
        ),
        (
            {"scheduler": "exponential", "gamma": 0.8},
            lambda o: torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.8),
            False,
        ),
        (
            {"scheduler": "none"},
            lambda o: torch.optim.lr_scheduler.ConstantLR(o, factor=1.0),
            False,
        ),
    ],
)
def test_schedules_match_torch_schedulers(options, make, per_iteration):
    epochs, per_epoch = 6, 4
    config = TrainConfig(lr=0.1, epochs=epochs, warmup_epochs=0, **options)
    ours = _lrs_of(LRSchedule(_optimizer(0.1), config, per_epoch), epochs * per_epoch, per_epoch)
    reference = _torch_lrs(make, epochs * per_epoch, per_epoch, per_iteration)
    assert ours == pytest.approx(reference, rel=1e-9, abs=1e-12)


def test_cosine_ends_every_group_at_the_same_fraction_of_its_own_lr():
    """--min-lr is where --lr's group ends; the backbone's --backbone-lr ends at the same
    fraction of itself and never rises (timm's and torch's cosine floor every group at the
    absolute lr_min: this backbone would climb from 0.001 to 0.005)."""
    config = TrainConfig(
        lr=0.1, backbone_lr=0.001, min_lr=0.005, scheduler="cosine", epochs=2, warmup_epochs=0
    )
    optimizer = build_optimizer(param_groups(TinyNet(), config), config)
    schedule = LRSchedule(optimizer, config, updates_per_epoch=2)
    seen = []
    for _ in range(5):  # the 4 updates, then the lr after the last
        seen.append({g["group_name"]: g["lr"] for g in optimizer.param_groups})
        schedule.step()
    # 0.005 + (0.1 - 0.005) * (1 + cos(pi * u / 4)) / 2, by hand; the backbone's is 1/100 of it
    head = [0.1, 0.08608757, 0.0525, 0.01891243, 0.005]
    assert [lrs["head_decay"] for lrs in seen] == pytest.approx(head, rel=1e-6)
    assert [lrs["head_no_decay"] for lrs in seen] == pytest.approx(head, rel=1e-6)
    backbone = [lr / 100 for lr in head]
    assert [lrs["backbone_decay"] for lrs in seen] == pytest.approx(backbone, rel=1e-6)
    assert [lrs["backbone_no_decay"] for lrs in seen] == pytest.approx(backbone, rel=1e-6)


def test_plateau_matches_reduce_lr_on_plateau():
    metrics = [0.5, 0.6, 0.6, 0.6, 0.6, 0.55, 0.7, 0.7, 0.7, 0.7]
    config = TrainConfig(lr=0.1, epochs=10, warmup_epochs=0, scheduler="plateau", patience=2)
    ours = _lrs_of(LRSchedule(_optimizer(0.1), config, 3), 30, 3, metrics)
    reference = _torch_lrs(
        lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o, mode="max", patience=2),
        30,
        3,
        False,
        metrics,
    )
    assert ours == pytest.approx(reference)
    assert min(ours) < 0.1  # it did decay


def test_plateau_on_the_loss_matches_reduce_lr_on_plateau_in_min_mode():
    losses = [1.0, 0.9, 0.9, 0.95, 0.9, 0.8, 0.8, 0.8, 0.85, 0.8]
    config = TrainConfig(lr=0.1, epochs=10, warmup_epochs=0, scheduler="plateau", patience=1)
    schedule = LRSchedule(_optimizer(0.1), config, 2)
    ours = []
    for loss in losses:
        ours += [schedule.current_lr()] * 2
        schedule.step()
        schedule.step()
        schedule.epoch_end(loss, higher_is_better=False)
    param = nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.1)
    reference_scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=1)
    reference = []
    for loss in losses:
        reference += [optimizer.param_groups[0]["lr"]] * 2
        reference_scheduler.step(loss)
    assert ours == pytest.approx(reference) and min(ours) < 0.1


def test_warmup_is_linear_per_iteration_then_cosine():
    config = TrainConfig(lr=1.0, epochs=4, warmup_epochs=1, scheduler="cosine")
    lrs = _lrs_of(LRSchedule(_optimizer(1.0), config, 5), 20, 5)
    assert lrs[:5] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    expected = [0.5 * (1 + math.cos(math.pi * t / 15)) for t in range(15)]
    assert lrs[5:] == pytest.approx(expected)


def test_a_schedule_resumed_by_more_processes_goes_on_from_its_epoch():
    """A checkpoint of one process after 2 of 4 epochs (8 updates an epoch), resumed by 2
    ranks (4 updates an epoch): epoch 3 runs at gamma^2, as in the uninterrupted run (before:
    the 16 updates done put the schedule at epoch 5, gamma^4, and the run ended early)."""
    from pathlib import Path

    from torchkit.core.runtime.distributed import DistContext
    from torchkit.core.train.resume import realign_schedule, resume_point

    config = TrainConfig(lr=1.0, epochs=4, warmup_epochs=0, scheduler="step", step_size=1)
    config.gamma = 0.5
    one = LRSchedule(_optimizer(1.0), config, 8)
    for _ in range(16):
        one.step()
    checkpoint = {"epoch": 2, "world_size": 1, "scheduler": one.state_dict()}
    point = resume_point(checkpoint, DistContext(world_size=2), config, Path("last.pt"))
    two = LRSchedule(_optimizer(1.0), config, 4)
    two.load_state_dict(checkpoint["scheduler"])
    realign_schedule(two, point, config)
    assert (two.updates, two.current_lr()) == (8, 0.25)


def _optimizer(lr: float):
    """An optimiser as build_optimizer makes them: each group knows its base lr."""
    return torch.optim.SGD([{"params": [nn.Parameter(torch.zeros(1))], "lr": lr, "base_lr": lr}])


def test_mixup_blends_with_the_reversed_batch():
    images = torch.arange(24.0).reshape(3, 2, 2, 2)
    labels = torch.tensor([0, 1, 2])
    mixed = mixup(images, labels, 0.7)
    assert torch.allclose(mixed.images, 0.7 * images + 0.3 * images.flip(0))
    assert mixed.labels_b.tolist() == [2, 1, 0] and mixed.lam == 0.7


def test_cutmix_pastes_a_box_and_corrects_lam_to_its_area():
    torch.manual_seed(3)
    images = torch.zeros(2, 1, 10, 10)
    images[1] = 1.0
    labels = torch.tensor([0, 1])
    mixed = cutmix(images, labels, 0.75)
    pasted = float(mixed.images[0].sum())  # image 0 got a box of image 1's ones
    assert pasted > 0
    assert mixed.lam == pytest.approx(1 - pasted / 100)
    torch.manual_seed(0)
    assert mix_batch(images, labels, 0.0, 0.0) is None
    assert mix_batch(images, labels, 0.0, 1.0).kind == "cutmix"
    assert mix_batch(images, labels, 0.4, 0.0).kind == "mixup"


def test_ema_follows_the_formula_with_warmup_of_the_decay():
    model = nn.Linear(2, 1)
    ema = ModelEMA(model, decay=0.9)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    for n in range(5):
        with torch.no_grad():
            model.weight.add_(1.0)
        d = min(0.9, (1 + n) / (10 + n))
        ema.update()
        for key, value in model.state_dict().items():
            expected[key] = d * expected[key] + (1 - d) * value
    for key, value in ema.state_dict().items():
        assert torch.allclose(value, expected[key])


def test_epoch_sampler_splits_the_global_batch_over_ranks():
    single = [i for _, i in EpochSampler(12, shuffle=True, seed=5)]
    ranks = [EpochSampler(12, shuffle=True, seed=5, rank=r, world=2) for r in range(2)]
    shards = [[i for _, i in sampler] for sampler in ranks]
    # Global batch j of 2 processes x 3 images == batch j of one process with 6 images.
    for j in range(2):
        assert sorted(shards[0][3 * j : 3 * j + 3] + shards[1][3 * j : 3 * j + 3]) == sorted(
            single[6 * j : 6 * j + 6]
        )
    sampler = EpochSampler(12, shuffle=True, seed=5)
    sampler.set_epoch(1)
    second = [i for _, i in sampler]
    assert second != single and sorted(second) == list(range(12))
    sampler.set_epoch(1, skip=4)
    assert [i for _, i in sampler] == second[4:]
    assert sorted([*ShardSampler(7, 0, 2), *ShardSampler(7, 1, 2)]) == list(range(7))


def test_seeded_dataset_gives_the_same_augmentation_wherever_it_runs():
    class RandomItem:
        def __len__(self):
            return 4

        def __getitem__(self, index):
            return torch.rand(3)

    dataset = SeededDataset(RandomItem(), seed=1)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    first = dataset[(0, 2)]
    assert torch.equal(torch.get_rng_state(), before)  # the main process stream is untouched
    assert torch.equal(dataset[(0, 2)], first)
    assert not torch.equal(dataset[(1, 2)], first)
    assert not torch.equal(dataset[(0, 3)], first)
    assert len({mix_seed(1, e, i) for e in range(50) for i in range(50)}) == 2500


def test_sync_bn_is_refused_on_cpu_warned_for_one_process_and_converts_under_ddp(caplog):
    from torchkit.core.runtime.distributed import DistContext
    from torchkit.core.train.ddp import check_sync_bn, convert_sync_bn

    with pytest.raises(UsageError, match="--sync-bn needs CUDA"):
        check_sync_bn(DistContext(device=torch.device("cpu"), world_size=2), True)
    single_gpu = DistContext(device=torch.device("cuda", 0))
    with caplog.at_level("WARNING", logger="torchkit"):
        assert check_sync_bn(single_gpu, True) is False
    assert "no effect in a single process" in caplog.text
    assert check_sync_bn(DistContext(device=torch.device("cuda", 0), world_size=2), True)
    assert check_sync_bn(DistContext(device=torch.device("cpu")), False) is False
    net = convert_sync_bn(_Net())
    assert isinstance(net.bn, nn.SyncBatchNorm)


def test_curves_stay_readable_with_an_outlier_epoch(tmp_path):
    """One diverging val loss (14.6 among ~0.1) puts the loss on a log axis; epochs are integer
    ticks; the best epoch is marked; the learning rate has its own panel."""
    from matplotlib.ticker import MaxNLocator

    from torchkit.core.train.outputs import curves_figure, write_curves_png

    history = [
        {"epoch": e, "train_loss": 1 / e, "val_loss": 14.6 if e == 3 else 0.1 + 0.01 * e,
         "train_top1": 0.5 + e / 40, "val_top1": 0.6 + e / 50, "lr": 0.1 / e}
        for e in range(1, 13)
    ]  # fmt: skip
    figure = curves_figure(history, best_epoch=7)
    loss_ax, acc_ax, lr_ax = figure.axes
    assert loss_ax.get_yscale() == "log" and acc_ax.get_yscale() == "linear"
    low, high = loss_ax.get_ylim()
    assert low < 0.08 and high > 14.6  # every point visible
    assert lr_ax.get_title().startswith("learning rate")
    for axes in figure.axes:
        assert isinstance(axes.xaxis.get_major_locator(), MaxNLocator)
        assert all(float(t).is_integer() for t in axes.get_xticks())
        assert any(list(line.get_xdata()) == [7, 7] for line in axes.get_lines())  # best epoch
    calm = [{**row, "val_loss": 0.2} for row in history]
    assert curves_figure(calm).axes[0].get_yscale() == "linear"
    write_curves_png(tmp_path / "curves.png", history, 7)
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("name", ["sgd", "adam", "adamw", "rmsprop"])
def test_optimizers_use_fused_steps_on_cpu_with_the_plain_steps_values(name):
    from torchkit.core.models.convnet import convnet_class

    config = TrainConfig(optimizer=name, lr=0.01, weight_decay=0.05, momentum=0.9)
    torch.manual_seed(0)
    model = convnet_class()(10, 3, 12)
    reference = copy.deepcopy(model)
    optimizer = build_optimizer(param_groups(model, config), config)
    assert optimizer.defaults.get("fused") is (True if name != "rmsprop" else None)
    # The reference: torch's plain single-tensor step over the same groups.
    plain_groups = [
        {**{k: v for k, v in group.items() if k != "params"}, "params": list(ref_group)}
        for group, ref_group in zip(
            optimizer.param_groups,
            _same_groups(model, reference, optimizer),
            strict=True,
        )
    ]
    plain_class = type(optimizer)
    kwargs = {"foreach": False, "fused": None} if name != "rmsprop" else {"foreach": False}
    plain = plain_class(plain_groups, **kwargs)
    inputs, labels = torch.randn(16, 3, 12, 12), torch.randint(0, 10, (16,))
    for net, opt in ((model, optimizer), (reference, plain)):
        torch.manual_seed(1)
        for _ in range(5):
            opt.zero_grad()
            nn.functional.cross_entropy(net(inputs), labels).backward()
            opt.step()
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def _same_groups(model, reference, optimizer):
    """The reference model's parameters, grouped as `optimizer` groups `model`'s."""
    by_id = {id(p): q for p, q in zip(model.parameters(), reference.parameters(), strict=True)}
    return [[by_id[id(p)] for p in group["params"]] for group in optimizer.param_groups]


def test_resuming_a_run_recorded_before_decode_existed_decodes_exactly():
    saved = resolve_defaults(TrainConfig(epochs=3), is_digits=True).to_dict()
    saved["decode"] = "fast"  # what a run records (`auto` is resolved when it starts)
    assert merge_for_resume(saved, TrainConfig(resume="run"), overrides=None).decode == "fast"
    del saved["decode"]  # what runs recorded before --decode have
    merged = merge_for_resume(saved, TrainConfig(resume="run"), overrides=None)
    assert merged.decode == "exact"  # what they trained with: a bitwise continuation
    again = merge_for_resume(saved, TrainConfig(decode="fast", resume="run"), overrides=["decode"])
    assert again.decode == "fast"  # asked for on the command line


def test_checkpoint_structure_is_kept_and_cpu_tensors_are_not_copied():
    """`on_cpu` puts a GPU run's checkpoint tensors on the CPU (tested on a GPU in
    test_gpu_training); on a CPU run it copies nothing and keeps every container's type."""
    from torchkit.core.models.checkpoint import on_cpu

    kept = torch.ones(2)
    moved = on_cpu({"a": [kept, (torch.zeros(3), 1)], "b": "x"})
    assert moved["a"][0] is kept and moved["b"] == "x" and moved["a"][1][1] == 1
    assert isinstance(moved["a"][1], tuple) and torch.equal(moved["a"][1][0], torch.zeros(3))


def test_nets_build_and_run():
    x = torch.zeros(2, 3, 8, 8)
    for net in (TinyNet(5), NoisyNet(5), AutocastProbe(5), GatedNet(5)):
        assert net.eval()(x).shape == (2, 5)


@pytest.mark.parametrize(("arch", "size"), [("googlenet", 32), ("inception_v3", 75)])
def test_googlenet_and_inception_train_on_their_main_logits(arch, size):
    """In training mode they returned their auxiliary logits too (a namedtuple the loss
    refused: every googlenet run stopped at its first batch) and Inception's auxiliary head
    failed below about 140 px. It is switched off and frozen, and kept in the state dict."""
    import torchvision

    from torchkit.core.data.preprocessing import Preprocess
    from torchkit.core.train.setup import _build_model

    config = TrainConfig(model=arch, epochs=1)
    model, _, _ = _build_model(
        None, config, arch, ["a", "b"], Preprocess(image_size=size), False, from_checkpoint=False
    )
    model.train()
    logits = model(torch.rand(2, 3, size, size))
    assert isinstance(logits, torch.Tensor) and logits.shape == (2, 2)
    nn.functional.cross_entropy(logits, torch.tensor([0, 1])).backward()
    aux = [name for name, p in model.named_parameters() if name.startswith(("aux", "AuxLogits"))]
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert aux and not trainable & set(aux) and "fc.weight" in trainable
    with torch.device("meta"):  # its names only: no memory, no initialisation
        reference = torchvision.models.get_model(arch, num_classes=2, init_weights=False)
    assert model.state_dict().keys() == reference.state_dict().keys()


def test_a_head_of_tens_of_thousands_of_classes_in_another_order_is_reordered_in_linear_time():
    """Fine-tuning weights that name the data's classes in another order: each class was looked
    for by a scan of the weights' class list, 40,000 classes took about 10 s."""
    import time

    from torchkit.core.train.setup import _order_head_as

    recorded = [f"n{i:08d}" for i in range(40_000)]
    model = nn.Sequential(nn.Flatten(), nn.Linear(1, len(recorded)))
    with torch.no_grad():
        model[1].bias.copy_(torch.arange(len(recorded), dtype=torch.float32))
    # CPU time, which other processes' load does not stretch: linear about 0.06 s, the wall
    # time of that up to 0.4 s under a load of 10 on 2 cores; quadratic about 10 s.
    started = time.process_time()
    _order_head_as(model, recorded, recorded[::-1], "weights.pt")
    assert time.process_time() - started < 2
    assert model[1].bias[:3].tolist() == [39_999.0, 39_998.0, 39_997.0]
