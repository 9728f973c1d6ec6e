"""Benchmark: the digits job's training step (the convnet at 12 px, channels-last, batches of 32,
torchkit's AdamW groups with the fused step, label smoothing 0.1, one torch thread) against
three other ways to compute it, none kept:

- oneDNN off (`torch.backends.mkldnn.flags(enabled=False)`): PyTorch's own im2col and GEMM
  convolutions;
- the second convolution's backward split over two Python threads: the weight and bias
  gradients on a side thread while the training thread computes the input gradient, each by the
  call autograd makes (so the same floats: the script checks the weights stay bitwise equal),
  one hand-over a step waited for on a condition, no spinning barrier;
- each half batch's gradients on a thread of its own (`torch.autograd.grad`, summed: other
  floats), the rest of the step on the training thread.

    uv run python benchmarks/bench_digits_step_threads.py [--blocks 150] [--steps 10]

A hand-written loop over one random batch (no data path, no EMA). The variants run in turns, a
block of `--steps` steps each; wall and process CPU ms per step, median over blocks, and the
median over rounds of each variant's wall time to the step's of the same round (below 1:
faster). On a machine other jobs load, the wall figures say how the machine is shared, not what
the step costs: the figures in docs/performance.md were taken with the script's process given
the cores (Linux: `setsid sh -c 'echo -20 > /proc/self/autogroup; exec nice -n -20 ...'` as
root, autogroup scheduling on).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

VARIANTS = ("the step (now)", "oneDNN off", "weight gradient beside", "half batches on 2 threads")


class SideThread:
    """One daemon thread for one task a call; a task it has not started is run by the caller."""

    def __init__(self) -> None:
        self.condition = threading.Condition()
        self.state, self.task, self.result = "idle", None, None
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        import torch

        torch.set_num_threads(torch.get_num_threads())  # OpenMP's count in this thread too
        while True:
            with self.condition:
                while self.state != "pending":
                    self.condition.wait()
                self.state, task = "running", self.task
            result = task()
            with self.condition:
                self.result, self.state = result, "done"
                self.condition.notify_all()

    def beside(self, side, here):
        with self.condition:
            self.task, self.state = side, "pending"
            self.condition.notify_all()
        mine = here()
        with self.condition:
            if self.state == "pending":
                self.state = "idle"
                return side(), mine
            while self.state != "done":
                self.condition.wait()
            self.state = "idle"
            return self.result, mine


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=150, help="rounds of the variants")
    parser.add_argument("--steps", type=int, default=10, help="steps per block")
    args = parser.parse_args()
    import torch

    from torchkit.core.models import convnet
    from torchkit.core.train import fused_step
    from torchkit.core.train.config import TrainConfig
    from torchkit.core.train.optim import build_optimizer, param_groups

    torch.set_num_threads(1)
    side = SideThread()
    channels_last = torch.channels_last
    convolution_backward = torch.ops.aten.convolution_backward

    class WeightGradientBeside(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, bias):
            ctx.save_for_backward(x, weight)
            return torch.nn.functional.conv2d(x, weight, bias)

        @staticmethod
        def backward(ctx, grad):
            x, weight = ctx.saved_tensors
            rest = ([weight.shape[0]], [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
            (_, weight_grad, bias_grad), (input_grad, _, _) = side.beside(
                lambda: convolution_backward(grad, x, weight, *rest, [False, True, True]),
                lambda: convolution_backward(grad, x, weight, *rest, [True, False, False]),
            )
            return input_grad, weight_grad, bias_grad

    def forward_beside(model, images):
        features = images
        for index, layer in enumerate(model.features):
            if index == 2:
                features = WeightGradientBeside.apply(features, layer.weight, layer.bias)
            else:
                features = layer(features)
        convnet._gradient_as_channels_last(features)
        return model.classifier(features)

    images = torch.randn(32, 3, 12, 12).contiguous(memory_format=channels_last)
    labels = torch.randint(0, 10, (32,))
    mean_loss = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    summed_loss = torch.nn.CrossEntropyLoss(label_smoothing=0.1, reduction="sum")
    config = TrainConfig(data="digits")
    runs = []
    for _ in VARIANTS:
        torch.manual_seed(0)
        model = convnet.convnet_class()(10, 3, 12).to(memory_format=channels_last)
        runs.append((model, build_optimizer(param_groups(model, config), config)))

    def half_gradients(model, params, rows):
        loss = summed_loss(model(images[rows]), labels[rows]) / len(images)
        return torch.autograd.grad(loss, params)

    def block(index: int, steps: int, seed: int) -> tuple[float, float]:
        model, optimizer = runs[index]
        params = list(model.parameters())
        torch.manual_seed(seed)  # the same dropout masks for the step and the split backward
        started, cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            if index == 3:
                first, second = side.beside(
                    lambda: half_gradients(model, params, slice(16, 32)),
                    lambda: half_gradients(model, params, slice(0, 16)),
                )
                for param, a, b in zip(params, first, second, strict=True):
                    param.grad = a + b
            else:
                with torch.backends.mkldnn.flags(enabled=index != 1):
                    logits = forward_beside(model, images) if index == 2 else model(images)
                    mean_loss(logits, labels).backward()
            if not fused_step.step(optimizer):
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        return wall / steps * 1e3, cpu / steps * 1e3

    for index in range(len(runs)):  # oneDNN builds its kernels on the first calls
        block(index, 30, 0)
    times: list[list[tuple[float, float]]] = [[] for _ in runs]
    for round_no in range(args.blocks):
        order = range(len(runs)) if round_no % 2 == 0 else reversed(range(len(runs)))
        for index in order:
            times[index].append(block(index, args.steps, round_no + 1))
    same = all(
        torch.equal(a, b)
        for a, b in zip(runs[0][0].parameters(), runs[2][0].parameters(), strict=True)
    )
    print(f"{'variant':<28} {'wall ms':>8} {'CPU ms':>7} {'ratio':>6}")
    for name, mine in zip(VARIANTS, times, strict=True):
        ratio = statistics.median(a[0] / b[0] for a, b in zip(mine, times[0], strict=True))
        wall = statistics.median(t[0] for t in mine)
        cpu = statistics.median(t[1] for t in mine)
        print(f"{name:<28} {wall:8.3f} {cpu:7.3f} {ratio:6.3f}")
    print(f"weight gradient beside: weights bitwise those of the step: {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
