"""The rows of a CSV index: numbered classes sort as numbers, every label reads, the class order
is the same in every process (torchrun's ranks, train then resume); bytes no CSV index holds
are one error line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from image_folders import write_image_folder
from output_checks import error_line
from processes import dataset_stats, run_torchkit_in_process

from torchkit.core.data.sources.csv_index import natural_key
from torchkit.core.io.errors import InputError


def write_index(folder: Path, labels: list[str]) -> Path:
    """folder/index.csv naming one generated image per label, `imgs/x_<i>.png`."""
    write_image_folder(folder / "imgs", {"x": len(labels)})
    rows = "".join(f"imgs/x/x_{i}.png,{label}\n" for i, label in enumerate(labels))
    index = folder / "index.csv"
    index.write_text("path,label\n" + rows, encoding="utf-8")
    return index


def test_two_spellings_of_one_number_sort_the_same_whatever_order_they_come_in():
    """Labels "1" and "01" are two classes of one number: they sorted in the order they came in, a
    set's, which differs between processes (PYTHONHASHSEED), so two ranks could number them
    differently. Now by their text."""
    names = ["1", "01", "001", "2", "10"]
    assert sorted(names, key=natural_key) == ["001", "01", "1", "2", "10"]
    assert sorted(reversed(names), key=natural_key) == ["001", "01", "1", "2", "10"]


def test_labels_that_look_like_numbers_but_are_not_read(tmp_path):
    """A superscript digit ("²" is a digit to str.isdigit), "--1" and a number too long for
    int() were an `Error: ValueError: invalid literal for int()`; now they are classes named as
    written, after the numbers."""
    labels = ["²", "--1", "9" * 5000, "2", "a"]
    found = dataset_stats(write_index(tmp_path, labels), "-j", "0")
    assert [c["name"] for c in found["classes"]] == ["2", "--1", "9" * 5000, "a", "²"]


def test_a_path_holding_a_nul_byte_is_an_error_naming_its_line(tmp_path):
    """It was `Error: ValueError: embedded null byte` in dataset-stats, a skipped image in
    eval, and a path with a NUL byte in predict's rows."""
    index = write_index(tmp_path, ["a", "b", "a"])
    rows = index.read_text(encoding="utf-8").splitlines()
    rows[2] = rows[2].replace(".png", "\0.png")
    index.write_text("\n".join(rows) + "\n", encoding="utf-8")
    result = run_torchkit_in_process("dataset-stats", index, "-j", "0")
    assert result.returncode == 1
    # Python 3.10's csv stops at the NUL before the row's fields are known
    assert error_line(result.stderr).startswith(
        f"Error: {index} has "
        + ("1 row(s) whose path" if sys.version_info >= (3, 11) else "a row whose text")
        + " holds a NUL byte (line 3)"
    )


def test_a_utf16_index_is_said_to_be_no_utf8(tmp_path):
    """pandas' to_csv(encoding="utf-16") reads as UTF-8 with a NUL byte after each letter: the
    error named columns `p\\x00a\\x00t\\x00h\\x00`."""
    index = write_index(tmp_path, ["a", "b"])
    index.write_bytes(index.read_text(encoding="utf-8").encode("utf-16"))
    result = run_torchkit_in_process("dataset-stats", index, "-j", "0")
    assert result.returncode == 1
    line = error_line(result.stderr)
    assert line.startswith(f"Error: {index} is not UTF-8 text")
    assert line.endswith("(save it as CSV UTF-8, with or without BOM)")


def test_a_row_of_more_fields_than_the_header_is_an_error_naming_its_line(tmp_path):
    """An unquoted comma in a path (`a,b.png,cat`) read as the file `a` of a new class `b.png`
    (the file counted unreadable, exit 0), as pandas refuses. Empty fields past the header
    (a spreadsheet's trailing commas) are no fields."""
    index = write_index(tmp_path, ["a", "b", "a", "b"])
    rows = index.read_text(encoding="utf-8").splitlines()
    rows[1] += ",,"
    rows[3] = rows[3].replace("imgs/", "imgs/x,")
    index.write_text("\n".join(rows) + "\n", encoding="utf-8")
    result = run_torchkit_in_process("dataset-stats", index, "-j", "0")
    assert result.returncode == 1
    assert error_line(result.stderr).startswith(
        f"Error: {index} has 1 row(s) with more fields than its header names (line 4)"
    )
    rows[3] = rows[3].replace("imgs/x,", "imgs/")
    index.write_text("\n".join(rows) + "\n", encoding="utf-8")
    assert dataset_stats(index, "-j", "0")["images"] == 4


def test_an_index_listing_itself_is_refused_before_a_move_takes_it(tmp_path):
    """`split --mode move` moved the index into OUT/<split>/<class>/ as one of its images (a
    rerun to finish the move then found no index); other commands counted it unreadable."""
    index = write_index(tmp_path, ["a", "b", "a", "b"])
    with index.open("a", encoding="utf-8") as handle:
        handle.write("./index.csv,a\n")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    result = run_torchkit_in_process(
        "split", index, tmp_path.parent / "out", "--mode", "move", "--ratio", "1,1"
    )
    assert result.returncode == 1
    assert error_line(result.stderr).startswith(f"Error: {index} lists itself as an image (line 6)")
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_a_header_repeated_by_joining_two_indexes_is_an_error_naming_its_line(tmp_path):
    """`cat a.csv b.csv > all.csv` (the second with a BOM, as Excel saves it) read the second
    header as an image `path` of a class `label`: a class of no image, exit 0."""
    index = write_index(tmp_path, ["a", "b", "a", "b"])
    rows = index.read_text(encoding="utf-8").splitlines()
    rows.insert(3, "\ufeffpath,label")
    index.write_text("\n".join(rows) + "\n", encoding="utf-8")
    result = run_torchkit_in_process("dataset-stats", index, "-j", "0")
    assert result.returncode == 1
    assert error_line(result.stderr).startswith(f"Error: {index} repeats its header in line 4")


def test_a_symlinked_index_reads_the_images_beside_the_file_it_leads_to(tmp_path):
    """`ln -s /data/set/index.csv here/index.csv`: its paths were joined to the link's folder,
    so every image was unreadable ("file not found", exit 0). The index's own folder is what
    its paths are relative to, however it is reached."""
    index = write_index(tmp_path / "set", ["a", "b", "a"])
    (tmp_path / "here").mkdir()
    link = tmp_path / "here" / "index.csv"
    link.symlink_to(index)
    found = dataset_stats(link, "-j", "0")
    assert (found["images"], found["unreadable_count"]) == (3, 0)
    assert [c["images"] for c in found["classes"]] == [2, 1]


def test_an_index_linked_into_its_image_folder_from_elsewhere_reads_the_images_there(tmp_path):
    """`ln -s ~/splits/train.csv /data/flowers/`: read beside the link before links were
    followed, then joined to ~/splits/ (none of the images could be read); the link's folder
    is taken where the files are there and not beside the file it leads to."""
    index = write_index(tmp_path / "set", ["a", "b", "a"])
    (tmp_path / "splits").mkdir()
    elsewhere = index.rename(tmp_path / "splits" / "train.csv")
    link = tmp_path / "set" / "train.csv"
    link.symlink_to(Path("..") / "splits" / "train.csv")
    found = dataset_stats(link, "-j", "0")
    assert (found["images"], found["unreadable_count"]) == (3, 0)
    none_there = run_torchkit_in_process("dataset-stats", elsewhere, "-j", "0")
    assert none_there.returncode == 1


def _with_rows(index: Path, *rows: str, header: str | None = None) -> Path:
    """`index` with `rows` appended (and its header replaced by `header`)."""
    lines = index.read_text(encoding="utf-8").splitlines()
    if header is not None:
        lines[0] = header
    index.write_text("\n".join([*lines, *rows]) + "\n", encoding="utf-8")
    return index


def test_one_image_given_two_labels_is_one_error_naming_both_lines_in_every_command(tmp_path):
    """train trained the image as both classes and dataset-stats counted it in both (exit 0),
    while split refused it: every command refuses it now, naming the two lines (`./` or not)."""
    index = _with_rows(write_index(tmp_path, ["a", "b", "a", "b"]), "./imgs/x/x_0.png,b")
    expected = (
        f"Error: {index} gives './imgs/x/x_0.png' two labels: 'a' in line 2 and 'b' in line 6"
    )
    for command in (
        ["dataset-stats", index],
        ["split", index, tmp_path / "out", "--mode", "manifest"],
        ["train", "--data", index, "--model", "nets:TinyNet", "--out", tmp_path / "run"],
    ):
        result = run_torchkit_in_process(*command)
        assert result.returncode == 1
        assert error_line(result.stderr).startswith(expected), command
    assert not (tmp_path / "out").exists() and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "spelled", ["imgs/x/x_0.png", "imgs/x/./x_0.png", "imgs//x/x_0.png", "imgs/x/../x/x_0.png"]
)
def test_one_path_twice_or_spelled_otherwise_with_two_labels_is_an_error_naming_both_rows(
    tmp_path, spelled
):
    """The same text, or another spelling of one path (no stat needed to tell): one image."""
    from torchkit.core.data.sources.csv_index import read_index_rows

    index = _with_rows(write_index(tmp_path, ["a", "b"]), f"{spelled},b")
    with pytest.raises(InputError) as raised:
        read_index_rows(index)
    assert str(raised.value) == (
        f"{index} gives {spelled!r} two labels: 'a' in line 2 and 'b' in line 4 (an image has "
        "one label: fix or remove one of the rows)"
    )


def test_a_path_up_out_of_a_linked_folder_is_not_taken_for_the_file_its_text_names(tmp_path):
    """`sub/../x.png` where `sub` links to a folder elsewhere names the x.png beside that
    folder, another file than `x.png`: its two labels were refused as one image's."""
    from torchkit.core.data.sources.csv_index import read_index_rows

    write_image_folder(tmp_path / "elsewhere" / "deep", {"sub": 1})
    write_image_folder(tmp_path, {"imgs": 1}, seed=1)
    (tmp_path / "elsewhere" / "deep" / "x.png").write_bytes(b"other")
    (tmp_path / "x.png").write_bytes(b"this")
    (tmp_path / "sub").symlink_to(tmp_path / "elsewhere" / "deep" / "sub")
    index = tmp_path / "index.csv"
    index.write_text("path,label\nx.png,a\nsub/../x.png,b\nimgs/imgs_0.png,a\n")
    rows = read_index_rows(index)
    assert rows.paths == ["x.png", "sub/../x.png", "imgs/imgs_0.png"]
    assert rows.labels == ["a", "b", "a"]
    (tmp_path / "sub").unlink()
    (tmp_path / "sub").mkdir()  # a plain folder: one file
    with pytest.raises(InputError, match="gives 'sub/../x.png' two labels"):
        read_index_rows(index)


def test_dataset_stats_lists_one_image_in_two_splits_as_a_same_file_pair(tmp_path):
    """An index naming one file in train and val: dataset-stats, whose leakage check finds
    such files, stopped at the readers' error; now an exact pair marked same_file, as for a
    linked folder (--no-leakage refuses it, as every other command does)."""
    index = write_index(tmp_path, ["a", "b", "a"])
    rows = index.read_text(encoding="utf-8").splitlines()[1:]
    lines = ["path,label,split", *(row + ",train" for row in rows), "./" + rows[0] + ",val"]
    index.write_text("\n".join(lines) + "\n", encoding="utf-8")
    pairs = tmp_path / "pairs.csv"
    result = run_torchkit_in_process("dataset-stats", index, "-j", "0", "--leakage-csv", pairs)
    assert result.returncode == 0, result.stderr
    assert "1 of them one file under two names (same_file)" in result.stderr
    assert pairs.read_text().splitlines() == [
        "path_a,split_a,path_b,split_b,kind,distance,same_file",
        "imgs/x/x_0.png,train,./imgs/x/x_0.png,val,exact,0,true",
    ]
    refused = run_torchkit_in_process("dataset-stats", index, "-j", "0", "--no-leakage")
    assert refused.returncode == 1
    assert error_line(refused.stderr).startswith(
        f"Error: {index} gives './imgs/x/x_0.png' two splits: 'train' in line 2 and 'val' in line 5"
    )


def test_one_image_in_two_splits_is_an_error_naming_both_lines(tmp_path):
    """The same file in train and val leaked into the validation of the model trained on it."""
    index = write_index(tmp_path, ["a", "b"])
    rows = index.read_text(encoding="utf-8").splitlines()
    lines = ["path,label,split", rows[1] + ",train", rows[2] + ",train", rows[1] + ",val"]
    index.write_text("\n".join(lines) + "\n", encoding="utf-8")
    run = tmp_path / "run"
    result = run_torchkit_in_process(
        "train", "--data", index, "--model", "nets:TinyNet", "--out", run
    )
    assert result.returncode == 1 and not run.exists()
    assert error_line(result.stderr).startswith(
        f"Error: {index} gives 'imgs/x/x_0.png' two splits: 'train' in line 2 and 'val' in line 4"
    )


def test_a_row_repeated_with_its_label_is_read_once_with_a_warning_unless_repeats_are_numbered(
    tmp_path,
):
    """A repeated row (two indexes joined) was trained and counted twice, and refused by split;
    now each command reads it once and says so. Rows a `repeat` column numbers are repeats
    on purpose (what split --oversample --mode manifest writes for train): all read."""
    index = _with_rows(write_index(tmp_path, ["a", "b", "a"]), "imgs/x/x_0.png,a")
    result = run_torchkit_in_process("dataset-stats", index, "-j", "0", "--format", "json")
    assert result.returncode == 0, result.stderr
    assert (
        f"Warning: {index} lists 1 image(s) again with the same label (line 5 repeats line 2)"
        in (result.stderr)
    )
    assert '"images": 3' in result.stdout
    split = run_torchkit_in_process("split", index, tmp_path / "out", "--mode", "manifest")
    assert split.returncode == 0, split.stderr
    assert len((tmp_path / "out" / "split.csv").read_text().splitlines()) == 4
    rows = index.read_text(encoding="utf-8").splitlines()
    numbered = [rows[0] + ",repeat"] + [row + ",0" for row in rows[1:-1]] + [rows[-1] + ",1"]
    index.write_text("\n".join(numbered) + "\n", encoding="utf-8")
    assert dataset_stats(index, "-j", "0")["images"] == 4


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("~/x.png", "1 row(s) whose path starts with ~ (line 5: ~/x.png), which only a shell"),
        ("https://host/x.png", "1 row(s) whose path is a URL (line 5: https://host/x.png)"),
        ("C:\\data\\x.png", "1 row(s) whose path is a Windows path (line 5: C:\\data\\x.png)"),
        ("imgs\\x\\x_0.png", "1 row(s) whose path holds backslashes (line 5: imgs\\x\\x_0.png)"),
    ],
)
def test_a_path_written_for_a_shell_the_web_or_windows_is_an_error_naming_its_line(
    tmp_path, path, message
):
    """Read literally, each was an unreadable "file not found" (`DIR/~/x.png`; a URL's `//`
    even lost: `DIR/https:/host/x.png`), exit 0. A file named so is read, as it is written."""
    index = _with_rows(write_index(tmp_path, ["a", "b", "a"]), f'"{path}",a')
    result = run_torchkit_in_process("dataset-stats", index, "-j", "0")
    assert result.returncode == 1
    assert error_line(result.stderr).startswith(f"Error: {index} has {message}")
    if path == "imgs\\x\\x_0.png":
        assert error_line(result.stderr).endswith(
            "(write / between folders: imgs/x/x_0.png is there)"
        )
    if path[0] == "~":
        (tmp_path / "~").mkdir()
        (tmp_path / "~" / "x.png").hardlink_to(tmp_path / "imgs" / "x" / "x_0.png")
        assert dataset_stats(index, "-j", "0")["images"] == 4


def test_an_index_of_semicolons_or_tabs_is_said_to_be_so(tmp_path):
    """Excel saves "CSV" with semicolons where the decimal mark is a comma: the error named a
    column `path;label` and asked for `path` and `label` columns, which it seemed to have."""
    index = write_index(tmp_path, ["a", "b"])
    text = index.read_text(encoding="utf-8")
    for separator, name in ((";", "semicolons"), ("\t", "tabs")):
        index.write_text(text.replace(",", separator), encoding="utf-8")
        result = run_torchkit_in_process("dataset-stats", index, "-j", "0")
        assert result.returncode == 1
        assert error_line(result.stderr).startswith(
            f"Error: {index} separates its columns with {name}, not commas (line 1: "
        )


def test_one_image_labelled_in_two_unicode_spellings_of_one_name_is_named_as_such(tmp_path):
    """`café` composed in one row and decomposed (macOS) in another read as one class: the
    error said the image had two labels, 'café' and 'café'. The spellings are named instead."""
    index = _with_rows(write_index(tmp_path, ["caf\u00e9", "b"]), "imgs/x/x_0.png,cafe\u0301")
    result = run_torchkit_in_process("dataset-stats", index, "-j", "0")
    assert result.returncode == 1
    assert "two Unicode spellings" in error_line(result.stderr)
    assert "two labels" not in result.stderr


def test_a_repeated_row_of_an_unlabelled_index_is_not_said_to_repeat_a_label(tmp_path):
    index = write_index(tmp_path, ["a", "b"])
    paths = [row.split(",")[0] for row in index.read_text(encoding="utf-8").splitlines()[1:]]
    index.write_text("\n".join(["path", *paths, paths[0]]) + "\n", encoding="utf-8")
    result = run_torchkit_in_process("dataset-stats", index, "-j", "0", "--format", "json")
    assert result.returncode == 0, result.stderr
    assert f"Warning: {index} lists 1 image(s) again (line 4 repeats line 2): each is read" in (
        result.stderr
    )
    assert '"images": 2' in result.stdout


def test_a_column_named_twice_is_an_error_naming_it(tmp_path):
    """Two indexes pasted side by side (`path,label,path,label`) were read by their last
    columns alone, the first index's rows dropped without a word."""
    index = write_index(tmp_path, ["a", "b"])
    rows = index.read_text(encoding="utf-8").splitlines()
    index.write_text("\n".join(f"{row},{row}" for row in rows) + "\n", encoding="utf-8")
    result = run_torchkit_in_process("dataset-stats", index, "-j", "0")
    assert result.returncode == 1
    assert error_line(result.stderr) == (
        f"Error: {index} names the column path twice (line 1: path, label, path, label) (keep "
        "one column of each name)"
    )
