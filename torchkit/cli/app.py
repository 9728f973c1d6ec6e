"""The Typer app and the error boundary every command runs inside."""

from __future__ import annotations

import codecs
import contextlib
import copy
import errno
import functools
import inspect
import os
import re
import signal
import sys
import textwrap
import threading
import traceback
from collections.abc import Collection, Iterator
from typing import Any, NoReturn

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from torchkit import __version__, deferred_signals, working_folder
from torchkit.cli import console
from torchkit.core.io.errors import FS_ENCODING_HINT, NAME_TOO_LONG_HINT, first_line
from torchkit.core.io.folder_locks import held_until_the_command_ends
from torchkit.core.io.open_outputs import closed_at_end
from torchkit.core.runtime.signals import (
    handle_unless_ignored,
    note_stop,
    quiet_loader_worker_deaths,
    received_stops,
    restore_loader_worker_deaths,
)
from torchkit.program import ends_while_starting
from torchkit.program import runs_as_the_program as runs_as_the_program  # its old home
from torchkit.switches import switched_on

DEBUG_ENV = "TORCHKIT_DEBUG"

# The command-line errors of the click that typer runs on (vendored as a private module since
# typer 0.26): `typer.BadParameter` is public and derives from click's UsageError, so the class
# is found through it instead of importing a private module.
ClickUsageError: type[Exception] = next(
    base for base in typer.BadParameter.__mro__ if base.__name__ == "UsageError"
)


def debug_enabled() -> bool:
    return switched_on(DEBUG_ENV, default=False)


def describe_unexpected(
    error: BaseException, options: Collection[str] | None = None
) -> tuple[str, str]:
    """Turn an exception that escaped core into (what, hint) for the one-line error; `options`
    are the spellings the command takes (None: unknown), so that a hint names only those."""
    name = type(error).__name__
    if name == "OutOfMemoryError" or "out of memory" in str(error).lower():
        if options is None or "--amp" in options:
            return (
                "the GPU ran out of memory",
                "use a smaller --batch-size, --amp or a smaller model",
            )
        return "the GPU ran out of memory", "use a smaller --batch-size or a smaller model"
    if isinstance(error, FileNotFoundError) and error.filename is None and working_folder.is_gone():
        gone = working_folder.gone_error()  # a relative path made absolute (os.getcwd)
        return gone.message, gone.hint
    from torchkit.core.io.write_errors import shared_memory_full

    shared = shared_memory_full(error)  # a bare "No space left on device": where?
    if shared is not None:
        return shared.message, shared.hint
    if isinstance(error, OSError) and error.errno == errno.ENAMETOOLONG and error.filename:
        # A path the user gave (an input, an output, a model) that the file system cannot
        # hold: wherever it is first looked at, the path is the news, not the OSError.
        return (
            f"file name too long: {os.fsdecode(error.filename)}",
            NAME_TOO_LONG_HINT,
        )
    names = sys.getfilesystemencoding()
    if _not_in_file_system_encoding(error, names):
        # Python without UTF-8 mode under a locale that is not UTF-8 (LC_ALL=C with
        # PYTHONUTF8=0, a Latin-1 locale) holds file names in that encoding: a name read from a
        # UTF-8 file (a CSV index, split.csv) that it cannot hold fails wherever it is used.
        return (
            f"a file name cannot be held in this Python's file system encoding, {names}: "
            f"{first_line(error, with_type=True)}",
            FS_ENCODING_HINT,
        )
    return first_line(error, with_type=True), f"set {DEBUG_ENV}=1 to see the traceback"


def _not_in_file_system_encoding(error: BaseException, names: str) -> bool:
    """Whether `error` is text that the file system encoding `names`, where it is not UTF-8,
    cannot hold. Told by the text, not by the codec's name, which is not the encoding's
    (iso8859-1 fails as 'latin-1', iso8859-15 as 'charmap')."""
    if not isinstance(error, UnicodeEncodeError) or codecs.lookup(names).name == "utf-8":
        return False
    try:
        error.object[error.start : error.end].encode(names, "surrogateescape")
    except UnicodeEncodeError:
        return True
    return False


# --- help as a user reads it ------------------------------------------------------------------
#
# Typer renders a type for every parameter, flags included (`--amp <bool>`, as if `--amp true`
# were wanted), names arguments after the Python parameter (`{src}`, `<list[Path]>`), keeps the
# hard line breaks of a docstring's first line in command lists, and with rich markup takes
# `[default: ...]` in a help text for a style tag and drops it. The classes below fix that for
# every command at once: TorchkitGroup gives each command and parameter of the app these classes
# when the click command tree is built (see `_polish_command`).

# `[default: ...]` and `[required]` in a help text are text, not rich markup (an escaped one is
# left alone, so that polishing twice changes nothing).
_BRACKETS_AS_TEXT = re.compile(r"(?<!\\)\[(?=(?:default|required)\b)")


def _type_label(param: TyperOption | TyperArgument, ctx) -> str:
    """`<int>` for a number (its range is shown beside it), `<path>` for a list of paths: what
    one value looks like, the way `<str>` and `<file>` already read."""
    label = param.display_type(ctx)  # Typer's own: `<int range>`, `<list[Path]>`...
    if _is_ranged(param):
        label = f"<{param.type_descriptor.ranged_type_name}>"
    inner = re.fullmatch(r"<list\[(.*)\]>", label)
    if inner:
        label = f"<{inner.group(1)}>"
    if param.type_descriptor.is_choice:
        # Spaced, so that a narrow help wraps between choices (rich breaks lines at spaces
        # only, and folds a long `<a|b|c>` inside a word: `<cosine|step|mul` / `tistep|...`).
        return label.replace("|", " | ")
    return label.lower()


def _is_ranged(param: TyperOption | TyperArgument) -> bool:
    """A number with a min or max. On Python 3.10 `list[str]` passes `inspect.isclass`, and
    typer's number check then fails on it with a TypeError: a list is not a ranged number."""
    try:
        return bool(param.type_descriptor.is_ranged)
    except TypeError:
        return False


class TorchkitOption(TyperOption):
    """A flag shows no value type; other options show one value's type (or their metavar)."""

    def display_type_rich(self, ctx) -> str | None:
        if self.is_flag or self.count:
            return None
        if self.metavar is not None:
            return self.metavar
        label = _type_label(self, ctx)
        return label + "..." if self.nargs != 1 else label

    def get_runtime_param(self):
        return _cheap_first(self)

    def process_value(self, ctx, value):
        if "-o" in self.opts:
            value = _dash_as_a_file(value)
        return _process_value(self, super(), ctx, value)


def _cheap_first(param):
    """The parameter's conversion: plain values without pydantic (`coercion.CheapFirst`)."""
    if param._runtime_param is None:
        from torchkit.cli.coercion import CheapFirst

        param._runtime_param = CheapFirst(param.type_descriptor)
    return param._runtime_param


def _dash_as_a_file(value):
    """`-o ./-` names a file called `-` in the working folder; only `-o -` is stdout
    (`render.report_file`). A Path drops the `./` (Path('./-') is Path('-')): the name is made
    absolute before it becomes one."""
    if isinstance(value, str) and value != "-" and os.path.normpath(value) == "-":
        if value.endswith(os.sep):  # `./-/`: a folder's name, refused as such
            return value
        return os.path.abspath(value)
    return value


class TorchkitArgument(TyperArgument):
    """Arguments named in capitals as click and the README write them (`SRC`, `[DST]`,
    `PATH...`), without a type beside the name unless it is a choice."""

    @property
    def display_name_raw(self) -> str:
        return self.metavar if self.metavar is not None else (self.name or "").upper()

    def _rich_display_name(self) -> str:
        name = self.display_name_raw
        return name + "..." if self.nargs != 1 and not name.endswith("...") else name

    def _usage_display_name(self) -> str:
        name = self.display_name_raw
        repeated = self.nargs != 1 or name.endswith("...")
        name = name.removesuffix("...")
        name = name if self.required else f"[{name}]"
        return name + "..." if repeated else name

    def display_type_rich(self, ctx) -> str | None:
        return _type_label(self, ctx) if self.type_descriptor.is_choice else None

    def get_runtime_param(self):
        return _cheap_first(self)

    def process_value(self, ctx, value):
        if not ctx.resilient_parsing and isinstance(value, str | list | tuple):
            # The words as typed, before they become Paths (which drop a trailing slash): where
            # one is an output that a slash makes a folder, `given_words` has it.
            words = (value,) if isinstance(value, str) else tuple(value)
            ctx.meta.setdefault(GIVEN_WORDS, {})[self.name] = words
        return _process_value(self, super(), ctx, value)


# ctx.meta key: the words of each argument as the command line gives them.
GIVEN_WORDS = "torchkit.given_words"


def given_words(ctx, name: str) -> tuple:
    """The words of the argument (or, as its last value, the option) `name` of the command of
    `ctx`, as typed: () where it was not given on the command line."""
    if name in ctx.meta.get(GIVEN_WORDS, {}):
        return ctx.meta[GIVEN_WORDS][name]
    values = ctx.meta.get(_GIVEN_VALUES, {}).get(name)
    return (values[-1],) if values else ()


def _process_value(param, parent, ctx, value):
    # Shell completion parses with `resilient_parsing` and never uses the values: leaving them
    # as they are spares every TAB press the import of pydantic, which Typer's coercion needs.
    if ctx.resilient_parsing:
        return value
    _refuse_empty_value(param, ctx, value)
    _refuse_folder_name(param, ctx, value)
    try:
        return parent.process_value(ctx, value)
    except ClickUsageError as error:
        # Typer checks choices in a pydantic validator, whose errors read "Value error, 'yaml'
        # is not one of ...": the same line as click's own bad choice, without the prefix.
        if isinstance(getattr(error, "message", None), str):
            error.message = error.message.removeprefix("Value error, ")
        raise


# The options whose empty value means something, which their help says: any other option or
# argument given '' is refused, as a typo or a shell variable left unset, never taken as "not
# given" or as the current folder (Path('') is '.').
EMPTY_VALUE_MEANS_SOMETHING = frozenset({"strip_prefix"})


def _refuse_empty_value(param, ctx, value) -> None:
    if param.name in EMPTY_VALUE_MEANS_SOMETHING:
        return
    if getattr(ctx.get_parameter_source(param.name), "name", None) != "COMMANDLINE":
        return
    values = value if isinstance(value, list | tuple) else (value,)
    if "" not in values:
        return
    from torchkit.core.io.errors import UsageError

    if isinstance(param, TyperOption):
        name = _long_name(param)
        raise UsageError(f"invalid {name} '': an empty value", f"give a value, or leave {name} out")
    raise UsageError(f"invalid {param.display_name_raw} '': an empty value", "give a value")


def _refuse_folder_name(param, ctx, value) -> None:
    """A file-valued path (`-o`, export's OUT, --plot: any Path that takes no folder) given as
    `newdir/` names a folder: refused here, while the text still has its slash (the Path it
    becomes has none, and a FILE `newdir` was written); one naming an existing folder is
    refused with the line the core's check gives (`check_not_a_folder`)."""
    info = getattr(getattr(param, "type_descriptor", None), "parameter_info", None)
    if info is None or getattr(info, "dir_okay", True):
        return
    if getattr(ctx.get_parameter_source(param.name), "name", None) != "COMMANDLINE":
        return
    from torchkit.core.io.special_files import check_not_a_folder, check_not_folder_name

    name = param.display_name_raw if isinstance(param, TyperArgument) else _long_name(param)
    for item in value if isinstance(value, list | tuple) else (value,):
        if isinstance(item, str):
            check_not_folder_name(item, name)
            check_not_a_folder(item, name)  # the core's line, not click's "is a directory"


def _long_name(param) -> str:
    return next((o for o in param.opts if o.startswith("--")), param.opts[0])


def _polish_param(param) -> None:
    if type(param) is TyperOption:
        param.__class__ = TorchkitOption
    elif type(param) is TyperArgument:
        param.__class__ = TorchkitArgument
    if param.name == "help" and param.callback is not None:
        param.callback = _writing_stdout(param.callback)
    help_text = getattr(param, "help", None)
    if help_text:
        param.help = _BRACKETS_AS_TEXT.sub(r"\\[", help_text)


def _tidy_help(help_text: str | None) -> str | None:
    """The docstring with its first paragraph on one line (rich markup keeps line breaks, so a
    wrapped summary would show its breaks in `torchkit --help`), and each later paragraph
    dedented on its own, so that an indented Examples block renders the same way whether prose
    comes before it or not."""
    if not help_text:
        return help_text
    first, *rest = inspect.cleandoc(help_text).split("\n\n")
    if first.startswith("\b"):
        return help_text
    return "\n\n".join([" ".join(first.split()), *(_tidy_paragraph(p) for p in rest)])


def _tidy_paragraph(paragraph: str) -> str:
    """A paragraph of prose on one line, which the terminal wraps (its docstring's line breaks,
    kept, left a 100-column line in two at 80 columns: a line, then a word or two); an indented
    or `\\b` paragraph or a command line is kept as it is written."""
    paragraph = textwrap.dedent(paragraph)
    lines = paragraph.splitlines()
    kept = paragraph.startswith("\b") or any(
        line.startswith((" ", "torchkit ", "torchrun ")) for line in lines
    )
    return paragraph if kept else " ".join(paragraph.split())


def _polish_command(command) -> None:
    """Give a command built by Typer the help conventions above (idempotent)."""
    if type(command) is TyperCommand:
        command.__class__ = TorchkitCommand
    command.help = _tidy_help(command.help)
    _add_verbose_option(command)
    _add_quiet_option(command)
    for param in command.params:
        _polish_param(param)


VERBOSE_HELP = "Show informational logs on stderr."
QUIET_HELP = "Print only the result and problems: no progress and no notes on stderr."


def _add_verbose_option(command) -> None:
    """`-v/--verbose` after the command name too (`torchkit env -v`), as before it: every
    command and group takes it, unless it has a `-v` or `--verbose` of its own (the app's
    own, before the command name, is one)."""
    _add_flag(command, "verbose")


def _add_quiet_option(command) -> None:
    """`-q/--quiet`, for every command and group, unless it has its own (env's, which also
    drops the report)."""
    _add_flag(command, "quiet")


def _add_flag(command, name: str) -> None:
    option = _flag_template(name)
    taken = {opt for param in command.params for opt in getattr(param, "opts", ())}
    if taken & set(option.opts):
        return
    command.params.append(copy.copy(option))


def _quiet_flag(ctx, param, value: bool) -> bool:
    if value and not ctx.resilient_parsing:
        console.set_quiet(True)
    return value


def _verbose_flag(ctx, param, value: bool) -> bool:
    if value and not ctx.resilient_parsing:
        console.install_log_handler(True)  # after the app's callback: a later -v wins
    return value


# The flags every command is given: name -> (short flag, help, callback).
_FLAGS = {
    "verbose": ("-v", VERBOSE_HELP, _verbose_flag),
    "quiet": ("-q", QUIET_HELP, _quiet_flag),
}


@functools.cache
def _flag_template(name: str):
    """The `-v/--verbose` or `-q/--quiet` option the commands are given, made by Typer as the
    app's own options are."""
    short, help_text, callback = _FLAGS[name]
    probe = typer.Typer()

    @probe.command()
    def _probe(
        flag: bool = typer.Option(False, f"--{name}", short, help=help_text, callback=callback),
    ) -> None:
        """Stands for a command: Typer builds its option."""

    (option,) = [p for p in typer.main.get_command(probe).params if p.name == "flag"]
    option.name = name
    option.expose_value = False  # the commands' functions do not take it
    return option


# ctx.meta key: each single-valued option's values as the command line gives them, in order.
_GIVEN_VALUES = "torchkit.given_values"


def _recording_values(parser, ctx) -> None:
    """Make `parser` record in ctx.meta every value of each single-valued option (click keeps
    only the last). Left as it is where the parser is not built as click's 8.x is."""
    given: dict[str, list] = ctx.meta.setdefault(_GIVEN_VALUES, {})
    options = [
        *getattr(parser, "_long_opt", {}).values(),
        *getattr(parser, "_short_opt", {}).values(),
    ]
    for option in {id(option): option for option in options}.values():
        param = getattr(option, "obj", None)
        if getattr(option, "action", None) != "store" or not isinstance(param, TyperOption):
            continue
        if param.multiple or param.count or param.is_flag:
            continue

        def recording(value, state, process=option.process, name=param.name):
            given.setdefault(name, []).append(value)
            return process(value, state)

        option.process = recording


def _warn_of_repeated_options(command, ctx) -> None:
    """A single-valued option given again with another value (`--lr 1 ... --lr 2`) takes the last,
    as click (and most command lines) do, so that `$BASE --epochs 6` overrides BASE's: said in a
    warning, never silently. A recipe's value that the command line overrides is no repeat."""
    names = {param.name: param for param in command.params if isinstance(param, TyperOption)}
    for name, values in ctx.meta.get(_GIVEN_VALUES, {}).items():
        # nargs > 1 gives a tuple; in-process callers may pass any object (a Path)
        shown = [" ".join(map(str, v)) if isinstance(v, tuple | list) else str(v) for v in values]
        if len(set(shown)) < 2 or name not in names:
            continue
        flag = "/".join(sorted(names[name].opts, key=len))  # -e/--epochs
        times = "twice" if len(shown) == 2 else f"{len(shown)} times"
        console.warn(
            f"{flag} is given {times} ({', then '.join(shown)}): the last, {shown[-1]}, is used"
        )


def _options_after_double_dash(command, args: list[str], error: ClickUsageError) -> None:
    """`split -- data out --mode move`: every word after `--` is an argument, so an option
    there is an extra argument too many. Where one of those words is one of the command's
    options, the error says that options go before `--` (click said only "Got unexpected extra
    argument(s) (--mode move)")."""
    if "--" not in args or not str(getattr(error, "message", "")).startswith("Got unexpected"):
        return
    spellings = {
        spelling
        for param in command.params
        for spelling in (*getattr(param, "opts", ()), *getattr(param, "secondary_opts", ()))
        if spelling.startswith("-")
    }
    after = args[args.index("--") + 1 :]
    extra = str(error.message).rstrip(".").removesuffix(")").partition(") (")[2].split(" ")
    options = [word for word in after if word.split("=", 1)[0] in spellings and word in extra]
    if options:
        error.message = (
            f"{error.message.rstrip('.')}: {options[0]} comes after --, which makes every word "
            "after it an argument; options go before --"
        )


def _use_torchkit_help_layout() -> None:
    """Typer's help draws its Options and Arguments panels with `help_layout.options_panel`,
    which wraps what Typer's own cut with `…` at 80 columns. Set on the first help printed
    (rich_utils is imported for help only: a command run never pays for it)."""
    from typer import rich_utils

    from torchkit.cli.help_layout import options_panel

    rich_utils._print_options_panel = options_panel


class TorchkitCommand(TyperCommand):
    def make_parser(self, ctx):
        parser = super().make_parser(ctx)
        if not ctx.resilient_parsing:  # completion: nothing is run, nothing to say
            _recording_values(parser, ctx)
        return parser

    def parse_args(self, ctx, args):
        given = list(args)  # the parser consumes the list it is given
        try:
            rest = super().parse_args(ctx, args)
        except ClickUsageError as error:
            # The parser's own errors (`--format` with no value) come without the command:
            # their hint named `torchkit --help`, where every other one names the command's.
            if getattr(error, "ctx", None) is None:
                error.ctx = ctx
            _options_after_double_dash(self, given, error)
            raise
        _warn_of_repeated_options(self, ctx)
        return rest

    def invoke(self, ctx):
        # The command line is parsed (and --help printed) by now: from here on, stdout carries
        # the command's result alone. What it reads is held to its end (the data's locks).
        with console.results_only_on_stdout(), held_until_the_command_ends():
            return super().invoke(ctx)

    def format_help(self, ctx, formatter):
        with _reporting_stdout_write_errors():  # rich prints the help to stdout right here
            _require_stdout()
            _use_torchkit_help_layout()
            return super().format_help(ctx, formatter)

    def get_params(self, ctx):
        params = super().get_params(ctx)
        for param in params:  # the --help option is made on first use
            _polish_param(param)
        return params


class TorchkitGroup(TyperGroup):
    """Runs commands so that failures end in one `Error: <what> (<hint>)` line on stderr, and
    command-line mistakes in one such line too (exit code 2), instead of click's usage panel."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        _polish_command(self)
        for command in self.commands.values():
            _polish_command(command)

    def get_command(self, ctx, cmd_name):
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            _polish_command(command)
        return command

    def format_help(self, ctx, formatter):
        with _reporting_stdout_write_errors():  # also bare `torchkit`, which shows the help
            _require_stdout()
            _use_torchkit_help_layout()
            return super().format_help(ctx, formatter)

    def parse_args(self, ctx, args):
        # Bare `torchkit` or `torchkit convert`: the help, as --help gives it (stdout, exit 0),
        # as `docker`, `kubectl` and `pip` do; click made it a usage error (exit 2) with the
        # help on stdout, which a script's `torchkit >/dev/null || ...` took for a failure.
        if not args and self.no_args_is_help and not ctx.resilient_parsing:
            typer.echo(ctx.get_help(), color=ctx.color)
            ctx.exit()
        return super().parse_args(ctx, args)

    def get_params(self, ctx):
        params = super().get_params(ctx)
        for param in params:  # --install-completion and --help are added after __init__
            _polish_param(param)
        return params

    def make_context(self, info_name, args, parent=None, **extra):
        if parent is None:
            console.set_quiet(False)  # a new command line (in-process runs share the module)
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except ClickUsageError as error:
            _usage_error(error)

    def invoke(self, ctx):
        from torchkit.core.io.errors import Terminated, TorchkitError

        signals = _terminate_like_interrupt()
        try:
            # Every output the command left open is closed before the handlers go back (a
            # later signal does nothing meanwhile): a stop raised where the command's own
            # clean-up was not in place leaves no hidden folder, temporary or lock.
            with signals, closed_at_end():
                return super().invoke(ctx)
        except ClickUsageError as error:
            _usage_error(error)
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise
        except TorchkitError as error:
            if error.reported_by_another_rank:
                raise typer.Exit(error.exit_code) from None  # the failed rank's line says it
            if error.on_every_rank and not _is_main_process():
                raise typer.Exit(error.exit_code) from None  # rank 0 reports it, once
            if error.from_shared_inputs and _leave_to_local_rank_0():
                raise typer.Exit(error.exit_code) from None  # local rank 0 reports it
            working_folder.explain(error)
            _report(error, str(error))
            raise typer.Exit(error.exit_code) from None
        except BrokenPipeError:
            exit_quietly_on_broken_pipe()
        except KeyboardInterrupt as error:
            # The clean-up (workers stopped, a set-aside output put back) has run by now.
            terminated = isinstance(error, Terminated)
            console.stderr.print("Terminated." if terminated else "Interrupted.")
            raise typer.Exit(143 if terminated else 130) from None
        except Exception as error:
            what, hint = describe_unexpected(error, _options_of(self, ctx))
            _report(error, f"{what} ({hint})")
            raise typer.Exit(1) from None
        finally:
            # A stop raised as the `with` began to end (its __exit__ entered) skipped the
            # handlers' return, and the generator waited, kept by the stop's traceback, for the
            # garbage collector: an in-process caller had SIGTERM and Ctrl-C ignored until then.
            # Closed here, its `finally` puts them back (done already: nothing to do).
            signals.gen.close()


def _options_of(group: Any, ctx: Any) -> set[str] | None:
    """The option spellings of the command `ctx` ran (`summary` takes no --amp), or None."""
    name = ctx.invoked_subcommand
    command = group.get_command(ctx, name) if name else None
    if command is None or hasattr(command, "commands"):  # a group: its commands differ
        return None
    return {
        spelling for param in command.params for spelling in (*param.opts, *param.secondary_opts)
    }


def _is_main_process() -> bool:
    from torchkit.core.runtime.launch import is_main_process

    return is_main_process()


def _leave_to_local_rank_0() -> bool:
    from torchkit.core.runtime.launch import leave_to_local_rank_0

    return leave_to_local_rank_0()


# The signals that reached a command's `_raise_once` since its handlers were set, first first:
# the ending of a command that one reached is that signal's, even where its exception never
# came out of the command (a stop raised in a `__del__` or a weakref callback is swallowed, and
# every later signal is ignored: the command then finished and exited 0). Shared with train's
# own handlers (core.train.stop_signal), which note theirs there too.
_received: list[int] = received_stops


def _raise_once(signum, frame) -> None:
    from torchkit.core.io.errors import Terminated

    note_stop(signum)
    if deferred_signals.defer(signum):  # inside `import torch`: raised when it is over
        return
    deferred_signals.ignore_later((signal.SIGTERM, signal.SIGINT))
    quieted = quiet_loader_worker_deaths()
    if quieted is not None:
        _QUIETED_CHILD_HANDLERS.append(quieted)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


# torch's SIGCHLD handler, swapped out by a stopped command (see quiet_loader_worker_deaths).
_QUIETED_CHILD_HANDLERS: list[Any] = []


def _reset_in_child() -> None:
    # Forked workers (DataLoader, pools) must not unwind like the command, nor ignore SIGTERM
    # as a stopped command does, nor end like torchkit starting: SIGTERM kills them outright.
    handler = signal.getsignal(signal.SIGTERM)
    if (
        handler is _raise_once
        or deferred_signals.is_ignore_later(handler)
        or ends_while_starting(handler)
    ):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)


os.register_at_fork(after_in_child=_reset_in_child)


@contextlib.contextmanager
def _terminate_like_interrupt() -> Iterator[None]:
    """SIGTERM raises `Terminated` (a KeyboardInterrupt) so it unwinds like Ctrl-C: every
    clean-up runs. Only the first signal raises; later ones are ignored so that they cannot
    break the clean-up half-way (SIGKILL still works). A signal that reached the command ends it
    with 143 or 130 however the command ended (`_stop_not_come_out`): one that came as its
    work was done, or whose exception was dropped where it was raised."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    global _unraisable_hook_before
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    quiets_stops = sys.unraisablehook is not _quiet_about_stops  # not inside the app's group
    ended_by: BaseException | None = None
    try:
        if quiets_stops:
            _received.clear()
            _unraisable_hook_before = sys.unraisablehook
            sys.unraisablehook = _quiet_about_stops
        # One the process was started ignoring stays ignored, as it does while torchkit starts.
        handle_unless_ignored(previous, _raise_once)
        yield
    except BaseException as error:
        ended_by = error
        raise
    finally:
        # The handlers go back even when the stop is raised as they do (the loop was left
        # half-way: an in-process caller's SIGTERM and Ctrl-C were ignored from then on); the
        # stop is raised once they are back. No call comes before the `try`: a signal is
        # handled as a call is made, inside it.
        stopped_meanwhile: KeyboardInterrupt | None = None
        for _attempt in (1, 2):  # a stop raises once: the second attempt runs undisturbed
            try:
                _put_back_handlers(previous, quiets_stops)
                break
            except KeyboardInterrupt as stop:
                stopped_meanwhile = stop
        stop = _stop_not_come_out(ended_by)
        if stopped_meanwhile is not None:
            raise stopped_meanwhile from None
        if stop is not None:
            raise stop from None


def _put_back_handlers(previous: dict, quiets_stops: bool) -> None:
    if quiets_stops and sys.unraisablehook is _quiet_about_stops:
        sys.unraisablehook = _unraisable_hook_before
    # A command that was stopped, or that ignores the signals from now on (a torchrun rank
    # that torchrun's agent stops after another rank's failure), keeps ignoring them while
    # the process ends: a SIGTERM now printed a second `Terminated.` line.
    ending = runs_as_the_program()
    for sig, handler in previous.items():
        if not (ending and deferred_signals.is_ignore_later(signal.getsignal(sig))):
            signal.signal(sig, handler)
    # The workers a group's SIGTERM ended may report in after the command is over; a call
    # from someone's Python goes on, and its next loaders report their workers again.
    while _QUIETED_CHILD_HANDLERS and not ending:
        restore_loader_worker_deaths(_QUIETED_CHILD_HANDLERS.pop())


# sys.unraisablehook as the command found it (a command inside the app's group keeps the app's).
_unraisable_hook_before: Any = sys.unraisablehook


def _quiet_about_stops(unraisable: Any) -> None:
    """sys.unraisablehook while a command runs: a stop raised where Python cannot pass it on (a
    signal handled inside a finalizer or a `__del__`) is recorded in `_received` and ends the
    command at its end (`_stop_not_come_out`), so Python's report of it, a traceback, is left
    out. Anything else is reported as before."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and _received:
        return
    _unraisable_hook_before(unraisable)


def _stop_not_come_out(ended_by: BaseException | None) -> KeyboardInterrupt | None:
    """The stop a signal that reached the command asked for, where the command ended some other
    way: it finished (the signal came as its handlers went back, or its exception was
    swallowed), failed, or exited. SIGTERM or Ctrl-C at any moment ends a command with 143 or
    130, as timeout(1), systemd and Slurm expect of a process they stopped, even one whose
    outputs were whole by then. None where the stop came out itself (a KeyboardInterrupt, or the
    `with` left by one raised as its end began), or where a torchrun rank ends with the failed
    rank's code on purpose. The record is read once: a group's command inside the app's ends
    it."""
    from torchkit.core.io.errors import Terminated, TorchkitError

    if not _received:
        return None
    signum = _received[0]
    _received.clear()
    if isinstance(ended_by, KeyboardInterrupt | GeneratorExit):
        return None
    if isinstance(ended_by, TorchkitError) and ended_by.reported_by_another_rank:
        return None
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _usage_error(error: ClickUsageError) -> NoReturn:
    """Report a bad command line as `Error: <what> (see 'torchkit CMD --help')`, exit 2."""
    if _leave_to_local_rank_0():  # the same command line on every rank: local rank 0 reports it
        raise typer.Exit(error.exit_code) from None
    ctx = getattr(error, "ctx", None)
    command = ctx.command_path if ctx is not None else "torchkit"
    _report(error, f"{error.format_message().rstrip('.')} (see '{command} --help')")
    raise typer.Exit(error.exit_code) from None


def exit_without_teardown(done: SystemExit) -> None:
    """End the process as `done` says, skipping only the interpreter's teardown of its modules
    and the libraries' static destructors, which take 0.5-0.7 s once torch is loaded (most of
    the time between a command's last line and the shell's prompt). First, everything an exit
    does that can matter: threading's exit hooks run and non-daemon threads are waited for,
    every atexit handler runs (multiprocessing stops its workers, temporary folders go, logging
    flushes), and stdout and stderr are flushed. Every file torchkit writes is closed
    explicitly before this point."""
    import atexit
    import threading

    code = done.code
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)  # what SystemExit("message") prints
        code = 1
    # The interpreter's own first steps at exit, in its order: threading's exit hooks (an idle
    # ThreadPoolExecutor's workers are told to stop), then every non-daemon thread is waited
    # for, then the atexit handlers.
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        if stream is None:  # no stream at all (pythonw, `>&-`): nothing to flush
            continue
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader gone, a closed stream: as Python's own exit
            code = code or 120
    os._exit(code or 0)


# What a shell reports for a GNU tool that SIGPIPE ended (128 + SIGPIPE's number, 13).
BROKEN_PIPE_EXIT = 141


def exit_quietly_on_broken_pipe() -> NoReturn:
    """`torchkit ... | head -1`: the reader left. Stop as GNU tools do: nothing on stderr (not
    even Python's complaint when stdout is flushed at exit), exit code 141. The command has
    unwound by now (its loaders' workers stopped); the exit runs the atexit handlers."""
    console.drop_stdout()
    raise SystemExit(BROKEN_PIPE_EXIT)


def flushed_stdout(done: SystemExit) -> SystemExit:
    """`done`, or the broken-pipe exit when what is left in stdout's buffer finds that the
    reader has left (a result small enough to wait in the buffer until the end)."""
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except BrokenPipeError:
        console.drop_stdout()
        return SystemExit(BROKEN_PIPE_EXIT)
    except OSError as error:  # a full disk: the results did not all reach it
        failure = console.stdout_write_error(error)
        if done.code in (0, None):
            _report(error, str(failure))
            return SystemExit(1)
    except ValueError:
        pass  # a closed stream: as Python's own exit
    return done


def _report(error: BaseException, line: str) -> None:
    from rich.markup import escape

    if debug_enabled():
        console.stderr.print(
            "".join(traceback.format_exception(error)), markup=False, highlight=False
        )
    # The message is escaped: paths and shapes like "x[1].png" or "[3, 224]" are not markup,
    # and a file name's line break does not end the one line early.
    console.stderr.print(
        f"[bold red]Error:[/] {escape(console.shown_text(line))}",
        highlight=False,
        soft_wrap=True,
        markup=True,
    )


def _version_callback(value: bool) -> None:
    if value:
        with _reporting_stdout_write_errors():
            _require_stdout()
            typer.echo(f"torchkit {__version__}")
        raise typer.Exit()


def _require_stdout() -> None:
    """`torchkit --help >&-`: Python's sys.stdout is None, and click and rich would write the
    help nowhere and exit 0; it fails as a command's result into a closed stdout fails."""
    if sys.stdout is None:
        raise OSError(errno.EBADF, os.strerror(errno.EBADF))


@contextlib.contextmanager
def _reporting_stdout_write_errors() -> Iterator[None]:
    """`torchkit --help > /dev/full`: one `Error:` line, as for a command's results, not a
    traceback (the help and the version are written while the command line is parsed, before
    any command's error boundary). A reader that left (`| head`) stays quiet, as elsewhere."""
    try:
        yield
    except BrokenPipeError:
        exit_quietly_on_broken_pipe()
    except SystemExit as done:
        if isinstance(done.__context__, BrokenPipeError):  # rich's own exit (the help's console)
            exit_quietly_on_broken_pipe()
        raise
    except OSError as error:
        _report(error, str(console.stdout_write_error(error)))
        raise typer.Exit(1) from None


def _writing_stdout(callback):
    """The help option's callback, with its write errors reported as above (idempotent)."""
    if getattr(callback, "_torchkit_stdout", False):
        return callback

    def show_help(*args: Any, **kwargs: Any) -> Any:
        with _reporting_stdout_write_errors():
            return callback(*args, **kwargs)

    show_help._torchkit_stdout = True  # type: ignore[attr-defined]
    return show_help


# --- shell completion: build only what the word being completed needs ---------------------------

COMPLETE_ENV = "_TORCHKIT_COMPLETE"


def _completed_words() -> list[str]:
    """The words before the one being completed (after `torchkit`), as each shell passes them
    to Typer's completion classes; [] when they cannot be read."""
    if "COMP_WORDS" in os.environ:  # bash
        try:
            cword = int(os.environ.get("COMP_CWORD", ""))
        except ValueError:
            return []
        return split_arg_string(os.environ["COMP_WORDS"])[1:cword]
    line = os.environ.get("_TYPER_COMPLETE_ARGS", "")  # zsh, fish, PowerShell
    words = split_arg_string(line)[1:]
    if "_TYPER_COMPLETE_WORD_TO_COMPLETE" in os.environ:  # PowerShell
        incomplete = bool(os.environ["_TYPER_COMPLETE_WORD_TO_COMPLETE"])
    else:
        incomplete = not line.endswith(" ")
    return words[:-1] if words and incomplete else words


def split_arg_string(line: str) -> list[str]:
    """The words of a partly typed command line, as a POSIX shell splits them; an unclosed
    quote keeps what follows it as the last word (the one being typed)."""
    import shlex

    lexer = shlex.shlex(line, posix=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    words: list[str] = []
    try:
        for token in lexer:
            words.append(token)
    except ValueError:  # no closing quotation
        words.append(lexer.token)
    return words


def _placeholder() -> None:
    """Stands for a command while command names are completed."""


def _default_value(value: Any) -> Any:
    from typer.models import DefaultPlaceholder

    return value.value if isinstance(value, DefaultPlaceholder) else value


def _as_placeholder(name: str, help_text: str | None, hidden: bool):
    from typer.models import CommandInfo

    return CommandInfo(name=name, callback=_placeholder, help=help_text, hidden=hidden)


# The app's own options that may come before a command's name and show nothing themselves.
_QUIET_ROOT_FLAGS = frozenset({"-v", "--verbose", "-q", "--quiet"})


def _is_quiet_root_flag(word: str) -> bool:
    """Whether `word` is the app's quiet flags alone: one (`-v`), or short ones joined as click
    reads them (`-vq`)."""
    if word in _QUIET_ROOT_FLAGS:
        return True
    joined = word[1:] if word.startswith("-") and not word.startswith("--") else ""
    return bool(joined) and all(f"-{letter}" in _QUIET_ROOT_FLAGS for letter in joined)


def _registered(typer_app: typer.Typer) -> tuple[dict[str, Any], dict[str, Any]]:
    """The app's registered commands and groups (`convert`), by name."""
    commands = {info.name: info for info in typer_app.registered_commands if info.name}
    groups = {
        _default_value(info.name): info
        for info in typer_app.registered_groups
        if _default_value(info.name)
    }
    return commands, groups


def _named_command(typer_app: typer.Typer, words: list[str]) -> tuple[list, list] | None:
    """The (commands, groups) that `words`, the arguments after `torchkit`, run: the command or
    group their first word names, after the app's quiet flags alone (`-v -q`, joined: `-vq`).
    None for anything else (no command, `--help` or `--version` first, a name that is no
    command's, which click answers with the close names): the whole app is needed there."""
    commands, groups = _registered(typer_app)
    name = next((word for word in words if not _is_quiet_root_flag(word)), None)
    if name in commands:
        return [commands[name]], []
    if name in groups:
        return [], [groups[name]]
    return None


def _for_completion(typer_app: typer.Typer) -> tuple[list, list]:
    """The (commands, groups) to register while completing: the command being completed alone,
    or, while its name is being typed, every command as a placeholder with no options (the
    names, help lines and hidden flags are all completion shows). Building a command (reading
    its signature, evaluating its annotations) is what a TAB press spends most of its time on."""
    words = _completed_words()
    named = _named_command(typer_app, words)
    if named is not None:
        return named
    commands, groups = _registered(typer_app)
    if any(not word.startswith("-") for word in words):  # not a command: complete as usual
        return list(commands.values()), list(groups.values())
    placeholders = [
        _as_placeholder(
            name, info.help or inspect.getdoc(info.callback), bool(_default_value(info.hidden))
        )
        for name, info in commands.items()
    ]
    for name, info in groups.items():
        help_text = _default_value(info.help) or _default_value(info.typer_instance.info.help)
        placeholders.append(_as_placeholder(name, help_text, bool(_default_value(info.hidden))))
    return placeholders, []


# The shells `--install-completion SHELL` and `--show-completion SHELL` name.
COMPLETION_SHELLS = ("bash", "zsh", "fish", "powershell", "pwsh")


def _completion_for_named_shell(typer_app: typer.Typer, argv: list[str]) -> None:
    """`torchkit --install-completion [SHELL]` and `--show-completion [SHELL]`. Typer's two
    completion options are flags, so a shell named after them was ignored and the current
    shell's script installed (bash's, from a bash prompt); and Typer's installation rewrote the
    rc file in place (a full disk cut it short) and ended a read-only HOME in a traceback. Here
    they act for the shell named, or the current one (exit 0), refuse a shell they do not know
    (exit 2), and a file that cannot be written is one `Error:` line (exit 1); anything else is
    left to Typer."""
    if not argv or len(argv) > 2 or argv[0] not in ("--install-completion", "--show-completion"):
        return
    from torchkit.core.io.errors import TorchkitError

    try:
        _complete_for_shell(typer_app, *argv)
    except TorchkitError as error:
        _report(error, str(error))
        raise SystemExit(error.exit_code) from None


def _complete_for_shell(typer_app: typer.Typer, option: str, named: str | None = None) -> None:
    from torchkit.cli.completion import completion_script, install_completion
    from torchkit.core.io.errors import UsageError

    shells = ", ".join(COMPLETION_SHELLS)
    shell = named if named is not None else _current_shell()
    if named is not None and named not in COMPLETION_SHELLS:
        raise UsageError(
            f"unknown shell {named!r} for {option}",
            f"use one of {shells}, or none for the current shell",
        )
    if shell not in COMPLETION_SHELLS:
        raise UsageError(
            f"{option} completes in {shells}; the current shell is {shell or 'unknown'}",
            f"name the shell: {option} bash",
        )
    if shell in ("bash", "zsh", "fish"):
        if option == "--show-completion":
            with _reporting_stdout_write_errors():
                _require_stdout()
                typer.echo(completion_script(shell))
        else:
            path = install_completion(shell)
            typer.secho(f"{shell} completion installed in {path}", fg="green")
            typer.echo("Completion will take effect once you restart the terminal")
        raise SystemExit(0)
    from typer.completion import install_callback, show_callback

    act = install_callback if option == "--install-completion" else show_callback
    command = typer.main.get_command(typer_app)
    with command.make_context("torchkit", [], resilient_parsing=True) as ctx:
        ctx.resilient_parsing = False  # the callbacks do nothing while parsing resiliently
        act(ctx, None, shell)  # exits


def _current_shell() -> str | None:
    """The shell torchkit runs from, as Typer finds it (its parent processes)."""
    from typer.completion import _get_shell_name

    return _get_shell_name()


class _TorchkitTyper(typer.Typer):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Typer builds every registered command (reads its signature, evaluates its
        # annotations) on each call: a run builds only the command it runs, a TAB press only
        # what it completes; everything else (help, a misspelled name) builds the whole app.
        if os.environ.get(COMPLETE_ENV):
            wanted = _for_completion(self)
        else:
            given = args[0] if args else kwargs.get("args")  # click's `args`: None is argv's
            argv = list(sys.argv[1:] if given is None else given)
            _completion_for_named_shell(self, argv)
            wanted = _named_command(self, argv)
        if wanted is None:
            return super().__call__(*args, **kwargs)
        # A copy of the app holding those alone is built: the app itself is never changed, so
        # another call meanwhile (another thread's, one from inside a command) sees all of it.
        view = copy.copy(self)
        view.registered_commands, view.registered_groups = wanted
        return typer.Typer.__call__(view, *args, **kwargs)


app = _TorchkitTyper(
    cls=TorchkitGroup,
    name="torchkit",
    help="Train, evaluate and inspect PyTorch image models from the shell.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _root(
    version: bool = typer.Option(
        False,
        "--version",
        "-V",
        help="Show the version and exit.",
        callback=_version_callback,
        is_eager=True,
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help=VERBOSE_HELP),
) -> None:
    console.install_log_handler(verbose)
