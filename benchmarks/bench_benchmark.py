"""torchkit benchmark vs a hand-written timing loop on the same model and settings, in one run.

    uv run python benchmarks/bench_benchmark.py [--models convnet,resnet18] [--size 112]
        [--batch-size 16] [--warmup 3] [--iters 20] [--rounds 5] [--threads 1] [--device cpu]

For each model and mode (infer, train) both measure images/s and the median latency per batch:
torchkit through `torchkit.core.benchmark.benchmark_model`, the baseline through the loop anyone
would write (eval + inference_mode for inference; forward, cross-entropy, backward and an SGD
step for training; `torch.cuda.synchronize()` after each step on CUDA). They run interleaved,
`--rounds` times each, so that a change of load on a shared machine hits both alike; the best
round of each is printed with the ratio (torchkit / hand-written: 1.00 means they agree).
Single-threaded by default, which a busy machine disturbs least.
"""

from __future__ import annotations

import argparse
import statistics
import time


def hand_written(model, images, labels, mode: str, warmup: int, iters: int, sync) -> list[float]:
    """Seconds per timed step of the plain loop."""
    import torch
    import torch.nn.functional as F

    if mode == "infer":
        model.eval()

        def step():
            with torch.inference_mode():
                model(images)

    else:
        model.train()
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)

        def step():
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(images), labels).backward()
            optimizer.step()

    for _ in range(warmup):
        step()
    sync()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    if mode == "train":
        model.zero_grad(set_to_none=True)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="convnet,resnet18")
    parser.add_argument("--size", type=int, default=112, help="image side (convnet: 28)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    import torch

    from torchkit.core.benchmark import BenchmarkOptions, benchmark_model
    from torchkit.core.env import cpu_model
    from torchkit.core.models import resolve_model
    from torchkit.core.runtime.device import select_device

    torch.set_num_threads(args.threads)
    device = select_device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()
    print(
        f"{name} ({device}), torch {torch.__version__}, {torch.get_num_threads()} thread(s); "
        f"batch {args.batch_size}, warm-up {args.warmup}, {args.iters} timed steps, "
        f"best of {args.rounds} interleaved rounds"
    )
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    header = f"{'model':<10} {'mode':<6} {'':<13} {'images/s':>10} {'median ms':>10}"
    print(header)
    for spec in args.models.split(","):
        side = 28 if spec == "convnet" else args.size
        model = resolve_model(spec, image_size=side).model.to(device)
        sample = (3, side, side)
        generator = torch.Generator().manual_seed(0)
        images = torch.rand(args.batch_size, *sample, generator=generator).to(device)
        classes = 10 if spec == "convnet" else 1000
        labels = torch.randint(0, classes, (args.batch_size,), generator=generator).to(device)
        for mode in ("infer", "train"):
            options = BenchmarkOptions(
                batch_sizes=(args.batch_size,),
                mode=mode,
                device=str(device),
                warmup=args.warmup,
                iters=args.iters,
            )
            ours, theirs = [], []
            for _ in range(args.rounds):
                row = benchmark_model(model, sample, options, device=device).results[0]
                ours.append((row.images_per_s, row.latency_median_ms))
                times = hand_written(model, images, labels, mode, args.warmup, args.iters, sync)
                theirs.append(
                    (args.batch_size * len(times) / sum(times), statistics.median(times) * 1000)
                )
            best_ours, best_theirs = max(ours), max(theirs)
            for label, (rate, median) in (("torchkit", best_ours), ("hand-written", best_theirs)):
                print(f"{spec:<10} {mode:<6} {label:<13} {rate:10.1f} {median:10.2f}")
            print(
                f"{spec:<10} {mode:<6} {'ratio':<13} {best_ours[0] / best_theirs[0]:10.3f} "
                f"{best_ours[1] / best_theirs[1]:10.3f}   (torchkit / hand-written)"
            )


if __name__ == "__main__":
    main()
