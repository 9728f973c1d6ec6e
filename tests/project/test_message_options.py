"""An option that torchkit's source names (an error's hint, a warning, an option's help, a
comment) is a spelling of some command's option: a user who copies `drop --mixup` from a message
must not meet `No such option`. Other programs' options (torchrun's, uv's, docker's, tar's) are
listed. A grep-level check of the source, nothing is run."""

from __future__ import annotations

import re

from suite_paths import REPO
from test_command_pages import FOREIGN, _commands, _spellings

# Options of other programs that torchkit's texts name beside its own, and placeholders.
OTHER_PROGRAMS = {
    "--nproc",  # torchrun --nproc_per_node, named as its prefix
    "--cpus",  # docker run --cpus
    "--memory",  # docker run --memory
    "--shm-size",  # docker run --shm-size
    "--version",  # torchkit's own, on the app rather than a command
    "--install-completion",
    "--show-completion",
    "--field-name",  # the spelling a config field gets by default, as a docstring writes it
    "--option",  # `--option=VALUE`, any option
}
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]")


def test_every_option_the_source_names_exists(_torchkit_command):
    known = (
        {
            spelling
            for _, command in [("", _torchkit_command), *_commands(_torchkit_command)]
            for parameter in command.params
            for spelling in _spellings(parameter)
        }
        | FOREIGN
        | OTHER_PROGRAMS
    )
    unknown = [
        f"{path.relative_to(REPO)}:{text.count(chr(10), 0, found.start()) + 1}: {found.group()}"
        for path in sorted((REPO / "torchkit").rglob("*.py"))
        for text in [path.read_text(encoding="utf-8")]
        for found in OPTION.finditer(text)
        if found.group() not in known
    ]
    assert not unknown, unknown
