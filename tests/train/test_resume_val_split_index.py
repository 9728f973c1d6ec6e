"""`train --resume` of a run that held its validation images out itself (`--val-split`), on its
own images reached another way: a class folder's `ant/ant_0.png` is a CSV index's
`data/ant/ant_0.png` where the index lies beside the folder (either way round, and a root of
`train/` and `test/` alike), as the digests `--resume` compares count them; images the data
lacks are still refused, naming one of them (in-process CliRunner: no process boundary is under
test)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from checkpoints import read_checkpoint
from image_folders import write_image_folder
from processes import run_torchkit_in_process
from resume_runs import copied_project, runs_on_folder_and_index
from test_resume_val_split_moved import (
    COUNTS,
    FIRST,
    MORE,
    error_line,
    held_out_of,
    train,
    warnings_and_errors,
    write_index,
)

Row = tuple[str, ...]


def write_data(data: Path, layout: str) -> Path:
    """Class folders of `COUNTS` images (`flat`), or a root of them in `train/` with a `test/`
    beside it (`train-test`), whose validation images a run holds out of its train split."""
    if layout == "flat":
        return write_image_folder(data, COUNTS, seed=1)
    write_image_folder(data / "train", COUNTS, seed=1)
    write_image_folder(data / "test", {name: 1 for name in COUNTS}, seed=2)
    return data


def folder_rows(data: Path, prefix: str = "") -> list[Row]:
    """A row per image under `data` (its path relative to `data`, after `prefix`; its label;
    its split where `data` is a root of splits), as an index lists them."""
    rows = []
    for image in sorted(path for path in data.rglob("*.png")):
        parts = image.relative_to(data).parts
        split = [parts[0]] if parts[0] in ("train", "test") else []
        rows.append((prefix + "/".join(parts), image.parent.name, *split))
    return rows


@pytest.fixture(scope="module", params=["flat", "train-test"])
def runs(request, tmp_path_factory) -> tuple[Path, Path, Path]:
    """(the data in project/data, a run started on the folder, a run started on the index
    beside it, project/index.csv): one epoch each, 3 of the 12 training images held out for
    validation, which each test copies."""
    root = tmp_path_factory.mktemp(request.param)
    data = write_data(root / "project" / "data", request.param)
    index = write_index(root / "project" / "index.csv", folder_rows(data, "data/"))
    return data, *runs_on_folder_and_index(root, data, index, train, FIRST)


@pytest.fixture
def copied(runs, tmp_path) -> tuple[Path, Path, Path]:
    """A copy of the project (the data, the index beside it) and of both runs."""
    return copied_project(*runs, tmp_path)


def held(run: Path) -> list[str]:
    return read_checkpoint(run / "last.pt")["data"]["held_out"]["val"]


def resumed_silently(run: Path, spec: Path) -> object:
    """`train --resume RUN --data SPEC` to a second epoch, which succeeds without a warning,
    keeps the run's digests (the same samples) and records the held-out images as SPEC names
    them."""
    digests = read_checkpoint(run / "last.pt")["data"]["digests"]
    result = train("--resume", run, "--data", spec, *MORE)
    assert result.exit_code == 0, result.stderr
    assert warnings_and_errors(result) == []
    checkpoint = read_checkpoint(run / "last.pt")
    assert checkpoint["epoch"] == 2
    assert checkpoint["data"]["digests"] == digests
    return result


def test_a_run_on_the_folder_resumes_on_an_index_beside_it(runs, copied):
    """The run held out `ant/ant_2.png`, ...; the index beside the folder lists it as
    `data/ant/ant_2.png` (they were not found: 3 of the 3 images refused). The run's own
    files, where they were: nothing to note (resumed on the data the run trained on, not its
    copy)."""
    data, _, _ = runs
    _, run, _ = copied
    before = held(run)
    result = resumed_silently(run, data.parent / "index.csv")
    assert sorted(held(run)) == sorted(f"data/{path}" for path in before)
    assert "Note: the training run" not in result.stderr


def test_a_run_on_the_index_beside_the_folder_resumes_on_the_folder(copied):
    data, _, run = copied
    before = held(run)
    assert all(path.startswith("data/") for path in before)
    resumed_silently(run, data)
    assert sorted(held(run)) == sorted(path.removeprefix("data/") for path in before)


def test_a_run_on_the_index_beside_resumes_on_an_index_inside_the_folder(copied):
    data, _, run = copied
    inside = write_index(data / "index.csv", folder_rows(data))
    resumed_silently(run, inside)


def test_the_data_moved_and_reached_another_way_is_matched_below_both_folders(runs, copied):
    """The folder's run, resumed on a copy of the project elsewhere through its index: a note
    names the folder the held-out images lay in (the run's data; its train/ where they were
    held out of it) and the one they are matched in."""
    data, _, _ = runs
    copy, run, _ = copied
    result = resumed_silently(run, copy.parent / "index.csv")
    split = "" if (data / "ant").is_dir() else "/train"
    assert (
        f"Note: the training run's val images lay in {data}{split}: its val split is matched "
        f"by their paths below it in {copy}{split}\n"
    ) in result.stderr


def test_eval_of_the_folders_run_on_the_index_beside_scores_its_held_out_images(copied):
    data, run, _ = copied
    scored = run_torchkit_in_process(
        "eval", run / "last.pt", "--data", data.parent / "index.csv", "--split", "val",
        "--device", "cpu", "--workers", "0", "--trust-checkpoint",
    )  # fmt: skip
    assert scored.returncode == 0, scored.stderr
    assert "the val split the training run made: 3 images" in scored.stderr


def test_images_an_index_beside_lacks_are_refused_naming_one_of_them(copied, tmp_path):
    """As many images, one of the held-out ones replaced by another file: refused, counting and
    naming only the image the index lacks (all 3 were counted, one it has named). Other images
    under the class folders' names: all 3 refused."""
    data, run, _ = copied
    lacking = sorted(held(run))[1]
    rows = folder_rows(data, "data/")
    at = next(i for i, row in enumerate(rows) if row[0].endswith("/" + lacking))
    path, *rest = rows[at]
    shutil.copy(data.parent / path, data.parent / path.replace(".png", "-other.png"))
    rows[at] = (path.replace(".png", "-other.png"), *rest)
    index = write_index(data.parent / "index.csv", rows)
    result = train("--resume", run, "--data", index, *MORE)
    assert result.exit_code == 1
    assert error_line(result).startswith(
        f"Error: 1 of the 3 images the training run held out for val are not in {index} (e.g. "
        f"{lacking}) (give the data the run trained on: "
    )
    other = tmp_path / "other"
    write_data(other / "data", "flat" if (data / "ant").is_dir() else "train-test")
    for image in list(other.rglob("*.png")):
        image.rename(image.with_name(f"new-{image.name}"))
    index = write_index(other / "index.csv", folder_rows(other / "data", "data/"))
    result = train("--resume", run, "--data", index, *MORE)
    assert result.exit_code == 1
    assert "3 of the 3 images the training run held out for val are not in" in error_line(result)


def test_one_held_out_image_is_found_below_the_folder_the_index_lists_it_in(tmp_path):
    """Relative paths as absolute ones are: a single held-out image (its folder is its class
    folder) is found in the folder named as that class folder; the images of a run on an index
    of absolute paths through relative paths, and a folder's run's through absolute ones."""
    images = [
        write_image_folder(tmp_path / "data", {name: 1 for name in COUNTS}, seed=3)
        / name
        / f"{name}_0.png"
        for name in COUNTS
    ]
    relative = write_index(
        tmp_path / "index.csv",
        [(str(image.relative_to(tmp_path)), image.parent.name) for image in images],
    )
    assert held_out_of(relative, ["bee/bee_0.png"]) == ["data/bee/bee_0.png"]
    # a name that ends as another's is not it: a path below a folder is cut at a `/`
    assert held_out_of(relative, ["bee/ee_0.png"]) == (
        f"1 of the 1 images the training run held out for val are not in {relative} (e.g. "
        "bee/ee_0.png) (give the data the run trained on: /old)"
    )
    assert held_out_of(relative, ["/old/data/ant/ant_0.png", "/old/data/cat/cat_0.png"]) == [
        "data/ant/ant_0.png",
        "data/cat/cat_0.png",
    ]
    absolute = write_index(
        tmp_path / "absolute.csv", [(str(image), image.parent.name) for image in images]
    )
    assert held_out_of(absolute, ["ant/ant_0.png", "cat/cat_0.png"]) == [
        str(images[0]),
        str(images[2]),
    ]


def test_a_run_on_the_folder_resumes_on_an_index_of_its_images_by_absolute_paths(
    runs, copied, tmp_path
):
    """An index's absolute paths count from the folder they all lie in, for the digests and
    for the held-out images alike: the folder's `ant/ant_2.png` is `/.../data/ant/ant_2.png`."""
    data, _, _ = runs
    _, run, _ = copied
    index = write_index(
        tmp_path / "absolute.csv",
        [(str(data / path), *rest) for path, *rest in folder_rows(data)],
    )
    result = resumed_silently(run, index)
    assert "Note: the training run" not in result.stderr
    assert all(path.startswith(str(data) + "/") for path in held(run))
