"""`--data` names the data of every command that reads a dataset, as train's and eval's does: a
script that writes `--data DIR` everywhere ran into a usage error on predict, extract-features,
dataset-stats, split and convert shards, which took their images only as a positional argument
(kept). Giving both is a usage error, except on predict, whose several inputs --data adds to."""

from __future__ import annotations

import functools
import json

import pytest
from checkpoints import write_convnet_checkpoint
from output_checks import error_line
from typer._completion_classes import ZshComplete
from typer.main import get_command

from torchkit.cli import app

CPU = ["--device", "cpu", "-j", "0"]
DATA_COMMANDS = ["predict", "extract-features", "dataset-stats", "split", "eval", "train"]


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "model.pt"
    write_convnet_checkpoint(path, in_channels=3, image_size=8, classes="ab")
    return path


def _ok(result):
    assert result.exit_code == 0, result.stderr
    return result


def test_dataset_stats_takes_data(runner, image_folder):
    args = ["dataset-stats", "--format", "json", "-j", "0"]
    positional = _ok(runner.invoke(app, [*args, str(image_folder)]))
    option = _ok(runner.invoke(app, [*args, "--data", str(image_folder)]))
    short = _ok(runner.invoke(app, [*args, "-d", str(image_folder)]))
    assert json.loads(option.stdout) == json.loads(positional.stdout) == json.loads(short.stdout)
    assert json.loads(option.stdout)["images"] == 5


def test_split_takes_data_and_then_out(runner, image_folder, tmp_path):
    """With --data, the positional left is OUT (as with --model, MODEL's place goes on)."""
    made = {}
    for name, args in {
        "positional": [str(image_folder), str(tmp_path / "positional")],
        "data": ["--data", str(image_folder), str(tmp_path / "data")],
        "both_options": ["--data", str(image_folder), "--out", str(tmp_path / "both_options")],
    }.items():
        _ok(runner.invoke(app, ["split", *args, "--mode", "manifest", "--format", "json"]))
        made[name] = (tmp_path / name / "split.csv").read_bytes()
    assert made["data"] == made["positional"] == made["both_options"]
    assert len(made["data"].splitlines()) == 6


def test_predict_takes_data_repeated_after_its_images(runner, model, make_image_folder, tmp_path):
    first = make_image_folder(tmp_path / "first", {"a": 2, "b": 1}, size=8)
    second = make_image_folder(tmp_path / "second", {"a": 1, "b": 1}, size=8)
    args = ["predict", str(model), "--format", "csv", *CPU]
    positional = _ok(runner.invoke(app, [*args, str(first), str(second)]))
    option = _ok(runner.invoke(app, [*args, "--data", str(first), "-d", str(second)]))
    mixed = _ok(runner.invoke(app, [*args, "--data", str(second), str(first)]))
    assert option.stdout == positional.stdout == mixed.stdout
    assert len(positional.stdout.splitlines()) == 6
    assert "given twice" not in option.stderr  # many values: no repeat
    by_model_option = _ok(
        runner.invoke(
            app,
            ["predict", "--model", str(model), "--data", str(first), "-d", str(second)] + args[2:],
        )
    )
    assert by_model_option.stdout == positional.stdout


def test_extract_features_takes_data_and_then_out(runner, model, image_folder, tmp_path):
    args = ["extract-features", str(model), *CPU]
    _ok(runner.invoke(app, [*args, str(image_folder), str(tmp_path / "positional")]))
    _ok(runner.invoke(app, [*args, "--data", str(image_folder), str(tmp_path / "data")]))
    _ok(runner.invoke(app, [*args, "-d", str(image_folder), "--out", str(tmp_path / "options")]))
    index = (tmp_path / "positional" / "index.csv").read_bytes()
    assert (tmp_path / "data" / "index.csv").read_bytes() == index
    assert (tmp_path / "options" / "index.csv").read_bytes() == index
    assert len(index.splitlines()) == 6


def test_convert_shards_takes_data_and_then_out(runner, image_folder, tmp_path):
    """`convert shards --data raw/ out/`, as split's: it said `No such option: --data`, the one
    data-reading command without it. The shards are the same bytes however SRC is given; SRC
    given neither way is one usage error, and the argument taken for OUT beside --data is
    named in the refusal of an existing folder, as split's is."""
    made = {}
    for name, args in {
        "positional": [str(image_folder), str(tmp_path / "positional")],
        "data": ["--data", str(image_folder), str(tmp_path / "data")],
        "both_options": ["-d", str(image_folder), "--out", str(tmp_path / "both_options")],
    }.items():
        _ok(runner.invoke(app, ["convert", "shards", *args, "-j", "0", "-q"]))
        made[name] = (tmp_path / name / "shard-000000.tar").read_bytes()
    assert made["data"] == made["positional"] == made["both_options"]
    missing = runner.invoke(app, ["convert", "shards", "--out", str(tmp_path / "none")])
    assert missing.exit_code == 2
    assert error_line(missing.stderr) == "Error: missing SRC (give it, or as --data SRC)"
    taken = runner.invoke(
        app, ["convert", "shards", str(tmp_path / "data"), "-d", str(image_folder)]
    )
    assert taken.exit_code == 1
    assert (
        f"(the argument is OUT when --data {image_folder} gives SRC: to write shards of "
        f"{tmp_path / 'data'}, write `torchkit convert shards {tmp_path / 'data'} OUT` without "
        "--data; "
    ) in error_line(taken.stderr)


@pytest.mark.parametrize(
    ("command", "name", "extra"),
    [
        ("dataset-stats", "ROOT", []),
        ("split", "ROOT", ["OUT"]),
        ("extract-features", "IMAGES", ["OUT"]),
        ("convert shards", "SRC", ["OUT"]),
    ],
)
def test_data_given_twice_is_one_usage_error(runner, image_folder, tmp_path, command, name, extra):
    model = ["convnet", "--allow-untrained"] if command == "extract-features" else []
    outs = [str(tmp_path / word) for word in extra]
    result = runner.invoke(
        app, [*command.split(), *model, str(image_folder), *outs, "--data", str(image_folder)]
    )
    assert result.exit_code == 2
    line = error_line(result.stderr, besides="nothing")
    assert f"{name} given twice: {image_folder} and --data {image_folder}" in line
    assert "(give one of them)" in line
    assert not any((tmp_path / word).exists() for word in extra)


@pytest.mark.parametrize("command", ["split", "extract-features"])
def test_with_data_the_argument_is_out_also_beside_out_option(
    runner, image_folder, tmp_path, command
):
    """`split --data raw/ out/ --out other/` said `ROOT given twice: out/ and --data raw/`, and
    `--out out/` naming the same OUT was refused so, where `split raw/ out/ --out out/` runs:
    with --data, the argument is OUT, held to --out as OUT always is."""
    model = ["convnet", "--allow-untrained"] if command == "extract-features" else []
    out, other = tmp_path / "out", tmp_path / "other"
    args = [command, *model, "--data", str(image_folder), str(out)]
    result = runner.invoke(app, [*args, "--out", str(other)])
    assert result.exit_code == 2
    line = error_line(result.stderr, besides="nothing")
    assert f"OUT {out} and --out {other} name two outputs" in line
    assert not out.exists() and not other.exists()
    if command == "split":
        _ok(runner.invoke(app, [*args, "--out", str(out), "--mode", "manifest", "-q"]))
        assert len((out / "split.csv").read_bytes().splitlines()) == 6


@pytest.mark.parametrize(("command", "name"), [("split", "ROOT"), ("extract-features", "IMAGES")])
def test_argument_data_and_out_options_name_all_three_places(
    runner, make_image_folder, image_folder, tmp_path, command, name
):
    """`split raw --data raw2 --out o`: raw, most likely meant as ROOT, is OUT beside --data
    and was refused as `OUT raw and --out o name two outputs`, which did not say why raw was
    taken for OUT, nor name --data raw2. The error names all three and the rule."""
    model = ["convnet", "--allow-untrained"] if command == "extract-features" else []
    other_data = make_image_folder(tmp_path / "other", {"a": 1, "b": 1})
    out = tmp_path / "o"
    args = [command, *model, str(image_folder), "--data", str(other_data), "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    line = error_line(result.stderr, besides="nothing")
    assert line == (
        f"Error: OUT {image_folder} and --out {out} name two outputs (the argument is OUT "
        f"when --data {other_data} gives {name}: give one of them)"
    )
    assert not out.exists()
    assert sorted(path.name for path in image_folder.iterdir()) == ["a", "b"]


@pytest.mark.parametrize("command", ["dataset-stats", "split"])
def test_no_data_at_all_is_one_usage_error(runner, command, tmp_path):
    out = ["--out", str(tmp_path / "out")] if command == "split" else []
    result = runner.invoke(app, [command, *out])
    assert result.exit_code == 2
    assert "missing ROOT (give it, or as --data ROOT)" in error_line(result.stderr)


def test_a_repeated_data_of_one_input_takes_the_last_and_says_so(runner, image_folder, tmp_path):
    """The rule of every single-valued option (test_repeated_options)."""
    other = tmp_path / "other"
    other.mkdir()
    result = runner.invoke(
        app, ["dataset-stats", "-d", str(other), "--data", str(image_folder), "-j", "0"]
    )
    assert result.exit_code == 0, result.stderr
    assert (
        f"Warning: -d/--data is given twice ({other}, then {image_folder}): the last, "
        f"{image_folder}, is used"
    ) in result.stderr


@pytest.mark.parametrize("command", DATA_COMMANDS)
def test_help_lists_data(runner, command):
    result = _ok(runner.invoke(app, [command, "--help"], terminal_width=200))
    assert "--data" in result.stdout and "-d" in result.stdout


@functools.cache
def _command():
    return get_command(app)


def _zsh_candidates(monkeypatch, words: str) -> str:
    """What `torchkit WORDS<TAB>` gets in zsh, in process (the protocol the scripts call)."""
    monkeypatch.setenv("_TYPER_COMPLETE_ARGS", words)
    return ZshComplete(_command(), {}, "torchkit", "_TORCHKIT_COMPLETE").complete()


@pytest.mark.parametrize("command", DATA_COMMANDS)
def test_data_completes_its_name_and_then_paths(monkeypatch, command):
    """`--da<TAB>` offers --data, and its value completes as a positional's: with the shell's
    own file completion (zsh `_files`; bash's `-o default` and fish likewise on no candidates)."""
    assert '"--data"' in _zsh_candidates(monkeypatch, f"torchkit {command} --da")
    assert _zsh_candidates(monkeypatch, f"torchkit {command} --data pho") == "_files"
    for param in _command().commands[command].params:
        if "--data" in getattr(param, "opts", ()):
            assert param.shell_complete(None, "pho") == []


# The hint for a folder of the user's, which --force refuses too: "pass --force" was a dead end.
NOT_TORCHKITS = (
    "it was not written by torchkit, which --force does not replace: choose another folder, or "
    "empty it yourself"
)


def test_argument_taken_as_out_beside_data_is_refused_naming_both(
    runner, make_image_folder, image_folder, tmp_path
):
    """`split raw --data raw2` (no --out): raw, most likely meant as ROOT, is OUT, and its
    refusal (`output folder already exists: raw`) did not say why raw was OUT, nor name --data
    raw2. It names both, the rule and what to write; --help says the rule too."""
    other_data = make_image_folder(tmp_path / "other", {"a": 1, "b": 1})
    before = sorted(path.relative_to(image_folder) for path in image_folder.rglob("*"))
    result = runner.invoke(app, ["split", str(image_folder), "--data", str(other_data)])
    assert result.exit_code == 1
    rule = (
        f"the argument is OUT when --data {other_data} gives ROOT: to split {image_folder}, "
        f"write `torchkit split {image_folder} OUT` without --data"
    )
    assert error_line(result.stderr, besides="nothing") == (
        f"Error: output folder already exists: {image_folder} ({rule}; to split {other_data} "
        f"into {image_folder}: {NOT_TORCHKITS})"
    )
    assert sorted(path.relative_to(image_folder) for path in image_folder.rglob("*")) == before
    inside = other_data / "a"
    result = runner.invoke(app, ["split", str(inside), "--data", str(other_data), "--force"])
    assert result.exit_code == 1
    line = error_line(result.stderr, besides="nothing")
    assert line.startswith(f"Error: output folder {inside} lies inside the data folder")
    assert f"--data {other_data} gives ROOT: to split {inside}, write" in line
    # Given as --out, OUT was meant as OUT: the refusal says nothing of the argument.
    result = runner.invoke(app, ["split", "--data", str(other_data), "--out", str(image_folder)])
    assert error_line(result.stderr, besides="nothing") == (
        f"Error: output folder already exists: {image_folder} ({NOT_TORCHKITS})"
    )
    help_text = " ".join(runner.invoke(app, ["split", "--help"]).stdout.split())
    assert "With --data the argument is OUT: `split raw --data raw2` splits raw2 into raw" in (
        help_text
    )


def test_the_refusal_of_an_argument_taken_as_out_quotes_the_data_it_shows(
    runner, make_image_folder, image_folder, tmp_path
):
    """`--data my data` would be two words: the rule and the commands show shell words."""
    other_data = make_image_folder(tmp_path / "my data", {"a": 1, "b": 1})
    result = runner.invoke(app, ["split", str(image_folder), "--data", str(other_data)])
    assert result.exit_code == 1
    assert error_line(result.stderr, besides="nothing") == (
        f"Error: output folder already exists: {image_folder} (the argument is OUT when --data "
        f"'{other_data}' gives ROOT: to split {image_folder}, write `torchkit split "
        f"{image_folder} OUT` without --data; to split '{other_data}' into {image_folder}: "
        f"{NOT_TORCHKITS})"
    )


def test_extract_features_argument_taken_as_out_beside_data_is_refused_naming_both(
    runner, model, make_image_folder, image_folder, tmp_path
):
    """`extract-features best.pt raw --data raw2` (no --out): raw is OUT, as split's argument
    is, and was refused as `output folder already exists: raw (pass --force to overwrite it)`,
    without --data raw2 or why raw was OUT. The refusal is split's: both, the rule, what to
    write; with MODEL as --model too. Given as --out, OUT was meant as OUT: nothing added."""
    other_data = make_image_folder(tmp_path / "other", {"a": 1, "b": 1}, size=8)
    before = sorted(path.relative_to(image_folder) for path in image_folder.rglob("*"))
    rule = (
        f"the argument is OUT when --data {other_data} gives IMAGES: to extract features of "
        f"{image_folder}, write `torchkit extract-features {model} {image_folder} OUT` without "
        "--data"
    )
    for model_words in ([str(model)], ["--model", str(model)]):
        args = ["extract-features", *model_words, str(image_folder), "--data", str(other_data)]
        result = runner.invoke(app, [*args, *CPU])
        assert result.exit_code == 1
        assert error_line(result.stderr, besides="nothing") == (
            f"Error: output folder already exists: {image_folder} ({rule}; to extract features "
            f"of {other_data} into {image_folder}: {NOT_TORCHKITS})"
        )
    assert sorted(path.relative_to(image_folder) for path in image_folder.rglob("*")) == before
    inside = other_data / "a"
    args = ["extract-features", str(model), str(inside), "--data", str(other_data), "--force"]
    result = runner.invoke(app, [*args, *CPU])
    assert result.exit_code == 1
    line = error_line(result.stderr, besides="nothing")
    assert line.startswith(f"Error: output folder {inside} lies inside the IMAGES folder")
    assert f"--data {other_data} gives IMAGES: to extract features of {inside}, write" in line
    args = ["extract-features", str(model), "--data", str(other_data), "--out", str(image_folder)]
    result = runner.invoke(app, [*args, *CPU])
    assert error_line(result.stderr, besides="nothing") == (
        f"Error: output folder already exists: {image_folder} ({NOT_TORCHKITS})"
    )
    help_text = " ".join(runner.invoke(app, ["extract-features", "--help"]).stdout.split())
    assert "With --data the argument after MODEL is OUT: `extract-features convnet raw --data" in (
        help_text
    )
