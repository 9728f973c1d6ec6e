"""extract-features runs stopped part-way, as a Ctrl-C leaves them: what `--resume` picks up."""

from __future__ import annotations

import pytest

from torchkit.core.features import FeatureRequest, extract_features


class Stop(Exception):
    pass


def extract_stopped_after_one_batch(request: FeatureRequest) -> None:
    """Run `request` and stop it once its first batch is recorded (the `.partial` folder holds
    that batch's rows and a progress record)."""
    calls = []

    def stop_after_one_batch(done: int, total: int) -> None:
        calls.append(done)
        if len(calls) == 2:  # the initial call, then one batch
            raise Stop

    with pytest.raises(Stop):
        extract_features(request, progress=stop_after_one_batch)
