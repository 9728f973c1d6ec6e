"""torchvision imported without torch.onnx (`torchkit.torchvision_without_onnx`): in a fresh
process, since this one has loaded both."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from processes import child_environment
from suite_paths import REPO

# torchkit's CLI module installs the hooks as `python -m torchkit` does; then what train's
# transforms and extract-features' tracer import. torchvision's ONNX symbolics are registered
# as soon as torch.onnx is imported (as export imports it: `torch.onnx.export` through torch's
# lazy attribute), and a name the stand-in lacks imports the real module.
SCRIPT = """
    import json, sys
    import torchkit.cli
    import torch
    from torchkit import torchvision_without_onnx as light

    def registered():
        try:
            from torch.onnx._internal.torchscript_exporter import registration
        except ImportError:  # older torch
            from torch.onnx._internal import registration
        return [registration.registry.is_registered_op(name, opset) for name, opset in
                (("torchvision::nms", 11), ("torchvision::roi_align", 16),
                 ("torchvision::roi_pool", 11))]

    import torchvision.transforms.v2, torchvision.models.feature_extraction
    report = {"onnx after torchvision": "torch.onnx" in sys.modules,
              "owed": light.registration_owed(),
              "stand-in left": "torchvision.ops._register_onnx_ops" in sys.modules}
    torch.onnx.export  # noqa: B018 (imports torch.onnx)
    report.update({"registered": registered(), "owed after": light.registration_owed(),
                   "asked": light.missing})
    print(json.dumps(report))
    """


def test_torchvision_is_imported_without_torch_onnx_and_registers_its_symbolics_with_it():
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT)],
        capture_output=True, text=True, env=child_environment(None), cwd=REPO, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "onnx after torchvision": False,  # 0.3 s of CPU it took
        "owed": True,
        "stand-in left": False,
        "registered": [True, True, True],
        "owed after": False,
        "asked": [],
    }


def test_a_name_the_stand_in_lacks_comes_from_the_real_module_registered():
    """Without torchkit's hook in the way of the suite's process (torch.onnx is loaded here):
    the stand-in, placed by hand, answers another name from the real module, which registers
    the symbolics owed."""
    from torchkit import torchvision_without_onnx as light

    light._place()
    try:
        light._owed.set()
        stand_in = sys.modules[light.REGISTER]
        assert type(stand_in).__name__ == "StandInModule"
        helper = stand_in.symbolic_multi_label_nms
        assert (
            callable(helper) and light.missing[-1] == f"{light.REGISTER}.symbolic_multi_label_nms"
        )
        assert type(sys.modules[light.REGISTER]).__name__ == "module"
        assert not light.registration_owed()
    finally:
        light._remove()
        light._owed.clear()
        del light.missing[:]
