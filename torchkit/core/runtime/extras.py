"""The optional parts of torchkit's package (its extras), the one error when one is missing, and
the installed version of a package.

torchkit is installed from its source (a clone or a git URL: the name `torchkit` on the public
package index belongs to another project), so the hint names the clone, never `pip install
torchkit[...]` by name.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from torchkit.core.io.errors import TorchkitError

# extra -> the packages it installs (pyproject.toml's [project.optional-dependencies]).
EXTRAS: dict[str, tuple[str, ...]] = {
    "export": ("onnx", "onnxruntime"),
    "timm": ("timm",),
    "tensorboard": ("tensorboard",),
    "webdataset": ("webdataset",),
    "parquet": ("pyarrow",),
}


class MissingExtraError(TorchkitError):
    """A package of an optional extra is needed and not installed."""


def install_hint(extra: str) -> str:
    """How to add `extra` to an installation from source."""
    return (
        f"install torchkit's {extra} extra: `uv sync --extra {extra}` in a clone, or "
        f"`uv tool install --reinstall 'CLONE[{extra}]'` / `pip install 'CLONE[{extra}]'`; "
        "CLONE is the torchkit folder or git URL"
    )


def import_extra(module: str, extra: str, needed_for: str) -> ModuleType:
    """Import `module` of the optional `extra`, or a one-line error naming the extra."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        missing = (error.name or "").split(".")[0]
        if missing not in {package.split(".")[0] for package in EXTRAS[extra]}:
            raise  # a package of the extra is there but broken: not a missing extra
        raise _missing(missing, extra, needed_for) from error


def require_extra(module: str, extra: str, needed_for: str) -> None:
    """`import_extra`'s error when `module` is not installed, without importing it: for a
    package whose import starts threads, imported later (onnxruntime: after a fork)."""
    import importlib.util

    if importlib.util.find_spec(module) is None:  # None too where sys.modules holds None
        raise _missing(module, extra, needed_for)


def _missing(package: str, extra: str, needed_for: str) -> MissingExtraError:
    return MissingExtraError(
        f"{needed_for} needs the {package} package, which is not installed", install_hint(extra)
    )


def installed_version(*distributions: str) -> str | None:
    """The version of the first of `distributions` that is installed, read from its metadata
    without importing it; None when none is. A broken record (a `.dist-info` without METADATA,
    one that is not UTF-8, an unreadable one) is passed over: a stale record earlier on the path
    neither hides the package installed after it nor ends the command."""
    import importlib.metadata  # here: the commands that import this module rarely need it

    for name in distributions:
        try:
            for distribution in importlib.metadata.distributions(name=name):
                try:
                    version = distribution.version
                except Exception:  # UnicodeDecodeError, OSError, a malformed header
                    continue
                if version:
                    return str(version)
        except Exception:  # an unreadable folder on sys.path
            continue
    return None
