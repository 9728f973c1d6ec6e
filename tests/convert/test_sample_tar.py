"""`convert shards` writes its tars with torchkit's own SampleTarWriter (the standard library's
tarfile), not webdataset's TarWriter, whose package imports torch: the bytes are the same as
webdataset's writer makes them, webdataset's and torchkit's readers read every sample back,
and the command imports neither webdataset nor torch."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from image_folders import write_image_folder
from processes import run_torchkit_in_process
from suite_paths import REPO

from torchkit.core.convert.sample_tar import SampleTarWriter
from torchkit.core.convert.shards import TAR_MODE, TAR_MTIME, TAR_OWNER

# Members of every size class a tar pads differently (empty, under, at and over a 512-byte
# block, several records), a bytearray, 120- and 101-character and non-ASCII names (a PAX header)
# and a 100-character one (none).
SAMPLES = [
    {"__key__": "train_00000000", "png": b"\x89PNG" * 300, "cls": b"1", "json": b"{}"},
    {"__key__": "train_00000001", "jpg": b"", "cls": b"0", "json": bytearray(b'{"a": 1}')},
    {"__key__": "val_00000000", "webp": b"x" * 511, "txt": b"y" * 512, "bin": b"z" * 513},
    {"__key__": "k" * 120, "png": bytes(range(256)) * 90},
    {"__key__": "m" * 96, "png": b"at ustar's 100 bytes", "jpeg": b"past them: PAX"},
    {"__key__": "café_00000001", "png": b"not ASCII: PAX"},
    {"__key__": "train_00000002", "png": b"after PAX headers" * 1000},
]


def written_by_torchkit(samples: list[dict]) -> tuple[bytes, list[int]]:
    stream = io.BytesIO()
    writer = SampleTarWriter(stream, owner=TAR_OWNER, mode=TAR_MODE, mtime=TAR_MTIME)
    offsets = []
    for sample in samples:
        writer.write(sample)
        offsets.append(writer.offset)
    writer.close()
    return stream.getvalue(), offsets


def written_by_webdataset(samples: list[dict]) -> tuple[bytes, list[int]]:
    import webdataset

    stream = io.BytesIO()
    writer = webdataset.TarWriter(
        stream, user=TAR_OWNER, group=TAR_OWNER, mode=TAR_MODE, encoder=False, mtime=TAR_MTIME
    )
    offsets = []
    for sample in samples:
        writer.write(sample)
        offsets.append(writer.tarstream.offset)
    writer.close()
    return stream.getvalue(), offsets


def test_the_tar_is_byte_for_byte_what_webdatasets_tar_writer_writes():
    ours, our_offsets = written_by_torchkit(SAMPLES)
    theirs, their_offsets = written_by_webdataset(SAMPLES)
    assert ours == theirs
    assert our_offsets == their_offsets  # what --shard-size's size_with counts on
    with tarfile.open(fileobj=io.BytesIO(ours)) as tar:
        headers = tar.getmembers()
        names = [m.name for m in headers]
        assert names[:4] == [  # a sample's members in sorted extension order, key first
            "train_00000000.cls",
            "train_00000000.json",
            "train_00000000.png",
            "train_00000001.cls",
        ]
        assert "k" * 120 + ".png" in names and "m" * 96 + ".jpeg" in names
        for member in headers:
            assert member.isreg() and (member.mode, member.mtime) == (TAR_MODE, TAR_MTIME)
            assert (member.uname, member.gname, member.uid, member.gid) == (TAR_OWNER,) * 2 + (0, 0)
        assert tar.extractfile("val_00000000.bin").read() == b"z" * 513


def test_a_member_that_is_not_bytes_is_refused():
    writer = SampleTarWriter(io.BytesIO(), owner=TAR_OWNER, mode=TAR_MODE, mtime=TAR_MTIME)
    with pytest.raises(TypeError, match="member a.txt is str, not bytes"):
        writer.write({"__key__": "a", "txt": "text"})


def test_a_memoryview_of_wider_items_is_written_as_its_bytes():
    """A memoryview of 4-byte items got a header of its item count (4) before its 16 bytes:
    the rest of them were read as the next header, and the members after it were lost."""
    import array

    items = array.array("i", [1, 2, 3, 4])
    samples = [
        {"__key__": "a", "bin": memoryview(items)},
        {"__key__": "b", "bin": memoryview(items.tobytes()).cast("B", (2, 8)), "cls": b"1"},
    ]
    ours, _ = written_by_torchkit(samples)
    with tarfile.open(fileobj=io.BytesIO(ours)) as tar:
        read = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    assert read == {"a.bin": items.tobytes(), "b.bin": items.tobytes(), "b.cls": b"1"}


def tar_samples(out: Path, prefix: str) -> dict[str, dict[str, bytes]]:
    """KEY -> {extension: bytes} of the shards `prefix-*.tar` as tarfile reads them."""
    grouped: dict[str, dict[str, bytes]] = {}
    for shard in sorted(out.glob(f"{prefix}-*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                key, _, extension = member.name.partition(".")
                grouped.setdefault(key, {})[extension] = tar.extractfile(member).read()
    return grouped


def test_webdataset_and_torchkit_read_every_sample_of_the_shards(tmp_path: Path):
    import webdataset

    from torchkit.core.data.sources import open_data

    root = tmp_path / "split"
    write_image_folder(root / "train", {"cat": 4, "dog": 3}, seed=1)
    write_image_folder(root / "val", {"cat": 1, "dog": 2}, seed=2)
    out = tmp_path / "out"
    done = run_torchkit_in_process("convert", "shards", root, out, "--per-shard", 3)
    assert done.returncode == 0, done.stderr
    data = open_data(out)
    for split, count in (("train", 7), ("val", 3)):
        expected = tar_samples(out, split)
        assert len(expected) == count
        urls = [str(shard) for shard in sorted(out.glob(f"{split}-*.tar"))]
        read = {
            sample["__key__"]: {k: v for k, v in sample.items() if not k.startswith("__")}
            for sample in webdataset.WebDataset(urls, shardshuffle=False)
        }
        assert read == expected
        for members in read.values():
            about = json.loads(members["json"])
            assert members["png"] == (root / about["path"]).read_bytes()
        samples = data.splits[split]
        by_torchkit = {
            str(stored).rsplit("/", 1)[1].partition(".")[0]: (
                stored.read_bytes(),
                samples.classes[label],
            )
            for stored, label in zip(samples.paths, samples.labels, strict=True)
        }
        assert by_torchkit == {
            key: (members["png"], json.loads(members["json"])["label"])
            for key, members in read.items()
        }


# Runs `torchkit convert shards SRC OUT` through the entry point in a fresh interpreter and
# prints the heavy packages loaded by then.
IMPORTS_SCRIPT = r"""
import json, sys
import torchkit.cli

sys.argv = ["torchkit", "convert", "shards", *sys.argv[1:]]
code = 0
try:
    torchkit.cli.main()
except SystemExit as done:
    code = done.code or 0
heavy = {"torch", "webdataset"}
print(json.dumps({"code": code, "heavy": sorted({n.split(".")[0] for n in sys.modules} & heavy)}))
"""


def test_convert_shards_imports_neither_torch_nor_webdataset(tmp_path: Path):
    source = write_image_folder(tmp_path / "images", {"a": 2, "b": 2})
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-c", IMPORTS_SCRIPT, str(source), str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report == {"code": 0, "heavy": []}
    assert len(tar_samples(out, "shard")) == 4
