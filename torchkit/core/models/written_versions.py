"""The version a torchkit checkpoint or exported file records of its own format, checked alike
for both: one no torchkit writes is damage, and a newer one than this torchkit reads is refused
before any output (its fields may mean other things: read anyway, the model could be fed or
labelled wrongly without a word)."""

from __future__ import annotations

from typing import Any

from torchkit.core.io.errors import TorchkitError


def check_written_version(
    version: Any,
    written_by: Any,
    newest: int,
    *,
    where: str,
    field: str,
    kind: str,
    error: type[TorchkitError],
) -> None:
    """`error` where `version` (the file's `field`, at `where`) is no whole number from 1, or
    is newer than `newest`, the newest this torchkit reads; `written_by`: the torchkit version
    the file names, if any. `kind` names the versions in the message ("checkpoint format")."""
    from torchkit import __version__

    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise error(
            f"{where} has {field} {version!r}, which no torchkit writes",
            "the file is damaged or was not written by torchkit",
        )
    if version > newest:
        by = f"torchkit {written_by}" if isinstance(written_by, str) else "a newer torchkit"
        plural = kind.rsplit(" ", 1)[-1] + "s"
        raise error(
            f"{where} was written by {by} ({kind} {version}); this torchkit ({__version__}) "
            f"reads {plural} up to {newest}",
            "upgrade torchkit to read it",
        )
