"""Class names given twice exactly, as torchvision's ImageNet names give `crane` to classes 134
and 517: every reader takes them where labels are class indices (`KEY.cls` beside shards,
parquet's ClassLabel) and refuses a label given by such a name alone, naming the sample, the
name and both indices; eval's reports say which of the two a `confused_with` class is."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from checkpoints import write_constant_convnet_checkpoint
from image_folders import write_image_folder
from output_checks import error_line
from parquet_files import png, write_parquet
from processes import run_torchkit_in_process
from shards import serving

from torchkit.core.io.errors import InputError

NAMES = ["crane", "b", "crane", "c"]  # classes 0 and 2 share a name


def write_shard(folder: Path, labels: dict[str, tuple[int | None, str | None]]) -> Path:
    """FOLDER/s-000000.tar of one 8x8 PNG a sample, `labels` {key: (KEY.cls, KEY.json label)},
    beside classes.txt naming NAMES."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "classes.txt").write_text("".join(f"{name}\n" for name in NAMES))
    shard = folder / "s-000000.tar"
    with tarfile.open(shard, "w") as tar:
        for seed, (key, (index, name)) in enumerate(labels.items()):
            members = {f"{key}.png": png(seed)}
            if index is not None:
                members[f"{key}.cls"] = str(index).encode()
            if name is not None:
                members[f"{key}.json"] = json.dumps({"label": name}).encode()
            for member, data in members.items():
                info = tarfile.TarInfo(member)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return shard


def open_data(spec: object, classes: list[str] | None = None):
    from torchkit.core.data.sources import open_data

    return open_data(str(spec), classes=classes)


def test_shards_labelled_by_index_load_beside_a_classes_txt_naming_a_class_twice(tmp_path):
    """classes.txt with two `crane`s was refused ("names a class twice"), so ImageNet in
    WebDataset form (KEY.cls beside its 1,000 names) could not be read; the index decides."""
    labels = {"x": (0, "crane"), "y": (2, "crane"), "z": (1, "b"), "w": (3, None), "v": (0, None)}
    write_shard(tmp_path / "shards", labels)
    source = open_data(tmp_path / "shards")
    assert source.classes == NAMES
    assert source.whole.labels == [0, 2, 1, 3, 0]
    # A model with the data's names in the data's order scores it as it is.
    assert open_data(tmp_path / "shards", classes=NAMES).whole.labels == [0, 2, 1, 3, 0]


def test_a_shard_sample_labelled_by_a_name_of_two_classes_alone_is_refused(tmp_path):
    write_shard(tmp_path / "shards", {"x": (1, "b"), "y": (None, "crane")})
    with pytest.raises(InputError) as refused:
        open_data(tmp_path / "shards")
    assert refused.value.message == (
        "the label 'crane' of sample y in s-000000.tar is the name of 2 of the classes beside "
        "the shards (0, 2): which one it stands for is a guess"
    )
    assert "KEY.cls" in refused.value.hint
    result = run_torchkit_in_process("dataset-stats", tmp_path / "shards", "-j", "0")
    assert result.returncode == 1 and result.stdout == ""
    assert error_line(result.stderr, besides="nothing").startswith(f"Error: {refused.value}")


def test_a_shard_index_that_is_not_one_of_its_names_classes_is_refused(tmp_path):
    write_shard(tmp_path / "shards", {"x": (1, "crane")})
    with pytest.raises(InputError, match="class index 1, which classes.txt names 'b', and the "):
        open_data(tmp_path / "shards")
    with pytest.raises(InputError, match="the label 'crane', class 0 or 2 of classes.txt"):
        open_data(tmp_path / "shards")


def test_shards_over_http_take_a_classes_txt_naming_a_class_twice(tmp_path, monkeypatch):
    write_shard(tmp_path / "served" / "shards", {"x": (0, None), "y": (2, "crane")})
    with serving(tmp_path / "served", tmp_path / "cache", monkeypatch) as server:
        source = open_data(f"{server.url}/shards/s-000000.tar")
    assert source.classes == NAMES
    assert source.whole.labels == [0, 2]


def test_parquet_classlabel_names_given_twice_are_two_classes(tmp_path):
    """HF's ClassLabel refuses such names, and so did torchkit's reader: a parquet file whose
    metadata names ImageNet's classes (written by another tool) was an error, though its labels
    are class indices."""
    data = write_parquet(tmp_path / "d.parquet", [png(0), png(1), png(2)], [0, 2, 1], names=NAMES)
    source = open_data(data)
    assert source.classes == NAMES
    assert source.whole.labels == [0, 2, 1]


def test_data_naming_a_class_twice_is_not_matched_by_name_to_other_classes(tmp_path):
    """Shards of two `crane`s read with a model's classes in another order were matched by
    name: both cranes became the model's one crane, silently."""
    write_shard(tmp_path / "shards", {"x": (0, None), "y": (2, None), "z": (1, "b")})
    with pytest.raises(InputError) as refused:
        open_data(tmp_path / "shards", classes=["b", "crane", "c"])
    assert refused.value.message.startswith(
        "the model's class crane is the name of 2 of the classes of "
    )
    assert refused.value.message.endswith(" (0, 2): which one it stands for is a guess")


def test_convert_shards_writes_two_classes_of_one_name_as_two_indices(tmp_path):
    from torchkit.core.convert.shards import written_classes

    assert written_classes(NAMES) == (NAMES, [0, 1, 2, 3])
    assert written_classes(["crane", "", "crane"]) == (["crane", "crane"], [0, None, 1])


def test_eval_reports_say_which_of_two_classes_of_one_name_images_were_taken_for(tmp_path):
    """`confused_with` named the class alone: `crane:3`, with two cranes, said neither which
    output nor which class. JSON gains an "index" beside "class"; the table and per_class.csv
    show `crane (#2)` for a name two classes share, the name alone for others."""
    model = tmp_path / "model.pt"
    # Every image is taken for output 2, the second crane.
    write_constant_convnet_checkpoint(model, image_size=8, classes=NAMES, logits=[0, 0, 5, 0])
    data = write_image_folder(tmp_path / "bc", {"b": 2, "c": 1})
    found = run_torchkit_in_process(
        "eval", model, "--data", data, "--format", "json", "-j", "0", "--out", tmp_path / "out"
    )
    assert found.returncode == 0, found.stderr
    rows = {row["index"]: row for row in json.loads(found.stdout)["per_class"]}
    assert rows[1]["confused_with"] == [{"class": "crane", "index": 2, "count": 2}]
    assert rows[3]["confused_with"] == [{"class": "crane", "index": 2, "count": 1}]
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["per_class"][1]["confused_with"] == rows[1]["confused_with"]
    per_class = (tmp_path / "out" / "per_class.csv").read_text().splitlines()
    assert ",crane (#2):2," in per_class[2] and ",crane (#2):1," in per_class[4]
    table = run_torchkit_in_process("eval", model, "--data", data, "-j", "0")
    assert table.returncode == 0, table.stderr
    assert "crane (#2):2" in table.stdout and "crane (#2):1" in table.stdout


def test_names_given_twice_are_found_in_one_pass_in_either_unicode_spelling():
    from torchkit.core.data.sources.samples import classes_named_alike

    composed, decomposed = "caf\u00e9", "cafe\u0301"
    assert classes_named_alike(["a", "b", "a", "c", "b", "a"]) == {"a": [0, 2, 5], "b": [1, 4]}
    assert classes_named_alike([composed, "x", decomposed]) == {composed: [0, 2]}
    assert classes_named_alike(["a", "b", " a"]) == {}
