"""`torchkit convert cifar`: tiny CIFAR-10/100 sets built here in the real file format (one of them
byte for byte as Python 2's cPickle wrote the originals), pixels checked against the images the
rows were made from, and the restricted unpickler / archive checks tried with hostile files."""

from __future__ import annotations

import io
import json
import pickle
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from cifar_files import cifar_rows, py2_pickle
from format_files import bare_png
from hostile_pickles import RunsShell
from output_checks import error_line, tree_digest
from PIL import Image
from typer.testing import CliRunner

from torchkit.cli import app
from torchkit.core.convert.cifar import convert_cifar, read_cifar
from torchkit.core.convert.safe_pickle import restricted_loads
from torchkit.core.io.errors import InputError

runner = CliRunner()


PER_BATCH = 20
CIFAR10_CLASSES = [f"c10_{i}" for i in range(10)]
FINE = [f"fine_{i:02d}" for i in range(100)]
COARSE = [f"coarse_{i:02d}" for i in range(20)]


# --- building CIFAR files -----------------------------------------------------------------------


def make_cifar10(root: Path, rng: np.random.Generator, *, batches: int = 5) -> dict:
    """Write a CIFAR-10 folder; return {split: (images, labels)} to check against."""
    root.mkdir(parents=True)
    truth = {"train": ([], []), "test": ([], [])}
    names = [f"data_batch_{i}" for i in range(1, batches + 1)] + ["test_batch"]
    for number, name in enumerate(names):
        images = rng.integers(0, 256, (PER_BATCH, 32, 32, 3), dtype=np.uint8)
        labels = [int(x) for x in rng.integers(0, 10, PER_BATCH)]
        batch = {
            b"batch_label": f"batch {number}".encode(),
            b"labels": labels,
            b"data": cifar_rows(images),
            b"filenames": [f"img_{number}_{i}.png".encode() for i in range(PER_BATCH)],
        }
        # Mix the encodings real users meet: Python 2's cPickle, Python 3 protocols 2 and 5.
        blob = (
            py2_pickle(batch)
            if number % 3 == 0
            else pickle.dumps(batch, protocol=2 if number % 3 == 1 else 5)
        )
        (root / name).write_bytes(blob)
        split = "test" if name == "test_batch" else "train"
        truth[split][0].append(images)
        truth[split][1].extend(labels)
    meta = {
        b"num_cases_per_batch": PER_BATCH,
        b"label_names": [n.encode() for n in CIFAR10_CLASSES],
        b"num_vis": 3072,
    }
    (root / "batches.meta").write_bytes(py2_pickle(meta))
    (root / "readme.html").write_text("<html></html>")
    return {split: (np.concatenate(imgs), np.array(lbls)) for split, (imgs, lbls) in truth.items()}


def make_cifar100(root: Path, rng: np.random.Generator) -> dict:
    root.mkdir(parents=True)
    truth = {}
    for split in ("train", "test"):
        images = rng.integers(0, 256, (PER_BATCH, 32, 32, 3), dtype=np.uint8)
        fine = rng.integers(0, 100, PER_BATCH)
        coarse = fine // 5
        batch = {
            b"filenames": [f"{split}_{i}.png".encode() for i in range(PER_BATCH)],
            b"batch_label": split.encode(),
            b"fine_labels": [int(x) for x in fine],
            b"coarse_labels": [int(x) for x in coarse],
            b"data": cifar_rows(images),
        }
        (root / split).write_bytes(py2_pickle(batch))
        truth[split] = (images, fine, coarse)
    meta = {
        b"fine_label_names": [n.encode() for n in FINE],
        b"coarse_label_names": [n.encode() for n in COARSE],
    }
    (root / "meta").write_bytes(pickle.dumps(meta, protocol=2))
    (root / "file.txt~").write_text("")
    return truth


def make_archive(folder: Path, archive: Path, arcname: str) -> Path:
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname=arcname)
    return archive


def add_member(archive: Path, name: str, data: bytes = b"x", **attrs) -> None:
    """Rewrite `archive` with one more member named `name` (tarfile would refuse to write
    some names through `add`, so the TarInfo is made by hand)."""
    with tarfile.open(archive, "r:gz") as tar:
        members = [(m, tar.extractfile(m).read() if m.isfile() else None) for m in tar]
    with tarfile.open(archive, "w:gz") as tar:
        for member, content in members:
            tar.addfile(member, io.BytesIO(content) if content is not None else None)
        info = tarfile.TarInfo(name)
        info.size = len(data)
        for key, value in attrs.items():
            setattr(info, key, value)
        tar.addfile(info, io.BytesIO(data) if info.isfile() else None)


@pytest.fixture(scope="module")
def cifar10(tmp_path_factory) -> tuple[Path, Path, dict]:
    base = tmp_path_factory.mktemp("c10")
    folder = base / "cifar-10-batches-py"
    truth = make_cifar10(folder, np.random.default_rng(0))
    archive = make_archive(folder, base / "cifar-10-python.tar.gz", "cifar-10-batches-py")
    return folder, archive, truth


@pytest.fixture(scope="module")
def cifar100(tmp_path_factory) -> tuple[Path, Path, dict]:
    base = tmp_path_factory.mktemp("c100")
    folder = base / "cifar-100-python"
    truth = make_cifar100(folder, np.random.default_rng(1))
    archive = make_archive(folder, base / "cifar-100-python.tar.gz", "cifar-100-python")
    return folder, archive, truth


def check_output_tree(out: Path, truth: dict, classes: list[str], label_index: int = 1) -> None:
    """Every image is at split/<class of its label>/<index>.png with exactly its pixels."""
    for split, values in truth.items():
        images, labels = values[0], values[label_index]
        width = len(str(len(images) - 1))
        written = sorted(
            p.relative_to(out / split).as_posix() for p in (out / split).rglob("*.png")
        )
        expected = sorted(f"{classes[label]}/{i:0{width}d}.png" for i, label in enumerate(labels))
        assert written == expected
        for index, label in enumerate(labels):
            with Image.open(out / split / classes[label] / f"{index:0{width}d}.png") as image:
                assert image.mode == "RGB"
                np.testing.assert_array_equal(np.asarray(image), images[index])
    assert sorted(p.name for p in out.iterdir()) == [".torchkit", "test", "train"]
    for split in truth:
        assert sorted(p.name for p in (out / split).iterdir()) == sorted(classes)


# --- conversions --------------------------------------------------------------------------------


def test_cifar10_folder_pixels_exact(cifar10, tmp_path):
    folder, _, truth = cifar10
    out = tmp_path / "png"
    result = runner.invoke(
        app, ["convert", "cifar", str(folder), str(out), "--workers", "0", "--format", "json"]
    )
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["dataset"] == "cifar-10"
    assert report["label_type"] is None
    assert report["splits"] == {"train": 5 * PER_BATCH, "test": PER_BATCH}
    assert report["images"] == 6 * PER_BATCH
    assert report["classes"] == CIFAR10_CLASSES
    assert report["class_counts"]["train"] == np.bincount(truth["train"][1], minlength=10).tolist()
    check_output_tree(out, truth, CIFAR10_CLASSES)
    # Nothing beside the output folder: the temporary build folder was renamed into place.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["png"]


def test_cifar10_archive_in_parallel_matches_torchvision_order(cifar10, tmp_path):
    _, archive, truth = cifar10
    out = tmp_path / "png"
    result = runner.invoke(app, ["convert", "cifar", str(archive), str(out), "--workers", "2"])
    assert result.exit_code == 0, result.stderr
    assert "cifar-10" in result.stdout and "train" in result.stdout
    check_output_tree(out, truth, CIFAR10_CLASSES)


def test_cifar10_folder_found_from_its_parent(cifar10):
    folder, _, truth = cifar10
    data = read_cifar(folder.parent)
    np.testing.assert_array_equal(data.images["train"], truth["train"][0])
    np.testing.assert_array_equal(data.labels["test"], truth["test"][1])


@pytest.mark.parametrize("label_type", ["fine", "coarse"])
def test_cifar100_archive_fine_and_coarse(cifar100, tmp_path, label_type):
    _, archive, truth = cifar100
    out = tmp_path / "png"
    args = ["convert", "cifar", str(archive), str(out), "--label-type", label_type, "-j", "0"]
    result = runner.invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["dataset"] == "cifar-100"
    assert report["label_type"] == label_type
    classes = FINE if label_type == "fine" else COARSE
    assert report["classes"] == classes
    check_output_tree(out, truth, classes, label_index=1 if label_type == "fine" else 2)


def test_progress_reaches_total(cifar10, tmp_path):
    folder, _, _ = cifar10
    calls = []
    report = convert_cifar(
        folder, tmp_path / "out", workers=2, progress=lambda d, t: calls.append((d, t))
    )
    assert calls[-1] == (6 * PER_BATCH, 6 * PER_BATCH)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    assert report.images == 6 * PER_BATCH


def test_existing_output_needs_force(cifar10, tmp_path):
    folder, _, truth = cifar10
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = runner.invoke(app, ["convert", "cifar", str(folder), str(out), "-j", "0"])
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: output folder already exists")
    assert "--force" in result.stderr
    assert (out / "keep.txt").read_text() == "mine"
    # --force replaces only what torchkit wrote: not a folder of the user's own files.
    result = runner.invoke(app, ["convert", "cifar", str(folder), str(out), "-j", "0", "--force"])
    assert result.exit_code == 1
    assert "not written by torchkit" in result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    assert (out / "keep.txt").read_text() == "mine"
    (out / "keep.txt").unlink()
    result = runner.invoke(app, ["convert", "cifar", str(folder), str(out), "-j", "0"])
    assert result.exit_code == 0, result.stderr  # an empty folder needs no --force
    # torchkit's own output (it has the marker), but for a file of the user's: refused.
    (out / "train" / CIFAR10_CLASSES[0] / "extra.png").write_bytes(b"")
    result = runner.invoke(app, ["convert", "cifar", str(folder), str(out), "-j", "0", "--force"])
    assert result.exit_code == 1 and "extra.png that torchkit did not write" in result.stderr
    assert (out / "train" / CIFAR10_CLASSES[0] / "extra.png").read_bytes() == b""
    (out / "train" / CIFAR10_CLASSES[0] / "extra.png").unlink()
    # an earlier version's (OpenCV's bare PNG, before the Software text): the run's own
    (out / "train" / CIFAR10_CLASSES[0] / "9999.png").write_bytes(bare_png((32, 32)))
    result = runner.invoke(app, ["convert", "cifar", str(folder), str(out), "-j", "0", "--force"])
    assert result.exit_code == 0, result.stderr
    check_output_tree(out, truth, CIFAR10_CLASSES)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no leftovers


def test_force_never_replaces_an_unmarked_folder_shaped_like_its_output(cifar10, tmp_path):
    """MNIST as PNG from another script: `train`/`test` of class folders of `<digits>.png`, the
    shape `convert cifar` writes, but no marker. Nothing in it says torchkit wrote it: refused,
    not deleted."""
    folder, _, _ = cifar10
    out = tmp_path / "mnist"
    for split in ("train", "test"):
        for digit in ("0", "7"):
            (out / split / digit).mkdir(parents=True)
            (out / split / digit / "00042.png").write_bytes(b"the user's only copy")
    before = tree_digest(out)
    result = runner.invoke(app, ["convert", "cifar", str(folder), str(out), "-j", "0", "--force"])
    assert result.exit_code == 1
    assert "was not written by torchkit" in error_line(result.stderr)
    assert tree_digest(out) == before


def test_coarse_labels_of_cifar10_is_a_usage_error(cifar10, tmp_path):
    folder, _, _ = cifar10
    result = runner.invoke(
        app, ["convert", "cifar", str(folder), str(tmp_path / "o"), "--label-type", "coarse"]
    )
    assert result.exit_code == 2
    assert "CIFAR-10 has no coarse labels" in result.stderr
    assert not (tmp_path / "o").exists()


# --- hostile and broken input -------------------------------------------------------------------


def _copy_folder(folder: Path, target: Path) -> Path:
    target.mkdir(parents=True)
    for path in folder.iterdir():
        (target / path.name).write_bytes(path.read_bytes())
    return target


def test_malicious_pickle_is_refused(cifar10, tmp_path):
    folder, _, _ = cifar10
    evil = _copy_folder(folder, tmp_path / "evil")
    marker = tmp_path / "pwned"
    (evil / "data_batch_3").write_bytes(pickle.dumps({b"data": RunsShell(marker)}))
    out = tmp_path / "out"
    result = runner.invoke(app, ["convert", "cifar", str(evil), str(out)])
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: refused to unpickle data_batch_3")
    assert "system" in result.stderr
    assert "Traceback" not in result.stderr
    assert not marker.exists()
    assert not out.exists()
    # The same pickle through the plain unpickler would have run the command: the test is real.
    pickle.loads((evil / "data_batch_3").read_bytes())
    assert marker.exists()


@pytest.mark.parametrize(
    "payload",
    [
        pickle.dumps(__import__("builtins").eval),  # a global that is not data
        b"\x80\x02c_codecs\nencode\nX\x01\x00\x00\x00xX\x08\x00\x00\x00zlib_cod\x86R.",
        b"\x80\x02cnumpy\nload\nX\x01\x00\x00\x00x\x85R.",
    ],
)
def test_restricted_unpickler_refuses_other_globals(payload):
    with pytest.raises(InputError, match="refused"):
        restricted_loads(payload, source="x")


class PickledArrayState:
    """Pickles as NumPy pickles an array (an empty one, then `state`), with a crafted state."""

    def __init__(self, shape: tuple, state: tuple | None) -> None:
        self.shape, self.state = shape, state

    def __reduce__(self):
        reconstruct = np.ndarray.__reduce__(np.zeros(1))[0]
        built = (reconstruct, (np.ndarray, self.shape, b"b"))
        return built if self.state is None else (*built, self.state)


def test_restricted_unpickler_builds_arrays_only_from_their_data(tmp_path):
    """An array's pickled state is trusted by NumPy: an object array listing fewer items than
    its shape crashed the process, and an empty array of any shape took gigabytes."""
    huge = pickle.dumps({"data": PickledArrayState((10**12,), None)}, protocol=2)
    with pytest.raises(InputError, match="refused to unpickle x: it builds an array without"):
        restricted_loads(huge, source="x")
    crash = pickle.dumps(PickledArrayState((0,), (1, (10**6,), np.dtype("O"), False, [1])))
    script = (
        "import sys; from torchkit.core.convert.safe_pickle import restricted_loads as load\n"
        "try: load(sys.stdin.buffer.read(), source='x')\n"
        "except Exception as error: print(error)"
    )
    done = subprocess.run([sys.executable, "-c", script], input=crash, capture_output=True)
    assert done.returncode == 0, done.stderr  # -11: a segmentation fault
    assert done.stdout.startswith(b"refused to unpickle x: it builds an array of Python objects")
    assert restricted_loads(pickle.dumps(np.arange(6).reshape(2, 3))).tolist() == [
        [0, 1, 2],
        [3, 4, 5],
    ]


def test_truncated_batch_is_a_clear_error(cifar10, tmp_path):
    folder, _, _ = cifar10
    broken = _copy_folder(folder, tmp_path / "broken")
    blob = (broken / "test_batch").read_bytes()
    (broken / "test_batch").write_bytes(blob[: len(blob) // 2])
    result = runner.invoke(app, ["convert", "cifar", str(broken), str(tmp_path / "out")])
    assert result.exit_code == 1
    assert "Error: cannot unpickle test_batch" in result.stderr
    assert "truncated" in result.stderr


@pytest.mark.parametrize(
    ("name", "attrs"),
    [
        ("../escape.txt", {}),
        ("/tmp/absolute.txt", {}),
        ("cifar-10-batches-py/../../escape", {}),
        ("cifar-10-batches-py/link", {"type": tarfile.SYMTYPE, "linkname": "../../etc/passwd"}),
    ],
)
def test_archive_member_outside_its_folder_is_refused(cifar10, tmp_path, name, attrs):
    _, archive, _ = cifar10
    hostile = tmp_path / "hostile.tar.gz"
    hostile.write_bytes(archive.read_bytes())
    add_member(hostile, name, **attrs)
    out = tmp_path / "sub" / "out"
    result = runner.invoke(app, ["convert", "cifar", str(hostile), str(out)])
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: refused to read")
    assert "outside" in result.stderr
    # Nothing written (the lock beside OUT may leave its parent folder behind, empty).
    assert [p for p in tmp_path.rglob("*") if not p.is_dir()] == [hostile]


def test_tar_that_is_not_cifar(tmp_path):
    archive = tmp_path / "photos.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("photos/a.jpg")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"abc"))
    result = runner.invoke(app, ["convert", "cifar", str(archive), str(tmp_path / "out")])
    assert result.exit_code == 1
    assert "is not a CIFAR-10 or CIFAR-100 python dataset" in result.stderr


def test_truncated_archive(cifar10, tmp_path):
    _, archive, _ = cifar10
    cut = tmp_path / "cut.tar.gz"
    data = archive.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    result = runner.invoke(app, ["convert", "cifar", str(cut), str(tmp_path / "out")])
    assert result.exit_code == 1
    assert "Error: cannot read archive" in result.stderr


def test_missing_batch_and_missing_source(cifar10, tmp_path):
    folder, _, _ = cifar10
    partial = _copy_folder(folder, tmp_path / "partial")
    (partial / "data_batch_2").unlink()
    result = runner.invoke(app, ["convert", "cifar", str(partial), str(tmp_path / "o")])
    assert result.exit_code == 1
    assert "data_batch_2 is missing" in result.stderr
    result = runner.invoke(app, ["convert", "cifar", str(tmp_path / "nope"), str(tmp_path / "o")])
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: CIFAR source not found")


@pytest.mark.parametrize(
    ("renames", "expected"),
    [
        # zero-padded names were read as data_batch_1.. and then looked up unpadded (KeyError)
        ({f"data_batch_{i}": f"data_batch_0{i}" for i in range(1, 6)}, "holds data_batch_01,"),
        # a data_batch_0 beside 1..5 made it report data_batch_6 as missing
        ({"data_batch_1": "data_batch_0", "data_batch_2": "data_batch_1"}, "holds data_batch_0,"),
    ],
)
def test_batch_names_that_are_not_cifar10_names_are_refused(cifar10, tmp_path, renames, expected):
    folder, _, _ = cifar10
    odd = _copy_folder(folder, tmp_path / "odd")
    for old, new in renames.items():  # in order: data_batch_1 -> 0 before 2 -> 1
        (odd / old).rename(odd / new)
    result = runner.invoke(app, ["convert", "cifar", str(odd), str(tmp_path / "out")])
    assert result.exit_code == 1
    assert expected in error_line(result.stderr)
    assert "not a CIFAR-10 batch name" in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ([2**70] * PER_BATCH, "not class numbers (they are object)"),  # was an OverflowError
        ([1.7] * PER_BATCH, "not class numbers (they are float64)"),  # was converted as class 1
    ],
)
def test_labels_that_are_not_class_numbers_are_refused(cifar10, tmp_path, labels, expected):
    folder, _, _ = cifar10
    bad = _copy_folder(folder, tmp_path / "bad")
    batch = {b"labels": labels, b"data": np.zeros((PER_BATCH, 3072), np.uint8)}
    (bad / "data_batch_4").write_bytes(pickle.dumps(batch, protocol=2))
    result = runner.invoke(app, ["convert", "cifar", str(bad), str(tmp_path / "out"), "-j", "0"])
    assert result.exit_code == 1
    assert error_line(result.stderr).startswith(
        f"Error: data_batch_4 has labels that are {expected}"
    )
    assert not (tmp_path / "out").exists()


def _labels_listed_by_reference(depth: int) -> list:
    """2 ** depth zeros nested `depth` deep, each level listing the one below twice: pickled by
    reference, a few bytes a level."""
    nested: list = [0, 0]
    for _ in range(depth - 1):
        nested = [nested, nested]
    return nested


@pytest.mark.parametrize(
    "labels",
    [
        [[3]] * PER_BATCH,  # was flattened and read as labels
        [_labels_listed_by_reference(40)] * PER_BATCH,  # was 20 * 2**40 numbers: terabytes
    ],
    ids=["nested", "expanding"],
)
def test_labels_nested_in_lists_are_refused_unexpanded(cifar10, tmp_path, labels):
    folder, _, _ = cifar10
    bad = _copy_folder(folder, tmp_path / "bad")
    batch = {b"labels": labels, b"data": np.zeros((PER_BATCH, 3072), np.uint8)}
    blob = pickle.dumps(batch, protocol=2)
    assert len(blob) < 70_000  # the crafted file is small
    (bad / "data_batch_4").write_bytes(blob)
    result = runner.invoke(app, ["convert", "cifar", str(bad), str(tmp_path / "out"), "-j", "0"])
    assert result.exit_code == 1
    line = error_line(result.stderr)
    assert line.startswith(
        "Error: data_batch_4 has labels that are not class numbers (one is a list)"
    )
    assert not (tmp_path / "out").exists()


def test_class_name_that_is_a_path_is_refused(cifar10, tmp_path):
    folder, _, _ = cifar10
    bad = _copy_folder(folder, tmp_path / "bad")
    names = [n.encode() for n in CIFAR10_CLASSES]
    names[4] = b"../../outside"
    (bad / "batches.meta").write_bytes(py2_pickle({b"label_names": names}))
    result = runner.invoke(app, ["convert", "cifar", str(bad), str(tmp_path / "out")])
    assert result.exit_code == 1
    assert "unusable class name" in result.stderr
    assert not (tmp_path / "outside").exists()


def test_output_that_holds_the_input_is_refused(cifar10, tmp_path):
    folder, _, _ = cifar10
    copy = _copy_folder(folder, tmp_path / "data" / "cifar")
    result = runner.invoke(app, ["convert", "cifar", str(copy), str(tmp_path / "data"), "--force"])
    assert result.exit_code == 1
    assert "contains the CIFAR source" in result.stderr
    assert (copy / "batches.meta").exists()


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # written as a hidden folder .x/ that every image-folder reader skips: the class vanished
        (b".x", "has an unusable class name '.x'"),
        # c10_3 and C10_3 were two folders here and one on macOS and Windows
        (b"C10_3", "differ only by case: 'c10_3' and 'C10_3'"),
        # failed only when writing, as a write error of the output folder
        (b"x" * 256, "has an unusable class name 'xxxx"),
    ],
)
def test_class_names_no_reader_would_see_are_refused(cifar10, tmp_path, name, expected):
    folder, _, _ = cifar10
    bad = _copy_folder(folder, tmp_path / "bad")
    names = [n.encode() for n in CIFAR10_CLASSES]
    names[4] = name
    (bad / "batches.meta").write_bytes(py2_pickle({b"label_names": names}))
    result = runner.invoke(app, ["convert", "cifar", str(bad), str(tmp_path / "out"), "-j", "0"])
    assert result.exit_code == 1
    assert expected in error_line(result.stderr)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("packed", [False, True], ids=["folder", "archive"])
def test_cifar10_and_cifar100_side_by_side_need_variant(cifar10, cifar100, tmp_path, packed):
    both = _copy_folder(cifar10[0], tmp_path / "cifar" / "batches")
    for path in cifar100[0].iterdir():
        (both / path.name).write_bytes(path.read_bytes())
    source = make_archive(both, tmp_path / "both.tar.gz", "batches") if packed else both
    out = tmp_path / "out"
    # CIFAR-10 was converted, CIFAR-100 silently left out
    result = runner.invoke(app, ["convert", "cifar", str(source), str(out)])
    assert result.exit_code == 1
    line = error_line(result.stderr)
    assert "holds both CIFAR-10" in line and "and CIFAR-100" in line
    assert "--variant cifar10 or --variant cifar100" in line
    assert not out.exists()
    for variant, dataset, classes in [
        ("cifar100", "cifar-100", FINE),
        ("cifar10", "cifar-10", CIFAR10_CLASSES),
    ]:
        args = [str(source), str(out), "--variant", variant, "--force", "--format", "json"]
        result = runner.invoke(app, ["convert", "cifar", *args, "-j", "0"])
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["dataset"] == dataset
        assert sorted(p.name for p in (out / "test").iterdir()) == sorted(classes)


def test_variant_the_source_does_not_hold_is_a_usage_error(cifar10, tmp_path):
    folder, _, _ = cifar10
    result = runner.invoke(
        app, ["convert", "cifar", str(folder), str(tmp_path / "o"), "--variant", "cifar100"]
    )
    assert result.exit_code == 2
    assert "holds no CIFAR-100 dataset, only CIFAR-10" in error_line(result.stderr)
    assert not (tmp_path / "o").exists()


def test_a_report_the_full_disk_refuses_leaves_the_old_output(cifar10, tmp_path, small_tmpfs):
    """`convert cifar SRC OUT --force -o REPORT` where REPORT's disk is full: the new PNGs had
    replaced the old OUT while the command failed. OUT and the report are as they were."""
    from disks import fill_disk

    folder, _, _ = cifar10
    out = tmp_path / "out"
    assert runner.invoke(app, ["convert", "cifar", str(folder), str(out), "-j", "0"]).exit_code == 0
    (out / "train" / CIFAR10_CLASSES[0] / "9999.png").write_bytes(bare_png())  # gone if replaced
    before = tree_digest(out)
    disk = small_tmpfs(64)
    report = disk / "report.json"
    report.write_text('{"old": "report"}\n')
    fill_disk(disk)
    args = ["convert", "cifar", str(folder), str(out), "-j", "0", "--force", "-o", str(report)]
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.stderr
    line = error_line(result.stderr, besides="nothing")
    assert line.startswith(f"Error: cannot write {report}: No space left"), line
    assert report.read_text() == '{"old": "report"}\n'
    assert sorted(p.name for p in disk.iterdir()) == ["filler", "report.json"]
    assert tree_digest(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", disk.name]  # nothing beside
