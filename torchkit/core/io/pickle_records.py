"""The pickle of a `torch.save` zip, found without reading anything else of it: what the readers
of a file's pickle opcodes (`core.train.checkpoint_record`, `core.models.usercode`) start from."""

from __future__ import annotations

import zipfile

PICKLE_RECORD = "data.pkl"
# The bytes a pickle's structure is read in (its keys, names and references; not its tensors):
# far beyond any checkpoint's or model's.
MAX_STRUCTURE_BYTES = 64 * 1024 * 1024


def pickle_record(archive: zipfile.ZipFile, limit: int) -> zipfile.ZipInfo | None:
    """torch.save's `<name>/data.pkl` record of `archive`, where it has one, of at most `limit`
    bytes unpacked (a zip bomb is not read)."""
    records = [
        info
        for info in archive.infolist()
        if info.filename.count("/") == 1 and info.filename.endswith("/" + PICKLE_RECORD)
    ]
    if len(records) != 1 or records[0].file_size > limit:
        return None
    return records[0]
