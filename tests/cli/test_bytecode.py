"""torchkit caches bytecode inside its environment even under PYTHONDONTWRITEBYTECODE, and writes
no __pycache__ folder anywhere else (the user's model code included)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torchkit import bytecode

# Whether torchkit.cli called keep_bytecode_cache before it imported typer, and the prefix and
# flag it left: printed at typer's import, the process then ended (the rest of the CLI's modules
# read with no cache kept, as under the switch, cost a second of CPU to compile).
SHOW = textwrap.dedent(
    """
    import os, sys

    import torchkit.bytecode

    called, keep = [], torchkit.bytecode.keep_bytecode_cache


    def counted():
        called.append(True)
        return keep()


    class _AtTyper:
        def find_spec(self, name, path=None, target=None):
            if name == "typer":
                print(bool(called), sys.pycache_prefix, sys.dont_write_bytecode, flush=True)
                os._exit(0)


    torchkit.bytecode.keep_bytecode_cache = counted
    sys.meta_path.insert(0, _AtTyper())
    import torchkit.cli
    """
)


def _python(*args: str, env: dict, cwd=None) -> subprocess.CompletedProcess:
    base = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPYCACHEPREFIX", bytecode.SWITCH)
    }
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env={**base, **env},
        cwd=cwd,
        timeout=300,
    )


def _skip_where_torch_was_compiled_beside_its_sources() -> None:
    # A Python run without PYTHONDONTWRITEBYTECODE (or an installer that compiles) leaves
    # torch's bytecode beside its sources; torchkit then rightly leaves the cache alone, which
    # test_an_environment_the_installer_compiled_is_read_as_it_is checks.
    prefix, sys.pycache_prefix = sys.pycache_prefix, None  # look beside the sources only
    try:
        compiled = bytecode.installer_compiled("torch")
    finally:
        sys.pycache_prefix = prefix
    if compiled:
        pytest.skip("torch has bytecode beside its sources in this environment")


def test_cli_caches_bytecode_in_the_environment_not_beside_user_code(tmp_path):
    """Under PYTHONDONTWRITEBYTECODE alone the CLI sets the cache up (the user's module, imported
    by the command, says how it found bytecode set), torch's and the user's code land in it."""
    _skip_where_torch_was_compiled_beside_its_sources()
    (tmp_path / "tinynet.py").write_text(
        textwrap.dedent(
            """
            import sys

            import torch

            print("bytecode:", sys.pycache_prefix, sys.dont_write_bytecode, file=sys.stderr)

            def build(num_classes=3):
                return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, num_classes))
            """
        )
    )
    done = _python(
        "-m",
        "torchkit",
        "summary",
        "tinynet:build",
        "--params-only",  # the model built, no forward pass nor FLOP count: not the subject
        "--format",
        "json",
        env={"PYTHONDONTWRITEBYTECODE": "1"},
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert not list(tmp_path.rglob("__pycache__")) and not list(tmp_path.rglob("*.pyc"))
    cache = os.path.join(sys.prefix, bytecode.CACHE_FOLDER)
    assert f"bytecode: {cache} False" in done.stderr.splitlines(), done.stderr
    mirrored = (
        cache + os.path.join(str(tmp_path.resolve()), "tinynet.") + sys.implementation.cache_tag
    )
    assert os.path.isfile(mirrored + ".pyc")
    torch_pyc = cache + os.path.dirname(__import__("torch").__file__)
    assert os.path.isdir(torch_pyc)


def _cache_but_torch(folder: Path) -> Path:
    """`folder` made a pycache prefix holding this environment's cache (links into it) without
    torch's part: its bytecode is read, and torch is not found compiled in it (which would
    leave any prefix alone, decided or not)."""
    cache = Path(sys.prefix, bytecode.CACHE_FOLDER)
    torch_folder = Path(importlib.util.find_spec("torch").origin).parent
    mirror = folder
    for part in torch_folder.parts[1:]:  # the cache mirrors absolute source paths
        mirror.mkdir()
        for entry in cache.iterdir() if cache.is_dir() else ():
            if entry.name != part:
                (mirror / entry.name).symlink_to(entry)
        mirror, cache = mirror / part, cache / part
    return folder


# (PYTHONDONTWRITEBYTECODE alone: the cache, as the test above finds it.)
@pytest.mark.parametrize("decided_by", ["switch off", "own prefix"])
def test_the_cache_is_only_set_up_where_nothing_else_decides(decided_by, tmp_path):
    env = {"PYTHONDONTWRITEBYTECODE": "1"}
    if decided_by == "switch off":
        env[bytecode.SWITCH], expected = "0", "True None True"
    else:
        # The user's own prefix, one with the bytecode SHOW imports (an empty one, never
        # written under PYTHONDONTWRITEBYTECODE, had it compiled: the standard library's too).
        own = _cache_but_torch(tmp_path / "own")
        env["PYTHONPYCACHEPREFIX"], expected = str(own), f"True {own} True"
    done = _python("-c", SHOW, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected


def test_nothing_changes_outside_a_writable_virtual_environment(monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.delenv(bytecode.SWITCH, raising=False)
    monkeypatch.setattr(sys, "prefix", sys.base_prefix)
    assert bytecode.keep_bytecode_cache() is None
    assert sys.dont_write_bytecode is True and sys.pycache_prefix is None


def test_an_environment_the_installer_compiled_is_read_as_it_is(monkeypatch, tmp_path):
    """pip (and `uv pip install --compile-bytecode`) write __pycache__ beside the sources; Python
    reads it even under PYTHONDONTWRITEBYTECODE, so a second cache would only cost disk."""
    import py_compile

    package = tmp_path / "compiledpkg"
    package.mkdir()
    (package / "__init__.py").write_text("VALUE = 1\n")
    (tmp_path / "plainpkg").mkdir()
    (tmp_path / "plainpkg" / "__init__.py").write_text("VALUE = 2\n")
    py_compile.compile(str(package / "__init__.py"))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert bytecode.installer_compiled("compiledpkg")
    assert not bytecode.installer_compiled("plainpkg")
    assert not bytecode.installer_compiled("no_such_package_anywhere")
    assert "compiledpkg" not in sys.modules  # found, not imported

    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.delenv(bytecode.SWITCH, raising=False)
    monkeypatch.setattr(bytecode, "installer_compiled", lambda package: package == "torch")
    if sys.prefix == sys.base_prefix or not os.access(sys.prefix, os.W_OK):
        pytest.skip("needs a writable virtual environment")
    assert bytecode.keep_bytecode_cache() is None
    assert sys.dont_write_bytecode is True and sys.pycache_prefix is None


def test_a_full_disk_leaves_no_cut_short_bytecode_to_fail_the_next_start(
    small_tmpfs, tmp_path, monkeypatch
):
    """A .pyc that the disk had room for only part of was renamed into place all the same: every
    later import of that module failed ("EOFError: marshal data too short"), room made or not."""
    import importlib
    import importlib._bootstrap_external as external
    import marshal

    from disks import fill_disk

    name = "torchkit_test_big_module"
    (tmp_path / f"{name}.py").write_text(f"DATA = {bytes(range(256)) * 400!r}\n")  # a 100 KB .pyc
    cache = fill_disk(small_tmpfs(256), leave=32 * 1024)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "pycache_prefix", str(cache / "pyc"))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    monkeypatch.setattr(external, "_write_atomic", external._write_atomic)  # put back after
    monkeypatch.delitem(sys.modules, name, raising=False)
    bytecode.keep_bytecode_cache()  # what every torchkit start calls first
    assert len(importlib.import_module(name).DATA) == 102_400
    cached = importlib.util.cache_from_source(str(tmp_path / f"{name}.py"))
    if os.path.exists(cached):  # none, or a whole one
        with open(cached, "rb") as handle:
            marshal.loads(handle.read()[16:])
    (cache / "filler").unlink()  # room made: the next start imports it
    del sys.modules[name]
    assert len(importlib.import_module(name).DATA) == 102_400
