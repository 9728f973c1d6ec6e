"""Each command's page in docs/commands/ describes every option its `--help` lists, and the pages
name no option that no command has: the pages and the CLI cannot drift apart unnoticed. The
options every command shares (output format and file, `--force`, verbosity) are described once,
in conventions.md."""

from __future__ import annotations

import re

from suite_paths import REPO

DOCS = REPO / "docs"
# Described once for every command in conventions.md (output formats, files, verbosity, --force).
SHARED = ("--format", "--output", "--out", "--force", "--quiet", "--verbose", "--help")
# Options of other programs that the pages show beside torchkit's (torchrun, Slurm, uv, curl...).
FOREIGN = {
    "--nproc_per_node", "--nproc-per-node", "--nnodes", "--node-rank", "--master-addr",
    "--master-port", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf",
    "--nodes", "--ntasks-per-node", "--gpus-per-node", "--cpus-per-task", "--mem", "--help",
    "--compressed", "--extra", "--no-sync", "--reinstall", "--check", "--compile-bytecode",
    "--index-url", "--torch-backend", "--sparse", "--use-train-size",
}  # fmt: skip
# Pages about the benchmark and development scripts, whose options are the scripts' own.
SCRIPT_PAGES = ("performance.md", "development.md")
OPTION = re.compile(r"(?<![\w-])--?[a-zA-Z][\w-]*")


def _commands(command, name: str = "") -> list:
    """(name, command) of every command that runs, sub-commands of a group included."""
    if hasattr(command, "commands"):  # a group (of typer's own click, or of click)
        return [
            found
            for sub, child in command.commands.items()
            for found in _commands(child, f"{name} {sub}".strip())
        ]
    return [(name, command)]


def _page(name: str) -> str:
    return (DOCS / "commands" / f"{name.split()[0]}.md").read_text(encoding="utf-8")


def _spellings(parameter) -> list[str]:
    return [*parameter.opts, *parameter.secondary_opts]


def _named(text: str) -> set[str]:
    """The options a text names: `--name` and short `-x` spellings."""
    return set(OPTION.findall(text))


def _without_other_programs(text: str) -> str:
    """A page without its sections about another program's options ("## Coming from ...",
    "## Against ...", "## Compared with ...")."""
    heading = r"^## (?:Coming from|Against|Compared with) "
    return re.sub(heading + r".*?(?=^## |\Z)", "", text, flags=re.M | re.S)


def test_every_option_of_a_command_is_on_its_page(_torchkit_command):
    missing = []
    for name, command in _commands(_torchkit_command):
        named = _named(_page(name))
        for parameter in command.params:
            if parameter.param_type_name != "option" or parameter.hidden:
                continue
            spellings = _spellings(parameter)
            if not set(spellings) & set(SHARED) and not named & set(spellings):
                missing.append(f"{name}: {'/'.join(spellings)}")
    assert not missing, missing


def test_the_shared_options_are_described_in_conventions():
    named = _named((DOCS / "conventions.md").read_text(encoding="utf-8"))
    assert set(SHARED) - {"--help"} <= named


def test_every_option_a_page_names_exists(_torchkit_command):
    """An option on a page about the commands (README, docs/) is a spelling of some command's:
    a renamed or removed option cannot stay documented. Sections that map another program's
    options onto torchkit's ("## Coming from ...", "## Against ...") name that program's too."""
    known = {
        spelling
        for _, command in [("", _torchkit_command), *_commands(_torchkit_command)]
        for parameter in command.params
        for spelling in _spellings(parameter)
    }
    for page in [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]:
        if page.name in SCRIPT_PAGES:
            continue
        text = _without_other_programs(page.read_text(encoding="utf-8"))
        unknown = {name for name in _named(text) if name.startswith("--")} - known - FOREIGN
        assert not unknown, f"{page.relative_to(REPO)}: {sorted(unknown)}"


def test_train_page_names_every_option_fixed_on_resume():
    """train.md's list of the options that cannot change on resume is the one train enforces: an
    option added to the rules (--interpolation, --crop-mode) cannot be left off the page."""
    from torchkit.core.train.option_specs import default_flag
    from torchkit.core.train.resume_rules import FIXED_ON_RESUME

    text = _page("train")
    rule = re.search(r"\*\*What may change on resume:\*\*(.*?)(?=^- \*\*|^## )", text, re.M | re.S)
    assert rule, "train.md has no 'What may change on resume' item"
    cannot = rule.group(1).split("cannot", 1)[1].split("; another value", 1)[0]
    named = _named(cannot)
    missing = [default_flag(name) for name in FIXED_ON_RESUME if default_flag(name) not in named]
    assert not missing, missing


def test_recipe_edits_in_the_docs_change_an_option():
    """An example that edits what `train --print-config` prints (`jq '.NAME = VALUE'`) sets a
    value other than the default it prints: an edit that changes nothing teaches nothing."""
    import json

    from torchkit.core.train.config import TrainConfig

    defaults = TrainConfig()
    edits = [
        (page, name, value)
        for page in [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]
        for name, value in re.findall(
            r"--print-config.*\| jq '\.(\w+) = ([^']+)'", page.read_text(encoding="utf-8")
        )
    ]
    assert edits
    unchanged = [(p.name, n) for p, n, v in edits if json.loads(v) == getattr(defaults, n)]
    assert not unchanged, unchanged


def test_the_commands_said_to_take_data_take_it(_torchkit_command):
    """data.md lists the commands that read a dataset, the README's `--data` row those that
    also take it as an argument: each has `--data` (convert shards, listed, took only its SRC),
    and every command with both is in the README's list."""
    commands = dict(_commands(_torchkit_command))
    data_page = (DOCS / "data.md").read_text(encoding="utf-8")
    listed = re.search(r"reads every `--data` option.*?\((.*?)\)", data_page, re.S)
    assert listed, "data.md names no commands that read --data"
    readers = re.findall(r"`([a-z -]+)`", listed.group(1))
    row = next(
        line for line in (REPO / "README.md").read_text(encoding="utf-8").splitlines()
        if line.startswith("| `--data` |")
    )  # fmt: skip
    as_argument = set(re.findall(r"`([a-z -]+)`", row.split("also as an argument")[0]))
    with_both = set()
    for name, command in commands.items():
        positional = {p.name for p in command.params if p.param_type_name == "argument"}
        if "--data" in _named_options(command) and positional - {"model", "out"}:
            with_both.add(name)
    assert set(readers) <= set(commands)
    assert [name for name in readers if "--data" not in _named_options(commands[name])] == []
    assert with_both == as_argument - {"--data"}, (sorted(with_both), sorted(as_argument))


def _named_options(command) -> set[str]:
    return {spelling for parameter in command.params for spelling in _spellings(parameter)}
