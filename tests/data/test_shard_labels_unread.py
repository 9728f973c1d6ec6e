"""Shards labelled by a member torchkit does not read (`KEY.label`, `KEY.class`, `KEY.txt`):
dataset-stats read them as one class "" without a word, and train's "has no label" error did not
name the member it found. torchkit reads `KEY.cls` (as timm's webdataset reader does) and
`KEY.json`; the others are now named, with what it reads."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from output_checks import torchkit_log_to_caplog
from PIL import Image
from tar_members import tar_of_members

from torchkit.core.data.sources import open_data
from torchkit.core.io.errors import InputError


def _png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4), (200, 10, 10)).save(buffer, "PNG")
    return buffer.getvalue()


def _shard(path: Path, label_extension: str) -> Path:
    png = _png()
    members: list[tuple[str, bytes | str | None]] = []
    for key in ("000", "001"):
        members += [(f"{key}.png", png), (f"{key}.{label_extension}", key[-1].encode())]
    return tar_of_members(path, members)


@pytest.mark.parametrize("extension", ["label", "class", "cls2"])
def test_a_label_member_torchkit_does_not_read_is_named(tmp_path, caplog, monkeypatch, extension):
    shard = _shard(tmp_path / "s-000000.tar", extension)
    torchkit_log_to_caplog(caplog, monkeypatch)
    with caplog.at_level("WARNING", logger="torchkit"):
        assert open_data(str(shard), allow_unlabelled=True).classes == [""]
    assert caplog.messages == [
        f"{shard}: 2 samples without a label hold a member torchkit does not read as a label "
        f"(000.{extension} in s-000000.tar): read unlabelled; torchkit reads a label from "
        'KEY.cls, the class index, or KEY.json: "label", "cls"'
    ]
    with pytest.raises(InputError) as refused:  # train's and eval's reader
        open_data(str(shard))
    assert str(refused.value).startswith(
        f"sample 000 in s-000000.tar has no label (2 samples have none): 000.{extension} in "
        "s-000000.tar is not read as a label (torchkit reads a label from KEY.cls,"
    )


def test_a_caption_is_named_by_train_only(tmp_path, caplog, monkeypatch):
    """`KEY.txt` is LAION's caption as often as a class name: no warning where the samples
    are read unlabelled (predict over captioned shards), named where a label is wanted."""
    shard = _shard(tmp_path / "s-000000.tar", "txt")
    torchkit_log_to_caplog(caplog, monkeypatch)
    with caplog.at_level("WARNING", logger="torchkit"):
        open_data(str(shard), allow_unlabelled=True)
    assert caplog.messages == []
    with pytest.raises(InputError, match=r"000\.txt in s-000000\.tar is not read as a label"):
        open_data(str(shard))


def test_shards_without_other_members_read_unlabelled_silently(tmp_path, caplog, monkeypatch):
    png = _png()
    shard = tar_of_members(tmp_path / "s-000000.tar", [("000.png", png), ("000.npy", b"x")])
    torchkit_log_to_caplog(caplog, monkeypatch)
    with caplog.at_level("WARNING", logger="torchkit"):
        open_data(str(shard), allow_unlabelled=True)
    assert caplog.messages == []
    with pytest.raises(InputError) as refused:
        open_data(str(shard))
    assert "not read as a label" not in str(refused.value)
