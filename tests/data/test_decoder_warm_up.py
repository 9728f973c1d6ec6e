"""The GPU's JPEG decoder readied in a thread while a run sets up (`core.decoder_warm_up`,
`device_decode.ready_decoder`): tested with device="cpu", where the same calls decode and resize.
It never raises, one runs at a time, and waiting for it from its own thread returns at once."""

from __future__ import annotations

import functools
import threading

import pytest
from PIL import Image

from torchkit.core.data import device_decode
from torchkit.core.data.decoder_warm_up import start_decoder_warm_up, wait_for_decoder_warm_up
from torchkit.core.data.device_decode import READY_COPIES, ready_decoder

WARM_UP = "torchkit-decoder-warm-up"


def _alive() -> int:
    return sum(1 for thread in threading.enumerate() if thread.name == WARM_UP)


@pytest.fixture
def jpeg(tmp_path):
    path = tmp_path / "photo.jpg"
    Image.new("RGB", (40, 30), (200, 120, 40)).save(path, quality=90)
    return str(path)


def test_ready_decoder_decodes_and_resizes_copies_of_the_jpeg(jpeg, monkeypatch):
    decoded, resized = [], []
    real_decode, real_resize = device_decode.decode_jpegs, device_decode.resize_crops

    def decode_spy(chunks, device):
        images = real_decode(chunks, device)
        decoded.append([tuple(image.shape) for image in images])
        return images

    def resize_spy(images, boxes, flips, size, interpolation, **kwargs):
        crops = real_resize(images, boxes, flips, size, interpolation, **kwargs)
        resized.append((boxes, flips, tuple(crops.shape)))
        return crops

    monkeypatch.setattr(device_decode, "decode_jpegs", decode_spy)
    monkeypatch.setattr(device_decode, "resize_crops", resize_spy)
    ready_decoder(jpeg, "cpu", 16, "bilinear")
    assert decoded == [[(3, 30, 40)] * READY_COPIES]
    ((boxes, flips, shape),) = resized
    assert boxes == [(0, 0, 30, 40)] * READY_COPIES and flips == [False, True] * 2
    assert shape == (READY_COPIES, 3, 16, 16)


def test_a_warm_up_runs_in_a_thread_of_its_own(jpeg):
    assert start_decoder_warm_up(functools.partial(ready_decoder, jpeg, "cpu", 16, "bilinear"))
    wait_for_decoder_warm_up()
    assert _alive() == 0


@pytest.mark.parametrize("what", ["missing", "not a jpeg"])
def test_a_warm_up_that_fails_raises_nothing(tmp_path, what):
    path = tmp_path / "x.jpg"
    if what == "not a jpeg":
        path.write_bytes(b"not a jpeg at all")
    else:
        with pytest.raises(OSError):
            ready_decoder(str(path), "cpu", 16, "bilinear")  # called alone it raises
    failures = []
    hook, threading.excepthook = threading.excepthook, failures.append
    try:
        ready = functools.partial(ready_decoder, str(path), "cpu", 16, "bilinear")
        assert start_decoder_warm_up(ready)
        wait_for_decoder_warm_up()
    finally:
        threading.excepthook = hook
    assert failures == [] and _alive() == 0


def test_one_warm_up_at_a_time_and_waiting_from_it_returns():
    release, inside = threading.Event(), []

    def ready():
        wait_for_decoder_warm_up()  # what decode_jpegs does on CUDA: must not wait for itself
        inside.append(threading.current_thread().name)
        release.wait(10)

    assert start_decoder_warm_up(ready)
    try:
        assert not start_decoder_warm_up(ready)  # one is running
    finally:
        release.set()
    wait_for_decoder_warm_up()
    assert inside == [WARM_UP] and _alive() == 0
    wait_for_decoder_warm_up()  # none left: returns at once


def test_a_run_decoding_ahead_readies_the_decoder_and_trains_as_a_cold_one(
    runner, tmp_path, monkeypatch
):
    # The CUDA wiring on the CPU: decoding ahead is what turns the warm-up on.
    import torch
    from photos import jpeg_split_folder

    from torchkit.cli import app
    from torchkit.core.data import decode_ahead, decoder_warm_up

    root = tmp_path / "jpegs"
    jpeg_split_folder(root, train=5, val=2, size=(48, 36))
    monkeypatch.setattr(decode_ahead, "decodes_ahead", lambda decode, device: True)
    warmed = []
    real = decoder_warm_up.start_decoder_warm_up

    def spy(ready):
        warmed.append(ready.args)
        return real(ready)

    monkeypatch.setattr(decoder_warm_up, "start_decoder_warm_up", spy)
    # One loader worker: forked while the warm-up's thread may run, as on a GPU.
    args = ["train", "--data", str(root), "--model", "convnet", "--image-size", "16",
            "--batch-size", "4", "--epochs", "1", "--workers", "1", "--decode", "device",
            "--device", "cpu", "--deterministic"]  # fmt: skip
    assert runner.invoke(app, [*args, "--out", str(tmp_path / "warm")]).exit_code == 0
    ((path, device, size, interpolation),) = warmed
    assert path.startswith(str(root / "train")) and path.endswith(".jpg")
    assert (str(device), size, interpolation) == ("cpu", 16, "bilinear")
    # The same run with the decoder left cold: the same weights.
    monkeypatch.setattr(decoder_warm_up, "start_decoder_warm_up", lambda ready: None)
    assert runner.invoke(app, [*args, "--out", str(tmp_path / "cold")]).exit_code == 0
    ours = torch.load(tmp_path / "warm" / "last.pt", weights_only=True)["model"]
    theirs = torch.load(tmp_path / "cold" / "last.pt", weights_only=True)["model"]
    assert all(torch.equal(ours[key], value) for key, value in theirs.items())
