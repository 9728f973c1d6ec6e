"""A folder of shards named for two splits otherwise than `train-NNNNNN.tar` (timm's ImageNet
shards: `imagenet1k-train-0000.tar` beside `imagenet1k-validation-00.tar`) was read as one
unsplit dataset: train trained on the validation shards too, holding out a tenth of both, and
dataset-stats measured both as one, without a word. It is one error line naming a shard of
each split (as folders `Training/` and `Test/` are refused); a pattern reads one split."""

from __future__ import annotations

import io
import tarfile

import pytest

from torchkit.core.io.errors import InputError


def write_shard(path, key: str) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in ((f"{key}.png", b"not read"), (f"{key}.cls", b"0")):
            member = tarfile.TarInfo(name)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))


def test_shards_of_two_splits_named_otherwise_are_one_error_line(tmp_path):
    from torchkit.core.data.sources import open_data

    for name in (
        "imagenet1k-train-0000.tar",
        "imagenet1k-train-0001.tar",
        "imagenet1k-validation-00.tar",
    ):
        write_shard(tmp_path / name, name.split(".")[0])
    with pytest.raises(InputError) as raised:
        open_data(str(tmp_path), allow_unlabelled=True)
    line = str(raised.value)
    assert f"{tmp_path} holds shards of 2 splits named otherwise than train-" in line, line
    assert "(imagenet1k-train-0000.tar, imagenet1k-validation-00.tar)" in line, line
    one_split = open_data(str(tmp_path / "imagenet1k-train-{0000..0001}.tar"))
    assert len(one_split.whole.paths) == 2
    # Shards of one split, or of none, stay one dataset.
    (tmp_path / "imagenet1k-validation-00.tar").unlink()
    write_shard(tmp_path / "imagenet1k-extra-00.tar", "extra")
    assert len(open_data(str(tmp_path)).whole.paths) == 3
