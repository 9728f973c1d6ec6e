"""Plots drawn by a helper process that imports matplotlib beside a command's start-up
(`core.runtime.helper_process`): the command's side. The service is `torchkit.core.plotting`.

Importing matplotlib's figure machinery takes about a second, and a command drawing a plot
(train's curves.png and lr_find.png, eval's confusion_matrix.png and errors.png, dataset-stats
--plot) used to pay it at its end. A helper is started first thing (before torch is imported),
so the import runs on another core; at the end the command sends each plot as a request of a
kind ("curves", "confusion_matrix", "errors", "dataset_stats", "lr_find") with plain values.
NumPy arrays among them travel as temporary .npy files beside the output (never as JSON lists
of pixels), removed once answered. Whenever the helper cannot answer, `draw` returns False and
the command draws the plot itself with the same function and values, so a plot is never lost
and its errors (a full disk) are the command's own. No helper is started where matplotlib is
already imported (the plot costs no import there).

The service is named, not imported: it draws with the commands' own drawing functions, which
live above this floor.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torchkit.core.io.output_paths import remove_tree
from torchkit.core.io.special_files import is_special_file
from torchkit.core.io.temporaries import temporary_affixes
from torchkit.core.runtime.helper_process import HelperProcess

SERVICE = "torchkit.core.plotting"
# Whether plots go to a helper at all; a benchmark sets it False to time drawing in the process.
# (Not an environment switch: there is no reason for a user to turn it off.)
IN_HELPER = True
ARRAY_KEY = "npy"  # a value {"npy": PATH} in a request: the array saved at PATH


class PlotHelper:
    """A started helper that draws plots (see the module's doc)."""

    def __init__(self, helper: HelperProcess) -> None:
        self.helper = helper

    @property
    def process(self):
        return self.helper.process

    @property
    def answered(self) -> bool:
        """Whether the helper has drawn anything."""
        return self.helper.answered

    @classmethod
    def start(cls) -> Any:
        """A started helper, or None where none is wanted (matplotlib is imported already)
        or it cannot start."""
        return cls.spawn() if wanted() else None

    @classmethod
    def sharing(cls, helper: HelperProcess | None) -> PlotHelper | None:
        """The plotting side of a helper started for several services, this one among them
        (eval's scorer: one process imports scikit-learn and matplotlib); else None."""
        if SERVICE not in getattr(helper, "services", ()):
            return None
        return cls(helper)

    @classmethod
    def spawn(cls) -> Any:
        """A started helper, or None where it cannot start."""
        helper = HelperProcess.spawn(SERVICE)
        return None if helper is None else cls(helper)

    def draw(self, kind: str, path: str | os.PathLike, **values: Any) -> bool:
        """Whether the helper drew the plot `kind` of `values` at `path` (False: the caller
        draws it). A FIFO or /dev/stdout is left to the caller: the helper's own stdout is its
        answer pipe."""
        if self.helper.process is None or is_special_file(path):
            return False
        # Absolute: the helper keeps the working directory it was started in.
        target = os.path.abspath(path)
        saved: list[str] = []
        try:
            try:
                request_values = {
                    name: _saved_array(value, target, saved) for name, value in values.items()
                }
            except OSError:  # no room for the array: the caller draws, and reports its error
                return False
            request = {"kind": kind, "path": target, "values": request_values}
            return self.helper.call(request, SERVICE) == "ok"
        finally:
            for name in saved:
                remove_tree(Path(name))

    def close(self) -> None:
        self.helper.close()

    def forget(self) -> None:
        self.helper.forget()


def _saved_array(value: Any, target: str, saved: list[str]) -> Any:
    """`value`, or for a NumPy array {"npy": the temporary file beside `target` it is saved in}."""
    if type(value).__module__ != "numpy" or not hasattr(value, "dtype"):
        return value
    import numpy as np

    folder, name = os.path.split(target)
    prefix, suffix = temporary_affixes(Path(name).stem, ".npy")
    fd, array_path = tempfile.mkstemp(suffix, prefix, dir=folder)
    saved.append(array_path)
    with os.fdopen(fd, "wb") as handle:
        np.save(handle, value, allow_pickle=False)
    return {ARRAY_KEY: array_path}


def loaded_values(values: dict[str, Any]) -> dict[str, Any]:
    """The service's side of `_saved_array`: the arrays read back."""
    import numpy as np

    return {
        name: np.load(value[ARRAY_KEY], allow_pickle=False)
        if isinstance(value, dict) and set(value) == {ARRAY_KEY}
        else value
        for name, value in values.items()
    }


def wanted() -> bool:
    """Whether a plotting helper is worth starting: not where matplotlib is imported already
    (drawing costs no import there)."""
    return IN_HELPER and "matplotlib.figure" not in sys.modules


def start_plot_helper() -> PlotHelper | None:
    """`PlotHelper.start()`, looked up at each `plot_helper` call: a benchmark's baseline
    replaces it to draw every plot in the process."""
    return PlotHelper.start()


@contextlib.contextmanager
def plot_helper(wanted: bool = True) -> Iterator[PlotHelper | None]:
    """A started helper (None when not `wanted` or none starts), closed when the block ends:
    what eval --out and dataset-stats --plot draw with."""
    helper = start_plot_helper() if wanted else None
    try:
        yield helper
    finally:
        if helper is not None:
            helper.close()
