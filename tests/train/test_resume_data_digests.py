"""The digests of a run's samples that `--resume` compares (core.train.resume_data): what makes
two runs' samples the same, and what each comparison says."""

from __future__ import annotations

import logging
import unicodedata
from pathlib import Path

import pytest

from torchkit.core.data.sources.samples import Samples
from torchkit.core.io.errors import CheckpointError
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
