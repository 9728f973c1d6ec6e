"""--cuda-graphs on a CUDA GPU: the recorded step trains as the eager one does, the digits job
runs on it, and a step that cannot be recorded falls back to eager steps with a warning. The
step itself is checked on the CPU in test_graphed_step.py. `uv run pytest -m cuda`."""

from __future__ import annotations

import json

import pytest
import torch
from graphed_training import SmallNet, batches, make_context, train, weights

from torchkit.cli import app
from torchkit.core.train.graphed_step import WARMUP_UPDATES, GraphedStep

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
pytestmark = [pytest.mark.cuda, needs_cuda]


def _on_cuda(ctx, model=None, *, dropout: bool = True):
    """`ctx` (test_graphed_step.make_context) moved to the GPU, its optimiser rebuilt there;
    without `dropout`, whose masks under a graph come from the generator's offsets as torch
    arranges them for replays, not necessarily the eager run's."""
    from torchkit.core.train.config import TrainConfig
    from torchkit.core.train.ema import ModelEMA
    from torchkit.core.train.optim import LRSchedule, build_optimizer, param_groups

    device = torch.device("cuda")
    model = (model or ctx.model).to(device)
    if not dropout:
        model.drop = torch.nn.Identity()
    config = TrainConfig(optimizer="adamw", lr=0.05, warmup_epochs=1, epochs=3, weight_decay=0.01)
    groups = param_groups(model, config)
    ctx.model = ctx.module = model
    ctx.optimizer = build_optimizer(groups, config)
    ctx.schedule = LRSchedule(ctx.optimizer, config, updates_per_epoch=6)
    ctx.ema = ModelEMA(model, 0.9)
    ctx.device = device
    ctx.l1_params = []
    return ctx


def _cuda_batches(count):
    return [
        type(batch)(batch.images.cuda(), batch.labels.cuda(), batch.indices, [])
        for batch in batches(count)
    ]


@pytest.fixture
def deterministic_cudnn():
    saved = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    yield
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved


def test_the_recorded_step_trains_as_the_eager_step_does(deterministic_cudnn):
    data = _cuda_batches(6)
    eager = _on_cuda(make_context(), dropout=False)
    eager_progress = train(eager, data)
    graphed = _on_cuda(make_context(), dropout=False)
    graphed.graphed = GraphedStep(graphed, "float32", 8)
    graphed_progress = train(graphed, data)
    assert graphed.graphed.graph is not None and graphed.graphed.not_recorded is None
    assert graphed.graphed.replays == 12 - WARMUP_UPDATES
    for name, value in weights(eager).items():
        torch.testing.assert_close(weights(graphed)[name], value, rtol=1e-4, atol=1e-5, msg=name)
    for ours, theirs in zip(graphed_progress, eager_progress, strict=True):
        assert ours.loss_sum == pytest.approx(theirs.loss_sum, rel=1e-4)
        assert ours.correct == theirs.correct


class SyncingNet(SmallNet):
    """A forward that reads a value on the host: it cannot be recorded."""

    def forward(self, x):
        if float(x.abs().sum()) < 0:  # never true, but a host sync all the same
            x = -x
        return super().forward(x)


def test_a_step_that_reads_the_host_is_not_recorded_and_trains_eagerly(caplog):
    """torch's sync debugging in the last warm-up update finds the host read: no capture is
    tried (a failed one would leave CUDA's generator in capture mode), and the run goes on."""
    data = _cuda_batches(6)
    ctx = _on_cuda(make_context(), SyncingNet())
    ctx.graphed = GraphedStep(ctx, "float32", 8)
    train(ctx, data, epochs=1)
    assert ctx.graphed.graph is None and ctx.graphed.not_recorded
    assert "--cuda-graphs: the training step is not recorded" in caplog.text
    assert ctx.graphed.eager_updates == 6 - WARMUP_UPDATES
    assert all(torch.isfinite(v).all() for v in weights(ctx).values())
    assert torch.cuda.get_sync_debug_mode() == 0  # put back


@pytest.mark.parametrize("given", [["--cuda-graphs"], []], ids=["given", "by-default"])
def test_the_digits_job_with_cuda_graphs(runner, tmp_path, given):
    out = tmp_path / "run"
    result = runner.invoke(
        app,
        ["train", "--data", "digits", "--device", "cuda", *given, "--out", str(out),
         "--epochs", "8", "-v", "--format", "json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["options"]["cuda_graphs"] is True
    assert ("cuda_graphs" in config["defaults_from_data"]) is not given
    assert f"--cuda-graphs: captured after {WARMUP_UPDATES} eager updates" in result.stderr
    assert "updates replayed from the graph" in result.stderr
    summary = json.loads(result.stdout)
    assert summary["test_top1"] >= 0.95


def test_dropout_draws_a_new_mask_at_every_replay():
    """The graph takes its random numbers from the generator's state at each replay, so
    dropout is not frozen into the recording: with a learning rate too small to matter, the
    same batch's loss changes from replay to replay only through the mask."""
    from torchkit.core.train.config import TrainConfig
    from torchkit.core.train.optim import LRSchedule, build_optimizer, param_groups

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(36, 3), torch.nn.Dropout(0.5)
    ).cuda()
    config = TrainConfig(optimizer="sgd", lr=1e-9, warmup_epochs=0, epochs=1, momentum=0.0)
    optimizer = build_optimizer(param_groups(model, config), config)
    ctx = make_context()
    ctx.model = ctx.module = model
    ctx.optimizer, ctx.ema, ctx.device, ctx.l1_params = optimizer, None, torch.device("cuda"), []
    ctx.schedule = LRSchedule(optimizer, config, updates_per_epoch=12)
    step = GraphedStep(ctx, "float32", 8)
    (batch,) = _cuda_batches(1)
    losses, previous = [], 0.0
    for number in range(1, 13):
        step.step(batch.images, batch.labels, number)
        total = float(step.sums.loss_sum)
        losses.append(round(total - previous, 5))
        previous = total
    assert step.replays == 12 - WARMUP_UPDATES
    assert len(set(losses[WARMUP_UPDATES:])) > 1  # the replays' masks differ
