"""File and class names holding a carriage return, a line break, a comma or a quote (Linux allows
them): every CSV torchkit writes quotes such a field, so any CSV reader (Python's csv, pandas,
torchkit's own CSV index) reads each row back whole, to the name that opens the same file."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from checkpoints import write_convnet_checkpoint
from image_folders import write_image_folder
from processes import run_torchkit_in_process

from torchkit.core.io.csv_rows import CsvWriter, csv_text

CLASSES = ["cr\rclass", 'say "hi", twice']
FILES = ["cr\rback.png", "line\nbreak.png", "crlf\r\nboth.png"]
MODEL = ["--device", "cpu", "--workers", "0"]


def ok(*args: object):
    done = run_torchkit_in_process(*args)
    assert done.returncode == 0, done.stderr
    return done


def rows_of(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8", newline="") as handle:  # as the csv module asks
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = write_image_folder(tmp_path_factory.mktemp("names") / "data", dict.fromkeys(CLASSES, 3))
    for name in CLASSES:
        for index, file in enumerate(FILES):
            (root / name / f"{name}_{index}.png").rename(root / name / file)
    return root


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "model.pt"
    write_convnet_checkpoint(path, in_channels=3, image_size=8, classes=CLASSES)
    return path


def test_the_writer_writes_none_as_an_empty_field_and_an_empty_string_quoted():
    """One rule for every CSV: a missing value (None) is an empty field, an empty string `""`
    (PostgreSQL's CSV, Python's QUOTE_NOTNULL); a row of one field is `""` either way, as the
    csv module writes it (an empty line is no row). Before, both were empty fields."""
    rows = [["k", "v"], ["none", None], ["empty", ""], ["", None], [None, "x"], [""], [None]]
    for terminator in ("\n", "\r\n"):
        text = csv_text(rows, terminator)
        expected = ["k,v", "none,", 'empty,""', '"",', ",x", '""', '""', ""]
        assert text == terminator.join(expected)
    many = [["a", "b"], *([["x", "y"]] * 2500), ["z", ""]]  # past one chunk of rows
    assert csv_text(many).endswith('x,y\nz,""\n')


def test_the_writer_quotes_a_carriage_return_and_keeps_other_rows_as_csv_writes_them():
    rows = [["path", "n"], ["cr\rback.png", 1], ["plain.png", None], ["a,b", 2.5]]
    text = csv_text(rows)
    assert text == 'path,n\n"cr\rback.png",1\nplain.png,\n"a,b",2.5\n'
    assert list(csv.reader(io.StringIO(text, newline=""))) == [
        ["path", "n"], ["cr\rback.png", "1"], ["plain.png", ""], ["a,b", "2.5"],
    ]  # fmt: skip
    streamed = io.StringIO()
    writer = CsvWriter(streamed, lineterminator="\r\n")
    for row in rows:
        writer.writerow(iter(row))
    assert streamed.getvalue() == text.replace("\n", "\r\n")


def test_a_split_manifest_reads_back_as_the_same_files(data, tmp_path):
    ok("split", data, tmp_path / "out", "--mode", "manifest", "--ratio", "1,1,1", "-q")
    manifest = tmp_path / "out" / "split.csv"
    rows = rows_of(manifest)
    assert len(rows) == 6 and {row["label"] for row in rows} == set(CLASSES)
    assert all((tmp_path / "out" / row["path"]).is_file() for row in rows)
    stats = json.loads(ok("dataset-stats", manifest, "--split", "all", "--format", "json").stdout)
    assert stats["images"] == 6 and stats["unreadable_count"] == 0
    # --format csv of a table: the class names whole
    shown = ok("dataset-stats", data, "--format", "csv", "-j", "0").stdout  # no pool to fork
    classes = [row[1] for row in csv.reader(io.StringIO(shown, newline="")) if row[0] == "class"]
    assert sorted(classes) == sorted(CLASSES)


def test_predict_and_features_name_each_file_in_one_row(data, model, tmp_path):
    ok("predict", model, data, *MODEL, "-o", tmp_path / "predictions.csv")
    ok("extract-features", model, data, tmp_path / "features", *MODEL, "-q")
    for written in ("predictions.csv", "features/index.csv"):
        rows = rows_of(tmp_path / written)
        assert len(rows) == 6, written
        assert all((data / row["path"]).is_file() for row in rows), written
        assert sorted({row["label"] for row in rows}) == sorted(CLASSES)


SPACED = [" cat", "cat ", "cat", " "]  # class folders that differ only in spaces around them


def test_a_field_with_spaces_around_it_is_quoted_and_a_csv_index_reads_it_back_exactly(tmp_path):
    from torchkit.core.data.sources.csv_index import read_index_rows

    rows = [["path", "label", "n"], *([f" {i}.png ", name, i] for i, name in enumerate(SPACED))]
    rows.append(["two\nlines.png", " cat", 9])
    text = csv_text(rows)
    assert '" 0.png "," cat",0\n' in text and "\n2.png,cat,2\n" not in text
    assert text.endswith('"two\nlines.png"," cat",9\n')  # the quoted row spans two lines
    (tmp_path / "index.csv").write_text(text, encoding="utf-8", newline="")
    read = read_index_rows(tmp_path / "index.csv")
    assert read.paths == [row[0] for row in rows[1:]]
    assert read.labels == [row[1] for row in rows[1:]]
    # written by hand, unquoted: a space after the comma is no part of the label
    (tmp_path / "hand.csv").write_text('path, label\na.png, cat \nb.png,  "x" \n')
    assert read_index_rows(tmp_path / "hand.csv").labels == ["cat", '"x"']


def test_a_split_manifest_keeps_class_folders_that_differ_only_in_spaces_apart(tmp_path):
    # A folder " " is no class (a report would show no name): test_names_and_links.
    spaced = [name for name in SPACED if name.strip()]
    data = write_image_folder(tmp_path / "data", dict.fromkeys(spaced, 3))
    ok("split", data, tmp_path / "out", "--mode", "manifest", "--ratio", "1,1,1", "-q")
    manifest = tmp_path / "out" / "split.csv"
    stats = json.loads(
        ok("dataset-stats", manifest, "--split", "all", "--format", "json", "-j", "0").stdout
    )
    assert sorted(row["name"] for row in stats["classes"]) == sorted(spaced)
    model = tmp_path / "model.pt"
    write_convnet_checkpoint(model, in_channels=3, image_size=8, classes=spaced)
    done = ok("eval", model, "--data", manifest, "--split", "test", *MODEL, "--format", "json")
    assert sorted(row["label"] for row in json.loads(done.stdout)["per_class"]) == sorted(spaced)


def test_rows_without_spaces_skip_the_pattern_search_and_every_ascii_space_is_still_quoted(
    monkeypatch,
):
    # The pattern search took as long as writing the rows; plain ASCII rows never need it.
    import torchkit.core.io.csv_rows as csv_rows

    class Unsearchable:
        def search(self, text: str):
            raise AssertionError(f"searched {text!r}")

    pattern = csv_rows._SPACED
    monkeypatch.setattr(csv_rows, "_SPACED", Unsearchable())
    assert csv_text([["path", "p"], ["a/b.png", 0.5], ["c,d.png", None]]) == (
        'path,p\na/b.png,0.5\n"c,d.png",\n'
    )
    monkeypatch.setattr(csv_rows, "_SPACED", pattern)
    for char in (chr(code) for code in range(128)):
        if char.isspace() and char not in "\r\n":
            assert csv_text([["x" + char, "y"], [char + "z", 1]]) == f'"x{char}",y\n"{char}z",1\n'
    assert csv_text([["a\xa0", "b"]]) == '"a\xa0",b\n'  # non-ASCII text: the pattern decides
