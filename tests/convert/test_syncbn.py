"""BatchNorm <-> SyncBatchNorm conversion (`torchkit.core.convert.syncbn`) and
`torchkit convert-syncbn`."""

from __future__ import annotations

import copy
import io
import json

import pytest
import torch
from output_checks import error_line
from torch import nn

from torchkit.cli import app
from torchkit.core.convert.syncbn import (
    RECORDED_DIM_ATTR,
    checkpoint_uses_sync_bn,
    convert_batchnorm,
    find_batchnorm_layers,
    mark_checkpoint,
)
from torchkit.core.io.errors import InputError, UsageError
from torchkit.core.models.checkpoint import FORMAT_VERSION, save_checkpoint
from torchkit.core.models.random_init import skipped_weight_init


class Block(nn.Module):
    """A BatchNorm one level down, to check that nested children are really replaced."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.norm = nn.Sequential(nn.BatchNorm2d(4, eps=1e-3, momentum=None))

    def forward(self, x):
        return self.norm(self.conv(x))


def mixed_model() -> nn.Module:
    """BatchNorm1d/2d/3d with every flag combination, trained a little so the running
    statistics are not their defaults."""
    torch.manual_seed(0)
    model = nn.Sequential(
        Block(),
        nn.Flatten(),
        nn.Linear(4 * 6 * 6, 6),
        nn.BatchNorm1d(6, affine=False),
        nn.Unflatten(1, (6, 1, 1, 1)),
        nn.BatchNorm3d(6, momentum=0.3, track_running_stats=False),
        nn.Flatten(),
        nn.BatchNorm1d(6),
    )
    model.train()
    for _ in range(3):
        model(torch.randn(8, 3, 8, 8))
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.affine:
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.5, 0.5)
    model[-1].weight.requires_grad_(False)  # a frozen layer must stay frozen
    model.eval()
    model[0].train()  # mixed modes must be kept as they are
    return model


def batchnorm_dims(model: nn.Module) -> list[str]:
    return [type(m).__name__ for m in model.modules() if "BatchNorm" in type(m).__name__]


def test_to_sync_keeps_every_value_flag_and_output():
    model = mixed_model()
    x = torch.randn(5, 3, 8, 8)
    reference = copy.deepcopy(model).eval()(x)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    modes = [m.training for m in model.modules()]
    old_params = list(model.parameters())
    group = object()  # stands for a process group: it must be handed to every layer

    converted, rows = convert_batchnorm(model, to="sync", process_group=group)

    assert converted is model
    assert batchnorm_dims(converted) == ["SyncBatchNorm"] * 4
    assert [row["from_type"] for row in rows] == [
        "BatchNorm2d",
        "BatchNorm1d",
        "BatchNorm3d",
        "BatchNorm1d",
    ]
    assert [row["name"] for row in rows] == ["0.norm.0", "3", "5", "7"]
    assert rows[1] == {
        "name": "3",
        "from_type": "BatchNorm1d",
        "to_type": "SyncBatchNorm",
        "num_features": 6,
        "affine": False,
        "track_running_stats": True,
        "dim_source": None,
    }
    after = converted.state_dict()
    assert list(after) == list(before)
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert after["0.norm.0.num_batches_tracked"].item() == 3
    # the very same Parameter objects: an optimizer built before still points at them
    assert all(a is b for a, b in zip(converted.parameters(), old_params, strict=True))
    assert [m.training for m in converted.modules()] == modes
    assert converted[-1].weight.requires_grad is False
    assert converted[0].norm[0].momentum is None and converted[0].norm[0].eps == 1e-3
    assert converted[5].momentum == 0.3 and converted[5].running_mean is None
    assert all(m.process_group is group for m in converted.modules() if hasattr(m, "process_group"))
    converted.eval()
    assert torch.equal(converted(x), reference)


def test_revert_restores_the_original_types_values_and_outputs():
    original = mixed_model()
    x = torch.randn(5, 3, 8, 8)
    expected = copy.deepcopy(original).eval()(x)
    modes = [m.training for m in original.modules()]
    synced, _ = convert_batchnorm(copy.deepcopy(original), to="sync")

    reverted, rows = convert_batchnorm(synced, to="bn")

    assert batchnorm_dims(reverted) == batchnorm_dims(original)
    assert {row["dim_source"] for row in rows} == {"recorded at conversion"}
    assert [m.training for m in reverted.modules()] == modes
    state, reference = reverted.state_dict(), original.state_dict()
    assert list(state) == list(reference)
    assert all(torch.equal(state[k], reference[k]) for k in reference)
    assert reverted[-1].weight.requires_grad is False
    assert torch.equal(reverted.eval()(x), expected)


def test_sync_layer_trains_like_batchnorm_without_a_process_group():
    """On one process SyncBatchNorm falls back to batch_norm: a training step must update the
    running statistics exactly as BatchNorm does."""
    torch.manual_seed(1)
    plain = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train()
    synced, _ = convert_batchnorm(copy.deepcopy(plain), to="sync")
    x = torch.randn(4, 3, 6, 6)
    assert torch.equal(synced(x), plain(x))
    assert torch.equal(synced[1].running_var, plain[1].running_var)
    assert synced[1].num_batches_tracked.item() == 1


def test_recorded_dimensionality_survives_pickling_and_deepcopy():
    synced, _ = convert_batchnorm(nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)))
    buffer = io.BytesIO()
    torch.save(synced, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert getattr(loaded[1], RECORDED_DIM_ATTR) == 1
    assert getattr(copy.deepcopy(synced)[1], RECORDED_DIM_ATTR) == 1
    assert type(convert_batchnorm(loaded, to="bn")[0][1]) is nn.BatchNorm1d


def test_root_batchnorm_and_shared_layers():
    bn = nn.BatchNorm2d(3)
    converted, rows = convert_batchnorm(bn)
    assert isinstance(converted, nn.SyncBatchNorm) and rows[0]["name"] == "(model)"
    assert converted.weight is bn.weight

    shared = nn.BatchNorm1d(4)
    model = nn.Module()
    model.a = nn.Sequential(nn.Linear(4, 4), shared)
    model.b = nn.Sequential(shared)
    converted, rows = convert_batchnorm(model)
    assert len(rows) == 1  # one layer, held by two parents
    assert converted.a[1] is converted.b[0]
    assert isinstance(converted.b[0], nn.SyncBatchNorm)


def test_revert_without_record_uses_the_input_or_the_neighbouring_layer():
    # Made with SyncBatchNorm directly: nothing recorded.
    model = nn.Sequential(
        nn.Conv1d(2, 4, 3), nn.SyncBatchNorm(4), nn.Flatten(), nn.Linear(8, 3), nn.SyncBatchNorm(3)
    )
    reverted, rows = convert_batchnorm(model, to="bn")
    assert batchnorm_dims(reverted) == ["BatchNorm1d", "BatchNorm1d"]
    assert rows[0]["dim_source"] == "like 0 (Conv1d)"

    volume = nn.Sequential(nn.SyncBatchNorm(2), nn.Identity())
    volume.train()
    reverted, rows = convert_batchnorm(
        volume, to="bn", example_inputs=(torch.randn(2, 2, 3, 3, 3),)
    )
    assert type(reverted[0]) is nn.BatchNorm3d and rows[0]["dim_source"] == "5-D input"
    assert reverted.training and reverted[0].training  # the forward pass did not change modes
    assert reverted[0].num_batches_tracked.item() == 0  # nor the statistics

    with pytest.raises(UsageError, match="BatchNorm1d, 2d or 3d"):
        convert_batchnorm(nn.Sequential(nn.SyncBatchNorm(2), nn.ReLU()), to="bn")


def test_a_batchnorm_after_pooling_and_flatten_is_reverted_to_batchnorm1d():
    """A classifier head (pool, flatten, BatchNorm1d) converted elsewhere: the flattened layer
    was taken for a BatchNorm2d like the pooling before it, a model that failed on its first
    input ("expected 4D input (got 2D input)")."""
    head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.BatchNorm1d(4), nn.Linear(4, 2))
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), head).eval()
    x = torch.randn(2, 3, 5, 5)
    expected = model(x)
    synced = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # records nothing
    reverted, rows = convert_batchnorm(synced, to="bn")
    assert batchnorm_dims(reverted) == ["BatchNorm2d", "BatchNorm1d"]
    assert rows[1]["dim_source"] == "like 2.1 (Flatten)"
    assert torch.equal(reverted(x), expected)


def test_bad_target_and_lazy_layers_are_usage_errors():
    with pytest.raises(UsageError, match="unknown conversion target"):
        convert_batchnorm(nn.BatchNorm1d(2), to="batchnorm")
    with pytest.raises(UsageError, match="lazy BatchNorm"):
        convert_batchnorm(nn.Sequential(nn.LazyBatchNorm2d()))


def pruned_model() -> nn.Module:
    """tiny_pickled_model with its BatchNorm weight pruned: the layer holds `weight_orig`
    and a mask, and a hook makes `weight` from them."""
    from torch.nn.utils import prune

    model = tiny_pickled_model()
    prune.l1_unstructured(model[1], "weight", amount=0.5)
    with torch.no_grad():  # a leaf, so the model pickles
        model[1].weight = model[1].weight_orig * model[1].weight_mask
    return model


class Positive(nn.Module):
    def forward(self, weight):
        return weight.abs()


def test_a_pruned_or_parametrized_weight_is_refused_and_the_model_left_alone():
    """The new layer kept an empty meta-device `weight` beside `weight_orig` (or the
    parametrization): the converted model failed at its first forward pass."""
    from torch.nn.utils import parametrize

    parametrized = tiny_pickled_model()
    parametrize.register_parametrization(parametrized[1], "weight", Positive())
    for model in (pruned_model(), parametrized):
        before = [type(m) for m in model.modules()]
        with pytest.raises(InputError, match=r"layer 1 \(.*BatchNorm2d\) has no weight of its own"):
            convert_batchnorm(model)
        assert [type(m) for m in model.modules()] == before
        assert all(t.device.type == "cpu" for t in model.state_dict().values())
    synced = convert_batchnorm(tiny_pickled_model())[0]
    parametrize.register_parametrization(synced[1], "weight", Positive())
    with pytest.raises(InputError, match="no weight of its own"):
        convert_batchnorm(synced, to="bn")


def test_find_and_mark():
    model = mixed_model()
    assert [r["type"] for r in find_batchnorm_layers(model)] == batchnorm_dims(model)
    assert find_batchnorm_layers(model, sync=True) == []
    checkpoint = {"config": {"lr": 0.1}, "model": {}}
    marked = mark_checkpoint(checkpoint, sync=True)
    assert checkpoint_uses_sync_bn(marked) and not checkpoint_uses_sync_bn(checkpoint)
    assert checkpoint == {"config": {"lr": 0.1}, "model": {}}  # the input is not modified
    assert marked["config"] == {"lr": 0.1, "sync_bn": True}


# --- the command -----------------------------------------------------------------------------


def tiny_pickled_model() -> nn.Module:
    """Standard layers only, so the pickle loads anywhere."""
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(16, 5)
    )
    model.train()
    model(torch.randn(4, 3, 4, 4))
    return model.eval()


# A torchvision model with many BatchNorm layers and few weights (56 layers, 0.3 M parameters):
# resnet18's 11 M took about a second to write, read and compare in the checkpoint tests.
BN_ARCH, BN_LAYERS = "shufflenet_v2_x0_5", 56


@pytest.fixture(scope="module")
def bn_checkpoint(tmp_path_factory):
    import torchvision

    torch.manual_seed(0)
    model = getattr(torchvision.models, BN_ARCH)(num_classes=3)
    path = tmp_path_factory.mktemp("ckpt") / "best.pt"
    save_checkpoint(
        {
            "format_version": FORMAT_VERSION,
            "torchkit_version": "0.1.0",
            "arch": BN_ARCH,
            "num_classes": 3,
            "classes": ["a", "b", "c"],
            "model": model.state_dict(),
            "epoch": 4,
            "config": {"lr": 0.1},
            "preprocess": {"image_size": 32, "in_channels": 3},
        },
        path,
    )
    return path


def test_report_lists_every_batchnorm_of_a_named_model(runner):
    import torchvision

    result = runner.invoke(app, ["convert-syncbn", BN_ARCH, "--format", "json"])
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    with skipped_weight_init():  # only the layers' names are read
        reference = getattr(torchvision.models, BN_ARCH)()
    expected = [name for name, m in reference.named_modules() if isinstance(m, nn.BatchNorm2d)]
    assert report["count"] == len(expected) == BN_LAYERS
    assert [row["name"] for row in report["layers"]] == expected
    assert set(report["layers"][0]) == {
        "name",
        "type",
        "num_features",
        "affine",
        "track_running_stats",
    }
    table = runner.invoke(app, ["convert-syncbn", BN_ARCH])
    assert f"{BN_LAYERS} BatchNorm layers of {BN_ARCH} would become SyncBatchNorm" in table.stdout
    assert "stage4.3.branch2.6" in table.stdout


def test_checkpoint_is_marked_and_keeps_its_weights(runner, bn_checkpoint, tmp_path):
    source_bytes = bn_checkpoint.read_bytes()
    destination = tmp_path / "sync.pt"
    result = runner.invoke(
        app, ["convert-syncbn", str(bn_checkpoint), str(destination), "--format", "json"]
    )
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["kind"] == "torchkit checkpoint" and report["count"] == BN_LAYERS
    assert bn_checkpoint.read_bytes() == source_bytes  # the input is never modified
    original = torch.load(bn_checkpoint, weights_only=True)
    converted = torch.load(destination, weights_only=True)
    assert converted["config"] == {"lr": 0.1, "sync_bn": True}
    assert converted["epoch"] == 4 and converted["classes"] == ["a", "b", "c"]
    assert all(torch.equal(converted["model"][k], v) for k, v in original["model"].items())

    again = runner.invoke(app, ["convert-syncbn", str(bn_checkpoint), str(destination)])
    assert again.exit_code == 1
    assert again.stderr.startswith("Error: DST already exists") and "--force" in again.stderr

    back = tmp_path / "back.pt"
    reverted = runner.invoke(
        app, ["convert-syncbn", str(destination), str(back), "--revert", "--format", "json"]
    )
    assert reverted.exit_code == 0, reverted.stderr
    assert json.loads(reverted.stdout)["layers"][0]["to_type"] == "BatchNorm2d"
    assert torch.load(back, weights_only=True)["config"]["sync_bn"] is False

    # the report of a marked checkpoint lists the SyncBatchNorm layers --revert would undo
    report = runner.invoke(
        app, ["convert-syncbn", str(destination), "--revert", "--format", "json"]
    )
    assert json.loads(report.stdout)["count"] == BN_LAYERS
    assert json.loads(report.stdout)["marked_sync_bn"] is True


def test_a_checkpoint_that_already_is_what_was_asked_converts_nothing(
    runner, bn_checkpoint, tmp_path
):
    # Reverting a checkpoint never converted listed all its layers as SyncBatchNorm -> BatchNorm2d
    # "recorded at conversion", and converting a marked one listed them again.
    unmarked = runner.invoke(
        app,
        ["convert-syncbn", str(bn_checkpoint), str(tmp_path / "bn.pt"), "--revert"]
        + ["--format", "json"],
    )
    assert unmarked.exit_code == 0, unmarked.stderr
    assert json.loads(unmarked.stdout)["count"] == 0
    assert "is not marked for SyncBatchNorm" in unmarked.stderr
    synced = tmp_path / "sync.pt"
    save_checkpoint(mark_checkpoint(torch.load(bn_checkpoint), sync=True), synced)
    again = runner.invoke(
        app, ["convert-syncbn", str(synced), str(tmp_path / "again.pt"), "--format", "json"]
    )
    assert again.exit_code == 0, again.stderr
    assert json.loads(again.stdout)["count"] == 0
    assert "is already marked for SyncBatchNorm: nothing was converted" in again.stderr
    listed = runner.invoke(app, ["convert-syncbn", str(synced), "--format", "json"])
    assert listed.exit_code == 0, listed.stderr
    assert json.loads(listed.stdout)["count"] == 0  # the report agrees: none would be converted


def test_a_checkpoint_without_batchnorm_is_not_marked(runner, tmp_path):
    """ "has no BatchNorm layers: nothing was converted", yet DST was marked for SyncBatchNorm,
    and `train --resume DST` on a CPU refused it as "trained with --sync-bn"."""
    from checkpoints import read_checkpoint, write_convnet_checkpoint

    source, destination = tmp_path / "convnet.pt", tmp_path / "sync.pt"
    write_convnet_checkpoint(source, in_channels=3, image_size=8, classes="ab")
    result = runner.invoke(
        app, ["convert-syncbn", str(source), str(destination), "--format", "json"]
    )
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["count"] == 0
    assert "has no BatchNorm layers: nothing was converted" in result.stderr
    assert not checkpoint_uses_sync_bn(read_checkpoint(destination))


@pytest.mark.parametrize("revert", [False, True], ids=["converted-twice", "revert-plain"])
def test_a_pickled_model_already_as_asked_is_written_as_it_is_with_a_warning(
    runner, tmp_path, revert
):
    """Converting a converted model (or reverting a plain one) said it "has no BatchNorm
    layers", of a model full of SyncBatchNorm layers."""
    model = tiny_pickled_model()
    if not revert:
        model, _ = convert_batchnorm(model)
    source, destination = tmp_path / "net.pt", tmp_path / "out.pt"
    torch.save(model, source)
    command = ["convert-syncbn", str(source), str(destination), "--trust-checkpoint"]

    result = runner.invoke(app, [*command, *(["--revert"] if revert else []), "--format", "json"])

    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["count"] == 0
    have, lack = ("BatchNorm", "SyncBatchNorm") if revert else ("SyncBatchNorm", "BatchNorm")
    assert result.stderr.splitlines()[0] == (
        f"Warning: {source} holds {have} layers already (1) and no {lack} layer: nothing was "
        "converted"
    )
    written = torch.load(destination, weights_only=False)
    assert type(written[1]) is type(model[1])
    x = torch.randn(2, 3, 4, 4)
    assert torch.equal(written(x), model(x))


def test_pickled_model_is_converted_and_reverted(runner, tmp_path):
    model = tiny_pickled_model()
    x = torch.randn(2, 3, 4, 4)
    expected = model(x)
    source, synced, back = tmp_path / "net.pt", tmp_path / "sync.pt", tmp_path / "back.pt"
    torch.save(model, source)

    refused = runner.invoke(app, ["convert-syncbn", str(source), str(synced)])
    assert refused.exit_code == 1 and "--trust-checkpoint" in refused.stderr
    assert not synced.exists()

    result = runner.invoke(app, ["convert-syncbn", str(source), str(synced), "--trust-checkpoint"])
    assert result.exit_code == 0, result.stderr
    assert "1 layers converted to SyncBatchNorm" in result.stdout
    loaded = torch.load(synced, weights_only=False)
    assert isinstance(loaded[1], nn.SyncBatchNorm)
    assert torch.equal(loaded.eval()(x), expected)

    result = runner.invoke(
        app,
        [
            "convert-syncbn",
            str(synced),
            str(back),
            "--trust-checkpoint",
            "--revert",
            "-o",
            str(tmp_path / "report.csv"),
            "--format",
            "csv",
        ],
    )
    assert result.exit_code == 0, result.stderr
    csv_lines = (tmp_path / "report.csv").read_text().splitlines()
    assert csv_lines[0].split(",")[-1] == "dim_source"
    assert csv_lines[1].startswith("1,SyncBatchNorm,BatchNorm2d,4,")
    restored = torch.load(back, weights_only=False)
    assert type(restored[1]) is nn.BatchNorm2d
    assert torch.equal(restored.eval()(x), expected)
    state, reference = restored.state_dict(), model.state_dict()
    assert all(torch.equal(state[k], reference[k]) for k in reference)


def test_a_pruned_pickled_model_is_refused_and_nothing_written(runner, tmp_path):
    source, synced = tmp_path / "pruned.pt", tmp_path / "sync.pt"
    torch.save(pruned_model(), source)
    result = runner.invoke(app, ["convert-syncbn", str(source), str(synced), "--trust-checkpoint"])
    assert result.exit_code == 1
    assert error_line(result.stderr).startswith(
        "Error: layer 1 (BatchNorm2d) has no weight of its own (pruned or parametrized"
    )
    assert error_line(result.stderr).endswith(
        "(make it permanent first with torch.nn.utils.prune.remove or "
        "torch.nn.utils.parametrize.remove_parametrizations, then convert)"
    )
    assert not synced.exists()


def test_pickled_sync_model_without_record_needs_an_input_size(runner, tmp_path):
    model = nn.Sequential(nn.SyncBatchNorm(3), nn.Flatten())
    source = tmp_path / "net.pt"
    torch.save(model, source)
    args = [
        "convert-syncbn",
        str(source),
        str(tmp_path / "bn.pt"),
        "--trust-checkpoint",
        "--revert",
    ]
    failed = runner.invoke(app, args)
    assert failed.exit_code == 2 and "--input-size" in failed.stderr
    worked = runner.invoke(app, [*args, "--input-size", "3,4,4", "--format", "json"])
    assert worked.exit_code == 0, worked.stderr
    assert json.loads(worked.stdout)["layers"][0]["to_type"] == "BatchNorm2d"


def test_an_input_size_reaches_a_layer_without_running_statistics(runner, tmp_path):
    """One sample of --input-size was run: a SyncBatchNorm without running statistics (it
    normalises with the batch's own) refused one value per channel, and the revert failed."""
    model = nn.Sequential(nn.Linear(4, 6), nn.SyncBatchNorm(6, track_running_stats=False))
    source, reverted = tmp_path / "net.pt", tmp_path / "bn.pt"
    torch.save(model, source)
    args = [str(source), str(reverted), "--trust-checkpoint", "--revert", "--format", "json"]
    result = runner.invoke(app, ["convert-syncbn", *args, "--input-size", "4"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["layers"][0]["dim_source"] == "2-D input"
    assert type(torch.load(reverted, weights_only=False)[1]) is nn.BatchNorm1d


NOTHING_TO_CONVERT = (
    "holds a plain state dict: BatchNorm and SyncBatchNorm have the same keys, so there is "
    "nothing to convert (load it into either model as it is; convert a torchkit checkpoint or "
    "a pickled model instead)"
)


def lightning_style(model: nn.Module) -> dict:
    """What a Lightning module wrapping `model` as self.model saves."""
    weights = {f"model.{key}": value for key, value in model.state_dict().items()}
    return {"state_dict": weights, "epoch": 3, "global_step": 30}


@pytest.mark.parametrize(
    ("make", "code", "message"),
    [
        (lambda p: torch.save(nn.Linear(2, 2).state_dict(), p), 1, NOTHING_TO_CONVERT),
        (lambda p: torch.save(lightning_style(nn.Linear(2, 2)), p), 1, NOTHING_TO_CONVERT),
        (lambda p: p.write_bytes(b""), 1, "checkpoint is empty"),
        (lambda p: p.write_bytes(b"PK\x03\x04 not really a zip"), 1, "cannot read checkpoint"),
        (lambda p: None, 1, "model file not found"),
    ],
)
def test_bad_sources_are_one_line_errors(runner, tmp_path, make, code, message):
    source = tmp_path / "in.pt"
    make(source)
    result = runner.invoke(app, ["convert-syncbn", str(source), str(tmp_path / "out.pt")])
    assert result.exit_code == code
    assert result.stderr.startswith("Error: ") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out.pt").exists()


@pytest.mark.parametrize("wrap", [lambda model: model.state_dict(), lightning_style])
def test_a_report_of_plain_weights_says_to_name_their_architecture(runner, tmp_path, wrap):
    source = tmp_path / "weights.pt"
    torch.save(wrap(nn.Linear(2, 2)), source)
    result = runner.invoke(app, ["convert-syncbn", str(source)])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"Error: {source} holds plain weights (a state dict), not the architecture they belong "
        f"to (name the architecture they belong to: MODEL --weights {source})"
    )


def test_destination_cannot_be_the_source(runner, bn_checkpoint):
    path = str(bn_checkpoint)
    before = bn_checkpoint.read_bytes()
    result = runner.invoke(app, ["convert-syncbn", path, path, "--force"])
    assert result.exit_code == 1 and "is the model file" in result.stderr
    assert bn_checkpoint.read_bytes() == before


@pytest.mark.parametrize("name", ["out.safetensors", "out.txt", "out"])
def test_a_destination_it_cannot_write_is_a_usage_error(runner, bn_checkpoint, name):
    """Before: a torch pickle was written under any name, `.safetensors` included."""
    destination = bn_checkpoint.parent / name
    result = runner.invoke(app, ["convert-syncbn", str(bn_checkpoint), str(destination)])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"Error: cannot tell the output format from {name!r} (end DST with .pt, .pth, .ckpt or "
        ".bin: convert-syncbn writes a torch file; `torchkit convert checkpoint` makes "
        "safetensors of it)"
    )
    assert not destination.exists()


def test_a_model_name_with_a_destination_says_what_dst_needs(runner, tmp_path):
    """Before: "model file not found: resnet18 (check the path)", where the rule is that SRC
    DST converts a saved file and a name alone lists its layers."""
    result = runner.invoke(app, ["convert-syncbn", "resnet18", str(tmp_path / "out.pt")])
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        "Error: model file not found: resnet18 (SRC DST converts a saved checkpoint or model; "
        "for a model name, leave out DST to list the layers it would convert)"
    )
    assert not (tmp_path / "out.pt").exists()


def test_unknown_model_name(runner):
    result = runner.invoke(app, ["convert-syncbn", "resnet19"])
    assert result.exit_code == 2 and "unknown model 'resnet19'" in result.stderr


def test_image_size_is_the_sample_3_n_n_and_not_with_input_size(runner, tmp_path):
    model = nn.Sequential(nn.SyncBatchNorm(3), nn.Flatten())
    source = tmp_path / "net.pt"
    torch.save(model, source)
    args = [
        "convert-syncbn",
        str(source),
        str(tmp_path / "bn.pt"),
        "--trust-checkpoint",
        "--revert",
    ]
    worked = runner.invoke(app, [*args, "--image-size", "4", "--format", "json"])
    assert worked.exit_code == 0, worked.stderr
    assert json.loads(worked.stdout)["layers"][0]["to_type"] == "BatchNorm2d"
    both = runner.invoke(app, [*args, "--image-size", "4", "--input-size", "3,4,4", "--force"])
    assert both.exit_code == 2 and "both give the sample" in both.stderr


@pytest.mark.parametrize("sample", [["--input-size", "3,32,32"], ["--image-size", "32"]])
def test_a_sample_without_revert_is_refused_not_ignored(runner, bn_checkpoint, tmp_path, sample):
    """Converting to SyncBatchNorm takes no sample: the option would silently do nothing."""
    destination = tmp_path / "sync.pt"
    result = runner.invoke(app, ["convert-syncbn", str(bn_checkpoint), str(destination), *sample])
    assert result.exit_code == 2, result.stderr
    assert "goes with SRC DST --revert" in result.stderr
    assert not destination.exists()


def test_every_module_of_a_pickled_dict_is_converted(runner, tmp_path):
    """{'model': net, 'model_ema': ema}: the EMA copy was left with BatchNorm while the file
    was reported as converted."""
    torch.manual_seed(0)
    net, ema = tiny_pickled_model(), tiny_pickled_model()
    source, synced, back = tmp_path / "both.pt", tmp_path / "sync.pt", tmp_path / "back.pt"
    torch.save({"model": net, "model_ema": ema, "epoch": 3}, source)
    args = ["--trust-checkpoint", "--format", "json"]
    result = runner.invoke(app, ["convert-syncbn", str(source), str(synced), *args])
    assert result.exit_code == 0, result.stderr
    names = [row["name"] for row in json.loads(result.stdout)["layers"]]
    per_model = [name for name, m in net.named_modules() if isinstance(m, nn.BatchNorm2d)]
    assert names == [f"{key}.{name}" for key in ("model", "model_ema") for name in per_model]
    converted = torch.load(synced, weights_only=False)
    assert converted["epoch"] == 3
    for key in ("model", "model_ema"):
        types = {type(m) for m in converted[key].modules()}
        assert nn.SyncBatchNorm in types and nn.BatchNorm2d not in types
    reverted = runner.invoke(app, ["convert-syncbn", str(synced), str(back), "--revert", *args])
    assert reverted.exit_code == 0, reverted.stderr
    x = torch.randn(2, 3, 4, 4)
    restored = torch.load(back, weights_only=False)
    with torch.no_grad():
        assert torch.equal(restored["model"].eval()(x), net.eval()(x))
        assert torch.equal(restored["model_ema"].eval()(x), ema.eval()(x))


def test_a_pickled_dict_of_modules_sharing_layers_is_listed_and_converted_alike(runner, tmp_path):
    """Without DST the report listed the first module's layers alone, while SRC DST converted
    the EMA copy's too; and a BatchNorm both modules hold became two SyncBatchNorm layers, listed
    twice. Now a shared layer is listed and converted once, and stays shared."""
    torch.manual_seed(0)
    net = tiny_pickled_model()
    ema = nn.Sequential(nn.Conv2d(3, 4, 3), *net[1:], nn.BatchNorm1d(5))  # net[1] serves both
    source, synced = tmp_path / "both.pt", tmp_path / "sync.pt"
    torch.save({"model": net, "model_ema": ema, "epoch": 3}, source)
    args = ["--trust-checkpoint", "--format", "json"]
    report = runner.invoke(app, ["convert-syncbn", str(source), *args])
    assert report.exit_code == 0, report.stderr
    converted = runner.invoke(app, ["convert-syncbn", str(source), str(synced), *args])
    assert converted.exit_code == 0, converted.stderr
    listed = [row["name"] for row in json.loads(report.stdout)["layers"]]
    assert listed == [row["name"] for row in json.loads(converted.stdout)["layers"]]
    assert listed == ["model.1", "model_ema.5"]
    written = torch.load(synced, weights_only=False)
    assert isinstance(written["model"][1], nn.SyncBatchNorm)
    assert written["model"][1] is written["model_ema"][1]


UNPICKLED: list[str] = []


class CountsItsUnpickling(nn.Identity):
    """A layer that notes each time a pickle of it is loaded: the code a trusted pickle runs."""

    def __setstate__(self, state):
        UNPICKLED.append(type(self).__name__)
        super().__setstate__(state)


@pytest.mark.parametrize(
    "wrap", [lambda net: net, lambda net: {"model": net, "epoch": 3}], ids=["module", "dict"]
)
@pytest.mark.parametrize("with_destination", [False, True], ids=["list", "convert"])
def test_a_pickled_model_is_unpickled_once_per_command(runner, tmp_path, wrap, with_destination):
    """Listing the layers of a pickled model read the file twice (the model, then the modules
    it holds): twice the load time, and the unpickling code --trust-checkpoint allowed ran
    twice. Each command now unpickles SRC once."""
    source, synced = tmp_path / "net.pt", tmp_path / "sync.pt"
    torch.save(wrap(nn.Sequential(*tiny_pickled_model(), CountsItsUnpickling())), source)
    UNPICKLED.clear()
    args = [str(source), *([str(synced)] if with_destination else []), "--format", "json"]
    result = runner.invoke(app, ["convert-syncbn", *args, "--trust-checkpoint"])
    assert result.exit_code == 0, result.stderr
    assert [row["name"] for row in json.loads(result.stdout)["layers"]] == ["1"]
    assert UNPICKLED == ["CountsItsUnpickling"]


def test_the_page_names_every_key_of_both_reports(runner, bn_checkpoint, tmp_path):
    """docs/commands/convert-syncbn.md names each key of the JSON report, listing and
    converting, and of its rows: a script reads them from the page."""
    from suite_paths import REPO

    page = (REPO / "docs" / "commands" / "convert-syncbn.md").read_text(encoding="utf-8")
    listing = runner.invoke(app, ["convert-syncbn", str(bn_checkpoint), "--format", "json"])
    destination = tmp_path / "sync.pt"
    converting = runner.invoke(
        app, ["convert-syncbn", str(bn_checkpoint), str(destination), "--format", "json"]
    )
    keys = set()
    for result in (listing, converting):
        assert result.exit_code == 0, result.stderr
        report = json.loads(result.stdout)
        keys |= set(report) | set(report["layers"][0])
    assert {"marked_sync_bn", "destination", "from_type"} <= keys
    assert {key for key in keys if f"`{key}`" not in page} == set()
