"""convert-syncbn of a pickled torch.fx model (torchvision's `create_feature_extractor`) was
refused as holding BatchNorm layers it cannot reach (`eval_graph._owning_module.1`): a graph
the model keeps for its other mode still names the module it was traced in, which holds the
same layers. A graph names layers by their path in the module that runs it, and that module
becomes its owner when it takes the graph (`.eval()`): the model converts, in both modes."""

from __future__ import annotations

import torch
from processes import run_torchkit_in_process
from torch import nn


def test_a_pickled_feature_extractor_converts_in_both_modes(tmp_path):
    from torchvision.models.feature_extraction import create_feature_extractor

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
    extractor = create_feature_extractor(net, ["2"])
    source, destination = tmp_path / "features.pt", tmp_path / "features-sync.pt"
    torch.save(extractor, source)
    result = run_torchkit_in_process("convert-syncbn", source, destination, "--trust-checkpoint")
    assert result.returncode == 0, result.stderr

    converted = torch.load(destination, weights_only=False)
    images = torch.randn(2, 3, 6, 6)
    expected = extractor.eval()(images)["2"]
    layer = converted.get_submodule("1")
    assert isinstance(layer, nn.SyncBatchNorm)
    calls = []
    layer.register_forward_hook(lambda *_: calls.append(layer.training))
    converted.eval()  # its eval graph: the same numbers as the BatchNorm model's
    assert torch.equal(converted(images)["2"], expected)
    converted.train()  # and back to its train graph
    converted(images)
    assert calls == [False, True]
