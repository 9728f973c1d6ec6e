"""`torchkit split`: largest-remainder stratified counts, reproducibility, --group, every mode
(copy, symlink, hardlink, move, manifest), crash-safe moves, OUT safety and bad input."""

from __future__ import annotations

import csv
import errno
import gc
import hashlib
import json
import logging
import os
import random
import re
import shutil
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from image_folders import write_image_folder
from output_checks import error_line
from processes import run_torchkit_in_process

from torchkit.cli import app
from torchkit.core.data.sources import csv_samples, open_data
from torchkit.core.data.sources.discovery import discover_image_folder, list_folders
from torchkit.core.data.sources.splitting import largest_remainder_counts, stratified_split
from torchkit.core.io.errors import InputError, OutputExistsError, UsageError
from torchkit.core.split import files as split_files
from torchkit.core.split import parse_ratio, split_dataset
from torchkit.core.split import plan as split_plan

ERROR_LINE = re.compile(r"^Error: .+ \(.+\)$", re.M)
SPLIT_ORDER = ["train", "val", "test"]


def make_files(root: Path, counts: dict[str, int], *, prefix=None) -> Path:
    """ROOT/<class>/<class>_<i>.png with distinct contents (split never decodes them)."""
    for name, count in counts.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            stem = f"{prefix(name, i) if prefix else f'{name}_{i:02d}'}"
            (root / name / f"{stem}.png").write_bytes(f"{name}/{i}".encode() * 3)
    return root


def snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """Relative path -> (SHA-256, mtime_ns) of every file: to prove a folder was not touched."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            found[path.relative_to(root).as_posix()] = (digest, path.stat().st_mtime_ns)
    return found


def manifest(out: Path) -> list[dict[str, str]]:
    with (out / "split.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


def assignment(out: Path) -> dict[str, str]:
    """Source path relative to its dataset root's parent -> split."""
    return {"/".join(Path(r["source"]).parts[-2:]): r["split"] for r in manifest(out)}


# --------------------------------------------------------------------------- allocation


def test_largest_remainder_gives_15_2_2_not_split_folders_15_1_3():
    weights = parse_ratio("8:1:1")
    assert largest_remainder_counts(19, weights) == [15, 2, 2]
    # split-folders: int(0.8 * 19) = 15 train, int(0.1 * 19) = 1 val, the rest (3) test.
    assert [int(0.8 * 19), int(0.1 * 19), 19 - int(0.8 * 19) - int(0.1 * 19)] == [15, 1, 3]
    assert largest_remainder_counts(5, weights) == [4, 1, 0]
    assert largest_remainder_counts(5, weights, at_least_one=True) == [3, 1, 1]
    assert largest_remainder_counts(3, weights, at_least_one=True) == [1, 1, 1]
    assert largest_remainder_counts(2, weights, at_least_one=True) == [2, 0, 0]  # too few
    # split.md's other examples: 7 files at 7:3 give 5/2 (split-folders: int(0.7 * 7) = 4, so
    # 4/3), and 1 file goes to train (split-folders: to the last split, test or val at 7:3).
    assert largest_remainder_counts(7, parse_ratio("7:3"), at_least_one=True) == [5, 2]
    assert [int(0.7 * 7), 7 - int(0.7 * 7)] == [4, 3]
    assert largest_remainder_counts(1, weights, at_least_one=True) == [1, 0, 0]
    assert largest_remainder_counts(1, parse_ratio("7:3"), at_least_one=True) == [1, 0]
    assert [int(0.8 * 1), int(0.1 * 1)] == [0, 0] and int(0.7 * 1) == 0


def test_largest_remainder_properties():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(0, 500)
        raw = [rng.randint(1, 9) for _ in range(rng.choice([2, 3]))]
        weights = [Fraction(r, sum(raw)) for r in raw]
        counts = largest_remainder_counts(n, weights)
        assert sum(counts) == n
        for count, weight in zip(counts, weights, strict=True):
            assert math_floor(n * weight) <= count <= math_floor(n * weight) + 1
        fixed = largest_remainder_counts(n, weights, at_least_one=True)
        assert sum(fixed) == n
        if n >= len(weights):
            assert min(fixed) >= 1


def math_floor(value: Fraction) -> int:
    return value.numerator // value.denominator


def test_default_stratified_split_is_unchanged():
    """Callers that pass no keys (train --val-split, digits) keep the generator-based order."""
    rng = random.Random(5)
    labels = [rng.randrange(4) for _ in range(97)]
    parts = stratified_split(labels, (0.8, 0.1, 0.1), seed=3)
    expected: list[list[int]] = [[], [], []]
    for label in sorted(set(labels)):  # the original algorithm, written out
        members = [i for i, lab in enumerate(labels) if lab == label]
        order = [members[i] for i in np.random.default_rng([3, label]).permutation(len(members))]
        counts = largest_remainder_counts(len(order), [0.8, 0.1, 0.1])
        start = 0
        for part, count in zip(expected, counts, strict=True):
            part.extend(order[start : start + count])
            start += count
    assert parts == [sorted(p) for p in expected]


def test_keyed_split_ignores_listing_order_and_is_pinned():
    keys = [f"cat/cat_{i:02d}.png" for i in range(10)] + [f"dog/dog_{i:02d}.png" for i in range(7)]
    labels = [0] * 10 + [1] * 7
    weights = parse_ratio("8:1:1")
    parts = stratified_split(labels, weights, 0, keys=keys, at_least_one=True)
    named = [sorted(keys[i] for i in part) for part in parts]
    # Pinned: the same split on every machine, Python and NumPy version, forever.
    assert named[1] == ["cat/cat_04.png", "dog/dog_05.png"]
    assert named[2] == ["cat/cat_02.png", "dog/dog_06.png"]
    order = list(range(len(keys)))
    random.Random(1).shuffle(order)
    shuffled = stratified_split(
        [labels[i] for i in order], weights, 0, keys=[keys[i] for i in order], at_least_one=True
    )
    assert [sorted(keys[order[i]] for i in part) for part in shuffled] == named


# Split membership before many-small-classes filling existed: a split with no empty part must
# never change (the digits job's figures and resumed runs depend on it).
UNCHANGED_SPLITS = {
    ("digits", "plain"): "2d32b00618f97c50",
    ("digits", "keys"): "e79bfbe9984d2686",
    ("digits", "keys, at least one"): "f211afb45b6ab6b1",
    ("3x50", "plain"): "d3f9b333defc7920",
    ("3x50", "keys"): "c913cd24b02daea1",
    ("3x50", "keys, at least one"): "51643be853bef788",
    ("2x[100,7]", "plain"): "ea032a2631a86399",
    ("2x[100,7]", "keys"): "1d5445e7fa01467f",
    ("2x[100,7]", "keys, at least one"): "940059bfd5bb7b72",
}


def test_splits_without_an_empty_part_are_unchanged():
    from torchkit.core.data.sources.digits import _sklearn_digits  # no sklearn import

    shapes = {
        "digits": [int(x) for x in _sklearn_digits()[1]],
        "3x50": [c for c in range(3) for _ in range(50)],
        "2x[100,7]": [0] * 100 + [1] * 7,
    }
    for (shape, how), pinned in UNCHANGED_SPLITS.items():
        labels = shapes[shape]
        keys = [f"c{label}/{i:04d}.png" for i, label in enumerate(labels)]
        fractions, kwargs = {
            "plain": ((0.8, 0.1, 0.1), {}),
            "keys": ((0.9, 0.1), {"keys": keys}),
            "keys, at least one": ((0.8, 0.1, 0.1), {"keys": keys, "at_least_one": True}),
        }[how]
        filled: list[int] = []
        parts = stratified_split(labels, fractions, 0, filled=filled, **kwargs)
        digest = hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]
        assert (shape, how, digest, filled) == (shape, how, pinned, [])


def test_many_small_classes_fill_an_empty_held_out_part_across_classes():
    # 200 classes of 4 at 0.9:0.1: 0.4 of an image a class rounds to none, so val was empty
    labels = [c for c in range(200) for _ in range(4)]
    keys = [f"c{label:03d}/{i}.png" for i, label in enumerate(labels)]
    filled: list[int] = []
    train, val = stratified_split(labels, (0.9, 0.1), 0, keys=keys, filled=filled)
    assert (len(train), len(val), filled) == (720, 80, [1])
    assert len({labels[i] for i in val}) == 80  # stratified: one image from each of 80 classes
    assert {labels[i] for i in train} == set(range(200))  # every class keeps 3 for training
    order = list(range(len(keys)))
    random.Random(2).shuffle(order)
    shuffled = stratified_split(
        [labels[i] for i in order], (0.9, 0.1), 0, keys=[keys[i] for i in order]
    )
    assert sorted(keys[order[i]] for i in shuffled[1]) == sorted(
        keys[i] for i in val
    )  # seeded by path
    assert stratified_split(labels, (0.9, 0.1), 1, keys=keys)[1] != val
    # the largest classes first; one image a class is never taken (its class would lose it)
    labels = [0] * 5 + [c for c in range(1, 40) for _ in range(2)] + list(range(40, 60))
    plain = stratified_split(labels, (0.9, 0.1), 3)
    assert len(plain[1]) == 10 and 0 in {labels[i] for i in plain[1]}
    assert not {labels[i] for i in plain[1]} & set(range(40, 60))


def test_split_fills_empty_val_and_test_of_classes_of_two(runner, tmp_path):
    root = make_files(tmp_path / "pairs", {f"c{i:02d}": 2 for i in range(30)})
    result = runner.invoke(
        app, ["split", str(root), str(tmp_path / "out"), "--mode", "manifest", "--format", "json"]
    )
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["splits"] == {"train": 48, "val": 6, "test": 6}
    assert "Note: every class's share of val rounds to no image" in result.stderr
    rows = manifest(tmp_path / "out")
    assert {r["label"] for r in rows if r["split"] == "train"} == {f"c{i:02d}" for i in range(30)}


def test_a_class_too_small_for_every_split_follows_the_documented_policy(tmp_path, caplog):
    """docs/commands/split.md: 1 file to train, 2 at 8:1:1 both to train (1:1:1: train and
    val), 3 at 8:1:1 one in each split; a warning names the classes and what they lack."""
    root = make_files(tmp_path / "raw", {"a": 10, "b": 1, "c": 2, "d": 3})
    with caplog.at_level(logging.WARNING, logger="torchkit"):
        result = split_dataset(root, tmp_path / "out", mode="manifest")
    assert result.counts == [[8, 1, 1], [1, 0, 0], [2, 0, 0], [1, 1, 1]]
    assert (
        "2 class(es) have too few images for every split: b (1: none in val/test), "
        "c (2: none in val/test)" in caplog.text
    )
    even = split_dataset(root, tmp_path / "even", mode="manifest", ratio="1:1:1")
    assert even.counts[1:3] == [[1, 0, 0], [1, 1, 0]]


def test_fast_listing_matches_image_folders_walk(tmp_path):
    root = make_files(tmp_path / "tree", {"a": 2, "b": 1})
    (root / "a" / "deep" / ".hidden").mkdir(parents=True)
    (root / "a" / "deep" / ".hidden" / "x.JPG").write_bytes(b"x")
    (root / "a" / "notes.txt").write_text("x")
    (root / "a" / "folder.png").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "y.png").write_bytes(b"y")
    (root / "b" / "linked").symlink_to(tmp_path / "elsewhere")
    (root / "b" / "link.png").symlink_to(root / "a" / "a_00.png")
    (root / "b" / "broken.png").symlink_to(tmp_path / "nothing.png")
    for folder in (root, root / "a", root / "b"):
        # torchvision's ImageFolder: os.walk(followlinks=True), files named like images.
        expected = sorted(
            os.path.join(top, name)
            for top, _, names in os.walk(folder, followlinks=True)
            for name in names
            if os.path.isfile(os.path.join(top, name))
            and os.path.splitext(name)[1].lower() in {".png", ".jpg"}
        )
        assert list_folders([folder]).images[0] == expected


# --------------------------------------------------------------------------- the split itself


def test_cli_counts_per_class_are_largest_remainder(runner, tmp_path):
    root = make_files(tmp_path / "data", {"a": 19, "b": 10, "c": 5, "d": 2})
    out = tmp_path / "out"
    result = runner.invoke(app, ["split", str(root), str(out), "--format", "json"])
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    by_class = {c["name"]: [c["train"], c["val"], c["test"]] for c in report["classes"]}
    assert by_class == {"a": [15, 2, 2], "b": [8, 1, 1], "c": [3, 1, 1], "d": [2, 0, 0]}
    assert report["splits"] == {"train": 28, "val": 4, "test": 4} and report["files"] == 36
    assert "d (2: none in val/test)" in result.stderr  # too small a class: warned, not fatal
    rows = manifest(out)
    assert len(rows) == 36 and {r["split"] for r in rows} == {"train", "val", "test"}
    for row in rows:  # split.csv matches the files on disk
        assert (out / row["path"]).read_bytes() == Path(row["source"]).read_bytes()
        assert row["path"].startswith(f"{row['split']}/{row['label']}/")
    table = runner.invoke(app, ["split", str(root), str(tmp_path / "o2"), "--format", "csv"])
    assert table.stdout.splitlines()[0] == "class,train,val,test,total"
    assert "a,15,2,2,19" in table.stdout.splitlines() and "total,28,4,4,36" in table.stdout


def test_two_part_ratio_names_and_no_stratify(runner, tmp_path):
    root = make_files(tmp_path / "data", {"a": 6, "b": 4})
    out = tmp_path / "out"
    args = ["split", str(root), str(out), "--ratio", "0.7,0.3", "--names", "fit,check"]
    result = runner.invoke(app, [*args, "--no-stratify", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["splits"] == {"fit": 7, "check": 3} and report["stratified"] is False
    assert sorted(p.name for p in out.iterdir()) == [".torchkit", "check", "fit", "split.csv"]


def test_reproducible_and_independent_of_listing_order(tmp_path):
    one = make_files(tmp_path / "one" / "data", {"a": 12, "b": 9})
    two = tmp_path / "two" / "data"  # the same files, created in the opposite order
    for path in sorted(one.rglob("*.png"), reverse=True):
        target = two / path.relative_to(one)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
    split_dataset(one, tmp_path / "o1", mode="manifest", seed=4)
    split_dataset(two, tmp_path / "o2", mode="manifest", seed=4)
    split_dataset(one, tmp_path / "o3", mode="manifest", seed=5)
    assert assignment(tmp_path / "o1") == assignment(tmp_path / "o2")
    assert assignment(tmp_path / "o1") != assignment(tmp_path / "o3")


def test_group_keeps_groups_together(runner, tmp_path):
    def patient(name, i):
        return f"p{i // 3 + (100 if name == 'malignant' else 0)}_{name}_{i}"  # 3 per patient

    root = make_files(tmp_path / "data", {"benign": 24, "malignant": 15}, prefix=patient)
    (root / "benign" / "loose.png").write_bytes(b"unmatched")
    out = tmp_path / "out"
    args = ["split", str(root), str(out), "--group", r"^(p\d+)_", "--mode", "manifest"]
    result = runner.invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 0, result.stderr
    assert "1 file name(s) do not match --group" in result.stderr
    report = json.loads(result.stdout)
    assert report["groups"] == 8 + 5 + 1
    split_of: dict[str, set[str]] = {}
    for row in manifest(out):
        name = Path(row["source"]).name
        split_of.setdefault(name.split("_")[0] if name != "loose.png" else name, set()).add(
            row["split"]
        )
    assert all(len(splits) == 1 for splits in split_of.values())  # no patient in two splits
    # Every split still gets patients of each class (5 malignant patients, 3 splits).
    assert all(c[s] > 0 for c in report["classes"][:2] for s in ("train", "val", "test"))


def test_group_stem_keeps_a_folders_files_of_one_name_together_not_across_classes(runner, tmp_path):
    """`--group stem` is split-folders' `group="stem"`: `cat/003.jpg` goes with `cat/003.png`,
    never with `dog/003.jpg`. Each class numbers its files from 000, as most datasets do."""
    root = tmp_path / "data"
    for name, pairs in {"cat": 20, "dog": 10, "owl": 3}.items():
        (root / name).mkdir(parents=True)
        for i in range(pairs):
            for suffix in (".jpg", ".png"):
                (root / name / f"{i:03d}{suffix}").write_bytes(f"{name}{i}{suffix}".encode())
    out = tmp_path / "out"
    args = ["split", str(root), str(out), "--group", "stem", "--mode", "manifest"]
    result = runner.invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["group"] == "stem" and report["groups"] == 20 + 10 + 3
    split_of: dict[str, set[str]] = {}
    for row in manifest(out):
        split_of.setdefault(row["path"].rsplit(".", 1)[0], set()).add(row["split"])
    assert len(split_of) == 33 and all(len(splits) == 1 for splits in split_of.values())
    counts = {c["name"]: [c[s] for s in SPLIT_ORDER] for c in report["classes"]}
    # split-folders' ratio(..., ratio=(.8, .1, .1), group="stem") on the same folder counted
    # cat 32/4/4 and dog 16/2/2 (pairs of files); its owl, 4/0/2, rounds val down to nothing,
    # where the largest remainders give each split one of the three pairs.
    assert counts == {"cat": [32, 4, 4], "dog": [16, 2, 2], "owl": [2, 2, 2]}
    # A regex sees only file names: the same stems tie all three classes' 000.jpg together.
    by_name = ["--group", r"^(.*)\.[^.]*$", "--mode", "manifest"]
    regex = runner.invoke(app, [*args[:2], str(tmp_path / "re"), *by_name])
    assert regex.exit_code == 0 and "owl (6: none in val)" in regex.stderr


def split_json(runner, args: list[str]) -> tuple:
    """`torchkit ARGS --format json`, which must succeed: its result and the report's classes."""
    result = runner.invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 0, result.stderr
    return result, json.loads(result.stdout)["classes"]


def pairs_folder(root: Path, files: dict[str, int], suffixes=(".jpg", ".png")) -> Path:
    """ROOT/<folder>/<i>.jpg and <i>.png (one pair per i) for each folder (`cat/2019`...)."""
    for folder, count in files.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            for suffix in suffixes:
                (root / folder / f"{i:03d}{suffix}").write_bytes(f"{folder}{i}{suffix}".encode())
    return root


def splits_by_stem(out: Path, column: str = "path") -> dict[str, set[str]]:
    split_of: dict[str, set[str]] = {}
    for row in manifest(out):
        split_of.setdefault(row[column].rsplit(".", 1)[0], set()).add(row["split"])
    return split_of


def test_group_stem_keeps_nested_folders_apart_and_a_finished_move_reruns_as_done(runner, tmp_path):
    """A class's subfolder is a folder of its own: `cat/2019/000.jpg` goes with
    `cat/2019/000.png`, not with `cat/000.jpg`; the files keep their subfolder in OUT. A move
    with `--group stem` run again is the same move: done, nothing moved."""
    root = pairs_folder(tmp_path / "data", {"cat": 6, "cat/2019": 4, "dog": 5})
    out = tmp_path / "out"
    result = runner.invoke(
        app, ["split", str(root), str(out), "--group", "stem", "--format", "json"]
    )
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["groups"] == 6 + 4 + 5
    split_of = splits_by_stem(out)
    assert len(split_of) == 15 and all(len(splits) == 1 for splits in split_of.values())
    nested = {row["path"] for row in manifest(out) if "/2019/" in row["path"]}
    assert len(nested) == 8 and all(p.split("/")[1:3] == ["cat", "2019"] for p in nested)
    assert all((out / path).is_file() for path in nested)

    moved = tmp_path / "moved"
    args = ["split", str(root), str(moved), "--group", "stem", "--mode", "move"]
    assert runner.invoke(app, args).exit_code == 0
    assert not list(root.rglob("*.*")) and splits_by_stem(moved) == split_of
    again = runner.invoke(app, [*args, "--format", "json"])
    assert again.exit_code == 0, again.stderr
    assert json.loads(again.stdout)["group"] == "stem"
    assert splits_by_stem(moved) == split_of


def test_group_stem_in_a_csv_index_and_with_fixed_counts_of_pairs(runner, tmp_path):
    """In a CSV index the stem is the listed path without its extension: the folder counts as
    in an image folder. `--fixed` counts images: split-folders' `fixed=(1, 1)` of pairs is
    `--fixed 2,2`; `--fixed 1,1` is met as closely as whole pairs allow, with a warning;
    `--oversample` repeats whole pairs."""
    root = pairs_folder(tmp_path / "data", {"imgs": 6, "more": 4})
    index = tmp_path / "data" / "index.csv"
    rows = [f"{p.relative_to(root).as_posix()},{p.parent.name}" for p in sorted(root.rglob("*.*"))]
    index.write_text("path,label\n" + "\n".join(rows) + "\n")
    out = tmp_path / "out"
    args = ["split", str(index), str(out), "--group", "stem", "--mode", "manifest"]
    result = runner.invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["groups"] == 10
    split_of = splits_by_stem(out)
    assert len(split_of) == 10 and all(len(splits) == 1 for splits in split_of.values())

    classes = pairs_folder(tmp_path / "classes", {"cat": 6, "dog": 5})
    fixed = ["split", str(classes), "--group", "stem", "--mode", "manifest", "--format", "json"]
    exact = runner.invoke(app, [*fixed[:2], str(tmp_path / "f2"), *fixed[2:], "--fixed", "2,2"])
    assert exact.exit_code == 0 and "Warning" not in exact.stderr
    counts = [[c[s] for s in SPLIT_ORDER] for c in json.loads(exact.stdout)["classes"]]
    assert counts == [[8, 2, 2], [6, 2, 2]]
    near = runner.invoke(app, [*fixed[:2], str(tmp_path / "f1"), *fixed[2:], "--fixed", "1,1"])
    assert near.exit_code == 0
    assert "is not met with whole groups for 2 class(es)" in near.stderr
    counts = [[c[s] for s in SPLIT_ORDER] for c in json.loads(near.stdout)["classes"]]
    assert counts == [[8, 2, 2], [6, 2, 2]]
    assert all(len(s) == 1 for s in splits_by_stem(tmp_path / "f1").values())
    # --oversample repeats a group whole, as split-folders repeats a stem group: dog's two
    # repeats, which bring its train to cat's 8 images, are both files of one pair.
    over = tmp_path / "over"
    balanced = runner.invoke(
        app, [*fixed[:2], str(over), *fixed[2:], "--fixed", "2,2", "--oversample"]
    )
    assert balanced.exit_code == 0, balanced.stderr
    assert "Warning" not in balanced.stderr
    report = json.loads(balanced.stdout)["classes"]
    assert [(c["train"], c["repeats"]) for c in report] == [(8, 0), (6, 2)]
    repeated = [row for row in manifest(over) if row["repeat"] != "0"]
    assert {row["repeat"] for row in repeated} == {"1"}
    assert len(splits_by_stem(over).keys() & {r["path"].rsplit(".", 1)[0] for r in repeated}) == 1
    assert sorted(row["path"].rsplit(".", 1)[1] for row in repeated) == ["jpg", "png"]


def test_oversample_with_group_stem_copies_a_pair_under_one_repeat_number(runner, tmp_path):
    """The repeats of a pair are named alike (`003-repeat1.jpg` with `003-repeat1.png`): a
    reader that pairs files by stem finds each repeat's other half."""
    classes = pairs_folder(tmp_path / "classes", {"cat": 7, "dog": 3})
    out = tmp_path / "out"
    args = ["split", str(classes), str(out), "--group", "stem", "--fixed", "2,2", "--oversample"]
    result, report = split_json(runner, args)
    assert "Warning" not in result.stderr
    # cat: 5 pairs in train; dog: 1 pair, repeated 4 times whole.
    assert [(c["train"], c["repeats"]) for c in report] == [(10, 0), (2, 8)]
    names = sorted(p.name for p in (out / "train" / "dog").iterdir())
    stems = {name.rsplit(".", 1)[0] for name in names}
    assert len(names) == 10 and len(stems) == 5
    assert all(f"{stem}.jpg" in names and f"{stem}.png" in names for stem in stems)
    assert sum("-repeat" in stem for stem in stems) == 4


def repeat_stems(out: Path) -> dict[tuple[str, str], list[str]]:
    """(`<class>/<source stem>`, repeat number) -> the stems of that source stem's repeats, one
    a file, from OUT's split.csv, each of them a file in OUT."""
    repeats: dict[tuple[str, str], list[str]] = {}
    for row in manifest(out):
        assert (out / row["path"]).is_file()
        if row["repeat"] != "0":
            source = Path(row["source"])
            key = (f"{source.parent.name}/{source.stem}", row["repeat"])
            repeats.setdefault(key, []).append(row["path"].rsplit(".", 1)[0])
    return repeats


def test_oversample_with_group_names_both_halves_of_a_pair_alike_where_a_name_is_taken(
    runner, tmp_path
):
    """ROOT already holds `001-repeat1.png` (a file of its own, beside the pair 001): the
    pair's first repeat cannot be `001-repeat1.*`, and both halves take the next name free for
    both, `001-repeat1-1.jpg` with `001-repeat1-1.png` (not `001-repeat1.jpg` with
    `001-repeat1-1.png`, which a reader pairing files by stem would part)."""
    root = pairs_folder(tmp_path / "data", {"cat": 8, "dog": 2})
    (root / "dog" / "000-repeat1.jpg").write_bytes(b"a file of its own")
    (root / "dog" / "001-repeat1.png").write_bytes(b"another one")
    out = tmp_path / "out"
    args = ["split", str(root), str(out), "--group", "stem", "--fixed", "1", "--oversample"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    # Whichever group val takes, a pair stays in train beside the file its repeat would be.
    repeats = repeat_stems(out)
    pairs = {key: stems for key, stems in repeats.items() if key[0].endswith(("000", "001"))}
    assert pairs and all(len(set(stems)) == 1 for stems in pairs.values())
    assert any(stem.endswith("-repeat1-1") for stems in pairs.values() for stem in stems)
    names = {p.name for p in (out / "train" / "dog").iterdir()}
    paired = [n.rsplit(".", 1)[0] for n in names if n.startswith(("000-", "001-"))]
    halves = [stem for stem in paired if paired.count(stem) == 1]
    # the lone files and their own repeats (`001-repeat1-repeat2.png`), no half of a pair
    assert all(re.fullmatch(r"00[01]-repeat1(-repeat\d+)?", stem) for stem in halves)


def test_oversample_with_group_names_a_group_of_three_alike_in_every_class(runner, tmp_path):
    """Groups of three files (`001.jpg`, `001.png`, `001.bmp`) in three classes, names taken in
    two of them: every repeat of a group is one stem for its three files, in every class, and
    where `-repeat<k>` is taken for one of them all three take `-repeat<k>-1`."""
    root = pairs_folder(tmp_path / "data", {"cat": 8, "dog": 2, "fox": 3}, (".jpg", ".png", ".bmp"))
    (root / "dog" / "000-repeat1.png").write_bytes(b"a file of its own")
    (root / "dog" / "001-repeat2.bmp").write_bytes(b"another one")
    (root / "fox" / "000-repeat1.jpg").write_bytes(b"and one more")
    out = tmp_path / "out"
    args = ["split", str(root), str(out), "--group", "stem", "--fixed", "1", "--oversample"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    repeats = {
        key: stems
        for key, stems in repeat_stems(out).items()
        if re.fullmatch(r"00\d", key[0].split("/")[1])  # the groups, not the lone files
    }
    assert {key[0].split("/")[0] for key in repeats} == {"dog", "fox"}
    assert all(len(stems) == 3 and len(set(stems)) == 1 for stems in repeats.values())
    renamed = {stems[0] for stems in repeats.values() if re.search(r"-repeat\d-1$", stems[0])}
    # dog's 001 (its 000 or 001 may go to val) or fox's 000, whichever the seed keeps in train
    assert renamed and renamed <= {
        "train/dog/000-repeat1-1", "train/dog/001-repeat2-1", "train/fox/000-repeat1-1"
    }  # fmt: skip


def test_names_claimed_together_take_one_tag_free_for_each():
    """`FreeNames.claim_together`, which names a --group group's repeats: the first tag free
    for every file of the group."""
    free = split_plan.FreeNames(["t/c/x-repeat1.jpg", "t/c/x-repeat1-1.png"])
    pair = [("t/c/", "x", ".jpg"), ("t/c/", "x", ".png")]
    assert free.claim_together(pair, tag="-repeat1") == [
        "t/c/x-repeat1-2.jpg",
        "t/c/x-repeat1-2.png",
    ]
    assert free.claim_together(pair, tag="-repeat2") == ["t/c/x-repeat2.jpg", "t/c/x-repeat2.png"]
    # one file: the name `claim` gives it, the first free
    assert free.claim_together([("t/c/", "x", ".jpg")], tag="-repeat1") == ["t/c/x-repeat1-1.jpg"]
    # compared by casefold, as every name: `X.JPG` takes `x.jpg`'s place
    cased = split_plan.FreeNames(["t/c/X-REPEAT1.JPG"])
    assert cased.claim_together(pair, tag="-repeat1") == [
        "t/c/x-repeat1-1.jpg",
        "t/c/x-repeat1-1.png",
    ]
    # two long stems cut to fit the same name are never given one name: each its own, at once
    # or once the tag grows by a number (`-repeat1` fits both whole, `-repeat1-1` cuts both)
    for stem in ("é" * 200, "é" * 121):
        pair = [("t/", stem + "a", ".jpg"), ("t/", stem + "b", ".jpg")]
        free = split_plan.FreeNames([f"t/{stem}a-repeat1.jpg"])
        names = free.claim_together(pair, tag="-repeat1")
        assert len({n.casefold() for n in names}) == 2
        assert all(len(os.fsencode(n[2:])) <= 255 for n in names)


def test_oversample_with_groups_meets_the_count_as_closely_as_whole_groups_allow(runner, tmp_path):
    """Groups of 3 cannot make up 4 missing images: the class gets one more group (3, nearer
    than 6), and a warning names it with its count."""
    root = pairs_folder(tmp_path / "raw", {"cat": 16}, suffixes=(".png",))
    pairs_folder(root, {"dog": 4}, suffixes=(".jpg", ".png", ".bmp"))
    args = ["split", str(root), str(tmp_path / "out"), "--group", "stem", "--fixed", "3,3"]
    result, report = split_json(runner, [*args, "--oversample", "--mode", "manifest"])
    assert [(c["train"], c["repeats"]) for c in report] == [(10, 0), (6, 3)]
    assert [line for line in result.stderr.splitlines() if "--oversample" in line] == [
        "Warning: --oversample repeats whole groups: 1 class has other than 10 images in train: "
        "dog (9)"
    ]
    repeated = [row["path"] for row in manifest(tmp_path / "out") if row["repeat"] != "0"]
    assert len({path.rsplit(".", 1)[0] for path in repeated}) == 1  # one triple, whole


@pytest.mark.parametrize(
    ("sizes", "need", "taken"),
    [
        ([1, 1, 1], 5, [(0, 1), (1, 1), (2, 1), (0, 2), (1, 2)]),  # round-robin, as files
        ([3, 1, 3], 4, [(0, 1), (1, 1)]),  # the second group of 3 passed over for the single
        ([3, 3], 4, [(0, 1)]),  # 1 short is nearer than 2 over
        ([3, 2], 4, [(0, 1)]),  # the 3 first, in turn: the exact 2 + 2 is not sought
        ([3, 3], 2, [(0, 1)]),  # 1 over is nearer than 2 short
        ([2, 2], 1, []),  # a tie: short rather than over
        ([5], 0, []),
    ],
)
def test_oversample_repeats_whole_groups_round_robin(sizes, need, taken):
    assert split_plan._repeated_units(sizes, need) == taken


def test_oversample_repeats_byte_identical_files_one_at_a_time(runner, tmp_path):
    """Byte-identical files stay in one split, but --oversample repeats them as other files,
    not as a --group group: dog's 2 missing images are 2 repeats (its 3 copies as one group
    would have overshot to 3, or fallen short at 1)."""
    root = tmp_path / "data"
    for name, body in [*((f"cat/{i}.png", f"cat{i}") for i in range(7)), ("dog/c.png", "c")]:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(body.encode())
    for name in ["a", "b", "d"]:
        (root / "dog" / f"{name}.png").write_bytes(b"same")
    (root / "dog" / "e.png").write_bytes(b"e")
    out = tmp_path / "out"
    args = ["split", str(root), str(out), "--fixed", "1", "--oversample", "--mode", "manifest"]
    result, report = split_json(runner, args)
    assert "--oversample" not in result.stderr
    assert [(c["train"], c["repeats"]) for c in report] == [(6, 0), (4, 2)]
    assert sorted(row["repeat"] for row in manifest(out) if row["repeat"] != "0") == ["1", "1"]


def test_oversample_warnings_count_the_classes_in_words(caplog):
    """'1 class has', '2 classes have': a class one group short, one a group over, and one
    with no train image."""
    counts = [[10, 1, 1], [9, 1, 1], [7, 1, 1], [0, 1, 0], [10, 0, 0]]
    with caplog.at_level(logging.WARNING, logger="torchkit"):
        split_plan.warn_unbalanced(list("abcde"), counts, SPLIT_ORDER, [0, 0, 4, 0, 0])
    assert [r.getMessage() for r in caplog.records] == [
        "--oversample cannot balance train for 1 class with no image in it: d",
        "--oversample repeats whole groups: 2 classes have other than 10 images in train: "
        "b (9), c (11)",
    ]


def test_oversample_repeats_a_classes_files_of_one_group_under_one_number():
    """Groups are a class's own: the `p1` files of cat and of dog are two units."""
    labels = [0, 0, 0, 0, 1, 1]
    keys = ["cat/p1_a", "cat/p1_b", "cat/p2_a", "cat/p3_a", "dog/p1_a", "dog/p1_b"]
    groups = ["p1", "p1", "p2", "p3", "p1", "p1"]
    repeats, extra = split_plan.oversample_repeats(labels, [0] * 6, keys, 0, 2, groups)
    assert extra == [0, 2] and sorted(repeats) == [(4, 1), (5, 1)]
    files, extra = split_plan.oversample_repeats(labels, [0] * 6, keys, 0, 2)
    assert extra == [0, 2] and sorted(files) == [(4, 1), (5, 1)]  # each file its own unit


def test_group_regex_on_names_does_split_folders_sibling_grouping(runner, tmp_path):
    """split-folders' `group="sibling"` (`images/001.jpg` with `masks/001.png`) is a regex
    on the name without its extension: each pair lands in one split, in OUT/<split>/images/
    and OUT/<split>/masks/."""
    root = tmp_path / "data"
    for folder, suffix in (("images", ".jpg"), ("masks", ".png")):
        pairs_folder(root, {folder: 10}, suffixes=(suffix,))
    out = tmp_path / "out"
    args = ["split", str(root), str(out), "--group", r"^(.*)\.[^.]*$"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    by_name: dict[str, set[str]] = {}
    for row in manifest(out):
        split, folder, name = row["path"].split("/")
        assert (folder, split) == (row["label"], row["split"]) and (out / row["path"]).is_file()
        by_name.setdefault(name.rsplit(".", 1)[0], set()).add(split)
    assert len(by_name) == 10 and all(len(splits) == 1 for splits in by_name.values())
    assert sorted(p.relative_to(out).as_posix() for p in out.glob("*/*/")) == [
        f"{split}/{folder}" for split in ("test", "train", "val") for folder in ("images", "masks")
    ]


def test_group_bad_regex_or_no_match(runner, tmp_path):
    root = make_files(tmp_path / "data", {"a": 3})
    bad = runner.invoke(app, ["split", str(root), str(tmp_path / "o"), "--group", "(unclosed"])
    assert bad.exit_code == 2 and ERROR_LINE.search(bad.stderr)
    none = runner.invoke(app, ["split", str(root), str(tmp_path / "o"), "--group", "^zzz(\\d)"])
    assert none.exit_code == 2 and "matches no file name" in none.stderr
    # An empty pattern is a usage error, not --group left out.
    empty = runner.invoke(app, ["split", str(root), str(tmp_path / "o"), "--group", ""])
    assert empty.exit_code == 2 and "invalid --group '': an empty value" in empty.stderr
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- modes


@pytest.mark.parametrize("mode", ["copy", "symlink", "hardlink", "manifest"])
def test_modes_leave_root_untouched(tmp_path, mode):
    root = make_files(tmp_path / "data", {"a": 5, "b": 4})
    before = snapshot(root)
    out = tmp_path / "out"
    result = split_dataset(root, out, mode=mode)
    assert snapshot(root) == before
    rows = manifest(out)
    assert len(rows) == 9 and list(rows[0]) == ["path", "label", "split", "source"]
    for row in rows:
        placed = out / row["path"]
        source = Path(row["source"])
        assert source.is_absolute() and placed.read_bytes() == source.read_bytes()
        if mode == "symlink":
            assert placed.is_symlink() and os.readlink(placed) == str(source)
        elif mode == "hardlink":
            assert placed.stat().st_ino == source.stat().st_ino
        elif mode == "copy":
            assert not placed.is_symlink() and placed.stat().st_ino != source.stat().st_ino
    if mode == "manifest":
        assert sorted(p.name for p in out.iterdir()) == [".torchkit", "split.csv"]
        loaded = csv_samples(out / "split.csv")  # the manifest works as a CSV index
        assert sorted(loaded.paths) == sorted(str(out / r["path"]) for r in rows)
    else:
        assert discover_image_folder(out / "train").classes == ["a", "b"]
    assert result.totals == [5, 2, 2]  # a: 5 -> 3/1/1, b: 4 -> 2/1/1 (one each)


def test_move_moves_and_verifies(tmp_path):
    root = make_files(tmp_path / "data", {"a": 5, "b": 4})
    before = snapshot(root)
    out = tmp_path / "out"
    split_dataset(root, out, mode="move")
    assert not list(root.rglob("*.png"))
    after = {row["source"]: row["path"] for row in manifest(out)}
    for relative, (digest, _) in before.items():
        moved = out / after[str(root / relative)]
        assert hashlib.sha256(moved.read_bytes()).hexdigest() == digest
    journal = json.loads((out / ".torchkit-split.json").read_text())
    assert journal["state"] == "done"
    # OUT now holds the only copies: --force must not delete them.
    with pytest.raises(OutputExistsError, match="only copies"):
        split_dataset(tmp_path / "other", out, force=True)


def test_move_interrupted_half_way_loses_nothing_and_resumes(tmp_path, monkeypatch):
    root = make_files(tmp_path / "data", {"a": 6, "b": 5})
    contents = {p.name: p.read_bytes() for p in root.rglob("*.png")}
    out = tmp_path / "out"
    real_move = split_files.move_file
    moved = []

    def crash_after_four(source, dest, **options):
        if len(moved) == 4:
            raise KeyboardInterrupt  # the power goes out
        real_move(source, dest, **options)
        moved.append(source)

    monkeypatch.setattr(split_files, "move_file", crash_after_four)
    with pytest.raises(KeyboardInterrupt):
        split_dataset(root, out, mode="move", seed=2)
    in_root = {p.name for p in root.rglob("*.png")}
    in_out = {p.name for p in out.rglob("*.png")}
    assert len(in_out) == 4 and not in_root & in_out and in_root | in_out == set(contents)
    assert json.loads((out / ".torchkit-split.json").read_text())["state"] == "moving"

    monkeypatch.setattr(split_files, "move_file", real_move)
    with pytest.raises(UsageError, match="unfinished move"):  # another command is refused
        split_dataset(root, out, mode="copy", force=True)
    result = split_dataset(root, out, mode="move", seed=2)
    assert result.resumed and result.totals == [7, 2, 2]
    assert not list(root.rglob("*.png"))
    for path in out.rglob("*.png"):
        assert path.read_bytes() == contents[path.name]
    reference = tmp_path / "reference"
    split_dataset(make_files(tmp_path / "copy" / "data", {"a": 6, "b": 5}), reference, seed=2)
    planned = sorted(r["path"] for r in manifest(reference))
    assert sorted(r["path"] for r in manifest(out)) == planned


def test_move_of_a_file_deleted_meanwhile_fails_clearly_and_a_rerun_finishes_without_it(
    runner, tmp_path, monkeypatch
):
    root = make_files(tmp_path / "data", {"a": 5, "b": 5})
    contents = {p.name: p.read_bytes() for p in root.rglob("*.png")}
    victim = root / "b" / "b_01.png"
    out = tmp_path / "out"
    real_move = split_files.move_file

    def another_process_deletes_one(source, dest, **options):
        victim.unlink(missing_ok=True)  # a network share drops it before its turn
        real_move(source, dest, **options)

    monkeypatch.setattr(split_files, "move_file", another_process_deletes_one)
    failed = runner.invoke(app, ["split", str(root), str(out), "--mode", "move"])
    assert failed.exit_code == 1 and "Traceback" not in failed.stderr
    assert ERROR_LINE.search(failed.stderr)
    assert f"Error: {victim} disappeared during the move" in failed.stderr

    monkeypatch.setattr(split_files, "move_file", real_move)
    rerun = runner.invoke(app, ["split", str(root), str(out), "--mode", "move"])
    assert rerun.exit_code == 0, rerun.stderr
    assert "1 file(s) were deleted" in rerun.stderr and str(victim) in rerun.stderr
    assert not list(root.rglob("*.png"))
    del contents[victim.name]
    assert {p.name: p.read_bytes() for p in out.rglob("*.png")} == contents
    rows = manifest(out)
    assert len(rows) == 9 and str(victim) not in {row["source"] for row in rows}
    journal = json.loads((out / ".torchkit-split.json").read_text())
    assert journal["state"] == "done" and journal["lost"] == [str(victim)]
    assert sum(map(sum, journal["counts"])) == 9
    again = split_dataset(root, out, mode="move")  # done: nothing moved, the files counted
    assert again.already_done and sum(again.totals) == 9


def test_move_across_filesystems_copies_verifies_then_removes(tmp_path, monkeypatch):
    root = make_files(tmp_path / "data", {"a": 3})
    contents = {p.name: p.read_bytes() for p in root.rglob("*.png")}

    def no_rename(source, dest):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(split_files.os, "rename", no_rename)
    split_dataset(root, tmp_path / "out", mode="move", ratio="2:1")
    assert not list(root.rglob("*.png"))
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").rglob("*.png")} == contents
    assert not list((tmp_path / "out").rglob(".torchkit-move-*"))


def test_move_keeps_source_when_the_copy_differs(tmp_path, monkeypatch):
    source = tmp_path / "a.png"
    source.write_bytes(b"precious")

    def no_rename(src, dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    def bad_copy(src, dst):
        Path(dst).write_bytes(b"precioux")  # a flipped byte on the way

    monkeypatch.setattr(split_files.os, "rename", no_rename)
    monkeypatch.setattr(split_files.shutil, "copy2", bad_copy)
    (tmp_path / "dest").mkdir()
    with pytest.raises(InputError, match="differs"):
        split_files.move_file(str(source), str(tmp_path / "dest" / "a.png"))
    assert source.read_bytes() == b"precious" and not any((tmp_path / "dest").iterdir())


# --------------------------------------------------------------------------- OUT safety


def test_out_needs_force_and_force_replaces_only_the_split(runner, tmp_path):
    root = make_files(tmp_path / "data", {"a": 4, "b": 4})
    out = tmp_path / "out"
    assert runner.invoke(app, ["split", str(root), str(out), "--names", "x,y,z"]).exit_code == 0
    (out / "keep.txt").write_text("mine")
    again = runner.invoke(app, ["split", str(root), str(out)])
    assert again.exit_code == 1 and ERROR_LINE.search(again.stderr)
    assert "already exists" in again.stderr and "--force" in again.stderr
    forced = runner.invoke(app, ["split", str(root), str(out), "--force", "--ratio", "1:1"])
    assert forced.exit_code == 0, forced.stderr
    listed = sorted(p.name for p in out.iterdir())
    assert listed == [".torchkit", "keep.txt", "split.csv", "train", "val"]
    assert (out / "keep.txt").read_text() == "mine"


def test_out_inside_root_and_root_inside_a_split_are_refused(runner, tmp_path):
    root = make_files(tmp_path / "data", {"a": 3})
    inside = runner.invoke(app, ["split", str(root), str(root / "splits")])
    assert inside.exit_code == 1 and "lies inside the data folder" in inside.stderr
    assert not (root / "splits").exists()
    holder = tmp_path / "holder"
    make_files(holder / "train", {"a": 3})
    (holder / "split.csv").write_text("path,label,split\n")
    result = runner.invoke(app, ["split", str(holder / "train"), str(holder), "--force"])
    assert result.exit_code == 1 and "contains the data folder" in result.stderr
    assert len(list((holder / "train").rglob("*.png"))) == 3


# --------------------------------------------------------------------------- other inputs


def test_flat_folder_and_csv_index(tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    for i in range(10):
        (flat / f"f{i}.png").write_bytes(bytes([i]))
    split_dataset(flat, tmp_path / "o1")
    assert len(list((tmp_path / "o1" / "train").glob("*.png"))) == 8
    assert {r["label"] for r in manifest(tmp_path / "o1")} == {""}

    make_files(tmp_path / "x", {"a": 2})
    make_files(tmp_path / "y", {"a": 2})  # same file names in another folder
    index = tmp_path / "index.csv"
    index.write_text(
        "path,label\nx/a/a_00.png,cat\nx/a/a_01.png,cat\ny/a/a_00.png,cat\ny/a/a_01.png,dog\n"
    )
    split_dataset(index, tmp_path / "o2", ratio="1:1")
    rows = manifest(tmp_path / "o2")
    assert len({r["path"] for r in rows}) == 4  # colliding names were made unique
    for row in rows:
        assert (tmp_path / "o2" / row["path"]).read_bytes() == Path(row["source"]).read_bytes()
        assert row["path"].startswith(f"{row['split']}/{row['label']}/")


def test_the_manifest_of_a_flat_folder_reads_as_unlabelled_split_data(runner, tmp_path):
    # Its label column is empty in every row: the commands that take unlabelled images
    # refused it ("row(s) with an empty label"), so no command could read what split wrote.
    from PIL import Image

    flat = tmp_path / "flat"
    flat.mkdir()
    for i in range(10):
        Image.new("RGB", (4, 4), (i * 20, 0, 0)).save(flat / f"f{i}.png")
    split_dataset(flat, tmp_path / "out", mode="manifest")
    index = tmp_path / "out" / "split.csv"
    args = ["dataset-stats", str(index), "--split", "all", "-j", "0", "--format", "json"]
    stats = runner.invoke(app, args)
    assert stats.exit_code == 0, stats.stderr
    assert json.loads(stats.stdout)["images"] == 10
    samples = csv_samples(index, allow_unlabelled=True)
    assert len(samples.paths) == 10
    with pytest.raises(InputError, match=r"10 row\(s\) with an empty label"):
        csv_samples(index)  # train and eval still need labels


@pytest.mark.parametrize("mode", ["copy", "symlink"])
def test_the_split_folders_of_a_flat_folder_read_as_unlabelled_split_data(runner, tmp_path, mode):
    # OUT/train/x.png: every reader took train/ for an image folder without class folders and
    # stopped ("out/train holds images but no class folders"), so no command read OUT.
    from PIL import Image

    flat = tmp_path / "flat"
    flat.mkdir()
    for i in range(10):
        Image.new("RGB", (4, 4), (i * 20, 0, 0)).save(flat / f"f{i}.png")
    out = tmp_path / "out"
    split_dataset(flat, out, mode=mode)
    data = open_data(out, allow_unlabelled=True)
    assert (data.kind, data.classes, list(data.splits)) == ("split root", [""], SPLIT_ORDER)
    read = {i: name for name, part in data.splits.items() for i in part.ids}
    assert read == {row["path"]: row["split"] for row in manifest(out)}
    args = ["dataset-stats", str(out), "--split", "all", "-j", "0", "--format", "json"]
    stats = runner.invoke(app, args)
    assert stats.exit_code == 0, stats.stderr
    assert json.loads(stats.stdout)["images"] == 10
    with pytest.raises(InputError, match="is a split of unlabelled images"):
        open_data(out)  # train and eval need labels: one error, not a misread


@pytest.mark.parametrize("mode", ["copy", "symlink"])
def test_the_split_folders_of_an_unlabelled_csv_index_are_a_split_of_flat_images(tmp_path, mode):
    # A CSV index without labels was refused ("label '' cannot be a class folder ... fix the
    # label"): a user with no labels was told to fix one. Its images split as a flat folder's.
    from PIL import Image

    for i in range(10):
        (tmp_path / "images").mkdir(exist_ok=True)
        Image.new("RGB", (4, 4), (i * 20, 0, 0)).save(tmp_path / "images" / f"f{i}.png")
    index = tmp_path / "index.csv"
    index.write_text("path\n" + "".join(f"images/f{i}.png\n" for i in range(10)))
    out = tmp_path / "out"
    split_dataset(index, out, mode=mode)
    rows = manifest(out)
    assert all(row["path"] == f"{row['split']}/{Path(row['source']).name}" for row in rows)
    for row in rows:
        assert (out / row["path"]).read_bytes() == Path(row["source"]).read_bytes()
    data = open_data(out, allow_unlabelled=True)
    assert (data.kind, data.classes, list(data.splits)) == ("split root", [""], SPLIT_ORDER)
    read = {i: name for name, part in data.splits.items() for i in part.ids}
    assert read == {row["path"]: row["split"] for row in rows}


@pytest.mark.parametrize(
    ("names", "shown"), [("tr,va,te", "te/, tr/, va/"), ("train,valid,test", "valid/")]
)
def test_a_split_with_other_names_is_refused_as_data(runner, tmp_path, names, shown):
    # OUT/tr, OUT/va, OUT/te read as an image folder of three classes: train learned which
    # split an image was in, without a word.
    root = make_files(tmp_path / "data", {"a": 6, "b": 6})
    out = tmp_path / "out"
    split_dataset(root, out, names=names.split(","))
    with pytest.raises(InputError, match=re.escape(f"{out} is a split into {shown} (split --")):
        open_data(out)
    result = runner.invoke(app, ["dataset-stats", str(out), "-j", "0"])
    assert result.exit_code == 1 and ERROR_LINE.fullmatch(result.stderr.strip())
    assert "rename them train, val and test" in result.stderr
    standard = tmp_path / "standard"
    split_dataset(root, standard)
    assert open_data(standard).kind == "split root"
    (tmp_path / "classes").mkdir()  # an image folder with a split.csv of its own is no split
    for name in ("tr", "va"):
        shutil.copytree(root / "a", tmp_path / "classes" / name)
    shutil.copy(out / "split.csv", tmp_path / "classes")
    assert open_data(tmp_path / "classes").classes == ["tr", "va"]


def test_a_csv_index_spelling_a_path_with_dot_or_double_slash_splits_it_the_same(tmp_path):
    # `./x/a.png`, `x//a.png` and `x/a.png` name one file; the split hashed the text as written,
    # so the same files landed in other splits.
    make_files(tmp_path / "x", {"a": 10, "b": 10})
    paths = sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / "x").rglob("*.png"))
    spellings = {
        "plain": paths,
        "dot": [f"./{p}" for p in paths],
        "double": [p.replace("/", "//") for p in paths],
        "dot-inside": [p.replace("/", "/./", 1) for p in paths],
    }
    found = {}
    for name, spelled in spellings.items():
        index = tmp_path / f"{name}.csv"
        rows = "".join(
            f"{p},{plain.split('/')[1]}\n" for p, plain in zip(spelled, paths, strict=True)
        )
        index.write_text("path,label\n" + rows)
        split_dataset(index, tmp_path / f"out-{name}", mode="manifest")
        found[name] = [row["split"] for row in manifest(tmp_path / f"out-{name}")]
    assert found["plain"].count("val") == 2
    assert all(splits == found["plain"] for splits in found.values())


def test_manifest_paths_lead_to_the_files_from_an_out_reached_through_a_link(tmp_path):
    # `out` lies two folders down a linked folder: `..` from it leaves the link's target, so
    # the paths spelled from the link pointed nowhere and the split.csv could not be read.
    root = make_files(tmp_path / "data", {"a": 3, "b": 3})
    (tmp_path / "deep" / "er").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "deep" / "er")
    out = tmp_path / "link" / "out"
    split_dataset(root, out, mode="manifest", ratio="1:1")
    rows = manifest(out)
    assert len(rows) == 6
    for row in rows:
        assert (out / row["path"]).read_bytes() == Path(row["source"]).read_bytes()
    assert all(os.path.isfile(p) for p in csv_samples(out / "split.csv").paths)  # as data
    # Without links the paths are spelled as before.
    split_dataset(root, tmp_path / "plain", mode="manifest", ratio="1:1")
    assert manifest(tmp_path / "plain")[0]["path"].startswith("../data/")


def test_root_spelled_with_dotdot_after_a_link_names_the_files_it_lists(tmp_path):
    # `link/../data` is `deep/data` for the system, but was `tmp_path/data` once normalised:
    # symbolic links to files that do not exist (reported as a success), or other files.
    make_files(tmp_path / "deep" / "data", {"a": 2, "b": 2})
    make_files(tmp_path / "data", {"a": 2, "b": 2}, prefix=lambda name, i: f"other_{name}{i}")
    (tmp_path / "deep" / "er").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "deep" / "er")
    root = f"{tmp_path}/link/../data"
    for mode in ("symlink", "copy"):
        split_dataset(root, tmp_path / mode, mode=mode, ratio="1:1")
        rows = manifest(tmp_path / mode)
        assert sorted(Path(r["path"]).name for r in rows) == sorted(
            p.name for p in (tmp_path / "deep" / "data").rglob("*.png")
        )
        for row in rows:
            assert Path(row["source"]).parent.parent == tmp_path / "deep" / "data"
            assert (tmp_path / mode / row["path"]).read_bytes() == Path(row["source"]).read_bytes()
    index = tmp_path / "deep" / "er" / "index.csv"  # `..` in its rows leaves the real folder
    index.write_text("path,label\n../data/a/a_00.png,a\n../data/b/b_00.png,b\n")
    split_dataset(tmp_path / "link" / "index.csv", tmp_path / "csv", ratio="1:1")
    assert {Path(r["source"]).parent.parent for r in manifest(tmp_path / "csv")} == {
        tmp_path / "deep" / "data"
    }


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--ratio", "0.7,0.2"], 2, "adds up to 0.9"),
        (["--ratio", "1"], 2, "two or three parts"),
        (["--ratio", "8:1:1:1"], 2, "two or three parts"),
        (["--ratio", "a:b"], 2, "cannot read --ratio"),
        (["--ratio", "1e100000000:1"], 2, "cannot read --ratio"),  # no 100-million-digit number
        (["--ratio", "1" * 40 + ":1"], 2, "cannot read --ratio"),
        (["--ratio", "8:0:2"], 2, "must be positive"),
        (["--names", "train,val"], 2, "for the 3 splits of --ratio (give one name per split"),
        # The example has as many names as there are splits: `train,val,test` was refused too.
        (["--ratio", "1:1", "--names", "a,b,c"], 2, "e.g. --names train,val)"),
        (["--names", "a,a,b"], 2, "must differ"),
        # The JSON's class objects lost their name, the table had two `total` columns.
        (["--names", "train,name,test"], 2, "'name' cannot be a split name"),
        (["--names", "train,val,total"], 2, "'total' cannot be a split name"),
        (["--mode", "teleport"], 2, "teleport"),
    ],
)
def test_cli_bad_options(runner, tmp_path, args, code, message):
    root = make_files(tmp_path / "data", {"a": 3})
    result = runner.invoke(app, ["split", str(root), str(tmp_path / "out"), *args])
    assert result.exit_code == code, result.stderr
    assert ERROR_LINE.search(result.stderr) and message in result.stderr
    assert not (tmp_path / "out").exists()


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _index_of_a(index: Path, rows: str) -> Path:
    """A CSV index `path,label` with `rows`, beside a file a.png they may list."""
    _write(index.parent / "a.png", "x")
    return _write(index, "path,label\n" + rows)


def _linked_twice(index: Path) -> Path:
    """A CSV index listing one file twice, once through a symbolic link to its folder."""
    _write(index.parent / "d" / "i.csv", "x")
    (index.parent / "link").symlink_to("d", target_is_directory=True)
    return _write(index, "path,label\nd/i.csv,x\nlink/i.csv,y\n")


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda p: p / "missing", "dataset not found"),
        (lambda p: (p / "empty").mkdir() or p / "empty", "no images"),
        (lambda p: _write(p / "i.csv", "file,label\na.png,x\n"), "needs `path` and `label`"),
        (lambda p: _write(p / "i.csv", "path,label\nnope.png,x\n"), "do not exist: nope.png"),
        # a folder is there: "do not exist" misled
        (
            lambda p: _write(p / "sub" / "b.png", "x") and _index_of_a(p / "i.csv", "sub,x\n"),
            "are not files (a folder?): sub",
        ),
        # the data resolver's rule, every command's: one file of two labels is an error
        (lambda p: _index_of_a(p / "i.csv", "a.png,x\n./a.png,y\n"), "'x' in line 2 and 'y' in"),
        # through a linked folder: was split (a move stopped half-way: "disappeared")
        (lambda p: _linked_twice(p / "i.csv"), "same file twice: d/i.csv and link/i.csv"),
        # folders every image-folder reader skips: the class would vanish from the output
        (lambda p: _index_of_a(p / "i.csv", "a.png,.x\n"), "'.x' cannot be a class folder"),
        (lambda p: _index_of_a(p / "i.csv", "a.png,__MACOSX\n"), "'__MACOSX' cannot be"),
    ],
)
def test_cli_bad_input(runner, tmp_path, setup, message):
    (tmp_path / "in").mkdir()  # OUT may not lie in the folder of the images an index names
    result = runner.invoke(app, ["split", str(setup(tmp_path / "in")), str(tmp_path / "out")])
    assert result.exit_code == 1, result.stdout
    assert ERROR_LINE.search(result.stderr) and message in result.stderr
    assert "Traceback" not in result.stderr


def test_non_image_files_and_empty_classes_are_warned(runner, tmp_path, caplog):
    root = make_files(tmp_path / "data", {"a": 3, "b": 3})
    (root / "a" / "labels.txt").write_text("x")
    (root / "empty").mkdir()
    with caplog.at_level(logging.WARNING, logger="torchkit"):
        calls = []
        result = split_dataset(root, tmp_path / "out", progress=lambda d, t: calls.append((d, t)))
    assert "skipped 1 non-image file(s), e.g. a/labels.txt" in caplog.text
    assert "no images are left out: empty" in caplog.text
    assert result.totals == [2, 2, 2] and calls[-1] == (6, 6)
    assert not (tmp_path / "out" / "train" / "empty").exists()


def test_a_listed_file_that_is_no_image_is_left_out_with_a_warning_or_refused_with_strict(
    tmp_path,
):
    """A CSV index listing `notes.txt` with a label: train and dataset-stats skip it as an
    unreadable image, split copied it into OUT/<split>/<class>/ as one. Now it is left out
    (a file PIL opens is an image whatever its name; one named like an image is not opened)."""
    root = make_files(tmp_path / "data", {"a": 3, "b": 3})
    write_image_folder(tmp_path / "png", {"p": 1})
    shutil.copy(tmp_path / "png" / "p" / "p_0.png", root / "scan.dat")
    (root / "notes.txt").write_text("not an image")
    rows = [f"{p.relative_to(root).as_posix()},{p.parent.name}" for p in root.rglob("*.png")]
    index = root / "i.csv"
    index.write_text("path,label\n" + "\n".join([*rows, "notes.txt,a", "scan.dat,b"]) + "\n")
    result = run_torchkit_in_process("split", index, tmp_path / "out", "--mode", "manifest")
    assert result.returncode == 0, result.stderr
    assert f"Warning: {index} lists 1 file(s) that are not images, left out: notes.txt" in (
        result.stderr
    )
    listed = sorted(Path(r["source"]).name for r in manifest(tmp_path / "out"))
    assert len(listed) == 7 and "scan.dat" in listed and "notes.txt" not in listed
    strict = run_torchkit_in_process("split", index, tmp_path / "strict", "--strict")
    assert strict.returncode == 1
    assert error_line(strict.stderr).startswith(
        f"Error: {index} lists 1 file(s) that are not images: notes.txt"
    )
    assert not (tmp_path / "strict").exists()


def test_linked_folders_are_split_and_the_links_left_out_are_warned(tmp_path, caplog):
    """A folder linked inside a class folder (ImageFolder reads its images) was left out of the
    split; now it is split, a loop is not entered, and both are named in warnings with an
    image link to nothing; so are links round a loop or through a file (`a.png/`), which the
    listing passed over unsaid."""
    root = make_files(tmp_path / "data", {"a": 3, "b": 3})
    more = make_files(tmp_path / "elsewhere", {"more": 4})
    (root / "a" / "more").symlink_to(more / "more", target_is_directory=True)
    (root / "a" / "loop").symlink_to("..", target_is_directory=True)
    (root / "b" / "gone.png").symlink_to(tmp_path / "nowhere.png")
    (root / "b" / "self.png").symlink_to("self.png")
    first = sorted((root / "a").iterdir())[0].name
    (root / "b" / "slash.png").symlink_to(f"../a/{first}/")  # 'Not a directory'
    with caplog.at_level(logging.WARNING, logger="torchkit"):
        result = split_dataset(root, tmp_path / "out", mode="manifest")
    assert sum(result.totals) == 10 and result.classes == ["a", "b"]
    assert f"1 linked folder(s) in {root} not entered: " in caplog.text
    assert f"read already: {os.path.join('a', 'loop')}\n" in caplog.text + "\n"
    shown = ", ".join(os.path.join("b", name) for name in ("gone.png", "self.png", "slash.png"))
    assert f"3 image link(s) point nowhere and are left out: {shown}" in caplog.text


def test_many_files_of_one_name_are_named_in_linear_time(monkeypatch):
    """A CSV index of k files all named image.png in one class (`ID/image.png` datasets): each
    takes the next free `image-N.png` without trying every number below it again (k*k/2 tries
    took minutes for 100,000 files). Counted: each try formats the stem into a candidate."""
    from torchkit.core.data.sources.samples import Samples
    from torchkit.core.split.plan import destinations

    tries = 0

    class Stem(str):
        def __format__(self, spec: str) -> str:
            nonlocal tries
            tries += 1
            return str.__format__(self, spec)

    splitext = os.path.splitext
    monkeypatch.setattr(os.path, "splitext", lambda p: (Stem(splitext(p)[0]), splitext(p)[1]))
    k = 300
    paths = [f"/data/{i}/image.png" for i in range(k)]
    samples = Samples(["cat"], [0] * k, paths=paths, ids=paths)
    dests = destinations(samples, [0] * k, ["train"], is_csv=True)
    assert dests == ["train/cat/image.png"] + [f"train/cat/image-{n}.png" for n in range(1, k)]
    assert tries <= 2 * k  # was k * (k - 1) / 2


def test_copy_holds_a_few_copies_in_flight_not_one_future_per_file(tmp_path):
    """--mode copy of a million files held a future per file at once (about 2.6 KB a file in
    all: 2.6 GB at 1M); now a few dozen are in flight, in order, whatever the count."""
    import tracemalloc

    def pairs(folder: Path, n: int) -> tuple[list[str], list[str]]:
        (folder / "in").mkdir(parents=True)
        (folder / "out").mkdir()
        sources = [str(folder / "in" / f"{i}.png") for i in range(n)]
        for source in sources:
            Path(source).write_bytes(b"x")
        return sources, [str(folder / "out" / f"{i}.png") for i in range(n)]

    # Imports and the first thread pool outside the measure, as a long run has paid them: 500
    # files then peak at about 250 bytes a file, where a future per file took about 1,850.
    split_files._copy_all(*pairs(tmp_path / "warm", 40), None)
    n = 500
    sources, targets = pairs(tmp_path / "many", n)
    done = []
    tracemalloc.start()
    try:
        split_files._copy_all(sources, targets, lambda k, total: done.append(k))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sorted(os.listdir(tmp_path / "many" / "out")) == sorted(f"{i}.png" for i in range(n))
    assert done[-1] == n and done == sorted(done)
    assert peak / n < 800, peak


def test_copy_stops_at_the_first_failed_copy_and_starts_no_more(tmp_path, monkeypatch):
    (tmp_path / "out").mkdir()
    sources = [str(tmp_path / f"{i}.png") for i in range(500)]
    for source in sources[:10]:  # the 11th is missing
        Path(source).write_bytes(b"x")
    targets = [str(tmp_path / "out" / f"{i}.png") for i in range(500)]
    with pytest.raises(FileNotFoundError):
        split_files._copy_all(sources, targets, None)
    assert len(os.listdir(tmp_path / "out")) < 100  # not every copy tried


def test_a_large_split_holds_each_path_once_and_writes_split_csv_in_pieces(tmp_path):
    """A split of 200,000 files took about 1.1 KB a file at its peak: every path copied twice
    more (the sources beside the paths read, a key for each), and split.csv rendered whole in
    memory before it was written. About half of that now."""
    import tracemalloc

    n = 3000
    root = make_files(tmp_path / "many", {f"class_{c}": n // 10 for c in range(10)})
    split_dataset(root, tmp_path / "warm", mode="manifest", dedup=False, ratio="1:1")
    # A full collection empties Python's free lists, so that every object made in the window is
    # counted whatever ran before (the same run counted 520-804 a file by the earlier tests'
    # leftovers; 806 after it, the same on the code of before).
    gc.collect()
    tracemalloc.start()  # imports and caches made outside
    try:
        split_dataset(root, tmp_path / "out", mode="manifest", dedup=False, ratio="1:1")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(manifest(tmp_path / "out")) == n
    assert peak / n < 950, peak / n  # was 1,180 at 3,000 files


def test_splits_left_empty_by_groups_of_copies_are_named_in_a_warning(tmp_path, caplog):
    # Each class's 20 files are byte-identical copies, one group kept in one split: val and test
    # got nothing, and the only warning said the classes had "too few images" (20 each).
    root = tmp_path / "copies"
    for name in ("a", "b", "c"):
        (root / name).mkdir(parents=True)
        for i in range(20):
            (root / name / f"{i:02d}.png").write_bytes(f"{name}".encode() * 3)
    with caplog.at_level(logging.WARNING, logger="torchkit"):
        result = split_dataset(root, tmp_path / "out", mode="manifest")
    assert result.counts == [[20, 0, 0]] * 3
    assert "split(s) val, test are empty: no class could spare an image, or a group" in caplog.text


def test_digits_is_refused_with_a_hint_the_user_can_follow(runner, tmp_path, monkeypatch):
    """`split digits OUT` hinted "give the data it came from", which is scikit-learn's: the
    hint names ./digits, which splits a folder named so."""
    monkeypatch.chdir(tmp_path)
    refused = runner.invoke(app, ["split", "digits", "out"])
    assert refused.exit_code == 1
    assert error_line(refused.stderr) == (
        "Error: digits (digits: train, val, test) is split already (`digits` is built in, split "
        "already; ./digits for a folder named so)"
    )
    make_files(tmp_path / "digits", {"a": 5, "b": 5})
    followed = runner.invoke(app, ["split", "./digits", "out"])
    assert followed.exit_code == 0, followed.stderr
    assert (tmp_path / "out" / "train" / "a").is_dir()


@pytest.mark.parametrize("mode", ["copy", "move", "manifest"])
def test_a_folder_whose_image_names_are_all_left_out_is_an_error_as_an_empty_one(tmp_path, mode):
    """Before: a folder whose only image names were a FIFO and a link to nothing split into
    nothing, an empty split.csv and exit 0 (so `split data out && rm -r data` went on), where a
    folder with no images is `Error: no images in DATA`."""
    root = tmp_path / "data"
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    os.mkfifo(root / "a" / "pipe.png")
    (root / "b" / "gone.png").symlink_to(tmp_path / "nowhere.png")
    out = tmp_path / "out"
    result = run_torchkit_in_process("split", root, out, "--mode", mode)
    assert result.returncode == 1
    assert error_line(result.stderr, besides="warnings") == (
        f"Error: no images in {root} that a split can place: every image name in it is a link "
        "to nothing or no regular file (2 names) (the warnings above name them; a split places "
        "regular image files)"
    )
    assert "are left out: a/pipe.png" in result.stderr and "left out: b/gone.png" in result.stderr
    assert not out.exists()
