"""Issue #29, "Trust, round three": numbers torchkit must not make up or choke on.

1. `convert checkpoint --average` refuses checkpoints holding NaN or infinite values (naming the
   file and the tensor), writes nothing, and averages them only with `--allow-nonfinite`.
2. A NaN or infinite validation loss is the divergence signal too: the run stops as for a
   non-finite training loss (same error style, exit 1, the diverged epoch never saved).
3. `summary` counts the mult-adds of what runs: a parameter no operation reads adds nothing.
4. `convert cifar` bounds what one archive member may expand to, and refuses a crafted member
   before reading it (never whole into memory).
5. `summary -i` refuses absurd input sizes (overflowing, or larger than memory) with one usage
   error line, before anything is allocated.

The networks below are named on the command line as `test_nonfinite_and_oversized_inputs:NAME`
(this module, imported by pytest, is what the in-process runs import).
"""

from __future__ import annotations

import io
import json
import math
import tarfile
import tracemalloc
from pathlib import Path

import pytest
import torch
from image_folders import write_image_folder
from nets import TinyNet
from output_checks import error_line, hidden_siblings
from torch import nn

from torchkit.cli import app
from torchkit.core.io.errors import CheckpointError, InputError, UsageError

HERE = Path(__file__).stem
MIB = 1 << 20


# --- 1. averaging refuses non-finite checkpoints ------------------------------------------------


def _state(seed: int, bad: float | None = None) -> dict:
    torch.manual_seed(seed)
    state = {
        "conv.weight": torch.randn(4, 3, 3, 3),
        "fc.weight": torch.randn(2, 4),
        "fc.bias": torch.randn(2),
        "bn.num_batches_tracked": torch.tensor(seed),
    }
    if bad is not None:
        state["fc.weight"][1, 2] = bad  # the second float tensor: the first key is finite
        state["fc.bias"][0] = bad
    return state


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_averaging_a_checkpoint_holding_nan_is_refused_naming_file_and_key(runner, tmp_path, bad):
    good, diverged = tmp_path / "epoch-1.pt", tmp_path / "epoch-2.pt"
    torch.save(_state(0), good)
    torch.save(_state(1, bad), diverged)
    out = tmp_path / "avg.pt"
    before = sorted(p.name for p in tmp_path.iterdir())
    result = runner.invoke(
        app, ["convert", "checkpoint", "--average", str(good), str(diverged), str(out)]
    )
    assert result.exit_code == 1, result.output
    line = error_line(result.stderr)
    assert str(diverged) in line and "'fc.weight'" in line and "--allow-nonfinite" in line
    assert result.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_allow_nonfinite_averages_anyway_and_is_refused_without_average(runner, tmp_path):
    good, diverged = tmp_path / "a.pt", tmp_path / "b.pt"
    torch.save(_state(0), good)
    torch.save(_state(1, math.nan), diverged)
    out = tmp_path / "avg.pt"
    args = ["convert", "checkpoint", "--average", "--allow-nonfinite"]
    result = runner.invoke(app, [*args, str(good), str(diverged), str(out), "--format", "json"])
    assert result.exit_code == 0, result.stderr
    averaged = torch.load(out, weights_only=True)
    assert torch.isnan(averaged["fc.weight"][1, 2]) and torch.isnan(averaged["fc.bias"][0])
    assert torch.isfinite(averaged["conv.weight"]).all()
    assert json.loads(result.stdout)["checkpoints"] == 2

    plain = runner.invoke(
        app, ["convert", "checkpoint", "--allow-nonfinite", str(good), str(tmp_path / "c.pt")]
    )
    assert plain.exit_code == 2, plain.output
    assert "--allow-nonfinite applies to --average only" in error_line(plain.stderr)
    assert not (tmp_path / "c.pt").exists()


def test_the_core_refuses_before_averaging():
    from torchkit.core.convert.averaging import average_state_dicts, first_nonfinite

    states = [_state(0), _state(1), _state(2, math.inf)]
    assert first_nonfinite(states[2]) == "fc.weight" and first_nonfinite(states[0]) is None
    with pytest.raises(CheckpointError, match=r"c\.pt holds a non-finite value .* 'fc\.weight'"):
        average_state_dicts(states, ["a.pt", "b.pt", "c.pt"])
    averaged = average_state_dicts(states, ["a.pt", "b.pt", "c.pt"], allow_nonfinite=True)
    assert torch.isinf(averaged["fc.bias"][0])


# --- 2. a non-finite validation loss stops the run -----------------------------------------------


class EvalNanNet(TinyNet):
    """TinyNet; from its `nan_from`-th evaluation forward pass (1-based) on, the output is NaN
    (training passes stay finite: only the validation loss shows the divergence)."""

    evals = 0
    nan_from = 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        if not self.training:
            EvalNanNet.evals += 1
            if EvalNanNet.evals >= EvalNanNet.nan_from:
                out = out * float("nan")
        return out


def _train(runner, data: Path, out: Path, *extra: str):
    return runner.invoke(
        app,
        ["train", "--data", str(data), "--workers", "0", "--device", "cpu", "--out", str(out),
         *extra],
    )  # fmt: skip


def test_lr_1e30_stops_on_the_nan_validation_loss_and_keeps_nothing(runner, tmp_path):
    """The issue's run: train loss 0.71, val loss nan, exit 0 and a best.pt picked by top-1."""
    data = write_image_folder(tmp_path / "small", {"a": 6, "b": 6}, size=16)
    out = tmp_path / "run"
    result = _train(
        runner, data, out, "--model", "convnet", "--image-size", "16", "--lr", "1e30",
        "--epochs", "1",
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    line = error_line(result.stderr)
    assert "the validation loss is not finite (NaN or infinite) at epoch 1: the run diverged" in (
        line
    )
    assert "nothing of this epoch was saved; lower --lr" in line  # the training-loss hint
    assert not out.exists()  # as for a run whose training loss diverges in its first epoch


def test_a_nan_validation_loss_in_epoch_two_keeps_epoch_one(runner, tmp_path):
    data = tmp_path / "data"
    write_image_folder(data / "train", {"a": 4, "b": 4, "c": 4}, seed=1)
    write_image_folder(data / "val", {"a": 1, "b": 1, "c": 1}, seed=2)
    EvalNanNet.evals, EvalNanNet.nan_from = 0, 2  # one validation batch per epoch: epoch 2
    out = tmp_path / "run"
    result = _train(
        runner, data, out, "--model", f"{HERE}:EvalNanNet", "--image-size", "8",
        "--batch-size", "4", "--epochs", "3",
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "the validation loss is not finite (NaN or infinite) at epoch 2" in error_line(
        result.stderr
    )
    for name in ("last.pt", "best.pt"):
        checkpoint = torch.load(out / name, map_location="cpu", weights_only=True)
        assert checkpoint["epoch"] == 1, name
    assert (out / "metrics.csv").read_text().count("\n") == 2  # header + epoch 1
    assert "nan" not in (out / "metrics.csv").read_text()


def test_a_nan_ema_validation_loss_is_divergence_too():
    from torchkit.core.train.epochs import check_val_finite
    from torchkit.core.train.loop import DivergedError

    check_val_finite({"val_loss": 0.5, "val_ema_loss": 0.4}, 3)  # finite: nothing
    with pytest.raises(DivergedError, match="the EMA validation loss is not finite .* epoch 3"):
        check_val_finite({"val_loss": 0.5, "val_ema_loss": math.inf}, 3)
    with pytest.raises(DivergedError, match="lower --lr"):
        check_val_finite({"val_loss": math.nan}, 1)


# --- 3. mult-adds count what runs ----------------------------------------------------------------


class NoopNet(nn.Module):
    """A leaf module with 1,152 parameters whose forward runs no operation."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(8, 16, 3, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class ScaleOnly(nn.Module):
    """A leaf with a weight and a bias; its forward reads the weight (and the bias's shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4))
        self.bias = nn.Parameter(torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.bias.shape == x.shape[-1:]  # looking at a shape runs nothing
        return x * self.weight


class UnusedConv(nn.Module):
    """Holds a Conv2d that its forward never calls."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


@pytest.mark.parametrize("on_meta", [True, False])
def test_mult_adds_count_only_parameters_an_operation_reads(on_meta):
    from torchkit.core.summary import summarize

    noop = summarize(NoopNet(), [(1, 3, 8, 8)], on_meta=on_meta)
    assert noop.total_params == 1152
    assert noop.total_mult_adds == 0 and noop.flops == 0 and noop.layers[0].mult_adds == 0
    unused = summarize(UnusedConv(), [(1, 3, 8, 8)], on_meta=on_meta)
    assert unused.total_mult_adds == 0 and unused.flops == 0
    scale = summarize(ScaleOnly(), [(2, 4)], on_meta=on_meta)
    assert scale.total_mult_adds == 2 * 4  # the weight, once per sample; not the bias


def test_summary_of_a_module_that_runs_nothing_reports_zero_mult_adds(runner):
    result = runner.invoke(app, ["summary", f"{HERE}:NoopNet", "-i", "3,8,8", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    totals = json.loads(result.stdout)["totals"]
    assert totals["total_mult_adds"] == 0 and totals["flops"] == 0
    assert totals["total_params"] == 1152


def test_layers_that_run_still_agree_with_torchinfo():
    import torchinfo

    from torchkit.core.summary import summarize

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 5),
    )
    expected = torchinfo.summary(model, input_size=(2, 3, 8, 8), verbose=0).total_mult_adds
    assert summarize(model, [(2, 3, 8, 8)]).total_mult_adds == expected
    lstm = nn.LSTM(8, 16, 2, batch_first=True)
    expected = torchinfo.summary(lstm, input_size=(2, 5, 8), verbose=0).total_mult_adds
    assert summarize(lstm, [(2, 5, 8)]).total_mult_adds == expected


# --- 4. convert cifar bounds what a member may expand to ----------------------------------------


class _Zeros(io.RawIOBase):
    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        count = min(len(buffer), self.left)
        buffer[:count] = bytes(count)
        self.left -= count
        return count


def _zero_archive(path: Path, members: dict[str, int]) -> Path:
    """A tar.gz of members of zeros (a few KiB on disk per MiB of member)."""
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        for name, size in members.items():
            info = tarfile.TarInfo(name)
            info.size = size
            tar.addfile(info, io.BufferedReader(_Zeros(size), MIB))
    return path


def test_a_crafted_member_is_refused_before_it_is_read(tmp_path, monkeypatch):
    import torchkit.core.convert.cifar as cifar

    monkeypatch.setattr(cifar, "MAX_MEMBER_BYTES", MIB)
    archive = _zero_archive(
        tmp_path / "bomb.tar.gz", {"cifar-10-batches-py/data_batch_1": 64 * MIB}
    )
    assert archive.stat().st_size < MIB // 2
    tracemalloc.start()
    try:
        with pytest.raises(
            InputError, match="data_batch_1' expands to 64 MiB, more than the 1 MiB"
        ):
            cifar.read_cifar(archive)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * MIB  # never read whole (64 MiB)


def test_convert_cifar_of_a_crafted_archive_is_one_error_line_and_writes_nothing(
    runner, tmp_path, monkeypatch
):
    import torchkit.core.convert.cifar as cifar

    monkeypatch.setattr(cifar, "MAX_MEMBER_BYTES", MIB)
    archive = _zero_archive(tmp_path / "bomb.tar.gz", {"cifar-10-batches-py/test_batch": 8 * MIB})
    out = tmp_path / "out"
    result = runner.invoke(app, ["convert", "cifar", str(archive), str(out)])
    assert result.exit_code == 1, result.output
    line = error_line(result.stderr)
    assert f"refused to read {archive}" in line and "expands to 8 MiB" in line
    assert not out.exists() and hidden_siblings(out) == []


def test_members_adding_up_past_the_archive_bound_are_refused(tmp_path, monkeypatch):
    import torchkit.core.convert.cifar as cifar

    monkeypatch.setattr(cifar, "MAX_ARCHIVE_BYTES", 2 * MIB)
    members = {f"cifar-10-batches-py/junk_{i}": MIB for i in range(3)}  # not even CIFAR names
    archive = _zero_archive(tmp_path / "many.tar.gz", members)
    with pytest.raises(InputError, match="its members expand to more than 2 MiB"):
        cifar.read_cifar(archive)


def test_a_folder_file_past_the_bound_is_refused_without_reading_it(tmp_path, monkeypatch):
    import torchkit.core.convert.cifar as cifar

    monkeypatch.setattr(cifar, "MAX_MEMBER_BYTES", MIB)
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    with open(folder / "data_batch_1", "wb") as handle:
        handle.truncate(1 << 40)  # a sparse terabyte: costs no disk
    with pytest.raises(InputError, match="data_batch_1 expands to 1,048,576 MiB"):
        cifar.read_cifar(folder)


def test_reading_is_bounded_while_streaming(monkeypatch):
    """Whatever a header claims, reading stops just past the bound: chunks, never everything."""
    import torchkit.core.convert.cifar as cifar

    monkeypatch.setattr(cifar, "MAX_MEMBER_BYTES", 3 * MIB)

    class Endless(io.RawIOBase):
        requested: list[int] = []

        def readable(self) -> bool:
            return True

        def read(self, size: int = -1) -> bytes:
            assert size > 0, "read whole"
            Endless.requested.append(size)
            return bytes(size)

    with pytest.raises(InputError, match="expands to 4 MiB"):
        cifar._read_bounded(Endless(), Path("src"), "member")
    assert sum(Endless.requested) <= 3 * MIB + cifar._CHUNK_BYTES


# --- 5. absurd summary input sizes ---------------------------------------------------------------


class ItemNet(nn.Module):
    """Reads a value (`.item()`): it cannot run on the meta device, so summary runs it for real."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x) * float(x.mean().item() < 2)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["convnet", "-i", "99999999999999999999,1,1"], "is too large: 99,999,999,999,999,999,999"),
        (["convnet", "-i", "3,3000000000,3000000000"], "is too large"),
        (
            ["convnet", "-i", "3,8,8", "-b", "99999999999999999999"],
            "--batch-size 99999999999999999999 of inputs 3,8,8 is more values than a tensor",
        ),
        (["convnet", "-i", "0,1,1"], "invalid input size '0,1,1'"),
        (["convnet", "-i", "3,-8,8"], "invalid input size '3,-8,8'"),
        # convnet's classifier grows with the image: petabytes for this one, refused unbuilt
        (
            ["convnet", "-i", "3,1000000,1000000"],
            "weights in its first linear layer (8,191,934.5 GB)",
        ),
        # a real run's input alone would not fit: refused before it is allocated
        ([f"{HERE}:ItemNet", "-i", "3,10000000,10000000"], "GB, more than the"),
    ],
)
def test_absurd_input_sizes_are_one_usage_error_line(runner, args, message):
    result = runner.invoke(app, ["summary", *args])
    assert result.exit_code == 2, result.output
    line = error_line(result.stderr)
    assert message in line and "Traceback" not in result.output
    assert result.stdout == ""


def test_the_core_refuses_sizes_no_tensor_holds():
    from torchkit.core.summary import summarize
    from torchkit.core.summary.run import parse_input_size

    with pytest.raises(UsageError, match="is too large"):
        parse_input_size("1," + str(2**63))
    with pytest.raises(UsageError, match="is too large"):
        summarize(nn.Identity(), [(2**32, 2**32)])
    with pytest.raises(UsageError, match="GB, more than the"):
        summarize(ItemNet(), [(1, 3, 10**7, 10**7)])
    assert summarize(ItemNet(), [(1, 3, 8, 8)]).total_mult_adds == 4 * 3 * 3 * 3 * 36 + 4 * 36
