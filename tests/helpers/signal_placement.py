"""A signal placed exactly: raised as a chosen function is entered, where Python runs a pending
handler (at the start of a call), so a test can stop a command at the one step it is about."""

from __future__ import annotations

import signal
import textwrap
from collections.abc import Callable
from pathlib import Path


def signalled_on_entry(
    monkeypatch, owner: object, name: str, when: Callable[..., bool] = lambda *a, **k: True
) -> list:
    """Patch `owner.name` to raise SIGTERM (the command's own handler, which raises) as its
    first call that `when` accepts is entered, before its body. The list it returns holds that
    call's arguments."""
    original = getattr(owner, name)
    signalled: list = []

    def on_entry(*args, **kwargs):
        if not signalled and when(*args, **kwargs):
            signalled.append(args)
            assert callable(signal.getsignal(signal.SIGTERM))  # the command's handler: it raises
            signal.raise_signal(signal.SIGTERM)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, on_entry)
    return signalled


def signalled_on_first_import(folder: Path, module: str, *signames: str) -> dict[str, str]:
    """The environment of a torchkit process that sends itself each of `signames` ("SIGTERM"),
    in order, when `module` is first looked for: a sitecustomize.py written to `folder`.
    "torchkit.cli.split", imported with the CLI's commands, comes before a command's handlers
    are set; "numpy", in a `train`, inside `import torch` (from torch._C's C++ set-up)."""
    (folder / "sitecustomize.py").write_text(
        textwrap.dedent(
            f"""
            import os, signal, sys

            class _Sender:
                sent = False

                def find_spec(self, name, path=None, target=None):
                    if name == {module!r} and not self.sent:
                        self.sent = True
                        for signame in {signames!r}:
                            os.kill(os.getpid(), getattr(signal, signame))
                    return None

            sys.meta_path.insert(0, _Sender())
            """
        )
    )
    return {"PYTHONPATH": str(folder)}
