"""The next epoch's batches are asked for while an epoch validates (core.train.epoch_starts):
the same batches and random draws as an epoch that starts its own iterator."""

from __future__ import annotations

import multiprocessing

import torch
from image_folders import write_image_folder
from processes import run_torchkit_in_process

from torchkit.core.train import epoch_starts
from torchkit.core.train.epoch_starts import EpochStarts, StartedBatches


class FakeSampler:
    def __init__(self):
        self.calls = []

    def set_epoch(self, epoch, skip=0):
        self.calls.append((epoch, skip))


class FakeLoader:
    def __init__(self, workers=2, persistent=True):
        self.num_workers, self.persistent_workers = workers, persistent
        self.iterators = 0

    def __len__(self):
        return 3

    def __iter__(self):
        self.iterators += 1
        return iter([f"batch {self.iterators}.{n}" for n in range(3)])


def test_an_epoch_started_early_iterates_the_iterator_made_then():
    loader, sampler = FakeLoader(), FakeSampler()
    starts = EpochStarts(loader, sampler)
    starts.start_early(1)
    assert sampler.calls == [(1, 0)] and loader.iterators == 1
    batches = starts.batches(1)
    assert isinstance(batches, StartedBatches) and len(batches) == 3
    assert list(batches) == ["batch 1.0", "batch 1.1", "batch 1.2"]
    assert loader.iterators == 1 and sampler.calls == [(1, 0)]  # no second iterator
    # The next epoch, not started early: the loader, set to it.
    assert starts.batches(2) is loader and sampler.calls[-1] == (2, 0)


def test_a_resumed_or_other_epoch_sets_the_sampler_itself():
    loader, sampler = FakeLoader(), FakeSampler()
    starts = EpochStarts(loader, sampler)
    assert starts.batches(0, skip=8) is loader and sampler.calls == [(0, 8)]
    starts.start_early(3)
    assert starts.batches(4) is loader and sampler.calls[-1] == (4, 0)  # not the one started


def test_without_persistent_workers_nothing_starts_early():
    for loader in (FakeLoader(workers=0), FakeLoader(persistent=False)):
        sampler = FakeSampler()
        EpochStarts(loader, sampler).start_early(1)
        assert loader.iterators == 0 and sampler.calls == []


class FakeAhead:
    """What `decode_ahead` makes of an epoch started early: records its start and close."""

    def __init__(self, batches):
        self.batches, self.started, self.closed = batches, 0, 0

    def start(self):
        self.started += 1

    def close(self):
        self.closed += 1


def test_an_epoch_started_early_is_decoded_at_once_and_closed_if_never_asked_for():
    loader, sampler = FakeLoader(), FakeSampler()
    starts = EpochStarts(loader, sampler, decode_ahead=FakeAhead)
    assert not starts.decoding_early
    starts.start_early(1)
    assert starts.decoding_early
    first = starts.batches(1)
    assert isinstance(first, FakeAhead) and (first.started, first.closed) == (1, 0)
    assert isinstance(first.batches, StartedBatches) and list(first.batches)[0] == "batch 1.0"
    starts.start_early(2)
    second = starts._started[1]
    assert starts.batches(3) is loader and (second.started, second.closed) == (1, 1)
    starts.start_early(4)
    third = starts._started[1]
    starts.close()
    starts.close()
    assert third.closed == 1 and not starts.decoding_early
    assert first.closed == 0  # the one handed out is its epoch's to close


def test_early_decoding_decodes_epoch_1_while_the_model_is_built_and_trains_the_same(
    runner, tmp_path, monkeypatch
):
    # --decode device as on a GPU with a budget (`ahead_budget`): each epoch's
    # batches are decoded before it begins, the first epoch's while the model is built, and
    # the run trains bit for bit as one that decodes nothing early and starts cold. One loader
    # worker: an epoch starts early on persistent workers, whatever their number.
    import threading

    from photos import jpeg_split_folder

    from torchkit.cli import app
    from torchkit.core.data import decode_ahead, decoder_warm_up, device_decode
    from torchkit.core.train import epochs, setup

    root = tmp_path / "jpegs"
    jpeg_split_folder(root, train=4, val=2, size=(48, 36))  # 4 steps an epoch
    monkeypatch.setattr(decode_ahead, "decodes_ahead", lambda decode, device: True)
    decoded, epochs_got, warmed = threading.Event(), [], []
    real_decode, real_to_device, real_epoch = (
        device_decode.jpegs_decoded, setup._to_device, epochs.train_one_epoch,
    )  # fmt: skip

    def jpegs_decoded(batch, device):
        result = real_decode(batch, device)
        decoded.set()
        return result

    def to_device(model, ctx, config):
        # The model waits here for epoch 1's first batch to be decoded, which only a decode
        # begun in the set-up can give it.
        epochs_got.append(("decoded before the model went to the device", decoded.wait(60)))
        real_to_device(model, ctx, config)

    def train_one_epoch(ctx, batches, *args, **kwargs):
        early = isinstance(batches, decode_ahead.DecodedAhead) and bool(batches._started)
        epochs_got.append((kwargs["epoch"], early))
        return real_epoch(ctx, batches, *args, **kwargs)

    monkeypatch.setattr(device_decode, "jpegs_decoded", jpegs_decoded)
    monkeypatch.setattr(setup, "_to_device", to_device)
    monkeypatch.setattr(epochs, "train_one_epoch", train_one_epoch)
    monkeypatch.setattr(decoder_warm_up, "start_decoder_warm_up", warmed.append)
    args = ["train", "--data", str(root), "--model", "convnet", "--image-size", "16",
            "--batch-size", "2", "--epochs", "2", "--workers", "1", "--decode", "device",
            "--device", "cpu", "--deterministic"]  # fmt: skip
    monkeypatch.setattr(decode_ahead, "ahead_budget", lambda device: 2**20)
    early = runner.invoke(app, [*args, "--out", str(tmp_path / "early")])
    assert early.exit_code == 0, early.stderr
    assert epochs_got == [("decoded before the model went to the device", True), (1, True),
                          (2, True)]  # fmt: skip
    assert warmed == []  # decoding the first batches readies the decoder
    monkeypatch.setattr(setup, "_to_device", real_to_device)
    monkeypatch.setattr(decode_ahead, "ahead_budget", lambda device: 0)
    monkeypatch.setattr(EpochStarts, "start_early", lambda self, epoch: None)  # nothing early
    epochs_got.clear()
    cold = runner.invoke(app, [*args, "--out", str(tmp_path / "cold")])
    assert cold.exit_code == 0, cold.stderr
    assert epochs_got == [(1, False), (2, False)]
    ours = torch.load(tmp_path / "early" / "last.pt", weights_only=True)["model"]
    theirs = torch.load(tmp_path / "cold" / "last.pt", weights_only=True)["model"]
    assert all(torch.equal(ours[key], value) for key, value in theirs.items())
    assert not [t for t in threading.enumerate() if t.name.startswith("torchkit-decode")]


def test_a_stop_between_epochs_stops_the_next_epochs_early_decoding(runner, tmp_path, monkeypatch):
    import threading

    from photos import jpeg_split_folder

    from torchkit.cli import app
    from torchkit.core.data import decode_ahead
    from torchkit.core.train import epochs

    root = tmp_path / "jpegs"
    jpeg_split_folder(root, train=4, val=2, size=(48, 36))  # 4 steps an epoch
    monkeypatch.setattr(decode_ahead, "decodes_ahead", lambda decode, device: True)
    monkeypatch.setattr(decode_ahead, "ahead_budget", lambda device: 2**20)
    made = []
    real_init = decode_ahead.DecodedAhead.__init__

    def init(self, *args, **kwargs):
        made.append(self)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(decode_ahead.DecodedAhead, "__init__", init)
    # Asked between epochs 1 and 2 (force=True), as after a SIGTERM during validation.
    monkeypatch.setattr(epochs.EpochDriver, "should_stop", lambda self, force=False: force)
    result = runner.invoke(
        app,
        ["train", "--data", str(root), "--model", "convnet", "--image-size", "16",
         "--batch-size", "2", "--epochs", "3", "--workers", "1", "--decode", "device",
         "--device", "cpu", "--out", str(tmp_path / "run"), "--format", "json"],
    )  # fmt: skip
    assert result.exit_code == 130, result.stderr  # stopped, as by Ctrl-C
    assert torch.load(tmp_path / "run" / "last.pt", weights_only=True)["epoch"] == 1
    assert len(made) == 2  # epoch 1's, and epoch 2's started early, never trained
    assert all(ahead._stop.is_set() for ahead in made)
    assert not [t for t in threading.enumerate() if t.name.startswith("torchkit-decode")]


def _run(runner, root, out, workers):
    from torchkit.cli import app

    return runner.invoke(
        app,
        ["train", "--data", str(root), "--model", "nets:NoisyNet", "--image-size",
         "8", "--batch-size", "4", "--epochs", "2", "--deterministic", "--lr", "0.01",
         "--workers", str(workers), "--device", "cpu", "--out", str(out)],
    )  # fmt: skip


def test_a_run_with_workers_started_early_trains_as_one_without_workers(
    runner, tmp_path, monkeypatch
):
    root = tmp_path / "data"
    write_image_folder(root / "train", {"a": 5, "b": 6}, size=12, seed=3)
    write_image_folder(root / "val", {"a": 2, "b": 2}, size=12, seed=4)
    started = []
    real = epoch_starts.EpochStarts.start_early

    def spy(self, epoch):
        started.append((epoch, self.loader.num_workers))
        real(self, epoch)

    monkeypatch.setattr(epoch_starts.EpochStarts, "start_early", spy)
    assert _run(runner, root, tmp_path / "workers", 2).exit_code == 0
    # during the set-up, then after epoch 1's steps, not after the last
    assert started == [(0, 2), (1, 2)]
    assert _run(runner, root, tmp_path / "none", 0).exit_code == 0
    ours = torch.load(tmp_path / "workers" / "last.pt", weights_only=True)
    theirs = torch.load(tmp_path / "none" / "last.pt", weights_only=True)
    for key, value in theirs["model"].items():
        assert torch.equal(ours["model"][key], value), key
    rows = [{k: v for k, v in row.items() if "time" not in k and "per_s" not in k}
            for row in theirs["history"]]  # fmt: skip
    assert [
        {k: v for k, v in row.items() if "time" not in k and "per_s" not in k}
        for row in ours["history"]
    ] == rows


def test_a_resumed_run_starts_its_next_epoch_early_and_trains_as_one_without_workers(
    runner, tmp_path, monkeypatch
):
    import shutil

    from torchkit.cli import app

    root = tmp_path / "data"
    write_image_folder(root / "train", {"a": 5, "b": 6}, size=12, seed=3)
    write_image_folder(root / "val", {"a": 2, "b": 2}, size=12, seed=4)
    first = runner.invoke(
        app,
        ["train", "--data", str(root), "--model", "nets:NoisyNet", "--image-size",
         "8", "--batch-size", "4", "--epochs", "2", "--deterministic", "--lr", "0.01",
         "--workers", "0", "--device", "cpu", "--out", str(tmp_path / "two")],
    )  # fmt: skip
    assert first.exit_code == 0, first.stderr
    started = []
    real = epoch_starts.EpochStarts.start_early
    monkeypatch.setattr(
        epoch_starts.EpochStarts,
        "start_early",
        lambda self, epoch: (started.append((epoch, self.loader.num_workers)), real(self, epoch)),
    )
    for workers in (2, 0):
        out = tmp_path / f"resumed-{workers}"
        shutil.copytree(tmp_path / "two", out)
        resumed = runner.invoke(
            app,
            ["train", "--resume", str(out / "last.pt"), "--epochs", "3", "--workers",
             str(workers), "--out", str(out), "--trust-checkpoint"],
        )  # fmt: skip
        assert resumed.exit_code == 0, resumed.stderr
    assert started[0] == (2, 2)  # epoch 3, asked for during the set-up
    ours = torch.load(tmp_path / "resumed-2" / "last.pt", weights_only=True)
    theirs = torch.load(tmp_path / "resumed-0" / "last.pt", weights_only=True)
    assert ours["epoch"] == theirs["epoch"] == 3
    for key, value in theirs["model"].items():
        assert torch.equal(ours["model"][key], value), key


def test_a_bad_model_after_the_workers_started_is_one_error_and_leaves_nothing(tmp_path):
    # The warm start forks epoch 1's workers before the model is built: an unknown model is
    # still one error line, and the workers go with the run (gone when the command returns).
    write_image_folder(tmp_path / "data" / "train", {"a": 5, "b": 6}, size=12, seed=3)
    write_image_folder(tmp_path / "data" / "val", {"a": 2, "b": 2}, size=12, seed=4)
    done = run_torchkit_in_process(
        "train", "--data", "data", "--model", "no_such_model", "--workers", "2",
        "--device", "cpu", "--out", "run", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: unknown model 'no_such_model'"), done
    assert multiprocessing.active_children() == []
    assert not (tmp_path / "run").exists()
