"""The Typer layer: one thin module per command, registered on one app.

Nothing here imports torch, torchvision, cv2, pandas or sklearn at import time, so `--help` and
shell completion stay fast; commands import core inside their functions.
"""

from __future__ import annotations

import importlib
import os
import sys

from torchkit.program import end_on_signals_while_starting, open_closed_standard_descriptors

open_closed_standard_descriptors()  # before any file is opened and kept: it would take 0-2
end_on_signals_while_starting()  # first: a Ctrl-C from here until a command runs ends it cleanly

from torchkit import (  # noqa: E402
    deferred_signals,
    torchvision_without_dynamo,
    torchvision_without_onnx,
    working_folder,
)
from torchkit.bytecode import keep_bytecode_cache  # noqa: E402

keep_bytecode_cache()  # before typer, rich and (later) torch are imported
torchvision_without_dynamo.install()  # before torchvision is imported
torchvision_without_onnx.install()  # the same
deferred_signals.install()  # first: it hands torchvision to the finder above
working_folder.install()  # torch is not imported where the working folder is gone

from torchkit.cli import console  # noqa: E402
from torchkit.cli.app import (  # noqa: E402
    app,
    exit_quietly_on_broken_pipe,
    exit_without_teardown,
    flushed_stdout,
    runs_as_the_program,
)

# Each module defines `register(app)`; order is the order of `torchkit --help`.
COMMAND_MODULES: tuple[str, ...] = (
    "env",
    "train",
    "evaluate",
    "predict",
    "convert",
    "dataset_stats",
    "split",
    "summary",
    "extract_features",
    "export",
    "video_info",
    "convert_syncbn",
    "benchmark",
)

for _name in COMMAND_MODULES:
    importlib.import_module(f"torchkit.cli.{_name}").register(app)


def main() -> None:
    console.unknown_terminal_size_as_unset()  # before typer or a command makes a console
    if os.environ.get("_TORCHKIT_COMPLETE"):
        # zsh and fish completions carry each option's help, which Typer renders with rich at
        # the terminal width: a wrapped line would turn into a bogus completion candidate.
        os.environ.setdefault("TERMINAL_WIDTH", "100000")
        rich_utils = sys.modules.get("typer.rich_utils")  # read at its import; set it if too late
        if rich_utils is not None:
            rich_utils.MAX_WIDTH = int(os.environ["TERMINAL_WIDTH"])
    console.write_names_as_bytes()
    console.diagnostics_on_best_effort()
    try:
        try:
            app(prog_name="torchkit")
        except BrokenPipeError:
            exit_quietly_on_broken_pipe()
    except SystemExit as ended:
        done = flushed_stdout(ended)
        if "torch" in sys.modules and runs_as_the_program():
            exit_without_teardown(done)
        raise done from None


__all__ = ["app", "main"]
