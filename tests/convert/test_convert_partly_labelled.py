"""Data of which only some samples have a label (shards, parquet rows, CSV rows): `convert shards`
wrote it all unlabelled (read so for the commands that need no labels), dropping every label the
labelled samples had. The shards keep each label now, and read back as partly labelled data, as
the source does; `split`, which cannot write an image without a label into a class folder,
refuses such data."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from output_checks import torchkit_log_to_caplog
from partly_labelled import KINDS, partly_labelled_source
from PIL import Image
from processes import run_torchkit_in_process

from torchkit.core.data.sources import open_data
from torchkit.core.io.errors import InputError

# Per source sample in order: its class name, or None for no label.
LABELS = ["cat", None, "dog", "cat", None]
NAMES = ["cat", "dog"]


def _written(out: Path) -> dict[int, tuple[int | None, str | None]]:
    """Source sample -> (its KEY.cls, its KEY.json label) in the shards, known by its pixel."""
    found = {}
    with tarfile.open(out / "shard-000000.tar") as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    for name, data in members.items():
        key, _, extension = name.partition(".")
        if extension != "png":
            continue
        with Image.open(io.BytesIO(data)) as image:
            index = image.getpixel((0, 0))[0] // 40
        label = members.get(f"{key}.cls")
        found[index] = (
            None if label is None else int(label),
            json.loads(members[f"{key}.json"])["label"],
        )
    return found


@pytest.mark.parametrize("kind", KINDS)
def test_convert_shards_keeps_every_label_of_partly_labelled_data(
    tmp_path, kind, caplog, monkeypatch
):
    source = partly_labelled_source(kind, tmp_path / "source", LABELS, NAMES)
    out = tmp_path / "out"
    done = run_torchkit_in_process("convert", "shards", source, out, "--format", "json")
    assert done.returncode == 0, done.stderr
    assert _written(out) == {
        index: (None, None) if label is None else (NAMES.index(label), label)
        for index, label in enumerate(LABELS)
    }
    assert (out / "classes.txt").read_text() == "cat\ndog\n"
    assert "2 of the 5 images of the data have no label: written without one" in done.stderr
    assert json.loads(done.stdout)["splits"]["shard"]["class_counts"] == {"cat": 2, "dog": 1}
    # Read back by the rule of the source: unlabelled (with a warning) where labels are not
    # needed, refused where they are.
    torchkit_log_to_caplog(caplog, monkeypatch)
    with caplog.at_level("WARNING", logger="torchkit"):
        assert open_data(out, allow_unlabelled=True).classes == [""]
    assert "2 sample(s) without a label" in caplog.text
    with pytest.raises(InputError, match="has no label"):
        open_data(out)


def test_split_refuses_a_partly_labelled_index_rather_than_dropping_its_labels(tmp_path):
    from torchkit.core.split.plan import load_split_input

    index = partly_labelled_source("csv", tmp_path / "source", LABELS, NAMES)
    with pytest.raises(InputError) as refused:
        load_split_input(index)
    assert str(refused.value).startswith(
        f"{index} (csv) has 2 image(s) without a label (1.png, 4.png) among 3 labelled ones"
    )


@pytest.mark.parametrize("kind", KINDS)
def test_no_shuffle_writes_partly_labelled_samples_in_the_sources_order(tmp_path, kind):
    # The samples without a label stay where the source has them (class "" is a label, not a
    # sort key): dog, none, cat, ... is written so, not by class nor with the unlabelled last.
    labels = ["dog", None, "cat", "dog", None, "cat"]
    source = partly_labelled_source(kind, tmp_path / "source", labels, NAMES)
    out = tmp_path / "out"
    done = run_torchkit_in_process("convert", "shards", source, out, "--no-shuffle")
    assert done.returncode == 0, done.stderr
    with tarfile.open(out / "shard-000000.tar") as tar:
        written = [
            json.loads(tar.extractfile(member).read())["label"]
            for member in tar.getmembers()
            if member.name.endswith(".json")
        ]
    assert written == labels
    assert list(_written(out)) == list(range(len(labels)))  # the source's samples, in turn
