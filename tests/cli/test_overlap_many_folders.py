"""The output-overlap check over many input folders (a CSV index of `ID/image.png` rows names a
folder per image): each folder on the way is looked at once per check, not once per input that
lies under it, and links among the inputs are still followed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from torchkit.core.io.overlap import InputPath, OutputOverlapError, check_overlap

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the posix path of the check")


def test_the_folders_above_many_inputs_are_looked_at_once(tmp_path, monkeypatch):
    """300 input folders, each an `ID/` folder in one data folder: one lstat for each input's
    own name (is it a link?) and a stat for each folder, instead of one for every folder from
    `/` down to each input (realpath's), and the folders above walked once."""
    data = tmp_path / "data" / "images"
    inputs = []
    for i in range(300):
        (data / f"{i:04d}").mkdir(parents=True)
        inputs.append(InputPath(data / f"{i:04d}", "image folder"))
    depth = len(data.parts)
    calls = {"lstat": 0, "stat": 0}
    real_lstat, real_stat = os.lstat, os.stat

    def lstat(path, *args, **kwargs):
        calls["lstat"] += 1
        return real_lstat(path, *args, **kwargs)

    def stat(path, *args, **kwargs):
        calls["stat"] += 1
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "lstat", lstat)
    monkeypatch.setattr(os, "stat", stat)
    check_overlap(tmp_path / "out", "--out", inputs)
    assert calls["lstat"] <= len(inputs) + 4 * depth  # before: about 300 x depth
    assert calls["stat"] <= len(inputs) + 4 * depth


def test_links_among_many_inputs_are_still_followed(tmp_path):
    """An input folder that is a link to the output's folder, and one reached through a linked
    folder, among ordinary ones: both are refused as before."""
    data = tmp_path / "data"
    for i in range(40):
        (data / f"{i:03d}").mkdir(parents=True)
    out_parent = tmp_path / "runs"
    out_parent.mkdir()
    (data / "linked").symlink_to(out_parent)
    plain = [InputPath(data / f"{i:03d}", "image folder") for i in range(40)]
    linked = InputPath(data / "linked", "image folder")
    with pytest.raises(OutputOverlapError, match="lies inside the image folder .*linked"):
        check_overlap(out_parent / "out", "--out", [*plain, linked])
    (tmp_path / "via").symlink_to(tmp_path)  # a linked folder on the way to the output
    behind = InputPath(tmp_path / "via" / "runs" / "out" / "x", "image folder")
    with pytest.raises(OutputOverlapError, match="contains the image folder"):
        check_overlap(out_parent / "out", "--out", [*plain, behind])
    check_overlap(tmp_path / "elsewhere", "--out", [*plain, behind])  # no overlap: no error


def test_an_input_named_with_dot_dot_is_resolved_as_realpath_does(tmp_path):
    """`link/..` is the folder above the link's target, not the link's own folder."""
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "to_b").symlink_to(tmp_path / "a" / "b")
    through = InputPath(Path(f"{tmp_path}/c/to_b/.."), "image folder")  # is tmp_path/a
    with pytest.raises(OutputOverlapError, match="lies inside"):
        check_overlap(tmp_path / "a" / "out", "--out", [through])
    check_overlap(tmp_path / "c" / "out", "--out", [through])


def test_a_folder_deeper_than_pythons_recursion_limit_is_checked(tmp_path):
    """An output or input 1,500 folders deep (`d/d/.../d`, 3,000 characters: a path Linux
    takes) is checked like any other: the walk up its folders is a loop (it was a recursion
    a folder, 'Error: RecursionError: maximum recursion depth exceeded' from split --out)."""
    deep = Path(tmp_path, *["d"] * 1500)
    data = tmp_path / "data"
    data.mkdir()
    check_overlap(deep / "out", "--out", [InputPath(data, "data")])
    check_overlap(tmp_path / "out", "--out", [InputPath(deep, "data")])
    (tmp_path / "d").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "d")  # by identity too
    for name in ("d", "alias"):
        with pytest.raises(OutputOverlapError, match=f"lies inside the data .*{name}"):
            check_overlap(deep / "out", "--out", [InputPath(tmp_path / name, "data")])
    with pytest.raises(OutputOverlapError, match="contains the data"):
        check_overlap(tmp_path / "d", "--out", [InputPath(deep, "data")])


@pytest.mark.parametrize(
    ("out_name", "input_name"),
    [
        ("runs/out", "runs/out/link"),
        ("//TMP/runs/out", "runs/out/link"),  # a leading `//` is `/` on Linux
        ("runs/out", "//TMP/runs/out/link"),
        ("to_runs/out", "runs/out/link"),  # a link to the output's folder on the way
        ("runs/out", "to_runs/out/link"),
        ("runs/./out/", "runs/out/./link/"),
        ("runs/x/../out", "to_runs/out/link"),
        ("runs/out", "runs/out/inside_link/data"),  # through a link inside OUT
    ],
)
def test_an_input_named_through_the_output_is_refused_however_spelled(
    tmp_path, out_name, input_name
):
    """`--data OUT/link` (a link in OUT to data elsewhere) is gone from its name once OUT is
    replaced: refused however either is spelled. A leading `//` and a link to OUT's folder
    passed before (the name was compared as `abspath` spells it)."""
    (tmp_path / "runs" / "out").mkdir(parents=True)
    (tmp_path / "runs" / "x").mkdir()
    (tmp_path / "elsewhere" / "data").mkdir(parents=True)
    (tmp_path / "runs" / "out" / "link").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "runs" / "out" / "inside_link").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "to_runs").symlink_to(tmp_path / "runs")

    def spelled(name: str) -> str:
        return name.replace("//TMP", "/" + str(tmp_path)) if "TMP" in name else f"{tmp_path}/{name}"

    with pytest.raises(OutputOverlapError, match="contains the data"):
        check_overlap(spelled(out_name), "--out", [InputPath.of(spelled(input_name), "data")])
    # the same input beside another output, and the data it links to: no overlap
    check_overlap(tmp_path / "runs" / "x", "--out", [InputPath.of(spelled(input_name), "data")])
    check_overlap(
        spelled(out_name), "--out", [InputPath.of(tmp_path / "elsewhere" / "data", "data")]
    )


def test_absolute_paths_are_checked_from_a_deleted_working_folder(tmp_path, monkeypatch):
    """The working folder deleted under the process (library use: the CLI refuses it first):
    absolute paths need none and are checked as ever; before, os.getcwd's FileNotFoundError
    came out of the check whatever the paths."""
    (tmp_path / "data" / "a").mkdir(parents=True)
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    check_overlap(tmp_path / "out", "--out", [InputPath(tmp_path / "data", "image folder")])
    with pytest.raises(OutputOverlapError, match="contains the folder"):
        check_overlap(tmp_path / "data", "--out", [InputPath(tmp_path / "data" / "a", "folder")])


def test_the_walk_keeps_the_folders_above_the_inputs_not_each_input(tmp_path):
    """What one check keeps of its walk (`_Resolver.walked`) is the folders on the way, not an
    entry per input: 100k `ID/` input folders held 25 MB more at the check's peak (82.5 against
    57.2 MB), the real paths of inputs the check never walks again."""
    from torchkit.core.io.overlap import _Resolver

    data = tmp_path / "data" / "images"
    for i in range(50):
        (data / f"{i:03d}").mkdir(parents=True)
    resolver = _Resolver(None)
    for i in range(50):
        assert resolver.resolve(data / f"{i:03d}") == (data / f"{i:03d}", False)
    assert len(resolver.walked) <= len(data.parts) + 1  # before: 50 more


def test_an_input_named_up_from_a_link_inside_the_output_is_refused(tmp_path):
    """`OUT/link/..` (OUT/link a link to a folder elsewhere) is the folder above the link's
    target, as the kernel resolves it, but its name hangs on OUT/link, which replacing OUT
    takes away: refused, as `OUT/link` is. It passed once the check walked each name from
    `/` (a `..` took the walk out of OUT by the target's path). A `..` up a real folder of
    OUT leaves OUT by name: `OUT/sub/../..` is OUT's folder, which OUT lies inside."""
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (tmp_path / "elsewhere" / "data").mkdir(parents=True)
    (out / "link").symlink_to(tmp_path / "elsewhere" / "data")
    (out / "sub" / "link").symlink_to(tmp_path / "elsewhere" / "data")
    for named in ("out/link/..", "out/sub/link/..", "out/link/../data/..", "out/sub/../link/.."):
        with pytest.raises(OutputOverlapError, match="contains the data"):
            check_overlap(out, "--out", [InputPath.of(f"{tmp_path}/{named}", "data")])
        # the same input beside another output: no overlap
        check_overlap(tmp_path / "other", "--out", [InputPath.of(f"{tmp_path}/{named}", "data")])
    # named up and out of OUT through its own folders: the data beside OUT, no overlap
    (tmp_path / "beside").mkdir()
    for named in ("out/../beside", "out/sub/../../beside"):
        check_overlap(out, "--out", [InputPath.of(f"{tmp_path}/{named}", "data")])


def test_a_place_of_the_output_elsewhere_costs_no_walk_an_input(tmp_path, monkeypatch):
    """Where a bind mount shows the output at another path too (`_mounted_places`), each of
    many inputs is compared with that place as text: the output was resolved again for each
    input (a realpath each: twice the CPU of a check of 100,000 input folders)."""
    from torchkit.core.io import overlap

    out, data = tmp_path / "out", tmp_path / "data"
    out.mkdir()
    inputs = [InputPath(data / f"{i:04d}", "image folder") for i in range(300)]
    place = tmp_path / "elsewhere" / "out"
    monkeypatch.setattr(overlap, "_mounted_places", lambda real, is_dir: [(str(real), True, place)])
    calls = []
    real_path = overlap.real_path
    monkeypatch.setattr(overlap, "real_path", lambda path: calls.append(path) or real_path(path))
    check_overlap(out, "--out", inputs)
    assert len(calls) == 1  # the output's, once
    with pytest.raises(OutputOverlapError, match=f"contains the image folder {place}/x"):
        check_overlap(out, "--out", [*inputs, InputPath(place / "x", "image folder")])
