"""The suite's DDP ranks (gloo_ranks.py) are forked from a Python that imported torch
(preloaded_processes.py) unless their environment differs from that Python's in what torch may
read as it is imported: then they get a server of their own (or, the first time, start fresh)."""

from __future__ import annotations

from preloaded_processes import import_environment as server_environment

# What the pytest process and a rank share: the first rank a worker starts sets its server's.
SHARED = {"PATH": "/usr/bin", "OMP_NUM_THREADS": "1", "PYTHONPYCACHEPREFIX": "/tmp/pyc"}


def test_a_later_rank_differing_only_in_what_torch_reads_later_still_forks():
    """inductor adds TORCHINDUCTOR_CACHE_DIR to the test process at its first in-process
    compile: every rank a later test of that worker started (10 of 34 in the DDP modules'
    2-worker run) came fresh."""
    later = {
        **SHARED,
        "TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor_root",
        "TORCHKIT_TEST_SEEN_DIR": "/tmp/seen",
        "RANK": "1",
        "MASTER_PORT": "29500",
        "PYTHONPATH": "/tmp/site",
    }
    assert server_environment(later) == SHARED


def test_a_rank_differing_in_what_torch_reads_at_import_starts_fresh():
    for name, value in (("OMP_NUM_THREADS", "2"), ("TORCH_CPP_LOG_LEVEL", "INFO")):
        assert server_environment({**SHARED, name: value}) != SHARED, name
