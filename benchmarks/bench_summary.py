"""torchkit summary vs torchinfo.summary on resnet50 at 224x224, in the same run.

    uv run python benchmarks/bench_summary.py [--model resnet50] [--size 224] [--repeats 5]

Both summarize the same model instance on a CPU, single-threaded by default so the figures
are comparable on a shared machine. torchinfo runs the model; torchkit runs a meta-device copy
(shapes only, no arithmetic), and is also timed running the model for real and without its
FlopCounterMode pass (torchinfo measures no FLOPs); a plain no-grad forward pass is the floor.
Each candidate runs once to warm up, then `--repeats` times interleaved with the others, and
its best time is reported. The totals are printed side by side as a check that both did the
same work.
"""

from __future__ import annotations

import argparse
import time


def best_seconds(candidates: dict, repeats: int) -> dict[str, float]:
    """Best (minimum) time of each candidate, runs interleaved so that a change of load on a
    shared machine hits all of them alike; one warm-up run each first."""
    for fn in candidates.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, fn in candidates.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: min(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import torch
    import torchinfo
    import torchvision

    from torchkit.core.summary import summarize

    torch.set_num_threads(args.threads)
    model = torchvision.models.get_model(args.model, weights=None)
    shape = (args.batch_size, 3, args.size, args.size)

    ours = summarize(model, [shape])
    theirs = torchinfo.summary(model, input_size=shape, verbose=0)
    print(
        f"{args.model} at {args.size}x{args.size}, batch {args.batch_size}, CPU, "
        f"{args.threads} thread(s)"
    )
    print(f"  total params   torchkit {ours.total_params:,}  torchinfo {theirs.total_params:,}")
    print(
        f"  mult-adds      torchkit {ours.total_mult_adds:,}  torchinfo {theirs.total_mult_adds:,}"
    )
    print(f"  FLOPs          torchkit {ours.flops:,}  (torchinfo: not measured)")

    best = best_seconds(
        {
            "torchinfo": lambda: torchinfo.summary(model, input_size=shape, verbose=0),
            "torchkit": lambda: summarize(model, [shape]),
            "torchkit_real": lambda: summarize(model, [shape], on_meta=False),
            "torchkit_no_flops": lambda: summarize(model, [shape], count_flops=False),
            "forward": lambda: plain_forward(model, shape),
        },
        args.repeats,
    )
    theirs_s = best["torchinfo"]
    print(f"  plain forward pass (no_grad) {best['forward'] * 1000:8.1f} ms")
    print(f"  torchinfo.summary            {theirs_s * 1000:8.1f} ms")
    labels = {
        "torchkit": "torchkit summarize",
        "torchkit_no_flops": "  without FLOPs",
        "torchkit_real": "  real forward, not meta",
    }
    for key, label in labels.items():
        print(
            f"  {label:<28} {best[key] * 1000:8.1f} ms  "
            f"ratio torchkit/torchinfo {best[key] / theirs_s:.2f}"
        )


def plain_forward(model, shape) -> None:
    import torch

    model.eval()
    with torch.no_grad():
        model(torch.rand(*shape))


if __name__ == "__main__":
    main()
