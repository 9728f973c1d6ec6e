"""--cuda-graphs (core.train.graphed_step): the step a CUDA graph records, checked on the CPU.

Recording needs a GPU (the `cuda` tests in test_gpu_training.py); here the same step runs from
the same static buffers at every batch (`capture=False`). Checked: it trains as the eager step
does, updates the epoch's sums in place, and is recordable: the operators it runs, with every
argument that is not a tensor, are the same at every step (a Python number that changed from
step to step would be frozen into a graph), and none of them waits for the device.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses

import pytest
import torch
from graphed_training import SmallNet, batches, make_context, train, weights
from torch.utils._python_dispatch import TorchDispatchMode

from torchkit.cli import app
from torchkit.core.data.batches import Batch
from torchkit.core.io.errors import DeviceError, UsageError
from torchkit.core.train import graphed_step, loop
from torchkit.core.train.config import TrainConfig
from torchkit.core.train.graphed_step import GraphedStep
from torchkit.core.train.validation import validate


@pytest.mark.parametrize(
    "options",
    [
        {"optimizer": "adamw"},
        {"optimizer": "sgd", "clip_grad": 0.5, "l1": 1e-4},
        {"optimizer": "adam", "ema": False},
    ],
    ids=["adamw-ema", "sgd-clip-l1", "adam"],
)
def test_the_graphs_step_trains_as_the_eager_step_does(options):
    """Two epochs of 6 batches with a warm-up schedule (a new lr at every update): weights,
    EMA, BatchNorm statistics, optimiser state, the lr, and the epoch's loss and accuracy."""
    data = batches(6)
    eager = make_context(**options)
    eager_progress = train(eager, data)
    graphed = make_context(**options)
    graphed.graphed = GraphedStep(graphed, "float32", 8)
    graphed_progress = train(graphed, data)

    for name, value in weights(eager).items():
        torch.testing.assert_close(weights(graphed)[name], value, rtol=1e-5, atol=1e-6, msg=name)
    for ours, theirs in zip(graphed_progress, eager_progress, strict=True):
        assert ours.seen == theirs.seen == 48 and ours.batches == theirs.batches == 6
        assert ours.loss_sum == pytest.approx(theirs.loss_sum, rel=1e-6)
        assert ours.correct == theirs.correct
        assert ours.last_lr == theirs.last_lr
    assert graphed.schedule.current_lr() == eager.schedule.current_lr()
    if eager.ema is not None:
        assert graphed.ema.updates == eager.ema.updates == 12
    # Checkpoints keep the eager groups: Python learning rates, no `capturable`.
    for group in graphed.optimizer.state_dict()["param_groups"]:
        assert isinstance(group["lr"], float) and not group.get("capturable")
    assert graphed.graphed.eager_updates == 12 and graphed.graphed.replays == 0


def test_a_batch_of_another_shape_and_an_empty_one_take_the_eager_way():
    """A batch that lost images takes the eager step (its gradients not added to the graph's
    last ones); an update with no readable image moves the schedule and EMA on, no weights."""
    data = batches(3)
    short = batches(1, size=5, seed=3)[0]
    empty = Batch(None, None, None, ["x.png: cannot identify image file"])
    eager, graphed = make_context(), make_context()
    graphed.graphed = GraphedStep(graphed, "float32", 8)
    for ctx in (eager, graphed):
        torch.manual_seed(1)
        loop.train_one_epoch(
            ctx, [*data, short, empty, *data], loop.EpochProgress(), loop.UnreadableImages(False)
        )
    for name, value in weights(eager).items():
        torch.testing.assert_close(weights(graphed)[name], value, rtol=1e-5, atol=1e-6, msg=name)
    assert graphed.ema.updates == eager.ema.updates == 8


def test_the_summary_counts_each_kind_of_update():
    """`train -v`'s last --cuda-graphs line: eager updates (here: no recording on a CPU, and a
    short batch) and those without a readable image are counted."""
    ctx = make_context()
    ctx.graphed = step = GraphedStep(ctx, "float32", 8)
    empty = Batch(None, None, None, ["x.png: cannot identify image file"])
    data = [*batches(2), batches(1, size=5, seed=3)[0], empty]
    loop.train_one_epoch(ctx, data, loop.EpochProgress(), loop.UnreadableImages(False))
    assert step.summary() == (
        "--cuda-graphs: 0 updates replayed from the graph, 0 warm-up and 3 other eager "
        "updates, 1 without a readable image"
    )


def test_a_non_finite_loss_names_its_batch_as_the_eager_step_does():
    data = batches(5)
    data[2] = dataclasses.replace(data[2], images=torch.full_like(data[2].images, float("nan")))
    ctx = make_context()
    ctx.graphed = GraphedStep(ctx, "float32", 8)
    with pytest.raises(loop.DivergedError, match=r"epoch 4, step 3 of 5"):
        loop.train_one_epoch(ctx, data, loop.EpochProgress(), loop.UnreadableImages(False), epoch=4)


class OperatorLog(TorchDispatchMode):
    """Every operator run, with its arguments other than tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []
        self.fused_lrs: list[int] = []  # the data pointers of the fused step's lr arguments

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat = torch.utils._pytree.tree_leaves((args, kwargs))
        values = tuple(_value(a) for a in flat if not isinstance(a, torch.Tensor))
        self.calls.append((str(func), values))
        if "fused_adamw" in str(func):
            self.fused_lrs.append(kwargs["lr"].data_ptr())
        return func(*args, **kwargs)


PLAIN_VALUES = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format)


def _value(argument):
    """A plain argument as it is; anything else (a profiler's record handle) by its type."""
    return argument if isinstance(argument, PLAIN_VALUES) else type(argument).__name__


@pytest.mark.parametrize("amp_dtype", ["float32", "bfloat16"])
def test_the_recorded_step_reads_nothing_from_the_host_that_changes(amp_dtype):
    """What a graph would freeze: the same operators with the same non-tensor arguments at
    every step, while the lr, the EMA's decay and the batch number change; and nothing that
    waits for the device (.item(), a tensor turned into a Python number)."""
    ctx = make_context("adamw", clip_grad=1.0)
    step = GraphedStep(ctx, amp_dtype, 8)
    data = batches(4)
    logs, lrs, fused_lrs = [], [], []

    def device_scalars():  # what a graph reads: the same tensors, changed in place only
        sums = step.sums
        tensors = [*step.lrs, step.decay, step.rest, step.batch_no]
        return [(id(t), t.data_ptr()) for t in [*tensors, sums.loss_sum, sums.correct,
                                                sums.first_bad]]  # fmt: skip

    scalars = device_scalars()
    for number, batch in enumerate(data, start=1):
        step._fill(number)
        lrs.append(float(step.lrs[0]))
        if number == 1:
            step.images, step.labels = batch.images.clone(), batch.labels.clone()
        step.images.copy_(batch.images)
        step.labels.copy_(batch.labels)
        ctx.optimizer.zero_grad(set_to_none=True)
        with OperatorLog() as log:
            step._body(step.images, step.labels)
        step._updated()
        logs.append(log.calls)
        fused_lrs.append(log.fused_lrs)
    assert len(set(lrs)) == 4  # the warm-up moved the lr on at every step
    assert float(step.decay) != 0 and float(step.batch_no) == 4
    # The first step creates the optimiser's state; the graph is recorded after warm-up.
    assert logs[2] == logs[1] and logs[3] == logs[1]
    names = {name for name, _ in logs[1]}
    assert not names & {"aten._local_scalar_dense.default", "aten.item.default"}
    assert "aten._fused_adamw_.tensor_lr" in names
    assert device_scalars() == scalars
    # Each group's update read that group's device lr, at every step.
    assert all(ptrs == [lr.data_ptr() for lr in step.lrs] for ptrs in fused_lrs)


def test_graph_refusals_are_usage_errors(monkeypatch):
    for options, message in [
        ({"optimizer": "rmsprop"}, "fused optimiser"),
        ({"accum_steps": 2}, "--accum-steps"),
        ({"mixup_alpha": 0.2}, "cannot use --mixup-alpha or --cutmix-alpha:"),
        ({"compile": True}, "compiled"),
        ({"find_lr": True}, "--find-lr"),
    ]:
        with pytest.raises(UsageError, match=message):
            validate(TrainConfig(cuda_graphs=True, **options))
    cpu = torch.device("cpu")
    with pytest.raises(UsageError, match="needs a CUDA device, and this run is on cpu"):
        graphed_step.refuse_ungraphable_run(cpu, distributed=False, amp_dtype="float32")
    monkeypatch.setattr(graphed_step, "GRAPH_DEVICES", ("cuda", "cpu"))
    with pytest.raises(UsageError, match="torchrun"):
        graphed_step.refuse_ungraphable_run(cpu, distributed=True, amp_dtype="float32")
    with pytest.raises(UsageError, match="float16"):
        graphed_step.refuse_ungraphable_run(cpu, distributed=False, amp_dtype="float16")
    graphed_step.refuse_ungraphable_run(cpu, distributed=False, amp_dtype="bfloat16")
    double = make_context()
    double.optimizer = torch.optim.AdamW(copy.deepcopy(SmallNet()).double().parameters())
    with pytest.raises(UsageError, match="fused"):
        GraphedStep(double, "float32", 8)


# -- through `torchkit train` ----------------------------------------------------------------

# 16 images, 12 of them training images in batches of 5: 2 whole batches and one of 2.
RUN_ARGS = ["train", "--model", "convnet", "--image-size", "8", "-b", "5", "--val-split",
            "0.25", "--device", "cpu", "--workers", "0", "--cuda-graphs"]  # fmt: skip


def test_cuda_graphs_on_a_cpu_is_one_usage_error(runner, tmp_path, make_image_folder):
    data = make_image_folder(tmp_path / "data", {"a": 8, "b": 8})
    result = runner.invoke(app, [*RUN_ARGS, "--data", str(data), "--out", str(tmp_path / "r")])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == (
        "Error: --cuda-graphs needs a CUDA device, and this run is on cpu (drop --cuda-graphs; "
        "a resumed run takes --no-cuda-graphs)"
    )
    assert len(result.stderr.splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_a_run_with_the_graphs_step_drops_the_partial_batch_and_resumes(
    runner, tmp_path, make_image_folder, monkeypatch
):
    """The whole run on the graph's step (not recorded on a CPU): the last partial batch is
    dropped (one batch shape), `train -v` says how the updates were made, and the run resumes."""
    import torch

    monkeypatch.setattr(graphed_step, "GRAPH_DEVICES", ("cuda", "cpu"))
    data = make_image_folder(tmp_path / "data", {"a": 8, "b": 8})
    out = tmp_path / "run"
    args = [*RUN_ARGS, "--data", str(data), "--out", str(out), "--ema"]
    result = runner.invoke(app, [*args, "--epochs", "2", "-v"])
    assert result.exit_code == 0, result.stderr
    assert (
        "--cuda-graphs: 0 updates replayed from the graph, 0 warm-up and 4 other eager updates"
        in result.stderr
    )
    checkpoint = torch.load(out / "last.pt", weights_only=True)
    assert checkpoint["drop_last"] is True and checkpoint["config"]["cuda_graphs"] is True
    assert checkpoint["ema_updates"] == 4 and checkpoint["global_step"] == 4
    groups = checkpoint["optimizer"]["param_groups"]
    assert all(isinstance(g["lr"], float) and not g.get("capturable") for g in groups)
    resumed = runner.invoke(app, ["train", "--resume", str(out / "last.pt"), "--epochs", "3"])
    assert resumed.exit_code == 0, resumed.stderr
    assert torch.load(out / "last.pt", weights_only=True)["epoch"] == 3
    # Where no graph can be recorded, the run goes on with --no-cuda-graphs, as the error says.
    monkeypatch.setattr(graphed_step, "GRAPH_DEVICES", ("cuda",))
    resume = ["train", "--resume", str(out / "last.pt"), "--epochs", "4"]
    refused = runner.invoke(app, resume)
    assert refused.exit_code == 2 and "a resumed run takes --no-cuda-graphs" in refused.stderr
    assert torch.load(out / "last.pt", weights_only=True)["epoch"] == 3
    eager = runner.invoke(app, [*resume, "--no-cuda-graphs"])
    assert eager.exit_code == 0, eager.stderr
    finished = torch.load(out / "last.pt", weights_only=True)
    assert finished["epoch"] == 4 and finished["drop_last"] is True  # the run's batches kept


# -- the CUDA branches, with torch.cuda's streams and graphs faked ------------------------------


class FakeCuda:
    """Stand-ins for torch.cuda's streams, sync debugging and graphs. A fake capture runs the
    step and then puts back every tensor it changed (a real capture records kernels without
    running them); a replay runs it again from the static buffers, writing the gradients
    afresh as a graph does. `waits`: what the sync debugging reports in the last warm-up
    update; `fail`: the capture raises, as torch does (the end of the capture's error, with
    the cause before it)."""

    def __init__(self, step: GraphedStep, *, waits=(), fail: bool = False) -> None:
        self.step, self.waits, self.fail = step, list(waits), fail
        self.captures, self.probes, self.capturable_while_capturing = 0, 0, None

    def install(self, monkeypatch) -> None:
        stream = type("Stream", (), {"wait_stream": lambda self, other: None})
        monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: stream())
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: stream())
        monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: self)
        monkeypatch.setattr(torch.cuda, "graph", self.capture)
        monkeypatch.setattr(graphed_step, "_host_waits", self.host_waits)
        self.step.capture = True

    @contextlib.contextmanager
    def host_waits(self):
        self.probes += 1
        found: list[str] = []
        yield found
        found += self.waits

    def _state(self) -> list[torch.Tensor]:
        ctx = self.step.ctx
        tensors = [*ctx.model.state_dict().values(), *ctx.ema.state_dict().values()]
        tensors += [t for s in ctx.optimizer.state.values() for t in s.values()]
        sums = self.step.sums
        return [*tensors, sums.loss_sum, sums.correct, sums.first_bad]

    @contextlib.contextmanager
    def capture(self, graph, capture_error_mode="global"):
        assert graph is self and capture_error_mode == "thread_local"
        self.captures += 1
        self.capturable_while_capturing = [g["capturable"] for g in self.step.groups]
        if self.fail:
            try:
                raise RuntimeError("operation not permitted when stream is capturing")
            except RuntimeError:
                # Chained implicitly, as torch's graph __exit__ raises it.
                raise RuntimeError("operation failed due to a previous error during capture")  # noqa: B904
        saved, rng = [t.clone() for t in self._state()], torch.get_rng_state()
        yield
        for tensor, value in zip(self._state(), saved, strict=True):
            tensor.copy_(value)
        torch.set_rng_state(rng)

    def replay(self) -> None:
        self.step.ctx.optimizer.zero_grad(set_to_none=True)
        self.step._body(self.step.images, self.step.labels)


def _graphed_run(monkeypatch, data, **fake_options):
    """(eager context and progress, graphed context, its GraphedStep, the fake, its progress)."""
    eager = make_context()
    eager_progress = train(eager, data)
    graphed = make_context()
    graphed.graphed = step = GraphedStep(graphed, "float32", 8)
    fake = FakeCuda(step, **fake_options)
    fake.install(monkeypatch)
    return eager, eager_progress, graphed, step, fake


def _same_training(eager, eager_progress, graphed, graphed_progress) -> None:
    for name, value in weights(eager).items():
        torch.testing.assert_close(weights(graphed)[name], value, rtol=1e-5, atol=1e-6, msg=name)
    for ours, theirs in zip(graphed_progress, eager_progress, strict=True):
        assert ours.loss_sum == pytest.approx(theirs.loss_sum, rel=1e-6)
        assert ours.correct == theirs.correct


def test_the_cuda_branches_warm_up_probe_capture_and_replay(monkeypatch, caplog):
    """A first batch that is short (an unreadable image) steps eagerly and does not size the
    graph: the whole batches after it are warmed up, probed, recorded once and replayed."""
    data = [batches(1, size=5, seed=4)[0], *batches(6)]
    eager, eager_progress, graphed, step, fake = _graphed_run(monkeypatch, data)
    _same_training(eager, eager_progress, graphed, train(graphed, data))
    # Captured once, after the warm-up, with the groups `capturable` only while capturing.
    assert fake.captures == 1 and fake.capturable_while_capturing == [True] * len(step.groups)
    assert all(not group["capturable"] for group in graphed.optimizer.param_groups)
    assert fake.probes == 1 and step.warm_updates == graphed_step.WARMUP_UPDATES
    assert step.graph is fake and step.replays == 9 and step.eager_updates == 2
    assert "not recorded" not in caplog.text and step.images.shape[0] == 8


def test_a_step_that_waits_for_the_device_is_not_recorded_and_trains_eagerly(monkeypatch, caplog):
    data = batches(6)
    wait = "called a synchronizing CUDA operation"
    eager, eager_progress, graphed, step, fake = _graphed_run(monkeypatch, data, waits=[wait])
    _same_training(eager, eager_progress, graphed, train(graphed, data))
    assert fake.captures == 0 and step.graph is None
    assert step.replays == 0 and step.eager_updates == 9
    assert f"not recorded, because it waits for the device ({wait}" in caplog.text
    assert step.summary().endswith(f"(not recorded: the step waits for the device: {wait})")


def test_a_capture_that_fails_all_the_same_stops_the_run_with_its_cause(monkeypatch):
    """A failed capture leaves CUDA's generator in capture mode: one error, naming the first
    failure (torch raises the end of the capture's on top of it), not an eager fallback."""
    data = batches(6)
    *_, graphed, step, fake = _graphed_run(monkeypatch, data, fail=True)
    with pytest.raises(DeviceError) as raised:
        train(graphed, data)
    assert str(raised.value) == (
        "--cuda-graphs could not record the training step: operation not permitted when "
        "stream is capturing (train without --cuda-graphs; a resumed run takes "
        "--no-cuda-graphs)"
    )
    assert fake.captures == 1 and step.graph is None


def test_the_capture_waits_for_the_profiler_to_stop(monkeypatch):
    """train --profile-steps: no capture while torch.profiler records (CUPTI and a capture do
    not mix safely): the updates step eagerly until the profile stops, then it is recorded."""

    class Profiler:  # the loop's view of step_profiler.StepProfiler: stops after 5 updates
        updates = 0

        @property
        def recording(self):
            return self.updates < 5

        def stepped(self):
            self.updates += 1

    data = batches(6)
    eager, eager_progress, graphed, step, fake = _graphed_run(monkeypatch, data)
    torch.manual_seed(1)
    progress = loop.EpochProgress()
    unreadable = loop.UnreadableImages(False)
    loop.train_one_epoch(graphed, data, progress, unreadable, epoch=1, profiler=Profiler())
    assert step.warm_updates == 3 and step.eager_updates == 2  # updates 4 and 5
    assert fake.captures == 1 and step.replays == 1


def test_only_warnings_of_an_operation_that_waits_count_as_waits():
    # torch warns once a process when its sync debugging is switched on: on the first H200 run
    # that warning was taken for a wait, and no step was ever recorded.
    switched_on = (
        "Synchronization debug mode is a prototype feature and does not yet detect all "
        "synchronizing operations (Triggered internally at "
        "/pytorch/torch/csrc/cuda/Module.cpp:1003.)"
    )
    waited = "called a synchronizing CUDA operation (Triggered internally at ...)"
    assert graphed_step.host_waits_among([switched_on]) == []
    assert graphed_step.host_waits_among([switched_on, waited, "other"]) == [waited]


# -- the default: on for digits on one CUDA device, where the options allow a graph ----------


def _chosen(data="digits", device="cuda", distributed=False, amp_dtype="float32", **options):
    from types import SimpleNamespace

    from torchkit.core.train.setup import _resolve_cuda_graphs

    ctx = SimpleNamespace(device=torch.device(device), is_distributed=distributed)
    config = TrainConfig(data=data, **options)
    return _resolve_cuda_graphs(ctx, config, amp_dtype)


def test_the_digits_job_on_one_cuda_device_is_graphed_by_default():
    # torch.device("cuda") needs no GPU: the choice reads the device's type alone.
    chosen = _chosen()
    assert chosen.cuda_graphs is True and "cuda_graphs" in chosen.data_defaults


@pytest.mark.parametrize(
    "case",
    [
        {"device": "cpu"},
        {"data": "some/folder"},
        {"distributed": True},
        {"amp_dtype": "float16"},
        {"mixup_alpha": 0.2},
        {"optimizer": "rmsprop"},
        {"accum_steps": 2},
        {"compile": True},
    ],
)
def test_where_a_graph_cannot_record_the_step_the_default_is_eager_not_an_error(case):
    chosen = _chosen(**case)
    assert chosen.cuda_graphs is False and "cuda_graphs" in chosen.data_defaults


def test_a_given_cuda_graphs_is_kept_as_given():
    assert _chosen(cuda_graphs=False).cuda_graphs is False
    given = _chosen(device="cpu", cuda_graphs=True)  # refused later, by refuse_ungraphable_run
    assert given.cuda_graphs is True and "cuda_graphs" not in given.data_defaults


def test_a_resumed_run_chooses_again_unless_given_or_asked_for_at_the_start():
    from torchkit.core.train.resume_merge import merge_for_resume

    chosen_on_a_gpu = {**TrainConfig(data="digits").to_dict(), "cuda_graphs": True}
    chosen_on_a_gpu["data_defaults"] = ["cuda_graphs", "model"]
    resumed = TrainConfig(resume="run")
    assert merge_for_resume(chosen_on_a_gpu, resumed, []).cuda_graphs is None
    given = dataclasses.replace(resumed, cuda_graphs=False)
    assert merge_for_resume(chosen_on_a_gpu, given, ["cuda_graphs"]).cuda_graphs is False
    asked_for = {**chosen_on_a_gpu, "data_defaults": ["model"]}
    assert merge_for_resume(asked_for, resumed, []).cuda_graphs is True
