"""Benchmark: a torchkit command that uses torchvision, with torchvision imported without
torch._dynamo (`torchkit/torchvision_without_dynamo.py`, the default) against the same command
with it imported as it is (TORCHKIT_LIGHT_TORCHVISION=0), same run, in turns; and the bare
import of torch and torchvision both ways.

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
IMPORT = (
    "from torchkit.bytecode import keep_bytecode_cache; keep_bytecode_cache(); "
    "from torchkit import torchvision_without_dynamo as light; light.install(); "
    "import torch, torchvision, torchvision.transforms.v2"
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
        train = [sys.executable, "-m", "torchkit", "train", "--data", str(data), "--model",
                 "convnet", "--image-size", "16", "--epochs", "1", "--workers", "0",
                 "--device", "cpu", "--force", "--out", str(Path(folder) / "run")]  # fmt: skip
        bare = [sys.executable, "-c", IMPORT]
        off = {"TORCHKIT_LIGHT_TORCHVISION": "0"}
        timings = measure_all(
            {"train": train, "train, as it is": train, "import": bare, "import, as it is": bare},
            args.repeat,
            envs={"train, as it is": off, "import, as it is": off},
        )
    print("torchkit train, 1 epoch of an image folder (whole process)")
    compare_timings(
        "without dynamo",
        timings["train"],
        "TORCHKIT_LIGHT_TORCHVISION=0",
        timings["train, as it is"],
    )
    print("\nimport torch, torchvision, torchvision.transforms.v2")
    compare_timings(
        "without dynamo",
        timings["import"],
        "TORCHKIT_LIGHT_TORCHVISION=0",
        timings["import, as it is"],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
