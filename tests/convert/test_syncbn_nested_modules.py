"""convert-syncbn on a pickled dict converts the modules in lists, tuples and dicts inside it
too (`{'model': net, 'list': [bn]}`), where only those under the dict's own keys were and the
others were written back as BatchNorm, silently: each is named by its path (`list.0`), listed
alike without DST, and what the file shared stays shared."""

from __future__ import annotations

import json
from collections import OrderedDict

import torch
from processes import run_torchkit_in_process
from torch import nn


def test_modules_inside_containers_of_a_pickled_dict_are_converted(tmp_path):
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    shared, heads = nn.BatchNorm1d(5), [nn.BatchNorm2d(2)]
    heads.append(shared)
    source, synced = tmp_path / "dict.pt", tmp_path / "sync.pt"
    saved = {
        "model": net,
        "list": heads,
        "again": heads,  # the same list twice
        "nested": OrderedDict(pair=(shared, 3)),
        "inner": [net[1]],  # a layer of the model, held beside it too
        "epoch": 3,
    }
    torch.save(saved, source)
    args = ["--trust-checkpoint", "--format", "json"]
    report = run_torchkit_in_process("convert-syncbn", source, *args)
    converted = run_torchkit_in_process("convert-syncbn", source, synced, *args)
    assert report.returncode == 0 and converted.returncode == 0, report.stderr + converted.stderr
    listed = [row["name"] for row in json.loads(report.stdout)["layers"]]
    assert listed == [row["name"] for row in json.loads(converted.stdout)["layers"]]
    assert listed == ["model.1", "list.0", "list.1"]

    written = torch.load(synced, weights_only=False)
    assert written["epoch"] == 3 and written["list"] is written["again"]
    assert [type(layer) for layer in written["list"]] == [nn.SyncBatchNorm] * 2
    assert type(written["nested"]) is OrderedDict and written["nested"]["pair"][1] == 3
    assert written["nested"]["pair"][0] is written["list"][1]
    assert isinstance(written["model"][1], nn.SyncBatchNorm)
    assert written["inner"][0] is written["model"][1]
