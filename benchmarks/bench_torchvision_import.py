"""Benchmark: a torchkit command that uses torchvision, with torchvision imported without
torch._dynamo (`torchkit/torchvision_without_dynamo.py`, as torchkit runs) against the same
command with torch._dynamo imported first (torchvision then imports as it is), same run, in
turns; and the bare import of torch and torchvision both ways.

    uv run python benchmarks/bench_torchvision_import.py [--repeat 5]

The command: `torchkit train` for one epoch of the convnet on a generated image folder (12
images of 16 px, no workers), the smallest run whose set-up imports torchvision's transforms.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from _timing import compare_timings, measure_all

# As the CLI starts: the bytecode cache (`torchkit.bytecode`), then the finder.
CACHE = "from torchkit.bytecode import keep_bytecode_cache; keep_bytecode_cache(); "
LIGHT = "from torchkit import torchvision_without_dynamo as light; light.install(); "
IMPORT = "import torch, torchvision, torchvision.transforms.v2"
# torchkit's CLI with torch._dynamo loaded before it: the finder then leaves torchvision alone.
AS_IT_IS = (
    CACHE
    + "import sys, torch._dynamo; sys.argv[0] = 'torchkit'; from torchkit.cli import main; main()"
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed runs of each, in turns")
    args = parser.parse_args()
    import numpy as np
    from PIL import Image

    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder) / "data"
        rng = np.random.default_rng(0)
        for split, count in (("train", 6), ("val", 2)):
            for label in ("a", "b"):
                (data / split / label).mkdir(parents=True)
                for index in range(count):
                    pixels = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
                    Image.fromarray(pixels).save(data / split / label / f"{index}.png")
        command = ["train", "--data", str(data), "--model", "convnet", "--image-size", "16",
                   "--epochs", "1", "--workers", "0", "--device", "cpu", "--force", "--out",
                   str(Path(folder) / "run")]  # fmt: skip
        timings = measure_all(
            {
                "train": [sys.executable, "-m", "torchkit", *command],
                "train, as it is": [sys.executable, "-c", AS_IT_IS, *command],
                "import": [sys.executable, "-c", CACHE + LIGHT + IMPORT],
                "import, as it is": [sys.executable, "-c", CACHE + IMPORT],
            },
            args.repeat,
        )
    print("torchkit train, 1 epoch of an image folder (whole process)")
    compare_timings(
        "without dynamo",
        timings["train"],
        "torch._dynamo imported first",
        timings["train, as it is"],
    )
    print("\nimport torch, torchvision, torchvision.transforms.v2")
    compare_timings(
        "without dynamo",
        timings["import"],
        "as it is",
        timings["import, as it is"],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
