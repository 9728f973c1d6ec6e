"""Every `torchkit train` option is declared once, on its TrainConfig field: the command's
parameters are generated from those declarations, so the two cannot drift apart."""

from __future__ import annotations

import dataclasses
import json

import pytest

from torchkit.cli import app
from torchkit.cli.spec_options import field_value
from torchkit.core.train.config import TRAIN_OPTIONS, TrainConfig
from torchkit.core.train.config_file import NOT_IN_A_RECIPE
from torchkit.core.train.resume_rules import FIXED_ON_RESUME
from torchkit.core.train.setup import effective_config
from torchkit.core.train.validation import option_name

# Parameters of `train` that are not training options, and those every command has.
NOT_TRAINING_OPTIONS = {"stats", "config_file", "print_config", "fmt", "output"}
EVERY_COMMAND = {"verbose", "quiet", "help"}
# What TrainConfig records about a run, never given on the command line.
BOOKKEEPING = {"data_defaults"}


@pytest.fixture
def train_params(_torchkit_command) -> dict:
    return {param.name: param for param in _torchkit_command.commands["train"].params}


def test_every_field_is_an_option_with_help_and_every_option_a_field(train_params):
    fields = {f.name for f in dataclasses.fields(TrainConfig)} - BOOKKEEPING
    assert set(TRAIN_OPTIONS) == fields
    assert set(train_params) - EVERY_COMMAND == fields | NOT_TRAINING_OPTIONS
    for name in fields:
        assert train_params[name].help, f"--{name} has no help"


def test_each_option_is_spelled_and_placed_as_declared(train_params):
    for name, spec in TRAIN_OPTIONS.items():
        param = train_params[name]
        assert param.opts[0] == spec.name == option_name(name)
        if not spec.shared:
            spelled = [*param.opts, *param.secondary_opts]
            assert spelled == [s for flag in spec.flags for s in flag.split("/")], name
            assert param.rich_help_panel == spec.panel, name
            assert param.help == spec.help, name


def test_the_generated_defaults_are_the_dataclass_defaults(train_params):
    defaults = TrainConfig()
    for name, spec in TRAIN_OPTIONS.items():
        generated = field_value(spec, train_params[name].default)
        assert generated == getattr(defaults, name), name


def test_resume_help_names_the_fixed_options_as_the_command_line_does():
    help_text = TRAIN_OPTIONS["resume"].help
    for name in FIXED_ON_RESUME:
        assert option_name(name) in help_text


@pytest.mark.parametrize("name", [name for name, spec in TRAIN_OPTIONS.items() if spec.choices])
def test_choices_come_from_the_declared_list(runner, name):
    spec = TRAIN_OPTIONS[name]
    for choice in spec.choices:
        result = runner.invoke(app, ["train", spec.name, choice.upper(), "--print-config"])
        if result.exit_code == 0:  # a valid choice may still contradict the defaults
            assert json.loads(result.stdout)[name] == choice
        else:
            assert "Invalid value" not in result.stderr, result.stderr
    refused = runner.invoke(app, ["train", spec.name, "no-such-choice", "--print-config"])
    assert refused.exit_code == 2 and "no-such-choice" in refused.stderr


GIVEN = [
    "-d", "digits", "--val-split", "0.2", "--image-size", "16", "--resize-size", "20",
    "--mean", "0.5", "--std", "0.25,0.25,0.25", "--no-flip", "--crop-scale", "0.5,1",
    "--augment", "trivialaugment", "--random-erasing", "0.25", "--decode", "exact",
    "--interpolation", "bicubic", "-m", "convnet", "--freeze-backbone", "--head-lr-mult", "5",
    "-e", "3", "-b", "16", "--optimizer", "sgd", "--lr", "0.01", "--momentum", "0.8",
    "--nesterov", "--wd", "0.001", "--scheduler", "multistep", "--milestones", "1,2",
    "--gamma", "0.5", "--label-smoothing", "0", "--mixup-alpha", "0.2", "--clip-grad", "1",
    "--accum-steps", "2", "--no-ema", "--amp-dtype", "bf16", "--no-channels-last",
    "--seed", "3", "--deterministic", "--device", "cpu", "--dist-timeout", "60", "-j", "0",
    "--strict", "--out", "somewhere", "--save-every", "2", "--keep", "1", "--early-stop", "4",
    "--best-metric", "top1",
]  # fmt: skip


def test_print_config_round_trips_through_train_config(runner, tmp_path):
    result = runner.invoke(app, ["train", *GIVEN, "--print-config"])
    assert result.exit_code == 0, result.stderr
    printed = json.loads(result.stdout)
    assert list(printed) == [*TRAIN_OPTIONS, "defaults_from_data"]
    expected = TrainConfig(
        val_split=0.2, image_size=16, resize_size=20, mean=(0.5,), std=(0.25, 0.25, 0.25),
        flip=False, crop_scale=(0.5, 1.0), augment="trivialaugment", random_erasing=0.25,
        decode="exact", interpolation="bicubic", model="convnet", freeze_backbone=True,
        head_lr_mult=5.0, epochs=3, batch_size=16, optimizer="sgd", lr=0.01, momentum=0.8,
        nesterov=True, weight_decay=0.001, scheduler="multistep", milestones=(1, 2), gamma=0.5,
        label_smoothing=0.0, mixup_alpha=0.2, clip_grad=1.0, accum_steps=2, ema=False,
        amp_dtype="bf16", channels_last=False, seed=3, deterministic=True, device="cpu",
        dist_timeout=60.0, workers=0, strict=True, out="somewhere", save_every=2, keep=1,
        early_stop=4, best_metric="top1",
    )  # fmt: skip
    assert printed == effective_config(expected)
    read_back = TrainConfig.from_dict(printed).to_dict()
    options = {name: value for name, value in printed.items() if name in TRAIN_OPTIONS}
    assert {name: value for name, value in read_back.items() if name in TRAIN_OPTIONS} == options
    # The printed options, replayed as a recipe (without what only a command line may say),
    # print the same options.
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps({k: v for k, v in printed.items() if k not in NOT_IN_A_RECIPE}))
    replayed = runner.invoke(app, ["train", "--config", str(recipe), "--print-config"])
    assert replayed.exit_code == 0, replayed.stderr
    assert json.loads(replayed.stdout) == printed


def test_only_the_options_given_override_a_recipe(runner, tmp_path):
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps({"lr": 0.02, "seed": 5, "mean": [0.1], "std": [0.2]}))
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps({"mean": [0.3, 0.3, 0.3], "std": [0.4, 0.4, 0.4]}))
    default_valued = ["--lr", str(TrainConfig.lr), "--stats", str(stats)]
    result = runner.invoke(
        app, ["train", "--config", str(recipe), *default_valued, "--print-config"]
    )
    assert result.exit_code == 0, result.stderr
    printed = json.loads(result.stdout)
    assert printed["lr"] == TrainConfig.lr  # given, though it is the default
    assert printed["seed"] == 5  # not given: the recipe's
    assert printed["mean"] == [0.3] * 3 and printed["std"] == [0.4] * 3  # --stats gives both


def test_a_value_outside_its_options_bounds_is_refused_naming_the_option_and_range():
    """One check (`check_ranges`) of every option's declared minimum and maximum, for the
    values a recipe, a resumed run or Python gives, which the command line's parser never
    sees."""
    from torchkit.core.io.errors import UsageError
    from torchkit.core.option_specs import check_ranges, option

    @dataclasses.dataclass
    class Counts:
        steps: int = option(1, minimum=1, maximum=10)
        share: float = option(0.5, minimum=0, maximum=1)
        name: str = option("x")

    check_ranges(Counts())
    check_ranges(Counts(steps=10, share=1.0))
    for wrong, said in [
        (Counts(steps=11), "--steps 11 is out of range"),
        (Counts(steps=0), "--steps 0 is out of range"),
        (Counts(share=1.5), "--share 1.5 is out of range"),
    ]:
        with pytest.raises(UsageError, match=said) as refused:
            check_ranges(wrong)
        hints = ("give a whole number from 1 to 10", "give a number from 0 to 1")
        assert refused.value.hint in hints
