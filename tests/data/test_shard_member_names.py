"""A shard's members are read at the path `tar -x` unpacks them to, as a `.tar` of an image
folder's are: a leading `/` is stripped (`/001.png` is sample 001, its id `s.tar/001.png`), and
a member with a `..` part (`../002.png`, `a/../003.png`), which GNU tar does not unpack
("Member name contains '..'"), is not read, with a warning that counts and names them. Before,
such members were samples whose ids (`s.tar//001.png`, `s.tar/../002.png`) named no file of the
unpacked shard, in every command that lists them. GNU tar is the reference where the machine
has it."""

from __future__ import annotations

import csv
import io
import subprocess
import tarfile
from pathlib import Path

import pytest
from checkpoints import write_convnet_checkpoint
from output_checks import error_line
from parquet_files import png
from processes import run_json, run_torchkit_in_process
from tar_members import has_gnu_tar, opened_with_warnings, tar_of_members

from torchkit.core.data.sources import open_data

SHARD = "s-000000.tar"
MEMBERS = [
    ("000.png", png(0)),
    ("000.cls", b"0"),
    ("/001.png", png(1)),
    ("/001.cls", b"1"),
    ("../002.png", png(2)),
    ("../002.cls", b"1"),
    ("a/../003.png", png(3)),
    ("a/../003.cls", b"0"),
]
IDS = [f"{SHARD}/000.png", f"{SHARD}/001.png"]
WARNING = (
    f"/{SHARD}: 4 sample members with '..' in their path are not read, as tar -x does not unpack "
    f"such members: {SHARD}/../002.png, {SHARD}/../002.cls, {SHARD}/a/../003.png and 1 more"
)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """The shard of MEMBERS and a convnet checkpoint of classes 0, 1."""
    root = tmp_path_factory.mktemp("member-names")
    tar_of_members(root / SHARD, MEMBERS, format=tarfile.GNU_FORMAT)
    write_convnet_checkpoint(root / "model.pt", in_channels=3, image_size=8, classes=["0", "1"])
    return root


def test_a_shard_reads_the_members_tar_unpacks_by_the_paths_it_unpacks_them_to(world, caplog):
    source, warned = opened_with_warnings(world / SHARD, caplog)
    assert source.whole.ids == IDS
    assert [path.read_bytes() for path in source.whole.paths] == [png(0), png(1)]
    assert list(source.whole.labels) == [0, 1]
    assert [w for w in warned if w.endswith(WARNING)] != []
    if has_gnu_tar():  # the reference: what GNU tar unpacks, its samples' images
        unpacked = world / "unpacked"
        unpacked.mkdir(exist_ok=True)
        subprocess.run(["tar", "-xf", world / SHARD, "-C", unpacked], capture_output=True)
        files = sorted(p.name for p in unpacked.iterdir())
        assert files == ["000.cls", "000.png", "001.cls", "001.png"]
        assert [f"{SHARD}/{name}" for name in files if name.endswith(".png")] == IDS


def test_every_command_lists_the_samples_by_their_unpacked_paths(world, tmp_path):
    stats = run_json("dataset-stats", world / SHARD, "--workers", "0")
    assert (stats["images"], stats["duplicate_files"]) == (2, 0)  # was 4 and a label conflict
    model, device = world / "model.pt", ("--device", "cpu", "-j", "0")
    predicted = run_torchkit_in_process("predict", model, world / SHARD, "--format", "csv", *device)
    assert predicted.returncode == 0, predicted.stderr
    assert [row["path"] for row in csv.DictReader(io.StringIO(predicted.stdout))] == IDS
    assert WARNING in predicted.stderr.replace("\n", " ")
    result = run_torchkit_in_process(
        "extract-features", model, world / SHARD, "--out", tmp_path / "feats", *device
    )
    assert result.returncode == 0, result.stderr
    with open(tmp_path / "feats" / "index.csv", newline="") as handle:
        assert [row["path"] for row in csv.DictReader(handle)] == IDS
    result = run_torchkit_in_process(
        "eval", model, "--data", world / SHARD, "--out", tmp_path / "eval", *device
    )
    assert result.returncode == 0, result.stderr
    with open(tmp_path / "eval" / "predictions.csv", newline="") as handle:
        assert [row["path"] for row in csv.DictReader(handle)] == IDS


def test_a_key_with_a_dot_is_cut_at_the_first_dot_as_webdataset_cuts_it(tmp_path):
    """`a.b.png` is sample a's `b.png` (webdataset's grouping, which timm's reader reads): a
    sample of no image, whose error named only `b.cls, b.png`; it says why. A member named
    only `.cls` belongs to no sample, as webdataset groups it with none."""
    from webdataset.tariterators import base_plus_ext

    assert (base_plus_ext("a.b.png"), base_plus_ext(".cls")) == (("a", "b.png"), (None, None))
    members = [("a.b.png", png(0)), ("a.b.cls", b"0"), (".cls", b"1"), ("c.png", png(1))]
    shard = tar_of_members(tmp_path / SHARD, [*members, ("c.cls", b"1")])
    result = run_torchkit_in_process("dataset-stats", shard, "--workers", "0")
    assert result.returncode == 1
    assert error_line(result.stderr) == (
        f"Error: sample a in {SHARD} has no image; it holds b.cls, b.png: a.b.png is sample a's "
        "b.png, no image, as webdataset reads a sample's KEY up to the first dot of a member's "
        "name (name members KEY.EXT with no dot in KEY, as a_b.png for a.b.png, and the label "
        "beside it alike)"
    )
    renamed = [("a_b.png", png(0)), ("a_b.cls", b"0"), *members[2:], ("c.cls", b"1")]
    source = open_data(str(tar_of_members(tmp_path / "r-000000.tar", renamed)))
    assert (source.whole.ids, list(source.whole.labels)) == (
        ["r-000000.tar/a_b.png", "r-000000.tar/c.png"],
        [0, 1],
    )
