"""The built-in `digits`: scikit-learn's 1,797 real 8x8 handwritten digits, split 80/10/10."""

from __future__ import annotations

import os
from typing import Any

from torchkit.core.data.sources.samples import Samples
from torchkit.core.data.sources.splitting import SPLIT_NAMES, stratified_split

DIGITS = "digits"


def _sklearn_digits() -> tuple[Any, Any]:
    """(images N,8,8 floats 0..16, targets) of scikit-learn's digits: read from the CSV that
    ships inside scikit-learn, as `load_digits` reads it, without importing sklearn.datasets
    (2 s, a tenth of the README's training run); `load_digits` itself if the file moved."""
    import importlib.util

    import numpy as np

    spec = importlib.util.find_spec("sklearn")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, "datasets", "data", "digits.csv.gz")
        if os.path.isfile(path):
            data = np.loadtxt(path, delimiter=",")
            return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.images, bunch.target


def digits_splits() -> dict[str, Samples]:
    """scikit-learn's 1,797 real 8x8 digits, split 80/10/10 stratified with seed 0."""
    import numpy as np

    pixels, targets = _sklearn_digits()
    # Pixel values are 0..16; scale to 0..255 so they behave like any 8-bit grayscale image.
    images = np.rint(pixels * (255.0 / 16.0)).astype(np.uint8)
    labels = [int(y) for y in targets]
    classes = [str(c) for c in range(10)]
    ids = [f"digits/{i:04d}" for i in range(len(labels))]
    everything = Samples(classes, labels, images=images, source=DIGITS, ids=ids)
    parts = stratified_split(labels, (0.8, 0.1, 0.1), seed=0)
    return {name: everything.subset(part) for name, part in zip(SPLIT_NAMES, parts, strict=True)}
