"""Shards without classes.txt whose samples carry a class index (`KEY.cls`) and a class name
(`KEY.json` "label"), two indices of one name (ImageNet's two `crane`s): the index is the label
and the name what shows it. Read by name, the two classes were one, silently, in train, eval and
dataset-stats alike; where the samples cannot say which name each index has, it is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from output_checks import error_line
from parquet_files import png
from processes import run_torchkit_in_process

from torchkit.core.io.errors import InputError

NAMES = ["crane", "b", "crane"]  # classes 0 and 2 share a name
LABELS = [0, 2, 1, 0, 2, 1, 0, 2]


def write_shard(folder: Path, samples: list[tuple[int, str | None]]) -> Path:
    """FOLDER/s-000000.tar by webdataset's own writer: a PNG, KEY.cls and KEY.json a sample."""
    import webdataset as wds

    folder.mkdir(parents=True, exist_ok=True)
    with wds.TarWriter(str(folder / "s-000000.tar")) as sink:
        for seed, (index, name) in enumerate(samples):
            sample = {"__key__": f"k{seed}", "png": png(seed), "cls": index}
            if name is not None:
                sample["json"] = {"label": name}
            sink.write(sample)
    return folder


def open_data(spec: object):
    from torchkit.core.data.sources import open_data

    return open_data(str(spec))


def test_two_indices_of_one_name_are_two_classes_in_train_eval_and_dataset_stats(
    tmp_path, monkeypatch
):
    shards = write_shard(tmp_path / "shards", [(i, NAMES[i]) for i in LABELS])
    source = open_data(shards)
    assert source.classes == NAMES
    assert source.whole.labels == LABELS
    stats = run_torchkit_in_process("dataset-stats", shards, "-j", "0", "--format", "json")
    assert stats.returncode == 0, stats.stderr
    counts = [(c["name"], c["index"], c["images"]) for c in json.loads(stats.stdout)["classes"]]
    assert counts == [("crane", 0, 3), ("b", 1, 2), ("crane", 2, 3)]
    run = tmp_path / "run"
    trained = run_torchkit_in_process(
        "train", "--data", shards, "--model", "convnet", "--image-size", "8", "--epochs", "1",
        "--batch-size", "8", "--workers", "0", "--device", "cpu", "--out", run,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    import torch

    assert torch.load(run / "best.pt", weights_only=True)["classes"] == NAMES
    labels = {line.split(",")[1] for line in (run / "split.csv").read_text().splitlines()[1:]}
    assert labels == {"crane (#0)", "b", "crane (#2)"}
    scored = run_torchkit_in_process(
        "eval", run / "best.pt", "--data", shards, "--split", "all", "-j", "0", "--format", "json"
    )
    assert scored.returncode == 0, scored.stderr
    support = [
        (c["label"], c["index"], c["support"]) for c in json.loads(scored.stdout)["per_class"]
    ]
    assert support == [("crane", 0, 3), ("b", 1, 2), ("crane", 2, 3)]


@pytest.mark.parametrize(
    "samples",
    [
        [(0, "crane"), (2, "crane"), (1, "b"), (3, "b2"), (5, "c")],  # index 4 has no name
        [(0, "crane"), (2, "crane"), (1, "b"), (1, None)],  # a sample of no name
        [(0, "crane"), (2, "crane"), (1, "b"), (1, "b2")],  # an index of two names
    ],
)
def test_a_name_of_two_indices_the_samples_cannot_pair_is_refused(tmp_path, samples):
    """Read by name, crane 0 and crane 2 were one class."""
    shards = write_shard(tmp_path / "shards", samples)
    with pytest.raises(InputError) as refused:
        open_data(shards)
    assert refused.value.message.startswith(
        "sample k1 in s-000000.tar has class index 2 and the label 'crane', which sample k0 "
        "in s-000000.tar gives class index 0: read by name they would be one class"
    )
    assert "classes.txt" in refused.value.hint
    result = run_torchkit_in_process("dataset-stats", shards, "-j", "0")
    assert result.returncode == 1 and result.stdout == ""
    assert error_line(result.stderr, besides="nothing").startswith(f"Error: {refused.value}")
