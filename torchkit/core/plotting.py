"""The plotting service a helper process runs (`core.runtime.plot_helper` is the commands'
side): matplotlib imported while the command starts, then one plot drawn per request with the
command's own drawing function, so that the helper's file and the command's are the same.

No module imports this one: the helper names it (`plot_helper.SERVICE`), and it imports the
drawing functions of the commands above the floors only when a request of their kind comes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def prepare() -> None:
    """The helper's import: matplotlib's figure machinery (about a second)."""
    from torchkit.core.train.outputs import import_plotting

    import_plotting()


def _drawer(kind: str) -> Callable[..., Any]:
    """The function that draws a plot of `kind`: called as `drawer(path, **values)`."""
    if kind == "curves":
        from torchkit.core.train.outputs import write_curves_png

        return write_curves_png
    if kind == "lr_find":
        from torchkit.core.train.lr_find import draw_lr_find

        return draw_lr_find
    if kind == "confusion_matrix":
        from torchkit.core.evaluate.reports import draw_confusion_matrix

        return draw_confusion_matrix
    if kind == "errors":
        from torchkit.core.evaluate.reports import draw_errors

        return draw_errors
    if kind == "dataset_stats":
        from torchkit.core.stats.plot import draw_dataset_stats

        return draw_dataset_stats
    raise ValueError(f"no plot of kind {kind!r}")


def answer(request: dict[str, Any]) -> str:
    """Draw one plot: {"kind": KIND, "path": PATH, "values": {NAME: VALUE}}."""
    from pathlib import Path

    from torchkit.core.runtime.plot_helper import loaded_values

    _drawer(request["kind"])(Path(request["path"]), **loaded_values(request["values"]))
    return "ok"
