"""`convert`'s `-o FILE` report: checked against the conversion's source and destination before
any work."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import PurePath

from torchkit.core.io.file_outputs import check_output_file
from torchkit.core.io.overlap import InputPath, check_distinct_outputs, check_not_written_in


def check_report_output(
    output: str | os.PathLike | None,
    force: bool,
    *,
    source: str | os.PathLike,
    destination: str | os.PathLike,
    writes: Callable[[PurePath], bool] | None = None,
    inputs: Iterable[InputPath] = (),
) -> None:
    """Check a `-o FILE` report before any work: it is never the source (nor inside a source
    folder) nor the destination file, and an existing file needs `force`. A report inside an
    existing destination folder is fine (`convert tensor a.png . --to npy -o report.json`).
    `-` (stdout) and special files (FIFOs, /dev/stdout) are written into, so they pass.
    `writes(path inside the destination folder)`: whether the conversion writes that file
    there (the report may not be one). `inputs`: what else the source names (the images of a
    CSV index, the shards of a pattern), which the report may not be nor lie inside either."""
    if output is None or os.fspath(output) == "-":
        return
    checked = [InputPath.of(source, "source"), *inputs]
    if not os.path.isdir(destination):
        checked.append(InputPath.of(destination, "destination"))
    check_output_file(output, force, checked, what="report")
    check_distinct_outputs((destination, "destination"), (output, "report"))  # one FIFO, stdout
    if writes is not None:
        check_not_written_in(output, destination, writes, "destination")
