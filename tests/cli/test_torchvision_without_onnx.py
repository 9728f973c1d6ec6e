"""torchvision imported without torch.onnx (`torchkit.torchvision_without_onnx`): how the
stand-in answers a name it lacks. That a fresh process imports torchvision without torch.onnx
and registers the symbolics once torch.onnx comes is checked in test_torchvision_without_dynamo,
in a fork of its fresh process (a process of its own cost a torch start-up)."""

from __future__ import annotations

import sys


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
