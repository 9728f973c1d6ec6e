"""One process setup for every command under torchrun (`torchkit.core.runtime.distributed`):
eval and predict start their process group as train does, with the same collective timeout, and end
only a group they started."""

from __future__ import annotations

import multiprocessing
from datetime import timedelta

import numpy as np
import pytest
import torch.distributed as dist
from gloo_ranks import BAD_LAUNCHES, set_launch_env
from image_folders import write_image_folder
from PIL import Image

from torchkit.core.inference.options import InferenceOptions
from torchkit.core.io.errors import DeviceError
from torchkit.core.runtime import distributed
from torchkit.core.runtime import launch as launch_variables


@pytest.fixture
def rank_without_peers(monkeypatch) -> list[dict]:
    """This process as rank 0 of a torchrun job of 2 whose other rank never comes: the process
    group's start is recorded, then fails as torch's store does when a peer is missing."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    starts: list[dict] = []

    def no_peer(**kwargs):
        starts.append(kwargs)
        raise dist.DistStoreError("Timed out after 1801 seconds waiting for clients. 1/2 joined.")

    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", no_peer)
    return starts


def _check_one_start(starts: list[dict], error: DeviceError) -> None:
    assert starts == [
        {
            "backend": "gloo",
            "rank": 0,
            "world_size": 2,
            "timeout": timedelta(seconds=distributed.DEFAULT_TIMEOUT_S),
        }
    ]
    assert error.message == (
        "rank 0: the 2 processes of the run did not all join within 1800 s: Timed out after "
        "1801 seconds waiting for clients. 1/2 joined."
    )
    # eval and predict have no --dist-timeout to suggest
    assert error.hint == "start every rank that torchrun's --nproc_per_node and --nnodes count"


def test_eval_starts_its_process_group_with_the_collective_timeout(rank_without_peers, tmp_path):
    from torchkit.core.evaluate import EvalOptions, evaluate
    from torchkit.core.models import ModelSpec

    write_image_folder(tmp_path / "data", {"a": 2, "b": 2})
    with pytest.raises(DeviceError) as caught:
        options = EvalOptions(
            data=str(tmp_path / "data"), run=InferenceOptions(device="cpu", workers=1)
        )
        evaluate(ModelSpec(model="convnet", allow_untrained=True, classes=["a", "b"]), options)
    _check_one_start(rank_without_peers, caught.value)
    # The loader's worker forked before the join stops with the failure, not at the next
    # garbage collection, whose join of it then waited 5 s (torch's status interval).
    assert multiprocessing.active_children() == []


def test_predict_starts_its_process_group_with_the_collective_timeout(rank_without_peers, tmp_path):
    from torchkit.core.models import ModelSpec
    from torchkit.core.predict.run import PredictRequest, PredictRun

    Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(tmp_path / "a.png")
    run = PredictRun(
        PredictRequest(
            spec=ModelSpec("convnet", allow_untrained=True),
            images=[str(tmp_path)],
            run=InferenceOptions(device="cpu"),
        )
    )
    with pytest.raises(DeviceError) as caught:
        run.setup()  # (the group is joined once the loader's workers are forked)
        list(run.rows())
    _check_one_start(rank_without_peers, caught.value)
    assert multiprocessing.active_children() == []  # as eval's (above)


def test_train_names_its_timeout_option_in_the_hint(rank_without_peers):
    with pytest.raises(DeviceError) as caught:
        distributed.setup("cpu", 5, timeout_option="--dist-timeout")
    assert rank_without_peers[0]["timeout"] == timedelta(seconds=5)
    assert caught.value.hint.endswith(", or raise --dist-timeout")


def test_teardown_ends_only_a_group_setup_started_and_only_once(monkeypatch):
    ended: list[str] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "destroy_process_group", lambda: ended.append("destroyed"))
    monkeypatch.setattr(dist, "barrier", lambda **kwargs: ended.append("barrier"))

    joined = distributed.DistContext(rank=0, world_size=2, backend="gloo")
    distributed.teardown(joined, wait=True)
    assert ended == []  # the caller's group stays

    started = distributed.DistContext(rank=0, world_size=2, backend="gloo", initialised_here=True)
    distributed.teardown(started, wait=True)
    distributed.teardown(started, wait=True)  # a second call has nothing left to end
    assert ended == ["barrier", "destroyed"]


@pytest.mark.parametrize(("version", "destroyed"), [("2.4.0+cu121", []), ("2.15.0", ["destroyed"])])
def test_after_a_failure_torch_2_4_leaves_the_group_to_the_exit(monkeypatch, version, destroyed):
    # torch 2.4's destroy_process_group blocked on Gloo ranks that failed together (a refused
    # run folder) until torchrun killed them; the ending process lets the OS end the group.
    import torch

    ended: list[str] = []
    monkeypatch.setattr(torch, "__version__", version)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "destroy_process_group", lambda: ended.append("destroyed"))
    failed = distributed.DistContext(rank=1, world_size=2, backend="gloo", initialised_here=True)
    distributed.teardown(failed, wait=False)
    assert ended == destroyed
    ended.clear()
    ended_well = distributed.DistContext(
        rank=1, world_size=2, backend="gloo", initialised_here=True
    )
    monkeypatch.setattr(dist, "barrier", lambda **kwargs: None)
    distributed.teardown(ended_well, wait=True)
    assert ended == ["destroyed"]  # after a last barrier it returns on every version


def test_a_group_the_caller_made_is_joined_with_its_ranks(monkeypatch):
    """Without torchrun's variables, a process group that already exists decides the ranks."""
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 3)
    monkeypatch.setattr(dist, "get_backend", lambda: "gloo")
    monkeypatch.setattr(dist, "init_process_group", lambda **kwargs: pytest.fail("started"))
    assert distributed.joins_process_group()
    ctx = distributed.setup("cpu")
    assert (ctx.rank, ctx.world_size, ctx.backend, ctx.initialised_here) == (1, 3, "gloo", False)
    assert ctx.device.type == "cpu"


@pytest.mark.parametrize(
    ("env", "launch"),
    [
        ({}, launch_variables.LaunchEnv()),
        ({"RANK": "", "WORLD_SIZE": ""}, launch_variables.LaunchEnv()),  # empty: unset
        # Blanks and leading zeros are read as torch's int() reads them: rank 0 to every reader
        # (some compared the text with "0" and took rank 0 for another rank).
        ({"RANK": " 0", "WORLD_SIZE": "2 "}, launch_variables.LaunchEnv(world_size=2)),
        ({"RANK": "00", "WORLD_SIZE": "1"}, launch_variables.LaunchEnv()),
        (
            {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"},
            launch_variables.LaunchEnv(rank=3, world_size=4, local_rank=1, local_world_size=2),
        ),
    ],
)
def test_torchruns_variables_are_read_in_one_place(monkeypatch, env, launch):
    set_launch_env(monkeypatch, env)
    assert launch_variables.launch_env() == launch
    assert launch_variables.is_main_process() == (launch.rank == 0)
    assert distributed.launched_by_torchrun() == (launch.world_size > 1)


@pytest.mark.parametrize(("env", "line"), BAD_LAUNCHES)
def test_predict_refuses_torchrun_variables_no_torchrun_sets(monkeypatch, tmp_path, env, line):
    """They were a KeyError or ValueError line (exit 1), or (RANK=x, RANK=1 alone) ignored."""
    from output_checks import error_line
    from processes import run_torchkit_in_process

    Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(tmp_path / "a.png")
    set_launch_env(monkeypatch, env)
    args = ["predict", "convnet", tmp_path / "a.png", "--allow-untrained", "--device", "cpu"]
    result = run_torchkit_in_process(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert error_line(result.stderr) == line
    assert result.stdout == ""


def test_extract_features_under_torchrun_is_refused_on_every_rank_before_any_work(
    monkeypatch, tmp_path
):
    """extract-features runs in one process: under torchrun every rank would write the same OUT
    (the second refused by its lock mid-run). Each rank says so and exits 2; nothing is made."""
    from output_checks import error_line
    from processes import run_torchkit_in_process

    images = tmp_path / "images"
    images.mkdir()
    out = tmp_path / "feats"
    for rank in ("0", "1"):
        env = {"WORLD_SIZE": "2", "RANK": rank, "LOCAL_RANK": rank, "LOCAL_WORLD_SIZE": "2"}
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        result = run_torchkit_in_process("extract-features", "convnet", images, out, cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        line = error_line(result.stderr)
        assert line.startswith("Error: extract-features runs in one process: under torchrun")
        assert line.endswith("(run it without torchrun, on the one device --device names)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images"]


def test_an_error_before_the_forks_joins_the_group_then_is_the_error(rank_without_peers):
    """A rank that fails before its loader's workers are forked joins first, as it did when
    the group came first, so the others learn of it instead of waiting for it to join; its
    own error is what it reports, not the join's."""
    ctx = distributed.place("cpu")
    with pytest.raises(ValueError, match="bad data"), distributed.JoinedAfterForks(ctx):
        raise ValueError("bad data")
    assert len(rank_without_peers) == 1 and not ctx.initialised_here


def test_ctrl_c_before_the_forks_ends_the_rank_without_joining(rank_without_peers):
    ctx = distributed.place("cpu")
    with pytest.raises(KeyboardInterrupt), distributed.JoinedAfterForks(ctx):
        raise KeyboardInterrupt
    assert rank_without_peers == []


def test_the_group_is_joined_once_at_the_forks_or_at_the_end(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    starts: list[dict] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: bool(starts))
    monkeypatch.setattr(dist, "init_process_group", lambda **kwargs: starts.append(kwargs))
    monkeypatch.setattr(dist, "barrier", lambda: None)
    ctx = distributed.place("cpu")
    assert (ctx.rank, ctx.world_size, ctx.backend) == (1, 2, None) and starts == []
    with distributed.JoinedAfterForks(ctx, 7) as join:
        join()
        join()
    assert len(starts) == 1 and starts[0]["timeout"] == timedelta(seconds=7)
    assert (ctx.backend, ctx.initialised_here) == ("gloo", True)
    starts.clear()
    monkeypatch.setattr(dist, "is_initialized", lambda: bool(starts))
    later = distributed.place("cpu")
    with distributed.JoinedAfterForks(later):
        pass  # no workers to fork: joined at the end
    assert len(starts) == 1 and later.initialised_here
