"""`torchkit train` on 2 Gloo CPU processes: it trains, only rank 0 writes and prints, and the
result matches one process with the same global batch; and two nodes, simulated on one machine
as two real torchrun agents (`--nnodes 2 --node-rank 0/1 --nproc-per-node 1`) that meet through
a c10d rendezvous, train to exactly the weights of one node running two processes. torchkit
itself only reads RANK / WORLD_SIZE / LOCAL_RANK, so what differs between the two launches is
torchrun's rendezvous and rank assignment, which must not change the result. (With the c10d
rendezvous torchrun ignores --node-rank and numbers the ranks as agents join.) The one node's
ranks are started as torchrun starts them, without an agent (gloo_ranks.py). The two agents are
forked from a Python that has imported torch (preloaded_processes.py); the rank each starts is a
fresh interpreter. The one-node run is made once for both comparisons."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from gloo_ranks import (
    error_lines_of,
    forks_noted,
    free_port,
    run_ranks,
    start_ranks,
    stderr_of,
    watching_forks,
)
from image_folders import write_image_folder
from output_checks import error_line
from preloaded_processes import start_preloaded_process
from processes import killed
from suite_paths import HELPERS, REPO

from torchkit.cli import app

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="torch.distributed missing"
)


def recipe(data: Path, out: Path, batch_size: int, workers: int = 0) -> list[str]:
    # Augmentation stays on (random crops and flips): it is seeded per image, so two processes
    # see exactly the images one process sees (with loader workers or without). TinyNet has no
    # dropout or BatchNorm, whose per-process randomness and batch statistics would
    # legitimately differ.
    return [
        "train", "--data", str(data), "--model", "nets:TinyNet", "--image-size", "8",
        "--batch-size", str(batch_size), "--epochs", "2", "--optimizer", "sgd", "--lr", "0.2",
        "--workers", str(workers), "--device", "cpu", "--out", str(out), "--format", "json",
    ]  # fmt: skip


def start_torchrun(launch: list[str], args: list[str]) -> subprocess.Popen:
    """A torchrun agent, forked from a Python that has imported torch (preloaded_processes.py:
    its own `import torch` was about 3 s of CPU an agent); the ranks it starts are fresh
    interpreters, as under any torchrun."""
    # One torch thread in every rank, as torchrun sets only with --nproc-per-node > 1: ranks
    # left to torch's default thread count round differently (digits convnet, 2 epochs: 1.9e-6).
    env = {"PYTHONPATH": str(HELPERS), "OMP_NUM_THREADS": "1"}
    return start_preloaded_process(
        *launch, "--monitor-interval=0.1", "-m", "torchkit", *args,
        env=env, cwd=REPO, module="torch.distributed.run",
    )  # fmt: skip


def finish(processes: list[subprocess.Popen], timeout: float = 240) -> list[tuple[int, str, str]]:
    """Wait for every process (killing all of them if one hangs): (returncode, stdout, stderr)."""
    results = []
    try:
        for process in processes:
            stdout, stderr = process.communicate(timeout=timeout)
            results.append((process.returncode, stdout, stderr))
    finally:
        for process in processes:
            if process.poll() is None:
                killed(process)
    return results


@dataclass
class Launched:
    """The data, the one-node run (two ranks) and the two-node run (two torchrun agents, one
    rank each), launched at once: the two nodes must be, the one node may as well."""

    data: Path
    one_node: Path
    one_node_result: tuple[int, str, str]
    two_nodes: Path
    node_results: list[tuple[int, str, str]]
    watched: Path  # the one node's forks (`gloo_ranks.watching_forks`)


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> Launched:
    root = tmp_path_factory.mktemp("ddp")
    data = root / "data"
    write_image_folder(data / "train", {"a": 8, "b": 8}, seed=1)  # 2 global batches of 8
    write_image_folder(data / "val", {"a": 3, "b": 2}, seed=2)  # odd: uneven shards
    write_image_folder(data / "test", {"a": 2, "b": 3}, seed=3)
    two_port = free_port()
    # The one node's ranks with a loader worker each, their forks watched.
    watched = root / "watched"
    one_node = start_ranks(
        *recipe(data, root / "one-node", batch_size=4, workers=1), env=watching_forks(watched)
    )
    nodes = []
    for node in (0, 1):
        launch = [
            "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{two_port}",
            "--rdzv-id", "two-nodes",
        ]  # fmt: skip
        nodes.append(start_torchrun(launch, recipe(data, root / "two-nodes", batch_size=4)))
    rank0, rank1, *node_results = finish([*one_node, *nodes])
    # As one torchrun agent would report them: the first failure's code, every rank's output.
    one_node_result = (rank0[0] or rank1[0], rank0[1] + rank1[1], rank0[2] + rank1[2])
    return Launched(
        data, root / "one-node", one_node_result, root / "two-nodes", node_results, watched
    )


def test_two_gloo_processes_match_one_process_with_the_same_global_batch(
    launched, tmp_path, runner
):
    data = launched.data
    single = runner.invoke(app, recipe(data, tmp_path / "single", batch_size=8))
    assert single.exit_code == 0, single.stderr

    returncode, stdout, stderr = launched.one_node_result
    assert returncode == 0, stderr[-3000:]
    out = launched.one_node

    # Rank 0 alone printed the summary and wrote one set of files.
    summary = json.loads(stdout)
    assert summary["world_size"] == 2
    assert stderr.count("epoch 2/2") == 1
    assert sorted(p.name for p in out.iterdir()) == [
        ".torchkit",
        "best.pt",
        "config.json",
        "curves.png",
        "last.pt",
        "metrics.csv",
        "split.csv",
    ]
    # One split.csv, rank 0's, the same as the single process's.
    assert (out / "split.csv").read_text() == (tmp_path / "single" / "split.csv").read_text()
    config = json.loads((out / "config.json").read_text())
    assert (config["world_size"], config["global_batch_size"]) == (2, 8)

    reference = json.loads(single.stdout)
    ours = torch.load(out / "last.pt", weights_only=True)
    theirs = torch.load(tmp_path / "single" / "last.pt", weights_only=True)
    assert ours["global_step"] == theirs["global_step"] == 4
    for key, value in theirs["model"].items():
        assert torch.allclose(ours["model"][key], value, atol=1e-5), key
    for ddp_row, row in zip(summary["history"], reference["history"], strict=True):
        topk = f"val_top{summary['topk']}"  # named for the k used
        for name in ("train_loss", "train_top1", "val_loss", "val_top1", topk):
            assert ddp_row[name] == pytest.approx(row[name], abs=1e-5), name
    assert summary["test_top1"] == pytest.approx(reference["test_top1"], abs=1e-9)
    assert summary["test_size"] == reference["test_size"] == 5


def test_two_nodes_train_to_the_same_weights_as_one_node_with_two_processes(launched):
    (code, stdout, stderr), node_results = launched.one_node_result, launched.node_results
    assert code == 0, stderr[-3000:]
    for node_code, _, node_stderr in node_results:
        assert node_code == 0, node_stderr[-3000:]

    # Rank 0 (on whichever agent the rendezvous gave it) alone printed the summary.
    printed = [json.loads(out) for _, out, _ in node_results if out.strip()]
    assert len(printed) == 1 and printed[0]["world_size"] == 2
    reference = json.loads(stdout)
    assert reference["world_size"] == 2
    config = json.loads((launched.two_nodes / "config.json").read_text())
    assert (config["world_size"], config["global_batch_size"]) == (2, 8)

    ours = torch.load(launched.two_nodes / "last.pt", weights_only=True)
    theirs = torch.load(launched.one_node / "last.pt", weights_only=True)
    assert ours["global_step"] == theirs["global_step"] == 4
    difference = max(
        (ours["model"][key].double() - value.double()).abs().max().item()
        for key, value in theirs["model"].items()
    )
    print(f"max abs weight difference, 2 nodes vs 1 node x 2 processes: {difference:.3g}")
    assert difference == 0  # bit for bit (measured: 0), every rank with one torch thread
    for row, want in zip(printed[0]["history"], reference["history"], strict=True):
        for name in ("train_loss", "train_top1", "val_loss", "val_top1"):
            assert row[name] == pytest.approx(want[name], abs=1e-5), name
    assert printed[0]["test_top1"] == reference["test_top1"]


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="the threads in Linux's /proc")
def test_every_rank_forks_its_workers_before_the_process_group_starts_a_thread(launched):
    """Each rank's train, validation and test workers are forked with the main thread alone:
    they were forked after `init_process_group`, beside Gloo's threads (gloo_tcp_loop,
    pt_gloo_runloop; rank 0's TCPStore server), and a process forked beside a thread may
    deadlock in the child on a lock that thread held (eval's and predict's:
    test_eval.py's and test_predict.py's torchrun tests)."""
    assert launched.one_node_result[0] == 0, launched.one_node_result[2][-3000:]
    for rank in (0, 1):
        forks = forks_noted(launched.watched, rank)
        assert len(forks) == 3 and all(len(threads) == 1 for threads in forks), (rank, forks)


def test_a_refusal_on_rank_0_is_an_error_on_every_rank_not_a_hang(tmp_path):
    """Only rank 0 checks and locks the run folder: when it is refused (here: locked by another
    process), every rank ends with the same error instead of waiting for rank 0 forever; rank 0
    alone prints it (each rank printed its own copy: the user read it once per rank)."""
    from torchkit.core.io.output_locks import FolderLock

    data = tmp_path / "data"
    write_image_folder(data / "train", {"a": 2, "b": 2}, seed=1)
    write_image_folder(data / "val", {"a": 1, "b": 1}, seed=2)
    out = tmp_path / "run"
    lock = FolderLock(out, "run folder")  # this test process is "the other torchkit run"
    try:
        ranks = run_ranks(*recipe(data, out, batch_size=2))
    finally:
        lock.release()
    assert [done.returncode for done in ranks] == [1, 1], stderr_of(ranks)[-3000:]
    refusal = f"being written by another torchkit process (PID {os.getpid()})"
    assert refusal in error_line(ranks[0].stderr)
    assert ranks[1].stderr == "", ranks[1].stderr[-3000:]
    assert not out.exists()


def test_ranks_that_read_other_data_are_one_error_before_anything_is_written(tmp_path):
    """Each node reads --data from its own disk: a copy with another class (the same number of
    images) was trained on silently, with labels meaning other classes on rank 1; a copy with
    more images made Gloo abort rank 0 mid-run. Now every rank refuses it (rank 0 says so), and
    no run folder is left."""
    for name, classes in (("node0", {"a": 2, "b": 2}), ("node1", {"a": 2, "c": 2})):
        write_image_folder(tmp_path / name / "train", classes, seed=1)
        write_image_folder(tmp_path / name / "val", dict.fromkeys(classes, 1), seed=2)
    out = tmp_path / "run"
    ranks = run_ranks(
        *recipe(tmp_path / "node0", out, batch_size=2),
        rank_args={1: recipe(tmp_path / "node1", out, batch_size=2)},
    )
    assert [done.returncode for done in ranks] == [1, 1], stderr_of(ranks)[-3000:]
    errors = error_lines_of(ranks)
    refusal = "rank 1 reads other data than rank 0: classes a, c instead of a, b"
    assert len(errors) == 1 and refusal in error_line(ranks[0].stderr), stderr_of(ranks)[-3000:]
    assert not out.exists()


def test_sync_bn_on_gloo_cpu_ranks_is_one_refusal_before_anything_is_written(tmp_path):
    """torch's SyncBatchNorm synchronises only GPU tensors: on CPUs it fails at its first
    training step ("SyncBatchNorm expected input tensor to be on GPU"). Two real Gloo ranks
    given --sync-bn each refuse it while setting up, before training: as with any set-up error,
    a rank joins the others first (JoinedAfterForks), so none waits for it until the timeout;
    both exit 2 with the one refusal, and nothing is written."""
    data = tmp_path / "data"
    write_image_folder(data / "train", {"a": 2, "b": 2}, seed=1)
    write_image_folder(data / "val", {"a": 1, "b": 1}, seed=2)
    out = tmp_path / "run"
    ranks = run_ranks(*recipe(data, out, batch_size=2), "--sync-bn")
    assert [done.returncode for done in ranks] == [2, 2], stderr_of(ranks)[-3000:]
    refusal = (
        "Error: --sync-bn needs CUDA GPUs: SyncBatchNorm cannot train on CPU tensors (drop "
        "--sync-bn, or train on GPUs with torchrun --nproc_per_node=N)"
    )
    assert error_lines_of(ranks) == [refusal, refusal], stderr_of(ranks)[-3000:]
    assert not out.exists()
