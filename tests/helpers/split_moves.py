"""A `split --mode move` stopped part-way, as a Ctrl-C (or the power going out) stops it: the
state every test of finishing, refusing or reading around a half-done move starts from."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchkit.core.split import files as split_files
from torchkit.core.split import split_dataset


def stop_move_after(files: int, monkeypatch, root: Path, out: Path, **options) -> None:
    """`split_dataset(root, out, mode="move", **options)` ended by a KeyboardInterrupt once
    `files` files have moved; `move_file` is put back afterwards."""
    move_file, moved = split_files.move_file, []

    def stopping(source, dest, *args, **kwargs):
        if len(moved) == files:
            raise KeyboardInterrupt
        move_file(source, dest, *args, **kwargs)
        moved.append(source)

    with monkeypatch.context() as patched:
        patched.setattr(split_files, "move_file", stopping)
        with pytest.raises(KeyboardInterrupt):
            split_dataset(root, out, mode="move", **options)
