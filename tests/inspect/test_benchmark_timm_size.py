"""`torchkit benchmark timm/NAME` at the input size timm's benchmark.py takes: the test size of
the model's pretrained config where it has one (`resolve_data_config(..., use_test_size=not
--use-train-size)`, for inference and training alike, with or without weights), the train size
where the model is built for one size (`fixed_input_size`, a ViT), `--image-size`/`--input-size`
or a checkpoint's recorded size where given, and a note that says which size ran and why. Other
commands keep the train size. Tiny timm models built offline, one batch of one, no timing."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

timm = pytest.importorskip("timm")

import torch  # noqa: E402
from checkpoints import save_torchkit_checkpoint  # noqa: E402
from timm_hub import tag_with_test_size  # noqa: E402

from torchkit.cli import app  # noqa: E402
from torchkit.core.models import ModelSpec, resolve_spec  # noqa: E402

FAST = ["-b", "1", "--warmup", "0", "--iters", "1", "--device", "cpu", "--format", "json"]
TEST_NOTE = (
    "Note: timm/test_resnet: 192 px, its test size, as timm's benchmark.py takes it; "
    "--image-size 160 for its train size"
)


def benchmark(runner, *args: str) -> tuple[dict, list[str]]:
    """The JSON result and the lines on stderr that are not the random weights' note."""
    result = runner.invoke(app, ["benchmark", *args, *FAST])
    assert result.exit_code == 0, result.stderr
    notes = [line for line in result.stderr.splitlines() if "has random weights" not in line]
    return json.loads(result.stdout), notes


def timm_benchmark_size(model, use_train_size: bool = False) -> list[int]:
    """What timm's benchmark.py times, inference and train alike (`BenchmarkRunner.__init__`):
    `resolve_data_config(kwargs, model=model, use_test_size=not use_train_size)`."""
    from timm.data import resolve_data_config

    config = resolve_data_config({}, model=model, use_test_size=not use_train_size)
    return list(config["input_size"])


def patch_config(monkeypatch, tag: str, **changes) -> None:
    """timm's registered pretrained config `tag` (and its architecture's default, the same
    object) with `changes`, for this test only."""
    from timm.models import get_pretrained_cfg
    from timm.models._registry import _model_pretrained_cfgs

    config = get_pretrained_cfg(tag)  # a copy: the registry's is patched
    changed = replace(config, **changes)
    for name, registered in list(_model_pretrained_cfgs.items()):
        if registered == config:
            monkeypatch.setitem(_model_pretrained_cfgs, name, changed)


@pytest.fixture
def tested_tag(tmp_path, monkeypatch):
    """test_resnet given a 192 px test size beside its 160 px train size, as resnet50's
    default tag has 288 beside 224 (timm_hub.tag_with_test_size); the pretrained model."""
    return tag_with_test_size(tmp_path / "hf", monkeypatch)


@pytest.mark.parametrize("mode", ["infer", "train"])
def test_a_timm_model_without_weights_runs_at_its_test_size_as_timms_benchmark(
    runner, tested_tag, mode
):
    """Before: 160 px (the train size) where benchmark.py times 192 px, and nothing said so."""
    result, notes = benchmark(runner, "timm/test_resnet", "--mode", mode)
    assert result["input_size"] == timm_benchmark_size(tested_tag) == [3, 192, 192]
    assert [row["input_size"] for row in result["results"]] == ["3x192x192"]
    assert [row["mode"] for row in result["results"]] == [mode]
    assert notes == [TEST_NOTE]


def test_timms_own_weights_run_at_the_test_size_too_and_say_so(runner, tested_tag):
    """Before: 192 px already, without the note."""
    result, notes = benchmark(runner, "timm/test_resnet", "--weights", "DEFAULT")
    assert result["input_size"] == [3, 192, 192]
    assert notes == [TEST_NOTE]


def test_a_given_size_replaces_the_test_size_without_a_note(runner, tested_tag):
    """--image-size at the train size is benchmark.py's --use-train-size; the note is only for
    the size benchmark chose."""
    assert timm_benchmark_size(tested_tag, use_train_size=True) == [3, 160, 160]
    result, notes = benchmark(runner, "timm/test_resnet")
    assert result["input_size"] == [3, 192, 192] and notes == [TEST_NOTE]
    for size, side in (
        (["--image-size", "160"], 160),
        (["--input-size", "3,160,160"], 160),
        (["-i", "3,64,64"], 64),
    ):
        result, notes = benchmark(runner, "timm/test_resnet", *size)
        assert result["input_size"] == [3, side, side]
        assert notes == []


def test_a_state_dict_file_runs_at_the_test_size_a_checkpoint_at_its_own(
    runner, tested_tag, tmp_path
):
    """A plain state dict says nothing of the size: benchmark.py's test size (before: 160). A
    torchkit checkpoint records the size it was trained at: that one, as MODEL or as
    --weights, without a note."""
    state = tmp_path / "weights.pth"
    torch.save(tested_tag.state_dict(), state)
    result, notes = benchmark(runner, "timm/test_resnet", "--weights", str(state))
    assert result["input_size"] == [3, 192, 192]
    assert notes == [TEST_NOTE]
    trained = tmp_path / "trained.pt"
    two_classes = timm.create_model("test_resnet", num_classes=2)
    save_torchkit_checkpoint(trained, "timm/test_resnet", two_classes, 96)
    for args in ([str(trained)], ["timm/test_resnet", "--weights", str(trained)]):
        result, notes = benchmark(runner, *args)
        assert result["input_size"] == [3, 96, 96]
        assert notes == []


def test_a_real_timm_config_resnet18_benchmarks_at_288_and_other_commands_at_224():
    """timm's own registry (no patch): resnet18's default tag, a1_in1k, trains at 224 and tests
    at 288. Only benchmark asks the resolver for the test size; train, summary and the others
    keep the train size of a model without timm's weights."""
    spec = ModelSpec(model="timm/resnet18")
    benchmarked = resolve_spec(spec, command="benchmark", timm_test_size=True)
    assert benchmarked.sample_shape == (3, 288, 288)
    assert list(benchmarked.sample_shape) == timm_benchmark_size(benchmarked.model)
    assert benchmarked.timm_size == "test"
    other = resolve_spec(spec, command="summary")
    assert other.sample_shape == (3, 224, 224) and other.preprocess.image_size == 224
    assert other.timm_size == "train"


def test_a_tag_without_a_test_size_runs_at_its_one_size_without_a_note(runner):
    """resnet18.tv_in1k (torchvision's weights) has no test size: 224, as benchmark.py."""
    spec = ModelSpec(model="timm/resnet18.tv_in1k")
    resolved = resolve_spec(spec, command="benchmark", timm_test_size=True)
    assert resolved.sample_shape == (3, 224, 224) and resolved.timm_size is None
    assert list(resolved.sample_shape) == timm_benchmark_size(resolved.model)
    result, notes = benchmark(runner, "timm/test_vit")  # test_vit: one size, 160
    assert result["input_size"] == [3, 160, 160] and notes == []


def test_a_vit_built_for_one_size_keeps_its_train_size_and_runs(runner, monkeypatch):
    """A config with a test size and fixed_input_size (a ViT's position embeddings are made
    for the train size): the train size, which runs, and a note that says why it is not the
    test size benchmark.py would take. Before: no note."""
    patch_config(monkeypatch, "test_vit.r160_in1k", test_input_size=(3, 192, 192))
    model = timm.create_model("test_vit")
    assert model.pretrained_cfg["fixed_input_size"] is True
    assert timm_benchmark_size(model) == [3, 192, 192]
    for mode in ("infer", "train"):
        result, notes = benchmark(runner, "timm/test_vit", "--mode", mode)
        assert result["input_size"] == [3, 160, 160]
        assert notes == [
            "Note: timm/test_vit: 160 px, its train size: it is built for that size alone "
            "(fixed_input_size), where timm's benchmark.py takes its test size (192 px)"
        ]


def test_a_train_size_not_square_is_given_back_as_input_size(runner, monkeypatch):
    patch_config(
        monkeypatch,
        "test_resnet.r160_in1k",
        input_size=(3, 64, 80),
        test_input_size=(3, 96, 96),
    )
    result, notes = benchmark(runner, "timm/test_resnet")
    assert result["input_size"] == [3, 96, 96]
    assert notes == [
        "Note: timm/test_resnet: 96 px, its test size, as timm's benchmark.py takes it; "
        "--input-size 3,64,80 for its train size"
    ]
    result, notes = benchmark(runner, "timm/test_resnet", "--input-size", "3,64,80")
    assert result["input_size"] == [3, 64, 80] and notes == []
