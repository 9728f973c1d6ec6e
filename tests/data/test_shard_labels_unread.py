"""Shards labelled by a member torchkit does not read (`KEY.label`, `KEY.class`, `KEY.txt`):
dataset-stats read them as one class "" without a word, and train's "has no label" error did not
name the member it found. torchkit reads `KEY.cls` (as timm's webdataset reader does) and
`KEY.json`; the others are now named, with what it reads."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from checkpoints import write_convnet_checkpoint
from output_checks import error_line, torchkit_log_to_caplog
from PIL import Image
from processes import run_torchkit_in_process
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
    rename = (
        f"rename each KEY.{extension} that holds a class index to KEY.cls, as 000.{extension} to "
        '000.cls, or write a class name as the "label" of a KEY.json'
    )
    assert caplog.messages == [
        f"{shard}: 2 samples without a label hold a member torchkit does not read as a label "
        f"(000.{extension} in s-000000.tar): read unlabelled; torchkit reads a label from "
        f'KEY.cls, the class index, or KEY.json: "label", "cls"; {rename}'
    ]
    with pytest.raises(InputError) as refused:  # train's and eval's reader
        open_data(str(shard))
    assert str(refused.value) == (
        f"sample 000 in s-000000.tar has no label (2 samples have none): 000.{extension} in "
        "s-000000.tar is not read as a label (torchkit reads a label from KEY.cls, the class "
        f'index, or KEY.json: "label", "cls"; {rename})'
    )


@pytest.mark.parametrize("extension", ["label", "class"])
def test_a_tar_of_flat_images_beside_label_members_is_read_as_shards(
    tmp_path, caplog, monkeypatch, extension
):
    """`lab.tar` of `000.png` and `000.label` (no class folders, not named as a shard) read as
    flat unlabelled images: dataset-stats said nothing of the labels, and train asked for class
    folders (`holds images but no class folders`). It is a shard whose labels torchkit does not
    read, said so, as one named `NAME-NNNNNN.tar` is; the renamed members are read."""
    tar = _shard(tmp_path / "lab.tar", extension)
    torchkit_log_to_caplog(caplog, monkeypatch)
    with caplog.at_level("WARNING", logger="torchkit"):
        read = open_data(str(tar), allow_unlabelled=True)
    assert read.whole.ids == ["lab.tar/000.png", "lab.tar/001.png"]
    assert f"(000.{extension} in lab.tar): read unlabelled" in caplog.messages[0]
    result = run_torchkit_in_process("train", "--data", tar, "--out", tmp_path / "run")
    assert result.returncode == 1
    assert error_line(result.stderr).startswith(
        f"Error: sample 000 in lab.tar has no label (2 samples have none): 000.{extension} in "
        "lab.tar is not read as a label"
    )
    assert f"to KEY.cls, as 000.{extension} to 000.cls, or" in error_line(result.stderr)
    renamed = _shard(tmp_path / "renamed.tar", "cls")
    assert open_data(str(renamed)).whole.labels == [0, 1]


def test_a_caption_beside_flat_images_keeps_them_an_image_folder(tmp_path):
    """A `KEY.txt` is a caption as often: flat images beside one are read as they were."""
    tar = _shard(tmp_path / "captioned.tar", "txt")
    assert open_data(str(tar), allow_unlabelled=True).whole.ids == ["000.png", "001.png"]


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


def test_train_and_eval_of_a_tar_of_captioned_flat_images_name_the_captions(tmp_path):
    """A captioning data set's `.tar` (`000.png` beside `000.txt`) is flat images: train's and
    eval's error asked for class folders without a word of the .txt files; it names them and
    says they are no class labels. A `.tar` of flat images alone is refused as before."""
    tar = _shard(tmp_path / "captioned.tar", "txt")
    expected = (
        f"Error: {tar} holds images but no class folders, and its KEY.txt members (000.txt and "
        "1 more) are read as captions, not class labels (arrange it as ROOT/<class>/<image>; or "
        "rename each KEY.txt that holds a class index to KEY.cls, as 000.txt to 000.cls, or "
        'write a class name as the "label" of a KEY.json)'
    )
    result = run_torchkit_in_process("train", "--data", tar, "--out", tmp_path / "run")
    assert (result.returncode, error_line(result.stderr)) == (1, expected)
    write_convnet_checkpoint(tmp_path / "m.pt", in_channels=3, image_size=8, classes="ab")
    result = run_torchkit_in_process("eval", tmp_path / "m.pt", "--data", tar, "--device", "cpu")
    assert (result.returncode, error_line(result.stderr)) == (1, expected)
    plain = tar_of_members(tmp_path / "plain.tar", [("000.png", _png()), ("001.png", _png())])
    with pytest.raises(InputError) as refused:
        open_data(str(plain))
    assert str(refused.value) == (
        f"{plain} holds images but no class folders (arrange it as ROOT/<class>/<image>)"
    )
