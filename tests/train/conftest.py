"""tests/train's runs in this process lay curves.png out but do not rasterise it: matplotlib's
Agg took 0.15-0.2 s of CPU of a tiny run's 0.5 s, and most tests here read everything but the
picture. A module marked `drawn_curves` (the painter's, train_core's, the digits run's) draws
it as torchkit does; processes a test starts always draw it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from run_curves import lay_out_curves_only


@pytest.fixture(scope="module", autouse=True)
def curves_laid_out(request: pytest.FixtureRequest) -> Iterator[None]:
    """Module-scoped, so that a module's own module-scoped runs (set up after this) have it."""
    if request.node.get_closest_marker("drawn_curves"):
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        lay_out_curves_only(patch)
        yield
