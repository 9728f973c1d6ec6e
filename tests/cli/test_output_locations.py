"""Issue #31, one rule for output locations: `--out` names what a command makes (a positional
OUT is the same thing), `-o/--output` only the printed report; `train -o DIR` gets a hint."""

from __future__ import annotations

from pathlib import Path

import pytest
from output_checks import error_line, tree_digest, write_command_inputs

from torchkit.cli import app


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    return write_command_inputs(tmp_path, per_class=5)


def _commands(root: Path) -> dict[str, tuple[list[str], Path]]:
    """Each command that makes a file or folder: its arguments before OUT, and OUT."""
    images, image = str(root / "images"), str(root / "images" / "a" / "a_0.png")
    return {
        "split": (["split", images], root / "split"),
        "export": (["export", "convnet", "--image-size", "12"], root / "model.onnx"),
        "extract-features": (
            ["extract-features", "convnet", images, "--image-size", "12", "-j", "0",
             "--allow-untrained"],  # fmt: skip
            root / "features",
        ),
        "convert tensor": (["convert", "tensor", image], root / "a.npy"),
        "convert checkpoint": (["convert", "checkpoint", str(root / "weights.pt")], root / "w.pt"),
        "convert-syncbn": (["convert-syncbn", str(root / "model.pt")], root / "sync.pt"),
    }  # fmt: skip


@pytest.mark.parametrize(
    "command",
    [
        "split",
        "export",
        "extract-features",
        "convert tensor",
        "convert checkpoint",
        "convert-syncbn",
    ],
)
def test_out_names_what_the_command_makes(runner, inputs, command):
    args, out = _commands(inputs)[command]
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    assert out.exists()


# convert checkpoint: before, "takes SRC and DST, not 3 paths".
@pytest.mark.parametrize("command", ["split", "export", "convert tensor", "convert checkpoint"])
def test_out_and_a_different_positional_out_are_refused(runner, inputs, command):
    args, out = _commands(inputs)[command]
    before = tree_digest(inputs)
    result = runner.invoke(app, [*args, str(out), "--out", str(out.with_name("other"))])
    assert result.exit_code == 2
    assert "name two outputs" in error_line(result.stderr)
    assert tree_digest(inputs) == before


@pytest.mark.parametrize("command", ["split", "export", "convert tensor"])
def test_a_missing_out_is_a_usage_error(runner, inputs, command):
    args, _ = _commands(inputs)[command]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert "missing" in error_line(result.stderr) and "--out" in error_line(result.stderr)


def test_the_same_place_twice_is_fine(runner, inputs):
    args, out = _commands(inputs)["convert tensor"]
    result = runner.invoke(app, [*args, str(out), "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    assert out.exists()


@pytest.mark.parametrize(
    ("output", "out", "summary"),
    [
        ("myrun", "myrun", "myrun.json"),
        ("run-2026", "run-2026", "run-2026.json"),
        ("my run", "'my run'", "'my run.json'"),  # the options shown are pasted as they are
    ],
)
def test_train_output_meant_as_out_gets_a_hint_and_writes_nothing(
    runner, inputs, output, out, summary
):
    import os

    before = tree_digest(inputs)
    old = os.getcwd()
    os.chdir(inputs)
    try:
        result = runner.invoke(app, ["train", "--data", "digits", "--output", output])
    finally:
        os.chdir(old)
    assert result.exit_code == 2
    line = error_line(result.stderr)
    assert "-o/--output names the file" in line
    assert line.endswith(
        f"(the run folder is --out: did you mean --out {out}, or -o {summary} for the "
        "summary as JSON?)"
    )
    assert tree_digest(inputs) == before
    assert not (inputs / "runs").exists()
