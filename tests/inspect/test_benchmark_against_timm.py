"""`torchkit benchmark` against timm's benchmark.py, where benchmark.md's "Against timm's
benchmark.py" says they measure the same thing: the FLOPs and mult-adds per image against an
independent count (FlopCounterMode on the real model, and a hand count), the parameter count
against timm's (`sum(p.numel() for p in model.parameters())`), the input size of a timm model with
and without timm's own weights, the warm-up and timed steps counted as forward calls (no timing),
TFLOP/s from the figures reported, channels-last and --amp-dtype as timm's --channels-last and
--amp run. CPU only, tiny models, no timed assertion."""

from __future__ import annotations

import importlib.util
import json
import sys
import types

import pytest
import torch
from timm_hub import tag_with_test_size
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from torchkit.cli import app
from torchkit.core.benchmark import BenchmarkOptions, benchmark_model, run_benchmark
from torchkit.core.benchmark import run as bench_run

needs_timm = pytest.mark.skipif(importlib.util.find_spec("timm") is None, reason="needs timm")


def options(**kwargs) -> BenchmarkOptions:
    kwargs.setdefault("device", "cpu")
    kwargs.setdefault("batch_sizes", (1,))
    kwargs.setdefault("warmup", 0)
    kwargs.setdefault("iters", 1)
    return BenchmarkOptions(**kwargs)


def conv_linear() -> nn.Module:
    """3x8x8 -> conv 3->4 (3x3, padding 1) -> flatten (256) -> linear 256->5: counted by hand."""
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(256, 5))


def run_cli(runner, *args: str) -> dict:
    result = runner.invoke(app, ["benchmark", *args, "--device", "cpu", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


# --- FLOPs, mult-adds, parameters ---------------------------------------------------------------


def test_flops_and_mult_adds_per_image_equal_a_hand_count():
    """FLOPs: 2 per multiply-add of the convolution and the matrix product (FlopCounterMode's
    unit; timm's gmacs, fvcore's or DeepSpeed's, count 1). Mult-adds (torchinfo's definition):
    the weights and the bias at every output position."""
    conv_macs, linear_macs = (4 * 3 * 3 * 3) * 64, 256 * 5
    result = benchmark_model(conv_linear(), (3, 8, 8), options(batch_sizes=(4,)))
    assert result.flops_per_image == 2 * (conv_macs + linear_macs) == 16_384
    assert result.mult_adds_per_image == conv_macs + 4 * 64 + linear_macs + 5 == 8_453
    (row,) = result.results
    assert (row.flops_per_image, row.step_flops_per_image) == (16_384, 16_384)


@needs_timm
@pytest.mark.parametrize("name", ["test_resnet", "test_vit"])
def test_flops_per_image_equal_flop_counter_mode_on_the_real_model(name):
    """torchkit counts on a meta-device copy at batch 1; FlopCounterMode here runs the real timm
    model on a real batch of 2 at the same size (a ViT's attention products included), and
    the parameters are timm's own count (benchmark.py's `count_params`)."""
    import timm

    model = timm.create_model(name).eval()
    result = run_benchmark(f"timm/{name}", options())
    assert result.input_size == [3, 160, 160]
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.rand(2, *result.input_size))
    assert result.flops_per_image == counter.get_total_flops() // 2
    assert result.params == sum(p.numel() for p in model.parameters())


def test_params_count_every_parameter_once_frozen_and_shared_too(runner):
    """JSON's `params`: `sum(p.numel() for p in model.parameters())`, timm's count: frozen
    parameters count, a module used twice and a tied weight count once."""
    shared = nn.Linear(8, 8)
    model = nn.Sequential(shared, nn.ReLU(), shared, nn.Linear(8, 8), nn.Linear(8, 8))
    model[3].requires_grad_(False)
    model[4].weight = model[3].weight
    result = benchmark_model(model, (8,), options())
    assert result.params == sum(p.numel() for p in model.parameters()) == 72 + 72 + 8
    assert run_cli(runner, "convnet", "-i", "1,28,28", "-b", "1", "--iters", "1", "--warmup", "0")[
        "params"
    ] == (sum(p.numel() for p in bench_run_model("convnet").parameters()))


def bench_run_model(spec: str) -> nn.Module:
    from torchkit.core.models import resolve_model

    return resolve_model(spec, in_channels=1, image_size=(28, 28)).model


def test_tflops_are_the_step_flops_times_images_per_second(monkeypatch):
    """Each timed step takes 1 us on a fake clock: 4 images a step make 4e6 images/s, and the
    TFLOP/s are the forward FLOPs times that (3x the forward FLOPs to train)."""
    real = bench_run.time_steps
    now = [0.0]

    def ticking() -> float:
        now[0] += 1e-6
        return now[0]

    monkeypatch.setattr(bench_run, "time_steps", lambda step, **kw: real(step, **kw, clock=ticking))
    result = benchmark_model(conv_linear(), (3, 8, 8), options(batch_sizes=(4,), mode="both"))
    infer, train = result.results
    assert infer.images_per_s == pytest.approx(4e6) and train.images_per_s == pytest.approx(4e6)
    assert infer.step_flops_per_image == 16_384 and train.step_flops_per_image == 3 * 16_384
    assert infer.tflops == pytest.approx(16_384 * 4e6 / 1e12)
    # timm's step_time is a mean: timed_s / iters, the steps running back to back
    assert infer.timed_s / infer.iters == pytest.approx(1e-6)
    assert train.tflops == pytest.approx(3 * 16_384 * 4e6 / 1e12)


def test_a_small_tflops_figure_keeps_its_digits_in_json_and_the_table(monkeypatch):
    """A step of 4 images a second on a fake clock: 16,384 FLOPs x 4 images/s is 6.5536e-8
    TFLOP/s, which JSON rounded to 0.0 and the table showed as 0.0000."""
    from torchkit.cli.benchmark import _results_table

    real = bench_run.time_steps
    now = [0.0]

    def ticking() -> float:
        now[0] += 1.0
        return now[0]

    monkeypatch.setattr(bench_run, "time_steps", lambda step, **kw: real(step, **kw, clock=ticking))
    result = benchmark_model(conv_linear(), (3, 8, 8), options(batch_sizes=(4,), iters=1))
    (row,) = result.results
    assert row.images_per_s == 4 and row.tflops == pytest.approx(16_384 * 4 / 1e12)
    (cells,) = _results_table(result).rows
    assert cells[6] == "0.0000000655"


# --- steps: warm-up, timed, the untimed first step ------------------------------------------


class Counted(nn.Module):
    """Records (batch, training, inference mode, channels-last) of every real forward call and
    counts backward passes."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 3)
        self.calls: list[tuple[int, bool, bool, bool]] = []
        self.backwards = [0]
        self.conv.weight.register_hook(self._backward)

    def _backward(self, grad):
        self.backwards[0] += 1

    def forward(self, x):
        if x.device.type != "meta":  # summary's count runs on a meta-device copy
            self.calls.append(
                (
                    x.shape[0],
                    self.training,
                    torch.is_inference_mode_enabled(),
                    x.is_contiguous(memory_format=torch.channels_last) and x.shape[0] > 1,
                )
            )
        return self.fc(self.conv(x).mean((2, 3)))


def test_warmup_and_iters_are_forward_calls_after_one_untimed_first_step():
    """--warmup W --iters N: W + N forward calls at the batch; before the first configuration,
    one untimed step of each mode at a small batch (1 to infer, 2 to train); infer first."""
    model = Counted()
    result = benchmark_model(
        model, (3, 8, 8), options(batch_sizes=(4, 6), warmup=3, iters=2, mode="both")
    )
    batches = [call[0] for call in model.calls]
    assert batches == [1, 2] + [4] * 5 + [6] * 5 + [4] * 5 + [6] * 5
    infer_calls = model.calls[:1] + model.calls[2:12]
    assert all(not training and inference for _, training, inference, _ in infer_calls)
    train_calls = model.calls[1:2] + model.calls[12:]
    assert all(training and not inference for _, training, inference, _ in train_calls)
    assert model.backwards[0] == 1 + 2 * 5  # every train step, the first one too
    assert [(row.mode, row.batch_size, row.warmup, row.iters) for row in result.results] == [
        ("infer", 4, 3, 2),
        ("infer", 6, 3, 2),
        ("train", 4, 3, 2),
        ("train", 6, 3, 2),
    ]


def test_warmup_0_runs_only_the_timed_steps():
    model = Counted()
    benchmark_model(model, (3, 8, 8), options(batch_sizes=(4,), warmup=0, iters=3))
    assert [call[0] for call in model.calls] == [4, 4, 4]


def test_compile_skips_the_untimed_first_step(monkeypatch):
    """--compile compiles during the warm-up, per configuration: no step before it (the
    compiler stubbed out here, so that the test stays fast)."""
    monkeypatch.setattr(bench_run, "compile_module", lambda module, **kwargs: module)
    monkeypatch.setattr(torch.compiler, "reset", lambda: None)
    model = Counted()
    benchmark_model(model, (3, 8, 8), options(batch_sizes=(4,), warmup=2, iters=3, compile=True))
    assert [call[0] for call in model.calls] == [4] * 5


def test_the_commands_defaults_are_5_warmup_and_20_timed_steps(runner, monkeypatch):
    model = Counted()
    module = types.ModuleType("hbench_counted")
    module.build = lambda: model
    monkeypatch.setitem(sys.modules, "hbench_counted", module)
    data = run_cli(runner, "hbench_counted:build", "-i", "3,8,8", "-b", "4")
    (row,) = data["results"]
    assert (row["warmup"], row["iters"], data["settings"]["iters"]) == (5, 20, 20)
    assert [call[0] for call in model.calls] == [1] + [4] * 25


def test_train_step_is_sgd_with_momentum_and_a_grad_scaler_for_float16_only(monkeypatch):
    """timm's train step: SGD at lr 1e-4 (momentum 0.9, nesterov), no GradScaler; torchkit's
    SGD at lr 1e-4, momentum 0.9, and a GradScaler under float16 autocast, as training uses."""
    made, scalers = [], []
    init = torch.optim.SGD.__init__

    def recorded(self, params, **kwargs):
        made.append(kwargs)
        init(self, params, **kwargs)

    class Scaler(torch.amp.GradScaler):
        def __init__(self, *args, **kwargs):
            scalers.append(args)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(torch.optim.SGD, "__init__", recorded)
    monkeypatch.setattr(torch.amp, "GradScaler", Scaler)
    for amp_dtype in (torch.float16, torch.bfloat16, None):
        benchmark_model(
            conv_linear(),
            (3, 8, 8),
            options(batch_sizes=(2,), mode="train", amp=amp_dtype is not None),
            device=torch.device("cpu"),
            amp_dtype=amp_dtype,
        )
    assert {(kw["lr"], kw["momentum"], kw.get("nesterov", False)) for kw in made} == {
        (1e-4, 0.9, False)
    }
    assert scalers == [("cpu",)]  # the float16 run's, its run only


def test_out_of_memory_is_one_error_line_where_benchmark_py_retries_smaller(runner, monkeypatch):
    """benchmark.py retries a batch that runs out of memory at smaller ones; torchkit stops,
    naming --find-batch-size, which finds the largest batch that fits."""

    class Big(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 2)

        def forward(self, x):
            if x.device.type != "meta" and x.shape[0] >= 4:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return self.fc(x)

    module = types.ModuleType("hbench_big")
    module.build = Big
    monkeypatch.setitem(sys.modules, "hbench_big", module)
    args = ["benchmark", "hbench_big:build", "-i", "8", "-b", "2,4", "--device", "cpu"]
    result = runner.invoke(app, [*args, "--warmup", "1", "--iters", "1"])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "Error: out of memory in infer mode at batch 4 on cpu (use a smaller --batch-size, "
        "--amp, or --find-batch-size)"
    )


def test_cudnn_picks_its_algorithms_on_cuda_as_benchmark_py_sets_it():
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False
    try:
        with bench_run._cudnn_benchmark(torch.device("cuda")):
            assert torch.backends.cudnn.benchmark is True
        assert torch.backends.cudnn.benchmark is False
    finally:
        torch.backends.cudnn.benchmark = before


# --- as timm's --channels-last and --amp --------------------------------------------------------


def test_channels_last_lays_out_the_inputs_and_the_weights_as_timms_does(runner, monkeypatch):
    model = Counted()
    module = types.ModuleType("hbench_counted")
    module.build = lambda: model
    monkeypatch.setitem(sys.modules, "hbench_counted", module)
    args = ["hbench_counted:build", "-i", "3,8,8", "-b", "4", "--warmup", "1", "--iters", "1"]
    data = run_cli(runner, *args, "--channels-last")
    assert data["results"][0]["channels_last"] is True
    assert [call[3] for call in model.calls if call[0] == 4] == [True, True]
    assert model.conv.weight.is_contiguous(memory_format=torch.channels_last)


def test_amp_dtype_fp16_is_timms_amp_and_auto_is_bf16_where_native(runner, monkeypatch):
    """timm's --amp is CUDA's float16 autocast; torchkit's `--amp` alone takes bfloat16 on a
    CPU and on a CUDA GPU that computes it natively, `--amp-dtype fp16` float16."""
    from torchkit.core.runtime import device as devices

    args = ["convnet", "-b", "2", "--warmup", "1", "--iters", "1", "--amp"]
    assert run_cli(runner, *args, "--amp-dtype", "fp16")["results"][0]["dtype"] == "float16"
    assert run_cli(runner, *args)["results"][0]["dtype"] == "bfloat16"
    monkeypatch.setattr(devices, "cuda_bf16_native", lambda: True)
    cuda = torch.device("cuda")
    assert devices.resolve_amp_dtype("auto", cuda) == torch.bfloat16
    assert devices.resolve_amp_dtype("fp16", cuda) == torch.float16


# --- the input size of a timm model -------------------------------------------------------------


@pytest.fixture
def tested_tag(tmp_path, monkeypatch):
    """timm's pretrained test_resnet given a 192 px test size beside its 160 px train size
    (timm_hub.tag_with_test_size), its weights in an offline Hugging Face cache."""
    return tag_with_test_size(tmp_path / "hf", monkeypatch)


def timm_benchmark_size(model, use_train_size: bool = False) -> list[int]:
    """The input size timm's benchmark.py takes: its model's pretrained config, test size
    unless --use-train-size, whether or not weights are loaded (it loads none)."""
    from timm.data import resolve_data_config

    return list(
        resolve_data_config({}, model=model, use_test_size=not use_train_size)["input_size"]
    )


@needs_timm
def test_input_size_of_a_timm_model_with_and_without_timms_weights(runner, tested_tag, tmp_path):
    """The test size, as benchmark.py takes it, with timm's own weights, without weights and
    with weights from a file that records no size; `--image-size` at the train size is
    benchmark.py's --use-train-size (test_benchmark_timm_size.py: the rest)."""
    assert timm_benchmark_size(tested_tag) == [3, 192, 192]
    assert timm_benchmark_size(tested_tag, use_train_size=True) == [3, 160, 160]
    fast = ["-b", "1", "--warmup", "0", "--iters", "1"]
    default = ["timm/test_resnet", "--weights", "DEFAULT", *fast]
    assert run_cli(runner, *default)["input_size"] == [3, 192, 192]
    assert run_cli(runner, *default, "--image-size", "160")["input_size"] == [3, 160, 160]
    got = run_cli(runner, "timm/test_resnet", *fast)
    assert got["input_size"] == timm_benchmark_size(tested_tag)
    train_size = run_cli(runner, "timm/test_resnet", *fast, "--image-size", "160")
    assert train_size["input_size"] == timm_benchmark_size(tested_tag, use_train_size=True)
    weights = tmp_path / "weights.pth"
    torch.save(tested_tag.state_dict(), weights)
    from_file = run_cli(runner, "timm/test_resnet", "--weights", str(weights), *fast)
    assert from_file["input_size"] == [3, 192, 192]
