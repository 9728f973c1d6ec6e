"""Shell completion: model specs without importing torch at TAB time; the scripts themselves
and their installation (`--install-completion`)."""

from __future__ import annotations

import os
from pathlib import Path


def complete_model_name(incomplete: str) -> list[str]:
    """torchvision names and `convnet` (from the generated list), then model files and folders
    under the path typed so far."""
    from torchkit.core.models.names import MODEL_NAMES

    names = [name for name in MODEL_NAMES if name.startswith(incomplete)]
    return names + _model_files(incomplete)


def _model_files(incomplete: str) -> list[str]:
    """Model files (core's one list of suffixes) and folders, so that paths can be walked."""
    from torchkit.core.models.model_files import MODEL_FILE_SUFFIXES

    folder, prefix = os.path.split(incomplete)
    try:
        entries = sorted(os.scandir(folder or "."), key=lambda entry: entry.name)
    except OSError:
        return []
    found = []
    for entry in entries:
        if not entry.name.startswith(prefix) or entry.name.startswith("."):
            continue
        path = os.path.join(folder, entry.name)
        if entry.is_dir():
            found.append(path + os.sep)
        elif entry.name.endswith(MODEL_FILE_SUFFIXES):
            found.append(path)
    return found


# --- the scripts and their installation ---------------------------------------------------------

PROGRAM = "torchkit"

# Typer's bash script inserts candidates as they are: a model file or folder with a space or a
# quote in its name (`my run/best.pt`) became two words, and a folder (`runs/`) got a space
# after it, so that TAB could not walk on into it. Where a candidate is a file or folder, bash
# is told to treat them as file names, as its own file completion does: it quotes them (inside
# a quote the user opened too) and ends a folder with its slash instead of a space, so the
# folders' own slashes are left to it. (compopt is bash 4's: bash 3.2 keeps Typer's way.)
_BASH_RETURN = "\n    return 0\n}"
# bash splits a word at the colons and equals signs in COMP_WORDBREAKS (`--device cuda:0` came
# as `cuda`, `:`, `0`; `--device=cuda:0` as `--device`, `=`, `cuda`, `:`, `0`), so that torchkit
# completed `:` or `0` alone, or took the `=` for the option's value, and offered nothing. Pieces
# that touch in the line as typed are joined back into the word torchkit completes, except that
# the `=` of `--option=VALUE` parts the option from its value: two words, as the spaced form
# gives (an empty value, not the one being completed, is passed as '' so that no word goes
# missing). As bash replaces only what follows the word's last colon or `=`, the candidates lose
# what precedes it (what bash-completion's __ltrim_colon_completions does, without needing
# bash-completion). bash would look for a folder (`runs/t:1`) under the rest of its name, not
# find it and end it in a space: a single folder keeps its slash, and no space follows.
_BASH_WORDS = """
    COMPREPLY=( $( env COMP_WORDS="${COMP_WORDS[*]}" \\
                   COMP_CWORD=$COMP_CWORD \\"""
_BASH_JOINED_WORDS = """
    local words=() cword=0 rest=$COMP_LINE word blanks breaks i
    for ((i = 0; i < ${#COMP_WORDS[@]}; i++)); do
        word=${COMP_WORDS[i]}
        blanks=${rest%%[![:blank:]]*}
        rest=${rest#"$blanks"}
        rest=${rest#"$word"}
        if ((i > 1)) && [[ -z $blanks && $word == =* && ${COMP_WORDS[i-1]} == --?* ]] &&
            [[ ${words[${#words[@]}-1]} == "${COMP_WORDS[i-1]}" ]]
        then
            words+=("${word#=}")
        elif ((i > 1)) && [[ -z $blanks && ( $word =~ ^[=:]+$ || ${COMP_WORDS[i-1]} =~ ^[=:]+$ ) ]]
        then
            words[${#words[@]}-1]+=$word
        else
            words+=("$word")
        fi
        ((i == COMP_CWORD)) && cword=$((${#words[@]} - 1))
    done
    for i in "${!words[@]}"; do
        [[ -z ${words[i]} ]] && ((i != cword)) && words[i]="''"
    done
    COMPREPLY=( $( env COMP_WORDS="${words[*]}" \\
                   COMP_CWORD=$cword \\"""
_BASH_AFTER_LAST_BREAK = """
    breaks=${COMP_WORDBREAKS//[!:=]}
    word=${words[cword]}
    [[ $breaks ]] && word=${word%"${word##*[$breaks]}"} || word=
    if [[ $word ]]; then
        for i in "${!COMPREPLY[@]}"; do
            COMPREPLY[i]=${COMPREPLY[i]#"$word"}
        done
        if ((${#COMPREPLY[@]} == 1)) && [[ -d $word${COMPREPLY[0]} ]]; then
            COMPREPLY[0]+=/
            compopt -o nospace 2>/dev/null
        fi
    fi"""
_BASH_AS_FILE_NAMES = """
    for i in "${!COMPREPLY[@]}"; do
        if [[ -e ${COMPREPLY[i]} ]] && compopt -o filenames 2>/dev/null; then
            for i in "${!COMPREPLY[@]}"; do
                [[ -d ${COMPREPLY[i]} ]] && COMPREPLY[i]=${COMPREPLY[i]%/}
            done
            break
        fi
    done"""


# Typer's zsh script only registers its function (compdef), which suits a sourced script; from
# fpath (`~/.zfunc/_torchkit`, where --install-completion puts it) zsh autoloads the file at the
# first TAB and runs it in place of the completion, so that the first TAB of every shell
# completed nothing. As click's own script does: autoloaded, it completes at once.
_ZSH_COMPDEF = "\ncompdef _torchkit_completion torchkit"
_ZSH_AUTOLOADED_OR_SOURCED = """
if [[ $zsh_eval_context[-1] == loadautofunc ]]; then
  _torchkit_completion "$@"
else
  compdef _torchkit_completion torchkit
fi"""


def completion_script(shell: str) -> str:
    """The script that completes torchkit in `shell`: Typer's, which calls torchkit back."""
    from typer._completion_shared import get_completion_script

    from torchkit.cli.app import COMPLETE_ENV

    script = get_completion_script(prog_name=PROGRAM, complete_var=COMPLETE_ENV, shell=shell)
    if shell == "bash":
        if script.count(_BASH_RETURN) != 1 or script.count(_BASH_WORDS) != 1:
            raise RuntimeError("Typer's bash completion script changed: see cli/completion.py")
        script = script.replace(_BASH_WORDS, _BASH_JOINED_WORDS)
        # File names are told from the whole candidates, before they lose a colon's prefix.
        script = script.replace(
            _BASH_RETURN, _BASH_AS_FILE_NAMES + _BASH_AFTER_LAST_BREAK + _BASH_RETURN
        )
    elif shell == "zsh":
        if not script.endswith(_ZSH_COMPDEF):
            raise RuntimeError("Typer's zsh completion script changed: see cli/completion.py")
        script = script.removesuffix(_ZSH_COMPDEF) + _ZSH_AUTOLOADED_OR_SOURCED
    return script


def _zsh_lines(zshrc: Path) -> list[str]:
    """What ~/.zshrc needs (Typer's lines): ~/.zfunc on fpath and compinit, and a menu to pick
    from unless the file sets styles of its own."""
    lines = ["fpath+=~/.zfunc; autoload -Uz compinit; compinit"]
    try:
        own_styles = "zstyle" in zshrc.read_text(encoding="utf-8", errors="replace")
    except OSError:
        own_styles = False
    return lines if own_styles else [*lines, "zstyle ':completion:*' menu select"]


def _folder_from_environment(name: str) -> Path | None:
    """The absolute folder the variable `name` gives (a relative one is ignored, as the XDG
    specification says), or None."""
    value = os.environ.get(name, "")
    return Path(value) if os.path.isabs(value) else None


def install_completion(shell: str, home: Path | None = None) -> Path:
    """Write `shell`'s script where that shell (as Typer sets it up) reads it, and add what its
    rc file lacks to load it; returns the script's path. bash, zsh and fish; the user's rc file
    is only ever added to, and replaced whole (`add_missing_lines`)."""
    from torchkit.core.io.files import add_missing_lines, atomic_write_text

    home = Path.home() if home is None else home
    script = completion_script(shell) + "\n"
    # Where the shell reads its files: zsh's rc file from ZDOTDIR, fish's from XDG_CONFIG_HOME,
    # where set (Typer wrote under HOME alone, which those shells then never read).
    zsh_dot = _folder_from_environment("ZDOTDIR") or home
    config = _folder_from_environment("XDG_CONFIG_HOME") or home / ".config"
    if shell == "bash":
        path = home / ".bash_completions" / f"{PROGRAM}.sh"
        atomic_write_text(path, script)
        add_missing_lines(home / ".bashrc", [f"source '{path}'"])
    elif shell == "zsh":
        path = home / ".zfunc" / f"_{PROGRAM}"
        atomic_write_text(path, script)
        add_missing_lines(zsh_dot / ".zshrc", _zsh_lines(zsh_dot / ".zshrc"))
    elif shell == "fish":
        path = config / "fish" / "completions" / f"{PROGRAM}.fish"
        atomic_write_text(path, script)
    else:
        raise ValueError(f"torchkit installs no {shell} completion itself")
    return path
