"""`torchrun --nproc-per-node 2 -m torchkit eval ...` launched for real: the elastic agent's
variables (TORCHELASTIC_RUN_ID, TORCHELASTIC_*, its MASTER_PORT, OMP_NUM_THREADS=1), its
rendezvous and its handling of the ranks' streams and exit codes, which the suite's other
distributed eval tests leave out (gloo_ranks starts the ranks without an agent). The numbers
are those of one process on the same data."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from checkpoints import write_convnet_checkpoint
from gloo_ranks import free_port
from image_folders import write_image_folder
from processes import INHERITED, run_json
from suite_paths import REPO

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="torch.distributed missing"
)


def test_eval_under_torchrun_gives_the_numbers_of_one_process(tmp_path):
    data = write_image_folder(tmp_path / "data", {"a": 6, "b": 5, "c": 4}, seed=4)  # 15: odd
    write_convnet_checkpoint(tmp_path / "m.pt", in_channels=3, image_size=8, classes="abc")
    args = ["eval", str(tmp_path / "m.pt"), "--data", str(data), "--topk", "2", "--workers",
            "0", "--batch-size", "4", "--device", "cpu"]  # fmt: skip
    env = {key: value for key, value in os.environ.items() if key not in INHERITED}
    launched = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(free_port()), "--monitor-interval", "0.1",
         "-m", "torchkit", *args, "--format", "json", "--out", str(tmp_path / "ddp")],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert launched.returncode == 0, launched.stderr[-3000:]
    ddp = json.loads(launched.stdout)  # one report: rank 1 prints nothing
    # On one thread, as torchrun runs each rank (OMP_NUM_THREADS=1): another count rounds the
    # probabilities' last digits otherwise.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        single = run_json(*args, "--out", tmp_path / "single")
    finally:
        torch.set_num_threads(threads)
    assert (ddp["world_size"], single["world_size"]) == (2, 1)
    for key in ("num_images", "accuracy", "topk_accuracy", "f1_macro", "per_class"):
        assert ddp[key] == single[key], key
    assert ddp["loss"] == pytest.approx(single["loss"], rel=1e-6)
    for name in ("predictions.csv", "confusion_matrix.csv", "per_class.csv"):
        assert (tmp_path / "ddp" / name).read_bytes() == (tmp_path / "single" / name).read_bytes()
