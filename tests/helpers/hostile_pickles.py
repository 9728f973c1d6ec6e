"""A pickle that runs a shell command when loaded by a plain unpickler: what the loaders that must
refuse arbitrary pickles (convert cifar, convert tensor) are tested with."""

from __future__ import annotations

import os
from pathlib import Path


class RunsShell:
    """Unpickled by `pickle.load`, it runs `touch MARKER`: the marker shows the code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))
