"""Issue #29 ("Trust, round three"), "What a user is not told", and two preprocessing cases: a
write error on stdout from --help/--version, a dangling image link in a folder for
dataset-stats, `out:`/`resume:`/`force:` and duplicate keys in config files, --topk cut to the
classes, predict's summary when images are unreadable, a model file's unusable preprocessing,
empty --batch-size items, --find-lr on a tiny folder, and "is a exported-program file"."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
import torch
from image_folders import write_image_folder
from output_checks import error_line
from processes import run_torchkit_in_process, run_torchkit_process

from torchkit.cli import app
from torchkit.core.data.preprocessing import Preprocess
from torchkit.core.io.errors import CheckpointError
from torchkit.core.models.checkpoint import FORMAT_VERSION, save_checkpoint
from torchkit.core.models.convnet import convnet_class

CLASSES = ["a", "b"]
GOOD = Preprocess(image_size=12, resize_size=12, mean=(0.5,) * 3, std=(0.25,) * 3)
CPU = ["--device", "cpu", "-j", "0"]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    """Hand-made torchkit checkpoints of a 2-class convnet (a good one and ones whose recorded
    preprocessing is unusable) and a tiny image folder with classes a and b."""
    root = tmp_path_factory.mktemp("round_three")
    torch.manual_seed(0)
    model = convnet_class()(2, 3, 12).eval()
    broken = {
        "good": {},
        "std0": {"std": [0.0, 0.0, 0.0]},
        "mean7": {"mean": [0.5] * 7},
        "nanmean": {"mean": [float("nan")] * 3},
        "area": {"interpolation": "area"},
    }
    for name, change in broken.items():
        save_checkpoint(
            {
                "format_version": FORMAT_VERSION,
                "arch": "convnet",
                "num_classes": 2,
                "classes": CLASSES,
                "model": model.state_dict(),
                "preprocess": {**GOOD.to_dict(), **change},
            },
            root / f"{name}.pt",
        )
    images = write_image_folder(root / "images", {"a": 3, "b": 3}, size=14)
    return {"root": root, "images": images}


# -- 1. a write error on stdout from --help and --version ----------------------------------------


def _into_full_disk(*args: str) -> subprocess.CompletedProcess:
    """`torchkit ARGS > /dev/full` (a disk with no room left) in a real process."""
    with open("/dev/full", "w") as full:
        return run_torchkit_process(*args, stdout=full.fileno())


def test_short_version_option_is_version():
    # -V is --version's other name on the same option: the full-disk path is tested once, for
    # --version; here that the short name is still there, in this process.
    long, short = run_torchkit_in_process("--version"), run_torchkit_in_process("-V")
    assert (short.returncode, short.stdout, short.stderr) == (0, long.stdout, "")
    assert long.returncode == 0 and long.stdout.startswith("torchkit ")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize(
    "args", [["--help"], ["--version"], ["predict", "--help"], ["convert"], []]
)
def test_help_and_version_into_a_full_disk_are_one_error_line(args):
    done = _into_full_disk(*args)
    assert done.returncode == 1, done.stderr
    line = error_line(done.stderr, besides="nothing")
    assert line.startswith("Error: cannot write to standard output: No space left on device")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("what", ["dataset-stats", "predict"])
def test_results_into_a_full_disk_are_one_error_line(world, what):
    """A command's results (written at once, or streamed row by row) that stdout cannot take:
    exit 1 and one error line, not an internal OSError line nor Python's complaint at exit."""
    images = str(world["images"])
    args = {
        "dataset-stats": ["dataset-stats", images, "--format", "csv", "-j", "0"],
        "predict": ["predict", str(world["root"] / "good.pt"), images, *CPU, "--format", "csv"],
    }[what]
    done = _into_full_disk(*args)
    assert done.returncode == 1, done.stderr
    line = error_line(done.stderr)
    assert line.startswith("Error: cannot write to standard output: No space left on device")
    assert "Exception ignored" not in done.stderr and "OSError" not in done.stderr


def test_results_left_in_stdouts_buffer_that_a_full_disk_refuses_at_exit(monkeypatch, capsys):
    """The last flush, at the command's end: a full disk there fails a command that said
    nothing of it (exit 1 and the one error line), not Python's complaint and exit 120."""
    import errno

    from torchkit.cli.app import flushed_stdout

    class FullDisk(io.StringIO):
        def flush(self):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def fileno(self):
            raise io.UnsupportedOperation("fileno")

    monkeypatch.setattr(sys, "stdout", FullDisk())
    assert flushed_stdout(SystemExit(0)).code == 1
    assert flushed_stdout(SystemExit(3)).code == 3  # an earlier failure stays the one reported
    line = error_line(capsys.readouterr().err)
    assert line.startswith("Error: cannot write to standard output: No space left on device")


class _ShortWrites(io.RawIOBase):
    """A file descriptor that takes at most `step` bytes a write, and `room` bytes in all
    (then ENOSPC): a disk that fills mid-write, as the raw stdout of PYTHONUNBUFFERED=1 sees."""

    def __init__(self, step: int, room: int) -> None:
        self.step, self.room, self.data = step, room, bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        import errno

        if len(self.data) >= self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        taken = bytes(data[: min(self.step, self.room - len(self.data))])
        self.data += taken
        return len(taken)


@pytest.mark.parametrize("room", [10**9, 5000])
def test_results_on_an_unbuffered_stdout_are_written_whole_or_fail(monkeypatch, room):
    """PYTHONUNBUFFERED=1 (container images set it) or `python -u`: stdout's text layer writes
    straight to the file descriptor and dropped what a short write left out, a result cut
    short with exit 0 (`> out.csv` on a disk that filled mid-write). The rest is written
    again, and a disk that has no room left is the one error."""
    from torchkit.cli import console
    from torchkit.core.io.errors import OutputWriteError

    raw = _ShortWrites(step=4096, room=room)
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="utf-8", write_through=True))
    result = "".join(f"row {i},é\n" for i in range(2000))
    with console.results_only_on_stdout():
        if room > len(result.encode()):
            console.stdout.file.write(result)
            console.stdout.file.flush()
            assert raw.data.decode() == result
        else:
            with pytest.raises(OutputWriteError, match="No space left on device"):
                console.stdout.file.write(result)


def test_help_still_shows():
    # Help into a reader that leaves early (`| head -c 1`): cli/test_broken_pipe.py (exit 141,
    # nothing on stderr).
    shown = run_torchkit_process("--help")
    assert shown.returncode == 0 and "Usage: torchkit" in shown.stdout and not shown.stderr


# -- 2. a dangling image link in a folder is unreadable for dataset-stats -------------------------


@pytest.mark.parametrize("layout", ["image folder", "split root", "flat folder"])
def test_dataset_stats_counts_a_dangling_image_link_in_a_folder(runner, tmp_path, layout):
    if layout == "split root":
        root = tmp_path / "data"
        write_image_folder(root / "train", {"a": 3, "b": 2})
        write_image_folder(root / "val", {"a": 1, "b": 1}, seed=1)
        link, shown = root / "train" / "a" / "gone.png", "train/a/gone.png"
    elif layout == "flat folder":
        root = tmp_path / "flat"
        write_image_folder(tmp_path / "tmp", {"x": 5})
        (tmp_path / "tmp" / "x").rename(root)
        link, shown = root / "gone.png", "gone.png"
    else:
        root = write_image_folder(tmp_path / "data", {"a": 3, "b": 2})
        link, shown = root / "a" / "gone.png", "a/gone.png"
    link.symlink_to(tmp_path / "nowhere.png")
    result = runner.invoke(app, ["dataset-stats", str(root), "--format", "json", "-j", "0"])
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["unreadable_count"] == 1 and report["files"] == 6 and report["images"] == 5
    assert report["unreadable"] == [
        {"path": shown, "error": "not a regular file (a symbolic link to nothing)"}
    ]
    assert "skipped 1 unreadable file(s)" in result.stderr
    strict = runner.invoke(app, ["dataset-stats", str(root), "--strict", "-j", "0"])
    assert strict.exit_code == 1 and strict.stdout == ""
    # the report lists it by its place in the data; the error line by its path, as every
    # command's --strict names an unreadable image
    assert f"unreadable image {link}: not a regular file" in error_line(strict.stderr)


# -- 3. `out:`, `resume:` and `force:` in a hand-written config file -------------------------------


def test_a_recipes_out_is_honoured_as_out(runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("epochs: 1\nbatch-size: 512\nimage-size: 8\nout: from-recipe\n")  # 3 steps
    shown = runner.invoke(app, ["train", "--config", str(recipe), "--print-config"])
    assert shown.exit_code == 0, shown.stderr
    assert json.loads(shown.stdout)["out"] == "from-recipe"
    overridden = runner.invoke(
        app, ["train", "--config", str(recipe), "--out", "typed", "--print-config"]
    )
    assert json.loads(overridden.stdout)["out"] == "typed"  # the command line wins
    trained = runner.invoke(app, ["train", "--config", str(recipe), *CPU, "--format", "json"])
    assert trained.exit_code == 0, trained.stderr
    assert (tmp_path / "from-recipe" / "last.pt").is_file()
    assert json.loads(trained.stdout)["out_dir"] == "from-recipe"


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("resume: runs/old", "'resume' in"),
        ("force: true", "'force' in"),
        ("--resume: runs/old", "'--resume' in"),
    ],
)
def test_resume_and_force_in_a_recipe_are_refused_by_name(runner, tmp_path, key, message):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"epochs: 1\n{key}\n")
    result = runner.invoke(app, ["train", "--config", str(recipe), "--print-config"])
    assert result.exit_code == 2
    line = error_line(result.stderr, besides="nothing")
    assert message in line and "is not taken from a config file" in line
    assert ("--resume RUN" if "resume" in key else "--force") in line


def test_a_run_config_json_still_drops_its_out(runner, tmp_path):
    recorded = tmp_path / "config.json"
    recorded.write_text(json.dumps({"options": {"epochs": 1, "out": "runs/old", "force": True}}))
    result = runner.invoke(app, ["train", "--config", str(recorded), "--print-config"])
    assert result.exit_code == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["out"] is None and shown["force"] is False and shown["epochs"] == 1


# -- 4. duplicate keys in a config file or a class-weights file -----------------------------------


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("recipe.yaml", "lr: 0.01\nepochs: 1\nlr: 0.5\n", "key 'lr' is given twice in"),
        ("recipe.json", '{"lr": 0.01, "lr": 0.5}', "key 'lr' is given twice in"),
        ("recipe.yaml", "lr: 0.01\n--lr: 0.5\n", "--lr is given twice in"),
    ],
)
def test_a_key_given_twice_in_a_config_file_is_refused(runner, tmp_path, name, text, message):
    recipe = tmp_path / name
    recipe.write_text(text)
    result = runner.invoke(app, ["train", "--config", str(recipe), "--print-config"])
    assert result.exit_code == 1 and result.stdout == ""
    line = error_line(result.stderr, besides="nothing")
    assert message in line and str(recipe) in line


def test_yaml_merge_keys_are_not_duplicates(tmp_path):
    from torchkit.core.train.config_file import read_config_file

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("<<: {lr: 0.1, epochs: 2}\nlr: 0.2\n")
    assert read_config_file(recipe) == {"lr": 0.2, "epochs": 2}


@pytest.mark.parametrize("suffix", [".json", ".txt"])
def test_a_class_given_twice_in_a_class_weights_file_is_refused(runner, tmp_path, suffix):
    weights = tmp_path / f"weights{suffix}"
    if suffix == ".json":
        items = ", ".join(f'"{i}": 1.0' for i in range(10))
        weights.write_text("{" + items + ', "0": 5.0}')
    else:
        weights.write_text("".join(f"{i},1.0\n" for i in range(10)) + "0,5.0\n")
    out = tmp_path / "run"
    result = runner.invoke(
        app,
        ["train", "--data", "digits", "--class-weights", str(weights), "--epochs", "1",
         "--out", str(out), *CPU],
    )  # fmt: skip
    assert result.exit_code == 1
    line = error_line(result.stderr)
    assert f"class '0' is given twice in {weights}" in line
    assert not out.exists()


# -- 5. --topk larger than the classes ---------------------------------------------------------


def test_predict_says_when_topk_is_cut_to_the_classes(runner, world):
    args = ["predict", str(world["root"] / "good.pt"), str(world["images"]), *CPU]
    result = runner.invoke(app, [*args, "--topk", "5", "--format", "csv"])
    assert result.exit_code == 0, result.stderr
    assert "Note: --topk 5 is more than the 2 classes; using 2" in result.stderr
    assert result.stdout.splitlines()[0].endswith("class_2,probability_2,error")
    quiet = runner.invoke(app, [*args, "--topk", "2", "--format", "csv"])
    assert quiet.exit_code == 0 and "--topk" not in quiet.stderr
    evaluated = runner.invoke(
        app,
        ["eval", str(world["root"] / "good.pt"), "--data", str(world["images"]), "--topk", "5",
         "--format", "json", *CPU],
    )  # fmt: skip
    assert evaluated.exit_code == 0, evaluated.stderr
    assert "--topk 5 with 2 classes: every class is in the top 5" in evaluated.stderr
    assert json.loads(evaluated.stdout)["top5"] is None  # named for k, null: 1 by definition


# -- 6. predict where images are unreadable ----------------------------------------------------


def test_predict_summary_counts_the_unreadable_images(runner, world, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    for i in range(3):
        (bad / f"x{i}.png").write_bytes(b"not an image")
    checkpoint = str(world["root"] / "good.pt")
    result = runner.invoke(app, ["predict", checkpoint, str(bad), "--format", "csv", *CPU])
    assert result.exit_code == 1, result.stderr  # a row with an error each, and no result
    assert error_line(result.stderr).startswith(
        f"Error: none of the 3 images in {bad} could be read"
    )
    mixed = runner.invoke(
        app, ["predict", checkpoint, str(bad), str(world["images"]), "--format", "csv", *CPU]
    )
    assert mixed.exit_code == 0, mixed.stderr
    summary = [line for line in mixed.stderr.splitlines() if "predicted" in line]
    assert summary and "predicted 6 of 9 images" in summary[0]
    assert summary[0].endswith("; 3 unreadable")


# -- 7. a model file's unusable preprocessing --------------------------------------------------


@pytest.mark.parametrize(
    ("name", "field"),
    [
        ("std0", "std [0.0, 0.0, 0.0] has a value that is not above 0"),
        ("mean7", "mean has 7 value(s) for 3-channel images"),
        ("nanmean", "mean [nan, nan, nan] is not all finite numbers"),
        ("area", "interpolation 'area' is not one of bilinear, bicubic, nearest, lanczos"),
    ],
)
@pytest.mark.parametrize("command", ["predict", "eval"])
def test_unusable_preprocessing_is_one_error_before_any_output(runner, world, name, field, command):
    checkpoint = str(world["root"] / f"{name}.pt")
    data = [str(world["images"])] if command == "predict" else ["--data", str(world["images"])]
    result = runner.invoke(app, [command, checkpoint, *data, "--format", "csv", *CPU])
    assert result.exit_code == 1
    assert result.stdout == ""  # no CSV header before the error
    line = error_line(result.stderr)
    assert f"the preprocessing recorded in {checkpoint} is unusable: {field}" in line
    assert "unreadable" not in result.stderr and "RuntimeError" not in result.stderr


def test_options_override_unusable_preprocessing_and_are_checked_themselves(runner, world):
    images = str(world["images"])
    fixed = runner.invoke(
        app, ["predict", str(world["root"] / "std0.pt"), images, "--std", "0.25", *CPU]
    )
    assert fixed.exit_code == 0, fixed.stderr
    fixed = runner.invoke(
        app, ["predict", str(world["root"] / "mean7.pt"), images, "--mean", "0.5", *CPU]
    )
    assert fixed.exit_code == 0, fixed.stderr
    good = str(world["root"] / "good.pt")
    for option, value, message in (
        ("--std", "0", "--std values must be positive"),
        ("--mean", "0.5,0.5", "--mean has 2 values but the images have 3 channels"),
        ("--std", "nan", "--std must be finite numbers"),
    ):
        refused = runner.invoke(app, ["predict", good, images, option, value, *CPU])
        assert refused.exit_code == 2, refused.stderr
        assert message in error_line(refused.stderr) and refused.stdout == ""


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"in_channels": -3}, "in_channels is -3"),
        ({"in_channels": 0}, "in_channels is 0"),
        ({"image_size": 0}, "image_size is 0"),
        ({"resize_size": -1}, "resize_size is -1"),
    ],
)
@pytest.mark.parametrize("command", ["export", "summary", "predict"])
def test_sizes_and_channels_below_one_are_a_damaged_file_in_every_command(
    world, tmp_path, change, field, command
):
    """Before: export ended in 'Error: RuntimeError: Trying to create tensor with negative
    dimension -3', summary in 'input size (1, -3, 12, 12) has a dimension that is not
    positive', and 0 channels in weights that do not fit the model."""
    checkpoint = torch.load(world["root"] / "good.pt", weights_only=True)
    checkpoint["preprocess"].update(change)
    path = tmp_path / "damaged.pt"
    torch.save(checkpoint, path)
    args = {
        "export": ["export", str(path), str(tmp_path / "out.onnx"), "--no-verify"],
        "summary": ["summary", str(path)],
        "predict": ["predict", str(path), str(world["images"]), *CPU],
    }[command]
    done = run_torchkit_in_process(*args)
    assert done.returncode == 1, done.stderr
    assert error_line(done.stderr) == (
        f"Error: the preprocessing recorded in {path} is unusable: {field}, not a positive "
        "whole number (the file is damaged or was not written by torchkit)"
    )
    assert done.stdout == "" and sorted(p.name for p in tmp_path.iterdir()) == ["damaged.pt"]


def test_preprocessing_values_of_the_wrong_kind_are_a_checkpoint_error():
    with pytest.raises(CheckpointError, match=r"model.pt is unusable: mean is 'abc'"):
        Preprocess.from_dict({"mean": "abc"}, "model.pt")
    with pytest.raises(CheckpointError, match=r"image_size is 12.5, not a whole number"):
        Preprocess.from_dict({"image_size": 12.5})
    assert Preprocess.from_dict({"in_channels": 1, "image_size": 10}).problem() is None
    assert Preprocess.from_dict(GOOD.to_dict()) == GOOD
    assert Preprocess(image_size=0).problem()[0] == "image_size"


# -- 8. empty --batch-size items ---------------------------------------------------------------


@pytest.mark.parametrize("sizes", ["1,,2", ",1", "1,", ""])
def test_benchmark_refuses_empty_batch_size_items(runner, sizes):
    result = runner.invoke(app, ["benchmark", "convnet", "-i", "3,12,12", "-b", sizes, *CPU[:2]])
    assert result.exit_code == 2
    assert "an empty" in error_line(result.stderr, besides="nothing")  # item, or value ('')


def test_batch_size_lists_with_spaces_still_parse():
    from torchkit.core.benchmark.run import parse_batch_sizes

    assert parse_batch_sizes("1, 8 ,32") == (1, 8, 32)
    assert parse_batch_sizes("1 8") == (1, 8)


# -- 9. --find-lr needs no validation set, and says what it ignores ------------------------------


def test_find_lr_on_a_tiny_folder_and_the_options_it_ignores(runner, tmp_path):
    data = write_image_folder(tmp_path / "tiny", {"a": 2, "b": 2}, size=12)
    out = tmp_path / "run"
    result = runner.invoke(
        app,
        ["train", "--data", str(data), "--model", "convnet", "--find-lr", "--find-lr-iters", "5",
         "--image-size", "12", "--epochs", "3", "--early-stop", "2", "--out", str(out),
         "--format", "json", *CPU],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["lr_find_iterations"] >= 1
    assert (out / "lr_find.csv").is_file()
    notes = [line for line in result.stderr.splitlines() if "--find-lr runs" in line]
    assert len(notes) == 1 and notes[0].endswith("--epochs, --early-stop are ignored")


# -- 10. "is a exported-program file" ---------------------------------------------------------


def test_an_untrusted_exported_program_is_named_with_an_article(runner, world, tmp_path):
    exported = tmp_path / "model.pt2"
    made = runner.invoke(app, ["export", str(world["root"] / "good.pt"), str(exported)])
    assert made.exit_code == 0, made.stderr
    result = runner.invoke(app, ["predict", str(exported), str(world["images"]), *CPU])
    assert result.exit_code != 0
    line = error_line(result.stderr)
    assert f"{exported} is a torch.export archive, whose code runs" in line
    assert "a exported" not in line
