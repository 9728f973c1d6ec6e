"""Class names read from metadata, not from a file of names (test_shards_read and
test_eval_class_names hold those): a ClassLabel name that is no name (null, true, a list) was
made one by str() (class "None"), a class no data can name, printed as if the dataset named it;
two names a shard gives one class index, `cat` and `cat `, were two classes."""

from __future__ import annotations

import io
import json
import re
import tarfile
import unicodedata

import pytest
from output_checks import error_line
from parquet_files import hf_features, png, write_parquet
from processes import run_torchkit_in_process

HINT = "(give every class a name in the ClassLabel feature of the dataset's metadata)"


@pytest.mark.parametrize(("name", "shown"), [(None, "null"), (True, "true"), (["a"], '["a"]')])
def test_a_classlabel_name_that_is_no_name_is_one_error_line_naming_the_file_and_class(
    tmp_path, name, shown
):
    data = write_parquet(tmp_path / "d.parquet", [png(0), png(1)], [0, 1], names=["a", name])
    result = run_torchkit_in_process("dataset-stats", data, "-j", "0")
    assert result.returncode == 1
    assert error_line(result.stderr, besides="nothing") == (
        f"Error: the ClassLabel names of {data} give class 1 {shown}, not a name {HINT}"
    )


def test_dataset_info_json_names_are_held_to_the_same_rule_and_numbers_stay_names(tmp_path):
    """HF's save_to_disk writes the names to ROOT/dataset_info.json, read where the parquet
    schema names none; a number is a name as HF's int2str makes it (str)."""
    root = tmp_path / "ds"
    write_parquet(root / "train.parquet", [png(0), png(1)], [0, 1], names=None)
    info = root / "dataset_info.json"
    features = hf_features(["a", None])
    info.write_text(json.dumps({"features": features}), encoding="utf-8")
    result = run_torchkit_in_process("dataset-stats", root, "-j", "0")
    assert result.returncode == 1
    assert error_line(result.stderr, besides="nothing") == (
        f"Error: the ClassLabel names of {info} give class 1 null, not a name {HINT}"
    )
    info.write_text(json.dumps({"features": hf_features(["a", 7])}), encoding="utf-8")
    result = run_torchkit_in_process("dataset-stats", root, "-j", "0", "--format", "json")
    assert result.returncode == 0, result.stderr
    assert [row["name"] for row in json.loads(result.stdout)["classes"]] == ["a", "7"]


def _shard(path, labels: list[tuple[str, int | None]]):
    """A WebDataset shard of one tiny PNG per (KEY.json "label", KEY.cls) pair (no KEY.cls for
    an index None)."""
    with tarfile.open(path, "w") as tar:
        for i, (name, index) in enumerate(labels):
            for member, data in (
                (f"s{i}.png", png(i)),
                *([] if index is None else [(f"s{i}.cls", str(index).encode())]),
                (f"s{i}.json", json.dumps({"label": name}).encode()),
            ):
                info = tarfile.TarInfo(member)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize(
    ("twin", "how"),
    [
        ("cat ", "the spaces around them"),
        (unicodedata.normalize("NFD", "café"), "Unicode spelling"),
    ],
)
def test_two_names_of_one_shard_class_index_that_look_alike_are_one_error_line(tmp_path, twin, how):
    """`cat` and `cat ` (KEY.cls 0 both) were classes 0 and 1, dog (KEY.cls 1) class 2: each
    later class an output further than the shards say, and two outputs that print alike."""
    from torchkit.core.data.sources import open_data
    from torchkit.core.io.errors import InputError

    first = unicodedata.normalize("NFC", twin.strip())
    shard = _shard(tmp_path / "s-000000.tar", [(first, 0), ("dog", 1), (twin, 0)])
    with pytest.raises(InputError) as raised:
        open_data(str(shard))
    assert str(raised.value) == (
        f"sample s2 in s-000000.tar names class index 0 {twin!r}, and sample s0 in "
        f"s-000000.tar {first!r}: one class would be two whose names differ only by {how} "
        "(give the samples of one class one name in KEY.json)"
    )


def test_other_names_of_one_shard_class_index_stay_apart(tmp_path):
    """A fine label beside a coarse index (apple and pear, KEY.cls 0) is no typo: the names
    are the classes, sorted, as before."""
    from torchkit.core.data.sources import open_data

    shard = _shard(tmp_path / "s-000000.tar", [("pear", 0), ("apple", 0), ("tulip", 1)])
    source = open_data(str(shard))
    assert source.classes == ["apple", "pear", "tulip"]
    assert source.whole.labels == [1, 0, 2]


COMPOSED, DECOMPOSED = "caf\u00e9", "cafe\u0301"  # café as typed, and as macOS names files
SPELLINGS = "are one name in two Unicode spellings (composed and decomposed accents)"


def test_shard_class_names_in_two_unicode_spellings_are_one_error_line(tmp_path):
    """Names in KEY.json alone (no KEY.cls) are the classes, sorted: `café` composed in one
    sample and decomposed in another were two classes that print alike, where two such class
    folders or CSV labels are refused. So are they here, through the same rule; and where
    each name has its own KEY.cls index."""
    shard = _shard(tmp_path / "s-000000.tar", [(COMPOSED, None), ("tea", None), (DECOMPOSED, None)])
    result = run_torchkit_in_process("dataset-stats", shard, "-j", "0")
    assert result.returncode == 1
    assert error_line(result.stderr, besides="nothing") == (
        f"Error: labels of {shard}: {ascii(DECOMPOSED)} and {ascii(COMPOSED)} {SPELLINGS} "
        "(rename one to the other's spelling: torchkit reads them as one class)"
    )
    from torchkit.core.data.sources import open_data
    from torchkit.core.io.errors import InputError

    indexed = _shard(tmp_path / "i-000000.tar", [(COMPOSED, 0), ("tea", 1), (DECOMPOSED, 2)])
    with pytest.raises(InputError, match=f"^labels of {indexed}: .* {re.escape(SPELLINGS)}"):
        open_data(str(indexed))


def test_one_name_in_two_spellings_in_two_split_shards_is_one_class(tmp_path):
    """As in a CSV index's splits: val's `café` in another spelling than train's is train's
    class (`find_class`), not refused."""
    from torchkit.core.data.sources import open_data

    folder = tmp_path / "split"
    folder.mkdir()
    _shard(folder / "train-000000.tar", [(COMPOSED, None), ("tea", None)])
    _shard(folder / "val-000000.tar", [(DECOMPOSED, None), ("tea", None)])
    source = open_data(str(folder))
    assert source.classes == [COMPOSED, "tea"]
    assert source.splits["val"].labels == [0, 1]
