"""One rule for every size in bytes (`convert shards --shard-size`, `benchmark --memory-limit`,
TORCHKIT_CACHE_LIMIT): `1GB` is 10^9 bytes, `256M` and `256MiB` 256 x 2^20, `1e9` bytes; the
same spelling is never two sizes in two places."""

from __future__ import annotations

import pytest
from output_checks import error_line
from processes import run_torchkit_in_process

from torchkit.core.benchmark.memory import parse_memory_limit
from torchkit.core.convert.shards import shard_options
from torchkit.core.data.sources.http_shards import cache_limit
from torchkit.core.io.errors import UsageError
from torchkit.core.io.sizes import SIZE_RULE


def _every_reading(text: str, monkeypatch) -> dict[str, int]:
    monkeypatch.setenv("TORCHKIT_CACHE_LIMIT", text)
    return {
        "--shard-size": shard_options(shard_size=text).shard_size,
        "--memory-limit": parse_memory_limit(text).bytes,
        "TORCHKIT_CACHE_LIMIT": cache_limit(),
    }


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("256M", 256 * 2**20),  # --memory-limit read it as 256 x 10^6
        ("256MiB", 256 * 2**20),
        ("1.5GiB", 3 * 2**29),
        ("1.5g", 3 * 2**29),  # --memory-limit read it as 1.5 x 10^9
        ("2Gi", 2 * 2**30),  # --shard-size refused it
        ("1GB", 10**9),
        ("1.5kb", 1500),
        ("1e9", 10**9),  # --shard-size refused it
        ("2.5E3 MB", 2500 * 10**6),
        ("4096", 4096),
    ],
)
def test_every_size_option_reads_a_spelling_as_the_same_bytes(text, size, monkeypatch):
    readings = _every_reading(text, monkeypatch)
    assert readings == dict.fromkeys(readings, size)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("lots", "is not a size"),
        ("5XB", "is not a size"),
        ("-1GB", "is not a size"),
        ("\u0663GB", "is not a size"),  # an Arabic-Indic 3: digits are 0-9
        ("1e12345", "is not a size"),
        ("0.5", "is less than a byte"),
        ("1e-3", "is less than a byte"),
        ("8EiB", "is not a size"),
        ("1e400", "is more than 8 EiB"),
        ("9" * 4000, "is more than 8 EiB"),
    ],
)
def test_every_size_option_refuses_a_spelling_alike(text, message, monkeypatch):
    monkeypatch.setenv("TORCHKIT_CACHE_LIMIT", text)
    readers = {
        "--shard-size": lambda: shard_options(shard_size=text),
        "--memory-limit": lambda: parse_memory_limit(text),
        "TORCHKIT_CACHE_LIMIT": cache_limit,
    }
    for what, read in readers.items():
        with pytest.raises(UsageError) as refused:
            read()
        assert refused.value.message.startswith(what) and message in refused.value.message


def test_every_size_option_states_the_rule_in_its_help(_torchkit_command):
    commands = _torchkit_command.commands
    helps = {
        option: next(p.help for p in command.params if option in getattr(p, "opts", ()))
        for command, option in [
            (commands["convert"].commands["shards"], "--shard-size"),
            (commands["benchmark"], "--memory-limit"),
        ]
    }
    assert all(SIZE_RULE in text for text in helps.values()), helps


def test_a_memory_limit_that_is_no_size_is_one_usage_error_naming_the_percentage():
    result = run_torchkit_in_process(
        "benchmark", "convnet", "--find-batch-size", "--memory-limit", "256 Mbytes"
    )
    assert result.returncode == 2
    line = error_line(result.stderr)
    assert "--memory-limit '256 Mbytes' is not a size" in line
    assert "(e.g. 1GB, 500MB, 256MiB or 256M, or a number of bytes" in line
    assert "or a percentage such as 50%" in line
