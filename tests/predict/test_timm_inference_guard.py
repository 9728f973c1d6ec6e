"""The guard of test_predict_against_timm_inference.py: its tests need timm >= 1.0.31 (an older
timm's library cannot run inference.py as rebuilt there) and skip, naming the version, where the
installed timm is older or missing."""

from __future__ import annotations

import pytest
import test_predict_against_timm_inference as against_timm


@pytest.mark.parametrize(
    ("installed", "reason"),
    [
        ("1.0.30", "needs timm >= 1.0.31 (installed: 1.0.30)"),
        ("0.9.16", "needs timm >= 1.0.31 (installed: 0.9.16)"),
        ("1.0.31rc0", "needs timm >= 1.0.31 (installed: 1.0.31rc0)"),  # before the release
        ("1.0.31", None),
        ("1.0.32.dev0", None),
        ("1.1.0", None),
        (None, "needs timm"),
        ("unknown", "needs timm >= 1.0.31 (installed: unknown, a version not understood)"),
    ],
)
def test_the_skip_reason_names_the_version_needed_and_the_one_installed(
    monkeypatch, installed, reason
):
    asked = []

    def installed_version(*names: str) -> str | None:
        asked.append(names)
        return installed

    monkeypatch.setattr(against_timm, "installed_version", installed_version)
    assert against_timm.timm_skip_reason() == reason
    assert asked == [("timm",)]


def test_the_module_skips_with_that_reason_where_timm_is_too_old():
    """The module's mark is the guard's answer for the timm installed here."""
    mark = against_timm.pytestmark
    assert mark.name == "skipif"
    assert mark.args == (against_timm.SKIP_REASON is not None,)
    assert mark.kwargs["reason"] == (against_timm.SKIP_REASON or "")
    assert against_timm.timm_skip_reason() == against_timm.SKIP_REASON
