"""`torchkit train` on 2 Gloo CPU processes (started as torchrun starts its ranks: gloo_ranks.py)
tells the truth and never hangs: a rank whose batch was all unreadable keeps in step, validation
uses the BatchNorm statistics that best.pt holds, a signal to any rank stops every rank with
last.pt saved, a stopped run resumes exactly (every rank's random state and sums), only rank 0
opens files in the run folder, and a rank that stops answering ends the run after --dist-timeout
instead of hanging.

The network is named on the command line as `nets:BNNet` (tests/helpers/nets.py, on the ranks'
PYTHONPATH). Its fault injection is driven by environment variables read in each rank:
TORCHKIT_TEST_SIGNAL=RANK:N:SIGNAL sends SIGNAL (INT or TERM) to rank RANK on its N-th training
forward pass; TORCHKIT_TEST_HANG=RANK:N:SECONDS makes that rank stop answering for SECONDS there;
TORCHKIT_TEST_VOTE_EVERY_UPDATE=1 makes the ranks vote on stopping after every update (as they
do when updates are slow), so a stop lands inside an epoch at an exact update."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import textwrap
import time
import types
from pathlib import Path

import pytest
import torch
from gloo_ranks import finish, run_ranks, start_ranks, stderr_of
from image_folders import write_image_folder
from nets import BNNet
from processes import killed, run_torchkit_in_process
from suite_paths import HELPERS
from torch import nn

from torchkit.core.runtime import distributed as dist_utils

NET = "nets:BNNet"

# A sitecustomize for the ranks: with TORCHKIT_TEST_NO_SHARED_FS=OUT, every access of a rank to a
# path in OUT is logged to TORCHKIT_TEST_AUDIT_LOG.RANK, and refused on ranks other than 0, as
# if OUT were on a disk only rank 0's node has; the modules of torch._dynamo a rank imports are
# logged to TORCHKIT_TEST_AUDIT_LOG.imports.RANK.
NO_SHARED_FS = textwrap.dedent(
    """
    import os, sys

    _out, _rank = os.environ.get("TORCHKIT_TEST_NO_SHARED_FS"), os.environ.get("RANK")
    _EVENTS = {"open", "os.listdir", "os.scandir", "os.mkdir", "os.remove", "os.rename",
               "os.replace", "os.rmdir", "os.unlink", "os.truncate", "shutil.rmtree"}
    _busy = []

    def _hook(event, args):
        if _busy or not args:
            return
        if event == "import" and str(args[0]).startswith("torch._dynamo"):
            _busy.append(1)
            try:
                with open(os.environ["TORCHKIT_TEST_AUDIT_LOG"] + ".imports." + _rank, "a") as log:
                    log.write(f"import {args[0]}\\n")
            finally:
                _busy.pop()
            return
        if event not in _EVENTS:
            return
        if not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        _busy.append(1)
        try:
            path = os.path.realpath(os.fsdecode(args[0]))
            if path != _out and not path.startswith(_out + os.sep):
                return
            with open(os.environ["TORCHKIT_TEST_AUDIT_LOG"] + "." + _rank, "a") as log:
                log.write(f"{event} {path}\\n")
        finally:
            _busy.pop()
        if _rank != "0":
            raise PermissionError(13, "no shared file system on this rank (test)", path)

    if _out and _rank is not None:
        _out = os.path.realpath(_out)
        sys.addaudithook(_hook)
    """
)


def recipe(data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "train", "--data", str(data), "--model", NET, "--image-size", "8", "--batch-size", "1",
        "--epochs", "2", "--workers", "0", "--device", "cpu", "--out", str(out),
        "--format", "json", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """9 training images, one of them unreadable: with --batch-size 1 on 2 ranks (5 batches
    each), one rank gets a batch with no image while the other trains. The 6th test image is
    unreadable too: rank 1 alone reads it (every 2nd image from the 2nd)."""
    root = tmp_path_factory.mktemp("ddp") / "data"
    write_image_folder(root / "train", {"a": 4, "b": 4}, seed=1)
    (root / "train" / "a" / "zz_corrupt.png").write_bytes(b"not a png")
    write_image_folder(root / "val", {"a": 3, "b": 3}, seed=2)
    write_image_folder(root / "test", {"a": 2, "b": 3}, seed=3)
    (root / "test" / "b" / "zz_corrupt.png").write_bytes(b"not a png")
    return root


@pytest.fixture(scope="module")
def uninterrupted(data):
    """One uninterrupted 2-rank run in which rank 1 cannot open anything in the run folder."""
    out = data.parent / "uninterrupted"
    audit = data.parent / "no-shared-fs"
    audit.mkdir()
    (audit / "sitecustomize.py").write_text(NO_SHARED_FS)
    started = time.monotonic()
    ranks = run_ranks(
        *recipe(data, out),
        env={
            "PYTHONPATH": f"{audit}{os.pathsep}{HELPERS}",
            "TORCHKIT_TEST_NO_SHARED_FS": str(out),
            "TORCHKIT_TEST_AUDIT_LOG": str(audit / "log"),
        },
    )
    # As torchrun reports a run: rank 0's output and code (each rank's if one failed), and
    # every rank's stderr.
    code = next((done.returncode for done in ranks if done.returncode), 0)
    done = subprocess.CompletedProcess(ranks[0].args, code, ranks[0].stdout, stderr_of(ranks))
    return out, done, time.monotonic() - started, audit / "log"


pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="torch.distributed missing"
)


def summary_of(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def evaluate_in_process(runner, checkpoint: Path, data: Path, split: str) -> dict:
    from torchkit.cli import app

    done = runner.invoke(
        app,
        ["eval", str(checkpoint), "--data", str(data), "--split", split, "--format", "json"]
        + ["--trust-checkpoint"]  # the run's model is code (BNNet)
        + ["--device", "cpu"]  # the run's numbers are the CPU's
        + ["-j", "0"],  # read in this process: no loader worker forked beside xdist's thread
    )
    assert done.exit_code == 0, done.stderr
    return json.loads(done.stdout)


# -- a rank with an empty batch --------------------------------------------------------------------


def test_a_rank_whose_batch_is_all_unreadable_keeps_in_step_instead_of_hanging(uninterrupted, data):
    """Before: the rank with the corrupt image skipped forward and backward while the other
    waited in DDP's gradient all-reduce, forever (here: until the 120 s timeout)."""
    out, done, seconds, _ = uninterrupted
    summary = summary_of(done)
    assert summary["world_size"] == 2 and summary["epochs"] == 2
    # Rank 1's unreadable test image is warned of and counted by rank 0, which alone prints
    # (before: silently skipped, and the count held rank 0's images only).
    assert summary["skipped_images"] == 2
    for image in ("train/a/zz_corrupt.png", "test/b/zz_corrupt.png"):
        assert done.stderr.count(f"skipped unreadable image {data / image}") == 1
    last = torch.load(out / "last.pt", weights_only=True)
    assert last["global_step"] == 10  # 5 batches of 1 per rank and epoch: none was dropped
    # A hang would have failed the run above (run_ranks: a rank not ended within 120 s).


class TinyLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3 * 8 * 8, 2)


def test_the_empty_batch_adds_nothing_and_a_model_that_cannot_run_one_is_one_error():
    """What the rank with no readable image runs: zero gradients, BatchNorm's running statistics
    untouched; a model that cannot take an empty batch is an InputError on that rank (torchrun
    then stops the others), never a rank that silently skips the collectives."""
    from torchkit.core.io.errors import InputError
    from torchkit.core.train.loop import StepContext, _empty_step

    model = BNNet().train()
    before = {k: v.clone() for k, v in model.state_dict().items() if "running" in k}
    ctx = StepContext(model, model, None, None, None, torch.device("cpu"), input_shape=(3, 8, 8))
    _empty_step(ctx, is_update=True, batch=1)
    assert all(float(p.grad.abs().sum()) == 0 for p in model.parameters())
    for key, value in before.items():
        assert torch.equal(model.state_dict()[key], value), key

    class Flattens(TinyLinear):  # the tutorials' `x.view(x.size(0), -1)`: not for 0 images
        def forward(self, x):
            return self.fc(x.view(x.size(0), -1))

    rigid = Flattens()
    ctx = StepContext(rigid, rigid, None, None, None, torch.device("cpu"), input_shape=(3, 8, 8))
    with pytest.raises(
        InputError, match="every image of batch 4 of this process was unreadable"
    ) as caught:
        _empty_step(ctx, is_update=True, batch=4)
    assert caught.value.hint == "fix or remove the unreadable images the warnings name"


def test_a_parameter_the_output_does_not_use_is_one_error_at_the_first_update():
    """DDP waits for a gradient of every trainable parameter: a model with a layer its forward
    never calls (it trains in one process) failed at its second step with torch's "Expected to
    have finished reduction in the prior iteration", printed by every rank and advising DDP
    arguments torchkit does not take. The first update now names the parameters, as an error
    the ranks agree on (an all-reduce; here a world of one), before any weight changes."""
    import functools

    from graphed_training import batches, make_context

    from torchkit.core.io.errors import UsageError
    from torchkit.core.runtime import dynamo_free
    from torchkit.core.train import ddp, loop

    dynamo_free.mark_not_compiled()  # as training does: torch.optim imports dynamo (seconds)

    def context(*, frozen: bool):
        ctx = make_context(ema=False)
        ctx.module.unused = nn.Linear(2, 2).requires_grad_(not frozen)  # never called
        ctx.check_gradients = functools.partial(
            ddp.refuse_untrained_parameters, dist_utils.DistContext(), ctx.module
        )
        return ctx

    def train(ctx) -> None:
        progress, unreadable = loop.EpochProgress(), loop.UnreadableImages(False)
        loop.train_one_epoch(ctx, batches(2), progress, unreadable, epoch=1)

    ctx = context(frozen=False)
    before = {k: v.clone() for k, v in ctx.module.named_parameters()}
    with pytest.raises(
        UsageError, match=r"parameters unused\.weight, unused\.bias take no part"
    ) as caught:
        train(ctx)
    assert caught.value.hint == (
        "remove them from the model, or freeze them with requires_grad=False; or train in one "
        "process"
    )
    for key, value in ctx.module.named_parameters():
        assert torch.equal(value, before[key]), key
    frozen = context(frozen=True)  # DDP leaves parameters without requires_grad out
    train(frozen)
    assert frozen.check_gradients is None  # checked once, at the first update


# -- validation with BatchNorm -------------------------------------------------------------------


def test_validation_under_ddp_measures_the_weights_best_pt_holds(uninterrupted, data, runner):
    """Every rank validates with rank 0's BatchNorm statistics, the ones saved: `eval best.pt`
    gives metrics.csv's numbers (before: each rank used its own, and they differed)."""
    out, done, _, _ = uninterrupted
    summary = summary_of(done)
    row = summary["history"][summary["best_epoch"] - 1]
    report = evaluate_in_process(runner, out / "best.pt", data, "val")
    assert report["num_images"] == 6
    assert report["accuracy"] == row["val_top1"]
    # The same images and weights; only the order of the float sums differs.
    assert report["loss"] == pytest.approx(row["val_loss"], rel=1e-6, abs=0)
    csv_row = (out / "metrics.csv").read_text().splitlines()[summary["best_epoch"]].split(",")
    assert float(csv_row[3]) == pytest.approx(report["loss"], rel=1e-5, abs=0)


# -- the ranks' start-up ----------------------------------------------------------------------


def test_ddp_ranks_that_do_not_compile_never_import_dynamo(uninterrupted):
    """Wrapping the model in DistributedDataParallel and its first forward imported
    torch._dynamo (inductor, sympy) in every rank: seconds of each rank's start."""
    _, done, _, audit_log = uninterrupted
    summary_of(done)
    for rank in (0, 1):
        imports = Path(f"{audit_log}.imports.{rank}")
        assert not imports.exists(), imports.read_text()


# -- the test evaluation without a shared file system ---------------------------------------------


def test_only_rank_0_opens_the_run_folder_and_sends_best_pt_to_the_others(
    uninterrupted, data, runner
):
    """Rank 1 was refused every access to the run folder (as on a node without the disk): the
    run still succeeded, and its test numbers are best.pt's (before: every rank read best.pt)."""
    out, done, _, audit_log = uninterrupted
    summary = summary_of(done)
    assert not Path(f"{audit_log}.1").exists(), Path(f"{audit_log}.1").read_text()
    assert f"open {out / 'best.pt'}" in Path(f"{audit_log}.0").read_text()  # the hook works
    report = evaluate_in_process(runner, out / "best.pt", data, "test")
    assert summary["test_weights"] == "best.pt" and summary["test_size"] == 6
    assert summary["test_top1"] == report["accuracy"]
    assert summary["test_loss"] == pytest.approx(report["loss"], rel=1e-6, abs=0)


# -- a signal to one rank, and exact resume --------------------------------------------------------


@pytest.fixture(scope="module")
def interrupted(data):
    """The same run, launched as torchrun launches its ranks, with SIGTERM sent to rank 1 alone
    on its 7th training forward pass (epoch 2, batch 2): (out, [rank 0, rank 1])."""
    out = data.parent / "interrupted"
    env = {"TORCHKIT_TEST_SIGNAL": "1:7:TERM", "TORCHKIT_TEST_VOTE_EVERY_UPDATE": "1"}
    ranks = run_ranks(*recipe(data, out), env=env)
    if (out / "last.pt").is_file():  # as it was stopped (the resume test continues the run)
        shutil.copy2(out / "last.pt", data.parent / "stopped.pt")
    return out, ranks


def test_sigterm_to_rank_1_alone_stops_every_rank_with_last_pt_saved(interrupted):
    """Before: only rank 0's signals counted; rank 1 noted its SIGTERM and trained on."""
    out, (rank0, rank1) = interrupted
    # Rank 0's code is the run's (143: SIGTERM, though rank 0 was not signalled); the other
    # ranks end with 0 so that torchrun does not signal rank 0 while it saves.
    assert (rank0.returncode, rank1.returncode) == (143, 0), rank0.stderr[-2000:]
    assert f"Terminated: saved {out / 'last.pt'}" in rank0.stderr
    assert "epoch 2/2" not in rank0.stderr
    assert rank1.stdout == "" and "Error" not in rank1.stderr
    last = torch.load(out / "last.pt", weights_only=True)
    assert last["epoch"] == 1 and 0 < last["epoch_progress"]["batches"] < 5  # inside epoch 2
    assert last["world_size"] == 2 and len(last["rank_states"]) == 2


def test_a_stopped_ddp_run_resumes_exactly_as_the_uninterrupted_one(interrupted, uninterrupted):
    """Each rank gets back its own random state (dropout) and epoch sums: the resumed run ends
    with the uninterrupted run's weights, bit for bit, and the same metrics (before: rank 0's
    state was restored on both ranks, and the weights differed)."""
    out, _ = interrupted
    reference, reference_done, _, _ = uninterrupted
    rank0, rank1 = run_ranks(
        "train", "--resume", str(out), "--format", "json", "--trust-checkpoint", "--device", "cpu"
    )
    assert (rank0.returncode, rank1.returncode) == (0, 0), rank0.stderr[-3000:]
    ours = torch.load(out / "last.pt", weights_only=True)
    theirs = torch.load(reference / "last.pt", weights_only=True)
    assert ours["global_step"] == theirs["global_step"] == 10
    for key, value in theirs["model"].items():
        assert torch.equal(ours["model"][key], value), key
    resumed, expected = json.loads(rank0.stdout), summary_of(reference_done)
    for row, want in zip(resumed["history"], expected["history"], strict=True):
        for name in ("train_loss", "train_top1", "val_loss", "val_top1"):
            assert row[name] == pytest.approx(want[name], rel=1e-12, abs=1e-12), name


def test_resuming_with_another_number_of_processes_goes_on_and_says_so(
    interrupted, data, tmp_path, runner
):
    """The 2-rank checkpoint stopped inside epoch 2, resumed by one process: it trains to the
    end, warning that it cannot continue exactly, from where the epoch's images stopped."""
    from torchkit.cli import app

    out, _ = interrupted
    branch = tmp_path / "branch"
    stopped = out.parent / "stopped.pt"
    done = runner.invoke(
        app,
        ["train", "--resume", str(stopped), "--out", str(branch), "--format", "json"]
        + ["--trust-checkpoint"],  # the run's model is code (BNNet)
    )
    assert done.exit_code == 0, done.stderr
    assert "was saved by 2 process(es), this run has 1: it continues, but not exactly" in (
        done.stderr
    )
    summary = json.loads(done.stdout)
    assert summary["epochs"] == 2
    last = torch.load(branch / "last.pt", weights_only=True)
    assert last["world_size"] == 1
    # One process makes 9 updates an epoch where the 2 ranks made 5: the schedule goes on from
    # the stopped epoch's place counted in this run's updates, so the cosine ends with the run
    # (before: it kept the ranks' count, put the resumed epoch at update 5 + 2 of 18 and
    # ended 6 updates short of its end, the learning rate far from decayed).
    assert last["global_step"] == 2 * 9
    # The last update's lr: 3e-3 x the cosine at update 17 of 18, after 9 updates of warm-up.
    lr = summary["history"][-1]["lr"]
    assert lr == pytest.approx(3e-3 * 0.5 * (1 + math.cos(math.pi * 8 / 9)), rel=1e-6)


# -- --dist-timeout ------------------------------------------------------------------------------


def test_a_rank_that_stops_answering_ends_the_run_after_dist_timeout(uninterrupted, data, tmp_path):
    """Rank 1 stops answering on its 3rd step: rank 0 gives up after --dist-timeout with one
    error line (before: it waited for torch's 30 minutes).

    The timeout holds every wait of the run, also the ranks' join and their set-up's
    collectives, which a busy machine can put seconds apart: it is 3 s, or a third of what the
    same run took without a hang on this machine just now, whichever is longer.

    The collective's error is told as it is: rank 0 no longer ran the model on the meta device
    first (the check for images too small for it), which imported sympy and torch._dynamo
    (seconds of CPU before the error line)."""
    _, _, seconds, audit_log = uninterrupted
    timeout = max(3, math.ceil(seconds / 3))
    out, imports = tmp_path / "run", tmp_path / "log"
    ranks = start_ranks(
        *recipe(data, out, "--dist-timeout", str(timeout)),
        env={
            "TORCHKIT_TEST_HANG": f"1:3:{10 * timeout}",
            "PYTHONPATH": f"{audit_log.parent}{os.pathsep}{HELPERS}",  # NO_SHARED_FS's audit
            "TORCHKIT_TEST_NO_SHARED_FS": str(out),
            "TORCHKIT_TEST_AUDIT_LOG": str(imports),
        },
    )
    try:
        rank0 = finish(ranks[0], timeout=120 + timeout)
    finally:
        killed(ranks[1])
    assert rank0.returncode == 1
    errors = [line for line in rank0.stderr.splitlines() if line.startswith("Error:")]
    assert errors == [
        f"Error: rank 0: another process of the run did not answer within {timeout} s (look at "
        "the other ranks' output; raise --dist-timeout if one of them legitimately works alone "
        "that long)"
    ], rank0.stderr[-3000:]
    assert "Traceback" not in rank0.stderr
    dynamo = Path(f"{imports}.imports.0")
    assert not dynamo.exists(), dynamo.read_text()[:3000]


def test_dist_timeout_reaches_init_process_group(monkeypatch):
    from datetime import timedelta

    import torch.distributed as dist

    seen: list[dict] = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kwargs: seen.append(kwargs))
    monkeypatch.setattr(dist, "barrier", lambda: None)
    ctx = dist_utils.setup("cpu", 42.5)
    assert (ctx.rank, ctx.world_size, ctx.backend) == (1, 2, "gloo")
    dist_utils.setup("cpu")
    assert [kwargs["timeout"] for kwargs in seen] == [
        timedelta(seconds=42.5),
        timedelta(seconds=1800),  # the documented default
    ]


def test_gloo_ranks_go_on_only_once_every_rank_has_joined(monkeypatch):
    """Gloo's init can return on one rank while another still connects: a rank that then
    failed at once (`--sync-bn` on CPUs) closed its connections and broke the other's init,
    whose error read "did not all join within 1800 s: ... Connection closed by peer" (exit
    1) instead of the refusal every rank shares (seen under torchrun on a busy machine)."""
    import torch.distributed as dist

    calls: list[str] = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kwargs: calls.append("init"))
    monkeypatch.setattr(dist, "barrier", lambda: calls.append("barrier"))
    dist_utils.setup("cpu")
    assert calls == ["init", "barrier"]


def test_ranks_that_do_not_all_join_within_dist_timeout_are_one_error(monkeypatch):
    import torch.distributed as dist

    from torchkit.core.io.errors import DeviceError

    def no_peer(**kwargs):
        raise dist.DistStoreError(
            "Timed out after 3 seconds waiting for clients. 1/2 clients joined."
        )

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", no_peer)
    with pytest.raises(DeviceError) as caught:
        dist_utils.setup("cpu", 2, timeout_option="--dist-timeout")
    assert str(caught.value).startswith(
        "rank 0: the 2 processes of the run did not all join within 2 s: Timed out after 3"
    )
    assert "raise --dist-timeout" in str(caught.value)


@pytest.mark.parametrize(
    "failure",
    [
        "Connection closed by peer [127.0.0.1]:29500",  # Gloo, a rank killed while connecting
        "[c10d] failed to recv, got 0 bytes",  # the store's client, its server gone
        "unexpected error",  # any failure long before the timeout
    ],
)
def test_a_rank_that_ends_while_the_ranks_connect_is_not_called_a_timeout(monkeypatch, failure):
    """Another rank crashed or killed while the ranks connected: rank 0 failed at once, and
    its error read "the 2 processes of the run did not all join within 1800 s"."""
    import torch.distributed as dist

    from torchkit.core.io.errors import DeviceError

    def peer_gone(**kwargs):
        raise RuntimeError(failure)

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", peer_gone)
    with pytest.raises(DeviceError) as caught:
        dist_utils.setup("cpu", timeout_option="--dist-timeout")
    assert caught.value.message == (
        "rank 0: could not connect the 2 processes of the run: another process ended while "
        f"they connected ({failure})"
    )
    assert "torchrun's report names the rank that failed first" in caught.value.hint
    # The same failure at the end of the wait is one: the ranks did not all join in time.
    assert dist_utils._timed_out(RuntimeError(failure), 1799.0, 1800.0)
    assert not dist_utils._timed_out(RuntimeError(failure), 2.0, 1800.0)


@pytest.mark.parametrize("value", ["0", "-5"])
def test_a_dist_timeout_that_is_not_positive_is_a_usage_error(value, tmp_path):
    done = run_torchkit_in_process("train", "--dist-timeout", value, "--out", tmp_path / "run")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        f"Error: --dist-timeout must be a positive number of seconds, not {value}"
    )
    assert not (tmp_path / "run").exists()


# -- the stop vote ----------------------------------------------------------------------------


class OtherRank:
    """Stands in for the all-reduce (MAX) of a 2-rank world: the other rank's vote is
    `[request, -interval estimate]`; every call is recorded."""

    def __init__(self, monkeypatch, request: int = 0, estimate: int = 1000) -> None:
        self.vote = [float(request), -float(estimate)]
        self.calls: list[list[float]] = []
        monkeypatch.setattr(dist_utils, "all_reduce_max", self)

    def __call__(self, ctx, values):
        self.calls.append(list(values))
        return [max(mine, theirs) for mine, theirs in zip(values, self.vote, strict=True)]


def test_the_ranks_vote_on_stopping_every_half_second_not_after_every_update(monkeypatch):
    """Before: an all-reduce (a host sync) after every optimiser update."""
    other = OtherRank(monkeypatch)
    # Updates a microsecond apart on the vote's clock: a worker descheduled for 5 ms before
    # the first made that update look slow, and the interval 95 updates, not 1000.
    ticks = iter(range(10**6))
    clock = types.SimpleNamespace(perf_counter=lambda: next(ticks) * 1e-6)
    monkeypatch.setattr(dist_utils, "time", clock)
    vote = dist_utils.StopVote(dist_utils.DistContext(rank=0, world_size=2))
    assert not any(vote(0) for _ in range(500))  # fast updates: microseconds each
    assert len(other.calls) == 1  # the first update votes; the next vote is 1000 updates on
    assert vote.interval == dist_utils.STOP_POLL_MAX_UPDATES
    # A request waits for the next vote; between epochs the vote is forced.
    assert not vote(signal.SIGINT)
    assert vote(0, force=True) is False  # the request was withdrawn meanwhile
    assert vote(signal.SIGINT, force=True) and vote.signal == signal.SIGINT


def test_every_rank_stops_at_the_same_update_whichever_rank_asked(monkeypatch):
    other = OtherRank(monkeypatch, request=0, estimate=3)  # the other rank's updates are slow
    vote = dist_utils.StopVote(dist_utils.DistContext(rank=0, world_size=2))
    assert [vote(0) for _ in range(7)] == [False] * 7
    assert len(other.calls) == 3  # updates 1, 4 and 7: the smaller interval is the common one
    other.vote[0] = float(signal.SIGTERM)  # rank 1 is sent SIGTERM
    assert [vote(0) for _ in range(3)] == [False, False, True]
    assert vote.signal == signal.SIGTERM  # rank 0 learns which signal it was (exit code 143)


def test_slow_updates_vote_after_every_update(monkeypatch):
    other = OtherRank(monkeypatch, estimate=dist_utils.STOP_POLL_MAX_UPDATES)
    vote = dist_utils.StopVote(dist_utils.DistContext(rank=0, world_size=2), every_s=0.0)
    assert [vote(0) for _ in range(4)] + [vote(signal.SIGINT)] == [False] * 4 + [True]
    assert len(other.calls) == 5


# -- CUDA random state ----------------------------------------------------------------------------


def fake_cuda(monkeypatch, count: int) -> list[tuple[int, int]]:
    """torch.cuda with `count` visible GPUs whose RNG states are recorded; setting the state of a
    GPU that is not visible raises IndexError, as torch does once CUDA runs the queued call."""
    restored: list[tuple[int, int]] = []

    def set_rng_state(new_state, device="cuda"):
        index = device if isinstance(device, int) else (torch.device(device).index or 0)
        if index >= count:
            raise IndexError("list index out of range")
        restored.append((int(new_state[0]), index))

    def get_rng_state(device="cuda"):
        index = device if isinstance(device, int) else (torch.device(device).index or 0)
        return torch.tensor([100 + index], dtype=torch.uint8)

    def every_gpu():
        raise AssertionError("reads every GPU's state (a CUDA context on each)")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_rng_state", get_rng_state)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", every_gpu)
    monkeypatch.setattr(torch.cuda, "set_rng_state", set_rng_state)
    monkeypatch.setattr(torch.cuda.random, "set_rng_state", set_rng_state)  # set_rng_state_all's
    return restored


def test_an_older_checkpoint_of_two_gpus_resumes_on_one(monkeypatch):
    """Before: `set_rng_state_all` set GPU 1's state too, which raised IndexError."""
    from torchkit.core.runtime.seeding import capture_rng_state, restore_rng_state

    state = capture_rng_state(torch.device("cpu"))
    state["cuda"] = [torch.tensor([7], dtype=torch.uint8), torch.tensor([8], dtype=torch.uint8)]
    restored = fake_cuda(monkeypatch, count=1)
    restore_rng_state(state, torch.device("cuda", 0))
    assert restored == [(7, 0)]  # the training GPU's state, and no other


def test_each_rank_saves_its_own_gpu_s_random_state_and_restores_it_on_its_gpu(monkeypatch):
    from torchkit.core.runtime.seeding import capture_rng_state, restore_rng_state

    restored = fake_cuda(monkeypatch, count=4)
    state = capture_rng_state(torch.device("cuda", 3))  # rank 3 of a 4-GPU node
    assert [int(s[0]) for s in state["cuda"]] == [103] and state["cuda_device"] == 3
    restored_on_one = fake_cuda(monkeypatch, count=1)  # resumed where one GPU is visible
    restore_rng_state(state, torch.device("cuda", 0))
    assert restored == [] and restored_on_one == [(103, 0)]


def test_a_cuda_random_state_without_cuda_is_left_out_with_a_warning(monkeypatch, caplog):
    from torchkit.core.runtime.seeding import capture_rng_state, restore_rng_state

    state = capture_rng_state(torch.device("cpu"))
    state["cuda"] = [torch.tensor([7], dtype=torch.uint8)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    restore_rng_state(state)
    assert "CUDA random state is not restored" in caplog.text
