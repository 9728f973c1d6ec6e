"""`train --config FILE` and `--print-config`: a run replayed from its own config.json ends with
bitwise-identical weights; the command line overrides the file; unknown keys are errors."""

from __future__ import annotations

import json

import pytest
import torch

from torchkit.cli import app

FAST = ["--epochs", "2", "--deterministic", "-j", "0", "--device", "cpu", "--batch-size", "256"]
# A net of 8 px, BatchNorm (buffers) and dropout (random draws): digits' 1,438 training images
# in 6 steps an epoch, at a fraction of the cost of digits' convnet at 12 px.
TINY_NET = ["--model", "nets:NoisyNet", "--image-size", "8"]


def train(runner, *args):
    result = runner.invoke(app, ["train", *map(str, args)])
    assert result.exit_code == 0, result.stderr
    return result


def test_a_run_replayed_from_its_config_json_ends_with_identical_weights(runner, tmp_path):
    recipe = ["--data", "digits", "--lr", "0.002", *FAST, *TINY_NET]
    train(runner, *recipe, "--out", tmp_path / "first")
    config = tmp_path / "first" / "config.json"
    train(runner, "--config", config, "--out", tmp_path / "again")
    first = torch.load(tmp_path / "first" / "last.pt", weights_only=True)
    again = torch.load(tmp_path / "again" / "last.pt", weights_only=True)
    assert first["model"].keys() == again["model"].keys()
    for key, value in first["model"].items():
        assert torch.equal(value, again["model"][key]), key
    replayed = json.loads((tmp_path / "again" / "config.json").read_text())["options"]
    assert replayed["lr"] == 0.002 and replayed["epochs"] == 2 and replayed["deterministic"]


def test_the_command_line_overrides_the_file_and_print_config_shows_the_result(runner, tmp_path):
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps({"lr": 0.01, "epochs": 7, "label-smoothing": 0.2}))
    result = runner.invoke(
        app, ["train", "--config", str(recipe), "--epochs", "3", "--print-config"]
    )
    assert result.exit_code == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["lr"] == 0.01 and shown["label_smoothing"] == 0.2
    assert shown["epochs"] == 3  # given on the command line
    assert shown["model"] == "convnet" and shown["image_size"] == 12  # digits' defaults filled
    assert not list(tmp_path.glob("runs*"))  # nothing trained, nothing written


def test_print_config_under_torchrun_is_printed_and_written_by_rank_0_alone(
    runner, tmp_path, monkeypatch
):
    """Every rank wrote -o FILE: the ranks raced, and one refused the file another had just
    written (an error, exit 1: 5 launches in 8 on a 2-core machine)."""
    shown = tmp_path / "config.json"
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    result = runner.invoke(app, ["train", "--print-config", "-o", str(shown)])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "" and not shown.exists()
    monkeypatch.setenv("RANK", "0")
    result = runner.invoke(app, ["train", "--print-config", "-o", str(shown)])
    assert result.exit_code == 0, result.stderr
    assert json.loads(shown.read_text())["model"] == "convnet"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"lr": 0.01, "learning_rate": 0.1}, "unknown option 'learning_rate'"),
        ({"epoch": 3}, "did you mean epochs?"),
        ({"lr": "fast"}, "--lr in"),
        ([1, 2], "not option names and values"),
    ],
)
def test_bad_config_files_are_one_error_line(runner, tmp_path, content, message):
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps(content))
    result = runner.invoke(app, ["train", "--config", str(recipe), "--print-config"])
    assert result.exit_code in (1, 2)
    assert result.stderr.startswith("Error: ") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"crop_scale": [0.5]}, "--crop-scale in"),  # was: ValueError: not enough values...
        ({"crop_scale": [0.1, 0.5, 0.9]}, "--crop-scale in"),
        # was taken: MultiStepLR never meets epoch 1.5, so the lr never dropped
        ({"scheduler": "multistep", "milestones": [1.5]}, "--milestones in"),
    ],
)
def test_config_file_lists_of_the_wrong_length_or_type_are_usage_errors(
    runner, tmp_path, content, message
):
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps(content))
    result = runner.invoke(app, ["train", "--config", str(recipe), "--print-config"])
    assert result.exit_code == 2, result.stdout
    assert result.stderr.startswith("Error: ") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ({"workers": 1000.0}, "--workers in h.json is 1000.0, not a whole number or null"),
        ({"epochs": "3"}, "--epochs in h.json is '3', not a whole number or null"),
        ({"lr": "fast"}, "--lr in h.json is 'fast', not a number"),
        ({"mean": "0.5"}, "--mean in h.json is '0.5', not a list of numbers or null"),
        ({"crop_scale": [0.5]}, "--crop-scale in h.json is [0.5], not a list of 2 numbers or null"),
        ({"milestones": [1.5]}, "--milestones in h.json is [1.5], not a list of whole numbers"),
        ({"flip": "yes"}, "--flip in h.json is 'yes', not true, false or null"),
        ({"amp": 1}, "--amp in h.json is 1, not true or false"),
        ({"optimizer": 3}, "--optimizer in h.json is 3, not a string"),
        ({"clip_grad": [1]}, "--clip-grad in h.json is [1], not a number or null"),
        # A bare number where a list goes (was a TypeError, exit 1).
        ({"milestones": 3}, "--milestones in h.json is 3, not a list of whole numbers"),
        ({"mean": 0.5}, "--mean in h.json is 0.5, not a list of numbers or null"),
        ({"std": 1}, "--std in h.json is 1, not a list of numbers or null"),
        ({"crop_scale": 0.5}, "--crop-scale in h.json is 0.5, not a list of 2 numbers or null"),
    ],
)
def test_a_value_of_the_wrong_type_is_named_in_a_users_words(runner, tmp_path, content, said):
    """Was Python's annotation: "--workers in h.json is 1000.0, not a int | None"."""
    recipe = tmp_path / "h.json"
    recipe.write_text(json.dumps(content))
    result = runner.invoke(app, ["train", "--config", str(recipe), "--print-config"])
    assert result.exit_code == 2, result.stdout
    assert len(result.stderr.strip().splitlines()) == 1
    assert said.replace("h.json", str(recipe)) in result.stderr


@pytest.mark.parametrize(
    ("name", "text"),
    [("recipe.cfg", "lr: 0.2\nepochs: 3\n"), ("recipe", '{"lr": 0.2, "epochs": 3}')],
)
def test_a_recipe_named_neither_json_nor_yaml_is_read_by_its_content(runner, tmp_path, name, text):
    """A YAML recipe without .yaml or .yml (`recipe.cfg`, `<(yq ...)`'s /dev/fd/63) was
    "not valid JSON": it is told apart as `--config -` tells stdin's."""
    recipe = tmp_path / name
    recipe.write_text(text)
    result = runner.invoke(app, ["train", "--config", str(recipe), "--print-config"])
    assert result.exit_code == 0, result.stderr
    shown = json.loads(result.stdout)
    assert (shown["lr"], shown["epochs"]) == (0.2, 3)


def test_a_toml_recipe_is_refused_as_toml(runner, tmp_path):
    """Was "r.toml is not valid JSON", a format the user never gave."""
    recipe = tmp_path / "r.toml"
    recipe.write_text("lr = 0.2\n")
    result = runner.invoke(app, ["train", "--config", str(recipe), "--print-config"])
    assert result.exit_code == 2, result.stdout
    assert result.stderr.strip() == (
        f"Error: {recipe} is TOML, and --config reads JSON or YAML (write it as JSON or YAML: "
        "torchkit train --print-config prints JSON)"
    )
    # A mistyped name is not found, not a TOML file to rewrite as JSON.
    missing = runner.invoke(app, ["train", "--config", str(tmp_path / "rr.toml"), "--print-config"])
    assert missing.exit_code == 1, missing.stdout
    assert missing.stderr.strip() == (
        f"Error: config file not found: {tmp_path / 'rr.toml'} (give a run's config.json or a "
        "JSON or YAML recipe; torchkit train --print-config prints a recipe to start from)"
    )


def test_whole_numbers_where_numbers_go_print_as_the_command_line_gives_them(runner, tmp_path):
    """`lr: 1` stayed the int 1 (the printed recipe and config.json read 1 where `--lr 1`
    gives 1.0), and an int too large for a float ended in 'Error: OverflowError: int too
    large to convert to float' once the run started."""
    recipe = tmp_path / "h.json"
    options = {"lr": 1, "warmup_epochs": 2, "mean": [0, 0, 1], "crop_scale": [1, 1], "clip_grad": 5}
    recipe.write_text(json.dumps(options))
    from_file = runner.invoke(app, ["train", "--config", str(recipe), "--print-config"])
    typed = ["--lr", "1", "--warmup-epochs", "2", "--mean", "0,0,1", "--crop-scale", "1,1"]
    from_line = runner.invoke(app, ["train", *typed, "--clip-grad", "5", "--print-config"])
    assert from_file.exit_code == from_line.exit_code == 0, from_file.stderr + from_line.stderr
    assert from_file.stdout == from_line.stdout
    recipe.write_text('{"lr": 1' + "0" * 400 + "}")
    result = runner.invoke(app, ["train", "--config", str(recipe), "--out", tmp_path / "run"])
    assert result.exit_code == 2, result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert errors == [f"Error: {recipe}: --lr must be a finite number, not inf (nan and inf are "
                      "not option values)"]  # fmt: skip


@pytest.mark.parametrize(
    ("content", "args", "said"),
    [
        ({"lr": -1}, [], "Error: h.json: --lr must be positive, not -1"),
        ({"lr": float("nan")}, [], "Error: h.json: --lr must be a finite number, not nan"),
        ({"augment": "fancy"}, [], "Error: h.json: unknown --augment 'fancy'"),
        ({"mean": [0.5, 0.5]}, [], "Error: h.json: --mean takes 3 values"),
        ({"backbone_lr": 0.1}, ["--head-lr-mult", "2"], "Error: h.json: --backbone-lr and"),
        # the command line's own value: the file has nothing to do with it
        ({"lr": 0.1, "lr_max": 5.0}, ["--lr", "-1"], "Error: --lr must be positive, not -1"),
    ],
)
def test_a_bad_value_from_the_recipe_names_the_recipe(runner, tmp_path, content, args, said):
    """A value of the right type but out of range or not a choice read "Error: --lr must be
    positive, not -1": no --lr on the command line, and the recipe not named."""
    recipe = tmp_path / "h.json"
    recipe.write_text(json.dumps(content))
    result = runner.invoke(app, ["train", "--config", str(recipe), "--print-config", *args])
    assert result.exit_code == 2, result.stdout
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith(said.replace("h.json", str(recipe))), result.stderr


def test_a_nan_in_the_recipe_gets_the_command_lines_hint(runner, tmp_path):
    """A bounded option's NaN said "(nan and inf are not option values)" from a recipe and
    "(give a number >= 0)" typed: one hint for both."""
    recipe = tmp_path / "h.json"
    recipe.write_text('{"min_lr": NaN}')
    from_file = runner.invoke(app, ["train", "--config", str(recipe), "--print-config"])
    typed = runner.invoke(app, ["train", "--min-lr", "nan", "--print-config"])
    assert from_file.exit_code == typed.exit_code == 2
    said = "Error: --min-lr must be a finite number, not nan (give a number >= 0)"
    assert typed.stderr.strip() == said
    assert from_file.stderr.strip() == typed.stderr.strip().replace("--min", f"{recipe}: --min")


def test_a_bad_value_from_the_recipe_on_stdin_names_stdin_when_training(runner, tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, ["train", "--config", "-", "--out", out], input='{"lr": -1}')
    assert result.exit_code == 2, result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert errors == ["Error: the recipe on stdin: --lr must be positive, not -1"]
    assert not out.exists()


@pytest.mark.parametrize(
    ("content", "hint"),
    [
        ({"crop_scale": "0.08,1"}, '(write a list in brackets, such as [1, 2], not a string such '
                                   'as "1,2")'),
        ({"epochs": "3"}, "(write a whole number such as 3, without quotes)"),
        ({"lr": "1e-3"}, "(write a number such as 0.1, without quotes)"),
        ({"flip": "yes"}, "(write true or false, without quotes)"),
        ({"optimizer": 3}, '(write a string, in quotes where YAML would read a number, true or '
                           'null: "2024")'),
    ],
)  # fmt: skip
def test_a_value_of_the_wrong_type_says_how_a_recipe_writes_it(runner, tmp_path, content, hint):
    """The hint was "give the value as the command line would", which is what `crop_scale:
    0.08,1` and `epochs: "3"` had done."""
    recipe = tmp_path / "h.json"
    recipe.write_text(json.dumps(content))
    result = runner.invoke(app, ["train", "--config", str(recipe), "--print-config"])
    assert result.exit_code == 2, result.stdout
    assert result.stderr.strip().endswith(hint), result.stderr


def test_print_config_never_writes_over_the_recipe_it_reads(runner, tmp_path):
    """`--config r.json --print-config -o r.json --force` replaced the recipe it read, which a
    training run (and every command) refuses: an output may not be an input."""
    recipe = tmp_path / "r.json"
    recipe.write_text('{"lr": 0.1}')
    link = tmp_path / "link.json"
    link.symlink_to(recipe)
    for given in (recipe, link):
        args = ["train", "--config", given, "--lr", "0.2", "--print-config", "-o", recipe]
        result = runner.invoke(app, [*map(str, args), "--force"])
        assert result.exit_code == 1, result.stdout
        said = f"Error: -o {recipe} is the --config file {given} (choose another output)"
        assert result.stderr.strip() == said
        assert recipe.read_text() == '{"lr": 0.1}'
    other = tmp_path / "other.json"
    result = runner.invoke(app, ["train", "--config", str(recipe), "--print-config", "-o", other])
    assert result.exit_code == 0, result.stderr
    assert json.loads(other.read_text())["lr"] == 0.1


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        ("r.json", "", "r.json holds no options"),  # was "not valid JSON: Expecting value"
        ("r.yaml", "# lr: 0.1\n", "r.yaml holds no options"),  # was "holds a NoneType"
        ("r.json", "null", "r.json holds no options"),
        ("r.json", "3", "r.json holds a number, not option names and values"),  # "an int"
        ("r.yaml", "lr\n", "r.yaml holds a string, not option names and values"),  # "a str"
    ],
)
def test_a_recipe_without_options_says_so_in_a_users_words(runner, tmp_path, name, text, said):
    recipe = tmp_path / name
    recipe.write_text(text)
    result = runner.invoke(app, ["train", "--config", str(recipe), "--print-config"])
    assert result.exit_code == 1, result.stdout
    assert result.stderr.strip() == (
        f"Error: {tmp_path / said} (torchkit train --print-config prints a recipe to start from)"
    )


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("data: !!timestamp 2024-01-01\n", "--data in r.yaml is 2024-01-01, not a string"),
        ("data: null\n", "--data in r.yaml is null, not a string"),
        ("amp: null\n", "--amp in r.yaml is null, not true or false"),
        ("optimizer: true\n", "--optimizer in r.yaml is true, not a string"),
    ],
)
def test_a_wrong_value_is_shown_as_the_file_writes_it(runner, tmp_path, text, said):
    """Was Python's repr: "is datetime.date(2024, 1, 1)", "is None", "is True"."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text)
    result = runner.invoke(app, ["train", "--config", str(recipe), "--print-config"])
    assert result.exit_code == 2, result.stdout
    assert result.stderr.startswith(f"Error: {said.replace('r.yaml', str(recipe))} (write ")


def test_a_choice_in_any_case_is_taken_as_the_command_line_takes_it(runner, tmp_path):
    """`--optimizer AdamW` is adamw, and `"optimizer": "AdamW"` in a recipe was refused:
    "unknown optimizer 'AdamW'"."""
    choices = {
        "optimizer": "AdamW",
        "scheduler": "Cosine",
        "amp_dtype": "BF16",
        "augment": "TrivialAugment",
        "best_metric": "Top1",
        "crop_mode": "Squash",
    }
    recipe = tmp_path / "r.json"
    recipe.write_text(json.dumps(choices))
    from_file = runner.invoke(app, ["train", "--config", str(recipe), "--print-config"])
    typed = [f"--{name.replace('_', '-')}={value}" for name, value in choices.items()]
    from_line = runner.invoke(app, ["train", *typed, "--print-config"])
    assert from_file.exit_code == from_line.exit_code == 0, from_file.stderr + from_line.stderr
    assert from_file.stdout == from_line.stdout
    assert json.loads(from_file.stdout)["optimizer"] == "adamw"


def test_a_recipes_paths_starting_with_a_tilde_are_in_the_home_folder(
    runner, tmp_path, monkeypatch
):
    """`out: ~/runs/x` in a recipe trained into a folder named `~` in the working directory,
    which the summary showed as `~/runs/x`: the shell expands an unquoted `--out ~/runs/x`."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    recipe = tmp_path / "r.yaml"
    recipe.write_text("out: ~/runs/x\nclass_weights: ~/w.txt\nmodel: convnet\n")
    result = runner.invoke(app, ["train", "--config", str(recipe), "--print-config"])
    assert result.exit_code == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["out"] == str(home / "runs" / "x")
    assert shown["class_weights"] == str(home / "w.txt") and shown["model"] == "convnet"


def test_config_dash_reads_the_recipe_print_config_pipes_in(runner):
    """`--config -` was "config file not found: -"."""
    printed = runner.invoke(app, ["train", "--print-config", "--lr", "0.01", "-e", "3"])
    assert printed.exit_code == 0, printed.stderr
    again = runner.invoke(app, ["train", "--config", "-", "--print-config"], input=printed.stdout)
    assert again.exit_code == 0, again.stderr
    assert json.loads(again.stdout) == json.loads(printed.stdout)


@pytest.mark.parametrize(
    ("piped", "env", "said"),
    [
        ("lr: 1e-3\nepochs: 4\n", {}, None),  # YAML: what does not start as JSON does
        ('\ufeff{"lr": 0.001, "epochs": 4}', {}, None),  # a BOM, as in a file
        ("", {}, "Error: the recipe on stdin is empty: --config - reads the options there"),
        ('{"workers": 1.5}', {}, "--workers in the recipe on stdin is 1.5, not a whole number"),
        ('{"lr": 0.1', {}, "Error: the recipe on stdin is not valid JSON: "),
        ("{}", {"WORLD_SIZE": "2", "RANK": "0"}, "which torchrun's ranks share"),
    ],
)
def test_config_dash_reads_json_or_yaml_and_refuses_what_it_cannot(runner, piped, env, said):
    result = runner.invoke(app, ["train", "--config", "-", "--print-config"], input=piped, env=env)
    if said is None:
        assert result.exit_code == 0, result.stderr
        assert (json.loads(result.stdout)["lr"], json.loads(result.stdout)["epochs"]) == (1e-3, 4)
        return
    assert result.exit_code in (1, 2), result.stdout
    assert len(result.stderr.strip().splitlines()) == 1 and said in result.stderr


@pytest.mark.parametrize("epochs", [1_000_001, 99999999999999999999])
def test_epochs_past_the_most_a_run_takes_are_refused_in_a_recipe_and_on_the_command_line(
    runner, tmp_path, epochs
):
    """--epochs 99999999999999999999 started a run that could never end, its progress line 20
    digits wide; a recipe's epochs the same. Both name the option and what it takes."""
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps({"epochs": epochs}))
    from_recipe = runner.invoke(app, ["train", "--config", str(recipe), "--print-config"])
    assert from_recipe.exit_code == 2, from_recipe.stdout
    assert from_recipe.stderr == (
        f"Error: {recipe}: --epochs {epochs} is out of range "
        "(give a whole number from 1 to 1,000,000)\n"
    )
    typed = runner.invoke(app, ["train", "--epochs", str(epochs), "--print-config"])
    assert typed.exit_code == 2 and "'--epochs'" in typed.stderr and "1,000,000" in typed.stderr
    most = runner.invoke(app, ["train", "--epochs", "1000000", "--print-config"])
    assert most.exit_code == 0, most.stderr


def test_accum_steps_past_the_most_an_update_takes_are_refused_in_a_recipe_and_typed(
    runner, tmp_path
):
    """--accum-steps 99999999999999999999 trained (one update an epoch, as any number past an
    epoch's batches does), recording that many batches as each update's."""
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps({"accum_steps": 99999999999999999999}))
    from_recipe = runner.invoke(app, ["train", "--config", str(recipe), "--print-config"])
    assert from_recipe.exit_code == 2, from_recipe.stdout
    assert from_recipe.stderr == (
        f"Error: {recipe}: --accum-steps 99999999999999999999 is out of range "
        "(give a whole number from 1 to 1,000,000)\n"
    )
    typed = runner.invoke(app, ["train", "--accum-steps", "1000001", "--print-config"])
    assert typed.exit_code == 2 and "'--accum-steps'" in typed.stderr, typed.stderr
    assert "1,000,000" in typed.stderr
    most = runner.invoke(app, ["train", "--accum-steps", "1000000", "--print-config"])
    assert most.exit_code == 0, most.stderr


@pytest.mark.parametrize("key", ["weights", "out", "data", "model"])
def test_an_empty_value_in_a_config_file_is_refused_as_on_the_command_line(runner, tmp_path, key):
    """Was taken as not given: "weights": "" trained without weights, "out": "" made a new
    runs/ folder, where --weights '' and --out '' are refused."""
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps({key: ""}))
    result = runner.invoke(app, ["train", "--config", str(recipe), "--print-config"])
    assert result.exit_code == 2, result.stdout
    assert result.stderr.startswith(f"Error: invalid --{key} '' in ")
    assert "an empty value" in result.stderr


def test_print_config_written_to_yaml_reads_back_and_yaml_exponents_are_floats(runner, tmp_path):
    """Was refused: PyYAML (YAML 1.1) reads 1e-07 (json.dumps' lr_min) and a hand-written
    `lr: 1e-3` as strings: "--lr-min in printed.yaml is '1e-07', not a float"."""
    printed = tmp_path / "printed.yaml"
    result = runner.invoke(app, ["train", "--print-config", "-o", str(printed)])
    assert result.exit_code == 0, result.stderr
    again = runner.invoke(app, ["train", "--config", str(printed), "--print-config"])
    assert again.exit_code == 0, again.stderr
    assert json.loads(again.stdout) == json.loads(printed.read_text())
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("lr: 1e-3\nweight_decay: 5.0e4\n")
    result = runner.invoke(app, ["train", "--config", str(recipe), "--print-config"])
    assert result.exit_code == 0, result.stderr
    shown = json.loads(result.stdout)
    assert (shown["lr"], shown["weight_decay"]) == (0.001, 50000.0)


@pytest.mark.parametrize(
    ("text", "read_as"),
    [
        ("lr: 0.1\nepochs: 010\nmodel: 2024-01-01\n", {"epochs": 10, "model": "2024-01-01"}),
        ("epochs: 0o17\nbatch_size: 0x10\nlr: +.5\namp: True\n", {"epochs": 15, "amp": True}),
        ("out: 1:30\nmodel: on\n", {"out": "1:30", "model": "on"}),
    ],
)
def test_yaml_recipes_read_plain_values_by_yaml_12(runner, tmp_path, text, read_as):
    """PyYAML reads YAML 1.1: `epochs: 010` was 8 (octal), `model: 2024-01-01` a date that was
    refused, `out: 1:30` the number 90 (base 60) and `model: on` true; YAML 1.2 (and JSON)
    read 10, the strings "2024-01-01", "1:30" and "on", 0o17 as 15 and 0x10 as 16."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text)
    result = runner.invoke(app, ["train", "--config", str(recipe), "--print-config"])
    assert result.exit_code == 0, result.stderr
    shown = json.loads(result.stdout)
    for name, value in read_as.items():  # `out` as given, or made absolute
        assert shown[name] == value or str(shown[name]).endswith(f"/{value}"), shown[name]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("lr: 1:30\n", "--lr in r.yaml is '1:30', not a number"),  # was lr 90
        ("amp: yes\n", "--amp in r.yaml is 'yes', not true or false"),  # was true
        ("flip: off\n", "--flip in r.yaml is 'off', not true, false or null"),  # was false
        ("epochs: 1_000\n", "--epochs in r.yaml is '1_000', not a whole number"),  # was 1000
        ("optimizer: yes\n", "r.yaml: unknown --optimizer 'yes'"),  # was "is true, not a string"
    ],
)
def test_yaml_11_only_forms_are_refused_naming_the_key_and_the_file(runner, tmp_path, text, said):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text)
    result = runner.invoke(app, ["train", "--config", str(recipe), "--print-config"])
    assert result.exit_code == 2, result.stdout
    assert result.stderr.startswith(f"Error: {said.replace('r.yaml', str(recipe))}")


@pytest.mark.parametrize(
    ("text", "side"),
    [
        ("input_size: [3, 224, 224]\n", 224),  # timm's train.py's args.yaml
        ("input-size: [1, 3, 64, 64]\n", 64),
        ("img_size: 48\n", 48),  # timm's other key
        ("--input-size: 32\n", 32),
    ],
)
def test_timms_input_size_in_a_recipe_is_the_image_size(runner, tmp_path, text, side):
    """Was "unknown option 'input_size' in r.yaml (did you mean train_crop_size?)", though
    --input-size 3,224,224 is taken on the command line."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text)
    result = runner.invoke(app, ["train", "--config", str(recipe), "--print-config"])
    assert result.exit_code == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["image_size"] == side and "input_size" not in shown


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            "input_size: [1, 28, 28]\n",
            "'input_size' in r.yaml is [1, 28, 28], which is a 1-channel shape, and train feeds "
            "its model 3-channel (RGB) images (give [3, N, N], or the side N of the square crop)",
        ),
        ("input_size: [3, 224, 160]\n", "'input_size' in r.yaml is [3, 224, 160], which is not "),
        ("input_size: [3, 0, 0]\n", "'input_size' in r.yaml is [3, 0, 0], which is not a "),
        ("input_size: [3, 8, 8]\nimage_size: 8\n", "--image-size is given twice in r.yaml"),
    ],
)
def test_an_input_size_train_cannot_take_is_refused_naming_key_and_file(
    runner, tmp_path, text, said
):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text)
    result = runner.invoke(app, ["train", "--config", str(recipe), "--print-config"])
    assert result.exit_code in (1, 2), result.stdout
    assert result.stderr.startswith(f"Error: {said.replace('r.yaml', str(recipe))}")


def test_train_refuses_an_input_size_of_other_than_3_channels(runner):
    """`--input-size 1,28,28` trained at 28 on RGB images, the 1 dropped unread."""
    result = runner.invoke(app, ["train", "--input-size", "1,28,28", "--print-config"])
    assert result.exit_code == 2, result.stdout
    assert "'1,28,28' is a 1-channel shape, and train feeds its model 3-channel" in result.stderr
    taken = runner.invoke(app, ["train", "--input-size", "3,28,28", "--print-config"])
    assert taken.exit_code == 0 and json.loads(taken.stdout)["image_size"] == 28


def test_config_with_resume_is_refused(runner, tmp_path):
    recipe = tmp_path / "recipe.json"
    recipe.write_text("{}")
    result = runner.invoke(
        app, ["train", "--config", str(recipe), "--resume", str(tmp_path / "run")]
    )
    assert result.exit_code == 2 and "--config starts a new run" in result.stderr


def test_a_config_json_recorded_before_decode_existed_replays_exact_decoding(tmp_path):
    from torchkit.core.train.config_file import read_config_file

    old = tmp_path / "config.json"
    old.write_text(json.dumps({"options": {"data": "ds", "lr": 0.01}, "defaults_from_data": []}))
    assert read_config_file(old)["decode"] == "exact"
    recipe = tmp_path / "recipe.json"  # a hand-written recipe: today's defaults apply
    recipe.write_text(json.dumps({"lr": 0.01}))
    assert "decode" not in read_config_file(recipe)
    new = tmp_path / "new.json"
    new.write_text(json.dumps({"options": {"decode": "fast"}, "defaults_from_data": []}))
    assert read_config_file(new)["decode"] == "fast"


def test_data_dependent_defaults_in_print_config_and_help(runner):
    from torchkit.core.train.defaults import DIGITS_DEFAULTS, FOLDER_DEFAULTS

    shown = runner.invoke(app, ["train", "--print-config"])
    assert shown.exit_code == 0, shown.stderr
    digits = json.loads(shown.stdout)
    assert (digits["epochs"], digits["batch_size"], digits["channels_last"]) == (25, 32, True)
    assert (digits["image_size"], digits["resize_size"]) == (12, 12)
    off = runner.invoke(app, ["train", "--no-channels-last", "-e", "3", "--print-config"])
    assert off.exit_code == 0, off.stderr
    given = json.loads(off.stdout)
    assert (given["channels_last"], given["epochs"], given["batch_size"]) == (False, 3, 32)
    help_text = " ".join(
        runner.invoke(app, ["train", "--help"], env={"COLUMNS": "300"}).stdout.split()
    )
    for name in ("epochs", "image_size"):
        wanted = f"Default: {DIGITS_DEFAULTS[name]} for digits, {FOLDER_DEFAULTS[name]} for image"
        assert wanted in help_text


def _alias_bomb(levels: int) -> str:
    """A YAML list of 9**levels numbers written in a few hundred bytes, each level nine
    aliases of the one before."""
    items = ["&a0 [1, 2, 3, 4, 5, 6, 7, 8, 9]"]
    items += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "mean: [" + ", ".join(items) + "]\n"


def test_a_yaml_alias_bomb_is_a_short_error_line(runner, tmp_path):
    """Was the whole nested value in the error: 600 KB of line for this file, minutes and
    gigabytes for one of a few more levels (300 bytes)."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(_alias_bomb(5))
    result = runner.invoke(app, ["train", "--config", str(recipe), "--print-config"])
    assert result.exit_code == 2, result.stdout[:300]
    line = result.stderr.strip()
    assert line.startswith("Error: --mean in ") and "not a list of numbers or null" in line
    assert len(line.splitlines()) == 1 and len(line) < 500, len(line)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        # were PyYAML's own messages over 4 and 8 lines, quoting the file
        (
            "a.yaml",
            "!!python/object/apply:os.system ['echo hi']",
            "is not valid YAML: line 1, column 1: could not determine a constructor for the tag",
        ),
        ("b.yaml", "{? [1, 2] : 3}", "is not valid YAML: line 1, column 4: found unhashable key"),
        (
            "c.yaml",
            "lr: [1,\nepochs: 2",
            "is not valid YAML: line 2, column 10: expected ',' or ']', but got '<stream end>', "
            "while parsing a flow sequence that starts on line 1, column 5",
        ),
        # were "Error: ValueError: Exceeds the limit (4300 digits)..." with the debug hint
        ("d.json", '{"epochs": ' + "9" * 5000 + "}", "holds a value Python cannot read"),
        ("e.yaml", "epochs: " + "9" * 5000, "holds a value Python cannot read"),
        ("f.yaml", "lr: !!timestamp 2001-13-45", "holds a value Python cannot read: month must"),
        # were "TypeError: 'int' object is not iterable" and "unhashable type: 'list'"
        (
            "g.json",
            '{"options": {"lr": 0.5}, "defaults_from_data": 5}',
            "`defaults_from_data` is not a mapping of option names to the values the data chose",
        ),
        (
            "h.json",
            '{"options": {"lr": 0.5}, "defaults_from_data": [["lr"]]}',
            "`defaults_from_data` is not a mapping of option names to the values the data chose",
        ),
    ],
)
def test_unreadable_config_files_are_one_error_line(runner, tmp_path, name, text, message):
    recipe = tmp_path / name
    recipe.write_text(text)
    result = runner.invoke(app, ["train", "--config", str(recipe), "--print-config"])
    assert result.exit_code == 1, result.stdout[:300]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert message in lines[0] and "TORCHKIT_DEBUG" not in lines[0], lines[0]


def test_what_print_config_prints_is_a_recipe_for_the_same_options(runner, tmp_path):
    """Was refused: "'force' in printed.json is not taken from a config file" (the printed
    options hold `force: false` and `resume: null`)."""
    args = ["train", "--lr", "0.01", "--scheduler", "step", "--gamma", "0.5", "--print-config"]
    printed = runner.invoke(app, args)
    assert printed.exit_code == 0, printed.stderr
    recipe = tmp_path / "printed.json"
    recipe.write_text(printed.stdout)
    again = runner.invoke(app, ["train", "--config", str(recipe), "--print-config"])
    assert again.exit_code == 0, again.stderr
    assert json.loads(again.stdout) == json.loads(printed.stdout)
    recipe.write_text(json.dumps({**json.loads(printed.stdout), "force": True}))
    refused = runner.invoke(app, ["train", "--config", str(recipe), "--print-config"])
    assert refused.exit_code == 2 and "'force' in " in refused.stderr  # a force it asks for


def test_print_config_with_resume_shows_what_the_resumed_run_trains_with(runner, tmp_path):
    """Printed a new run's defaults beside `resume` (--epochs 25, --ema, --best-metric loss,
    no --early-stop), not the options the resumed run goes by."""
    run = tmp_path / "run"
    fast = ["-j", "0", "--device", "cpu", "--batch-size", "512", "--epochs", "1", *TINY_NET]
    train(runner, *fast, "--no-ema", "--best-metric", "top1", "--early-stop", "3", "--out", run)
    before = {p.name: p.stat().st_mtime_ns for p in run.iterdir()}
    again = ["train", "--resume", str(run), "--epochs", "4", "--lr", "0.01", "--print-config"]
    result = runner.invoke(app, again)
    assert result.exit_code == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["epochs"] == 4 and shown["lr"] == 0.01  # given again
    assert shown["ema"] is False and shown["best_metric"] == "top1"  # the run's own
    assert shown["early_stop"] == 3 and shown["batch_size"] == 512
    refused = runner.invoke(app, [*again, "--batch-size", "64"])
    assert refused.exit_code == 1 and "--batch-size cannot change" in refused.stderr
    assert {p.name: p.stat().st_mtime_ns for p in run.iterdir()} == before  # nothing written


def test_both_recipe_forms_choose_the_data_defaults_again_for_other_data(
    runner, tmp_path, image_folder
):
    """--print-config's recipe kept the digits' 12 px, no flips and one thread under
    `--config printed.json --data images/`, where the run's own config.json chose an image
    folder's: both now say which options the data chose, and both choose those again."""
    picked = ["--batch-size", "512", "--epochs", "1", "--flip"]  # set by the user: kept
    printed = runner.invoke(app, ["train", *picked, "--print-config"])
    assert printed.exit_code == 0, printed.stderr
    assert "image_size" in json.loads(printed.stdout)["defaults_from_data"]
    recipe = tmp_path / "printed.json"
    recipe.write_text(printed.stdout)
    # A run's config.json, as runner.py writes it (its options, and the data's choices apart).
    options = json.loads(printed.stdout)
    chosen_by_data = options.pop("defaults_from_data")
    run_config = tmp_path / "config.json"
    run_config.write_text(json.dumps({"options": options, "defaults_from_data": chosen_by_data}))
    for source in (recipe, run_config):
        args = ["train", "--config", str(source), "--data", str(image_folder), "--print-config"]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.stderr
        shown = json.loads(result.stdout)
        chosen = {k: shown[k] for k in ("model", "image_size", "resize_size", "threads")}
        assert chosen == {"model": "resnet18", "image_size": 224, "resize_size": 256,
                          "threads": None}, source  # fmt: skip
        assert (shown["flip"], shown["batch_size"], shown["epochs"]) == (True, 512, 1), source
        assert "flip" not in shown["defaults_from_data"], source


def test_a_value_the_data_chose_then_edited_in_the_recipe_is_kept(runner, tmp_path, image_folder):
    """A recipe records each option the data chose with the value it chose: the user who edits
    one (`image_size` 12 -> 16) in a printed recipe or a config.json keeps the edit, with the
    same data or other data; the options left as the data chose them are chosen again."""
    printed = runner.invoke(app, ["train", "--print-config"])
    assert printed.exit_code == 0, printed.stderr
    recipe = json.loads(printed.stdout)
    assert recipe["defaults_from_data"]["image_size"] == {"chosen": 12}
    recipe["image_size"] = 16
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(recipe))
    options = dict(recipe)
    run_config = tmp_path / "config.json"
    run_config.write_text(
        json.dumps({"defaults_from_data": options.pop("defaults_from_data"), "options": options})
    )
    for source in (edited, run_config):
        for data in ([], ["--data", str(image_folder)]):
            args = ["train", "--config", str(source), *data, "--print-config"]
            result = runner.invoke(app, args)
            assert result.exit_code == 0, result.stderr
            shown = json.loads(result.stdout)
            assert shown["image_size"] == 16, (source, data)
            assert "image_size" not in shown["defaults_from_data"], (source, data)
            assert shown["model"] == ("resnet18" if data else "convnet"), (source, data)


def test_a_textual_edit_of_a_printed_recipe_keeps_the_users_value(runner, tmp_path):
    """`sed 's/"epochs": 25/"epochs": 40/' r.json` also changed the value recorded under
    `defaults_from_data` (`"epochs": 25` there too), so the edit looked like the data's choice
    and was discarded (25 again): the record now reads `"epochs": {"chosen": 25}`."""
    printed = runner.invoke(app, ["train", "--print-config"])
    assert printed.exit_code == 0, printed.stderr
    assert printed.stdout.count('"epochs": 25') == 1
    edited = tmp_path / "edited.json"
    edited.write_text(printed.stdout.replace('"epochs": 25', '"epochs": 40'))
    result = runner.invoke(app, ["train", "--config", str(edited), "--print-config"])
    assert result.exit_code == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["epochs"] == 40 and "epochs" not in shown["defaults_from_data"]
    assert shown["defaults_from_data"]["image_size"] == {"chosen": 12}  # left as chosen


@pytest.mark.parametrize(
    "recorded",
    [["epochs", "image_size"], {"epochs": 25, "image_size": 12}],
    ids=["names", "values"],
)
def test_older_records_of_the_data_chosen_options_still_read(tmp_path, recorded):
    """Files written before `{"chosen": VALUE}`: a list of names (all chosen again), or each
    name with its bare value (an edited one kept)."""
    from torchkit.core.train.config_file import read_config_file

    recipe = tmp_path / "old.json"
    recipe.write_text(json.dumps({"epochs": 25, "image_size": 16, "lr": 0.5,
                                  "defaults_from_data": recorded}))  # fmt: skip
    options = read_config_file(recipe)
    assert "epochs" not in options and options["lr"] == 0.5
    assert ("image_size" in options) is isinstance(recorded, dict)


def test_a_recipe_with_another_model_chooses_its_mean_and_std_again(runner, tmp_path):
    """A googlenet recipe's mean/std 0.5 (what torchvision's googlenet weights expect) were
    carried to `--config googlenet.json --model resnet18`, and ImageNet's from a resnet18 recipe
    to googlenet's weights: both recipe forms now record mean/std as chosen, so another model
    chooses its own; a mean/std the user set stays."""
    printed = runner.invoke(app, ["train", "--model", "googlenet", "--weights", "DEFAULT",
                                  "--std", "0.25", "--print-config"])  # fmt: skip
    assert printed.exit_code == 0, printed.stderr
    recipe = json.loads(printed.stdout)
    assert recipe["defaults_from_data"]["mean"] == {"chosen": [0.5] * 3}
    assert "std" not in recipe["defaults_from_data"]  # the user's
    recipe_file = tmp_path / "googlenet.json"
    recipe_file.write_text(printed.stdout)
    options = dict(recipe)
    run_config = tmp_path / "config.json"
    run_config.write_text(
        json.dumps({"defaults_from_data": options.pop("defaults_from_data"), "options": options})
    )
    for source in (recipe_file, run_config):
        args = ["train", "--config", str(source), "--model", "resnet18", "--print-config"]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.stderr
        shown = json.loads(result.stdout)
        assert (shown["mean"], shown["std"]) == ([0.485, 0.456, 0.406], [0.25] * 3), source
    imagenet = runner.invoke(app, ["train", "--print-config"]).stdout
    (tmp_path / "plain.json").write_text(imagenet)
    args = [
        "--config",
        str(tmp_path / "plain.json"),
        "--model",
        "googlenet",
        "--weights",
        "DEFAULT",
    ]
    result = runner.invoke(app, ["train", *args, "--print-config"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["mean"] == [0.5] * 3


@pytest.mark.parametrize(("recipe_names_data", "noted"), [(True, False), (False, True)])
def test_the_no_data_note_is_left_out_when_the_recipe_names_the_data(
    runner, tmp_path, recipe_names_data, noted
):
    """A replayed config.json names its data (`"data": "digits"`): "no --data given: training on
    digits" would be false there. A recipe without `data` still gets the note. (The bad --lr
    stops the run right after the note.)"""
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps({"lr": -1, **({"data": "digits"} if recipe_names_data else {})}))
    result = runner.invoke(app, ["train", "--config", str(recipe), "--out", str(tmp_path / "r")])
    assert result.exit_code == 2, result.stderr
    assert "--lr must be positive" in result.stderr
    assert ("no --data given" in result.stderr) is noted, result.stderr


PRINT_ONE = "torchkit train --print-config prints a recipe to start from"


def _config_error(runner, config) -> tuple[int, str]:
    result = runner.invoke(app, ["train", "--config", str(config), "--print-config"])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and result.stdout == "", result.stderr
    return result.exit_code, lines[0]


def test_what_stands_at_a_config_name_that_is_no_recipe_is_named_with_what_to_give(
    runner, tmp_path
):
    """Each was a line without a hint ("config file not found: X", "cannot read config file X:
    'utf-8' codec can't decode ...", Typer's "file 'X' is a directory"), a socket "[Errno 6] No
    such device or address", and /dev/zero filled the memory."""
    import socket

    (tmp_path / "dangling.json").symlink_to(tmp_path / "nowhere")
    (tmp_path / "empty_folder").mkdir()
    (tmp_path / "latin1.yaml").write_bytes(b"model: caf\xe9\n")
    (tmp_path / "zeros.json").symlink_to("/dev/zero")
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(str(tmp_path / "sock"))
    try:
        socket_error = _config_error(runner, tmp_path / "sock")
    finally:
        listening.close()
    assert socket_error == (
        2, f"Error: --config {tmp_path}/sock is a socket, not a recipe file (give a JSON or "
        f"YAML file; {PRINT_ONE})",
    )  # fmt: skip
    assert _config_error(runner, tmp_path / "dangling.json") == (
        1, f"Error: config file not found: {tmp_path}/dangling.json, a link to nothing (give a "
        f"run's config.json or a JSON or YAML recipe; {PRINT_ONE})",
    )  # fmt: skip
    assert _config_error(runner, tmp_path / "empty_folder") == (
        2, f"Error: --config {tmp_path}/empty_folder is a folder, not a recipe file (give a "
        f"JSON or YAML file; {PRINT_ONE})",
    )  # fmt: skip
    assert _config_error(runner, tmp_path / "latin1.yaml") == (
        1, f"Error: config file {tmp_path}/latin1.yaml is not UTF-8 text: byte 0xe9 at offset "
        "10 (save it as UTF-8, the encoding JSON and YAML are read in)",
    )  # fmt: skip
    code, line = _config_error(runner, tmp_path / "zeros.json")
    assert code == 1 and line.startswith(f"Error: config file {tmp_path}/zeros.json holds more ")


def test_a_run_folder_given_as_config_names_its_config_json_which_works_as_given(
    runner, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my run").mkdir()
    (tmp_path / "my run" / "config.json").write_text('{"lr": 0.25}')
    code, line = _config_error(runner, "my run/")
    assert (code, line) == (
        2, "Error: --config 'my run' is a folder, not a recipe file (give the run's recipe in "
        "it: --config 'my run/config.json')",
    )  # fmt: skip
    followed = runner.invoke(app, ["train", "--config", "my run/config.json", "--print-config"])
    assert followed.exit_code == 0 and json.loads(followed.stdout)["lr"] == 0.25


def test_a_config_that_does_not_parse_says_to_fix_it_at_the_place_named(runner, tmp_path):
    (tmp_path / "r.json").write_text('{"lr": 1,}')
    (tmp_path / "r.yaml").write_text("lr: [1,\n")
    for name in ("r.json", "r.yaml"):
        code, line = _config_error(runner, tmp_path / name)
        assert code == 1 and line.endswith(f"(fix it at the place named; {PRINT_ONE})"), line
