"""Under torchrun, a rank that fails alone is the run's one error line: the rank torchrun's agent
then stops (SIGTERM) ends quietly with the failed rank's code, while a SIGTERM with no rank failed
still says `Terminated.` (train/ddp.one_line_per_failure)."""

from __future__ import annotations

import signal
import textwrap
from types import SimpleNamespace

import pytest
import torch
from gloo_ranks import run_ranks, run_ranks_under_agent
from image_folders import write_image_folder
from suite_paths import HELPERS

from torchkit.core.io.errors import DeviceError, Terminated, UsageError
from torchkit.core.runtime.distributed import DistContext
from torchkit.core.train import ddp
from torchkit.core.train.interface import TrainCallbacks

# A sitecustomize for the ranks: rank 0 cannot put best.pt in place (a full disk, as if its
# disk alone were full); the other ranks are untouched.
BEST_PT_FAILS_ON_RANK_0 = textwrap.dedent(
    """
    import os, sys

    def _hook(event, args):
        if event in ("os.rename", "os.replace", "os.link") and str(args[1]).endswith("best.pt"):
            raise OSError(28, "No space left on device (test)", str(args[1]))

    if os.environ.get("RANK") == "0":
        sys.addaudithook(_hook)
    """
)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed missing")
def test_the_rank_torchrun_stops_after_rank_0_fails_alone_prints_nothing(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BEST_PT_FAILS_ON_RANK_0)
    data = tmp_path / "data"
    for split, seed in (("train", 1), ("val", 2), ("test", 3)):
        write_image_folder(data / split, {"a": 2, "b": 2}, seed=seed)
    rank0, rank1 = run_ranks_under_agent(
        "train", "--data", data, "--model", "nets:TinyNet", "--image-size", "8",
        "--batch-size", "2", "--epochs", "1", "--workers", "0", "--device", "cpu",
        "--out", tmp_path / "run", env={"PYTHONPATH": f"{site}:{HELPERS}"}, timeout=120,
    )  # fmt: skip
    assert rank0.returncode == 1, rank0.stderr[-2000:]
    assert "Error: cannot write" in rank0.stderr and "best.pt" in rank0.stderr
    # It was "Terminated." below rank 0's error (or a line of its own: "another process of the
    # run ended"), as if it had been stopped for itself. Its code is rank 0's where it can read
    # it: torchrun's agent serves the store; here rank 0 did, and went with it (143).
    assert rank1.stderr == "" and rank1.returncode in (1, 143), rank1.stderr[-2000:]


def rank(number: int) -> DistContext:
    return DistContext(rank=number, world_size=2)  # no group of its own: nothing is recorded


@pytest.mark.parametrize("agent", [True, False])
def test_a_sigterm_with_no_rank_failed_still_ends_with_terminated(monkeypatch, agent):
    # A user's kill (no rank recorded a failure), or no torchrun agent: as in every command.
    monkeypatch.setattr(ddp.distributed, "peer_failure_code", lambda ctx: None if agent else 1)
    monkeypatch.setattr(ddp, "under_torchrun_agent", lambda: agent)
    with pytest.raises(Terminated), ddp.one_line_per_failure(rank(1)):
        raise Terminated()


@pytest.fixture
def signal_handlers_kept():
    """The SIGTERM and SIGINT handlers put back after a test of a rank that ignores them."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


@pytest.mark.parametrize("number", [0, 1])
def test_a_rank_stopped_after_another_failed_ends_with_its_code_quietly(
    monkeypatch, signal_handlers_kept, number
):
    # Rank 0 too: it said `Terminated.` (or "another process of the run ended") below the
    # failed rank's own error, two failures for one.
    monkeypatch.setattr(ddp.distributed, "peer_failure_code", lambda ctx: 2)
    monkeypatch.setattr(ddp, "under_torchrun_agent", lambda: True)
    with pytest.raises(DeviceError) as caught, ddp.one_line_per_failure(rank(number)):
        raise Terminated()
    assert caught.value.reported_by_another_rank and caught.value.exit_code == 2


def test_rank_0_stopped_after_another_failed_prints_nothing(
    monkeypatch, signal_handlers_kept, tmp_path
):
    """Through the CLI: rank 0's run stopped by torchrun's SIGTERM after rank 1 recorded its
    failure ends with rank 1's code and no line of its own."""
    from processes import run_torchkit_in_process

    from torchkit.core.train import runner

    def stopped(*args, **kwargs):
        raise Terminated()

    monkeypatch.setattr(runner, "_train", stopped)
    monkeypatch.setattr(ddp.distributed, "peer_failure_code", lambda ctx: 1)
    monkeypatch.setattr(ddp, "under_torchrun_agent", lambda: True)
    done = run_torchkit_in_process(
        "train", "--data", "digits", "--model", "nets:TinyNet", "--epochs", "1",
        "--device", "cpu", "--out", tmp_path / "run",
    )  # fmt: skip
    assert (done.returncode, done.stderr, done.stdout) == (1, "", "")


def test_a_rank_that_fails_with_its_own_error_records_it(monkeypatch):
    recorded = []
    monkeypatch.setattr(ddp.distributed, "record_failure", lambda ctx, code: recorded.append(code))
    with pytest.raises(UsageError), ddp.one_line_per_failure(rank(0)):
        raise UsageError("bad")
    with pytest.raises(OSError), ddp.one_line_per_failure(rank(1)):
        raise OSError("disk")
    with pytest.raises(KeyboardInterrupt), ddp.one_line_per_failure(rank(1)):
        raise KeyboardInterrupt()  # Ctrl-C is no failure
    assert recorded == [2, 1]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed missing")
def test_the_failed_ranks_code_reaches_the_others_through_the_store(monkeypatch):
    """record_failure and peer_failure_code through a real store, as torchrun's agent serves
    it: nothing while no rank failed, the failed rank's code once it recorded one, and 143
    once the store's server is gone."""
    from gloo_ranks import free_port
    from torch.distributed import TCPStore, distributed_c10d

    from torchkit.core.runtime import distributed
    from torchkit.core.runtime.distributed import DistContext

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setattr(distributed_c10d, "_get_default_store", lambda: store)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    failed, stopped = (DistContext(rank=r, world_size=2, initialised_here=True) for r in (0, 1))
    assert distributed.peer_failure_code(stopped) is None
    distributed.record_failure(failed, 2)
    assert distributed.peer_failure_code(stopped) == 2
    assert distributed.peer_failure_code(DistContext(rank=1, world_size=2)) is None  # joined
    assert distributed.peer_failure_code(failed) == 2  # rank 0 reads another rank's failure
    monkeypatch.setenv("MASTER_PORT", str(free_port()))  # no server there
    assert distributed.peer_failure_code(stopped) == 143
    # Rank 0 outlived the store's server: torchrun's agent, not a failed rank, is gone.
    assert distributed.peer_failure_code(failed) is None


def test_a_peer_lost_without_a_word_is_told_to_look_at_torchruns_report():
    """Rank 1 killed (SIGKILL) says nothing and records nothing: rank 0's one line pointed at
    rank 1's "own output", which is empty; torchrun's report names the signal."""
    ctx = SimpleNamespace(rank=0, is_main=True, is_distributed=True)
    error = RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer")
    described = ddp.describe_collective_failure(ctx, error, None)
    assert str(described) == (
        "rank 0: another process of the run ended (its own output says why; torchrun's report "
        "names one that was killed outright)"
    )


class _AskedToStop(TrainCallbacks):
    """This rank's own Ctrl-C or SIGTERM, noted while it waited in a collective."""

    def __init__(self, signum: int) -> None:
        self.signum = signum

    def should_stop(self) -> bool:
        return self.signum != 0

    def stop_signal(self) -> int:
        return self.signum


@pytest.mark.parametrize(
    ("signum", "peer_stopped", "ends_with"),
    [
        (signal.SIGTERM, True, Terminated),
        (signal.SIGINT, True, KeyboardInterrupt),
        (0, True, DeviceError),
        (signal.SIGTERM, False, DeviceError),
    ],
)
def test_a_rank_stopped_with_the_group_after_training_ends_stopped_not_with_a_lost_peer(
    monkeypatch, signum, peer_stopped, ends_with
):
    """A signal to torchrun (Ctrl-C in its terminal, `kill`) in the test evaluation: rank 0
    ends at once, while rank 1, told too, waits for it in a collective that then loses it.
    Rank 1 said `Error: rank 1: another process of the run ended` under rank 0's
    `Terminated.` (seen with a real torchrun); it ends stopped as well. A rank that was told
    nothing still says it lost a peer, and so does one whose lost peer recorded no stop of its
    own: killed outright (the OOM killer, a crash), after which torchrun's agent sends SIGTERM
    to the others. That rank said `Terminated.` and hid the loss (6 runs in 6 with a real
    torchrun and --workers 2, rank 0 SIGKILLed in training or in the test evaluation)."""
    from torchkit.core.train import runner

    def lost_rank_0(ctx, plan, folder, callbacks, timeline, join):
        join.tried = True  # joined: the group is not joined again on the way out
        raise RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [::1]:1")

    monkeypatch.setattr(runner, "_train", lost_rank_0)
    monkeypatch.setattr(
        runner.distributed,
        "place",
        lambda device: DistContext(rank=1, world_size=2, device=torch.device("cpu")),
    )
    monkeypatch.setattr(ddp.distributed, "peer_stopped", lambda ctx: peer_stopped)
    plan = SimpleNamespace(config=SimpleNamespace(device="cpu", dist_timeout=None))
    with pytest.raises(BaseException) as caught:  # a stop, caught as such: not this test's
        runner._run_on_device(plan, None, _AskedToStop(signum), None)
    assert type(caught.value) is ends_with
    if ends_with is DeviceError:
        assert "another process of the run ended" in str(caught.value)


@pytest.mark.parametrize("agent", [True, False])
def test_a_rank_that_ends_on_its_own_stop_records_it_under_the_agent(
    monkeypatch, signal_handlers_kept, agent
):
    """Where torchrun's agent serves the store (it outlives rank 0), a rank ended at once by
    its own Ctrl-C or SIGTERM records that for the ranks that lose it; one stopped after
    another rank failed, or failing with its own error, records no stop."""
    recorded = []
    monkeypatch.setattr(ddp.distributed, "record_stop", lambda ctx, signum: recorded.append(signum))
    monkeypatch.setattr(ddp.distributed, "record_failure", lambda ctx, code: None)
    monkeypatch.setattr(ddp, "under_torchrun_agent", lambda: agent)
    failed = {"code": None}
    monkeypatch.setattr(ddp.distributed, "peer_failure_code", lambda ctx: failed["code"])
    for stop in (Terminated(), KeyboardInterrupt()):
        with pytest.raises(type(stop)), ddp.one_line_per_failure(rank(0)):
            raise stop
    with pytest.raises(OSError), ddp.one_line_per_failure(rank(0)):
        raise OSError("disk")
    if agent:
        failed["code"] = 1
        with pytest.raises(DeviceError), ddp.one_line_per_failure(rank(1)):
            raise Terminated()
    assert recorded == ([signal.SIGTERM, signal.SIGINT] if agent else [])


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed missing")
def test_a_ranks_stop_reaches_the_others_through_the_store(monkeypatch):
    """record_stop and peer_stopped through a real store, as torchrun's agent serves it."""
    from gloo_ranks import free_port
    from torch.distributed import TCPStore, distributed_c10d

    from torchkit.core.runtime import distributed

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setattr(distributed_c10d, "_get_default_store", lambda: store)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    stopped, waiting = (DistContext(rank=r, world_size=2, initialised_here=True) for r in (0, 1))
    distributed.record_failure(stopped, 2)  # a failure is no stop
    assert not distributed.peer_stopped(waiting)
    distributed.record_stop(stopped, signal.SIGTERM)
    assert distributed.peer_stopped(waiting)
    assert distributed.peer_failure_code(waiting) == 2  # each read on its own
    monkeypatch.setenv("MASTER_PORT", str(free_port()))  # no server there: nothing known
    assert not distributed.peer_stopped(waiting)


# A sitecustomize for the ranks: rank 1 notes its process id; rank 0, reading best.pt for the
# test evaluation, sends rank 1 the SIGTERM torchrun's agent forwards, then ends as $END says:
# on the same SIGTERM (a signal to torchrun), or killed outright (the kernel's OOM killer).
SIGNAL_AT_THE_TEST_EVALUATION = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path

    pids = Path(os.environ["PIDS"])
    if os.environ.get("RANK") == "1":
        pids.joinpath("1").write_text(str(os.getpid()))

    def _hook(event, args):
        if event == "open" and str(args[0]).endswith("best.pt") and str(args[1]) == "r":
            if pids.joinpath("0").exists():
                return
            pids.joinpath("0").write_text(str(os.getpid()))
            os.kill(int(pids.joinpath("1").read_text()), signal.SIGTERM)
            end = signal.SIGTERM if os.environ["END"] == "stop" else signal.SIGKILL
            os.kill(os.getpid(), end)

    if os.environ.get("RANK") == "0":
        sys.addaudithook(_hook)
    """
)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed missing")
@pytest.mark.parametrize(
    ("end", "rank1_code", "rank1_says"),
    [
        ("stop", 143, "Terminated.\n"),
        (
            "killed",
            1,
            "Error: rank 1: another process of the run ended (its own output says why; "
            "torchrun's report names one that was killed outright)\n",
        ),
    ],
)
def test_a_rank_signalled_with_rank_0_ends_stopped_only_where_rank_0_stopped(
    tmp_path, end, rank1_code, rank1_says
):
    """Rank 1 told to stop as rank 0 ends in the test evaluation, the store served apart
    from the ranks (as torchrun's agent serves it): rank 0 ended on the same stop, and rank 1
    says `Terminated.`; rank 0 killed outright (torchrun's SIGTERM to rank 1 follows), and
    rank 1 says it lost a process, where it said `Terminated.` and hid the loss."""
    from torch.distributed import TCPStore

    site, pids = tmp_path / "site", tmp_path / "pids"
    site.mkdir(), pids.mkdir()
    (site / "sitecustomize.py").write_text(SIGNAL_AT_THE_TEST_EVALUATION)
    data = tmp_path / "data"
    for split, seed in (("train", 1), ("val", 2), ("test", 3)):
        write_image_folder(data / split, {"a": 2, "b": 2}, seed=seed)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = {"PYTHONPATH": f"{site}:{HELPERS}", "PIDS": str(pids), "END": end}
    env |= {"TORCHELASTIC_RUN_ID": "test", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    env["MASTER_PORT"] = str(store.port)
    # Each rank ends by itself: the one SIGTERM rank 1 gets is the hook's (a second one, as
    # run_ranks_under_agent sends after rank 0 ends, would end it at once, as designed).
    rank0, rank1 = run_ranks(
        "train", "--data", data, "--model", "nets:TinyNet", "--image-size", "8",
        "--batch-size", "2", "--epochs", "1", "--workers", "0", "--device", "cpu",
        "--out", tmp_path / "run", env=env, timeout=120,
    )  # fmt: skip
    assert rank0.returncode == (143 if end == "stop" else -signal.SIGKILL), rank0.stderr[-2000:]
    assert (rank1.returncode, rank1.stderr) == (rank1_code, rank1_says)
    if end == "stop":  # the run as trained (rank 0 killed outright leaves what it leaves)
        assert (tmp_path / "run" / "last.pt").is_file()
