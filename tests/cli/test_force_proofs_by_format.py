"""`--force` over an earlier output of convert cifar, video-info --extract-frames, convert
shards and extract-features: each file torchkit writes there is its own only where its
content shows it (`core.io.output_proofs`), so a user's image, tar or array under a name the
command writes is refused, byte for byte untouched. Before, these were judged by name alone and
went with the folder. (Re-runs over the commands' own outputs: their own test modules, and
tests/cli/test_force_keeps_users_files.py's FAMILIES.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from format_files import bare_png, owned_tar, photo_png
from output_checks import check_refused_untouched
from safety_world import marked, write_world

from torchkit.core.io.output_paths import MARKER
from torchkit.core.io.output_proofs import torchkit_png, with_software_text


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    root = write_world(tmp_path_factory.mktemp("template"))
    (root / "clip.avi").write_bytes(b"not read: the frames folder is refused first")
    return root


@pytest.fixture
def world(template, tmp_path) -> Path:
    return Path(shutil.copytree(template, tmp_path / "world", symlinks=True))


FRAMES = ["video-info", "clip.avi", "--segments", "2", "--extract-frames", "out", "--force"]
CIFAR = ["convert", "cifar", "ds", "out", "--force"]
SHARDS = ["convert", "shards", "ds", "out", "--force"]
FEATURES = ["extract-features", "run/best.pt", "ds", "out", "-l", "logits", "-j", "0", "--force"]
INDEX = b"row,path,label,error\n0,ds/a/a_0.png,a,\n"
NPY = b"\x93NUMPY\x01\x00" + b"v" * 10
MANIFEST = json.dumps({"written_by": "torchkit convert shards", "shards": []}).encode()
LABELLED = json.dumps({"written_by": "torchkit convert shards", "classes": ["a", "b"]}).encode()
LOGITS = {"logits": {"shape": [2], "dtype": "float32", "file": "logits"}}
PROGRESS = json.dumps({"fingerprint": "f", "total": 6, "done": 3, "rows": 3, "layers": LOGITS})
# an interrupted run's array of its record's layer: 6 rows of 2 float32 (an npy header's bytes)
PARTIAL_NPY = (
    b"\x93NUMPY\x01\x00v\x00"
    + b"{'descr': '<f4', 'fortran_order': False, 'shape': (6, 2), }".ljust(117)
    + b"\n"
    + bytes(48)
)

# command line, its marker's command, what torchkit wrote, the user's file (name, bytes)
CASES = {
    "a photo as a frame": (
        FRAMES,
        "video-info",
        {"clip_000001.png": with_software_text(bare_png((16, 16)))},
        ("clip_000004.png", photo_png((16, 16))),
    ),
    "another program's PNG as a frame": (
        FRAMES,
        "video-info",
        {"clip_000001.png": bare_png((16, 16))},
        ("clip_000004.png", with_software_text(bare_png()).replace(b"torchkit", b"gimp 2.1")),
    ),
    "a JPEG named as a frame": (
        FRAMES,
        "video-info",
        {"clip_000001.png": bare_png((16, 16))},
        ("clip_000004.png", b"\xff\xd8\xff\xe0 a JPEG"),
    ),
    "a photo as a CIFAR image": (
        CIFAR,
        "convert cifar",
        {"train/cat/0.png": bare_png()},
        ("train/cat/1.png", photo_png()),
    ),
    "a larger bare PNG as a CIFAR image": (
        CIFAR,
        "convert cifar",
        {"train/cat/0.png": with_software_text(bare_png())},
        ("test/dog/7.png", bare_png((64, 64))),
    ),
    "another tool's shard": (
        SHARDS,
        "convert shards",
        {"train-000000.tar": owned_tar(), "manifest.json": MANIFEST},
        ("train-000001.tar", owned_tar("ann")),
    ),
    "not a tar under a shard's name": (
        SHARDS,
        "convert shards",
        {"train-000000.tar": owned_tar()},
        ("val-000000.tar", b"my notes"),
    ),
    "another tool's manifest.json": (
        SHARDS,
        "convert shards",
        {"train-000000.tar": owned_tar()},
        ("manifest.json", b'{"name": "a web app", "icons": []}'),
    ),
    "a text of yours named as a converted array": (
        ["convert", "tensor", "ds", "out", "--to", "npy", "--force"],
        "convert tensor",
        {"a/a_0.npy": NPY},
        ("a/a_1.npy", b"0.1 0.2 0.3\n"),
    ),
    "your notes named as a converted image": (
        ["convert", "tensor", "ds", "out", "--to", "jpg", "--force"],
        "convert tensor",
        {"a/a_0.jpg": b"\xff\xd8\xff\xe0 a JPEG"},
        ("a/a_1.JPG", b"notes"),
    ),
    "your class list as classes.txt": (
        SHARDS,
        "convert shards",
        {"train-000000.tar": owned_tar(), "manifest.json": LABELLED},
        ("classes.txt", b"cat\ndog\n"),
    ),
    "your notes in an interrupted extraction": (
        FEATURES,
        "extract-features",
        {".partial/progress.json": PROGRESS, ".partial/logits.npy": PARTIAL_NPY},
        (".partial/notes.txt", b"to do"),
    ),
    "a text file named as an interrupted extraction's array": (
        FEATURES,
        "extract-features",
        {".partial/progress.json": PROGRESS},
        (".partial/umap.npy", b"x,y\n0.1,0.2\n"),
    ),
    "your own errors.jsonl in an interrupted extraction": (
        FEATURES,
        "extract-features",
        {".partial/progress.json": PROGRESS},
        (".partial/errors.jsonl", b'{"level": "error"}\n'),
    ),
    "your own index.csv": (
        FEATURES,
        "extract-features",
        {"logits.npy": NPY},
        ("index.csv", b"path,label\nds/a/a_0.png,a\n"),
    ),
    "a text file named as a layer's array": (
        FEATURES,
        "extract-features",
        {"index.csv": INDEX},
        ("umap.npy", b"x,y\n0.1,0.2\n"),
    ),
    "a pickle named as a layer's .pt": (
        FEATURES,
        "extract-features",
        {"index.csv": INDEX, "logits.npy": NPY},
        ("logits.pt", __import__("pickle").dumps({"mine": 1})),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_force_refuses_a_users_file_under_a_name_the_command_writes(world, case):
    args, command, own, (name, data) = CASES[case]
    marked(world / "out", command, {**own, name: data})
    what = "frames folder" if command == "video-info" else "output folder"
    check_refused_untouched(
        args, f"{what} out holds out/{name} that torchkit did not write", cwd=world
    )
    assert (world / "out" / name).read_bytes() == data


def test_extract_features_files_of_each_format_are_its_own(world):
    """An OUT of each --array-format passes its own proofs (written by the real command), and
    --force over the last replaces it."""
    from processes import run_torchkit_in_process

    from torchkit.core.features.extract import output_names
    from torchkit.core.features.store import known_files
    from torchkit.core.io.folder_contents import foreign_entries
    from torchkit.core.io.output_paths import WRITTEN_JOURNAL

    for array_format in ("npy", "pt", "safetensors"):
        args = [*FEATURES[:3], array_format, *FEATURES[4:-1], "--array-format", array_format]
        done = run_torchkit_in_process(*args, cwd=world)
        assert done.returncode == 0, done.stderr
        out = world / array_format
        assert (out / f"logits.{array_format}").is_file()
        for recorded in (known_files(out), ()):  # by its records, and as if it had none
            owned = output_names(recorded)
            assert foreign_entries(out, owned, top_level=(MARKER, WRITTEN_JOURNAL)) == []
    done = run_torchkit_in_process(*args, "--force", cwd=world)
    assert done.returncode == 0, done.stderr


def test_convert_tensor_files_of_each_format_are_its_own(world):
    """Each format convert tensor writes passes its proof (the real command's files)."""
    from processes import run_torchkit_in_process

    from torchkit.core.convert.tensor import WRITTEN_EXTENSIONS
    from torchkit.core.io.output_proofs import of_its_format

    for extension in WRITTEN_EXTENSIONS:
        out = f"to{extension}"
        args = ["convert", "tensor", "ds/a/a_0.png", f"{out}/a{extension}", "-j", "0"]
        done = run_torchkit_in_process(*args, cwd=world)
        assert done.returncode == 0, (extension, done.stderr)
        assert of_its_format(world / out / f"a{extension}"), extension
        (world / out / f"b{extension}").write_bytes(b"not of this format")
        assert not of_its_format(world / out / f"b{extension}"), extension


def test_a_tar_is_torchkits_by_its_members_owner(tmp_path):
    """A shard with a long first member name (a PAX header first, of no owner), an empty
    archive and an old torchkit's partial manifest (one JSON document) are the run's own."""
    from torchkit.core.convert.shards import SHARDS_OUTPUTS
    from torchkit.core.io.folder_contents import foreign_entries

    files = {
        "train-000000.tar": owned_tar(name="k" * 150 + ".png"),
        "val-000000.tar": bytes(10240),
        "manifest.partial.json": MANIFEST,
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    assert foreign_entries(tmp_path, SHARDS_OUTPUTS) == []
    (tmp_path / "test-000000.tar").write_bytes(owned_tar("root", name="k" * 150))
    assert foreign_entries(tmp_path, SHARDS_OUTPUTS) == ["test-000000.tar"]


def test_the_software_text_keeps_the_image_and_is_proven(tmp_path):
    """with_software_text adds a chunk PIL and OpenCV read past (same pixels), which the
    proof finds; the bare PNG of an earlier version passes only where allowed."""
    import io

    import cv2
    import numpy as np
    from PIL import Image

    pixels = np.arange(32 * 32 * 3, dtype=np.uint8).reshape(32, 32, 3)
    bare = cv2.imencode(".png", pixels)[1].tobytes()
    marked = with_software_text(bare)
    assert (cv2.imdecode(np.frombuffer(marked, np.uint8), cv2.IMREAD_COLOR) == pixels).all()
    with Image.open(io.BytesIO(marked)) as image:
        image.load()  # checks each chunk's CRC
        assert image.info["Software"].startswith("torchkit ")
    (tmp_path / "new.png").write_bytes(marked)
    (tmp_path / "old.png").write_bytes(bare)
    assert torchkit_png()(tmp_path / "new.png")
    assert not torchkit_png()(tmp_path / "old.png")
    assert torchkit_png(legacy_bare={(32, 32)})(tmp_path / "old.png")
    assert not torchkit_png(legacy_bare={(16, 16)})(tmp_path / "old.png")


def test_classes_txt_is_the_runs_by_its_manifests_names(tmp_path):
    """classes.txt is convert shards' where its lines are the class names its manifest (or
    partial manifest, of this version or an earlier one) lists, or it is empty (unlabelled
    data): a run writes its partial manifest before classes.txt. Another list under that name
    is the user's, one beside the run's marker alone too, however soon after it was written
    (such a list written within 120 s of the marker was taken for the run's)."""
    import os

    from torchkit.core.convert.shards import SHARDS_OUTPUTS
    from torchkit.core.io.folder_contents import foreign_entries

    def judged(files: dict[str, bytes], *, later_s: float = 0) -> list[str]:
        folder = tmp_path / f"case{len(list(tmp_path.iterdir()))}"
        marked(folder, "convert shards", files)
        if later_s:  # put there later than the run's marker
            marker = (folder / MARKER).stat().st_mtime
            os.utime(folder / "classes.txt", (marker + later_s, marker + later_s))
        return foreign_entries(folder, SHARDS_OUTPUTS, top_level=(MARKER,))

    partial = LABELLED.replace(b"}", b', "complete": false}') + b'\n{"name": "train-000000.tar"}\n'
    unlabelled = json.dumps({"written_by": "torchkit convert shards", "classes": []}).encode()
    assert judged({"manifest.json": LABELLED, "classes.txt": b"a\nb\n"}) == []
    assert judged({"manifest.partial.json": partial, "classes.txt": b"a\nb\n"}) == []
    assert judged({"manifest.json": unlabelled, "classes.txt": b""}) == []
    refused = [
        ({"manifest.json": LABELLED, "classes.txt": b"b\na\n"}, 0),  # not in label order
        ({"manifest.json": LABELLED, "classes.txt": b"a\nb"}, 0),  # not as torchkit ends it
        ({"manifest.json": unlabelled, "classes.txt": b"a\nb\n"}, 0),
        ({"manifest.json": b'{"name": "a web app"}', "classes.txt": b"a\nb\n"}, 0),
        ({"classes.txt": b"a\nb\n"}, 0),  # beside the marker alone, as soon as it was
        ({"classes.txt": b"a\nb\n"}, 3600),  # put there an hour after the run began
        ({"classes.txt": b"my notes, one line\n  indented\n"}, 0),
    ]
    for files, later_s in refused:
        assert judged(files, later_s=later_s)[0] == "classes.txt", files


def test_an_interrupted_extractions_files_are_its_own(tmp_path):
    """What an interrupted extract-features run keeps in OUT/.partial, as the store writes it
    (numpy's memory-mapped array, the progress record, the errors log, a streamed index; each
    empty where the run was stopped as it made it), passes its proof."""
    import numpy as np

    from torchkit.core.features.extract import output_names
    from torchkit.core.features.store import Progress
    from torchkit.core.io.folder_contents import foreign_entries

    out = marked(tmp_path / "out", "extract-features", {})
    partial = out / ".partial"
    partial.mkdir()
    np.lib.format.open_memmap(partial / "logits.npy", mode="w+", dtype="float32", shape=(6, 2))
    progress = Progress(3, 2, {1: "bad"}, layers=LOGITS)
    (partial / "progress.json").write_text(json.dumps(progress.to_json("f", 6)))
    (partial / "errors.jsonl").write_text('[1, "cannot identify image file"]\n')
    (partial / "index.csv").write_text("row,path,label,error\n0,a/a_0.png,a,\n")
    (partial / "layer1.npy").write_bytes(b"")
    assert foreign_entries(out, output_names(()), top_level=(MARKER,)) == []
    (partial / "index.csv").write_bytes(b"")
    (partial / "errors.jsonl").write_bytes(b"")
    assert foreign_entries(out, output_names(()), top_level=(MARKER,)) == []
    # Its rows kept (2 of 6) or a streamed run's count: any number of rows of the layer's.
    np.save(partial / "logits.npy", np.zeros((2, 2), np.float32))
    assert foreign_entries(out, output_names(()), top_level=(MARKER,)) == []
    # An array of yours there: a name the record does not give, or the layer's name with
    # another dtype or row shape (every valid .npy passed, and --force deleted it).
    np.save(partial / "umap.npy", np.zeros((6, 2), np.float32))
    assert foreign_entries(out, output_names(()), top_level=(MARKER,)) == [".partial/umap.npy"]
    (partial / "umap.npy").unlink()
    for dtype, shape in (("float64", (6, 2)), ("float32", (6, 3)), ("float32", (12,))):
        np.save(partial / "logits.npy", np.zeros(shape, dtype))
        owned = output_names(())
        assert foreign_entries(out, owned, top_level=(MARKER,)) == [".partial/logits.npy"]
    (partial / "logits.npy").unlink()
    (partial / "deeper").mkdir()
    assert foreign_entries(out, output_names(()), top_level=(MARKER,)) == [".partial/deeper/"]
