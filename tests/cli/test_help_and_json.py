"""What a user sees (issue #18): every command's `--help` (no `<bool>` after flags, arguments
named alike, examples at the end), weights downloads kept off stdout, and shell completion that
builds only what the word being completed needs."""

from __future__ import annotations

import functools
import json
import re
import sys

import pytest
from cli_commands import COMMANDS
from completion_runs import completions_in_one_process
from typer.testing import CliRunner

from torchkit.cli import app

runner = CliRunner()

# The commands this part gave examples, 2 to 4 each, as the README shows them.
EXAMPLES_HERE = {
    ("env",),
    ("video-info",),
    ("convert",),
    ("convert", "tensor"),
    ("convert", "cifar"),
    ("convert", "checkpoint"),
    ("convert-syncbn",),
    ("summary",),
}


@functools.cache  # the tests only read it; a help page costs about 0.1 s of CPU to render
def help_text(path: tuple[str, ...], width: int = 100) -> str:
    result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    return result.stdout


def usage_line(text: str) -> str:
    return next(line for line in text.splitlines() if "Usage:" in line).strip()


def type_column(text: str) -> list[str]:
    """The cells between the option names and the help in the Options/Arguments panels."""
    cells = []
    for line in text.splitlines():
        match = re.match(r"│\s*\*?\s*(-[-\w]+(?:, -[-\w]+)*|[A-Z][A-Z_.|]*)\S*(.*)│$", line)
        if match:  # the type's cell ends where two spaces start the help's
            cells.append(re.split(r"\s{2,}", match.group(2).strip())[0])
    return cells


def example_lines(text: str) -> list[str]:
    lines = [line.strip() for line in text.splitlines()]
    if "Examples:" not in lines:
        return []
    after = lines[lines.index("Examples:") + 1 :]
    examples = []
    for line in after:
        if line.startswith(("torchkit ", "torchrun ")) or line == "torchkit":
            examples.append(line)
        elif line.startswith("╭"):
            break
    return examples


@pytest.mark.parametrize("group", [(), ("convert",)], ids=["torchkit", "convert"])
def test_a_group_without_a_command_shows_its_help_on_stdout_and_exits_0(group):
    """Bare `torchkit` and `torchkit convert` give the help `--help` gives, as docker, kubectl
    and pip do: they exited 2, a usage error, with the help on stdout all the same."""
    bare = runner.invoke(app, list(group), env={"COLUMNS": "100"})
    assert bare.exit_code == 0, bare.output
    assert bare.stdout == help_text(group) and bare.stderr == ""
    # Options without a command are still a command line without its command: exit 2.
    quiet = runner.invoke(app, [*group, "-q"])
    assert quiet.exit_code == 2 and "Missing command" in quiet.stderr


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "torchkit")
def test_help_shows_no_bool_metavar_and_one_way_of_naming_arguments(path):
    text = help_text(path)
    assert "<bool>" not in text  # a flag takes no value
    assert "<list[" not in text and " range>" not in text
    usage = usage_line(text)
    assert "{" not in usage and "<" not in usage, usage  # SRC, [DST], PATH...: click's way
    words = usage.split()[usage.split().index("[OPTIONS]") + 1 :] if "[OPTIONS]" in usage else []
    for word in words:
        assert re.fullmatch(r"\[?[A-Z][A-Z_|]*\]?(\.\.\.)?", word), usage
    for cell in type_column(text):
        assert not re.search(r"\{\w+\}", cell), cell


# `torchkit --help` itself lists the commands instead.
@pytest.mark.parametrize("path", [p for p in COMMANDS if p], ids=" ".join)
def test_every_command_ends_with_examples(path):
    text = help_text(path)
    examples = example_lines(text)
    assert len(examples) >= 2, text
    command = "torchkit " + " ".join(path)
    assert all(line.startswith(command) or "torchkit " + path[0] in line for line in examples)
    if path in EXAMPLES_HERE:
        assert 2 <= len(examples) <= 4, examples


def test_examples_render_one_per_line_even_after_prose():
    """summary's examples were one wrapped paragraph; video-info and env have prose before
    their Examples block, which must not indent it differently."""
    for path in [("summary",), ("video-info",), ("env",), ("convert-syncbn",)]:
        lines = help_text(path).splitlines()
        examples = [line for line in lines if line.strip().startswith("torchkit ")]
        assert examples, path
        assert {len(line) - len(line.lstrip()) for line in examples} == {1}, path
        assert all(line.count("torchkit ") == 1 or "&&" in line for line in examples), path


def test_flags_have_no_type_but_options_with_values_do():
    text = help_text(("video-info",))
    rows = {line.split()[1]: line for line in text.splitlines() if line.startswith("│ --")}
    assert "<" not in rows["--exact"] and "<" not in rows["--skip-errors"]
    # --seed's bounds are core's one seed rule, checked by a callback (not shown as click's)
    assert "<int>" in rows["--seed"] and "<table | csv |" in rows["--format"]  # json | jsonl>
    assert "K [x>=1]" in rows["--segments"]
    assert usage_line(text).endswith("[OPTIONS] PATH...")


@pytest.mark.parametrize("width", [70, 80, 100, 120, 160])
def test_convert_help_has_no_stray_dots_and_whole_choices(width):
    """`[default: ...]` was read as a rich style and dropped, leaving "side ." behind; the
    `--to` choices folded inside a word ("safe / tensors")."""
    text = help_text(("convert", "tensor"), width)
    flat = " ".join(text.replace("│", " ").split())
    assert " ." not in flat.replace(" .npy", "").replace(" .pt", "").replace(" .safetensors", "")
    assert "[default: hwc for .npy, chw for .pt and .safetensors]" in flat
    assert "[default: 1]" in flat
    assert re.search(r"\bsafetensors\.", flat)  # the --to choices end whole
    for line in text.splitlines():
        assert not re.search(r"safe\s*│?\s*$", line), line
    summary = " ".join(help_text(("summary",), width).replace("│", " ").split())
    assert "Batch size. [default: 1]" in summary


def test_command_lists_show_each_summary_as_one_paragraph():
    text = help_text(())
    train = next(i for i, line in enumerate(text.splitlines()) if line.startswith("│ train "))
    following = text.splitlines()[train + 1]
    # The docstring's own line break after "curves.png," no longer ends the line early.
    assert not following.rstrip("│ ").endswith("curves.png,")
    assert "curves.png," in text.splitlines()[train] or "curves.png, config.json" in following


# --- JSON -----------------------------------------------------------------------------------------


def test_weights_download_line_goes_to_stderr(monkeypatch, tmp_path):
    """torch.hub writes `Downloading: "https://..."` with sys.stdout.write; `--format json` on
    stdout must stay parseable the first time the weights are fetched."""
    import torchvision
    import torchvision.models._api as api

    from torchkit.core.models import hub_cache

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))  # an empty cache: a download starts
    monkeypatch.setattr(hub_cache, "_unreachable", lambda url: None)  # the server answers

    def download(url, *args, **kwargs):
        sys.stdout.write(f'Downloading: "{url}" to /cache/checkpoints/weights.pth\n')
        return torchvision.models.squeezenet1_1().state_dict()

    monkeypatch.setattr(api, "load_state_dict_from_url", download)
    args = ["summary", "squeezenet1_1", "--weights", "DEFAULT", "-i", "3,64,64", "--depth", "0"]
    result = runner.invoke(app, [*args, "--no-flops", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)  # nothing but the result
    assert data["totals"]["total_params"] == 1_235_496
    assert 'Downloading: "https://download.pytorch.org/models/squeezenet1_1' in result.stderr


def test_json_has_no_yes_no_strings_anywhere(tmp_path):
    """One sweep over the commands of this part: a value that reads yes/no/true/false/none as a
    string is a boolean or null that was written as text."""
    import cv2
    import numpy as np
    import torch

    video = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(video), cv2.CAP_FFMPEG, cv2.VideoWriter_fourcc(*"MJPG"), 5, (8, 8))
    for index in range(6):
        writer.write(np.full((8, 8, 3), index * 40, dtype=np.uint8))
    writer.release()
    torch.save({"w": torch.ones(2), "n": torch.tensor(3)}, tmp_path / "sd.pt")
    runs = [
        ["env"],
        ["video-info", str(video), "-k", "2"],
        ["summary", "convnet", "-i", "1,8,8", "--no-flops"],
        ["convert-syncbn", "convnet"],
        ["convert", "checkpoint", str(tmp_path / "sd.pt"), str(tmp_path / "sd.safetensors")],
    ]

    def strings(value):
        if isinstance(value, dict):
            for item in value.values():
                yield from strings(item)
        elif isinstance(value, list):
            for item in value:
                yield from strings(item)
        elif isinstance(value, str):
            yield value

    for args in runs:
        result = runner.invoke(app, [*args, "--format", "json"])
        assert result.exit_code == 0, (args, result.stderr)
        data = json.loads(result.stdout)
        if args == ["env"]:  # the variables' values are the user's own text
            data.pop("environment")
        texts = {text.strip().lower() for text in strings(data)}
        assert not texts & {"yes", "no", "true", "false", "none", "null", "nan"}, args


# --- completion -----------------------------------------------------------------------------------


# TAB presses answered by real `python -m torchkit` processes, all in one fresh interpreter
# (`completions_in_one_process`): bash's, whose imports are checked, before zsh's (its help texts
# render with rich).
BASH_TAB_PRESSES = {  # COMP_WORDS: COMP_CWORD
    "torchkit su": "1",
    "torchkit summary --de": "2",
    "torchkit convert checkpoint --st": "3",
}
ZSH_COMMAND_NAMES = {"_TORCHKIT_COMPLETE": "complete_zsh", "_TYPER_COMPLETE_ARGS": "torchkit "}


@pytest.fixture(scope="module")
def tab_presses() -> dict[str, tuple[list[str], set[str]]]:
    """The lines printed and the modules imported, for each of BASH_TAB_PRESSES (by its words)
    and then ZSH_COMMAND_NAMES ("zsh")."""
    bash = [
        {"_TORCHKIT_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": cword}
        for words, cword in BASH_TAB_PRESSES.items()
    ]
    answers = completions_in_one_process([*bash, ZSH_COMMAND_NAMES])
    return dict(zip([*BASH_TAB_PRESSES, "zsh"], answers, strict=True))


@pytest.mark.parametrize("words", BASH_TAB_PRESSES)
def test_completion_imports_neither_pydantic_nor_rich(tab_presses, words):
    """What made a TAB press take 0.3-0.45 s: Typer's value coercion (pydantic, ~50 ms), rich's
    console, and building every command's options to complete one word."""
    lines, imported = tab_presses[words]
    assert lines and all(line.startswith(words.split()[-1]) for line in lines)
    top = {name.split(".")[0] for name in imported}
    assert not top & {"pydantic", "rich", "torch", "cv2"}, sorted(top)


def test_completion_builds_only_the_command_being_completed(monkeypatch):
    app_module = sys.modules["torchkit.cli.app"]  # `torchkit.cli.app` is also the Typer app

    def names(words: str, cword: int) -> tuple[list[str], list[str]]:
        monkeypatch.setenv("COMP_WORDS", words)
        monkeypatch.setenv("COMP_CWORD", str(cword))
        commands, groups = app_module._for_completion(app)
        return [info.name for info in commands], [info.name for info in groups]

    every, _ = names("torchkit ", 1)
    assert set(every) >= {"env", "summary", "video-info", "convert"}  # placeholders
    assert names("torchkit -v summary resn", 3) == (["summary"], [])
    assert names("torchkit convert ch", 2) == ([], ["convert"])
    assert len(names("torchkit nonsense --x", 2)[0]) == len(app.registered_commands)
    monkeypatch.delenv("COMP_WORDS")
    monkeypatch.setenv("_TYPER_COMPLETE_ARGS", "torchkit env --format ")  # zsh and fish
    assert app_module._for_completion(app)[0][0].name == "env"
    assert len(app.registered_commands) > 5  # the app itself is left as it was


def test_zsh_completion_of_command_names_keeps_their_help(tab_presses):
    lines, _ = tab_presses["zsh"]
    text = "\n".join(lines)
    assert '"env":"Report Python, OS, CPU' in text
    assert '"convert":"Convert images, arrays and tensors' in text


def test_json_of_the_data_and_training_commands_has_typed_values(
    tmp_path, make_image_folder, monkeypatch
):
    """The same sweep for dataset-stats, split, train, eval and predict: numbers are numbers,
    flags are booleans, missing values null."""
    data = make_image_folder(tmp_path / "data", {"a": 4, "b": 4}, size=8)
    run = tmp_path / "run"
    runs = [
        ["dataset-stats", str(data), "-j", "0"],
        ["split", str(data), str(tmp_path / "out"), "--mode", "manifest"],
        ["train", "--data", str(data), "--model", "convnet", "--image-size", "8", "--epochs",
         "1", "-j", "0", "--out", str(run), "--val-split", "0.5"],
        ["eval", str(run / "best.pt"), "--data", str(data), "-j", "0"],
        ["predict", str(run / "best.pt"), str(data), "-j", "0"],
    ]  # fmt: skip

    def values(value):
        if isinstance(value, dict):
            for item in value.values():
                yield from values(item)
        elif isinstance(value, list):
            for item in value:
                yield from values(item)
        else:
            yield value

    for args in runs:
        result = runner.invoke(app, [*args, "--format", "json"])
        assert result.exit_code == 0, (args, result.stderr)
        data_out = json.loads(result.stdout)
        # Options echoed as given are text even when their value is the word none
        # (`--tta none`, train's `--class-weights none`).
        if isinstance(data_out, dict):
            data_out.pop("config", None)
            data_out.pop("tta", None)
        texts = {v.strip().lower() for v in values(data_out) if isinstance(v, str)}
        assert not texts & {"yes", "no", "true", "false", "none", "null", "nan"}, args
        numeric_looking = [
            v for v in values(data_out) if isinstance(v, str) and v.replace(".", "", 1).isdigit()
        ]
        assert not numeric_looking or args[0] in ("split", "predict"), (args, numeric_looking[:3])


def choice_options(root, path: tuple[str, ...]) -> dict[str, list[str]]:
    """--option -> its choices, for the options of a command (of the command tree `root`) that
    take one of a few values."""
    command = root
    for name in path:
        command = command.commands[name]
    return {
        next(opt for opt in param.opts if opt.startswith("--")): [
            getattr(choice, "value", choice) for choice in param.type_descriptor.choices
        ]
        for param in command.params
        if param.param_type_name == "option"
        and param.type_descriptor.is_choice
        and param.metavar is None  # named otherwise (`--to FORMAT`): no choices shown
        and not param.hidden
    }


@pytest.mark.parametrize("path", [p for p in COMMANDS if p], ids=" ".join)
def test_choices_wrap_whole_at_80_columns(_torchkit_command, path):
    """`train --help` at 80 columns cut `<cosine|step|mul` / `tistep|exponenti` mid-word."""
    lines = help_text(path, 80).splitlines()
    for option, choices in choice_options(_torchkit_command, path).items():
        # A long name is cut at 80 columns (`--autoaugment-poli…`): its line starts so.
        name = rf"(?:{re.escape(option)}[ ,]|{re.escape(option[:18])}…)"
        start = next(i for i, line in enumerate(lines) if re.match(rf"│ {name}", line))
        end = next(
            i
            for i in range(start + 1, len(lines))
            if re.match(r"│\s*-", lines[i]) or lines[i].startswith("╰")
        )
        column = lines[start].index("<")  # the type column, then two spaces, then the help
        cell = " ".join(line[column:].split("  ")[0].strip() for line in lines[start:end])
        for choice in choices:
            assert re.search(rf"[<|] ?{re.escape(str(choice))} ?[|>]", cell), (option, cell)


@pytest.mark.parametrize("path", [("train",), ("extract-features",)])
def test_seed_help_shows_no_20_digit_bounds(path):
    """`--seed` showed `[-9223372036854775808<=x<=18446744073709551615]`; out-of-range seeds
    are still usage errors (test_train_cli)."""
    text = help_text(path, 80)
    assert "9223372036854775808" not in text and "18446744073709551615" not in text


def test_every_model_option_is_also_m(_torchkit_command):
    """`train -m` and `eval -m` took the model, but `predict -m` (summary, export, benchmark,
    extract-features) was `No such option: -m`: one spelling in every command."""
    from processes import run_torchkit_in_process

    with_model = []
    for path in COMMANDS:
        command = _torchkit_command
        for name in path:
            command = command.commands[name]
        for param in command.params:
            if "--model" in getattr(param, "opts", ()):
                with_model.append(path[0])
                assert "-m" in param.opts, f"torchkit {' '.join(path)}: {param.opts}"
    assert {"train", "eval", "predict", "summary", "export", "benchmark"} <= set(with_model)
    done = run_torchkit_in_process("summary", "-m", "convnet", "--params-only", "--format", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["model"] == "ConvNet"
