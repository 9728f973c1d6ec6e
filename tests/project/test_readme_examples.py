"""Every `torchkit ...` command line in README.md, in docs/ and in the commands' --help examples
parses: the command exists and every option and value it gives is one the command takes (examples
must not drift from the CLI), and none asks eval, predict or extract-features to run a model with
random weights, which they refuse. The lines are parsed as the shell and click would, without
running anything. README has an example of every command, and every command has its page in
docs/commands/."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from suite_paths import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"
SHELL_ENDS = {"|", "||", "&&", ";", ">", ">>", "2>", "<", "&"}
# Eager options whose callbacks act while the line is parsed (install into the shell's rc
# file, print and exit): their lines are checked for the option's existence only.
EAGER = ("--install-completion", "--show-completion", "--version", "-V", "--help", "-h")


def _documents() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def _command_lines(document: Path) -> list[str]:
    """The torchkit command lines of a document's bash blocks (after `uv run` or a `&&`)."""
    text = document.read_text(encoding="utf-8")
    lines: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            line = line.split(" #", 1)[0].strip()
            for part in re.split(r"&&|\|\||;", line):
                part = part.strip().removeprefix("uv run ").strip()
                if part.startswith("torchkit "):
                    lines.append(part)
    return lines


def _readme_commands() -> list[str]:
    return _command_lines(README)


COMMANDS = _readme_commands()
DOC_COMMANDS = [
    pytest.param(line, id=f"{path.relative_to(REPO)}: {line}")
    for path in _documents()
    for line in _command_lines(path)
]


def _help_command_lines() -> list[tuple[str, str]]:
    """(command, line) for the `torchkit ...` example lines of every command's --help."""
    import typer.main

    from torchkit.cli import app

    found = []
    pending = [("", typer.main.get_command(app))]
    while pending:
        name, command = pending.pop()
        if hasattr(command, "commands"):
            pending += [(f"{name} {sub}".strip(), cmd) for sub, cmd in command.commands.items()]
        for text in (command.help or "").splitlines():
            for part in re.split(r"&&|\|\|?|;", text):
                part = re.sub(r"\s+\(.*$", "", part.strip())  # a comment in parentheses
                if part.startswith("torchkit "):
                    found.append((name, part))
    return found


HELP_COMMANDS = [
    pytest.param(line, id=f"torchkit {name} --help: {line}") for name, line in _help_command_lines()
]


def _words(line: str) -> list[str]:
    words = []
    for word in shlex.split(line)[1:]:
        if word in SHELL_ENDS or word.startswith((">", "2>")):
            break
        words.append(word)
    return words


def test_the_readme_has_examples_of_every_command(_torchkit_command):
    names = set(_torchkit_command.commands)
    used = {_words(line)[0] for line in COMMANDS if _words(line)}
    assert names <= used, sorted(names - used)


@pytest.mark.parametrize(
    "line",
    ["torchkit train --data digits --no-such-option", "torchkit convert nothing a b", "torchkit x"],
)
def test_a_drifted_line_fails(line, _torchkit_command):
    """The check can fail: an unknown option, sub-command or command."""
    with pytest.raises(Exception) as caught:  # click's usage errors, or the assertion
        _parsed(line, _torchkit_command)
    assert "NoSuchOption" in type(caught.value).__name__ or isinstance(caught.value, AssertionError)


def _parsed(line: str, command):
    """The click context `line` parses into (raises when the line is wrong), or None for a
    line with an eager option, which must then be an option of the app, nothing more."""
    words = _words(line)
    eager = [word for word in words if word in EAGER]
    if eager:  # parsing would run them
        names = {name for param in command.params for name in param.opts}
        assert set(eager) <= names | {"--help", "-h"}, line
        return None
    return _context(line, command)


# What a model file's name ends with (models.md): a MODEL that names none of them is built with
# random weights, which eval, predict and extract-features refuse without --weights.
MODEL_FILES = (".pt", ".pth", ".ckpt", ".bin", ".safetensors", ".onnx", ".ts", ".pt2")


@pytest.mark.parametrize("line", DOC_COMMANDS + HELP_COMMANDS)
def test_a_readme_command_line_parses_and_runs_no_model_with_random_weights(
    line, _torchkit_command
):
    """The line parses as the command's own (`_parsed`), and an example of eval, predict or
    extract-features that names an architecture gives it weights (these commands refuse random
    weights: the line would end in a usage error). One test a line, parsed once for both."""
    context = _parsed(line, _torchkit_command)
    if context is None:
        return
    params = context.params
    if "allow_untrained" not in params or params.get("list_layers"):
        return
    named = [params.get("model"), params.get("model_option")]
    trained = params.get("weights") or params["allow_untrained"]
    assert trained or any(str(spec).endswith(MODEL_FILES) for spec in named if spec), line


def _context(line: str, command):
    """The click context a command line parses into (raises when the line is wrong)."""
    words = _words(line)
    parent = None
    while hasattr(command, "commands"):  # a group: its options, then a sub-command
        position = next((i for i, word in enumerate(words) if not word.startswith("-")), None)
        assert position is not None, f"no command in: {line}"
        known = {name for param in command.params for name in param.opts}
        assert set(words[:position]) <= known, line
        parent = command.context_class(command, info_name=command.name, parent=parent)
        found = command.get_command(parent, words[position])
        assert found is not None, f"no command {words[position]!r} in: {line}"
        command, words = found, words[position + 1 :]
    return command.make_context(command.name or "", list(words), parent=parent)


def test_every_document_has_command_lines_to_check():
    """The docs pages are found and read: a page moved or renamed would silently drop its lines."""
    assert (DOCS / "index.md").is_file()
    for page in sorted((DOCS / "commands").glob("*.md")):
        assert _command_lines(page), page


def test_every_command_has_a_page_listed_in_the_index(_torchkit_command):
    pages = {page.stem for page in (DOCS / "commands").glob("*.md")}
    assert set(_torchkit_command.commands) <= pages, sorted(set(_torchkit_command.commands) - pages)
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    for page in sorted(DOCS.rglob("*.md")):
        if page.name != "index.md":
            assert f"({page.relative_to(DOCS).as_posix()})" in index, page


def test_relative_links_between_documents_resolve():
    for document in _documents():
        text = document.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" in target:
                continue
            assert (document.parent / target).exists(), f"{document.relative_to(REPO)}: {target}"


def _heading_anchors(document: Path) -> set[str]:
    """The anchors GitHub gives a document's headings (lower case, punctuation dropped, spaces as
    hyphens, a repeated heading numbered -1, -2...), fenced code blocks left out."""
    text = re.sub(r"^```.*?^```", "", document.read_text(encoding="utf-8"), flags=re.M | re.S)
    anchors: set[str] = set()
    for heading in re.findall(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchor, repeat = slug, 0
        while anchor in anchors:
            repeat += 1
            anchor = f"{slug}-{repeat}"
        anchors.add(anchor)
    return anchors


def test_heading_anchors_follow_github(tmp_path):
    """The anchors are GitHub's: code spans, slashes and colons dropped, a repeat numbered, and a
    `# comment` in a code block is no heading."""
    page = tmp_path / "page.md"
    page.write_text(
        "# `convert cifar`: CIFAR-10/100 to PNG\n## Outputs\n### Outputs\n"
        "```bash\n# on each node\n```\n",
        encoding="utf-8",
    )
    assert _heading_anchors(page) == {"convert-cifar-cifar-10100-to-png", "outputs", "outputs-1"}


def test_links_to_headings_resolve():
    """Every `page.md#anchor` (and `#anchor`) link names a heading of its page: a heading renamed
    or moved cannot leave a link to nowhere."""
    broken = []
    for document in _documents():
        text = document.read_text(encoding="utf-8")
        for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", text):
            if "://" in target:
                continue
            page = (document.parent / target) if target else document
            if anchor not in _heading_anchors(page):
                broken.append(f"{document.relative_to(REPO)}: {target}#{anchor}")
    assert not broken, broken


def test_repository_paths_the_documents_name_exist():
    """A file or folder of the repository a document names in code (`tests/project/x.py`,
    `benchmarks/bench_x.py --seeds 0`) exists: a moved test or script cannot stay documented.
    Templates (`tests/test_<command>.py`) are left out."""
    named = re.compile(r"`((?:tests|benchmarks|scripts|torchkit|completions|docs)/[^`\s<]*)[`\s]")
    missing = [
        f"{document.relative_to(REPO)}: {path}"
        for document in _documents()
        for path in named.findall(document.read_text(encoding="utf-8"))
        if not (REPO / path.split("::")[0]).exists()
    ]
    assert not missing, missing


def test_documents_speak_of_the_software_only():
    """No issue numbers, work sessions, reviews or leases: the words are about torchkit."""
    words = re.compile(r"issue #\d|\bsessions?\b|\bleases?\b|\breview(s|'s)?\b", re.I)
    for document in _documents():
        found = words.search(document.read_text(encoding="utf-8"))
        assert found is None, f"{document.relative_to(REPO)}: {found.group(0)!r}"


def test_the_readme_is_a_front_door():
    """At most 300 lines; the newcomer's two commands stay as the fresh-clone check greps them."""
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    main_job = re.search(r"uv run torchkit train[^`]*", text)
    assert (
        main_job is not None and main_job.group(0).strip() == "uv run torchkit train --data digits"
    )
    assert "\nuv run pytest\n" in text
