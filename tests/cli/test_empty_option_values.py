"""An empty item in a list option (`a,,b`, `0.5,`) and an empty value (`--x ''`) are usage errors
naming the option and the value, in every command: one list reader (core.io.option_lists) and
one check of empty values (cli.app) for all."""

from __future__ import annotations

import pytest
from output_checks import error_line
from processes import run_torchkit_in_process

EMPTY_ITEMS = [
    (["eval", "ck.pt", "--data", "imgs", "--classes", "a,,b"], "--classes 'a,,b'"),
    (["predict", "ck.pt", "imgs", "--classes", ",a,b"], "--classes ',a,b'"),
    (["predict", "ck.pt", "imgs", "--classes", "a, ,b"], "--classes 'a, ,b'"),
    (["train", "--out", "run", "--mean", "0.5,"], "--mean '0.5,'"),
    (["train", "--out", "run", "--crop-scale", "0.5,,1"], "--crop-scale '0.5,,1'"),
    (["train", "--out", "run", "--scheduler", "multistep", "--milestones", "1,,2"], "'1,,2'"),
    (["train", "--out", "run", "--scheduler", "multistep", "--milestones", ","], "',':"),
    (["extract-features", "ck.pt", "imgs", "feats", "--std", ",0.2"], "--std ',0.2'"),
    (["split", "imgs", "out", "--names", "a,,b"], "--names 'a,,b'"),
    (["split", "imgs", "out", "--ratio", "8:1:"], "--ratio '8:1:'"),
    (["split", "imgs", "out", "--fixed", "1,"], "--fixed '1,'"),
    (["benchmark", "convnet", "-b", "1,,2"], "--batch-size '1,,2'"),
]


@pytest.mark.parametrize(("args", "shown"), EMPTY_ITEMS, ids=[" ".join(a) for a, _ in EMPTY_ITEMS])
def test_an_empty_list_item_is_a_usage_error(tmp_path, args, shown):
    result = run_torchkit_in_process(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    line = error_line(result.stderr)
    assert shown in line and "an empty item" in line, line
    assert list(tmp_path.iterdir()) == []


EMPTY_VALUES = [
    (["eval", "ck.pt", "--data", "imgs", "--classes", ""], "--classes"),
    (["predict", "convnet", "imgs", "--weights", ""], "--weights"),
    (["summary", "convnet", "--dtype", ""], "--dtype"),
    (["summary", "convnet", "--weights", ""], "--weights"),
    (["train", "--out", "run", "--milestones", ""], "--milestones"),
    (["train", "--out", "run", "--class-weights", ""], "--class-weights"),
    (["split", "imgs", "--out", ""], "--out"),
    (["eval", "ck.pt", "--data", "imgs", "-o", ""], "--output"),
    (["summary", ""], "MODEL"),
]


@pytest.mark.parametrize(("args", "name"), EMPTY_VALUES, ids=[" ".join(a) for a, _ in EMPTY_VALUES])
def test_an_empty_value_is_a_usage_error(tmp_path, args, name):
    result = run_torchkit_in_process(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert error_line(result.stderr).startswith(f"Error: invalid {name} '': an empty value")
    assert list(tmp_path.iterdir()) == []


def test_white_space_around_items_is_no_empty_item():
    from torchkit.core.io.option_lists import list_items

    assert list_items(" a , b ", "--classes") == ["a", "b"]
    assert list_items("0.5 0.4,0.3", "--mean", spaces=True) == ["0.5", "0.4", "0.3"]
    assert list_items("8:1,1", "--ratio", separators=":,") == ["8", "1", "1"]


STDOUT_NAMED_OUTPUTS = [
    ["export", "ck.pt", "-"],
    ["export", "ck.pt", "--out", "-"],
    ["split", "imgs", "-"],
    ["eval", "ck.pt", "--data", "imgs", "--out", "-"],
    ["extract-features", "ck.pt", "imgs", "-", "-l", "logits"],
    ["train", "--data", "imgs", "--out", "-"],
    ["convert", "shards", "imgs", "-"],
    ["convert", "tensor", "imgs", "-", "--to", "npy"],
    ["convert", "tensor", "imgs/a/a_0.png", "-", "--to", "npy"],  # was made: -/a_0.npy
    ["dataset-stats", "imgs", "--leakage-csv", "-"],
]


@pytest.mark.parametrize("args", STDOUT_NAMED_OUTPUTS, ids=" ".join)
def test_a_made_output_named_dash_is_refused_not_made(tmp_path, image_folder, args):
    # '-' is standard output for -o; a file or folder a command makes called '-' is a slip.
    from checkpoints import write_convnet_checkpoint

    write_convnet_checkpoint(tmp_path / "ck.pt", in_channels=3, image_size=8, classes="ab")
    (tmp_path / "imgs").symlink_to(image_folder, target_is_directory=True)
    result = run_torchkit_in_process(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    line = error_line(result.stderr, besides="warnings")
    assert "cannot go to standard output" in line and '"$PWD/-"' in line, line
    assert not (tmp_path / "-").exists()
