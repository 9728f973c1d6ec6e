"""A CSV index whose quote is opened and never closed (`"imgs/x/x_2.png,b`): Python's csv reader
closes it at the end of the file, so every row after it was read as one path naming no file, one
unreadable image among the rest (exit 0), the rows lost without a word."""

from __future__ import annotations

from pathlib import Path

from checkpoints import write_convnet_checkpoint
from image_folders import write_image_folder
from output_checks import error_line
from processes import dataset_stats, run_torchkit_in_process


def write_index(folder: Path, rows: list[str]) -> Path:
    write_image_folder(folder / "imgs", {"x": 4})
    index = folder / "index.csv"
    index.write_text("path,label\n" + "".join(row + "\n" for row in rows), encoding="utf-8")
    return index


def test_a_quote_never_closed_is_an_error_naming_its_lines(tmp_path):
    rows = [f"imgs/x/x_{i}.png,{'ab'[i % 2]}" for i in range(4)]
    index = write_index(tmp_path, [*rows[:2], '"' + rows[2], rows[3]])
    checkpoint = tmp_path / "ab.pt"
    write_convnet_checkpoint(checkpoint, in_channels=3, image_size=8, classes="ab")
    for command in (("dataset-stats", index), ("eval", checkpoint, "--data", index)):
        result = run_torchkit_in_process(*command, "-j", "0")
        assert result.returncode == 1, result.stderr
        assert error_line(result.stderr) == (
            f"Error: {index}: the quote opened in line 4 is never closed, so lines 4-5 read as "
            'one field (close it: "a,b.png",cat; a quote inside a quoted field is written '
            'twice, "a""b.png")'
        )


def test_a_quoted_path_holding_a_line_break_is_a_path_still(tmp_path):
    """A file name may hold a line break: quoted, closed, it is one path, as before."""
    index = write_index(tmp_path, ["imgs/x/x_0.png,a", '"imgs/x/x_1\n.png",b'])
    (tmp_path / "imgs" / "x" / "x_1.png").rename(tmp_path / "imgs" / "x" / "x_1\n.png")
    report = dataset_stats(index, "-j", "0")
    assert (report["images"], report["unreadable_count"]) == (2, 0)


def test_a_quote_never_closed_before_a_long_tail_says_what_made_the_field_too_long(tmp_path):
    index = write_index(tmp_path, ['"imgs/x/x_0.png,a'] + ["imgs/x/x_1.png,b"] * 10_000)
    result = run_torchkit_in_process("dataset-stats", index, "-j", "0")
    assert result.returncode == 1
    assert error_line(result.stderr).endswith(
        "field larger than field limit (131072) (a quote opened and never closed makes the "
        "lines after it one field)"
    )


def test_a_quote_closed_rows_later_is_an_error_naming_both_lines(tmp_path):
    """`"a.png,cat` in line 5 closed by `b.png",dog` in line 9: the rows between were read as
    one path naming no file (one unreadable image, exit 0), without a word."""
    rows = [f"imgs/x/x_{i}.png,{'ab'[i % 2]}" for i in range(4)]
    index = write_index(tmp_path, [*rows[:3], '"' + rows[3], *rows[:2], rows[2] + '"', rows[3]])
    result = run_torchkit_in_process("dataset-stats", index, "-j", "0")
    assert result.returncode == 1, result.stderr
    assert error_line(result.stderr) == (
        f"Error: {index}: the quote opened in line 5 is closed in line 8, so lines 5-8 read as "
        'one path, which names no file (close the quote in line 5 on its line: "a,b.png",cat; '
        'a quote inside a quoted field is written twice, "a""b.png")'
    )


def test_the_lines_are_counted_in_a_windows_index_whose_path_is_not_first(tmp_path):
    write_image_folder(tmp_path / "imgs", {"x": 2})
    index = tmp_path / "index.csv"
    lines = ["label,path", "a,imgs/x/x_0.png", 'a,"imgs/x/x_1.png', "b,imgs/x/x_0.png", 'x",b']
    index.write_bytes("\r\n".join(lines).encode() + b"\r\n")
    result = run_torchkit_in_process("dataset-stats", index, "-j", "0")
    assert result.returncode == 1
    assert "the quote opened in line 3 is closed in line 5, so lines 3-5" in result.stderr


def test_an_index_of_paths_alone_is_read_the_same_way(tmp_path):
    """Without a comma in its rows, the lines between read as a path of lines naming files."""
    write_image_folder(tmp_path / "imgs", {"x": 3})
    index = tmp_path / "index.csv"
    index.write_text('path\n"imgs/x/x_0.png\nimgs/x/x_1.png\nimgs/x/x_2.png"\n', encoding="utf-8")
    result = run_torchkit_in_process("dataset-stats", index, "-j", "0")
    assert result.returncode == 1
    assert "the quote opened in line 2 is closed in line 4, so lines 2-4" in result.stderr
    # A quoted path of two lines naming no file, whose lines name none: one path naming no
    # file (an unreadable image), as an unquoted one is.
    index.write_text('path\nimgs/x/x_0.png\n"two\nlines.png"\n', encoding="utf-8")
    report = dataset_stats(index, "-j", "0")
    assert (report["images"], report["unreadable_count"]) == (1, 1)
