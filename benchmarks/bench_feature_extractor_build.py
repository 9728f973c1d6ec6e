"""Benchmark: the start of `torchkit extract-features`, the layer graph and the extractor built
from a model (torch.fx tracing), in this checkout against an older one (`--before DIR`: a
checkout, `git worktree` or `git archive` of an earlier commit), in the same environment.

    uv run python benchmarks/bench_feature_extractor_build.py --before /tmp/old
    uv run python benchmarks/bench_feature_extractor_build.py --before /tmp/old --models resnet50

Each side runs in its own process with its checkout first on sys.path; the model (random
weights, `weights=None`) is built once per process, outside the timing; each repeat times
LayerGraph(model) + resolve + FeatureExtractor(...) for the layers asked for. Prints each side's
median and all runs, and the ratio (less than 1: faster now).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TIMED = """
import json, sys, time
import torch, torchvision
from torchkit.core.features.layers import FeatureExtractor, LayerGraph

arch, repeat, layers = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
torch.manual_seed(0)
model = torchvision.models.get_model(arch, weights=None).eval()
times = []
for _ in range(repeat + 1):  # the first: imports and caches, not counted
    started = time.perf_counter()
    graph = LayerGraph(model, arch=arch)
    extractor = FeatureExtractor(graph, graph.resolve(layers))
    times.append(time.perf_counter() - started)
    extractor.close()
print(json.dumps(times[1:]))
"""


def timings(checkout: Path, arch: str, repeat: int, layers: str) -> list[float]:
    # That checkout's torchkit, not the one installed in the environment.
    code = f"import sys; sys.path.insert(0, {str(checkout)!r})\n" + TIMED
    command = [sys.executable, "-c", code, arch, str(repeat), layers]
    done = subprocess.run(command, cwd=checkout, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the older checkout")
    parser.add_argument("--models", nargs="+", default=["resnet18", "resnet50"])
    parser.add_argument("--layers", default="layer3,penultimate", help="comma-separated")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    for arch in args.models:
        before = timings(args.before.resolve(), arch, args.repeat, args.layers)
        now = timings(ROOT, arch, args.repeat, args.layers)
        b, n = statistics.median(before), statistics.median(now)
        print(f"{arch}: before {b * 1000:.1f} ms, now {n * 1000:.1f} ms, ratio {n / b:.2f}")
        print(f"  before {[round(t * 1000, 1) for t in before]}")
        print(f"  now    {[round(t * 1000, 1) for t in now]}")


if __name__ == "__main__":
    main()
