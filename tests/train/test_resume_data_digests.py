"""The digests of a run's samples that `--resume` compares (core.train.resume_data): what makes
two runs' samples the same, and what each comparison says."""

from __future__ import annotations

import array
import hashlib
import logging
import os
import random
import unicodedata
from pathlib import Path

import pytest

from torchkit.core.data.sources import splitting
from torchkit.core.data.sources.parquet import SPLIT_KEYWORDS
from torchkit.core.data.sources.samples import Samples
from torchkit.core.io.errors import CheckpointError
from torchkit.core.train import resume_data
from torchkit.core.train.resume_data import (
    AS_A_SET,
    IN_ORDER,
    check_resumed_samples,
    sample_digests,
)

CLASSES = ["ant", "bee"]
IDS = ["ant/a.png", "ant/b.png", "bee/c.png", "bee/d.png"]
LABELS = [0, 0, 1, 1]


def samples(ids=IDS, labels=LABELS, root="/data", *, named=True) -> Samples:
    paths = [f"{root}/{ident}" for ident in ids]
    return Samples(list(CLASSES), list(labels), paths=paths, ids=list(ids) if named else [])


def digests(ids=IDS, labels=LABELS, root="/data", splits=("train", "val")) -> dict[str, str]:
    return sample_digests({split: samples(ids, labels, root) for split in splits})


def test_each_split_is_digested_train_in_order_the_others_as_sets():
    found = digests(splits=("train", "val", "test"))
    assert set(found) == {"train", "val", "test"}
    assert found["train"].startswith(IN_ORDER)
    assert found["val"].startswith(AS_A_SET) and found["test"].startswith(AS_A_SET)


def test_the_same_names_under_another_root_are_the_same_samples():
    """A run moved to another machine or mount point: the ids are relative to the data root."""
    assert digests(root="/data") == digests(root="/mnt/elsewhere/data")


def test_another_file_or_label_is_other_samples():
    base = digests()
    other_file = digests(ids=[*IDS[:3], "bee/e.png"])
    relabelled = digests(labels=[0, 1, 1, 1])  # ant/b.png labelled bee in an index
    for other in (other_file, relabelled):
        assert other["train"] != base["train"] and other["val"] != base["val"]


def test_another_order_is_other_training_batches_but_the_same_validation_images():
    base = digests()
    reversed_ = digests(ids=IDS[::-1], labels=LABELS[::-1])
    assert reversed_["train"] != base["train"]
    assert reversed_["val"] == base["val"]


def test_a_name_listed_twice_makes_one_set_in_any_order():
    ids, labels = ["a.png", "a.png", "b.png"], [0, 1, 1]
    ours = sample_digests({"val": samples(ids, labels)})
    theirs = sample_digests({"val": samples(ids[::-1], labels[::-1])})
    assert ours == theirs
    assert ours == sample_digests({"val": samples(ids, [1, 0, 1])})  # the same pairs
    assert ours != sample_digests({"val": samples(ids, [1, 1, 1])})


def test_names_are_compared_as_the_same_file_however_spelled():
    """A CSV index's `./ant/a.png` or `ant//a.png` names ant/a.png; a folder listed on macOS
    (NFD accents) names the file a Linux listing names in NFC."""
    accented = ["caf\u00e9/a.png", *IDS[1:]]
    decomposed = [unicodedata.normalize("NFD", accented[0]), *IDS[1:]]
    assert digests(ids=accented) == digests(ids=decomposed)
    assert digests(ids=["./ant/a.png", "ant//b.png", *IDS[2:]]) == digests()


def test_names_are_told_apart_where_they_end():
    """Names end where they end: `ab` + `c` is not `a` + `bc`."""
    assert digests(ids=["ab", "c", "d", "e"]) != digests(ids=["a", "bc", "d", "e"])


def test_a_name_of_bytes_that_are_not_utf8_is_digested():
    odd = ["ant/\udcff.png", *IDS[1:]]  # os.fsdecode's surrogate of byte 0xff
    assert digests(ids=odd) != digests()


def below_their_folder(
    keys: list[str], split: str | None = None, labels: list[int] | None = None
) -> list[str]:
    """`keys` less the folders every one of them begins with, counted part by part, but the
    last of them where it is named for `split` (parquet's split keywords, any case), or the
    one before the last (v3's: where all `labels` are one, a split of one class in its class
    folder; `labels` None: whatever the classes, v4's)."""
    folders = [key.split("/")[:-1] for key in keys]
    depth = 0
    while folders and all(len(parts) > depth for parts in folders):
        if len({parts[depth] for parts in folders}) > 1:
            break
        depth += 1
    if depth and split and SPLIT_KEYWORDS.get(folders[0][depth - 1].lower()) == split:
        depth -= 1
    elif (
        depth > 1
        and split
        and SPLIT_KEYWORDS.get(folders[0][depth - 2].lower()) == split
        and (labels is None or len(set(labels)) == 1)
    ):
        depth -= 2
    cut = sum(len(part) + 1 for part in folders[0][:depth]) if depth else 0
    return [key[cut:] for key in keys]


def reference(
    ids: list[str],
    labels: list[int],
    *,
    as_a_set: bool,
    version: int = 4,
    split: str = "",
    first: bool = False,
) -> str:
    """The digest as the docstrings define it, made the slow way: each name's `path_key` (the
    absolute ones first less the folders all the absolute ones begin with), less the folders
    all of the split's begin with (not `version` 1's: names from the data root), but from
    `version` 3 on the last of them where it is named for `split` (`val/`), or the one before
    it (`val/images/`; v3's for a split of one class only, `val/ant/`); sorted by key then
    label for a set; SHA-256 of the count, each key ended by NUL, the labels as int64.
    `first`: as `version` was first made: v1's absolute names whole, v3's folder before the
    last never kept."""
    kept = split if version >= 3 else None
    rule = ([] if first else list(labels)) if version == 3 else None
    keys = [splitting.path_key(ident) for ident in ids]
    absolute = [at for at, key in enumerate(keys) if key.startswith("/") and not first]
    relative = below_their_folder([keys[at] for at in absolute], kept, rule)
    for at, key in zip(absolute, relative, strict=True):
        keys[at] = key
    below = keys if version == 1 else below_their_folder(keys, kept, rule)
    pairs = list(zip(below, labels, strict=True))
    if as_a_set:
        pairs.sort()
    hashed = hashlib.sha256(len(pairs).to_bytes(8, "little"))
    hashed.update("".join(key + "\0" for key, _ in pairs).encode("utf-8", "surrogatepass"))
    hashed.update(array.array("q", [label for _, label in pairs]).tobytes())
    return hashed.hexdigest()


NAMES = [
    ["ant/a.png", "ant/b.png", "bee/c.png"],  # a folder's listing: its own keys, sorted
    ["b/x.png", "a/y.png", "c/z.png"],  # an index's order
    ["./a.png", "b//c.png", "d/./e.png", "f/", "g/.", "h/.i/j.png", ".k", "l/..", "../m.png"],
    ["caf\u00e9/a.png", "cafe\u0301/b.png", "\udcff/c.png", "d\udcfe.png"],  # NFD, not UTF-8
    ["", ".", "a.png", "a.png"],  # odd names, one twice
    ["/data/imgs/ant/a.png", "/data/imgs/bee/b.png", "/data/imgs/ant/c.png"],  # absolute
    ["/data/imgs//ant/a.png", "/data/./imgs/bee/b.png"],  # absolute, respelled
    ["/data/imgs/ant/a.png"],  # one: below its own folder
    ["/data/imgs/ant/a.png", "bee/b.png", "/data/imgs/cat/c.png"],  # both kinds
    ["val/ant/a.png", "val/bee/b.png", "val/bee/c.png"],  # a split folder's
    ["data/val/ant/a.png", "data/val/bee/b.png"],  # an index's beside that folder
    ["./data/val/ant/a.png", "data//val/bee/b.png", "data/val/./bee/c.png"],  # respelled
    ["a/b/x.png", "a/c/y.png", "a/b/z.png"],  # the first and the last share more than all
    ["caf\u00e9/a.png", "cafe\u0301/b.png"],  # one folder in two spellings
    ["val/ant/a.png", "val/ant/a.png", "val/ant/b.png"],  # one folder's, a name twice
    ["val/images/1.png", "val/images/2.png", "val/images/3.png"],  # an index's flat val/
    ["a/", "a/b.png"],  # a name that is its folder
    ["val/ant/1.png", "val/anteater/2.png", "val/ants.png"],  # a shared prefix, no folder
    ["val/ant/1.png"],  # one image: below its own folder
    [],  # an empty split
    ["data/test/ant/a.png", "data/test/bee/b.png"],  # another split's folder beside it
    ["train/ant/a.png", "train/bee/b.png"],
    ["val/test/1.png", "val/test/2.png"],  # one class, named like a split
    ["val/ant/1.png", "val/ant/2.png", "val/ant/3.png"],  # (labelled as) one class
    ["/mnt/data/val/ant/a.png", "/mnt/data/val/ant/b.png"],  # absolute, one class
    ["val/a.png", "val/b.png"],  # a split folder of images, no class folders
    ["data/Validation/ant/a.png", "data/Validation/bee/b.png"],  # a parquet folder's alias
    ["/mnt/data/val/ant/a.png", "/mnt/data/val/bee/b.png"],  # absolute, in a split folder
    ["/mnt/data/val/ant/a.png", "val/bee/b.png", "/mnt/data/val/cat/c.png"],  # both kinds
    ["a/val/val/x.png", "a/val/q.png", "a/val/val/y.png"],  # first and last share a val/ more
    ["./data//val/ant/a.png", "data/val/./bee/b.png"],  # respelled, in a split folder
    [f"part-{n // 7:06d}.tar/{n:05d}.jpg" for n in range(66_000)],  # past a chunk of names
]

# Those of NAMES labelled as one class (the others' labels are of three).
ONE_CLASS = [
    ["val/ant/1.png"],
    ["val/ant/1.png", "val/ant/2.png", "val/ant/3.png"],
    ["/mnt/data/val/ant/a.png", "/mnt/data/val/ant/b.png"],
]


@pytest.mark.parametrize("ids", NAMES, ids=range(len(NAMES)))
def test_each_listing_is_digested_as_defined_however_its_names_are_read(ids):
    """The quick pass over names that are their own keys, in order or sorted, and the keys
    made one by one give the digest as defined (a checkpoint's records compare with any)."""
    labels = [n % 3 for n in range(len(ids))]
    if ids in ONE_CLASS:
        labels = [0] * len(ids)
    shuffled = list(range(len(ids)))
    random.Random(len(ids)).shuffle(shuffled)
    for names, marks in (
        (ids, labels),
        ([ids[i] for i in shuffled], [labels[i] for i in shuffled]),
    ):
        found = sample_digests(
            {
                split: Samples(["a", "b", "c"], marks, ids=names)
                for split in ("train", "val", "test")
            }
        )
        assert found["train"] == IN_ORDER + reference(names, marks, as_a_set=False, split="train")
        for split in ("val", "test"):
            assert found[split] == AS_A_SET + reference(names, marks, as_a_set=True, split=split)


@pytest.mark.parametrize("ids", NAMES, ids=range(len(NAMES)))
@pytest.mark.parametrize("version", [1, 2, 3])
def test_a_listing_is_digested_as_an_earlier_version_made_it_for_its_checkpoints(ids, version):
    """A checkpoint of v1's digests (names from the data root), v2's (below their split's
    folder, a split root's `val/` cut off too) or v3's (`val/` kept, but cut off before a
    folder of images of more than one class: `val/images/`) is held to them: the data is
    digested as that version made them, however its names are read."""
    labels = [n % 3 for n in range(len(ids))]
    if ids in ONE_CLASS:
        labels = [0] * len(ids)
    shuffled = list(range(len(ids)))
    random.Random(len(ids)).shuffle(shuffled)
    for names, marks in (
        (ids, labels),
        ([ids[i] for i in shuffled], [labels[i] for i in shuffled]),
    ):
        split = Samples(["a", "b", "c"], marks, ids=names)
        in_order, as_a_set = f"ids-in-order-v{version}:", f"ids-as-set-v{version}:"
        assert resume_data._earlier_digest(in_order, split, "train") == (
            in_order + reference(names, marks, as_a_set=False, version=version, split="train")
        )
        assert resume_data._earlier_digest(as_a_set, split, "val") == (
            as_a_set + reference(names, marks, as_a_set=True, version=version, split="val")
        )
    assert resume_data._earlier_digest("ids-as-set-v0:", split) is None
    assert resume_data._earlier_digest(AS_A_SET, split) is None  # this version's own


def test_names_that_are_their_own_keys_are_not_respelled_one_by_one(monkeypatch):
    """A listing of a million names took as long again making each one's key, and held a
    second list of them: names already spelled as keys are digested as they are."""

    def respelled(ident: str) -> str:
        raise AssertionError(f"{ident} respelled")

    monkeypatch.setattr(splitting, "path_key", respelled)
    monkeypatch.setattr(resume_data, "path_key", respelled)
    ids = [f"n{n // 100:04d}/{n:06d}.JPEG" for n in range(1000)]
    found = sample_digests({"train": samples(ids, [0] * 1000), "val": samples(ids, [1] * 1000)})
    assert set(found) == {"train", "val"}
    absolute = [f"/datasets/x/{ident}" for ident in ids]
    assert sample_digests({"train": samples(absolute, [0] * 1000)}) == {"train": found["train"]}
    in_a_split_folder = [f"train/{ident}" for ident in ids]  # cut off in C too
    assert sample_digests({"val": samples(in_a_split_folder, [1] * 1000)}) == {"val": found["val"]}
    in_val = sample_digests({"val": samples([f"val/{ident}" for ident in ids], [1] * 1000)})
    beside = [f"data/val/{ident}" for ident in ids]  # `data/` cut off, `val/` kept, in C too
    assert sample_digests({"val": samples(beside, [1] * 1000)}) == in_val != {"val": found["val"]}


def test_an_index_of_absolute_paths_rewritten_for_another_place_is_the_same_samples():
    """The images moved to another disk, their index's absolute paths rewritten for it: the
    paths count from the folder all of them lie in, as a folder's from its root."""
    here = [f"/data/imgs/{ident}" for ident in IDS]
    there = [f"/mnt/disk2/imgs/{ident}" for ident in IDS]
    assert digests(ids=here, root="") == digests(ids=there, root="") == digests()
    other = [*here[:3], "/data/elsewhere/bee/d.png"]  # another image of that name
    assert digests(ids=other, root="")["val"] != digests(ids=here, root="")["val"]


def test_names_count_from_the_folder_all_of_the_splits_names_lie_in():
    """A split folder's `val/ant/a.png` is `data/val/ant/a.png` of an index beside the folder
    (and of one inside it, `val/ant/a.png`): the same files below the folder they share."""
    base = digests(ids=[f"val/{ident}" for ident in IDS])
    for folder in ("data/val/", "../data/val/", "./data//val/", "/mnt/data/val/"):
        assert digests(ids=[folder + ident for ident in IDS]) == base, folder
    val = [f"data/val/{ident}" for ident in IDS]
    other = [*val[:3], "data/test/bee/d.png"]  # one of them in another folder
    assert digests(ids=other)["val"] != digests(ids=val)["val"]
    moved = [*val[:3], "data/val/bee/e.png"]  # another file
    assert digests(ids=moved)["val"] != base["val"]
    # a folder of images named for no split, or for another one (the image folder `train/`
    # a run held validation images out of), is cut off as any other
    for folder in ("images/", "data/train/"):
        assert digests(ids=[folder + ident for ident in IDS])["val"] == digests()["val"]


def test_a_split_roots_val_and_test_images_named_alike_are_other_images():
    """Numbered per split, a split root's `val/ant/0001.png` and `test/ant/0001.png` are
    other files: an index beside the root whose val rows point at `test/` holds other
    validation images (below the folder each split's names share they were named alike)."""
    val = digests(ids=[f"val/{ident}" for ident in IDS], splits=("val", "test"))
    for folder in ("test/", "data/test/", "/mnt/data/test/", "data/train/", "data/valid/"):
        elsewhere = digests(ids=[folder + ident for ident in IDS], splits=("val",))
        assert elsewhere["val"] != val["val"], folder
    test = digests(ids=[f"test/{ident}" for ident in IDS], splits=("test",))
    assert test["test"] != val["test"]  # and the test digest of each is the other's
    assert digests(ids=[f"data/test/{ident}" for ident in IDS], splits=("test",)) == test
    # the training images as well: `data/train/` and `data/val/` are other folders for them
    train = digests(ids=[f"train/{ident}" for ident in IDS], splits=("train",))
    assert digests(ids=[f"data/train/{ident}" for ident in IDS], splits=("train",)) == train
    assert digests(ids=[f"data/val/{ident}" for ident in IDS], splits=("train",)) != train


def test_an_indexs_flat_val_and_test_folders_named_alike_are_other_images(caplog):
    """An index of a flat layout (`val/images/0001.png`, labels in the index, more than one
    class): its val rows pointed at `test/images/` of the same names and labels are other
    validation images. Both were `0001.png` below the folder the split's names share, and the
    run resumed validating on the test images without a word; `val/ant/` was caught."""
    flat = [f"images/{n:04d}.png" for n in range(4)]
    val = digests(ids=[f"data/val/{ident}" for ident in flat], splits=("val",))
    for folder in ("data/test/", "test/", "data/train/", "data/"):
        elsewhere = digests(ids=[folder + ident for ident in flat], splits=("val",))
        assert elsewhere["val"] != val["val"], folder
    # the same images through the index inside data/, or of absolute paths: the same
    for folder in ("val/", "/mnt/data/val/"):
        assert digests(ids=[folder + ident for ident in flat], splits=("val",)) == val, folder

    # A checkpoint of v3's digests (which cut off val/images/ whole) of the run's own data
    # resumes silently, compared as v3 made them.
    ids = [f"data/val/{ident}" for ident in flat]
    splits = {name: samples(ids, LABELS, "/data") for name in ("train", "val")}
    v3 = {
        name: f"{made}v3:" + reference(ids, LABELS, as_a_set=name == "val", version=3, split=name)
        for name, made in (("train", "ids-in-order-"), ("val", "ids-as-set-"))
    }
    v4 = reference(ids, LABELS, as_a_set=True, version=4, split="val")
    assert v3["val"] != "ids-as-set-v3:" + v4
    with caplog.at_level(logging.DEBUG, logger="torchkit"):
        check_resumed_samples(
            record(v3), sample_digests(splits), SIZES, Path("/runs/a/last.pt"), splits
        )
    assert caplog.records == []


def test_a_class_folder_named_like_a_split_is_the_same_from_the_folder_and_an_index():
    """A split's only class named like a split (`val/test/1.png`, or `val/val/1.png`): the
    folder and an index beside it name it alike still."""
    for inside in ("test", "val", "train", "Validation"):
        ids = [f"{inside}/{n}.png" for n in range(4)]
        splits = ("train", "val", "test")
        folder = digests(ids=[f"val/{ident}" for ident in ids], splits=splits)
        beside = digests(ids=[f"data/val/{ident}" for ident in ids], splits=splits)
        absolute = digests(ids=[f"/d/val/{ident}" for ident in ids], splits=splits)
        assert folder == beside == absolute, inside


def test_a_split_of_one_image_is_its_file_name_and_label():
    """The folder a split of one image lies in is its own: moved, or reached from another
    folder, it is the same sample; another name or label is another."""
    one = digests(ids=["val/ant/a.png"], labels=[0])
    assert digests(ids=["data/val/ant/a.png"], labels=[0]) == one
    assert digests(ids=["/mnt/data/val/ant/a.png"], labels=[0]) == one
    # the folder named for the split is kept before its class folder: not test/'s of its name
    assert digests(ids=["test/ant/a.png"], labels=[0])["val"] != one["val"]
    assert digests(ids=["a.png"], labels=[0])["train"] == one["train"]
    assert digests(ids=["val/ant/b.png"], labels=[0])["val"] != one["val"]
    assert digests(ids=["val/ant/a.png"], labels=[1])["val"] != one["val"]


def test_a_windows_split_folder_and_an_index_beside_it_are_the_same_samples(monkeypatch):
    # where the separator is `\`, the folder's names are spelled with it, an index's with `/`
    ours = digests(ids=[f"val/{ident}" for ident in IDS])
    monkeypatch.setattr(os, "sep", "\\")
    for spelled in ("val\\{}", "data/val/{}", "C:\\data\\val\\{}", ".\\data\\val/{}"):
        names = [spelled.format(ident.replace("/", "\\")) for ident in IDS]
        assert digests(ids=names) == ours, spelled


def test_samples_without_names_have_no_digest():
    assert sample_digests({"train": samples(named=False)}) == {}


def record(found: dict[str, str] | None, sizes=None) -> dict:
    data = {"version": 1, "sizes": sizes or {"train": 4, "val": 4}}
    if found is not None:
        data["digests"] = found
    return data


SIZES = {"train": 4, "val": 4}


def check(recorded: dict, ours: dict, sizes=SIZES, run: Path = Path("/runs/a/last.pt")):
    check_resumed_samples(recorded, ours, sizes, run)


def test_other_validation_images_are_refused_naming_the_way_on(tmp_path, caplog):
    (tmp_path / "split.csv").write_text("path,label,split\n")
    run = tmp_path / "last.pt"
    with pytest.raises(CheckpointError) as refused:
        check(record(digests()), digests(labels=[0, 1, 1, 1]), run=run)
    assert "the data's 4 validation images are not those the run was validated on" in str(
        refused.value.message
    )
    hint = refused.value.hint
    assert f"which {tmp_path / 'split.csv'} lists" in hint and f"--weights {run}" in hint


def test_other_training_images_are_one_warning(caplog):
    ours = digests()
    ours["train"] = digests(ids=IDS[::-1], labels=LABELS[::-1])["train"]
    with caplog.at_level(logging.WARNING, logger="torchkit"):
        check(record(digests()), ours)
    (warning,) = caplog.records
    message = warning.getMessage()
    assert message.startswith("the data's 4 training images are not those the run started with")
    assert "to continue it exactly" in message and "split.csv" not in message  # none beside


def test_the_same_samples_say_nothing(caplog):
    with caplog.at_level(logging.DEBUG, logger="torchkit"):
        check(record(digests()), digests(root="/elsewhere"))
    assert caplog.records == []


def test_a_checkpoint_without_digests_resumes_as_before(caplog):
    with caplog.at_level(logging.DEBUG, logger="torchkit"):
        check(record(None), digests(labels=[1, 1, 0, 0]))
        check({}, digests())
        check(None, digests())
    assert caplog.records == []


def test_digests_made_another_way_are_not_compared(caplog):
    theirs = {name: "ids-in-order-v0:" + "0" * 64 for name in ("train", "val")}
    with caplog.at_level(logging.DEBUG, logger="torchkit"):
        check(record(theirs), digests())
    assert caplog.records == []


def test_digests_v1_made_are_compared_as_v1_made_them(caplog):
    """Not compared, a checkpoint of v1's digests resumed on other validation images, recorded
    theirs and validated on them from then on; the same data (named from its root as v1 named
    it) says nothing."""
    val = [f"val/{ident}" for ident in IDS]
    splits = {name: samples(val, LABELS, "/data") for name in ("train", "val")}
    v1 = {
        "train": "ids-in-order-v1:" + reference(val, LABELS, as_a_set=False, version=1),
        "val": "ids-as-set-v1:" + reference(val, LABELS, as_a_set=True, version=1),
    }
    ours = sample_digests(splits)
    with caplog.at_level(logging.DEBUG, logger="torchkit"):
        check_resumed_samples(record(v1), ours, SIZES, Path("/runs/a/last.pt"), splits)
    assert caplog.records == []
    relabelled = {name: samples(val, [0, 1, 1, 1], "/data") for name in ("train", "val")}
    with pytest.raises(CheckpointError, match="4 validation images are not those"):
        check_resumed_samples(
            record(v1), sample_digests(relabelled), SIZES, Path("/runs/a/last.pt"), relabelled
        )
    elsewhere = {name: samples([f"data/{ident}" for ident in val]) for name in ("train", "val")}
    with pytest.raises(CheckpointError):  # below another folder: v1 named them otherwise
        check_resumed_samples(
            record(v1), sample_digests(elsewhere), SIZES, Path("/runs/a/last.pt"), elsewhere
        )


@pytest.mark.parametrize(
    ("ids", "labels", "held_out_of"),
    [
        (["val/ant/1.png", "val/ant/2.png", "val/ant/3.png", "val/ant/4.png"], [0] * 4, None),
        (["val/ant/1.png", "val/ant/2.png", "val/bee/3.png", "val/bee/4.png"], LABELS, "all"),
    ],
    ids=["split-root-val-of-one-class", "index-in-a-folder-named-val"],
)
def test_digests_v3_made_as_first_made_are_compared_as_made(ids, labels, held_out_of, caplog):
    """torchkit's first v3 digests (commits 32a1d1f2 to f75a73bd, the same prefixes) kept a
    folder named for the split only where it was the last all of the split's names lie in,
    and whatever the layout: a split root's val/ of one class was cut off whole, an index's
    held-out images kept val/. Their checkpoints were refused on their own data ("not those
    the run was validated on"), or warned of other training images; other data still is."""
    splits = {name: samples(ids, labels, "/data") for name in ("train", "val")}
    first = {
        name: f"{made}v3:"
        + reference(ids, labels, as_a_set=name == "val", version=3, split=name, first=True)
        for name, made in (("train", "ids-in-order-"), ("val", "ids-as-set-"))
    }
    ours = sample_digests(splits, held_out_of)
    with caplog.at_level(logging.DEBUG, logger="torchkit"):
        check_resumed_samples(
            record(first), ours, SIZES, Path("/runs/a/last.pt"), splits, held_out_of
        )
    assert caplog.records == []
    relabelled = {name: samples(ids, [1, 1, 0, 0], "/data") for name in ("train", "val")}
    with pytest.raises(CheckpointError, match="4 validation images are not those"):
        check_resumed_samples(
            record(first),
            sample_digests(relabelled, held_out_of),
            SIZES,
            Path("/runs/a/last.pt"),
            relabelled,
            held_out_of,
        )


def test_digests_v1_made_as_first_made_are_compared_as_made(caplog):
    """torchkit's first v1 digests (commit 308accd9, the same prefixes) named an index's
    absolute paths whole: its checkpoints were refused on their own index ("not those the run
    was validated on"); other data still is."""
    ids = [f"/data/imgs/{ident}" for ident in IDS]
    splits = {name: samples(ids, LABELS, "") for name in ("train", "val")}
    first = {
        name: f"{made}v1:" + reference(ids, LABELS, as_a_set=name == "val", version=1, first=True)
        for name, made in (("train", "ids-in-order-"), ("val", "ids-as-set-"))
    }
    assert first["val"] != "ids-as-set-v1:" + reference(ids, LABELS, as_a_set=True, version=1)
    with caplog.at_level(logging.DEBUG, logger="torchkit"):
        check_resumed_samples(record(first), sample_digests(splits), SIZES, RUN, splits)
    assert caplog.records == []
    other = {name: samples(ids, [1, 1, 0, 0], "") for name in splits}
    with pytest.raises(CheckpointError, match="4 validation images are not those"):
        check_resumed_samples(record(first), sample_digests(other), SIZES, RUN, other)


RUN = Path("/runs/a/last.pt")


def test_another_number_of_images_is_left_to_the_size_warnings(caplog):
    """Another number of training images is `_train_size_changed`'s warning; another number of
    validation images is one warning of its own, never the refusal of other images."""
    sizes = {"train": 5, "val": 5}
    with caplog.at_level(logging.WARNING, logger="torchkit"):
        check(record(digests()), digests(ids=[*IDS, "bee/e.png"], labels=[*LABELS, 1]), sizes)
    (warning,) = caplog.records
    assert warning.getMessage().startswith(
        "the checkpoint was validated on 4 images, the data has 5: the run continues"
    )


def test_the_test_split_is_recorded_but_never_compared(caplog):
    """Nothing of the run so far was measured on the test split: other test images are no
    reason to stop or warn."""
    recorded = record(digests(splits=("train", "val", "test")))
    ours = digests(splits=("train", "val"))
    ours["test"] = digests(labels=[1, 1, 0, 0], splits=("test",))["test"]
    assert ours["test"] != recorded["digests"]["test"]
    with caplog.at_level(logging.DEBUG, logger="torchkit"):
        check(recorded, ours, {**SIZES, "test": 4})
    assert caplog.records == []


def test_a_split_the_data_did_not_make_keeps_no_folder_named_for_it():
    """Held out of a split root's train split (`held_out_of` "train"), a val split's images
    lie in train's folder, and unsplit data ("all") has no split folders: a folder of theirs
    named for a split (an image folder `val/` named so by an index beside it) is cut off."""
    named = ["val/ant/a.png", "val/bee/b.png"]
    plain = ["ant/a.png", "bee/b.png"]

    def made(ids, held_out_of=None):
        return sample_digests(
            {split: samples(ids, [0, 1]) for split in ("train", "val")}, held_out_of
        )

    assert made(named)["val"] != made(plain)["val"]  # a split root's val/ (kept)
    assert made(named, "train")["val"] == made(plain, "train")["val"]
    assert made(named, "all") == made(plain, "all")
    train = ["train/ant/a.png", "train/bee/b.png"]
    assert made(train, "train")["train"] != made(plain, "train")["train"]  # train/ kept
    assert made(train, "all")["train"] == made(plain, "all")["train"]
