"""A signal placed exactly: raised as a chosen function is entered, where Python runs a pending
handler (at the start of a call), so a test can stop a command at the one step it is about."""

from __future__ import annotations

import signal
from collections.abc import Callable


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
