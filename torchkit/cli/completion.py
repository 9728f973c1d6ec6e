"""Shell completion of model specs, without importing torch at TAB time."""

from __future__ import annotations

import os


def complete_model_name(incomplete: str) -> list[str]:
    """torchvision names and `convnet` (from the generated list), then model files and folders
    under the path typed so far."""
    from torchkit.core.models.names import MODEL_NAMES

    names = [name for name in MODEL_NAMES if name.startswith(incomplete)]
    return names + _model_files(incomplete)


def _model_files(incomplete: str) -> list[str]:
    """Model files (core's one list of suffixes) and folders, so that paths can be walked."""
    from torchkit.core.models.model_files import MODEL_FILE_SUFFIXES

    folder, prefix = os.path.split(incomplete)
    try:
        entries = sorted(os.scandir(folder or "."), key=lambda entry: entry.name)
    except OSError:
        return []
    found = []
    for entry in entries:
        if not entry.name.startswith(prefix) or entry.name.startswith("."):
            continue
        path = os.path.join(folder, entry.name)
        if entry.is_dir():
            found.append(path + os.sep)
        elif entry.name.endswith(MODEL_FILE_SUFFIXES):
            found.append(path)
    return found
