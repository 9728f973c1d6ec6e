"""export's memory count against the measured peak: for each model, token count, format and
batch, a fresh process runs `export_model` with the check's count recorded, and measures the
peak RSS past the RSS at the check (VmHWM, reset at the check through /proc/self/clear_refs:
tracemalloc does not see torch's allocations). Linux only.

    uv run python benchmarks/bench_export_memory.py                 # the table
    uv run python benchmarks/bench_export_memory.py --only vit-mha  # one model

    uv run python benchmarks/bench_export_memory.py --only torchvision   # the zoo's models

Models: thin ViTs (64 channels, 4 heads, 4 blocks; attention by hand and nn.MultiheadAttention
without weights, as torchvision's), with 16 px patches at 224 px (196 tokens) and 8 px
(784 tokens); torchvision's swin_t and maxvit_t (windowed attention, 49 tokens) at 224 px; and
torchvision's resnet18, efficientnet_b0, vit_b_16, swin_t and convnext_tiny (`torchvision-*`),
built without weights (random, no download), at 224 px.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

MODELS = """
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, how, channels=64, heads=4):
        super().__init__()
        self.how, self.heads = how, heads
        self.norm = nn.LayerNorm(channels)
        self.attention = nn.MultiheadAttention(channels, heads, batch_first=True)
        self.qkv = nn.Linear(channels, 3 * channels)
        self.mlp = nn.Sequential(nn.Linear(channels, 4 * channels), nn.GELU(),
                                 nn.Linear(4 * channels, channels))

    def forward(self, tokens):
        x = self.norm(tokens)
        if self.how == "mha":
            mixed = self.attention(x, x, x, need_weights=False)[0]
        else:
            batch, count, channels = x.shape
            q, k, v = self.qkv(x).reshape(batch, count, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            if self.how == "sdpa":
                mixed = nn.functional.scaled_dot_product_attention(q, k, v)
            else:
                scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
                mixed = scores.softmax(dim=-1) @ v
            mixed = mixed.transpose(1, 2).reshape(batch, count, channels)
        tokens = tokens + mixed
        return tokens + self.mlp(tokens)


class Vit(nn.Module):
    def __init__(self, how, patch, depth=4):
        super().__init__()
        self.patches = nn.Conv2d(3, 64, patch, stride=patch)
        self.blocks = nn.Sequential(*[Block(how) for _ in range(depth)])
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        tokens = self.patches(x).flatten(2).transpose(1, 2)
        return self.head(self.blocks(tokens).mean(1))


def by_hand_16(): return Vit("by-hand", 16)
def by_hand_8(): return Vit("by-hand", 8)
def mha_16(): return Vit("mha", 16)
def mha_8(): return Vit("mha", 8)
def sdpa_16(): return Vit("sdpa", 16)
def sdpa_8(): return Vit("sdpa", 8)
"""

# name -> (model, image size, batches)
CASES = {
    "vit-by-hand-196": ("benchvits:by_hand_16", 224, (16, 64)),
    "vit-by-hand-784": ("benchvits:by_hand_8", 224, (16, 64)),
    "vit-mha-196": ("benchvits:mha_16", 224, (16, 64)),
    "vit-mha-784": ("benchvits:mha_8", 224, (16, 64)),
    "vit-sdpa-784": ("benchvits:sdpa_8", 224, (16, 64)),
    "swin_t": ("swin_t", 224, (4, 16)),
    "maxvit_t": ("maxvit_t", 224, (4, 16)),
    "torchvision-resnet18": ("resnet18", 224, (1, 16)),
    "torchvision-efficientnet_b0": ("efficientnet_b0", 224, (1, 16)),
    "torchvision-vit_b_16": ("vit_b_16", 224, (1, 8)),
    "torchvision-swin_t": ("swin_t", 224, (1, 16)),
    "torchvision-convnext_tiny": ("convnext_tiny", 224, (1, 16)),
}


def _kib(key: str) -> int:
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise RuntimeError(key)


def measure_one(model: str, image_size: int, batch: int, fmt: str) -> dict:
    """In this process: export, the count at the check and the peak past it."""
    from torchkit.core.export import run as export_run

    seen: dict = {}
    counting = export_run.export_memory_needed

    def recorded(*args, **kwargs):
        needed = counting(*args, **kwargs)
        seen["counted"] = needed.bytes
        seen["weights"] = export_run._PEAK_PER_WEIGHTS[kwargs["fmt"]] * kwargs["weight_bytes"]
        seen["weight_bytes"] = kwargs["weight_bytes"]
        seen["matrix"] = kwargs.get("largest_attention_bytes") or 0
        seen["largest"] = args[1]
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        seen["rss"] = _kib("VmRSS:")
        return needed

    export_run.export_memory_needed = recorded
    suffix = {"exported-program": ".pt2", "onnx": ".onnx", "torchscript": ".ts"}[fmt]
    with tempfile.TemporaryDirectory() as folder:
        request = export_run.ExportRequest(
            model=model,
            out=os.path.join(folder, "m" + suffix),
            image_size=image_size,
            batch_size=batch,
        )
        export_run.export_model(request)
    seen["peak"] = _kib("VmHWM:") - seen["rss"]
    return seen


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="")
    parser.add_argument("--format", default="exported-program")
    parser.add_argument("--one", nargs=3, metavar=("MODEL", "SIZE", "BATCH"))
    args = parser.parse_args()
    if args.one:
        model, size, batch = args.one
        print(json.dumps(measure_one(model, int(size), int(batch), args.format)))
        return
    root = Path(tempfile.mkdtemp())
    (root / "benchvits.py").write_text(textwrap.dedent(MODELS), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(root)}
    print("| model | format | -b (images) | counted MB | peak MB | peak/count | weights MB |")
    print("|---|---|---|---|---|---|---|")
    for name, (model, size, batches) in CASES.items():
        if args.only and args.only not in name:
            continue
        for batch in batches:
            done = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--format",
                    args.format,
                    "--one",
                    model,
                    str(size),
                    str(batch),
                ],
                capture_output=True,
                text=True,
                env=env,
                cwd=root,
                check=False,
            )
            if done.returncode:
                print(f"| {name} | -b {batch} | failed: {done.stderr.strip().splitlines()[-1]} |")
                continue
            seen = json.loads(done.stdout.strip().splitlines()[-1])
            print(
                f"| {name} | {args.format} | {batch} ({seen['largest']}) | "
                f"{seen['counted'] / 1e6:,.0f} | {seen['peak'] / 1e6:,.0f} | "
                f"{seen['peak'] / seen['counted']:.2f} | {seen['weight_bytes'] / 1e6:,.0f} | "
                f"matrix/img {seen['matrix'] / 1e6:.2f} MB",
                flush=True,
            )


if __name__ == "__main__":
    main()
