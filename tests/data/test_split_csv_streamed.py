"""RUN/split.csv is streamed to its temporary file in chunks of rows (and renamed into place):
it was rendered whole in memory first, about 45 MB of text at a million images. The bytes are
those the in-memory writer wrote, odd names included."""

from __future__ import annotations

import csv
import io
import tracemalloc

from image_folders import write_image_folder

from torchkit.core.data.sources import open_data, training_splits, write_split_csv
from torchkit.core.data.sources.record import SPLIT_CSV_COLUMNS
from torchkit.core.data.sources.samples import Samples
from torchkit.core.io.csv_rows import CsvWriter
from torchkit.core.io.files import NAME_ERRORS

# A comma, quotes, non-ASCII, a leading `=` (written as it is: a path, not a formula) and
# spaces around a name, as class folders and so in every path.
ODD_CLASSES = ["a,b", 'say "hi"', "ünïcødé", "=SUM(A1)", " spaced "]


def _old_writer_bytes(splits: dict[str, Samples]) -> bytes:
    """What write_split_csv wrote before: the whole text rendered, then written at once."""
    buffer = io.StringIO()
    writer = CsvWriter(buffer)
    writer.writerow(SPLIT_CSV_COLUMNS)
    for name, samples in splits.items():
        classes = samples.classes
        writer.writerows(
            (ident, classes[label], name)
            for ident, label in zip(samples.ids, samples.labels, strict=True)
        )
    return buffer.getvalue().encode("utf-8", NAME_ERRORS)


def test_split_csv_has_the_bytes_of_the_old_writer(tmp_path):
    root = write_image_folder(tmp_path / "data", dict.fromkeys(ODD_CLASSES, 4), size=4)
    splits, _ = training_splits(open_data(str(root)), val_split=0.5, seed=0)
    written = write_split_csv(tmp_path / "run" / "split.csv", splits)
    data = written.read_bytes()
    assert data == _old_writer_bytes(splits)
    assert sorted(p.name for p in written.parent.iterdir()) == ["split.csv"]  # no temporary
    text = data.decode("utf-8")
    assert '\n"a,b/a,b_0.png","a,b",' in text
    assert '\n"say ""hi""/say ""hi""_0.png","say ""hi""",' in text
    assert "\n=SUM(A1)/=SUM(A1)_0.png,=SUM(A1)," in text
    assert '\n" spaced / spaced _0.png"," spaced ",' in text
    rows = list(csv.reader(io.StringIO(text, newline="")))
    assert rows[0] == ["path", "label", "split"] and len(rows) == 1 + 4 * len(ODD_CLASSES)
    assert [row[0] for row in rows[1:]] == [i for s in splits.values() for i in s.ids]


def test_writing_a_big_split_csv_holds_a_chunk_not_the_file(tmp_path):
    """100,000 rows (about 4 MB): the writer's peak is a small part of the file's size."""
    count = 100_000
    samples = Samples(
        classes=["cat", "dog"],
        labels=[i % 2 for i in range(count)],
        ids=[f"train/class_{i % 2}/image_{i:07d}.jpg" for i in range(count)],
    )
    write_split_csv(tmp_path / "warm.csv", {"train": samples.subset(range(10))})  # imports
    tracemalloc.start()
    try:
        written = write_split_csv(tmp_path / "split.csv", {"train": samples})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    size = written.stat().st_size
    assert size > 3_000_000
    assert peak < size / 5, (peak, size)  # the text whole took twice the file's size
    with written.open(encoding="utf-8", newline="") as handle:
        assert sum(1 for _ in handle) == count + 1
