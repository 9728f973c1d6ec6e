"""The train tests' ranks (gloo_ranks.py) forked from one Python that has imported torch
(preloaded_ranks.py) rather than each importing it afresh: about 2.5 s of CPU a rank, 20 ranks."""

from __future__ import annotations

import gloo_ranks
import pytest
from preloaded_ranks import preloaded_servers, start_preloaded_process


@pytest.fixture(scope="session")
def _rank_server():
    with preloaded_servers() as servers:
        yield servers


@pytest.fixture(scope="module", autouse=True)
def ranks_forked_from_preloaded_torch(_rank_server):
    """Every rank a module's tests start through gloo_ranks (the real torchrun launches of
    test_train_ddp.py start their own)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gloo_ranks, "start_torchkit_process", start_preloaded_process)
        yield
