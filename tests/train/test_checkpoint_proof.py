"""--force's proof that a file in a run folder is a checkpoint torchkit wrote
(`checkpoint_record.is_torchkit_checkpoint_file`): every checkpoint a run writes passes it, and
its pickle is read by opcodes, never unpickled (a file a user made is refused by its shape, in
tests/cli/test_force_keeps_users_files.py)."""

from __future__ import annotations

import pickle
from pathlib import Path

import torch
from hostile_pickles import RunsShell

from torchkit.core.models import resolve_model
from torchkit.core.models.checkpoint import save_checkpoint
from torchkit.core.train.checkpoint_record import is_torchkit_checkpoint_file
from torchkit.core.train.checkpoints import build_checkpoint


class _Ema:
    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.updates = model, 3

    def state_dict(self) -> dict:
        return self.model.state_dict()


def _run_checkpoint(optimizer_class: type) -> dict:
    """A checkpoint as a run builds it after one step: optimiser, scheduler and scaler state,
    EMA weights, RNG states, history with a NaN, the training options."""
    model = resolve_model("convnet", in_channels=3, image_size=8, num_classes=3).model
    optimizer = optimizer_class(model.parameters(), lr=0.1)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=4)
    model(torch.rand(2, 3, 8, 8)).sum().backward()
    optimizer.step()
    schedule.step()
    return build_checkpoint(
        arch="convnet", classes=["a", "b", "c"], model_state=model.state_dict(),
        optimizer=optimizer, schedule=schedule, scaler=torch.amp.GradScaler("cpu"),
        ema=_Ema(model), epoch=1, global_step=5, best_metric=0.5, best_epoch=1,
        config={"lr": 0.1, "sizes": [1, (2, 3)], "name": None},
        preprocess={"image_size": 8, "mean": [0.5] * 3},
        history=[{"epoch": 1, "loss": float("nan")}],
        epoch_progress={"batches": 2},
    )  # fmt: skip


def test_every_checkpoint_a_run_writes_is_torchkits(tmp_path):
    for optimizer_class in (torch.optim.SGD, torch.optim.AdamW):
        path = tmp_path / f"{optimizer_class.__name__}.pt"
        save_checkpoint(_run_checkpoint(optimizer_class), path)
        assert is_torchkit_checkpoint_file(path)
    # torch.save to a path (the archive's folder named after the file), and an early format
    old = {"format_version": 1, "torchkit_version": "0.1.0", "model": {"w": torch.rand(7)}}
    torch.save(old, tmp_path / "epoch-001.pt")
    assert is_torchkit_checkpoint_file(tmp_path / "epoch-001.pt")


def test_a_checkpoint_less_its_data_or_cut_short_is_not(tmp_path):
    import zipfile

    path = tmp_path / "last.pt"
    save_checkpoint(_run_checkpoint(torch.optim.SGD), path)
    with zipfile.ZipFile(path) as archive:
        records = {info.filename: archive.read(info) for info in archive.infolist()}
    storage = next(name for name in records if "/data/" in name)
    with zipfile.ZipFile(tmp_path / "no_data.pt", "w") as archive:
        for name, data in records.items():
            if name != storage:
                archive.writestr(name, data)
    assert not is_torchkit_checkpoint_file(tmp_path / "no_data.pt")
    pickled = next(name for name in records if name.endswith("/data.pkl"))
    with zipfile.ZipFile(tmp_path / "cut.pt", "w") as archive:
        for name, data in records.items():
            archive.writestr(name, data[: len(data) // 2] if name == pickled else data)
    assert not is_torchkit_checkpoint_file(tmp_path / "cut.pt")


def test_the_proof_runs_nothing_the_pickle_names(tmp_path):
    """A checkpoint-shaped zip whose pickle would run a shell command when unpickled: the
    proof reads it (and may well call it torchkit's: it is only deleted), runs nothing."""
    marker = tmp_path / "ran"
    hostile = {"format_version": 2, "torchkit_version": "0.1.0", "model": RunsShell(marker)}
    path = tmp_path / "best.pt"
    torch.save({"format_version": 2, "torchkit_version": "0.1.0"}, path)
    import zipfile

    with zipfile.ZipFile(path) as archive:
        records = {info.filename: archive.read(info) for info in archive.infolist()}
    pickled = next(name for name in records if name.endswith("/data.pkl"))
    records[pickled] = pickle.dumps(hostile, protocol=2)
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in records.items():
            archive.writestr(name, data)
    is_torchkit_checkpoint_file(Path(path))
    assert not marker.exists()


def test_a_checkpoint_whose_pickle_is_compressed_is_not(tmp_path):
    """torch.save stores its records uncompressed; a zip of the same records with data.pkl
    deflated is another program's (and its opcodes are not read: 32 KB of such a best.pt,
    32 MB of opcodes unpacked, took 8 s)."""
    import zipfile

    path = tmp_path / "best.pt"
    save_checkpoint(_run_checkpoint(torch.optim.SGD), path)
    with zipfile.ZipFile(path) as archive:
        records = {info.filename: archive.read(info) for info in archive.infolist()}
    packed = tmp_path / "packed" / "best.pt"
    packed.parent.mkdir()
    with zipfile.ZipFile(packed, "w") as archive:
        for name, data in records.items():
            kind = zipfile.ZIP_DEFLATED if name.endswith("/data.pkl") else zipfile.ZIP_STORED
            archive.writestr(name, data, compress_type=kind)
    assert is_torchkit_checkpoint_file(path)
    assert not is_torchkit_checkpoint_file(packed)
