"""Issue #31, items 6 and 7: a bounded, visible --find-batch-size; video-info refuses still
images; env lists onnx, onnxruntime and timm; convert tensor's warning says "failed" as its table
does; the docs' file names and video-info JSON shape match the code; the class error of split data
names every split that has the class; benchmark rows record the spec as given; convert
checkpoint takes `state_dict` beside EMA copies; `-v` after the command name."""

from __future__ import annotations

import csv
import io
import json
import logging
import re
from pathlib import Path

import pytest
import torch
from image_folders import write_image_folder
from output_checks import error_line
from rich.console import Console
from suite_paths import REPO

from torchkit.cli import app
from torchkit.core.benchmark import COLUMNS, Trial, search_batch_size
from torchkit.core.benchmark import run as bench_run
from torchkit.core.benchmark.search import OVER_LIMIT
from torchkit.core.io.errors import InputError
from torchkit.core.models.checkpoint import FORMAT_VERSION, save_checkpoint

# What the docs say of each command lives in its page.
COMMAND_DOCS = {
    name: (REPO / "docs" / "commands" / f"{name}.md").read_text(encoding="utf-8")
    for name in ("convert", "video-info")
}
FAST = ["--device", "cpu", "--warmup", "0", "--iters", "1"]


def docs_line(containing: str, page: str) -> str:
    (line,) = [line for line in COMMAND_DOCS[page].splitlines() if containing in line]
    return line


# --- 6: --find-batch-size stops within 10%, says so, and shows its progress --------------------


def linear_memory(limit_mb: float, per_image_mb: float = 0.55, fixed_mb: float = 10.0):
    """A trial whose peak grows with the batch, as convnet's does (3,500 near a 2 GB limit)."""

    def try_batch(batch: int, trials: list) -> Trial:
        peak = fixed_mb + per_image_mb * batch
        return Trial(batch, peak <= limit_mb, peak, "fits" if peak <= limit_mb else OVER_LIMIT)

    return try_batch


def test_search_stops_once_the_bracket_is_within_ten_percent():
    from torchkit.core.benchmark.search import PRECISION

    found, stopped_by, trials = search_batch_size(linear_memory(2000.0), start=1, max_batch=4096)
    largest = (2000.0 - 10.0) / 0.55  # 3618: the largest batch that fits
    failed = min(t.batch_size for t in trials if not t.fits)
    assert stopped_by == OVER_LIMIT and PRECISION == 0.1
    assert failed <= found * 1.1 and largest / 1.1 <= found <= largest
    tried = [t.batch_size for t in trials]
    assert tried[12:] == [4096, 3072, 3584, 3840]  # not 3,600-something in steps of 32
    exact = search_batch_size(linear_memory(2000.0), start=1, max_batch=4096, precision=0)
    assert exact[0] == 3618 and len(exact[2]) > len(trials) + 5


def synthetic_trial(self, mode, batch, limit):
    peak = 1.0 * batch  # 1 MB per image
    fits = limit is None or peak * 1e6 <= limit
    return Trial(batch, fits, peak, "fits" if fits else OVER_LIMIT)


def test_find_batch_size_states_its_precision_in_help_and_json(runner, monkeypatch):
    help_text = runner.invoke(app, ["benchmark", "--help"], env={"COLUMNS": "300"}).stdout
    assert "stops within 10%" in " ".join(help_text.split())
    monkeypatch.setattr(bench_run._Context, "trial", synthetic_trial)
    args = ["benchmark", "convnet", "-i", "1,28,28", *FAST, "--find-batch-size"]
    result = runner.invoke(app, [*args, "--memory-limit", "100MB", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    (search,) = json.loads(result.stdout)["batch_size_search"]
    assert search["precision"] == 0.1
    assert search["batch_size"] < search["not_fitting"] <= search["batch_size"] * 1.1
    assert search["not_fitting"] == min(t["batch_size"] for t in search["trials"] if not t["fits"])
    table = runner.invoke(app, [*args, "--memory-limit", "100MB"]).stdout
    assert "within 10%" in table and f"{search['not_fitting']} did not fit" in table


def test_find_batch_size_shows_each_trial_on_a_terminal_and_nothing_on_stdout(runner, monkeypatch):
    from torchkit.cli import console

    monkeypatch.setattr(bench_run._Context, "trial", synthetic_trial)
    terminal = io.StringIO()
    monkeypatch.setattr(console, "stderr", Console(file=terminal, force_terminal=True, width=200))
    args = ["benchmark", "convnet", "-i", "1,28,28", *FAST, "--find-batch-size"]
    result = runner.invoke(app, [*args, "--memory-limit", "40MB", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    json.loads(result.stdout)  # stdout holds the JSON alone
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", terminal.getvalue())
    assert "finding the batch size (infer): trying 1" in shown
    assert "trying 64 (32 fits)" in shown and "(32 fits, 64 does not)" in shown
    assert "timing the batch found (infer, " in shown


# --- 7a: video-info refuses still images ----------------------------------------------------------


def still_and_animated(folder: Path) -> dict[str, Path]:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    paths = {name: folder / name for name in ("gray.png", "photo.jpg", "still.gif", "anim.gif")}
    Image.new("L", (32, 32), 128).save(paths["gray.png"])
    Image.new("RGB", (32, 32), (10, 200, 30)).save(paths["photo.jpg"])
    Image.new("RGB", (32, 32), (200, 0, 0)).save(paths["still.gif"])
    frames = [Image.new("RGB", (16, 16), (80 * i, 0, 0)) for i in range(3)]
    frames[0].save(paths["anim.gif"], save_all=True, append_images=frames[1:], duration=100)
    return paths


def test_video_info_reports_a_still_image_as_not_a_video(runner, tmp_path):
    from torchkit.core.video import probe_video

    paths = still_and_animated(tmp_path)
    for name, kind in (("gray.png", "PNG"), ("photo.jpg", "JPEG"), ("still.gif", "GIF")):
        info = probe_video(paths[name])
        assert (info.status, info.error) == ("unreadable", f"a still image ({kind}), not a video")
        assert info.fps is None and info.codec is None
    animated = probe_video(paths["anim.gif"])  # a GIF with frames is left to FFmpeg
    assert animated.status == "ok" and animated.frames == 3
    result = runner.invoke(app, ["video-info", str(paths["gray.png"]), "--format", "json"])
    assert result.exit_code == 1
    (row,) = json.loads(result.stdout)
    assert row["status"] == "unreadable" and "still image (PNG)" in row["error"]
    assert "1 of 1 videos could not be read: 1 unreadable" in error_line(result.stderr)


# --- 7b: env lists onnx, onnxruntime and timm -----------------------------------------------------


def test_env_lists_onnx_onnxruntime_and_timm_installed_or_not(runner, monkeypatch):
    from torchkit.core.env import package_versions

    versions = package_versions()
    for name in ("onnx", "onnxruntime", "timm"):
        assert name in versions
    import torchkit.core.env as env

    real = env.installed_version

    def without_them(*names: str) -> str | None:
        return None if names[0].startswith(("onnx", "timm")) else real(*names)

    monkeypatch.setattr(env, "installed_version", without_them)
    rows = dict(csv.reader(io.StringIO(runner.invoke(app, ["env", "--format", "csv"]).stdout)))
    assert all(f"packages.{name}" in rows for name in ("onnx", "onnxruntime", "timm"))
    table = runner.invoke(app, ["env"], env={"COLUMNS": "200"}).stdout
    for name in ("onnx", "onnxruntime", "timm"):
        (line,) = [line for line in table.splitlines() if re.search(rf"\b{name}\b\s*│", line)]
        assert "not installed" in line


# --- 7c: a file that failed is "failed", in the table and the warning -----------------------------


def test_convert_tensor_warning_says_failed_like_its_table(runner, tmp_path):
    source = write_image_folder(tmp_path / "in", {"a": 1})
    (source / "a" / "broken.jpg").write_bytes(b"not a jpeg")
    args = ["convert", "tensor", str(source), str(tmp_path / "out"), "--to", "npy", "-j", "1"]
    result = runner.invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 1, result.stderr  # a file that failed fails the command
    report = json.loads(result.stdout)
    assert (report["failed"], report["skipped"]) == (1, 0)
    assert "Warning: failed to convert " in result.stderr and "broken.jpg" in result.stderr
    assert "Error: 1 of 2 files could not be converted" in result.stderr
    assert "skipped" not in result.stderr


# --- 7d and 7e: the docs say what the code does --------------------------------------------------


def test_batch_file_names_are_zero_padded_as_readme_says(runner, tmp_path):
    for count, names in ((3, ["batch_0.png", "batch_1.png", "batch_2.png"]), (12, None)):
        folder = tmp_path / f"frames{count}"
        torch.save(torch.rand(count, 3, 4, 4), tmp_path / "batch.pt")
        result = runner.invoke(
            app, ["convert", "tensor", str(tmp_path / "batch.pt"), str(folder), "--to", "png"]
        )
        assert result.exit_code == 0, result.stderr
        written = sorted(p.name for p in folder.iterdir())
        expected = names or [f"batch_{i:02d}.png" for i in range(12)]
        assert written == expected  # in the order a shell lists them
    example = docs_line("convert tensor batch.pt frames/ --to png", "convert")
    assert "frames/batch_0.png" in example  # what a batch of 2 to 10 images gives
    assert "`batch_00.png` ... `batch_11.png` for 12" in " ".join(COMMAND_DOCS["convert"].split())


def test_video_info_json_is_an_array_as_readme_says(runner, tmp_path):
    paths = still_and_animated(tmp_path)
    result = runner.invoke(
        app, ["video-info", str(paths["anim.gif"]), "--format", "json", "--skip-errors"]
    )
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert isinstance(data, list) and len(data) == 1  # one file: still an array of one object
    assert "a JSON array, one object per video" in docs_line("video-info a.mp4 b.avi", "video-info")


# --- 7g: the class error names the splits that have the class -------------------------------------


def test_unknown_class_error_names_every_split_that_has_it(tmp_path):
    from torchkit.core.data.sources import open_data

    nine = [str(i) for i in range(9)]
    with pytest.raises(InputError, match=r"9 of digits \(train, val, test\) are not among"):
        open_data("digits", classes=nine)
    root = tmp_path / "splits"
    write_image_folder(root / "train", {"a": 2, "b": 2})
    write_image_folder(root / "val", {"a": 1, "b": 1})
    write_image_folder(root / "test", {"a": 1, "b": 1, "c": 1})
    with pytest.raises(InputError) as raised:
        open_data(str(root), classes=["a", "b"])
    assert f"class(es) c of {root} (test) are not among the model's 2 classes" in str(raised.value)


# --- 7h: benchmark rows record the spec as given --------------------------------------------------


def tiny_checkpoint(path: Path) -> Path:
    from torchkit.core.models.convnet import convnet_class

    save_checkpoint(
        {
            "format_version": FORMAT_VERSION,
            "arch": "convnet",
            "num_classes": 3,
            "classes": ["a", "b", "c"],
            "model": convnet_class()(3, 3, 12).state_dict(),
            "preprocess": {"image_size": 12, "resize_size": 12},
        },
        path,
    )
    return path


def test_benchmark_rows_record_the_checkpoint_and_old_files_still_append(runner, tmp_path):
    checkpoint = tiny_checkpoint(tmp_path / "best.pt")
    out = tmp_path / "bench.csv"
    args = ["benchmark", str(checkpoint), "-b", "1", *FAST, "-o", str(out), "--append"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    (row,) = list(csv.DictReader(out.open()))
    assert (row["model"], row["spec"]) == ("convnet", str(checkpoint))
    assert COLUMNS[-1] == "spec" and COLUMNS[:3] == ("model", "mode", "batch_size")
    # A file an earlier torchkit wrote (no spec column) takes the rows without it, with a note.
    old = tmp_path / "old.csv"
    old_columns = [c for c in COLUMNS if c != "spec"]
    old.write_text(",".join(old_columns) + "\n")
    result = runner.invoke(app, [*args[:-3], "-o", str(old), "--append"])
    assert result.exit_code == 0, result.stderr
    (row,) = list(csv.DictReader(old.open()))
    assert list(row) == old_columns and row["model"] == "convnet"
    assert "has no spec column" in result.stderr
    # --weights is part of what was given.
    spec = ["convnet", "--weights", str(checkpoint)]
    weights = runner.invoke(
        app, ["benchmark", *spec, "-i", "3,12,12", "-b", "1", *FAST, "--format", "json"]
    )
    assert weights.exit_code == 0, weights.stderr
    (row,) = json.loads(weights.stdout)["results"]
    assert row["spec"] == f"convnet --weights {checkpoint}"


# --- 7i: state_dict beside EMA weights is taken, with a note --------------------------------------


def test_convert_checkpoint_takes_state_dict_beside_model_ema(runner, tmp_path):
    from safetensors.torch import load_file

    model, ema = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    source = tmp_path / "last.pth"
    torch.save({"state_dict": model.state_dict(), "model_ema": ema.state_dict()}, source)
    out = tmp_path / "w.safetensors"
    result = runner.invoke(app, ["convert", "checkpoint", str(source), str(out)])
    assert result.exit_code == 0, result.stderr
    loaded = load_file(out)
    assert all(torch.equal(loaded[k], v) for k, v in model.state_dict().items())
    assert "took state_dict" in result.stderr and "--key model_ema" in result.stderr
    report = runner.invoke(
        app, ["convert", "checkpoint", str(source), str(tmp_path / "x.pt"), "--format", "json"]
    )
    data = json.loads(report.stdout)
    assert data["key"] == "state_dict" and data["not_taken"] == ["model_ema"]
    asked = runner.invoke(
        app, ["convert", "checkpoint", str(source), str(tmp_path / "e.pt"), "--key", "model_ema"]
    )
    assert asked.exit_code == 0 and "took state_dict" not in asked.stderr


@pytest.mark.parametrize("key", ["state_dict", "model"])
def test_weights_beside_an_ema_copy_are_the_models_own(runner, tmp_path, key):
    """`--weights FILE` took the EMA copy of {'state_dict'|'model': ..., 'model_ema': ...}
    (a torchvision reference script's or timm's file), where `convert checkpoint` takes
    state_dict and torchkit's own checkpoints need --ema."""
    from torchkit.core.models import resolve_model

    images = write_image_folder(tmp_path / "images", {"a": 2}, size=8)
    weights = resolve_model("convnet", in_channels=3, image_size=8, num_classes=2).model
    weights = weights.state_dict()
    plain, both = tmp_path / "plain.pt", tmp_path / "both.pt"
    torch.save(weights, plain)
    zeros = {name: torch.zeros_like(value) for name, value in weights.items()}
    torch.save({key: weights, "model_ema": zeros, "epoch": 3}, both)
    predict = ["predict", "convnet", str(images), "--image-size", "8", "-j", "0"]
    predict += ["--logits", "--format"]
    expected = runner.invoke(app, [*predict, "json", "--weights", str(plain)])
    result = runner.invoke(app, [*predict, "json", "--weights", str(both)])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == json.loads(expected.stdout)


# --- 7j: -v after the command name ---------------------------------------------------------------


def leaf_commands(command, path=()):
    children = getattr(command, "commands", None)
    if not children:
        yield path, command
        return
    for name, child in children.items():
        yield from leaf_commands(child, (*path, name))


def test_verbose_works_after_the_command_name(runner, monkeypatch, tmp_path, _torchkit_command):
    for path, command in leaf_commands(_torchkit_command):
        opts = {opt for param in command.params for opt in getattr(param, "opts", ())}
        assert {"-v", "--verbose"} <= opts, path
    logger = logging.getLogger("torchkit")
    result = runner.invoke(app, ["env", "-v"])
    assert result.exit_code == 0, result.stderr
    assert logger.level == logging.INFO
    result = runner.invoke(app, ["env"])
    assert result.exit_code == 0 and logger.level == logging.WARNING
    source = write_image_folder(tmp_path / "in", {"a": 1})
    result = runner.invoke(
        app, ["convert", "tensor", str(source), str(tmp_path / "out"), "--to", "npy", "--verbose"]
    )
    assert result.exit_code == 0, result.stderr
    assert logger.level == logging.INFO
    result = runner.invoke(app, ["-v", "env", "--format", "json"])  # before it, as always
    assert result.exit_code == 0 and logger.level == logging.INFO


# --- inputs before outputs: a missing input is said before an output that "already exists" -----

MISSING_INPUT_BEFORE_EXISTING_OUTPUT = [
    (["export", "missing.pt", "exists.onnx"], "checkpoint not found: missing.pt"),
    (["predict", "run/best.pt", "missing", "-o", "exists.csv"], "IMAGES not found: missing"),
    (["predict", "missing.pt", "data", "-o", "exists.csv"], "checkpoint not found: missing.pt"),
    (["dataset-stats", "missing", "-o", "exists.csv"], "dataset not found: missing"),
    (["eval", "run/best.pt", "--data", "missing", "--out", "full"], "dataset not found: missing"),
    (["eval", "missing.pt", "--data", "data", "--out", "full"], "checkpoint not found: missing.pt"),
    (["extract-features", "missing.pt", "data", "full"], "checkpoint not found: missing.pt"),
    (["split", "missing", "full"], "dataset not found: missing"),
    (["convert-syncbn", "missing.pt", "run/best.pt"], "model file not found: missing.pt"),
]


@pytest.mark.parametrize(
    "args, said",
    MISSING_INPUT_BEFORE_EXISTING_OUTPUT,
    ids=[" ".join(args) for args, _ in MISSING_INPUT_BEFORE_EXISTING_OUTPUT],
)
def test_a_missing_input_is_said_before_an_existing_output(
    runner, tmp_path, monkeypatch, args, said
):
    # `convert-syncbn missing.pt run/best.pt` said "DST already exists (pass --force ...)": a
    # hint that points the wrong way when the input is mistyped or the arguments swapped.
    monkeypatch.chdir(tmp_path)
    write_image_folder(tmp_path / "data", {"a": 1}, size=4)
    for name in ("exists.onnx", "exists.csv"):
        (tmp_path / name).write_text("mine\n")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine\n")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "best.pt").write_bytes(b"a checkpoint")
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.stderr
    assert error_line(result.stderr).startswith(f"Error: {said} ("), result.stderr
