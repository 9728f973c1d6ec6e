"""Issue #14, `eval` and `extract-features`: a model whose outputs are not finite is reported
(and is an error with --strict) instead of scored; the device of a process (one process:
`--device cuda:N` becomes the current device; torchrun: cuda:LOCAL_RANK, an explicit cuda:N
refused); `--amp-dtype auto|bf16|fp16` (auto: bf16 only where the GPU has it natively)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from eval_plots import lay_out_eval_plots_only
from gloo_ranks import BAD_LAUNCHES, error_lines_of, run_ranks, set_launch_env, stderr_of
from image_folders import write_image_folder
from processes import run_torchkit_in_process
from typer.testing import CliRunner

from torchkit.cli import app
from torchkit.core.data.batches import Batch
from torchkit.core.data.preprocessing import Preprocess
from torchkit.core.io.errors import DeviceError, UsageError
from torchkit.core.models import build_model
from torchkit.core.models.checkpoint import FORMAT_VERSION, save_checkpoint

runner = CliRunner()
CLASSES = ["a", "b"]
COUNTS = {"a": 6, "b": 5}  # 11 images: batches of 4 are 4 + 4 + 3
N = sum(COUNTS.values())
PREPROCESS = Preprocess(8, 8, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), 3)


def _save(model, path: Path) -> Path:
    save_checkpoint(
        {
            "format_version": FORMAT_VERSION,
            "torchkit_version": "0.1.0",
            "arch": "convnet",
            "num_classes": len(CLASSES),
            "classes": CLASSES,
            "model": model.state_dict(),
            "optimizer": None,
            "scheduler": None,
            "scaler": None,
            "epoch": 1,
            "global_step": 1,
            "best_metric": 0.0,
            "rng_state": None,
            "config": {},
            "preprocess": PREPROCESS.to_dict(),
        },
        path,
    )
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """11 random 8x8 RGB images in classes a and b, and three convnet checkpoints: random
    weights, NaN weights (a diverged run), and logits near 1e8 (finite in float32, beyond
    float16's 65504)."""
    root = tmp_path_factory.mktemp("honest")
    data = write_image_folder(root / "data", COUNTS, seed=0)
    torch.manual_seed(0)
    model = build_model("convnet", len(CLASSES), image_size=8)
    good = _save(model, root / "good.pt")
    head = model.classifier[-1]
    with torch.no_grad():
        head.weight.mul_(1e8)
        head.bias.mul_(1e8)
    huge = _save(model, root / "huge.pt")
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(float("nan"))
    nan = _save(model, root / "nan.pt")
    return {"root": root, "data": data, "good": good, "huge": huge, "nan": nan}


def invoke(*args) -> object:
    return runner.invoke(app, [str(arg) for arg in args])


def eval_args(world, checkpoint: str, *more) -> list:
    return [
        "eval", world[checkpoint], "--data", world["data"], "--device", "cpu",
        "--workers", "0", "--batch-size", "4", *more,
    ]  # fmt: skip


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("Error:")]


# Non-finite outputs: eval ---------------------------------------------------------------------


def test_eval_of_a_nan_model_warns_and_counts_instead_of_scoring_silently(
    world, tmp_path, monkeypatch
):
    lay_out_eval_plots_only(monkeypatch)  # the PNGs' pictures are not this test's (eval_plots)
    out = tmp_path / "report"
    result = invoke(*eval_args(world, "nan", "--format", "json", "--out", out))
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["num_nonfinite"] == N and data["num_images"] == N
    assert data["loss"] is None  # NaN, written as null: not a number that looks fine
    assert json.loads((out / "metrics.json").read_text())["num_nonfinite"] == N
    warning = (
        f"Warning: the model's outputs are not finite (NaN or inf) for {N} of {N} image(s) "
        f"in 3 batch(es) (first: {world['data'] / 'a' / 'a_0.png'}) (check whether the weights "
        "come from a diverged training run; their predictions and loss mean nothing, and "
        "--strict makes this an error)"
    )
    assert warning in result.stderr.splitlines(), result.stderr
    table = invoke(*eval_args(world, "nan"))
    row = next(line for line in table.stdout.splitlines() if "Non-finite outputs" in line)
    assert row.split("│")[2].strip() == str(N)


def test_eval_of_a_finite_model_reports_zero_and_no_warning(world):
    result = invoke(*eval_args(world, "good", "--format", "json"))
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["num_nonfinite"] == 0
    assert "not finite" not in result.stderr
    table = invoke(*eval_args(world, "good"))
    assert "Non-finite outputs" not in table.stdout


def test_eval_strict_fails_on_a_nan_model_with_one_error_line(world, tmp_path):
    out = tmp_path / "report"
    done = run_torchkit_in_process(*eval_args(world, "nan", "--strict", "--out", out))
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert error_lines(done.stderr) == [
        "Error: the model's outputs are not finite (NaN or inf) for 4 image(s) in 1 batch(es) "
        f"(first: {world['data'] / 'a' / 'a_0.png'}) (check whether the weights "
        "come from a diverged training run; without --strict they are counted and reported)"
    ]
    assert not out.exists()  # no report of a run that failed


class _MarkedNaN(torch.nn.Module):
    """Logits from the mean colour, NaN for an image whose top-left pixel is 9 (a marker)."""

    def forward(self, x):
        logits = torch.stack([x.mean((1, 2, 3)), -x.mean((1, 2, 3))], dim=1)
        marked = x[:, 0, 0, 0] == 9
        return torch.where(marked[:, None], torch.full_like(logits, float("nan")), logits)


def _batches(markers: list[list[str]]) -> list[Batch]:
    """One batch per list: images marked at the left ("L"), the right ("R") or not ("-")."""
    batches, index = [], 0
    for batch in markers:
        images = torch.zeros(len(batch), 3, 4, 4)
        for row, mark in enumerate(batch):
            if mark == "L":
                images[row, 0, 0, 0] = 9
            elif mark == "R":
                images[row, 0, 0, -1] = 9  # the flipped view has it at the left
        indices = torch.arange(index, index + len(batch))
        batches.append(Batch(images, torch.zeros(len(batch), dtype=torch.long), indices, []))
        index += len(batch)
    return batches


def test_predict_flags_exactly_the_images_and_batches_with_nonfinite_outputs():
    from torchkit.core.evaluate.runner import predict

    model, cpu = _MarkedNaN(), torch.device("cpu")
    loader = _batches([["-", "L", "-"], ["-", "-"], ["R", "-", "L"]])
    predictions, errors, bad_batches = predict(model, loader, cpu, k=1)
    assert errors == [] and len(predictions) == 8
    assert predictions.finite.tolist() == [True, False, True, True, True, True, True, False]
    assert bad_batches == 2
    # Flip TTA: the right-marked image is NaN in its mirrored view, so its average is too.
    predictions, _, bad_batches = predict(model, loader, cpu, k=1, tta="flip")
    assert predictions.finite.tolist() == [True, False, True, True, True, False, True, False]
    assert bad_batches == 2
    # --strict stops at the first batch that has one.
    predictions, _, bad_batches = predict(model, loader, cpu, k=1, strict=True)
    assert len(predictions) == 3 and bad_batches == 1


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed missing")
@pytest.mark.parametrize(
    ("command", "said"),
    [
        ("eval", "not finite (NaN or inf) for 4 image(s) in 2 batch(es)"),  # both ranks' images
        ("predict", "Error: the model's outputs for a/a_0.png are not finite (NaN or inf)"),
    ],
    ids=["eval", "predict"],
)
def test_under_ddp_a_strict_nan_model_fails_on_every_rank_reported_by_rank_0(world, command, said):
    """2 Gloo ranks each stop at their first batch (2 images each): every rank ends with exit 1
    and none waits for the other; the error, the same on every rank, is printed once, by rank 0
    (each rank printed it)."""
    args = eval_args(world, "nan", "--strict", "--batch-size", "2")
    if command == "predict":
        args = ["predict", world["nan"], world["data"], *args[4:]]
    ranks = run_ranks(*args)
    assert [done.returncode for done in ranks] == [1, 1], stderr_of(ranks)[-3000:]
    errors = error_lines_of(ranks)
    assert len(errors) == 1 and said in error_lines(ranks[0].stderr)[0], stderr_of(ranks)[-3000:]


# Outputs that are not (N, C) logits: eval and predict ------------------------------------------


@pytest.mark.parametrize(
    ("net", "returns"),
    [
        ("MapNet", "a tensor of shape (4, {classes}, 1, 1)"),
        ("PairNet", "a tuple of 2"),
        ("DictNet", "a dict (keys: out)"),
        ("ScoreNet", "a tensor of shape (4,)"),
    ],
)
@pytest.mark.parametrize("command", ["eval", "predict"])
def test_an_output_that_is_not_logits_is_one_error_line_naming_it(world, command, net, returns):
    args = [*eval_args(world, "good"), "--image-size", "8", "--allow-untrained"]
    args[1] = f"nets:{net}"
    if command == "predict":  # TinyNet's 3 classes (eval checks them against the data's 2)
        args = ["predict", args[1], world["data"], *args[4:]]
    else:
        args += ["--num-classes", "2"]
    done = run_torchkit_in_process(*args)
    assert done.returncode == 1
    returns = returns.format(classes=2 if command == "eval" else 3)
    assert error_lines(done.stderr) == [
        f"Error: the model returns {returns} for a batch of 4 images, not the (4, classes) "
        "logits of a classifier (eval and predict score classifiers: give a model whose forward "
        "returns its logits alone, or wrap it in a module that picks them)"
    ], done.stderr


# Non-finite outputs: extract-features ---------------------------------------------------------


def features_args(world, checkpoint: str, out: Path, *more) -> list:
    return [
        "extract-features", world[checkpoint], world["data"], out, "--device", "cpu",
        "--workers", "0", "--batch-size", "4", *more,
    ]  # fmt: skip


def test_extract_features_of_a_nan_model_warns_and_records_the_count(world, tmp_path):
    out = tmp_path / "features"
    result = invoke(*features_args(world, "nan", out))
    assert result.exit_code == 0, result.stderr
    meta = json.loads((out / "meta.json").read_text())
    assert meta["num_nonfinite"] == N and meta["num_rows"] == N
    first = world["data"] / "a" / "a_0.png"
    assert (
        f"Warning: {N} of the {N} rows have non-finite features (NaN or inf; first: {first}): "
        "they mean nothing (check whether the weights come from a diverged training run; "
        "--strict makes this an error)"
    ) in result.stderr.splitlines(), result.stderr
    assert np.isnan(np.load(out / "penultimate.npy")).all()  # stored as computed


def test_extract_features_strict_fails_on_a_nan_model_before_writing(world, tmp_path):
    out = tmp_path / "features"
    done = run_torchkit_in_process(*features_args(world, "nan", out, "--strict"))
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    first = world["data"] / "a" / "a_0.png"
    assert error_lines(done.stderr) == [
        "Error: layer penultimate gives non-finite values (NaN or inf) for 4 of the 4 images "
        f"of a batch (first: {first}) (check whether the weights come from a diverged training "
        "run; without --strict they are counted)"
    ]
    assert not out.exists()  # the first batch failed: nothing was written


def test_eval_nonfinite_hint_names_bf16_after_an_fp16_autocast():
    from torchkit.core.evaluate.runner import _nonfinite_hint

    assert _nonfinite_hint("fp16", strict=True) == (
        "check whether the weights come from a diverged training run, or use --amp-dtype bf16 or "
        "drop --amp: float16 overflows past 65504; without --strict they are counted and reported"
    )
    assert "float16" not in _nonfinite_hint("bf16", strict=True)


def test_float16_storage_overflow_is_caught_where_float32_is_fine(world, tmp_path):
    """Logits near 1e8 are finite, but not in a float16 array: the check looks at what is
    stored, and the hint names --dtype float32."""
    wide = invoke(*features_args(world, "huge", tmp_path / "f32", "--layer", "logits"))
    assert wide.exit_code == 0, wide.stderr
    assert json.loads((tmp_path / "f32" / "meta.json").read_text())["num_nonfinite"] == 0
    narrow = invoke(
        *features_args(world, "huge", tmp_path / "f16", "--layer", "logits", "--dtype", "float16")
    )
    assert narrow.exit_code == 0, narrow.stderr
    assert json.loads((tmp_path / "f16" / "meta.json").read_text())["num_nonfinite"] == N
    assert "or use --dtype float32: float16 overflows past 65504" in narrow.stderr
    strict = invoke(
        *features_args(world, "huge", tmp_path / "f16s", "--layer", "logits", "--dtype",
                       "float16", "--strict")
    )  # fmt: skip
    assert strict.exit_code == 1
    assert error_lines(strict.stderr)[0].startswith("Error: layer logits gives non-finite")


def test_the_nonfinite_count_survives_a_resume():
    from torchkit.core.features.store import Progress

    state = Progress(done=8, rows=8, nonfinite=3, nonfinite_first="a/a_1.png")
    again = Progress.from_json(json.loads(json.dumps(state.to_json("f", 11))))
    assert (again.nonfinite, again.nonfinite_first) == (3, "a/a_1.png")
    assert Progress.from_json({"done": 1, "rows": 1}).nonfinite == 0  # an older record


# The device of a process ----------------------------------------------------------------------


@pytest.fixture
def fake_cuda(monkeypatch):
    """Two CUDA GPUs as far as torch.cuda's queries go; set_device calls are recorded."""
    calls: list = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    return calls


def test_one_process_cuda_index_becomes_the_current_device(fake_cuda):
    from torchkit.core.runtime.device import select_device
    from torchkit.core.runtime.distributed import setup

    ctx = setup("cuda:1")
    assert (ctx.world_size, ctx.device) == (1, torch.device("cuda", 1))
    assert fake_cuda == [torch.device("cuda", 1)]  # cudnn handles, NCCL, current_device agree
    assert select_device("auto") == torch.device("cuda", 0)
    assert fake_cuda[-1] == torch.device("cuda", 0)
    assert select_device("cpu") == torch.device("cpu") and len(fake_cuda) == 2


@pytest.fixture
def fake_torchrun(monkeypatch, fake_cuda):
    """This process as rank 1 (LOCAL_RANK 1) of a torchrun job of 2; init is recorded."""
    import torch.distributed as dist

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    inits: list = []
    monkeypatch.setattr(dist, "is_initialized", lambda: bool(inits))
    monkeypatch.setattr(dist, "init_process_group", lambda **kwargs: inits.append(kwargs))
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    return inits


@pytest.mark.parametrize("spec", ["cuda", "auto", " CUDA "])
def test_torchrun_ranks_use_the_gpu_of_their_local_rank(fake_torchrun, fake_cuda, spec):
    from torchkit.core.runtime.distributed import setup

    ctx = setup(spec)
    assert (ctx.rank, ctx.world_size, ctx.initialised_here) == (1, 2, True)
    assert ctx.device == torch.device("cuda", 1)
    assert fake_cuda == [torch.device("cuda", 1)]
    assert [kwargs["backend"] for kwargs in fake_torchrun] == ["nccl"]


@pytest.mark.parametrize("spec", ["cuda:0", "cuda:1"])
def test_torchrun_refuses_an_explicit_gpu_before_anything_starts(fake_torchrun, fake_cuda, spec):
    from torchkit.core.runtime.distributed import setup

    with pytest.raises(UsageError) as caught:
        setup(spec)
    assert str(caught.value) == (
        f"--device {spec} names one GPU, but under torchrun each of the 2 processes uses the "
        "GPU of its LOCAL_RANK (use --device cuda or auto, and CUDA_VISIBLE_DEVICES to "
        "choose the GPUs)"
    )
    assert fake_cuda == [] and fake_torchrun == []


def test_train_takes_its_device_by_the_same_rule(fake_cuda, monkeypatch):
    """train's process setup: `--device cuda:1` becomes the current GPU; under torchrun each rank
    takes cuda:LOCAL_RANK and an explicit GPU is refused before the group starts."""
    import torch.distributed as dist

    from torchkit.core.runtime.distributed import setup

    assert setup("cuda:1").device == torch.device("cuda", 1)
    assert fake_cuda == [torch.device("cuda", 1)]
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    inits: list = []
    monkeypatch.setattr(dist, "is_initialized", lambda: bool(inits))
    monkeypatch.setattr(dist, "init_process_group", lambda **kwargs: inits.append(kwargs))
    with pytest.raises(UsageError, match="names one GPU, but under torchrun"):
        setup("cuda:0")
    assert inits == [] and len(fake_cuda) == 1
    ctx = setup("cuda")
    assert ctx.device == torch.device("cuda", 1) and fake_cuda[-1] == torch.device("cuda", 1)
    assert inits[0]["backend"] == "nccl" and (ctx.rank, ctx.world_size) == (1, 2)


def test_torchrun_with_more_ranks_than_gpus_is_a_device_error(fake_torchrun, monkeypatch):
    from torchkit.core.runtime.distributed import setup

    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(DeviceError, match="started 3 processes on this node, one per GPU, but "):
        setup("cuda")
    assert fake_torchrun == []


def test_every_rank_stops_when_the_node_has_fewer_gpus_than_processes(fake_torchrun, monkeypatch):
    """Rank 0 of `torchrun --nproc_per_node=2` on a 1-GPU machine has a GPU of its own, but stops
    with the same error as rank 1 before any process group or collective: it used to wait in
    init_process_group until torchrun killed it."""
    from torchkit.core.runtime.distributed import setup

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(DeviceError) as caught:
        setup("cuda")  # (eval's, predict's and train's)
    assert str(caught.value) == (
        "torchrun started 2 processes on this node, one per GPU, but only 1 CUDA device(s) are "
        "visible (use --nproc_per_node no larger than the number of GPUs)"
    )
    assert fake_torchrun == []


def test_torchrun_explicit_gpu_is_a_usage_error_exit_2(world, monkeypatch):
    """Rank 0 of a torchrun job of 2 (the variables torchrun sets, no MASTER_ADDR: a process
    group started first would fail otherwise): the refusal comes before any GPU or process
    group is touched, so it reads the same on a machine without GPUs, on every rank."""
    args = [a for a in map(str, eval_args(world, "good")) if a not in ("--device", "cpu")]
    env = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}
    set_launch_env(monkeypatch, env)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    done = run_torchkit_in_process(*args, "--device", "cuda:1")
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "Error: --device cuda:1 names one GPU, but under torchrun each of the 2 processes uses "
        "the GPU of its LOCAL_RANK (use --device cuda or auto, and CUDA_VISIBLE_DEVICES to "
        "choose the GPUs)"
    ]


@pytest.mark.parametrize(("env", "line"), BAD_LAUNCHES)
def test_torchrun_variables_no_torchrun_sets_are_one_usage_error(world, monkeypatch, env, line):
    """They were a KeyError or ValueError line (exit 1), or (RANK=x, RANK=1 alone) ignored."""
    set_launch_env(monkeypatch, env)
    result = run_torchkit_in_process(*eval_args(world, "good"))
    assert result.returncode == 2, result.stderr
    assert error_lines(result.stderr) == [line]
    assert result.stdout == ""


def test_extract_features_makes_its_gpu_the_current_device(world, tmp_path, monkeypatch):
    """extract-features goes through select_device too: `--device cuda:1` sets GPU 1 current
    (the model then runs on the CPU here, where there is no GPU to run it on)."""
    from torchkit.core.runtime import device as device_module

    calls: list = []
    real = device_module.select_device

    def select(spec, **kwargs):
        with pytest.MonkeyPatch.context() as cuda:
            cuda.setattr(torch.cuda, "is_available", lambda: True)
            cuda.setattr(torch.cuda, "device_count", lambda: 2)
            cuda.setattr(torch.cuda, "set_device", calls.append)
            assert real(spec, **kwargs) == torch.device("cuda", 1)
        return torch.device("cpu")

    monkeypatch.setattr(device_module, "select_device", select)
    out = tmp_path / "f"
    result = invoke(
        "extract-features", world["good"], world["data"], out, "--device", "cuda:1",
        "--workers", "0",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert calls == [torch.device("cuda", 1)]


# --amp-dtype -----------------------------------------------------------------------------------


@pytest.fixture
def bf16_support(monkeypatch):
    """`state["native"]` answers torch.cuda.is_bf16_supported(including_emulation=False);
    with emulation it is always True (as on a T4 or V100). The arguments are recorded."""
    state: dict = {"native": False, "calls": []}

    def is_bf16_supported(including_emulation: bool = True):
        state["calls"].append(including_emulation)
        return True if including_emulation else state["native"]

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    return state


def test_auto_amp_dtype_is_bf16_only_where_the_gpu_has_it_natively(bf16_support):
    from torchkit.core.runtime.device import amp_dtype_name, resolve_amp_dtype

    cuda, cpu, mps = torch.device("cuda", 0), torch.device("cpu"), torch.device("mps")
    assert resolve_amp_dtype("auto", cuda) == torch.float16  # pre-Ampere: fp16, not emulation
    assert bf16_support["calls"] == [False]
    bf16_support["native"] = True
    assert resolve_amp_dtype("auto", cuda) == torch.bfloat16
    assert resolve_amp_dtype("fp16", cuda) == torch.float16
    assert resolve_amp_dtype("auto", cpu) == torch.bfloat16
    assert resolve_amp_dtype("fp16", cpu) == torch.float16  # CPU float16 autocast is allowed
    assert resolve_amp_dtype("BF16", cpu) == torch.bfloat16
    assert resolve_amp_dtype("auto", mps) == torch.float16
    assert amp_dtype_name(torch.bfloat16) == "bf16" and amp_dtype_name(torch.float16) == "fp16"
    with pytest.raises(UsageError, match="unknown --amp-dtype 'fp8'"):
        resolve_amp_dtype("fp8", cpu)


def test_explicit_bf16_on_a_gpu_without_native_bf16_warns(bf16_support, caplog):
    from torchkit.core.runtime.device import resolve_amp_dtype

    with caplog.at_level(logging.WARNING, logger="torchkit"):
        assert resolve_amp_dtype("bf16", torch.device("cuda", 0)) == torch.bfloat16
    assert "emulated and slow" in caplog.text
    caplog.clear()
    bf16_support["native"] = True
    resolve_amp_dtype("bf16", torch.device("cuda", 0))
    assert caplog.text == ""


def test_eval_amp_dtype_on_cpu_for_real_is_recorded_and_used(world, tmp_path, monkeypatch):
    """fp16 and bf16 CPU autocast both run; each gives (slightly) different numbers from the
    other and from float32, so the dtype asked for is the one that ran."""
    lay_out_eval_plots_only(monkeypatch)  # the PNGs' pictures are not this test's (eval_plots)
    losses = {}
    for dtype in ("none", "fp16", "bf16"):
        amp = [] if dtype == "none" else ["--amp", "--amp-dtype", dtype]
        out = tmp_path / dtype
        result = invoke(*eval_args(world, "good", "--format", "json", "--out", out, *amp))
        assert result.exit_code == 0, result.stderr
        data = json.loads(result.stdout)
        assert data["amp"] is (dtype != "none")
        assert data["amp_dtype"] == (None if dtype == "none" else dtype)
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["amp_dtype"] == data["amp_dtype"]
        losses[dtype] = data["loss"]
    assert losses["fp16"] == pytest.approx(losses["none"], rel=1e-2)
    assert losses["bf16"] == pytest.approx(losses["none"], rel=5e-2)
    assert len(set(losses.values())) == 3


def test_extract_features_amp_dtype_on_cpu_for_real(world, tmp_path):
    runs = {}
    for dtype in ("none", "fp16"):
        amp = [] if dtype == "none" else ["--amp", "--amp-dtype", dtype]
        out = tmp_path / dtype
        result = invoke(*features_args(world, "good", out, *amp))
        assert result.exit_code == 0, result.stderr
        meta = json.loads((out / "meta.json").read_text())
        assert meta["amp"] is (dtype != "none")
        assert meta["amp_dtype"] == (None if dtype == "none" else dtype)
        runs[dtype] = (np.load(out / "penultimate.npy"), meta["fingerprint"])
    assert np.allclose(runs["fp16"][0], runs["none"][0], atol=1e-2)
    assert not np.array_equal(runs["fp16"][0], runs["none"][0])  # float16 really ran
    assert runs["fp16"][1] != runs["none"][1]  # --resume never mixes the two


def test_fingerprint_without_amp_is_the_one_older_versions_wrote():
    """An interrupted run of an earlier version (no amp_dtype key) can still be resumed."""
    import hashlib

    from torchkit.core.data.sources.samples import Samples
    from torchkit.core.features.extract import _fingerprint

    samples = Samples(classes=["a"], labels=[0], paths=["a/x.png"], source="s")
    settings = {"model": "convnet", "amp": False}
    old = hashlib.sha256(json.dumps(settings, sort_keys=True).encode("utf-8"))
    old.update(b"\na/x.png\t0")
    old.update(b"\n1")
    assert _fingerprint({**settings, "amp_dtype": None}, samples) == old.hexdigest()
    assert _fingerprint({**settings, "amp": True, "amp_dtype": "fp16"}, samples) != _fingerprint(
        {**settings, "amp": True, "amp_dtype": "bf16"}, samples
    )


@pytest.mark.parametrize("command", ["eval", "extract-features"])
def test_amp_dtype_without_amp_is_a_usage_error(world, tmp_path, command):
    if command == "eval":
        args = eval_args(world, "good", "--amp-dtype", "fp16")
    else:
        args = features_args(world, "good", tmp_path / "f", "--amp-dtype", "fp16")
    result = invoke(*args)
    assert result.exit_code == 2
    assert error_lines(result.stderr) == [
        "Error: --amp-dtype fp16 does nothing without --amp (add --amp)"
    ]
    assert not (tmp_path / "f").exists()


# Counts beyond what the machine takes -----------------------------------------------------------


def _inference_args(world, command: str, out: Path, *more) -> list:
    inputs = {
        "eval": ["--data", world["data"], "--out", out],
        "predict": [world["data"], "-o", out / "rows.csv"],
        "extract-features": [world["data"], "--out", out],
    }[command]
    return [command, world["good"], *inputs, "--device", "cpu", *more]


@pytest.mark.parametrize("command", ["eval", "predict", "extract-features"])
def test_more_workers_than_the_machine_can_use_is_a_usage_error(
    world, tmp_path, monkeypatch, command
):
    """Was accepted: the DataLoader forked -j processes until the memory ran out."""
    import multiprocessing.process

    def start(process):
        raise AssertionError("a process was started")

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", start)
    out = tmp_path / "out"
    result = invoke(*_inference_args(world, command, out, "-j", "100000"))
    assert result.exit_code == 2, result.stderr
    [line] = error_lines(result.stderr)
    assert line.startswith("Error: --workers 100000 is more than this machine can use (at most ")
    assert not out.exists()


@pytest.mark.parametrize("command", ["eval", "predict", "extract-features"])
def test_a_batch_size_beyond_a_python_index_is_a_usage_error(world, tmp_path, command):
    """Was "Error: ValueError: Stop argument for islice() ..." (exit 1) after the model loaded
    (eval, extract-features), as train refuses it."""
    out = tmp_path / "out"
    result = invoke(*_inference_args(world, command, out, "-j", "0", "-b", str(2**70)))
    assert result.exit_code == 2, result.stderr
    assert error_lines(result.stderr) == [
        f"Error: --batch-size {2**70} is more than a batch can hold ({sys.maxsize})"
    ]
    assert not out.exists()


@pytest.mark.parametrize("command", ["eval", "predict", "extract-features"])
def test_a_resize_smaller_than_the_crop_is_a_usage_error_as_in_train(world, tmp_path, command):
    """Was accepted: the crop was padded with zeros around the resized image."""
    out = tmp_path / "out"
    result = invoke(*_inference_args(world, command, out, "-j", "0", "--resize-size", "4"))
    assert result.exit_code == 2, result.stderr
    assert error_lines(result.stderr) == [
        "Error: --resize-size 4 is smaller than --image-size 8 "
        "(the centre crop must fit inside the resized image)"
    ]
    assert not out.exists()


def test_a_model_that_records_a_resize_smaller_than_its_crop_still_loads():
    from torchkit.core.data.preprocessing import apply_overrides

    recorded = Preprocess(16, 8)
    assert apply_overrides(recorded) == recorded
    assert apply_overrides(recorded, image_size=32).resize_size == 16  # its ratio, kept
    with pytest.raises(UsageError, match="--resize-size 12 is smaller than --image-size 32"):
        apply_overrides(recorded, image_size=32, resize_size=12)
    with pytest.raises(UsageError, match="--resize-size 12 is smaller than --image-size 16"):
        apply_overrides(Preprocess(16, 20), resize_size=12)
