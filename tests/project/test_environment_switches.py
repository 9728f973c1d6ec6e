"""The environment variables torchkit reads: only documented ones (issue #49). An experiment's
switch becomes an option or goes with its code path; the product keeps no hidden branches."""

from __future__ import annotations

import re
from pathlib import Path

import torchkit

# TORCHKIT_DEBUG: tracebacks (README, "Errors"); _TORCHKIT_COMPLETE: shell completion (click's
# protocol); TORCHKIT_BYTECODE_CACHE=0: no bytecode cache written in the environment (README,
# "Install"); TORCHKIT_CACHE, TORCHKIT_CACHE_LIMIT and TORCHKIT_HTTP_TIMEOUT: where shards read
# over HTTP are cached, how much of the cache streamed shards may take, and how long a socket
# operation may take (core/data/sources/http_shards.py).
DOCUMENTED = {
    "TORCHKIT_DEBUG",
    "_TORCHKIT_COMPLETE",
    "TORCHKIT_BYTECODE_CACHE",
    "TORCHKIT_CACHE",
    "TORCHKIT_CACHE_LIMIT",
    "TORCHKIT_HTTP_TIMEOUT",
}
NAME = re.compile(r"(?<![A-Za-z0-9])_?TORCHKIT_[A-Z0-9_]*[A-Z0-9]")


def test_the_package_reads_only_documented_environment_variables():
    package = Path(torchkit.__file__).parent
    found = {}
    for source in sorted(package.rglob("*.py")):
        for name in NAME.findall(source.read_text(encoding="utf-8")):
            found.setdefault(name, str(source.relative_to(package)))
    undocumented = {name: where for name, where in found.items() if name not in DOCUMENTED}
    assert not undocumented, undocumented
