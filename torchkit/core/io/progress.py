"""The progress callback every long-running core function accepts: `progress(done, total)`,
called as work completes; the CLI turns it into a progress bar, core never prints."""

from __future__ import annotations

from collections.abc import Callable

Progress = Callable[[int, int], None]  # (items done, items in total)
