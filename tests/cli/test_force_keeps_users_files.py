"""`--force` replaces only what torchkit wrote: an output folder of the same command that holds a
file, folder or link the user added (notes.txt in a run folder, a plot beside eval's reports, a
folder of analysis) is refused before any work, naming the first and counting the rest, and
nothing is touched. Before, the folder was replaced whole and the user's files went with it."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path

import pytest
from format_files import bare_png, chrome_trace, owned_tar, tensorboard_events
from output_checks import check_refused_untouched, error_line, tree_digest
from processes import run_torchkit_in_process
from safety_world import marked, write_world

from torchkit.core.io.errors import OutputExistsError
from torchkit.core.io.folder_contents import exact_pattern, foreign_entries, names_inside
from torchkit.core.io.force import note_report, write_marker
from torchkit.core.io.output_paths import MARKER, WRITTEN_JOURNAL
from torchkit.core.io.output_proofs import with_software_text
from torchkit.core.io.outputs import OutputFolder
from torchkit.core.train.outputs import RUN_OUTPUTS

TINY = ["--model", "convnet", "--image-size", "8", "--batch-size", "4", "--workers", "0"]
TRAIN = ["train", *TINY, "--data", "ds", "--val-split", "0.5", "--epochs", "1"]


def _saved(value: object) -> bytes:
    import io

    import torch

    saved = io.BytesIO()
    torch.save(value, saved)
    return saved.getvalue()


# What torchkit writes under the names others use too, as --force's proofs read them: a
# checkpoint with torchkit's keys, a run's config.json, an eval's metrics.json.
CHECKPOINT = _saved({"format_version": 1, "torchkit_version": "0.1.0", "model": {}})


def _zipped(records: dict[str, bytes]) -> bytes:
    """A zip holding `records` (name -> bytes), as a hand-made `best.pt` is."""
    import io
    import zipfile

    made = io.BytesIO()
    with zipfile.ZipFile(made, "w") as archive:
        for name, data in records.items():
            archive.writestr(name, data)
    return made.getvalue()


def _without_record(saved: bytes, name: str) -> bytes:
    """torch.save's zip `saved` less its record `ARCHIVE/name`."""
    import io
    import zipfile

    with zipfile.ZipFile(io.BytesIO(saved)) as archive:
        kept = {
            info.filename: archive.read(info)
            for info in archive.infolist()
            if info.filename.split("/", 1)[1] != name
        }
    return _zipped(kept)


# Files that hold torchkit's key strings without being a checkpoint it wrote: --force's proof
# (the words anywhere in a zip's data.pkl record) took each for torchkit's and deleted it.
KEYS_NOT_A_CHECKPOINT = {
    "the words in a hand-made zip": _zipped(
        {"archive/data.pkl": b"torchkit_version format_version", "archive/version": b"3\n"}
    ),
    "a pickle of them in a zip without torch.save's records": _zipped(
        {
            "archive/data.pkl": __import__("pickle").dumps(
                {"format_version": 2, "torchkit_version": "0.1.0"}, protocol=2
            )
        }  # fmt: skip
    ),
    "the words as values": _saved({"notes": ["torchkit_version", "format_version"]}),
    "the keys of an inner dict": _saved(
        {"arch": "yolo", "meta": {"format_version": 1, "torchkit_version": "0.1.0"}}
    ),
    "a format_version that is not a number": _saved(
        {"format_version": "v1", "torchkit_version": "0.1.0"}
    ),
}
# (and torchkit's own checkpoint less the record that tells torch.save's format version)
KEYS_NOT_A_CHECKPOINT["a checkpoint less its version record"] = _without_record(
    _saved({"format_version": 1, "torchkit_version": "0.1.0", "model": {}}), "version"
)


NPY = b"\x93NUMPY\x01\x00" + b"v" * 10  # a .npy's magic and version, as numpy writes
SHARDS_MANIFEST = json.dumps(
    {"written_by": "torchkit convert shards", "classes": ["a"], "shards": []}
)
FRAME = with_software_text(bare_png((16, 16)))  # a frame as video-info writes it
RUN_CONFIG = json.dumps({"options": {}, "arch": "convnet", "classes": ["a"], "preprocess": {}})
PER_CLASS = "label,index,support,predicted,precision\na,0,1,1,1.0\n"  # eval's header
EVAL_METRICS = json.dumps(
    {"num_images": 1, "num_skipped": 0, "accuracy": 1.0, "topk_accuracy": {"top5": 1.0}}
)


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """The inputs every command here reads (`ds`, `run/best.pt`...) and a file named as a video
    (the frames folder is judged before any video is opened)."""
    root = write_world(tmp_path_factory.mktemp("template"))
    (root / "clip.avi").write_bytes(b"not read: the frames folder is refused first")
    return root


@pytest.fixture
def world(template, tmp_path) -> Path:
    return Path(shutil.copytree(template, tmp_path / "world", symlinks=True))


# command line, the output folder, its marker's command, what torchkit wrote there, the user's
# file, the first path the error names
FAMILIES = {
    "train": (
        [*TRAIN, "--out", "out", "--force"],
        "train",
        {
            "config.json": RUN_CONFIG,
            "last.pt": CHECKPOINT,
            "tensorboard/events.out.tfevents.1.h": tensorboard_events(),
            "profile/epoch-1.txt": "torchkit train --profile-steps: epoch 1, its first 2 ...\n",
            "profile/epoch-1.json": chrome_trace(),
        },
        {"notes.txt": "my notes on this run"},
        "run folder out holds out/notes.txt that torchkit did not write",
    ),
    "eval": (
        ["eval", "run/best.pt", "--data", "ds", "-j", "0", "--out", "out", "--force"],
        "eval",
        {"metrics.json": EVAL_METRICS, "per_class.csv": PER_CLASS},
        {"my_plot.png": "x"},
        "output folder out holds out/my_plot.png that torchkit did not write",
    ),
    "extract-features": (
        ["extract-features", "run/best.pt", "ds", "out", "-l", "logits", "-j", "0", "--force"],
        "extract-features",
        {"index.csv": "row,path,label,error\n", "logits.npy": NPY},
        {"analysis/umap.png": "x"},
        "output folder out holds out/analysis/ that torchkit did not write",
    ),
    "convert tensor": (
        ["convert", "tensor", "ds", "out", "--to", "npy", "--force"],
        "convert tensor",
        {"a/a_0.npy": NPY},
        {"a/README": "x"},
        "output folder out holds out/a/README that torchkit did not write",
    ),
    "convert cifar": (
        ["convert", "cifar", "ds", "out", "--force"],
        "convert cifar",
        {"train/cat/0.png": bare_png(), "test/cat/0.png": with_software_text(bare_png())},
        {"train/cat/my_cat.jpg": "x"},
        "output folder out holds out/train/cat/my_cat.jpg that torchkit did not write",
    ),
    "convert shards": (
        ["convert", "shards", "ds", "out", "--force"],
        "convert shards",
        {"train-000000.tar": owned_tar(), "manifest.json": SHARDS_MANIFEST, "classes.txt": "a\n"},
        {"train-000000.tar.md5": "x"},
        "output folder out holds out/train-000000.tar.md5 that torchkit did not write",
    ),
    "video-info frames": (
        ["video-info", "clip.avi", "--segments", "2", "--extract-frames", "out", "--force"],
        "video-info",
        {"clip_000001.png": bare_png((16, 16)), "clip_000004.png": FRAME},
        {"notes.txt": "x"},
        "frames folder out holds out/notes.txt that torchkit did not write",
    ),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_force_refuses_an_output_folder_holding_a_users_file(world, family):
    args, command, own, users, message = FAMILIES[family]
    marked(world / "out", command, {**own, **users})
    check_refused_untouched(args, message, cwd=world)
    done = run_torchkit_in_process(*args, cwd=world)
    assert error_line(done.stderr, besides="warnings").endswith(
        "which --force would delete with it (move them out of out, or delete them yourself)"
    )


# A file of the user's under a name torchkit writes too, which torchkit cannot show it wrote
# (another trainer's checkpoint, another tool's record or log): --force deleted it silently.
USERS_UNDER_TORCHKIT_NAMES = {
    "another trainer's best.pt": ("train", {"best.pt": b"PK not a torchkit checkpoint"}),
    "another trainer's epoch checkpoint": ("train", {"epoch-042.pt": CHECKPOINT[:100]}),
    "a plain state dict": (
        "train",
        {"last.pt": CHECKPOINT.replace(b"torchkit_version", b"x" * 16)},
    ),
    "another tool's config.json": ("train", {"config.json": '{"lr": 0.1}'}),
    "another logger's metrics.csv": ("train", {"metrics.csv": "step,loss\n1,0.5\n"}),
    "another tool's metrics.json": ("eval", {"metrics.json": '{"accuracy": 0.9}'}),
    "not a TensorBoard log": ("train", {"tensorboard/events.out.tfevents.1.h": "my notes\n"}),
    "a TensorBoard log's first bytes only": (
        "train",
        {"tensorboard/events.out.tfevents.2.h": tensorboard_events()[:10]},
    ),
    "your notes as a profile table": ("train", {"profile/epoch-1.txt": "slow dataloader\n"}),
    "another tool's trace": ("train", {"profile/epoch-1.json": '{"traceEvents": []}'}),
    **{what: ("train", {"best.pt": data}) for what, data in KEYS_NOT_A_CHECKPOINT.items()},
}


@pytest.mark.parametrize("case", list(USERS_UNDER_TORCHKIT_NAMES))
def test_force_refuses_a_users_file_under_a_name_torchkit_writes_too(world, case):
    """Refused before any work, naming the file, with a hint that leads to no other refusal:
    once the file is moved out, --force replaces the folder."""
    command, users = USERS_UNDER_TORCHKIT_NAMES[case]
    own = {"last.pt": CHECKPOINT} if command == "train" else {"per_class.csv": PER_CLASS}
    marked(world / "out", command, {**own, **users})
    args = FAMILIES[command][0]
    (name,) = users
    what = "run folder" if command == "train" else "output folder"
    check_refused_untouched(
        args, f"{what} out holds out/{name} that torchkit did not write", cwd=world
    )
    done = run_torchkit_in_process(*args, cwd=world)
    assert error_line(done.stderr, besides="warnings").endswith(
        "which --force would delete with it (move them out of out, or delete them yourself)"
    )
    moved = world / Path(name).name
    (world / "out" / name).rename(moved)  # as the hint says
    done = run_torchkit_in_process(*args, cwd=world)
    assert done.returncode == 0, done.stderr
    assert moved.is_file()


def test_force_replaces_the_records_of_a_run_and_an_eval_of_many_classes(world):
    """A run of 30,000 classes writes a config.json of 1.4 MB (its classes listed), an eval of
    as many a metrics.json of several (a record per class): both are the command's own. Read
    only up to 1 MB, they were taken for another tool's files and --force was refused."""
    classes = [f"species_{index:05d}_a_rather_long_latin_name" for index in range(30_000)]
    config = {"options": {}, "arch": "convnet", "classes": classes, "preprocess": {}}
    marked(
        world / "out", "train", {"last.pt": CHECKPOINT, "config.json": json.dumps(config, indent=2)}
    )
    assert (world / "out" / "config.json").stat().st_size > 1 << 20
    before = tree_digest(world)
    done = run_torchkit_in_process(
        *TRAIN, "--out", "out", "--force", "--model", "no_such_module:Net", cwd=world
    )  # past the folder's check, to the model, which cannot be found
    assert done.returncode == 2 and "no_such_module" in error_line(done.stderr)
    assert tree_digest(world) == before
    metrics = {
        **json.loads(EVAL_METRICS),
        "classes": classes,
        "per_class": [{"class": name, "precision": 0.5, "recall": 0.5} for name in classes],
    }
    marked(
        world / "report", "eval", {"metrics.json": json.dumps(metrics), "per_class.csv": PER_CLASS}
    )
    assert (world / "report" / "metrics.json").stat().st_size > 1 << 20
    done = run_torchkit_in_process(
        *FAMILIES["eval"][0][:-3], "--out", "report", "--force", cwd=world
    )
    assert done.returncode == 0, done.stderr
    assert json.loads((world / "report" / "metrics.json").read_text())["num_classes"] < 10


def test_the_error_counts_what_else_is_not_torchkits(world):
    marked(
        world / "out", "train", {"last.pt": CHECKPOINT, "a.txt": "x", "b.txt": "x", "c/d.txt": "x"}
    )
    check_refused_untouched(
        [*TRAIN, "--out", "out", "--force"],
        "run folder out holds out/a.txt and 2 more that torchkit did not write",
        cwd=world,
    )


def test_a_torchkit_name_in_another_place_or_a_link_is_the_users(world):
    """`extra/best.pt` is not the run's best.pt; a link named best.pt is not a file train
    wrote (it is not followed: what it points at is not judged, nor deleted)."""
    marked(world / "out", "train", {"last.pt": CHECKPOINT, "extra/best.pt": "x"})
    marked(world / "linked", "train", {"last.pt": CHECKPOINT})
    (world / "linked" / "best.pt").symlink_to(world / "run" / "best.pt")
    marked(world / "old", "train", {"last.pt": CHECKPOINT, "tensorboard/notes.txt": "x"})
    (world / "old" / MARKER).unlink()  # a run from before the marker: known by config.json
    config = {"options": {}, "arch": "convnet", "classes": ["a", "b"], "preprocess": {}}
    (world / "old" / "config.json").write_text(json.dumps(config))
    for out, first in [
        ("out", "out/extra/"),
        ("linked", "linked/best.pt"),
        ("old", "old/tensorboard/notes.txt"),
    ]:
        check_refused_untouched(
            [*TRAIN, "--out", out, "--force"],
            f"holds {first} that torchkit did not write",
            cwd=world,
        )


def test_the_summary_this_run_writes_into_its_folder_is_its_own(world):
    """`train --out run --force -o run/summary.json` again: the earlier summary is replaced
    with the run (the run goes on to its next step, here a model that cannot be found); a
    summary under another name is a file this run does not write."""
    marked(world / "out", "train", {"last.pt": CHECKPOINT, "summary.json": "{}"})
    before = tree_digest(world)
    args = [*TRAIN, "--out", "out", "--force"]
    done = run_torchkit_in_process(
        *args, "--model", "no_such_module:Net", "-o", "out/summary.json", cwd=world
    )
    assert done.returncode == 2 and "no_such_module" in error_line(done.stderr)
    assert tree_digest(world) == before
    check_refused_untouched(
        [*args, "-o", "out/other.json"],
        "holds out/summary.json that torchkit did not write",
        cwd=world,
    )


def test_an_earlier_runs_summary_under_another_name_goes_with_its_run_folder(world):
    """A run folder whose marker records the summary `-o out/summary.json` wrote there (as
    train's `note_report` does): `train --out out --force -o out/other.json` no longer refuses
    it as a file torchkit did not write (the run goes on to its model, which cannot be found)."""
    out = marked(world / "out", "train", {"last.pt": CHECKPOINT, "summary.json": "{}"})
    write_marker(out, "train", reports=["summary.json"])
    note_report(out / "summary.json")
    before = tree_digest(world)
    done = run_torchkit_in_process(
        *TRAIN, "--out", "out", "--force", "--model", "no_such_module:Net", "-o",
        "out/other.json", cwd=world,
    )  # fmt: skip
    assert done.returncode == 2 and "no_such_module" in error_line(done.stderr)
    assert tree_digest(world) == before


def test_the_report_a_run_writes_into_its_output_folder_is_its_own(world):
    """`convert shards ds out --force -o out/report.json` again: the earlier report, which
    that command wrote there, is replaced with the rest, also under another -o name (it was
    refused as a file "torchkit did not write"); once the user changes it, it is theirs."""
    again = ["convert", "shards", "ds", "out", "--force", "-o", "out/report.json"]
    for _ in range(2):
        done = run_torchkit_in_process(*again, cwd=world)
        assert done.returncode == 0, done.stderr
    assert json.loads((world / "out" / "report.json").read_text())
    other = ["convert", "shards", "ds", "out", "--force", "-o", "out/other.json"]
    done = run_torchkit_in_process(*other, cwd=world)
    assert done.returncode == 0, done.stderr
    assert json.loads((world / "out" / "other.json").read_text())
    assert not (world / "out" / "report.json").exists()
    with open(world / "out" / "other.json", "a") as report:
        report.write("\n")  # the user's now, whatever its name
    check_refused_untouched(
        [*again[:-1], "out/third.json"],
        "output folder out holds out/other.json that torchkit did not write",
        cwd=world,
    )


def test_the_report_a_resumed_run_writes_into_its_folder_is_its_own(world):
    """`train --resume out -o out/resumed.json`: the folder's marker listed only the reports
    of the run that made it, so the next `train --out out --force` refused resumed.json as a
    file "torchkit did not write". Now a continued run lists its own too."""
    assert run_torchkit_in_process(*TRAIN, "--out", "out", cwd=world).returncode == 0
    resumed = [*TRAIN[:-1], "2", "--resume", "out", "-o", "out/resumed.json"]
    done = run_torchkit_in_process(*resumed, cwd=world)
    assert done.returncode == 0, done.stderr
    assert json.loads((world / "out" / "resumed.json").read_text())
    again = run_torchkit_in_process(*TRAIN, "--out", "out", "--force", cwd=world)
    assert again.returncode == 0, again.stderr
    assert not (world / "out" / "resumed.json").exists()  # replaced with the rest


def test_a_report_in_an_output_copied_with_new_times_is_still_its_own(world):
    """An output folder copied as `cp -r` copies it (the same bytes, new times): the report its
    run wrote there was known by size and time only, and --force over the copy refused it as
    "torchkit did not write"; now by its content too. Other bytes of the same size are not."""
    done = run_torchkit_in_process(
        "convert", "shards", "ds", "out", "-o", "out/report.json", cwd=world
    )
    assert done.returncode == 0, done.stderr
    for name in ("copy", "changed"):
        shutil.copytree(world / "out", world / name, copy_function=shutil.copy)
        report = world / name / "report.json"
        later = report.stat().st_mtime_ns + 7_000_000_000  # apart from the original's time
        os.utime(report, ns=(later, later))
    changed = world / "changed" / "report.json"
    text = changed.read_text()
    changed.write_text(text.replace('"', "'", 1))  # other bytes, the same size
    os.utime(changed, ns=(later, later))
    check_refused_untouched(
        ["convert", "shards", "ds", "changed", "--force"],
        "output folder changed holds changed/report.json that torchkit did not write",
        cwd=world,
    )
    again = run_torchkit_in_process("convert", "shards", "ds", "copy", "--force", cwd=world)
    assert again.returncode == 0, again.stderr
    assert not (world / "copy" / "report.json").exists()  # replaced with the rest


def test_a_users_file_under_the_name_of_an_earlier_report_is_the_users(world):
    """The marker names the report a run wrote; a file put at that name since (the report
    deleted, or never written: the run failed first) is not that report."""
    done = run_torchkit_in_process(
        "convert", "shards", "ds", "out", "-o", "out/report.json", cwd=world
    )
    assert done.returncode == 0, done.stderr
    (world / "out" / "report.json").unlink()
    (world / "out" / "report.json").write_text("my own report")
    check_refused_untouched(
        ["convert", "shards", "ds", "out", "--force"],
        "output folder out holds out/report.json that torchkit did not write",
        cwd=world,
    )


def test_the_report_video_info_writes_into_its_frames_folder_is_its_own(tmp_path):
    """`video-info --extract-frames frames --force -o frames/report.csv` again: the report the
    last run wrote beside its frames goes with them, also under another -o name."""
    import cv2
    import numpy as np

    writer = cv2.VideoWriter(
        str(tmp_path / "clip.avi"), cv2.CAP_FFMPEG, cv2.VideoWriter_fourcc(*"MJPG"), 10.0, (16, 16)
    )
    if not writer.isOpened():
        pytest.skip("this OpenCV build cannot write MJPG AVI")
    for value in range(6):
        writer.write(np.full((16, 16, 3), value * 40, dtype=np.uint8))
    writer.release()
    frames = ["video-info", "clip.avi", "--segments", "2", "--extract-frames", "frames", "--force"]
    for _ in range(2):
        done = run_torchkit_in_process(*frames, "-o", "frames/report.csv", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    assert (tmp_path / "frames" / "report.csv").is_file()
    done = run_torchkit_in_process(*frames, "-o", "frames/other.csv", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "frames" / "other.csv").is_file()
    assert not (tmp_path / "frames" / "report.csv").exists()


def test_torchkits_own_leftovers_and_a_browsers_files_are_not_the_users(tmp_path):
    """The marker, the journal of a killed run, a dead writer's temporary, an output set aside
    inside the folder and `.DS_Store` go with the folder; a temporary a live writer holds is
    still being written, and a FIFO is nobody's output."""
    out = marked(tmp_path / "out", "train", {"last.pt": CHECKPOINT, "tensorboard/.DS_Store": "x"})
    (out / WRITTEN_JOURNAL).write_text('"last.pt"\n')
    (out / ".last.pt.abcd1234.tmp").write_text("half")
    (out / ".best.pt.0123456789ab.replaced").write_text("old")
    assert foreign_entries(out, RUN_OUTPUTS, top_level=(MARKER, WRITTEN_JOURNAL)) == []
    with OutputFolder(out, command="train", force=True, owned=RUN_OUTPUTS) as folder:
        assert folder.has_content
    os.mkfifo(out / "pipe")
    with open(out / ".metrics.csv.abcd1234.tmp", "w") as live:
        fcntl.flock(live, fcntl.LOCK_EX)
        found = foreign_entries(out, RUN_OUTPUTS, top_level=(MARKER, WRITTEN_JOURNAL))
    assert found == [".metrics.csv.abcd1234.tmp", "pipe"]


def test_patterns_name_files_at_their_depth_and_folders_on_their_way(tmp_path):
    out = tmp_path / "out"
    for name in ["a/b/x.npy", "a/x.NPY", "x.npy", "a/b/x.txt", "train/cat/0.png", "c/0.png"]:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text("x")
    (out / "empty").mkdir()
    assert foreign_entries(out, ["train/*/[0-9]*.png"]) == ["a/", "c/", "empty/", "x.npy"]
    assert foreign_entries(out, ["**/*.npy"]) == [
        "a/x.NPY",
        "a/b/x.txt",
        "c/0.png",
        "train/cat/0.png",
    ]
    assert foreign_entries(out, ["train/*/[0-9]*.png", "**/*.[nN][pP][yY]"]) == [
        "a/b/x.txt",
        "c/0.png",
    ]


def test_a_report_name_holding_glob_characters_names_that_file_only(tmp_path):
    """`-o "run/summary[1]*.json"` written into the run folder: that name is the run's own,
    never read as a pattern that takes in `summary1x.json` of the user's."""
    out = tmp_path / "out"
    out.mkdir()
    for name in ["summary[1]*.json", "summary1x.json"]:
        (out / name).write_text("{}")
    owned = names_inside(out, [out / "summary[1]*.json", "-", None, tmp_path / "elsewhere.json"])
    assert owned == [exact_pattern("summary[1]*.json")]
    assert foreign_entries(out, owned) == ["summary1x.json"]


def test_resume_continues_a_folder_holding_the_users_files(tmp_path):
    """`train --resume` does not replace its folder: the user's files in it are no reason to
    refuse, and stay."""
    out = marked(tmp_path / "out", "train", {"last.pt": CHECKPOINT, "notes.txt": "mine"})
    with OutputFolder(out, command="train", resume=True, owned=RUN_OUTPUTS) as folder:
        (folder.begin() / "epoch-002.pt").write_bytes(CHECKPOINT)
    assert (out / "notes.txt").read_text() == "mine"
    with pytest.raises(OutputExistsError, match="holds .*notes.txt that torchkit did not write"):
        OutputFolder(out, command="train", force=True, owned=RUN_OUTPUTS)


def test_a_report_the_marker_does_not_list_is_not_read(tmp_path, monkeypatch):
    """`predict -o RUN/preds/all.csv` below a run folder: the run's marker does not list it, so
    recording it reads nothing. Before, its content's digest was taken first (up to 256 MiB
    read) and thrown away; the run's own report is still recorded with its digest."""
    import hashlib

    from torchkit.core.io import force

    out = tmp_path / "run"
    out.mkdir()
    write_marker(out, "train", reports=["summary.json"])
    (out / "preds").mkdir()
    (out / "preds" / "all.csv").write_text("path,label\n")
    (out / "summary.json").write_text("{}\n")
    read = []
    digest = force._content_digest
    monkeypatch.setattr(force, "_content_digest", lambda path, size: read.append(path.name))
    note_report(out / "preds" / "all.csv")
    assert read == []
    monkeypatch.setattr(force, "_content_digest", digest)
    note_report(out / "summary.json")
    [entry] = json.loads((out / ".torchkit").read_text())["reports"]
    assert entry["sha256"] == hashlib.sha256(b"{}\n").hexdigest()
