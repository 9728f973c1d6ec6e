"""Shell completions: the committed scripts are current, and completing really works (through
bash itself where it is installed, and the zsh and fish protocols) without importing torch."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from completion_runs import CWD, CompletionAnswerer, completions_in_one_process
from suite_paths import REPO
from typer.main import get_command

from torchkit.cli import app

HEAVY = {"torch", "torchvision", "cv2", "pandas", "sklearn", "matplotlib"}
CONSOLE_SCRIPT = Path(sys.executable).parent / "torchkit"


def run_bash(script: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run SCRIPT in a plain bash (no rc files) that finds this environment's torchkit first."""
    path = f"{CONSOLE_SCRIPT.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    done = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": path},
        cwd=cwd,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done


# A stand-in for the console script, first on PATH (`run_bash_answered`): it notes what press N
# of the script's run gave it (the protocol's variables) and prints $TAB_ANSWERS/N.answer where
# that is written.
_NOTING = """#!/bin/bash
n=$(cat "$TAB_ANSWERS/count" 2>/dev/null || echo 0)
echo $((n + 1)) > "$TAB_ANSWERS/count"
printf %s "$COMP_WORDS" > "$TAB_ANSWERS/$n.words"
printf %s "$COMP_CWORD" > "$TAB_ANSWERS/$n.cword"
printf %s "$_TORCHKIT_COMPLETE" > "$TAB_ANSWERS/$n.shell"
[[ -f $TAB_ANSWERS/$n.answer ]] && cat "$TAB_ANSWERS/$n.answer"
exit 0
"""


@pytest.fixture(scope="module")
def answerer():
    """The module's interpreter answering the bash tests' TAB presses (`run_bash_answered`)."""
    answering = CompletionAnswerer()
    yield answering
    answering.close()


def run_bash_answered(
    script: str, cwd: Path, answerer: CompletionAnswerer
) -> subprocess.CompletedProcess:
    """run_bash(SCRIPT, cwd) with torchkit's answers to the script's TAB presses asked of the
    module's fresh interpreter (`answerer`, in `cwd`) instead of a `torchkit` process each (0.4 s
    of CPU apiece): the script runs once with a stand-in `torchkit` that notes what each press
    gives it (the protocol's variables, as the script passes them), then again with the
    stand-in printing torchkit's answers. (test_committed_bash_script_completes_in_bash runs the
    console script itself.)"""
    with tempfile.TemporaryDirectory() as folder:  # not in cwd: its files would be candidates
        answers = Path(folder)
        (answers / "torchkit").write_text(_NOTING)
        (answers / "torchkit").chmod(0o755)
        noting = f"export PATH={shlex.quote(folder)}:$PATH TAB_ANSWERS={shlex.quote(folder)}\n"

        def presses() -> list[dict[str, str]]:
            count = int((answers / "count").read_text())
            (answers / "count").unlink()
            names = {"COMP_WORDS": "words", "COMP_CWORD": "cword", "_TORCHKIT_COMPLETE": "shell"}
            return [
                {name: (answers / f"{n}.{part}").read_text() for name, part in names.items()}
                for n in range(count)
            ]

        run_bash(noting + script, cwd)
        asked = presses()
        found = answerer.ask([{**case, CWD: str(cwd)} for case in asked])
        for n, lines in enumerate(found):
            (answers / f"{n}.answer").write_text("".join(f"{line}\n" for line in lines))
        done = run_bash(noting + script, cwd)
        assert presses() == asked  # the same presses, now answered
    return done


def load_script(name: str):
    """scripts/NAME.py as a module."""
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_generator():
    return load_script("generate_completions")


def top_level_commands() -> list[str]:
    return sorted(name for name, cmd in get_command(app).commands.items() if not cmd.hidden)


# The TAB presses answered by real `python -m torchkit` processes (what they import is checked):
# all in one fresh interpreter (`completions_in_one_process`), the first one's imports as a
# fresh process has them, the later ones' with what the earlier ones imported (zsh's and fish's
# help texts last).
MODEL_NAME_WORDS = [
    "torchkit summary resn",
    "torchkit extract-features resn",
    "torchkit convert-syncbn resn",
    "torchkit eval resn",
    "torchkit train --model resn",
]
TAB_PRESSES = {
    "commands": {
        "_TORCHKIT_COMPLETE": "complete_bash",
        "COMP_WORDS": "torchkit ",
        "COMP_CWORD": "1",
    },
    **{
        words: {
            "_TORCHKIT_COMPLETE": "complete_bash",
            "COMP_WORDS": words,
            "COMP_CWORD": str(len(words.split()) - 1),
        }
        for words in MODEL_NAME_WORDS
    },
    "zsh": {"_TORCHKIT_COMPLETE": "complete_zsh", "_TYPER_COMPLETE_ARGS": "torchkit env --format "},
    "fish": {
        "_TORCHKIT_COMPLETE": "complete_fish",
        "_TYPER_COMPLETE_FISH_ACTION": "get-args",
        "_TYPER_COMPLETE_ARGS": "torchkit env --re",
    },
}


@pytest.fixture(scope="module")
def tab_presses() -> dict[str, tuple[list[str], set[str]]]:
    """Each of TAB_PRESSES: the lines printed and the top-level packages imported."""
    answers = completions_in_one_process(list(TAB_PRESSES.values()))
    return {
        name: (lines, {module.split(".")[0] for module in imported})
        for name, (lines, imported) in zip(TAB_PRESSES, answers, strict=True)
    }


def test_committed_completion_scripts_are_current():
    generator = load_generator()
    scripts = generator.completion_scripts()
    assert sorted(scripts) == ["torchkit.bash", "torchkit.fish", "torchkit.zsh"]
    for name, text in scripts.items():
        committed = (REPO / "completions" / name).read_text(encoding="utf-8")
        assert committed == text, f"completions/{name} is stale: run the generator script"
        assert "_TORCHKIT_COMPLETE=complete_" in text
    assert generator.main(["--check"]) == 0


def test_bash_protocol_lists_commands_without_importing_torch(tab_presses):
    lines, imported = tab_presses["commands"]
    assert sorted(lines) == top_level_commands()
    assert "env" in lines
    assert not imported & HEAVY, f"completion imported {sorted(imported & HEAVY)}"


def test_zsh_and_fish_protocols_complete_option_values(tab_presses):
    zsh, imported = tab_presses["zsh"]
    assert zsh[0].startswith("_arguments") and '"table"' in zsh[0]
    assert '"csv"' in zsh[1] and '"json"' in zsh[2]
    assert not imported & HEAVY
    fish, _ = tab_presses["fish"]
    # One line per candidate: long help text must not wrap into bogus candidates.
    assert [line.split("\t")[0] for line in fish] == ["--require-cuda"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
@pytest.mark.skipif(not CONSOLE_SCRIPT.exists(), reason="no torchkit console script")
def test_committed_bash_script_completes_in_bash():
    """Source completions/torchkit.bash in a real bash and press TAB twice, in effect."""
    script = f"""
source {REPO / "completions" / "torchkit.bash"}
COMP_WORDS=(torchkit e); COMP_CWORD=1
_torchkit_completion torchkit
printf '%s\\n' "${{COMPREPLY[@]}}"
echo ---
COMP_WORDS=(torchkit env --format ""); COMP_CWORD=3
_torchkit_completion torchkit
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    done = run_bash(script)
    first, second = done.stdout.split("---\n")
    expected = [name for name in top_level_commands() if name.startswith("e")]
    assert sorted(first.split()) == expected and "env" in expected
    assert second.split() == ["table", "csv", "json"]


def test_the_generated_model_names_are_torchvisions_and_convnet():
    from torchkit.core.models import list_models
    from torchkit.core.models.names import MODEL_NAMES

    assert list(MODEL_NAMES) == list_models(), "run scripts/generate_model_names.py"
    generator = load_script("generate_model_names")
    assert generator.names_module(list_models()) == (
        REPO / "torchkit" / "core" / "models" / "names.py"
    ).read_text(encoding="utf-8")


@pytest.mark.parametrize("words", MODEL_NAME_WORDS)
def test_model_names_complete_without_importing_torch(tab_presses, words):
    lines, imported = tab_presses[words]
    assert "resnet18" in lines and "resnet50" in lines and "resnext50_32x4d" in lines
    assert all(line.startswith("resn") for line in lines)
    assert not imported & HEAVY, f"completion imported {sorted(imported & HEAVY)}"


def _all_commands(command, path="torchkit"):
    """(path, command) of every command under `command`, groups' subcommands included."""
    for name, sub in getattr(command, "commands", {}).items():
        yield from _all_commands(sub, f"{path} {name}")
    if not hasattr(command, "commands"):
        yield path, command


def test_every_model_option_and_argument_completes_model_names():
    """`predict --model resn<TAB>` (and summary's, export's, benchmark's, extract-features')
    completed nothing: only MODEL and the --model of train and eval offered the names."""
    root = get_command(app)
    found = []
    for path, command in _all_commands(root):
        with command.make_context(path, [], resilient_parsing=True) as ctx:
            for param in command.get_params(ctx):
                if "--model" not in getattr(param, "opts", ()) and param.metavar != "MODEL":
                    continue
                found.append(f"{path} {param.opts[0]}")
                names = [item.value for item in param.shell_complete(ctx, "resn")]
                assert "resnet18" in names, f"{path} {param.opts}: {names[:5]}"
    assert {"torchkit predict --model", "torchkit summary --model", "torchkit eval --model"} <= {
        " ".join(entry.split()[:3]) for entry in found
    }, found


def test_model_specs_complete_model_files_and_folders(tmp_path, monkeypatch):
    from torchkit.cli.completion import complete_model_name

    (tmp_path / "runs" / "r1").mkdir(parents=True)
    for name in ("best.pt", "weights.safetensors", "notes.txt", "conv.pth"):
        (tmp_path / "runs" / "r1" / name).write_text("")
    monkeypatch.chdir(tmp_path)
    assert complete_model_name("run") == ["runs/"]
    assert complete_model_name("runs/r1/") == [
        "runs/r1/best.pt",
        "runs/r1/conv.pth",
        "runs/r1/weights.safetensors",
    ]
    assert complete_model_name("convnet") == ["convnet"]


def test_model_specs_complete_the_files_torchkit_export_writes(tmp_path, monkeypatch):
    from torchkit.cli.completion import complete_model_name

    for name in ("m.onnx", "m.ts", "m.pt2", "m.txt"):
        (tmp_path / name).write_text("")
    monkeypatch.chdir(tmp_path)
    assert complete_model_name("m.") == ["m.onnx", "m.pt2", "m.ts"]


def test_install_completion_installs_the_shell_it_is_given(tmp_path, monkeypatch, capfd):
    """`--install-completion zsh` from a bash prompt installed bash's script. Through the app
    as `main` calls it (its own `__call__` reads the words), in this process."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("SHELL", "/bin/bash")

    def torchkit(*words: str) -> tuple[int, str, str]:
        capfd.readouterr()
        with pytest.raises(SystemExit) as ended:
            app(args=list(words), prog_name="torchkit")
        shown = capfd.readouterr()
        return ended.value.code, shown.out, shown.err

    code, _, err = torchkit("--install-completion", "zsh")
    assert code == 0, err
    assert "_TORCHKIT_COMPLETE=complete_zsh" in (tmp_path / ".zfunc" / "_torchkit").read_text()
    assert "fpath+=~/.zfunc" in (tmp_path / ".zshrc").read_text()
    assert not (tmp_path / ".bash_completions").exists()
    code, out, _ = torchkit("--show-completion", "fish")
    assert code == 0 and "complete --command torchkit" in out
    code, _, err = torchkit("--install-completion", "tcsh")
    assert code == 2 and err.startswith("Error: unknown shell 'tcsh'")


def _install(monkeypatch, home, *argv):
    """`torchkit ARGV` (--install-completion / --show-completion) with HOME=home, in this
    process: its exit code."""
    from torchkit.cli.app import _completion_for_named_shell

    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(SystemExit) as ended:
        _completion_for_named_shell(app, list(argv))
    return ended.value.code


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_install_completion_into_a_read_only_home_is_one_error_line(
    shell, small_tmpfs, monkeypatch, capfd
):
    """A read-only HOME ended `--install-completion SHELL` in an OSError traceback."""
    from output_checks import error_line

    home = small_tmpfs(64)
    subprocess.run(["mount", "-o", "remount,ro", str(home)], check=True)
    assert _install(monkeypatch, home, "--install-completion", shell) == 1
    line = error_line(capfd.readouterr().err, besides="nothing")
    assert line.startswith(f"Error: cannot write {home}/") and "Read-only file system" in line


def test_install_completion_adds_to_the_rc_file_and_keeps_it(tmp_path, monkeypatch, capfd):
    """The rc file is only added to: its link, its permissions, its last line without a line
    end, and a second install leaves it as the first left it."""
    dotfiles = tmp_path / "dotfiles"
    dotfiles.mkdir()
    (dotfiles / "bashrc").write_text("# mine\nalias ll='ls -l'")
    (dotfiles / "bashrc").chmod(0o600)
    (tmp_path / ".bashrc").symlink_to(dotfiles / "bashrc")
    for _ in range(2):
        assert _install(monkeypatch, tmp_path, "--install-completion", "bash") == 0
    script = tmp_path / ".bash_completions" / "torchkit.sh"
    assert (tmp_path / ".bashrc").is_symlink()
    assert (dotfiles / "bashrc").read_text() == f"# mine\nalias ll='ls -l'\nsource '{script}'\n"
    assert (dotfiles / "bashrc").stat().st_mode & 0o777 == 0o600
    assert script.read_text() == (REPO / "completions" / "torchkit.bash").read_text()
    assert "bash completion installed in" in capfd.readouterr().out


def test_a_full_disk_leaves_the_rc_file_as_it_was(small_tmpfs):
    """Typer rewrote ~/.bashrc in place: on a full disk it was cut at a page, its last line
    lost and the new one half written."""
    from torchkit.core.io.errors import OutputWriteError
    from torchkit.core.io.files import add_missing_lines

    home = small_tmpfs(64)
    rc = home / ".bashrc"
    rc.write_bytes(b"# my settings\n" + b"x" * 4060 + b"\n")
    before = rc.read_bytes()
    with contextlib.suppress(OSError), open(home / "filler", "wb") as filler:
        filler.write(b"\0" * 128 * 1024)
    with pytest.raises(OutputWriteError, match="No space left on device"):
        add_missing_lines(rc, ["source '/home/me/.bash_completions/torchkit.sh'"])
    assert rc.read_bytes() == before
    assert sorted(path.name for path in home.iterdir()) == [".bashrc", "filler"]


@pytest.mark.parametrize("shell", [None, "sh"])
def test_install_completion_from_a_shell_it_cannot_complete_in_says_so(
    shell, monkeypatch, tmp_path, capfd
):
    """From sh (or where no shell was found) `--install-completion` printed Typer's `Shell sh
    is not supported.` on stdout."""
    monkeypatch.setattr(
        importlib.import_module("torchkit.cli.app"), "_current_shell", lambda: shell
    )
    assert _install(monkeypatch, tmp_path, "--install-completion") == 2
    captured = capfd.readouterr()
    assert captured.out == ""
    line = captured.err.strip()
    assert line.startswith("Error: --install-completion completes in bash, zsh, fish")
    assert f"the current shell is {shell or 'unknown'}" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
@pytest.mark.skipif(not CONSOLE_SCRIPT.exists(), reason="no torchkit console script")
def test_bash_completes_model_files_and_folders_as_file_names(tmp_path, answerer):
    """Typer's bash script inserted candidates as they were: `torchkit eval my<TAB>` made `my
    run/` two words, and `ru<TAB>` gave `runs/ `, whose space stopped a second TAB going on into
    it. Where candidates are files or folders, bash is told they are file names (it quotes
    them, and ends a folder with its slash, not a space); options and model names are not."""
    (tmp_path / "runs" / "r1").mkdir(parents=True)
    (tmp_path / "runs" / "r1" / "best.pt").write_text("")
    (tmp_path / "my run").mkdir()
    (tmp_path / "my run" / "best.pt").write_text("")
    script = f"""
source {REPO / "completions" / "torchkit.bash"}
compopt() {{ echo "compopt $1 $2"; }}
for word in ru runs/r1/b my 'my\\ run/b' resnet1; do
    COMP_WORDS=(torchkit eval "$word"); COMP_CWORD=2
    _torchkit_completion torchkit
    printf '%s\\n' "${{COMPREPLY[@]}}" ---
done
"""
    done = run_bash_answered(script, tmp_path, answerer)
    found = [part.splitlines() for part in done.stdout.split("---\n")]
    folder, file, spaced_folder, spaced_file, names, _ = found
    as_file_names = "compopt -o filenames"
    # Every call's candidates and torchkit's own stderr come with any mismatch: a traceback, or
    # the calls from one on all empty (the environment or the tree changed under the test).
    shown = "\n".join([*map(repr, found[:-1]), done.stderr])
    assert folder == [as_file_names, "runs"], shown  # bash adds the slash, and no space
    assert file == [as_file_names, "runs/r1/best.pt"], shown
    assert spaced_folder == [as_file_names, "my run"], shown
    assert spaced_file == [as_file_names, "my run/best.pt"], shown
    # Model names (as options: test_bash_completes_a_device_after_its_colon's --seed) are not.
    assert "resnet18" in names and as_file_names not in names, shown


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
@pytest.mark.skipif(not CONSOLE_SCRIPT.exists(), reason="no torchkit console script")
def test_bash_completes_a_device_after_its_colon(tmp_path, answerer):
    """bash splits `--device cuda:` at the colon (COMP_WORDBREAKS), so torchkit completed `:`
    alone and offered nothing (bash then listed files). The script joins the pieces back, and
    the candidates lose `cuda:`, as bash replaces only what follows the colon; a folder with a
    colon (`runs/t:1`) keeps its slash, as bash would not find it under `1`. COMP_WORDS,
    COMP_CWORD, COMP_LINE and COMP_POINT are set as bash sets them for each line."""
    (tmp_path / "runs" / "t:1").mkdir(parents=True)
    script = f"""
source {REPO / "completions" / "torchkit.bash"}
compopt() {{ echo "compopt $1 $2"; }}
[[ $COMP_WORDBREAKS == *:* ]] || exit 3
for line in 'torchkit train --device cuda:' 'torchkit train --device cuda:0 --se' \\
        'torchkit eval runs/t:'; do
    COMP_LINE=$line; COMP_POINT=${{#line}}
    read -ra COMP_WORDS <<< "${{line//:/ : }}"; COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1))
    _torchkit_completion torchkit
    printf '%s\\n' "${{COMPREPLY[@]}}" ---
done
"""
    done = run_bash_answered(script, tmp_path, answerer)
    after_colon, after_device, folder, _ = [
        found.splitlines() for found in done.stdout.split("---\n")
    ]
    assert after_colon == ["0", "1"]
    assert after_device == ["--seed"]
    assert folder == ["compopt -o filenames", "compopt -o nospace", "1/"]


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
@pytest.mark.skipif(not CONSOLE_SCRIPT.exists(), reason="no torchkit console script")
def test_zsh_completes_at_the_first_tab_from_fpath(tmp_path):
    """Installed on fpath (`~/.zfunc/_torchkit`, as --install-completion zsh does), the script
    is autoloaded at the first TAB and run in place of the completion: Typer's only registered
    its function then, so the first TAB of every new shell completed nothing."""
    (tmp_path / "_torchkit").write_text((REPO / "completions" / "torchkit.zsh").read_text())
    script = f"""
fpath=({tmp_path} $fpath)
compdef() {{ echo "compdef $*" }}
_arguments() {{ echo "_arguments $*" }}
words=(torchkit train --dev); CURRENT=3
autoload -Uz _torchkit
_torchkit
"""
    path = f"{CONSOLE_SCRIPT.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    done = subprocess.run(
        ["zsh", "-f", "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": path},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith('_arguments *: :(("--device":'), done.stdout


def test_install_completion_writes_where_zdotdir_and_xdg_config_home_say(
    tmp_path, monkeypatch, capfd
):
    """With ZDOTDIR set zsh reads $ZDOTDIR/.zshrc, and fish its completions from
    $XDG_CONFIG_HOME/fish: Typer wrote under HOME, where those shells never looked."""
    home, zdot, config = (tmp_path / name for name in ("home", "zdot", "config"))
    monkeypatch.setenv("ZDOTDIR", str(zdot))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    assert _install(monkeypatch, home, "--install-completion", "zsh") == 0
    assert _install(monkeypatch, home, "--install-completion", "fish") == 0
    assert "fpath+=~/.zfunc" in (zdot / ".zshrc").read_text()
    assert (home / ".zfunc" / "_torchkit").is_file()
    assert (config / "fish" / "completions" / "torchkit.fish").is_file()
    assert sorted(path.name for path in home.iterdir()) == [".zfunc"]
    assert f"fish completion installed in {config}" in capfd.readouterr().out.replace("\n", "")


def _bash_words(line: str) -> str:
    """COMP_WORDS as bash splits LINE, quoted for bash: a run of COMP_WORDBREAKS' `=` and `:` is
    a word of its own (`--device=cuda:` is `--device`, `=`, `cuda`, `:`; `--d=:` is `--d`, `=:`),
    and a line that ends in a blank ends in an empty word."""
    words = re.sub(r"[=:]+", r" \g<0> ", line).split()
    return " ".join(shlex.quote(word) for word in [*words, *([""] if line[-1] == " " else [])])


def _bash_completions(
    lines: list[str],
    cwd: Path,
    program: str = "torchkit",
    answerer: CompletionAnswerer | None = None,
) -> list[list[str]]:
    """COMPREPLY of completions/torchkit.bash at the end of each of LINES, in a real bash, with
    COMP_LINE, COMP_POINT, COMP_WORDS and COMP_CWORD as bash sets them; `program` is what the
    script calls back (torchkit, answered by `answerer`, or a stand-in). compopt calls come as
    lines of their own."""
    calls = "".join(
        f"COMP_LINE={shlex.quote(line)}; COMP_POINT=${{#COMP_LINE}}\n"
        f"COMP_WORDS=({_bash_words(line)}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1))\n"
        f'_torchkit_completion {shlex.quote(program)}; printf "%s\\n" "${{COMPREPLY[@]}}" ---\n'
        for line in lines
    )
    script = f"""
source {REPO / "completions" / "torchkit.bash"}
compopt() {{ echo "compopt $1 $2"; }}
[[ $COMP_WORDBREAKS == *=* && $COMP_WORDBREAKS == *:* ]] || exit 3
{calls}"""
    done = run_bash_answered(script, cwd, answerer) if answerer else run_bash(script, cwd)
    found = [part.splitlines() for part in done.stdout.split("---\n")]
    assert len(found) == len(lines) + 1, done.stderr
    return found[:-1]


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_passes_option_equals_value_on_as_the_spaced_form(tmp_path):
    """bash splits `--device=cuda:` at the `=` and the colon (COMP_WORDBREAKS): torchkit got
    `--device = cuda:`, took the `=` for the option's value and completed `cuda:` as an argument
    (nothing for --device, model names for `--format=c`). The script passes on what the spaced
    form passes; a value with `=` in it (`runs/lr=0.1/b`) stays one word, and an empty one
    before the word completed (`--device= --se`) is passed as ''. A stand-in for torchkit says
    what it was given (no Python started)."""
    given = tmp_path / "given"
    given.write_text('#!/bin/bash\nprintf "%s|%s\\n" "$COMP_CWORD" "${COMP_WORDS//$\'\\n\'/ }"\n')
    given.chmod(0o755)
    pairs = [
        ("train --device=cuda:", "train --device cuda:"),
        ("train --device=cu", "train --device cu"),
        ("train --device=", "train --device "),
        ("train --device=:", "train --device :"),
        ("eval --model=resnet1", "eval --model resnet1"),
        ("eval --model=runs/lr=0.1/b", "eval --model runs/lr=0.1/b"),
        ("train --data=run", "train --data run"),
        ("eval --format=c", "eval --format c"),
        ("train --device=cuda:0 --se", "train --device cuda:0 --se"),
    ]
    lines = [f"torchkit {line}" for pair in pairs for line in pair]
    found = _bash_completions(lines, tmp_path, str(given))
    passed = dict(zip(lines, found, strict=True))
    for equals, spaced in pairs:
        assert passed[f"torchkit {equals}"] == passed[f"torchkit {spaced}"], equals
    assert passed["torchkit train --device=cuda:"] == ["3|torchkit train --device cuda:"]
    assert passed["torchkit train --device="] == ["3|torchkit train --device "]
    assert passed["torchkit eval --model=runs/lr=0.1/b"] == [
        "3|torchkit eval --model runs/lr=0.1/b"
    ]
    alone = ["torchkit eval m.pt runs/lr=", "torchkit train --device= --se"]
    assert _bash_completions(alone, tmp_path, str(given)) == [
        ["3|torchkit eval m.pt runs/lr="],
        ["4|torchkit train --device '' --se"],
    ]


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
@pytest.mark.skipif(not CONSOLE_SCRIPT.exists(), reason="no torchkit console script")
def test_bash_completes_option_equals_value(tmp_path, answerer):
    """`--device=cuda:<TAB>` offered nothing and `--format=c<TAB>` model names; the candidates
    lose what precedes the last `:` or `=`, which bash leaves in place."""
    lines = ["torchkit train --device=cuda:", "torchkit eval --format=c"]
    assert _bash_completions(lines, tmp_path, answerer=answerer) == [["0", "1"], ["csv"]]


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_trims_a_file_with_equals_signs_to_what_bash_replaces(tmp_path):
    """A model file offered for `--model=runs/lr=0.1/b` keeps bash's file name handling and
    loses `runs/lr=`, which bash leaves in place (it replaces what follows the last `=`). A
    stand-in for torchkit offers the file (no Python started)."""
    (tmp_path / "runs" / "lr=0.1").mkdir(parents=True)
    (tmp_path / "runs" / "lr=0.1" / "best.pt").write_text("")
    offers = tmp_path / "offers"
    offers.write_text("#!/bin/bash\necho runs/lr=0.1/best.pt\n")
    offers.chmod(0o755)
    lines = ["torchkit eval --model=runs/lr=0.1/b", "torchkit eval --model runs/lr=0.1/b"]
    found = _bash_completions(lines, tmp_path, str(offers))
    assert found == [["compopt -o filenames", "0.1/best.pt"]] * 2
