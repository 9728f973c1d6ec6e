"""summary's FLOP count imports torch.utils.flop_counter without triton
(torchkit.core.summary.flop_counter_import). This process has loaded both: each test takes them
out of sys.modules for its own while (monkeypatch puts them back), so that flop_counter's module
runs again as in a process that had loaded neither."""

from __future__ import annotations

import builtins
import importlib
import importlib.util
import sys

import pytest
import torch

from torchkit.core.summary import flop_counter_import, summarize

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton is not installed: nothing to save"
)


def _unload_flop_counter_and_triton(monkeypatch) -> dict[str, object]:
    """flop_counter and every triton module out of sys.modules; the triton ones, by name."""
    monkeypatch.delitem(sys.modules, "torch.utils.flop_counter", raising=False)
    triton_modules = {
        name: module
        for name, module in sys.modules.items()
        if name == "triton" or name.startswith("triton.")
    }
    for name in triton_modules:
        monkeypatch.delitem(sys.modules, name)
    return triton_modules


def test_summary_counts_flops_without_importing_triton(monkeypatch):
    import_hook = builtins.__import__
    _unload_flop_counter_and_triton(monkeypatch)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(16, 2)
    )
    summary = summarize(model, [(1, 3, 4, 4)])
    assert summary.flops == 2 * (2 * 2 * 4 * 3 * 3 * 3 + 16 * 2)
    assert [name for name in sys.modules if name.split(".")[0] == "triton"] == []
    assert "torch.utils.flop_counter" in sys.modules
    assert builtins.__import__ is import_hook  # the hook is gone with the import


def test_the_stand_in_jit_function_answers_as_triton_s_own(monkeypatch):
    """No object is a JITFunction while triton is not loaded; once it is, triton's are."""
    importlib.import_module("triton.runtime.jit")  # the suite's workers have it
    triton_modules = _unload_flop_counter_and_triton(monkeypatch)
    flop_counter = flop_counter_import.import_flop_counter()
    stand_in = flop_counter._JITFunction
    assert stand_in is flop_counter_import.JITFunction
    assert not isinstance(None, stand_in) and not isinstance(object(), stand_in)
    with pytest.raises(ValueError, match="JitFunction"):
        flop_counter.register_flop_formula(object())(lambda *args, **kwargs: 0)

    sys.modules.update(triton_modules)  # triton loaded later (monkeypatch takes these out)
    real = sys.modules["triton.runtime.jit"].JITFunction
    assert real is not stand_in and sys.modules["triton.runtime"].JITFunction is real
    assert isinstance(object.__new__(real), stand_in)
    assert issubclass(real, stand_in) and not issubclass(int, stand_in)


def test_other_imports_of_triton_get_the_real_module_while_the_hook_is_in_place():
    triton_jit = importlib.import_module("triton.runtime.jit")  # the suite's workers have it
    flop_counter_import._install()
    try:
        assert builtins.__import__("triton.runtime.jit", globals(), None, ["JITFunction"]) is (
            triton_jit
        )
        assert "triton.runtime.jit" in sys.modules and sys.modules["triton.runtime.jit"] is (
            triton_jit
        )
    finally:
        flop_counter_import._uninstall()
