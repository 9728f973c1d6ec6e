"""The outcome of a run that did the rest of its work and still failed, as `cp -r` exits 1:
inputs it could not read, folders in its source it could not list (`split`, `convert tensor`,
`convert shards`, `video-info`). One wording for each, so that `CMD src out && rm -r src`
never deletes what is in no output, and every command says so alike."""

from __future__ import annotations

from collections.abc import Sequence

from torchkit.core.io.errors import InputError
from torchkit.core.io.wording import counted

# Where inputs failed: each was warned of as it failed
FAILED_HINT = "the warnings above say which and why; --strict stops at the first"


def incomplete_run(
    source: str,
    unlisted_folders: Sequence[str],
    *,
    left_out: str,
    again: str,
    failed: str | None = None,
    failed_hint: str = FAILED_HINT,
) -> InputError | None:
    """The error the run ends in once the rest is done; None where nothing was left out.

    `failed` says what inputs failed ("3 of 10 files could not be converted into DST"), None
    where none did; `unlisted_folders` are the folders in `source` that could not be listed,
    `left_out` what that means for their files ("their files are in no split in OUT") and
    `again` the hint where they are all that failed ("make them readable and split again");
    `failed_hint` the hint where inputs failed (FAILED_HINT: where the warnings name them)."""
    folders = f"{counted(len(unlisted_folders), 'folder')} in {source}"
    if failed:
        listed = f", and {folders} could not be listed" if unlisted_folders else ""
        return InputError(failed + listed, failed_hint)
    if unlisted_folders:
        return InputError(f"{folders} could not be listed: {left_out}", again)
    return None
