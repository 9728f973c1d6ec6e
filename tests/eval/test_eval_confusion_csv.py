"""confusion_matrix.csv has the bytes of the csv module's writer (without pandas), and a field
holding a carriage return or spaces around it quoted too (csv.writer with `\n` line ends wrote
the first bare, and readers split the row; readers strip the spaces of an unquoted field):
checked against CSV's rule written out by hand, on class names that need quoting or look like
numbers or missing values, and read back."""

from __future__ import annotations

import csv
import io

import numpy as np
import pytest

from torchkit.core.evaluate.reports import CONFUSION_CORNER, confusion_csv_text

AWKWARD_NAMES = [
    "a,b",
    'say "hi"',
    "line\nbreak",
    "carriage\rreturn",
    " leading space",
    "trailing space ",
    "1",
    "1.0",
    "nan",
    "NA",
    "None",
    "True",
    "inf",
    "é✓",
    "back\\slash",
    "tab\tx",
]


def _field(value: object) -> str:
    """CSV's quoting (the csv module's minimal quoting, a carriage return, and spaces around
    the field, which some readers strip where it is not quoted)."""
    text = str(value)
    if any(c in text for c in ',"\n\r') or text != text.strip():
        return '"' + text.replace('"', '""') + '"'
    return text


def _csv_writer_text(cm: np.ndarray, classes: list[str]) -> str:
    rows = [[CONFUSION_CORNER, *classes]]
    rows += [[name, *row.tolist()] for name, row in zip(classes, cm, strict=True)]
    return "".join(",".join(_field(v) for v in row) + "\n" for row in rows)


@pytest.mark.parametrize("size", [1, 2, 5, len(AWKWARD_NAMES)])
def test_confusion_csv_bytes_equal_the_csv_module(size):
    rng = np.random.default_rng(size)
    for start in range(len(AWKWARD_NAMES) - size + 1):
        classes = AWKWARD_NAMES[start : start + size]
        cm = rng.integers(0, 1000, (size, size)).astype(np.int64)
        text = confusion_csv_text(cm, classes)
        assert text == _csv_writer_text(cm, classes), classes
        table = list(csv.reader(io.StringIO(text, newline="")))
        assert table[0] == [CONFUSION_CORNER, *classes]
        assert [row[0] for row in table[1:]] == classes


def test_confusion_csv_reads_back_as_the_matrix():
    classes = ["cat", "dog", "a,b"]
    cm = np.array([[5, 1, 0], [2, 7, 0], [0, 0, 0]], dtype=np.int64)
    table = list(csv.reader(io.StringIO(confusion_csv_text(cm, classes))))
    assert table[0] == [CONFUSION_CORNER, *classes]
    assert [row[0] for row in table[1:]] == classes
    np.testing.assert_array_equal(np.array([row[1:] for row in table[1:]], dtype=int), cm)


def test_confusion_csv_needs_no_pandas():
    """eval --out writes confusion_matrix.csv without importing pandas (a second of import)."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np\n"
        "from torchkit.core.evaluate.reports import confusion_csv_text\n"
        "confusion_csv_text(np.eye(2, dtype=np.int64), ['a', 'b'])\n"
        "print('pandas' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
