"""convert-syncbn on a pickled dict converts the modules in lists, tuples and dicts inside it
too (`{'model': net, 'list': [bn]}`), where only those under the dict's own keys were and the
others were written back as BatchNorm, silently: each is named by its path (`list.0`), listed
alike without DST, and what the file shared stays shared."""

from __future__ import annotations

import json
from collections import OrderedDict

import torch
from output_checks import error_line
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


class Holder:
    """A plain object holding a layer (pickled by reference to this module)."""

    def __init__(self, layer: nn.Module) -> None:
        self.layer = layer


def test_a_layer_the_conversion_cannot_reach_is_refused_and_nothing_written(tmp_path):
    # Such layers were written back unconverted while the file was reported as converted.
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    with_list = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    with_list.norms = [with_list[1]]  # a plain list beside the registered layers: kept the old
    cases = {
        "set": ({"model": net, "extras": {nn.BatchNorm2d(5)}}, "extras.(in a set)"),
        "object": ({"model": net, "holder": Holder(nn.BatchNorm1d(6))}, "holder.layer"),
        "attribute": (with_list, "norms.0"),
    }
    for name, (saved, path) in cases.items():
        source, destination = tmp_path / f"{name}.pt", tmp_path / f"{name}-sync.pt"
        torch.save(saved, source)
        result = run_torchkit_in_process(
            "convert-syncbn", source, destination, "--trust-checkpoint"
        )
        assert result.returncode == 1, result.stdout
        assert error_line(result.stderr).startswith(
            f"Error: {source} holds BatchNorm layers convert-syncbn cannot reach: {path} ("
        )
        assert not destination.exists()
    # and back: a SyncBatchNorm left behind is refused alike
    source, destination = tmp_path / "synced.pt", tmp_path / "plain.pt"
    torch.save(
        {"model": nn.Sequential(nn.SyncBatchNorm(3)), "x": Holder(nn.SyncBatchNorm(3))}, source
    )
    result = run_torchkit_in_process(
        "convert-syncbn",
        source,
        destination,
        "--trust-checkpoint",
        "--revert",
        "--input-size",
        "3,4,4",
    )
    assert result.returncode == 1
    assert "holds SyncBatchNorm layers convert-syncbn cannot reach: x.layer (" in result.stderr
    assert not destination.exists()


def test_the_listing_names_the_layers_converting_would_refuse(tmp_path):
    """Without DST the layers were listed, and those converting then refused (in a set, a
    plain object, a plain list beside the registered layers) went unsaid: a warning names
    them, by the paths the refusal gives; layers converting reaches give none."""
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    with_list = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    with_list.norms = [with_list[1]]
    reached = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    cases = {
        "set": {"model": net, "extras": {nn.BatchNorm2d(5)}},
        "object": {"model": net, "holder": Holder(nn.Sequential(nn.BatchNorm1d(6)))},
        "attribute": with_list,
        # held in a plain object too, but converted in place as a layer of the model
        "reached": {"model": reached, "holder": Holder(reached), "list": [reached[1]]},
        "revert": {"model": nn.Sequential(nn.SyncBatchNorm(3)), "x": Holder(nn.SyncBatchNorm(3))},
    }
    for name, saved in cases.items():
        source = tmp_path / f"{name}.pt"
        torch.save(saved, source)
        revert = ["--revert"] if name == "revert" else []
        listing = run_torchkit_in_process("convert-syncbn", source, "--trust-checkpoint", *revert)
        assert listing.returncode == 0, listing.stderr
        converting = run_torchkit_in_process(
            "convert-syncbn",
            source,
            tmp_path / f"{name}-out.pt",
            "--trust-checkpoint",
            *([*revert, "-i", "3,4,4"] if revert else []),
        )
        kind = "SyncBatchNorm" if name == "revert" else "BatchNorm"
        if name == "reached":
            assert converting.returncode == 0, converting.stderr
            assert "cannot reach" not in listing.stderr
            continue
        assert converting.returncode == 1, converting.stdout
        refused = error_line(converting.stderr)
        paths = refused.split("cannot reach: ")[1].split(" (")[0]
        assert (
            f"Warning: {source} also holds {kind} layers convert-syncbn cannot reach, not "
            f"listed: {paths} (converting it is refused;"
        ) in " ".join(listing.stderr.split()), (name, listing.stderr)
