"""Python without UTF-8 mode under a locale that is not UTF-8 (`LC_ALL=C PYTHONUTF8=0`) holds
file names in ASCII: a UTF-8 name it cannot hold is one `Error:` line that says how to run."""

from __future__ import annotations

import sys

import pytest
from output_checks import error_line
from PIL import Image
from processes import run_torchkit_process


def test_a_name_the_file_system_encoding_cannot_hold_says_to_use_a_utf8_locale(tmp_path):
    """Before: `Error: UnicodeEncodeError: 'ascii' codec can't encode character '\\xe9' ...
    (set TORCHKIT_DEBUG=1 to see the traceback)`, which did not say what to change."""
    (tmp_path / "café").mkdir()
    Image.new("RGB", (4, 4)).save(tmp_path / "café" / "a.png")
    index = tmp_path / "index.csv"
    index.write_text("path,label\ncafé/a.png,café\n", encoding="utf-8")
    done = run_torchkit_process(
        "dataset-stats", str(index),
        env={"LC_ALL": "C", "PYTHONUTF8": "0"},
        fresh=True,  # the file system encoding is chosen as the interpreter starts
    )  # fmt: skip
    assert done.returncode == 1 and done.stdout == ""
    line = error_line(done.stderr)
    assert "file system encoding, ascii" in line and "UnicodeEncodeError" in line
    assert line.endswith(
        "(run it under a UTF-8 locale, such as LC_ALL=C.UTF-8, or with PYTHONUTF8=1)"
    )


def test_a_label_the_file_system_encoding_cannot_hold_is_said_to_be_that(tmp_path):
    """`split` of a CSV index makes a folder per label. Before: `label 'caf\\xe9' cannot be a
    class folder: a class folder must be one folder name: not blank, '.' or '..', without / \\
    or NUL, at most 255 bytes`, none of which was what stood in the way."""
    (tmp_path / "images").mkdir()
    Image.new("RGB", (4, 4)).save(tmp_path / "images" / "a.png")
    index = tmp_path / "images" / "index.csv"
    index.write_text("path,label\na.png,café\n", encoding="utf-8")
    done = run_torchkit_process(
        "split", str(index), str(tmp_path / "out"),
        env={"LC_ALL": "C", "PYTHONUTF8": "0"},
        fresh=True,  # the file system encoding is chosen as the interpreter starts
    )  # fmt: skip
    assert done.returncode == 1 and done.stdout == ""
    assert error_line(done.stderr) == (
        "Error: label 'caf\\xe9' cannot be a class folder: not in this Python's file system "
        "encoding, ascii; run it under a UTF-8 locale, such as LC_ALL=C.UTF-8, or with "
        "PYTHONUTF8=1 (fix the label, or use --mode manifest)"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("encoding", ["iso8859-1", "iso8859-15"])
def test_a_latin_file_system_encoding_is_told_by_the_name_it_cannot_hold(monkeypatch, encoding):
    """Under a Latin-1 locale (PYTHONUTF8=0) the codec fails as 'latin-1' (iso8859-15: as
    'charmap'), not as the encoding Python names: before, `Error: UnicodeEncodeError: 'latin-1'
    codec can't encode ... (set TORCHKIT_DEBUG=1 to see the traceback)`. In process: a locale
    of that encoding is seldom installed to start a process under."""
    from torchkit.cli.app import describe_unexpected

    def failed(text: str, codec: str) -> UnicodeEncodeError:
        try:
            text.encode(codec)
        except UnicodeEncodeError as error:
            return error
        raise AssertionError(f"{text!r} is {codec}")

    monkeypatch.setattr(sys, "getfilesystemencoding", lambda: encoding)
    what, hint = describe_unexpected(failed("日本/a.png", encoding))
    assert what.startswith(
        "a file name cannot be held in this Python's file system encoding, "
        f"{encoding}: UnicodeEncodeError: "
    )
    assert hint == "run it under a UTF-8 locale, such as LC_ALL=C.UTF-8, or with PYTHONUTF8=1"
    # Text the encoding holds failed elsewhere (an ASCII-only stream): no word of file names.
    what, hint = describe_unexpected(failed("café", "ascii"))
    assert what.startswith("UnicodeEncodeError: 'ascii' codec") and "TORCHKIT_DEBUG" in hint
    monkeypatch.setattr(sys, "getfilesystemencoding", lambda: "utf-8")
    what, _ = describe_unexpected(failed("日本", "ascii"))
    assert what.startswith("UnicodeEncodeError: 'ascii' codec")
