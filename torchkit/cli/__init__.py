"""The Typer layer: one thin module per command, registered on one app.

Nothing here imports torch, torchvision, cv2, pandas or sklearn at import time, so `--help` and
shell completion stay fast; commands import core inside their functions.
"""

from __future__ import annotations

import importlib

from torchkit.cli.app import app

# Each module defines `register(app)`; order is the order of `torchkit --help`.
COMMAND_MODULES: tuple[str, ...] = ("video_info",)

for _name in COMMAND_MODULES:
    importlib.import_module(f"torchkit.cli.{_name}").register(app)


def main() -> None:
    app(prog_name="torchkit")


__all__ = ["app", "main"]
