"""`extract-features MODEL - OUT` reads the paths on stdin as they come: rows are written while
the list is still piped, and the files are those a listed run (a CSV index) writes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from image_folders import write_image_folder
from output_checks import error_line, tree_digest

import torchkit.core.features.store as store
from torchkit.cli import app
from torchkit.core.io.force import write_marker

BASE = ["extract-features", "--device", "cpu", "--allow-untrained", "--image-size", "16", "-j", "0"]


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> list[str]:
    """Seven images (absolute paths), a missing one and a file that is no image among them."""
    root = write_image_folder(tmp_path_factory.mktemp("data") / "imgs", {"a": 4, "b": 3}, size=20)
    (root / "b" / "broken.png").write_bytes(b"not a png")
    files = sorted(str(p) for p in root.rglob("*.png"))
    return [*files[:3], str(root / "gone.png"), *files[3:]]


def listed(tmp_path: Path, paths: list[str]) -> Path:
    index = tmp_path / "list.csv"
    index.write_text("path\n" + "".join(f"{p}\n" for p in paths), encoding="utf-8")
    return index


@pytest.mark.parametrize("array_format", ["npy", "safetensors"])
def test_the_streamed_files_are_those_of_a_listed_run(runner, photos, tmp_path, array_format):
    """Before: `-` read the whole list before writing anything; now batch by batch, into the
    same bytes (the arrays, index.csv) and the same meta (but for what IMAGES was)."""
    options = ["-b", "2", "-l", "penultimate", "-l", "logits", "--array-format", array_format]
    streamed = runner.invoke(
        app, [*BASE, *options, "convnet", "-", str(tmp_path / "s")], input="\n".join(photos)
    )
    assert streamed.exit_code == 0, streamed.stderr
    by_list = runner.invoke(
        app, [*BASE, *options, "convnet", str(listed(tmp_path, photos)), str(tmp_path / "l")]
    )
    assert by_list.exit_code == 0, by_list.stderr
    for name in ("penultimate", "logits"):
        file = f"{name}.{array_format}"
        assert (tmp_path / "s" / file).read_bytes() == (tmp_path / "l" / file).read_bytes()
    assert (tmp_path / "s" / "index.csv").read_bytes() == (
        tmp_path / "l" / "index.csv"
    ).read_bytes()
    index = (tmp_path / "s" / "index.csv").read_text().splitlines()
    assert len(index) == 1 + len(photos) and index[4].startswith(",") and "gone.png" in index[4]
    meta = [json.loads((tmp_path / out / "meta.json").read_text()) for out in ("s", "l")]
    assert meta[0]["num_images"] == 9 and meta[0]["num_rows"] == 7 and meta[0]["num_skipped"] == 2
    differ = {"images", "root", "images_location", "fingerprint"}  # IMAGES: `-` against the CSV
    assert {k: v for k, v in meta[0].items() if k not in differ} == {
        k: v for k, v in meta[1].items() if k not in differ
    }
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == sorted(
        p.name for p in (tmp_path / "l").iterdir()
    )


def test_a_name_that_is_not_utf8_streams_as_its_own_bytes(runner, photos, tmp_path):
    """Before: `Error: UnicodeEncodeError: 'utf-8' codec can't encode character '\\udce9'`
    (exit 1, no OUT) at the first batch naming it; now index.csv holds the name's own bytes,
    as a listed run's does (`-` gives the same files as a CSV index of the same paths)."""
    import os
    import shutil

    odd = tmp_path / "odd" / os.fsdecode(b"caf\xe9.png")
    odd.parent.mkdir()
    shutil.copy(photos[0], odd)
    paths = [os.fsencode(p) for p in (photos[1], odd, photos[2])]
    streamed = runner.invoke(
        app, [*BASE, "-b", "2", "convnet", "-", str(tmp_path / "s")], input=b"\n".join(paths)
    )
    assert streamed.exit_code == 0, streamed.stderr
    index = tmp_path / "list.csv"
    index.write_bytes(b"path\n" + b"".join(p + b"\n" for p in paths))
    by_list = runner.invoke(app, [*BASE, "-b", "2", "convnet", str(index), str(tmp_path / "l")])
    assert by_list.exit_code == 0, by_list.stderr
    lines = (tmp_path / "s" / "index.csv").read_bytes()
    assert lines == (tmp_path / "l" / "index.csv").read_bytes()
    assert b"\n1," + os.fsencode(odd) + b",," in lines
    assert (tmp_path / "s" / "penultimate.npy").read_bytes() == (
        tmp_path / "l" / "penultimate.npy"
    ).read_bytes()


def test_rows_are_written_before_the_list_ends(photos, tmp_path):
    """The first batches' rows and index lines are on disk while stdin still has paths to
    give (checked from the generator that gives them); memory holds only the paths in work."""
    from torchkit.core.features import FeatureRequest, extract_features
    from torchkit.core.inference.options import InferenceOptions
    from torchkit.core.models import ModelSpec

    out = tmp_path / "out"
    seen: list[tuple[int, int]] = []

    def piped():
        for number, path in enumerate(photos * 3):
            if number == 12:  # 2 batches of 2 read by the first pass, 4 more by the second
                array = out / ".partial" / "penultimate.npy"
                lines = (out / ".partial" / "index.csv").read_text().splitlines()
                seen.append((array.stat().st_size, len(lines)))
            yield path + "\n"

    request = FeatureRequest(
        spec=ModelSpec("convnet", image_size=16, allow_untrained=True),
        images="-",
        out=str(out),
        run=InferenceOptions(device="cpu", batch_size=2, workers=0),
    )
    result = extract_features(request, stdin=piped())
    assert result.num_images == 27 and result.num_rows == 21
    [(size, lines)] = seen
    assert size >= 128 + 4 * 128 * 4 and lines >= 1 + 4  # the header, 4 rows of 128 float32
    assert np.load(out / "penultimate.npy").shape == (21, 128)


def test_a_stream_of_unreadable_images_writes_nothing(runner, tmp_path):
    missing = "\n".join(str(tmp_path / "data" / f"gone{i}.png") for i in range(5))
    refused = runner.invoke(
        app, [*BASE, "-b", "2", "convnet", "-", str(tmp_path / "o")], input=missing
    )
    assert refused.exit_code == 1
    assert "none of the 5 images in - could be read" in error_line(refused.stderr)
    assert not (tmp_path / "o").exists()


def test_empty_stdin_is_one_error_line(runner, tmp_path):
    refused = runner.invoke(app, [*BASE, "convnet", "-", str(tmp_path / "o")], input="\n\n")
    assert refused.exit_code == 1
    assert "no image paths on stdin" in error_line(refused.stderr)
    assert not (tmp_path / "o").exists()


def test_resume_of_a_stream_is_refused(runner, photos, tmp_path):
    """stdin cannot be read again: --resume with `-` is refused before anything is read."""
    refused = runner.invoke(
        app, [*BASE, "convnet", "-", str(tmp_path / "o"), "--resume"], input="\n".join(photos)
    )
    assert refused.exit_code == 2
    assert "--resume cannot continue a list piped on stdin" in error_line(refused.stderr)
    assert "(run it again without --resume," in error_line(refused.stderr)
    assert not (tmp_path / "o").exists()


def test_resume_of_a_stream_into_an_interrupted_run_says_force(runner, photos, tmp_path):
    """--resume with `-` into an OUT holding an interrupted run says to start it over with
    --force: without --resume (what it said) is refused, "already exists (... pass --force to
    start over)"; with --force the list runs."""
    out = tmp_path / "o"
    _partial_rows(out / ".partial")
    write_marker(out, "extract-features")
    paths = "\n".join(photos)
    refused = runner.invoke(app, [*BASE, "convnet", "-", str(out), "--resume"], input=paths)
    assert refused.exit_code == 2
    assert "(pass --force in place of --resume to start it over" in error_line(refused.stderr)
    done = runner.invoke(app, [*BASE, "convnet", "-", str(out), "--force"], input=paths)
    assert done.exit_code == 0, done.stderr


@pytest.mark.parametrize("held", ["only yours", "a run and a file of yours", "train's run"])
def test_resume_of_a_stream_never_says_force_where_force_is_refused(runner, photos, tmp_path, held):
    """Before: --resume with `-` into an OUT holding anything said "pass --force in place of
    --resume", and --force then refused OUT (a folder of the user's files, a file of theirs in
    an interrupted run, another command's output). Now the first refusal says why --force would
    be refused and what to do, and OUT is left as it was."""
    out = tmp_path / "o"
    out.mkdir()
    expected = {
        "only yours": f"(OUT {out} was not written by torchkit, which --force does not replace:"
        " choose another folder, or empty it yourself)",
        "a run and a file of yours": f"(OUT {out} holds {out / 'notes.txt'} that torchkit did "
        "not write, so --force is refused too: move it out first, or choose another folder)",
        "train's run": f"(OUT {out} holds torchkit train's output, which extract-features "
        "--force does not replace: choose another folder)",
    }[held]
    if held != "only yours":
        write_marker(out, "train" if held == "train's run" else "extract-features")
    if held == "a run and a file of yours":
        _partial_rows(out / ".partial")
    (out / "notes.txt").write_text("mine")
    before = tree_digest(out)
    paths = "\n".join(photos)
    refused = runner.invoke(app, [*BASE, "convnet", "-", str(out), "--resume"], input=paths)
    assert refused.exit_code == 2
    assert error_line(refused.stderr).endswith(f"cannot be read again {expected}")
    forced = runner.invoke(app, [*BASE, "convnet", "-", str(out), "--force"], input=paths)
    assert forced.exit_code == 1  # the hint was right not to send the user here
    assert tree_digest(out) == before


def test_resume_of_a_stream_into_a_link_to_a_run_says_force_refuses_links(runner, photos, tmp_path):
    """OUT a symbolic link to an interrupted run: --resume with `-` says --force does not
    replace a link (it said "pass --force in place of --resume", which then refused the link)."""
    run, out = tmp_path / "run", tmp_path / "o"
    _partial_rows(run / ".partial")
    write_marker(run, "extract-features")
    out.symlink_to(run, target_is_directory=True)
    paths = "\n".join(photos)
    refused = runner.invoke(app, [*BASE, "convnet", "-", str(out), "--resume"], input=paths)
    assert refused.exit_code == 2
    assert error_line(refused.stderr).endswith(
        f"cannot be read again (OUT {out} is a symbolic link, which --force does not replace: "
        "give the real folder or a new name)"
    )
    forced = runner.invoke(app, [*BASE, "convnet", "-", str(out), "--force"], input=paths)
    assert forced.exit_code == 1  # the hint was right not to send the user here
    assert out.is_symlink() and (run / ".partial").is_dir()


def test_an_image_inside_out_later_in_the_stream_keeps_the_old_out(runner, photos, tmp_path):
    """A path read after the first rows that lies in OUT (replaced with --force) stops the run,
    and the old OUT, with that file, is put back as it was."""
    marked = tmp_path / "marked"
    first = runner.invoke(app, [*BASE, "convnet", "-", str(marked)], input=photos[0])
    assert first.exit_code == 0, first.stderr
    # Rows a killed run kept (--force refuses a user's file anywhere in OUT first).
    inside = _partial_rows(marked / ".partial")
    before = sorted(p.name for p in marked.rglob("*"))
    stream = "\n".join([*photos[:2], *photos[4:], str(inside)])
    refused = runner.invoke(
        app, [*BASE, "-b", "1", "convnet", "-", str(marked), "--force"], input=stream
    )
    assert refused.exit_code == 1
    assert "contains the image listed on stdin" in error_line(refused.stderr)
    assert inside.is_file() and sorted(p.name for p in marked.rglob("*")) == before


def test_out_may_lie_beside_the_images_listed_on_stdin(runner, photos, tmp_path):
    """`ls *.png | extract-features convnet - feats` was refused: OUT "lies inside the images
    listed on stdin" (their folder), where OUT beside an image file given as IMAGES was not.
    OUT may lie beside them; a listed path that is OUT, or leads into it (a link),
    still stops the run as it comes, and an old OUT stays as it was."""
    import shutil

    shots = tmp_path / "shots"
    shots.mkdir()
    for index, photo in enumerate([photos[0], photos[1], photos[2]]):
        shutil.copy(photo, shots / f"{index}.png")
    names = [str(shots / f"{index}.png") for index in range(3)]
    out = shots / "feats"
    beside = runner.invoke(
        app, [*BASE, "-b", "1", "convnet", "-", str(out)], input="\n".join(names)
    )
    assert beside.exit_code == 0, beside.stderr
    assert np.load(out / "penultimate.npy").shape == (3, 128)
    before = tree_digest(out)
    (shots / "in.png").symlink_to(out / "meta.json")
    for later, said in ((str(shots / "in.png"), "contains"), (str(out), "is")):
        refused = runner.invoke(
            app,
            [*BASE, "-b", "1", "convnet", "-", str(out), "--force"],
            input="\n".join([*names, later]),
        )
        assert refused.exit_code == 1
        assert error_line(refused.stderr).startswith(
            f"Error: output folder {out} {said} the image listed on stdin {later} ("
        )
        assert tree_digest(out) == before


def test_strict_stop_mid_stream_leaves_no_out(runner, photos, tmp_path):
    """A streamed run cannot be resumed: one stopped after its first rows leaves no OUT."""
    stream = "\n".join([*photos[:3], photos[3]])  # the fourth is gone
    out = tmp_path / "o"
    refused = runner.invoke(
        app, [*BASE, "-b", "1", "--strict", "convnet", "-", str(out)], input=stream
    )
    assert refused.exit_code == 1
    assert error_line(refused.stderr).startswith(f"Error: unreadable image {photos[3]}: ")
    assert not out.exists()


@pytest.mark.parametrize("earlier", [False, True], ids=["new OUT", "--force over an OUT"])
def test_a_full_disk_at_meta_json_after_the_arrays_leaves_no_trace(
    runner, photos, tmp_path, monkeypatch, earlier
):
    """The arrays and index.csv are renamed into OUT before meta.json is written: a write error
    there (or a kill) removes them with the rest of the run, and an earlier OUT comes back;
    before, they stayed as 'files this run did not write', OUT kept with them."""
    out = tmp_path / "o"
    if earlier:
        assert runner.invoke(app, [*BASE, "convnet", "-", str(out)], input=photos[0]).exit_code == 0
        before = tree_digest(out)
    write_json = store.atomic_write_json

    def full_at_meta(path, value, *args, **kwargs):
        if Path(path).name == "meta.json":
            raise OSError(28, "No space left on device")
        return write_json(path, value, *args, **kwargs)

    monkeypatch.setattr(store, "atomic_write_json", full_at_meta)
    force = ["--force"] if earlier else []
    failed = runner.invoke(
        app, [*BASE, "-b", "2", "convnet", "-", str(out), *force], input="\n".join(photos)
    )
    assert failed.exit_code == 1
    assert error_line(failed.stderr) == (
        f"Error: cannot write {out}: No space left on device "
        "(free some space, check the permissions, or choose another output)"
    )
    assert "did not write" not in failed.stderr
    if earlier:
        assert tree_digest(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == (["o"] if earlier else [])


def _partial_rows(partial: Path) -> Path:
    """A streamed run's array of a layer in `partial` (OUT/.partial), and its record, which
    names the array as the run's: as the store writes them before the first rows."""
    partial.mkdir(parents=True)
    layers = {"penultimate": {"shape": [8], "dtype": "float32", "file": "penultimate"}}
    record = {**store.Progress(layers=layers).to_json("", 0), "streamed": True}
    (partial / store.PROGRESS_FILE).write_text(json.dumps(record))
    np.lib.format.open_memmap(partial / "penultimate.npy", "w+", np.float32, (4, 8))
    return partial / "penultimate.npy"


def _killed_stream(out: Path) -> None:
    """What `extract-features MODEL - OUT` killed (SIGKILL) mid-stream leaves in a new OUT."""
    _partial_rows(out / ".partial")
    (out / ".torchkit").write_text('{"written_by": "torchkit", "command": "extract-features"}\n')


def test_a_killed_streams_out_names_force_not_resume(runner, photos, tmp_path):
    """A stream cannot be resumed (--resume with - is refused): the hint says what works."""
    out = tmp_path / "o"
    _killed_stream(out)
    refused = runner.invoke(app, [*BASE, "convnet", "-", str(out)], input="\n".join(photos))
    assert refused.exit_code == 1
    assert error_line(refused.stderr) == (
        f"Error: output folder already exists: {out} (it holds an interrupted extraction, "
        "which a list piped on stdin cannot continue: pass --force to start over)"
    )
    again = runner.invoke(
        app, [*BASE, "convnet", "-", str(out), "--force"], input="\n".join(photos)
    )
    assert again.exit_code == 0, again.stderr
    assert (out / "meta.json").is_file() and not (out / ".partial").exists()


def test_the_hint_is_about_the_out_left_once_a_killed_runs_old_out_is_back(
    runner, photos, tmp_path
):
    """A run killed with --force over a finished OUT: the next run puts the old OUT back and
    then judges it, finished, not the killed run's folder it found before that."""
    out = tmp_path / "o"
    assert runner.invoke(app, [*BASE, "convnet", "-", str(out)], input=photos[0]).exit_code == 0
    out.rename(tmp_path / ".o.0123456789ab.replaced")
    _killed_stream(out)
    (out / ".torchkit-written").write_text('".partial"\n')
    refused = runner.invoke(app, [*BASE, "convnet", "-", str(out)], input="\n".join(photos))
    assert refused.exit_code == 1
    assert f"put back {out}" in refused.stderr
    assert error_line(refused.stderr) == (
        f"Error: output folder already exists: {out} (pass --force to overwrite it)"
    )
    assert (out / "meta.json").is_file()
