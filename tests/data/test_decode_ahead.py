"""Batches of JPEG bytes decoded one batch ahead in a thread (`core.decode_ahead`), the way
training feeds a GPU with `--decode device`: same batches in the same order as decoding them in
the loop, errors raised in the loop, no thread left behind, and a training run with it equal,
bit for bit, to one without it (tested with device="cpu")."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import pytest
import torch
from photos import jpeg_split_folder
from processes import processes_in_group, start_torchkit_process, wait_until
from suite_paths import HELPERS

from torchkit.cli import app
from torchkit.core.data import decode_ahead
from torchkit.core.data.batches import Batch
from torchkit.core.data.decode_ahead import DecodedAhead, decodes_ahead
from torchkit.core.data.device_decode import EncodedImages, decoded_batch


def _threads() -> int:
    return sum(1 for thread in threading.enumerate() if thread.name.startswith("torchkit-decode"))


class Loader:
    """`count` plain batches (decoded_batch passes them through), failing at `fail_at`."""

    def __init__(self, count: int, fail_at: int | None = None) -> None:
        self.count, self.fail_at, self.given = count, fail_at, 0

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        for index in range(self.count):
            if index == self.fail_at:
                raise ValueError(f"unreadable batch {index}")
            self.given += 1
            yield Batch(torch.full((1, 3, 2, 2), index, dtype=torch.uint8), torch.tensor([index]),
                        torch.tensor([index]), [])  # fmt: skip


def test_only_device_decoding_on_a_gpu_decodes_ahead():
    assert decodes_ahead("device", "cuda") and decodes_ahead("device", torch.device("cuda", 1))
    assert not decodes_ahead("device", "cpu") and not decodes_ahead("fast", "cuda")


def test_batches_come_in_the_loaders_order_and_the_threads_end():
    loader = Loader(7)
    ahead = DecodedAhead(loader, "cpu")
    assert len(ahead) == 7
    assert [int(batch.labels) for batch in ahead] == list(range(7))
    assert _threads() == 0
    with pytest.raises(RuntimeError, match="iterated once"):
        iter(ahead).__next__()


def test_an_error_in_the_loader_is_raised_in_the_loop_after_the_batches_before_it():
    seen = []
    with pytest.raises(ValueError, match="unreadable batch 3"):
        for batch in DecodedAhead(Loader(6, fail_at=3), "cpu"):
            seen.append(int(batch.labels))
    assert seen == [0, 1, 2] and _threads() == 0


def test_an_error_making_the_crops_is_raised_in_the_loop_after_the_batches_before_it(
    monkeypatch,
):
    from torchkit.core.data import device_decode

    real = device_decode.cropped_batch

    def failing(started, device):
        if int(started.labels) == 2:
            raise RuntimeError("no crop for batch 2")
        return real(started, device)

    monkeypatch.setattr(device_decode, "cropped_batch", failing)
    seen = []
    with pytest.raises(RuntimeError, match="no crop for batch 2"):
        for batch in DecodedAhead(Loader(6), "cpu"):
            seen.append(int(batch.labels))
    assert seen == [0, 1] and _threads() == 0


def test_two_threads_hold_at_most_two_batches_of_whole_images(monkeypatch):
    # The whole decoded images are the big ones (a batch of 12 MP photos is 9 GB on a GPU):
    # the decoding thread waits while two such batches are alive, however slow the crops.
    from torchkit.core.data import device_decode

    lock, alive, most = threading.Lock(), [0], [0]
    blocked = threading.Event()
    real_acquire = DecodedAhead._acquire

    def decoded(batch, device):
        with lock:
            alive[0] += 1
            most[0] = max(most[0], alive[0])
        return batch

    def cropped(batch, device):
        if int(batch.labels) == 0:
            blocked.wait(10)  # until the decoding thread waits for batch 0's images to go
        with lock:
            alive[0] -= 1
        return batch

    def acquire(self, semaphore):
        with lock:
            if alive[0] == 2:
                blocked.set()
        return real_acquire(self, semaphore)

    monkeypatch.setattr(device_decode, "jpegs_decoded", decoded)
    monkeypatch.setattr(device_decode, "cropped_batch", cropped)
    monkeypatch.setattr(DecodedAhead, "_acquire", acquire)
    assert [int(b.labels) for b in DecodedAhead(Loader(6), "cpu")] == list(range(6))
    assert blocked.is_set() and most[0] == 2 and _threads() == 0


def test_leaving_early_stops_the_threads_within_the_batches_ahead():
    loader = Loader(50)
    with DecodedAhead(loader, "cpu", ahead=2) as ahead:
        for batch in ahead:
            assert int(batch.labels) == 0
            break
    assert _threads() == 0
    # The batch trained on, the `ahead` waiting, one in each thread's hands, and one waiting
    # between them.
    assert loader.given <= 1 + 2 + 2 + 1


def test_the_threads_count_their_time_in_the_decoder_on_the_crops_and_waiting(monkeypatch):
    # For `train -v`: a fake clock in which each batch takes 1 s to come from the loader, 3 s
    # in the JPEG decoder and 2 s on its crops.
    clock = [0.0]
    lock = threading.Lock()
    monkeypatch.setattr(decode_ahead.time, "perf_counter", lambda: clock[0])

    def tick(seconds):
        with lock:
            clock[0] += seconds

    class SlowLoader(Loader):
        def __iter__(self):
            for batch in super().__iter__():
                tick(1.0)
                yield batch

    def slow_decode(batch, device):
        tick(3.0)
        return batch

    def slow_crops(started, device):
        tick(2.0)
        return started

    monkeypatch.setattr("torchkit.core.data.device_decode.jpegs_decoded", slow_decode)
    monkeypatch.setattr("torchkit.core.data.device_decode.cropped_batch", slow_crops)
    ahead = DecodedAhead(SlowLoader(4), "cpu")
    assert len(list(ahead)) == 4
    # One clock for two threads: each thread's spans also hold the other's ticks made meanwhile.
    assert ahead.jpeg_seconds >= 12 and ahead.crop_seconds >= 8 and ahead.loader_seconds >= 4


def test_the_budget_is_a_64th_of_the_gpu_up_to_512_mib_and_none_on_a_cpu(monkeypatch):
    from types import SimpleNamespace

    from torchkit.core.data.decode_ahead import ahead_budget

    memory = {0: 8 * 2**30, 1: 80 * 2**30}
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=memory[i])
    )
    assert ahead_budget("cuda") == ahead_budget("cuda:0") == 128 * 2**20
    assert ahead_budget(torch.device("cuda", 1)) == 512 * 2**20
    assert ahead_budget("cpu") == 0


def test_ready_batches_take_the_least_whatever_their_size_then_what_fits_the_budget():
    from torchkit.core.data.decode_ahead import ReadyBatches

    ready = ReadyBatches(least=1, budget=100)
    never = lambda: False  # noqa: E731
    assert ready.put(("a",), 150, never)  # the least, though over the budget
    waiting = threading.Event()

    def put_b():
        assert ready.put(("b",), 30, lambda: waiting.set() or False)

    putter = threading.Thread(target=put_b)
    putter.start()
    assert waiting.wait(10)  # 150 + 30 > 100: waits for room
    assert ready.get() == ("a",)
    putter.join(10)
    assert not putter.is_alive() and len(ready) == 1
    assert ready.put(("c",), 70, never)  # 30 + 70 fits
    assert [ready.get(), ready.get()] == [("b",), ("c",)] and ready.most == 2
    assert ready.put(("d",), 10, never) and ready.put(("e",), 95, lambda: True) is False
    # The end is an item, not a batch: it never counts among the batches that waited.
    assert ready.put(("end",), 0, never, is_batch=False) and ready.put(("f",), 0, never)
    assert (len(ready), ready.batches(), ready.most) == (3, 2, 2)


def test_started_early_the_threads_decode_as_many_batches_as_the_budget_holds():
    # Batches of 12 bytes, a budget of 60: five wait before the loop asks for any (two with
    # no budget), and then come in the loader's order.
    for budget, held in ((60, 5), (0, 2)):
        loader = Loader(9)
        ahead = DecodedAhead(loader, "cpu", budget=budget)
        ahead.start()
        wait_until(lambda: ahead._ready.batches() == held, what=f"{held} batches")  # noqa: B023
        assert [int(batch.labels) for batch in ahead] == list(range(9))
        assert ahead.ready_at_start == ahead.most_ready == held and _threads() == 0


def test_an_early_start_never_asked_for_is_stopped_by_close():
    ahead = DecodedAhead(Loader(50), "cpu", budget=10**6)
    ahead.start()
    ahead.start()  # once
    wait_until(lambda: ahead._ready.batches() > 3, what="batches decoded")
    ahead.close()
    assert _threads() == 0 and len(ahead._ready) == 0


def _device_decode_loaders(root: Path, image_size: int):
    """The loaders `train --decode device` builds over the JPEG folder `root`, no workers."""
    from torchkit.core.train.config import TrainConfig
    from torchkit.core.train.loaders import build_loaders, load_splits, preprocess_for
    from torchkit.core.train.validation import resolve_defaults

    config = resolve_defaults(
        TrainConfig(data=str(root), image_size=image_size, workers=0, batch_size=4,
                    decode="device"),
        is_digits=False,
    )  # fmt: skip
    return build_loaders(load_splits(config).splits, preprocess_for(config), config)


def test_jpeg_batches_are_decoded_as_the_loop_decodes_them(tmp_path):
    root = tmp_path / "data"
    jpeg_split_folder(root, train=6, val=1, size=(120, 90))
    (root / "train" / "a" / "0.jpg").write_bytes(b"\xff\xd8\xff" + bytes(100))  # unreadable
    loaders = _device_decode_loaders(root, 16)
    try:
        loaders.train_sampler.set_epoch(0)
        raw = list(loaders.train)
        assert any(isinstance(batch.images, EncodedImages) for batch in raw)
        expected = [decoded_batch(batch, "cpu") for batch in raw]
        loaders.train_sampler.set_epoch(0)
        got = list(DecodedAhead(loaders.train, "cpu"))
    finally:
        loaders.close()
    assert len(got) == len(expected) == 3
    assert sum(len(batch.errors) for batch in got) == 1
    for ours, theirs in zip(got, expected, strict=True):
        assert torch.equal(ours.images, theirs.images) and torch.equal(ours.labels, theirs.labels)
        assert ours.errors == theirs.errors


def test_training_that_decodes_ahead_equals_training_that_does_not(runner, tmp_path, monkeypatch):
    root = tmp_path / "data"
    jpeg_split_folder(root, train=6, val=2, size=(120, 90))
    args = ["train", "--data", str(root), "--model", "convnet", "--image-size", "16", "-b", "4",
            "--epochs", "2", "--workers", "1", "--decode", "device", "--device", "cpu",
            "--format", "json"]  # fmt: skip
    plain = runner.invoke(app, [*args, "--out", str(tmp_path / "plain")])
    assert plain.exit_code == 0, plain.stderr
    monkeypatch.setattr(decode_ahead, "decodes_ahead", lambda decode, device: True)
    made = []

    class Counted(DecodedAhead):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(decode_ahead, "DecodedAhead", Counted)
    ahead = runner.invoke(app, [*args, "--out", str(tmp_path / "ahead")])
    assert ahead.exit_code == 0, ahead.stderr
    assert len(made) == 2 and _threads() == 0  # one per epoch
    weights = [torch.load(tmp_path / name / "last.pt", weights_only=True)["model"]
               for name in ("plain", "ahead")]  # fmt: skip
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][key], weights[1][key]) for key in weights[0])
    losses = [json.loads(result.stdout)["last_train_loss"] for result in (plain, ahead)]
    assert losses[0] == losses[1]


FORCE_AHEAD = """\
import os
from torchkit.core.data import decode_ahead

def decodes_ahead(decode, device):  # as on a GPU, here on the CPU
    open(os.environ["TORCHKIT_TEST_AHEAD_MARK"], "w").close()
    return True

decode_ahead.decodes_ahead = decodes_ahead
if "TORCHKIT_TEST_AHEAD_BUDGET" in os.environ:  # bytes of decoded batches, as on a GPU
    decode_ahead.ahead_budget = lambda device: int(os.environ["TORCHKIT_TEST_AHEAD_BUDGET"])
"""


def test_sigterm_while_decoding_ahead_saves_the_run_and_leaves_no_process(tmp_path):
    """SIGTERM to the process group (as `timeout` sends it) mid-epoch, while the thread holds
    decoded batches and the workers read more: last.pt is saved, exit 143, nothing left."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(FORCE_AHEAD)
    jpeg_split_folder(tmp_path / "data", train=8, val=2, size=(120, 90))
    gate = tmp_path / "gate"
    mark = tmp_path / "decoded-ahead"
    env = {"PYTHONPATH": f"{site}:{HELPERS}", "TORCHKIT_TEST_GATE_FILE": str(gate),
           "TORCHKIT_TEST_GATE_AT": "3", "TORCHKIT_TEST_AHEAD_MARK": str(mark)}  # fmt: skip
    args = ["train", "--data", "data", "--model", "nets:GatedNet", "--image-size",
            "8", "-b", "2", "--workers", "2", "--epochs", "2", "--decode", "device",
            "--device", "cpu", "--out", "run"]  # fmt: skip
    process = start_torchkit_process(*args, cwd=tmp_path, env=env)
    wait_until(gate.exists, process=process, what="the third step")
    assert mark.exists()  # the run decodes ahead
    os.killpg(process.pid, signal.SIGTERM)
    gate.unlink()
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr
    assert "Terminated: saved run/last.pt" in stderr
    assert processes_in_group(process.pid) == []
    saved = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    assert (saved["epoch"], saved["epoch_progress"]["batches"]) == (0, 3)


@pytest.mark.parametrize("budget", ["0", str(2**20)])
def test_sigterm_while_the_model_is_built_after_the_workers_started_leaves_nothing(
    tmp_path, budget
):
    """The warm start asks for epoch 1's batches (and readies the decoder, or with a budget
    decodes them in threads) before the model is built: a SIGTERM then ends the run at once,
    exit 143, with no worker, thread or run folder left behind."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(FORCE_AHEAD)
    jpeg_split_folder(tmp_path / "data", train=8, val=2, size=(120, 90))
    gate = tmp_path / "gate"
    env = {"PYTHONPATH": f"{site}:{HELPERS}", "TORCHKIT_TEST_GATE_FILE": str(gate),
           "TORCHKIT_TEST_GATE_AT": "build", "TORCHKIT_TEST_AHEAD_BUDGET": budget,
           "TORCHKIT_TEST_AHEAD_MARK": str(tmp_path / "decoded-ahead")}  # fmt: skip
    args = ["train", "--data", "data", "--model", "nets:GatedBuildNet",
            "--image-size", "8", "-b", "2", "--workers", "2", "--epochs", "2", "--decode",
            "device", "--device", "cpu", "--out", "run"]  # fmt: skip
    process = start_torchkit_process(*args, cwd=tmp_path, env=env)
    wait_until(gate.exists, process=process, what="the model's construction")
    # Epoch 1's loader workers were already reading, and the validation loader's were forked
    # beside them before any thread started: forked, so they carry the main process's command
    # line (the curves helper does not).
    command = Path(f"/proc/{process.pid}/cmdline").read_bytes()
    group = [pid for pid in processes_in_group(process.pid) if pid != process.pid]
    assert sum(Path(f"/proc/{pid}/cmdline").read_bytes() == command for pid in group) == 2 + 2
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    gate.unlink(missing_ok=True)
    assert process.returncode == 143, stderr
    assert "Traceback" not in stderr
    assert processes_in_group(process.pid) == []
    assert not (tmp_path / "run").exists()  # nothing was saved: no run folder left


def test_the_decoding_threads_use_the_runs_gpu_not_gpu_0(monkeypatch):
    # A new thread starts on GPU 0: with --device cuda:1 each decoding thread switches.
    from torchkit.core.runtime.device import use_in_this_thread

    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    for device in ("cuda:1", "cuda", "cpu"):
        use_in_this_thread(device)
    assert chosen == [torch.device("cuda", 1)]
