"""Checkpoint averaging: the mean NumPy computes, integer buffers from the last checkpoint, a
torchkit checkpoint that eval reads, and one clear error for mismatched inputs."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from torchkit.core.convert.averaging import average_checkpoints
from torchkit.core.io.errors import CheckpointError, UsageError
from torchkit.core.models.checkpoint import FORMAT_VERSION, save_checkpoint
from torchkit.core.models.convnet import convnet_class


def checkpoints(tmp_path, count: int = 3, arch: str = "convnet") -> list:
    paths = []
    for seed in range(count):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
        if arch == "convnet":
            model = convnet_class()(3, 3, 12)
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.num_batches_tracked += 10 * (seed + 1)
        path = tmp_path / f"epoch-{seed:03d}.pt"
        save_checkpoint(
            {
                "format_version": FORMAT_VERSION,
                "arch": arch,
                "num_classes": 3,
                "classes": ["a", "b", "c"],
                "model": model.state_dict(),
                "optimizer": {"state": {}},
                "epoch": seed + 1,
                "preprocess": {"image_size": 12, "resize_size": 12},
            },
            path,
        )
        paths.append(path)
    return paths


def test_the_average_is_numpys_mean_and_integers_come_from_the_last(tmp_path):
    paths = checkpoints(tmp_path)
    result = average_checkpoints(paths)
    states = [torch.load(p, weights_only=True)["model"] for p in paths]
    for key, value in result["model"].items():
        if value.is_floating_point():
            expected = np.mean([s[key].double().numpy() for s in states], axis=0)
            np.testing.assert_allclose(value.numpy(), expected.astype(np.float32), rtol=1e-6)
            assert value.dtype == states[0][key].dtype
        else:
            assert torch.equal(value, states[-1][key])
    assert result["arch"] == "convnet" and result["epoch"] == 3
    assert "optimizer" not in result and result["averaged_from"] == [p.name for p in paths]


def test_the_averaged_checkpoint_evaluates(tmp_path, runner, make_image_folder):
    from torchkit.cli import app

    out = tmp_path / "averaged.pt"
    save_checkpoint(average_checkpoints(checkpoints(tmp_path)), out)
    data = make_image_folder(tmp_path / "data", {"a": 2, "b": 2, "c": 2}, size=12)
    result = runner.invoke(app, ["eval", str(out), "--data", str(data), "-j", "0"])
    assert result.exit_code == 0, result.stderr


def test_mismatches_are_clear_errors(tmp_path):
    paths = checkpoints(tmp_path, 2)
    (tmp_path / "other").mkdir()
    other = checkpoints(tmp_path / "other", 1, arch="other")
    with pytest.raises(UsageError, match="at least two"):
        average_checkpoints(paths[:1])
    with pytest.raises(UsageError, match="given twice"):
        average_checkpoints([paths[0], paths[0]])
    os.link(paths[0], tmp_path / "linked.pt")  # one file, two names: it weighed twice
    with pytest.raises(UsageError, match="given twice: .*epoch.* and .*linked.pt are one file"):
        average_checkpoints([paths[0], paths[1], tmp_path / "linked.pt"])
    with pytest.raises(CheckpointError, match="different architectures"):
        average_checkpoints([paths[0], other[0]])
    plain = tmp_path / "plain.pt"
    torch.save(torch.load(paths[0], weights_only=True)["model"], plain)
    with pytest.raises(CheckpointError, match="mixed"):
        average_checkpoints([paths[0], plain])
    shrunk = tmp_path / "shrunk.pt"
    state = torch.load(paths[1], weights_only=True)["model"]
    key = next(k for k, v in state.items() if v.ndim == 4)
    torch.save({**state, key: state[key][:1]}, shrunk)
    with pytest.raises(CheckpointError, match="different shapes"):
        average_checkpoints([plain, shrunk])


def test_checkpoints_of_other_classes_or_another_order_are_not_averaged(tmp_path):
    """Two runs of one shape on classes [a, b, c] and [b, a, c] were averaged output by output
    (a's weights with b's), the result named by the last one's classes, without a word."""
    paths = checkpoints(tmp_path, 2)
    for classes, difference in (
        (["b", "a", "c"], "output 0 is 'a' in one, 'b' in the other"),
        (["a", "b", "d"], "output 2 is 'c' in one, 'd' in the other"),
        (None, "one records no class names"),
    ):
        save_checkpoint({**torch.load(paths[1], weights_only=True), "classes": classes}, paths[1])
        with pytest.raises(CheckpointError) as raised:
            average_checkpoints(paths)
        assert str(raised.value) == (
            f"checkpoints {paths[0]} and {paths[1]} name their outputs otherwise ({difference}): "
            "averaged, outputs would mix classes (average checkpoints of one run, or of runs on "
            "the same classes in one order)"
        )


def test_convert_checkpoint_average_writes_a_checkpoint_and_refuses_bad_calls(runner, tmp_path):
    import json

    from torchkit.cli import app

    paths = [str(p) for p in checkpoints(tmp_path)]
    out = tmp_path / "avg.pt"
    result = runner.invoke(
        app, ["convert", "checkpoint", "--average", *paths, str(out), "--format", "json"]
    )
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["checkpoints"] == 3 and report["kind"] == "torchkit checkpoint"
    assert isinstance(report["values"], int) and report["destination"] == str(out)
    saved = torch.load(out, weights_only=True)
    expected = average_checkpoints(paths)["model"]
    assert all(torch.equal(saved["model"][k], v) for k, v in expected.items())
    again = runner.invoke(app, ["convert", "checkpoint", "--average", *paths, str(out)])
    assert again.exit_code == 1 and "already exists" in again.stderr
    onto_input = runner.invoke(
        app, ["convert", "checkpoint", "--average", *paths, paths[0], "--force"]
    )
    assert onto_input.exit_code == 1 and torch.load(paths[0], weights_only=True)["epoch"] == 1
    one = runner.invoke(app, ["convert", "checkpoint", "--average", paths[0], str(out)])
    assert one.exit_code == 2 and "two or more checkpoints" in one.stderr
    three = runner.invoke(app, ["convert", "checkpoint", *paths])
    assert three.exit_code == 2 and "add --average" in three.stderr
    # One path: DST forgotten, where "not 1 paths (... add --average)" pointed at averaging.
    alone = runner.invoke(app, ["convert", "checkpoint", paths[0]])
    assert alone.exit_code == 2 and "--average" not in alone.stderr
    assert "Error: missing DST (give it after the inputs, or as --out DST)" in alone.stderr


def test_average_of_pickled_models_takes_trust_checkpoint(runner, tmp_path):
    """--trust-checkpoint was accepted with --average and ignored: the refusal asked for it."""
    from torchkit.cli import app

    paths = []
    for seed in range(2):
        torch.manual_seed(seed)
        paths.append(tmp_path / f"net-{seed}.pt")
        torch.save(torch.nn.Linear(3, 2), paths[-1])
    out = tmp_path / "avg.pt"
    average = ["convert", "checkpoint", "--average", *map(str, paths), str(out)]
    refused = runner.invoke(app, average)
    assert refused.exit_code == 1 and "pass --trust-checkpoint" in refused.stderr
    result = runner.invoke(app, [*average, "--trust-checkpoint"])
    assert result.exit_code == 0, result.stderr
    nets = [torch.load(path, weights_only=False) for path in paths]
    expected = (nets[0].weight + nets[1].weight).detach() / 2
    assert torch.allclose(torch.load(out, weights_only=True)["weight"], expected)


def test_state_dicts_with_keys_that_are_no_names_are_one_error_naming_the_key(runner, tmp_path):
    """Before: 'Error: AttributeError: 'int' object has no attribute 'startswith'' (the
    DataParallel prefix was looked for in every key)."""
    from output_checks import error_line

    from torchkit.cli import app

    first, second = tmp_path / "first.pt", tmp_path / "second.pt"
    torch.save({"conv.weight": torch.ones(2), "conv.bias": torch.zeros(2)}, first)
    torch.save({"conv.weight": torch.ones(2), 7: torch.zeros(2)}, second)
    out = tmp_path / "avg.pt"
    result = runner.invoke(
        app, ["convert", "checkpoint", "--average", str(first), str(second), str(out)]
    )
    assert result.exit_code == 1
    assert error_line(result.stderr, besides="nothing") == (
        f"Error: {second}: the model weights in the checkpoint hold a key 7 (int), not a "
        "parameter or buffer name (a state dict of model weights has string keys; the file "
        "holds something else)"
    )
    assert not out.exists()


def test_complex_tensors_are_averaged_and_their_nans_refused(tmp_path):
    """Complex weights (spectral layers) were taken from the last checkpoint, as integers are."""
    values = [torch.randn(3, dtype=torch.complex64), torch.randn(3, dtype=torch.complex64)]
    paths = []
    for number, value in enumerate(values):
        paths.append(tmp_path / f"{number}.pt")
        torch.save({"spectral": value, "count": torch.tensor(number)}, paths[-1])
    result = average_checkpoints(paths)
    expected = np.mean([value.numpy().astype(np.complex128) for value in values], axis=0)
    assert result["spectral"].dtype == torch.complex64
    np.testing.assert_allclose(result["spectral"].numpy(), expected, rtol=1e-6)
    assert result["count"].item() == 1
    torch.save({"spectral": torch.tensor([complex("nan")]), "count": torch.tensor(0)}, paths[0])
    with pytest.raises(CheckpointError, match="non-finite value .* in 'spectral'"):
        average_checkpoints(paths)


def test_mixed_float_dtypes_keep_the_widest_and_mixed_kinds_are_refused(tmp_path):
    """float16 + float32 was cast to the first file's float16, and a float-vs-integer tensor
    silently took one file's values."""
    half, single, ints = (tmp_path / name for name in ("half.pt", "single.pt", "ints.pt"))
    values = np.array([1.0001, 2.5, -3.25])
    torch.save({"w": torch.tensor(values, dtype=torch.float16)}, half)
    torch.save({"w": torch.tensor(values + 1e-3, dtype=torch.float32)}, single)
    torch.save({"w": torch.tensor([1, 2, 3])}, ints)
    for pair in ([half, single], [single, half]):
        result = average_checkpoints(pair)["w"]
        expected = np.mean([values.astype(np.float16), (values + 1e-3).astype(np.float32)], 0)
        assert result.dtype == torch.float32
        np.testing.assert_allclose(result.numpy(), expected.astype(np.float32), rtol=1e-6)
    for pair in ([single, ints], [ints, single]):
        with pytest.raises(CheckpointError, match=r"'?w'? has different kinds.*int64.*") as error:
            average_checkpoints(pair)
        assert "float32" in str(error.value)


def test_average_into_safetensors_writes_the_averaged_weights(runner, tmp_path):
    """Before: 'cannot tell the output format from 'avg.safetensors'' (exit 2), the suffix
    naming a format convert checkpoint writes."""
    from safetensors.torch import load_file

    from torchkit.cli import app

    paths = [str(p) for p in checkpoints(tmp_path, count=2)]
    out = tmp_path / "avg.safetensors"
    result = runner.invoke(app, ["convert", "checkpoint", "--average", *paths, str(out)])
    assert result.exit_code == 0, result.stderr
    assert "classes and preprocessing are left out" in result.stderr
    saved = load_file(out)
    expected = average_checkpoints(paths)["model"]
    assert saved.keys() == expected.keys()
    assert all(torch.equal(saved[k], v) for k, v in expected.items())
