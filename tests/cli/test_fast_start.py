"""`torchkit --help` and every `torchkit COMMAND --help` stay fast: none of them imports torch,
torchvision, torchinfo, cv2, pandas, sklearn, matplotlib, webdataset or pyarrow. New commands are
covered automatically."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import typer.main

HEAVY = (
    "torch", "torchvision", "torchinfo", "cv2", "pandas", "sklearn", "matplotlib", "webdataset",
    "pyarrow",
)  # fmt: skip

# Runs in a fresh interpreter: calls the real entry point (`torchkit.cli.main`) once per command
# path, the way the console script does, and records which heavy packages are loaded after each.
SCRIPT = r"""
import contextlib, io, json, sys

HEAVY = set(sys.argv[1].split(","))

def heavy_loaded():
    return sorted({name.split(".")[0] for name in sys.modules} & HEAVY)

before = heavy_loaded()
import typer.main
import torchkit.cli

# A `torchkit ... --help` process builds typer's command tree once; here each main() would build
# it again (a tenth of a second each). Built once, before the first main() (whatever building
# it imports shows in every result), and reused, as the suite's in-process runs reuse theirs.
build = typer.main.get_command
built = []

def built_once(typer_app):
    if typer_app is not torchkit.cli.app:
        return build(typer_app)
    if not built:
        built.append(build(typer_app))
    return built[0]

typer.main.get_command = built_once

def command_paths(command, prefix):
    yield prefix
    for name, child in sorted(getattr(command, "commands", {}).items()):
        if not getattr(child, "hidden", False):
            yield from command_paths(child, prefix + [name])

results = []
for path in command_paths(built_once(torchkit.cli.app), []):
    sys.argv = ["torchkit", *path, "--help"]
    out = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out):
        try:
            torchkit.cli.main()
        except SystemExit as done:
            code = done.code or 0
    results.append(
        {"path": path, "code": code, "help": out.getvalue(), "heavy": heavy_loaded()}
    )
print(json.dumps({"before": before, "results": results}))
"""


def test_help_of_every_command_imports_nothing_heavy():
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, ",".join(HEAVY)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["before"] == []
    results = report["results"]
    paths = [" ".join(r["path"]) for r in results]
    assert paths[0] == "" and "env" in paths  # the root help and at least `env`
    for result in results:
        name = "torchkit " + " ".join(result["path"])
        assert result["code"] == 0, f"{name} --help exited {result['code']}"
        assert "Usage:" in result["help"], name
        assert result["heavy"] == [], f"{name} --help imported {result['heavy']}"
    # video-info's help is its own (it was checked in a process of its own too)
    assert "--segments" in results[paths.index("video-info")]["help"]
    root_help = results[0]["help"]
    for path in paths[1:]:
        if " " not in path:  # every top-level command is listed in `torchkit --help`
            assert path in root_help


EVERY_COMMAND = {
    "env", "train", "eval", "predict", "dataset-stats", "split", "summary", "extract-features",
    "export", "video-info", "convert-syncbn", "benchmark", "tensor", "cifar", "checkpoint",
    "shards",
}  # fmt: skip


@pytest.mark.parametrize(
    ("words", "code", "built", "shown"),
    [
        (["summary", "--help"], 0, {"summary"}, "Usage: torchkit summary"),
        (["-v", "convert", "tensor", "--help"], 0, {"tensor", "cifar", "checkpoint", "shards"},
         "Usage: torchkit convert tensor"),
        (["-h", "train"], 0, EVERY_COMMAND, "convert-syncbn"),  # the app's help lists all
        (["trian"], 2, EVERY_COMMAND, "Did you mean 'train'?"),  # close names: all are needed
        # The quiet flags joined into one word, as click reads them.
        (["-vq", "summary", "--help"], 0, {"summary"}, "Usage: torchkit summary"),
        (["-qvv", "-q", "convert", "tensor", "--help"], 0,
         {"tensor", "cifar", "checkpoint", "shards"}, "Usage: torchkit convert tensor"),
        (["-vh", "train"], 0, EVERY_COMMAND, "convert-syncbn"),
    ],
)  # fmt: skip
def test_a_command_line_builds_only_the_command_it_runs(
    monkeypatch, capsys, words, code, built, shown
):
    """Typer reads the signature of every command it builds (0.1 s of CPU for all of them):
    the app, called as `python -m torchkit` calls it, builds the named command alone, and the
    whole tree only where the help or a misspelled name's suggestion needs every command."""
    from torchkit.cli import app

    registered = list(app.registered_commands), list(app.registered_groups)
    names = []
    build = typer.main.get_command_from_info

    def recording(command_info, **kwargs):
        names.append(command_info.name)
        return build(command_info, **kwargs)

    monkeypatch.setattr(typer.main, "get_command_from_info", recording)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # Typer's call installs its own
    with pytest.raises(SystemExit) as done:
        app(words, prog_name="torchkit")
    assert done.value.code == code
    assert set(names) == built
    assert shown in "".join(capsys.readouterr())
    assert (app.registered_commands, app.registered_groups) == registered  # put back


def test_the_app_keeps_every_command_while_one_is_built(monkeypatch, capsys):
    """The command a line names is built from a copy of the app that holds it alone: the app
    itself keeps every command meanwhile. It held that command alone while the command ran,
    so a second call meanwhile (another thread's) found no other command, and the two calls
    put back each other's sets: the app could be left with one command."""
    from torchkit.cli import app

    every = list(app.registered_commands), list(app.registered_groups)
    seen = []
    build = typer.main.get_command_from_info

    def recording(command_info, **kwargs):
        seen.append((command_info.name, len(app.registered_commands)))
        return build(command_info, **kwargs)

    monkeypatch.setattr(typer.main, "get_command_from_info", recording)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # Typer's call installs its own
    with pytest.raises(SystemExit) as done:
        app(["env", "--help"], prog_name="torchkit")
    assert done.value.code == 0
    assert "Usage: torchkit env" in capsys.readouterr().out
    assert seen == [("env", len(every[0]))]
    assert (app.registered_commands, app.registered_groups) == every


# Command lines whose first words are the app's quiet flags joined into one word: each gives
# what the whole app gives (a command's help, a group's command's usage error, an unknown
# option's). Cheap ones: each costs a tenth of a second of CPU or more, its help the most.
LINES_AFTER_FLAGS = [
    ["-vq", "summary", "--help"],
    ["-qv", "convert", "cifar"],
    ["-qv", "env", "--bogus"],
]


@pytest.mark.parametrize("words", LINES_AFTER_FLAGS, ids=" ".join)
def test_a_command_line_gives_what_the_whole_app_gives(monkeypatch, capsys, words):
    """Building only the command a line names changes nothing it prints or exits with."""
    from torchkit.cli import app

    app_module = sys.modules["torchkit.cli.app"]  # `torchkit.cli.app` is also the Typer app
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # Typer's call installs its own

    def outcome() -> tuple[object, str, str]:
        with pytest.raises(SystemExit) as done:
            app(list(words), prog_name="torchkit")
        return (done.value.code, *capsys.readouterr())

    fast = outcome()
    assert f"torchkit {words[1]}" in fast[1] + fast[2], fast  # the named command's
    monkeypatch.setattr(app_module, "_named_command", lambda *args: None)  # the whole app
    assert fast == outcome()
