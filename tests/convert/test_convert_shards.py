"""`torchkit convert shards SRC OUT`: WebDataset shards of any data torchkit reads. The tars are
checked member by member against the source files, read back by webdataset's own reader, and
the safety rules (atomic shards, resume, overlap, --force, full disk, signals) tried for real."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from disks import fill_disk, paused_io_env, slow_io_env
from image_folders import write_image_folder
from output_checks import error_line, tree_digest
from PIL import Image
from processes import run_torchkit_in_process, start_torchkit_process, wait_until

from torchkit.core.convert.shards import closed_size, parse_size, read_partial


def convert(*args: object, cwd: Path | None = None):
    return run_torchkit_in_process("convert", "shards", *args, cwd=cwd)


def sigkilled_when_paused(process, paused: Path, what: str) -> None:
    """SIGKILL `process` once it is paused (`paused_io_env`: at the step `what`), then reap it."""
    try:
        wait_until(paused.exists, process=process, what=what)
        process.send_signal(signal.SIGKILL)
    finally:
        process.communicate(timeout=60)


def members(tar_path: Path) -> dict[str, bytes]:
    with tarfile.open(tar_path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def samples_of(tar_path: Path) -> dict[str, dict[str, bytes]]:
    """KEY -> {extension: bytes}, grouped as webdataset groups members."""
    grouped: dict[str, dict[str, bytes]] = {}
    for name, data in members(tar_path).items():
        key, _, extension = name.partition(".")
        grouped.setdefault(key, {})[extension] = data
    return grouped


def shard_files(out: Path) -> list[str]:
    return sorted(p.name for p in out.glob("*.tar"))


def tree_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name != ".torchkit"}


@pytest.fixture
def split_root(tmp_path: Path) -> Path:
    root = tmp_path / "split"
    write_image_folder(root / "train", {"cat": 4, "dog": 3}, seed=1)
    write_image_folder(root / "val", {"cat": 1, "dog": 2}, seed=2)
    return root


def test_tar_members_hold_the_source_bytes_labels_and_paths(tmp_path: Path, image_folder: Path):
    out = tmp_path / "out"
    done = convert(image_folder, out, "--per-shard", 2)
    assert done.returncode == 0, done.stderr
    assert shard_files(out) == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    assert (out / "classes.txt").read_text() == "a\nb\n"
    seen = []
    for name in shard_files(out):
        for key, sample in samples_of(out / name).items():
            assert "." not in key and key.startswith("sample_")
            assert sorted(sample) == ["cls", "json", "png"]
            about = json.loads(sample["json"])
            assert sample["png"] == (image_folder / about["path"]).read_bytes()
            assert about["label"] == about["path"].split("/")[0]
            assert int(sample["cls"]) == ["a", "b"].index(about["label"])
            seen.append(about["path"])
    assert sorted(seen) == sorted(
        p.relative_to(image_folder).as_posix() for p in image_folder.rglob("*.png")
    )


def test_webdataset_reads_every_sample_with_its_label(tmp_path: Path, split_root: Path):
    import webdataset

    out = tmp_path / "out"
    assert convert(split_root, out, "--per-shard", 3).returncode == 0
    classes = (out / "classes.txt").read_text().splitlines()
    for split, count in (("train", 7), ("val", 3)):
        urls = [str(out / name) for name in shard_files(out) if name.startswith(split + "-")]
        dataset = webdataset.WebDataset(urls, shardshuffle=False).decode("pil")
        read = list(dataset)
        assert len(read) == count
        for sample in read:
            about = sample["json"]
            assert about["path"].startswith(f"{split}/")
            assert classes[sample["cls"]] == about["label"] == about["path"].split("/")[1]
            assert sample["png"].size == (8, 8)
            assert sample["__key__"].startswith(f"{split}_")


def test_digits_are_written_as_png_per_split(tmp_path: Path):
    from torchkit.core.data.sources import open_data

    out = tmp_path / "digits"
    assert convert("digits", out, "--no-shuffle", "--per-shard", 1000).returncode == 0
    assert shard_files(out) == [
        "test-000000.tar",
        "train-000000.tar",
        "train-000001.tar",
        "val-000000.tar",
    ]
    manifest = json.loads((out / "manifest.json").read_text())
    assert {k: v["samples"] for k, v in manifest["splits"].items()} == {
        "train": 1438,
        "val": 180,
        "test": 179,
    }
    first = samples_of(out / "val-000000.tar")["val_00000000"]
    val = open_data("digits").splits["val"]
    assert json.loads(first["json"]) == {"label": val.classes[val.labels[0]], "path": val.ids[0]}
    pixels = Image.open(io.BytesIO(first["png"]))
    assert pixels.format == "PNG" and pixels.tobytes() == val.images[0].tobytes()


def test_per_shard_and_shard_size_limits(tmp_path: Path, make_image_folder):
    data = make_image_folder(tmp_path / "data", {"a": 5, "b": 4}, size=16)
    by_count = tmp_path / "count"
    assert convert(data, by_count, "--per-shard", 4).returncode == 0
    counts = [s["samples"] for s in json.loads((by_count / "manifest.json").read_text())["shards"]]
    assert counts == [4, 4, 1]

    # An 80x80 noise PNG (~19 kB) is larger than the limit: alone in its shard.
    big = tmp_path / "data" / "a" / "zz_big.png"
    Image.frombytes("RGB", (80, 80), os.urandom(80 * 80 * 3)).save(big)
    limit = 12 * 1024
    by_size = tmp_path / "size"
    assert convert(data, by_size, "--shard-size", "12KiB", "--no-shuffle").returncode == 0
    shards = json.loads((by_size / "manifest.json").read_text())["shards"]
    assert sum(s["samples"] for s in shards) == 10
    for shard in shards:
        size = (by_size / shard["name"]).stat().st_size
        assert size == shard["bytes"]
        names = members(by_size / shard["name"])
        if any(name.endswith(".png") and len(data) > limit for name, data in names.items()):
            assert shard["samples"] == 1  # the oversized image alone
        else:
            assert size <= limit

    # Each shard closed only because its next sample would have passed the limit.
    def tar_bytes(sample: dict[str, bytes]) -> int:
        return sum(512 + -(-len(data) // 512) * 512 for data in sample.values())

    for shard, following in zip(shards, shards[1:], strict=False):
        content = sum(tar_bytes(s) for s in samples_of(by_size / shard["name"]).values())
        first_next = next(iter(samples_of(by_size / following["name"]).values()))
        assert closed_size(content + tar_bytes(first_next)) > limit


def test_the_same_seed_gives_the_same_bytes_and_no_shuffle_keeps_the_order(
    tmp_path: Path, split_root: Path
):
    first, second, other, ordered = (tmp_path / n for n in ("a", "b", "c", "d"))
    for out, seed in ((first, "7"), (second, "7"), (other, "8")):
        assert convert(split_root, out, "--seed", seed, "--per-shard", 3).returncode == 0
    assert tree_bytes(first) == tree_bytes(second)
    assert tree_bytes(first) != tree_bytes(other)
    assert convert(split_root, ordered, "--no-shuffle").returncode == 0
    paths = [
        json.loads(sample["json"])["path"]
        for sample in samples_of(ordered / "train-000000.tar").values()
    ]
    assert paths == sorted(paths)  # the source lists cat/ then dog/, each in name order
    with tarfile.open(first / "train-000000.tar") as tar:
        infos = tar.getmembers()
    for info in infos:
        assert (info.mtime, info.uid, info.gid, info.uname) == (0, 0, 0, "torchkit")


def test_manifest_counts_and_sha256(tmp_path: Path, split_root: Path):
    out = tmp_path / "out"
    done = convert(split_root, out, "--per-shard", 2, "--format", "json")
    assert done.returncode == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is True and manifest["classes"] == ["cat", "dog"]
    assert manifest["splits"]["train"]["class_counts"] == {"cat": 4, "dog": 3}
    assert manifest["splits"]["val"]["class_counts"] == {"cat": 1, "dog": 2}
    assert manifest["options"]["per_shard"] == 2 and manifest["options"]["seed"] == 0
    for shard in manifest["shards"]:
        data = (out / shard["name"]).read_bytes()
        assert shard["bytes"] == len(data)
        assert shard["sha256"] == hashlib.sha256(data).hexdigest()
        assert shard["samples"] == len(samples_of(out / shard["name"]))
    assert sorted(s["name"] for s in manifest["shards"]) == shard_files(out)
    report = json.loads(done.stdout)
    assert report["samples"] == 10 and report["shards"] == 6 and report["unreadable"] == 0
    assert not (out / "manifest.partial.json").exists()


def _interrupted_copy(complete: Path, shards_kept: int) -> None:
    """Make `complete` look like a run stopped after its first `shards_kept` shards."""
    manifest = json.loads((complete / "manifest.json").read_text())
    for shard in manifest["shards"][shards_kept:]:
        (complete / shard["name"]).unlink()
    manifest["shards"] = manifest["shards"][:shards_kept]
    manifest["complete"] = False
    (complete / "manifest.partial.json").write_text(json.dumps(manifest))
    (complete / "manifest.json").unlink()


def test_an_interrupted_run_resumes_and_other_options_need_force(tmp_path: Path, split_root: Path):
    reference, out = tmp_path / "reference", tmp_path / "out"
    assert convert(split_root, reference, "--per-shard", 2).returncode == 0
    assert convert(split_root, out, "--per-shard", 2).returncode == 0
    _interrupted_copy(out, 2)
    (out / "train-000001.tar").write_bytes(b"damaged")  # kept only if its SHA-256 matches
    (out / ".val-000000.tar.x1y2z3w4.tmp").write_bytes(b"half a shard")  # atomic_write's

    done = convert(split_root, out, "--per-shard", 2, "--seed", "1")
    assert done.returncode == 1
    assert "interrupted convert shards run with --seed 0 instead of 1" in error_line(done.stderr)
    assert "--force" in error_line(done.stderr)

    done = convert(split_root, out, "--per-shard", 2, "--format", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["kept_shards"] == 1  # the damaged second one is written again
    assert tree_bytes(out) == tree_bytes(reference)

    _interrupted_copy(out, 1)
    assert convert(split_root, out, "--per-shard", 3, "--force").returncode == 0
    assert json.loads((out / "manifest.json").read_text())["options"]["per_shard"] == 3


def test_a_killed_run_leaves_whole_shards_and_the_same_command_finishes_it(
    tmp_path: Path, split_root: Path
):
    reference, out = tmp_path / "reference", tmp_path / "out"
    args = ("convert", "shards", str(split_root), str(out), "--per-shard", "1")
    assert convert(split_root, reference, "--per-shard", "1").returncode == 0
    # Stopped once its third shard took its name (a rename onto a `.tar`).
    env, paused = paused_io_env(tmp_path, ".tar", calls=("os.replace",), after=True, at=3)
    sigkilled_when_paused(start_torchkit_process(*args, env=env), paused, "three shards")
    assert len(shard_files(out)) == 3
    assert not (out / "manifest.json").exists()
    partial = read_partial(out)
    for shard in partial["shards"]:
        data = (out / shard["name"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == shard["sha256"]
    done = convert(*args[2:])
    assert done.returncode == 0, done.stderr
    assert "kept" in done.stderr
    assert tree_bytes(out) == tree_bytes(reference)
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_a_run_killed_before_its_first_shard_is_finished_by_the_same_command(
    tmp_path: Path, split_root: Path
):
    # The partial manifest came only after the first shard: killed before, OUT held
    # classes.txt (and maybe a whole shard), which the same command refused ("output folder
    # already exists ... pass --force") although the docs say it resumes.
    reference, out = tmp_path / "reference", tmp_path / "out"
    args = ("convert", "shards", str(split_root), str(out), "--per-shard", "1")
    assert convert(split_root, reference, "--per-shard", "1").returncode == 0
    # Stopped as the first shard's temporary is renamed into place.
    env, paused = paused_io_env(tmp_path, out / "train-000000.tar", calls=("os.replace",))
    sigkilled_when_paused(start_torchkit_process(*args, env=env), paused, "the first shard")
    assert (out / "classes.txt").exists()
    assert not shard_files(out)
    done = convert(*args[2:])
    assert done.returncode == 0, done.stderr
    assert tree_bytes(out) == tree_bytes(reference)


def test_a_force_run_killed_before_its_first_shard_is_finished_and_a_users_list_kept(
    tmp_path: Path, split_root: Path
):
    """A --force run into a new OUT, SIGKILLed before its first shard, wrote its partial
    manifest before classes.txt: the same command finishes it without --force (it was
    refused: "already exists"), and classes.txt is the run's by the names that manifest
    lists. A list of the user's as classes.txt beside such a run's marker, with no manifest,
    is refused by --force and kept: it was taken for the run's (written within 120 s of the
    marker) and deleted."""
    import shutil

    reference, out, mine = tmp_path / "reference", tmp_path / "out", tmp_path / "mine"
    args = ("convert", "shards", str(split_root), str(out), "--per-shard", "1")
    assert convert(split_root, reference, "--per-shard", "1").returncode == 0
    env, paused = paused_io_env(tmp_path, out / "train-000000.tar", calls=("os.replace",))
    sigkilled_when_paused(
        start_torchkit_process(*args, "--force", env=env), paused, "the first shard"
    )
    assert read_partial(out) is not None and (out / "classes.txt").read_text() == "cat\ndog\n"
    shutil.copytree(out, mine, ignore=shutil.ignore_patterns("manifest.partial.json", ".*.tmp"))
    (mine / "classes.txt").write_text("siamese\ntabby\n")  # the user's own list, just now
    before = tree_digest(mine)
    done = convert(*args[2:])
    assert done.returncode == 0, done.stderr
    assert tree_bytes(out) == tree_bytes(reference)
    forced = convert(split_root, mine, "--per-shard", "1", "--force")
    assert forced.returncode == 1
    assert "classes.txt that torchkit did not write" in error_line(forced.stderr)
    assert tree_digest(mine) == before


def test_a_force_run_killed_before_its_first_shard_gives_the_old_output_back(
    tmp_path: Path, split_root: Path
):
    """A --force run over an earlier output, SIGKILLed before its first shard, set the old
    output aside: the next run puts it back (and, without --force, refuses to replace it).
    The check made before the source is listed refused first, "already exists", leaving the
    old output hidden beside OUT, and OUT holding only the killed run's marker."""
    out = tmp_path / "out"
    assert convert(split_root, out, "--per-shard", "2").returncode == 0
    old = tree_digest(out)
    env, paused = paused_io_env(tmp_path, out / "train-000000.tar", calls=("os.replace",))
    args = ("convert", "shards", str(split_root), str(out), "--per-shard", "1", "--force")
    sigkilled_when_paused(start_torchkit_process(*args, env=env), paused, "the first shard")
    assert "manifest.json" not in os.listdir(out)  # the old output is set aside
    again = convert(split_root, out, "--per-shard", "1")
    assert again.returncode == 1
    assert f"put back {out}, which a killed torchkit run had set aside" in again.stderr
    assert "output folder already exists" in error_line(again.stderr)
    assert tree_digest(out) == old
    assert not any(p.name.endswith(".replaced") for p in tmp_path.iterdir())


def test_a_run_killed_before_its_partial_manifest_is_run_again_by_the_same_command(
    tmp_path: Path, split_root: Path
):
    # Killed between marking OUT and writing its partial manifest: the marker and a dead
    # writer's temporary were all there was, and the same command was refused ("output
    # folder already exists ... pass --force").
    reference, out = tmp_path / "reference", tmp_path / "out"
    assert convert(split_root, reference, "--per-shard", "2").returncode == 0
    out.mkdir()
    (out / ".torchkit").write_text('{"written_by": "torchkit", "command": "convert shards"}\n')
    (out / ".manifest.partial.json.abcd1234.tmp").write_text('{"sha')
    done = convert(split_root, out, "--per-shard", "2")
    assert done.returncode == 0, done.stderr
    assert tree_bytes(out) == tree_bytes(reference)


def test_sigterm_leaves_no_half_shard(tmp_path: Path, split_root: Path):
    out = tmp_path / "out"
    args = ("convert", "shards", str(split_root), str(out), "--per-shard", "1")
    # Each rename into OUT pauses once it is done: the SIGTERM lands just after the second
    # shard took its name (a stop there left it out of the partial manifest).
    env = slow_io_env(tmp_path, out, delay=0.4, after=True)
    process = start_torchkit_process(*args, env=env)
    try:
        wait_until(lambda: len(shard_files(out)) >= 2, process=process, what="two shards")
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 143, stderr
    assert "Traceback" not in stderr
    names = sorted(p.name for p in out.iterdir())
    assert not [n for n in names if n.endswith(".tmp")] and "manifest.json" not in names
    partial = read_partial(out)
    assert sorted(s["name"] for s in partial["shards"]) == shard_files(out)  # all listed


def test_output_overlapping_the_source_or_existing_is_refused(tmp_path: Path, image_folder):
    for out, words in (
        (image_folder / "x", "lies inside the source"),
        (image_folder, "is the source"),
        (image_folder.parent, "contains the source"),
    ):
        done = convert(image_folder, out)
        assert done.returncode == 1 and words in error_line(done.stderr), done.stderr
    assert not (image_folder / "x").exists()

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    done = convert(image_folder, theirs)
    assert "already exists" in error_line(done.stderr)
    done = convert(image_folder, theirs, "--force")
    assert "not written by torchkit" in error_line(done.stderr)
    assert (theirs / "notes.txt").read_text() == "mine"

    out = tmp_path / "out"
    assert convert(image_folder, out).returncode == 0
    done = convert(image_folder, out)
    assert done.returncode == 1 and "already exists" in error_line(done.stderr)
    assert convert(image_folder, out, "--force", "--per-shard", 1).returncode == 0
    assert len(shard_files(out)) == 5


def test_shards_named_by_a_pattern_may_not_be_replaced_by_their_output(
    tmp_path: Path, image_folder: Path
):
    from torchkit.core.data.sources.containers import READERS

    if "torchkit.core.data.sources.shards" not in READERS:
        pytest.skip("the shard reader is not there yet")
    out = tmp_path / "out"
    assert convert(image_folder, out, "--per-shard", 2).returncode == 0
    pattern = f"{out}/shard-{{000000..000002}}.tar"
    done = convert(pattern, out, "--force")
    assert "contains the source shard" in error_line(done.stderr)  # the shard it names
    assert convert(pattern, tmp_path / "again", "--no-shuffle").returncode == 0


def test_a_report_over_an_image_of_a_csv_index_or_a_shard_of_a_pattern_is_refused(
    tmp_path: Path, image_folder: Path
):
    # The report was checked against SRC's own path only: --force wrote it over a source
    # image the index names, or over a source shard the pattern names.
    index = tmp_path / "index" / "index.csv"
    index.parent.mkdir()
    index.write_text(
        f"path,label\n{image_folder / 'a' / 'a_0.png'},a\n{image_folder / 'b' / 'b_0.png'},b\n"
    )
    image = image_folder / "a" / "a_0.png"
    before = tree_digest(image_folder)
    done = convert(index, tmp_path / "out", "-o", image, "--force")
    assert done.returncode == 1
    assert error_line(done.stderr).startswith(f"Error: report {image} lies inside the images of")
    assert tree_digest(image_folder) == before and not (tmp_path / "out").exists()

    shards = tmp_path / "shards"
    assert convert(image_folder, shards, "--per-shard", 3).returncode == 0
    shard = shards / "shard-000001.tar"
    kept = shard.read_bytes()
    done = convert(
        f"{shards}/shard-{{000000..000001}}.tar", tmp_path / "again", "-o", shard, "--force"
    )
    assert done.returncode == 1
    assert error_line(done.stderr).startswith(f"Error: report {shard} is the source shard")
    assert shard.read_bytes() == kept and not (tmp_path / "again").exists()

    assert (
        convert(index, tmp_path / "out", "-o", tmp_path / "index" / "report.json").returncode == 0
    )


def test_unreadable_images_are_skipped_and_counted_or_fatal_with_strict(
    tmp_path: Path, image_folder: Path
):
    (image_folder / "a" / "broken.png").write_bytes(b"not a png")
    out = tmp_path / "out"
    done = convert(image_folder, out, "--per-shard", 2, "--format", "json")
    # The rest is written and the run fails, as `cp -r` (it exited 0: `convert shards src out
    # && rm -r src` deleted the image that is in no shard)
    assert done.returncode == 1, done.stderr
    assert error_line(done.stderr) == (
        f"Error: 1 of 6 images could not be read and are in no shard in {out} (listed in "
        f"{out / 'manifest.json'}) (the warnings above say which and why; --strict stops at "
        "the first)"
    )
    # named by its path, as train's warnings name it; manifest.json by its place in the data
    assert f"Warning: skipped unreadable image {image_folder / 'a' / 'broken.png'}" in done.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["samples"] == 5 and manifest["unreadable"] == 1
    assert manifest["unreadable_images"][0]["path"] == "a/broken.png"
    assert manifest["splits"]["shard"]["class_counts"] == {"a": 3, "b": 2}
    assert json.loads(done.stdout)["unreadable"] == 1

    strict = tmp_path / "strict"
    done = convert(image_folder, strict, "--strict", "--no-shuffle")
    assert done.returncode == 1
    assert f"unreadable image {image_folder / 'a' / 'broken.png'}: " in error_line(done.stderr)
    assert not strict.exists()


HEADER_ONLY = "each image's header alone was checked, which a truncated image passes"


def test_a_truncated_image_passes_the_header_check_and_verify_skips_it(
    tmp_path: Path, image_folder: Path
):
    """By default each image's header is checked: a truncated JPEG goes into the shards (and
    every run reading them skips it then), which a note says where some image was unreadable;
    --verify decodes each image in full and skips it too. --verify had no test."""
    whole = io.BytesIO()
    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(noise).save(whole, "JPEG")  # mostly scan data: cut in half, past the header
    (image_folder / "a" / "cut.jpg").write_bytes(whole.getvalue()[: len(whole.getvalue()) // 2])
    (image_folder / "b" / "empty.png").write_bytes(b"")
    done = convert(image_folder, tmp_path / "headers", "--format", "json")
    assert done.returncode == 1, done.stderr  # the empty file is in no shard
    assert json.loads(done.stdout)["unreadable"] == 1  # the empty file alone
    manifest = json.loads((tmp_path / "headers" / "manifest.json").read_text())
    assert manifest["samples"] == 6 and manifest["splits"]["shard"]["class_counts"]["a"] == 4
    assert done.stderr.count(HEADER_ONLY) == 1
    verified = convert(image_folder, tmp_path / "verified", "--verify", "--format", "json")
    assert verified.returncode == 1, verified.stderr
    assert json.loads(verified.stdout)["unreadable"] == 2
    cut = image_folder / "a" / "cut.jpg"
    assert f"Warning: skipped unreadable image {cut}: " in verified.stderr
    manifest = json.loads((tmp_path / "verified" / "manifest.json").read_text())
    assert manifest["samples"] == 5 and manifest["splits"]["shard"]["class_counts"]["a"] == 3
    assert HEADER_ONLY not in verified.stderr


def test_unlabelled_images_have_no_class(tmp_path: Path):
    flat = tmp_path / "flat"
    flat.mkdir()
    for index in range(3):
        Image.new("RGB", (4, 4), (index, 0, 0)).save(flat / f"{index}.jpg")
    out = tmp_path / "out"
    assert convert(flat, out).returncode == 0
    samples = samples_of(out / "shard-000000.tar")
    assert len(samples) == 3
    for sample in samples.values():
        assert sorted(sample) == ["jpg", "json"]
        assert json.loads(sample["json"])["label"] is None
    assert (out / "classes.txt").read_text() == ""


@pytest.mark.parametrize("split", [False, True])
def test_unlabelled_shards_read_back_as_unlabelled_data(tmp_path: Path, split: bool):
    # Their empty classes.txt was refused by every reader ("classes.txt names no class, or a
    # class twice"): no command could read the shards of a flat folder or a flat split.
    from torchkit.core.data.sources import open_data
    from torchkit.core.io.errors import InputError

    flat = tmp_path / "flat"
    names = [f"train/{i}.png" if split else f"{i}.png" for i in range(3)]
    if split:
        names.append("val/3.png")
    for index, name in enumerate(names):
        (flat / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (4, 4), (index * 40, 7, 0)).save(flat / name)
    out = tmp_path / "out"
    assert convert(flat, out).returncode == 0
    data = open_data(out, allow_unlabelled=True)
    assert data.classes == [""] and data.is_split == split
    parts = data.splits.items() if split else [(None, data.whole)]
    read = {}
    for part, samples in parts:
        for stored in samples.paths:
            with Image.open(io.BytesIO(stored.read_bytes())) as image:
                read[str(stored).split("/", 1)[1]] = (part, image.getpixel((0, 0)))
    original = {}
    for index, name in enumerate(names):
        key = next(k for k, v in _json_paths(out).items() if v == name)
        original[key] = (name.split("/")[0] if split else None, (index * 40, 7, 0))
    assert read == original
    done = run_torchkit_in_process(
        "dataset-stats", out, "-j", "0", *(["--split", "all"] if split else [])
    )
    assert done.returncode == 0, done.stderr
    with pytest.raises(InputError, match=r"has no label"):
        open_data(out)  # train and eval need labels: one error
    # Labelled samples beside an empty classes.txt are still one error.
    labelled = write_image_folder(tmp_path / "labelled", {"cat": 2})
    assert convert(labelled, tmp_path / "cats").returncode == 0
    (tmp_path / "cats" / "classes.txt").write_text("")
    with pytest.raises(InputError, match=r"names no class, while sample \w+ in .+ is labelled"):
        open_data(tmp_path / "cats")


def test_an_unlabelled_split_beside_labelled_ones_keeps_their_labels(tmp_path: Path):
    # Shards (or HF parquet) whose test split has no labels: convert shards refused them
    # ("class name '' cannot be a line of classes.txt"), the unlabelled split's "" taken for
    # a class.
    source = tmp_path / "source"
    source.mkdir()
    png = io.BytesIO()
    Image.new("RGB", (4, 4), (9, 8, 7)).save(png, format="PNG")
    for split, labels in (("train", [b'"dog"', b'"cat"']), ("test", [b"null"])):
        with tarfile.open(source / f"{split}-000000.tar", "w") as tar:
            for number, label in enumerate(labels):
                for extension, data in (
                    ("png", png.getvalue()),
                    ("json", b'{"label": %s}' % label),
                ):
                    info = tarfile.TarInfo(f"{split}{number}.{extension}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    out = tmp_path / "out"
    done = convert(source, out, "--no-shuffle", "--format", "json")
    assert done.returncode == 0, done.stderr
    assert (out / "classes.txt").read_text() == "cat\ndog\n"
    assert json.loads(done.stdout)["splits"]["train"]["class_counts"] == {"cat": 1, "dog": 1}
    written = {
        key: (sample.get("cls"), json.loads(sample["json"])["label"])
        for shard in shard_files(out)
        for key, sample in samples_of(out / shard).items()
    }
    assert written == {
        "train_00000000": (b"1", "dog"),
        "train_00000001": (b"0", "cat"),
        "test_00000000": (None, None),
    }


def _json_paths(out: Path) -> dict[str, str]:
    """`SHARD/KEY.EXT` -> the source path its KEY.json records, for every sample in `out`."""
    found = {}
    for shard in sorted(out.glob("*.tar")):
        for key, sample in samples_of(shard).items():
            extension = next(e for e in sample if e not in ("json", "cls"))
            found[f"{key}.{extension}"] = json.loads(sample["json"])["path"]
    return found


@pytest.mark.parametrize("name", [" cat", "cat ", "new\nline", "form\x0cfeed"])
def test_a_class_name_classes_txt_cannot_give_back_is_refused_before_any_shard(
    tmp_path: Path, name: str
):
    """classes.txt is read one name a line without the spaces around it: a class it would give
    back otherwise made every sample of that class unreadable in the shards written."""
    source = write_image_folder(tmp_path / "src", {name: 1, "dog": 1})
    out = tmp_path / "out"
    done = convert(source, out)
    assert done.returncode == 1
    assert f"class name {name!r} cannot be a line of classes.txt" in error_line(done.stderr)
    assert not out.exists()
    # A name with spaces inside it is a line of its own and reads back.
    write_image_folder(tmp_path / "inner", {"cat, dog": 1, 'say "hi"': 1})
    assert convert(tmp_path / "inner", out).returncode == 0
    done = run_torchkit_in_process("dataset-stats", out, "--format", "json", "-j", "0")
    assert done.returncode == 0, done.stderr
    assert [c["name"] for c in json.loads(done.stdout)["classes"]] == ["cat, dog", 'say "hi"']


def test_images_named_without_an_image_extension_are_stored_as_images(tmp_path: Path):
    """A CSV index may name any file: `x.json` and `x.cls` replaced the sample's label member
    (the sample had no image) and `x.dat` was no image to any reader; a format that shards
    cannot name is skipped as unreadable (its format said with "a" or "an": was "a ICO")."""
    root = tmp_path / "csv"
    root.mkdir()
    names = {"a.json": "PNG", "b.cls": "PNG", "c.dat": "JPEG", "d": "GIF", "e.tga": "TGA"}
    names |= {"f.ico": "ICO", "g.sgi": "SGI"}
    for name, image_format in names.items():
        Image.new("RGB", (4, 4), (len(name), 0, 0)).save(root / name, format=image_format)
    (root / "index.csv").write_text("path,label\n" + "".join(f"{n},x\n" for n in names))
    out = tmp_path / "out"
    done = convert(root / "index.csv", out, "--no-shuffle")
    assert done.returncode == 1, done.stderr  # the 3 it cannot store are in no shard
    assert f"skipped unreadable image {root / 'e.tga'}: a TGA file" in done.stderr
    assert f"skipped unreadable image {root / 'f.ico'}: an ICO file, which" in done.stderr
    assert f"skipped unreadable image {root / 'g.sgi'}: an SGI file, which" in done.stderr
    samples = samples_of(out / "shard-000000.tar")
    stored = {
        json.loads(s["json"])["path"]: sorted(set(s) - {"cls", "json"}) for s in samples.values()
    }
    assert stored == {"a.json": ["png"], "b.cls": ["png"], "c.dat": ["jpg"], "d": ["gif"]}
    for sample in samples.values():
        assert sample["cls"] == b"0"
    stats = run_torchkit_in_process("dataset-stats", out, "--format", "json", "-j", "0")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["images"] == 4


def test_sizes_are_parsed_in_si_and_iec_units(tmp_path: Path, image_folder: Path):
    assert parse_size("1GB") == 10**9
    assert parse_size("256MiB") == parse_size("256M") == 256 * 2**20
    assert parse_size("1.5kb") == 1500 and parse_size("4096") == 4096
    done = convert(image_folder, tmp_path / "out", "--shard-size", "lots")
    assert done.returncode == 2 and "--shard-size 'lots' is not a size" in error_line(done.stderr)
    assert not (tmp_path / "out").exists()


def test_a_size_of_more_digits_than_python_reads_is_a_usage_error(tmp_path: Path, image_folder):
    """Was "Error: ValueError: Exceeds the limit (4300 digits)..." (exit 1), as was such a
    TORCHKIT_CACHE_LIMIT."""
    done = convert(image_folder, tmp_path / "out", "--shard-size", "9" * 5000)
    assert done.returncode == 2
    assert "--shard-size '99999" in error_line(done.stderr)
    assert "9...9" in error_line(done.stderr) and "is not a size" in error_line(done.stderr)
    assert not (tmp_path / "out").exists()


def test_shards_are_written_without_webdataset_installed(
    tmp_path: Path, image_folder: Path, monkeypatch
):
    """Was "Error: convert shards needs the webdataset package": the tars are written with the
    standard library's tarfile (webdataset's package imports torch)."""
    monkeypatch.setitem(sys.modules, "webdataset", None)
    out = tmp_path / "out"
    done = convert(image_folder, out)
    assert done.returncode == 0, done.stderr
    assert len(samples_of(out / "shard-000000.tar")) == 5


def test_a_full_disk_is_one_error_and_leaves_no_half_shard(
    tmp_path: Path, small_tmpfs, make_image_folder
):
    data = make_image_folder(tmp_path / "data", {"a": 6, "b": 6}, size=64)
    mount = small_tmpfs(256)
    fill_disk(mount, leave=40 * 1024)
    out = mount / "out"
    done = convert(data, out, "--per-shard", 2)
    assert done.returncode == 1
    assert "No space left on device" in error_line(done.stderr)
    left = sorted(p.name for p in out.iterdir()) if out.exists() else []
    assert not [n for n in left if n.endswith(".tmp")]


def test_a_forced_rerun_on_a_full_disk_leaves_the_old_output_as_it_was(
    tmp_path: Path, small_tmpfs, make_image_folder
):
    """`convert shards SRC OUT --force` over a complete OUT on a disk with a few pages left:
    where the disk filled as the first name was recorded (.torchkit-written), closing that
    journal failed again and stopped the clean-up, so the old output stayed hidden in
    .OUT.<hex>.replaced (classes.txt, manifest and shards gone from OUT) behind a raw
    "OSError: [Errno 28]". Whatever page the disk fills at, OUT is now as it was, byte for
    byte and file for file, after one Error line."""
    data = make_image_folder(tmp_path / "data", {"a": 6, "b": 6}, size=64)
    mount = small_tmpfs(512)
    out = mount / "out"
    assert convert(data, out, "--per-shard", 2).returncode == 0
    before = tree_digest(mount)
    for leave in (4, 8, 12):  # KiB: the marker, the journal, classes.txt
        fill_disk(mount, leave=leave * 1024)
        done = convert(data, out, "--per-shard", "2", "--force")
        assert done.returncode == 1, (leave, done.stderr)
        assert "No space left on device" in error_line(done.stderr, besides="nothing"), leave
        (mount / "filler").unlink()
        assert tree_digest(mount) == before, leave


def test_round_trip_dataset_stats_of_the_shards_equal_the_source(tmp_path: Path, split_root: Path):
    from torchkit.core.data.sources.containers import READERS

    if "torchkit.core.data.sources.shards" not in READERS:
        pytest.skip("the shard reader is not there yet")
    out = tmp_path / "out"
    assert convert(split_root, out, "--per-shard", 3).returncode == 0
    stats = {}
    for data in (split_root, out):
        done = run_torchkit_in_process(
            "dataset-stats", data, "--split", "all", "--format", "json", "-j", "0"
        )  # no worker processes (forks of the test process): the figures are the same
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        stats[data] = (report["mean"], report["std"], report["classes"], report["images"])
    assert stats[split_root] == stats[out]


def test_a_users_file_in_out_is_named_where_the_hint_said_force(tmp_path: Path, image_folder):
    """Before: "already exists (pass --force to overwrite it)", and --force then refused the
    user's notes.txt in OUT; an interrupted run with other options said the same. Now the first
    refusal names the file, and nothing changes."""
    out = tmp_path / "out"
    assert convert(image_folder, out, "--per-shard", 2).returncode == 0
    (out / "notes.txt").write_text("mine")
    done = convert(image_folder, out)
    assert done.returncode == 1
    assert error_line(done.stderr) == (
        f"Error: output folder already exists: {out} (it holds {out / 'notes.txt'} that "
        "torchkit did not write, so --force is refused too: move it out first, or choose "
        "another folder)"
    )
    _interrupted_copy(out, 1)
    before = tree_bytes(out)
    done = convert(image_folder, out, "--per-shard", 3)
    assert done.returncode == 1
    assert error_line(done.stderr).endswith(
        f"(run it with the same SRC and options to finish it; it holds {out / 'notes.txt'} "
        "that torchkit did not write, so --force is refused too: move it out first, or choose "
        "another folder)"
    )
    forced = error_line(convert(image_folder, out, "--force").stderr)
    assert "notes.txt that torchkit did not write, which --force would delete" in forced
    assert tree_bytes(out) == before
    (out / "notes.txt").unlink()  # what the hint said: --force now runs
    assert convert(image_folder, out, "--per-shard", 3, "--force").returncode == 0


def test_finishing_a_run_keeps_a_users_file_of_a_shards_name(tmp_path: Path, image_folder):
    """Finishing an interrupted run removes shard files its manifest does not list (a killed
    run's): before, a file of the user's under such a name went with them; now the run is
    refused before any work, naming it, and finishes once it is moved out."""
    out = tmp_path / "out"
    assert convert(image_folder, out, "--per-shard", 2).returncode == 0
    _interrupted_copy(out, 1)
    (out / "shard-000077.tar").write_text("mine")
    (out / "notes.txt").write_text("mine")  # not a shard's name: finishing leaves it
    before = tree_bytes(out)
    done = convert(image_folder, out, "--per-shard", 2)
    assert done.returncode == 1
    assert error_line(done.stderr) == (
        f"Error: output folder {out} holds {out / 'shard-000077.tar'} that torchkit did not "
        f"write, which finishing the interrupted run would delete with it (move them out of "
        f"{out}, or delete them yourself)"
    )
    assert tree_bytes(out) == before
    (out / "shard-000077.tar").unlink()
    done = convert(image_folder, out, "--per-shard", 2)
    assert done.returncode == 0, done.stderr
    assert shard_files(out) == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    assert (out / "notes.txt").read_text() == "mine"


def test_finishing_a_run_is_not_refused_for_files_it_keeps(tmp_path: Path, image_folder):
    """Finishing a run removes only regular files named exactly as shards (`shard-000077.tar`):
    a file of the user's whose name only begins like one (`shard-000000-mine.tar`) and a link
    under a shard's name are kept by it. Before, both refused the run as files it "would
    delete"; now it finishes and leaves them as they were."""
    out = tmp_path / "out"
    assert convert(image_folder, out, "--per-shard", 2).returncode == 0
    _interrupted_copy(out, 1)
    (out / "shard-000000-mine.tar").write_text("mine")
    (tmp_path / "elsewhere.tar").write_text("mine too")
    (out / "shard-000099.tar").symlink_to(tmp_path / "elsewhere.tar")
    done = convert(image_folder, out, "--per-shard", 2)
    assert done.returncode == 0, done.stderr
    assert (out / "shard-000000-mine.tar").read_text() == "mine"
    assert os.readlink(out / "shard-000099.tar") == str(tmp_path / "elsewhere.tar")
    assert (tmp_path / "elsewhere.tar").read_text() == "mine too"
