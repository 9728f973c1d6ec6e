"""The split.csv a split reads back from OUT (the plan an interrupted move finishes by, the files
an earlier split lists when `--force` replaces it): one reader, which names a damaged file."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from output_checks import error_line
from processes import run_torchkit_in_process
from split_moves import stop_move_after

from torchkit.core.split.run import split_dataset


def write_images(root: Path, count: int = 3) -> Path:
    """ROOT/{a,b}/<i>.png, each file's bytes its own name (a split only copies bytes)."""
    for label in "ab":
        (root / label).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            (root / label / f"{i}.png").write_bytes(f"{label}{i}".encode() * 3)
    return root


def digests(*roots: Path) -> dict[str, str]:
    return {
        str(p): hashlib.sha256(p.read_bytes()).hexdigest()
        for root in roots
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def interrupted_move(tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    """A move into OUT stopped by Ctrl-C after its first file: (ROOT, OUT)."""
    data, out = write_images(tmp_path / "data"), tmp_path / "out"
    stop_move_after(1, monkeypatch, data, out, ratio="1:1")
    return data, out


def rewrite_plan(out: Path, edit) -> None:
    lines = (out / "split.csv").read_text(encoding="utf-8").splitlines()
    (out / "split.csv").write_text("\n".join(edit(lines)) + "\n", encoding="utf-8")


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        # Before: 'Error: KeyError: 'source'' once the finish had begun.
        (lambda lines: [line.rsplit(",", 1)[0] for line in lines], "it has no source column"),
        # Before: 'Error: TypeError: lstat: path should be string, ... not NoneType'.
        (lambda lines: [*lines[:2], lines[2].split(",")[0], *lines[3:]], "row 3 is cut short"),
    ],
    ids=["column-gone", "row-cut-short"],
)
def test_a_damaged_plan_of_an_interrupted_move_is_named_and_no_file_moves(
    tmp_path, monkeypatch, edit, said
):
    data, out = interrupted_move(tmp_path, monkeypatch)
    rewrite_plan(out, edit)
    before = digests(data, out)
    result = run_torchkit_in_process("split", data, out, "--mode", "move", "--ratio", "1:1")
    assert result.returncode == 1
    line = error_line(result.stderr, besides="warnings")
    assert f"cannot read the plan {out / 'split.csv'}: {said}" in line, line
    assert digests(data, out) == before  # every file where the interrupted move left it


def test_an_earlier_split_without_a_path_column_is_named_when_force_replaces_it(tmp_path):
    """Before: every file of the earlier split read as one it did not write ('holds files in
    its split folders that the earlier split did not write'), split.csv never named."""
    data, out = write_images(tmp_path / "data"), tmp_path / "out"
    split_dataset(data, out, ratio="1:1")
    rewrite_plan(out, lambda lines: [line.split(",", 1)[1] for line in lines])
    before = digests(out)
    result = run_torchkit_in_process("split", data, out, "--ratio", "1:1", "--force")
    assert result.returncode == 1
    line = error_line(result.stderr)
    assert f"cannot read the earlier split {out / 'split.csv'}: it has no path column" in line
    assert digests(out) == before


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (lambda journal: journal.pop("ratio"), "it has no 'ratio'"),
        (lambda journal: journal.update(ratio=5), "its 'ratio' is 5"),
        (lambda journal: journal.update(counts=[[1]]), "its 'counts' do not fit"),
    ],
    ids=["key-gone", "wrong-type", "counts-misfit"],
)
def test_a_damaged_journal_of_an_interrupted_move_is_named_and_no_file_moves(
    tmp_path, monkeypatch, edit, said
):
    """Before: the rerun moved the rest of the files, then ended in `Error: KeyError: 'ratio'`
    (the summary read the journal only at the end)."""
    import json

    data, out = interrupted_move(tmp_path, monkeypatch)
    journal = json.loads((out / ".torchkit-split.json").read_text(encoding="utf-8"))
    edit(journal)
    (out / ".torchkit-split.json").write_text(json.dumps(journal), encoding="utf-8")
    before = digests(data, out)
    result = run_torchkit_in_process("split", data, out, "--mode", "move", "--ratio", "1:1")
    assert result.returncode == 1
    line = error_line(result.stderr, besides="warnings")
    assert line.startswith(f"Error: cannot read {out / '.torchkit-split.json'}: {said}"), line
    assert "no file was moved" in line and "mend it by hand" in line
    assert digests(data, out) == before  # every file where the interrupted move left it


def test_a_finished_move_whose_journal_is_damaged_is_named(tmp_path):
    """Before: the same command line again, which reports the finished move, ended in
    `Error: TypeError: 'int' object is not iterable`."""
    import json

    data, out = write_images(tmp_path / "data"), tmp_path / "out"
    split_dataset(data, out, mode="move", ratio="1:1")
    journal = json.loads((out / ".torchkit-split.json").read_text(encoding="utf-8"))
    journal["counts"] = 5
    (out / ".torchkit-split.json").write_text(json.dumps(journal), encoding="utf-8")
    result = run_torchkit_in_process("split", data, out, "--mode", "move", "--ratio", "1:1")
    assert result.returncode == 1
    assert "split.json: its 'counts' is 5 (a damaged" in error_line(result.stderr)


def mend_row(column: int, value: str):
    """An edit of the plan's last row: its `column` (path 0, label 1, split 2) set to `value`."""

    def edit(lines: list[str]) -> list[str]:
        fields = lines[-1].split(",")
        fields[column] = value
        return [*lines[:-1], ",".join(fields)]

    return edit


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        # Before: the files moved, then `Error: ValueError: 'bogus' is not in list`.
        (mend_row(2, "bogus"), "row 7 names the split 'bogus', not one of the move's splits"),
        # Before: the files moved, then `Error: KeyError: 'zzz'`.
        (mend_row(1, "zzz"), "row 7 names the class 'zzz', which the move's journal does not"),
        # Before: the file was moved out of OUT, beside it, and the rerun exited 0.
        (mend_row(0, "train/../../escaped.png"), "row 7 puts its file at 'train/../../escaped"),
        # Before: b/2.png was moved to b/1.png's place in OUT (b/1.png gone), exit 0.
        (
            lambda lines: mend_row(0, lines[-2].split(",")[0])(lines),
            "row 7 puts a second file at 'train/b/1.png'",
        ),
    ],
    ids=["split-not-journalled", "class-not-journalled", "path-out-of-out", "path-twice"],
)
def test_a_plan_row_the_journal_does_not_record_is_refused_before_any_file_moves(
    tmp_path, monkeypatch, edit, said
):
    """A plan's row is checked against the journal before the finish moves a file, where a
    file deleted from ROOT meanwhile (whose row the finish drops, recounting the splits) had
    the rerun move the rest first and fail after."""
    data, out = interrupted_move(tmp_path, monkeypatch)
    rewrite_plan(out, edit)
    plan = (out / "split.csv").read_text(encoding="utf-8").splitlines()
    gone = Path(plan[-2].split(",")[3])  # another process deletes a file not yet moved
    if gone.exists():
        gone.unlink()
    before = digests(tmp_path)
    result = run_torchkit_in_process("split", data, out, "--mode", "move", "--ratio", "1:1")
    assert result.returncode == 1
    line = error_line(result.stderr)
    assert line.startswith(f"Error: cannot read the plan {out / 'split.csv'}: {said}"), line
    assert "hand-edited plan; no file was moved" in line and "mend row" in line
    assert "finishing the interrupted move" not in result.stderr
    assert digests(tmp_path) == before  # every file where the interrupted move left it


def test_a_finished_move_whose_journal_lost_its_root_is_named_not_said_from_none(tmp_path):
    """Before: `Error: OUT holds files moved there from None: the only copies`."""
    import json

    data, out = write_images(tmp_path / "data"), tmp_path / "out"
    split_dataset(data, out, mode="move", ratio="1:1")
    journal = json.loads((out / ".torchkit-split.json").read_text(encoding="utf-8"))
    del journal["root"]
    (out / ".torchkit-split.json").write_text(json.dumps(journal), encoding="utf-8")
    result = run_torchkit_in_process("split", data, out, "--mode", "move", "--ratio", "1:1")
    assert result.returncode == 1
    assert "split.json: it has no 'root' (a damaged" in error_line(result.stderr)


@pytest.mark.parametrize("source", ["up-and-out", "absolute", "relative", "csv-elsewhere"])
def test_a_plan_row_whose_source_is_outside_root_is_refused_before_any_file_moves(
    tmp_path, monkeypatch, source
):
    """Before: the finish moved the file a hand-edited row named (`ROOT/../elsewhere/x.png`,
    `/home/me/x.png`, a path relative to wherever the rerun ran) into OUT, and exited 0."""
    import os

    elsewhere = tmp_path / "elsewhere" / "x.png"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(b"not the dataset's")
    if source == "csv-elsewhere":  # the folders a CSV index lists files in bound its move
        listed = write_images(tmp_path / "listed")
        rows = [f"{p.relative_to(listed)},{p.parent.name}" for p in sorted(listed.rglob("*.png"))]
        (listed / "index.csv").write_text("\n".join(["path,label", *rows]) + "\n")
        data, out = listed / "index.csv", tmp_path / "out"
        stop_move_after(1, monkeypatch, data, out, ratio="1:1")
    else:
        data, out = interrupted_move(tmp_path, monkeypatch)
    value = {
        "up-and-out": f"{data}/../elsewhere/x.png",
        "relative": os.path.relpath(elsewhere),
    }.get(source, str(elsewhere))
    rewrite_plan(out, mend_row(3, value))
    before = digests(tmp_path)
    result = run_torchkit_in_process("split", data, out, "--mode", "move", "--ratio", "1:1")
    assert result.returncode == 1
    line = error_line(result.stderr)
    said = "not an absolute path" if source == "relative" else "which is not inside"
    assert line.startswith(f"Error: cannot read the plan {out / 'split.csv'}: row 7 moves "), line
    assert said in line and "no file was moved" in line, line
    assert digests(tmp_path) == before  # every file where the interrupted move left it


def test_the_hint_that_finishes_a_move_of_a_folder_named_with_a_dash_works_as_written(
    tmp_path, monkeypatch, caplog
):
    """Before: `finish it with: torchkit split -d -o --mode move`, which reads `-d` as an
    option (`Error: missing OUT`); the paths are now written `./-d`."""
    import logging
    import shlex

    monkeypatch.chdir(tmp_path)
    write_images(tmp_path / "-d")
    with caplog.at_level(logging.WARNING, logger="torchkit"):
        stop_move_after(1, monkeypatch, Path("-d"), Path("-o"), ratio="1:1")
    assert "finish it with: torchkit split ./-d ./-o --mode move" in caplog.text
    refused = run_torchkit_in_process("dataset-stats", "--", "-d", cwd=tmp_path)
    hint = error_line(refused.stderr).rpartition("finish that move first: ")[2].rstrip(")")
    assert hint == f"torchkit split ./-d {shlex.quote(str(tmp_path / '-o'))} --mode move"
    finished = run_torchkit_in_process(*shlex.split(hint)[1:], cwd=tmp_path)  # as written
    assert finished.returncode == 0, finished.stderr
    assert not list((tmp_path / "-d").rglob("*.png")) and len(list(Path("-o").rglob("*.png"))) == 6
