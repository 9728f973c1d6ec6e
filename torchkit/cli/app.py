"""The Typer app and the error boundary every command runs inside."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from typing import NoReturn

import typer
from rich.markup import escape
from typer._click.exceptions import NoArgsIsHelpError
from typer._click.exceptions import UsageError as ClickUsageError
from typer.core import TyperGroup

from torchkit import __version__
from torchkit.cli import console
from torchkit.core.errors import first_line

DEBUG_ENV = "TORCHKIT_DEBUG"


def debug_enabled() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip() not in ("", "0", "false", "no")


def describe_unexpected(error: BaseException) -> tuple[str, str]:
    """Turn an exception that escaped core into (what, hint) for the one-line error."""
    name = type(error).__name__
    if name == "OutOfMemoryError" or "out of memory" in str(error).lower():
        return "the GPU ran out of memory", "use a smaller --batch-size, --amp or a smaller model"
    return first_line(error, with_type=True), f"set {DEBUG_ENV}=1 to see the traceback"


class TorchkitGroup(TyperGroup):
    """Runs commands so that failures end in one `Error: <what> (<hint>)` line on stderr, and
    command-line mistakes in one such line too (exit code 2), instead of click's usage panel."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except ClickUsageError as error:
            _usage_error(error)

    def invoke(self, ctx):
        from torchkit.core.errors import Terminated, TorchkitError

        try:
            with _terminate_like_interrupt():
                return super().invoke(ctx)
        except ClickUsageError as error:
            _usage_error(error)
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise
        except TorchkitError as error:
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
            what, hint = describe_unexpected(error)
            _report(error, f"{what} ({hint})")
            raise typer.Exit(1) from None


def _raise_once(signum, frame) -> None:
    from torchkit.core.errors import Terminated

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _reset_in_child() -> None:
    # Forked workers (DataLoader, pools) must not unwind like the command: SIGTERM kills them
    # outright, as it would have before the command started.
    if signal.getsignal(signal.SIGTERM) is _raise_once:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)


os.register_at_fork(after_in_child=_reset_in_child)


@contextlib.contextmanager
def _terminate_like_interrupt() -> Iterator[None]:
    """SIGTERM raises `Terminated` (a KeyboardInterrupt) so it unwinds like Ctrl-C: every
    clean-up runs. Only the first signal raises; later ones are ignored so that they cannot
    break the clean-up half-way (SIGKILL still works)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig in previous:
        signal.signal(sig, _raise_once)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _usage_error(error: ClickUsageError) -> NoReturn:
    """Report a bad command line as `Error: <what> (see 'torchkit CMD --help')`, exit 2."""
    if isinstance(error, NoArgsIsHelpError):  # bare `torchkit`: click shows the help
        raise error
    ctx = getattr(error, "ctx", None)
    command = ctx.command_path if ctx is not None else "torchkit"
    _report(error, f"{error.format_message().rstrip('.')} (see '{command} --help')")
    raise typer.Exit(error.exit_code) from None


def exit_quietly_on_broken_pipe() -> None:
    """`torchkit ... | head`: the reader left. Stop without an error message (and without
    Python's complaint when stdout is flushed at exit), with exit code 1 as click does."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    raise SystemExit(1)


def _report(error: BaseException, line: str) -> None:
    if debug_enabled():
        console.stderr.print(
            "".join(traceback.format_exception(error)), markup=False, highlight=False
        )
    # The message is escaped: paths and shapes like "x[1].png" or "[3, 224]" are not markup.
    console.stderr.print(
        f"[bold red]Error:[/] {escape(line)}", highlight=False, soft_wrap=True, markup=True
    )


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"torchkit {__version__}")
        raise typer.Exit()


app = typer.Typer(
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
    verbose: bool = typer.Option(
        False, "--verbose", "-v", help="Show informational logs on stderr."
    ),
) -> None:
    console.install_log_handler(verbose)
