"""Issue #29 (trust, round three), the model side: a file never chooses code to run without
--trust-checkpoint, a model with random weights is refused where its answers would be used, and
every command that takes a MODEL takes the files `torchkit export` writes (or says it cannot)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from image_folders import write_image_folder
from output_checks import error_line
from processes import run_torchkit_in_process, run_torchkit_process

from torchkit.cli import app

CLASSES = ["a", "b", "c"]
SIDE = 16


def _checkpoint(arch: str = "convnet", **changes) -> dict:
    """A torchkit checkpoint of a 3-class 16 px convnet with fixed (seeded) weights."""
    import torch

    from torchkit.core.models.convnet import convnet_class

    torch.manual_seed(0)
    model = convnet_class()(3, 3, SIDE)
    checkpoint = {
        "format_version": 1,
        "torchkit_version": "test",
        "arch": arch,
        "num_classes": 3,
        "classes": list(CLASSES),
        "model": model.state_dict(),
        "preprocess": {
            "image_size": SIDE,
            "resize_size": SIDE,
            "mean": [0.5, 0.5, 0.5],
            "std": [0.25, 0.25, 0.25],
            "in_channels": 3,
        },
    }
    checkpoint.update(changes)
    return checkpoint


def _save(checkpoint: dict, path: Path) -> Path:
    import torch

    torch.save(checkpoint, path)
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """Images, a checkpoint, and the three files `torchkit export` writes from it."""
    root = tmp_path_factory.mktemp("trust3")
    write_image_folder(root / "images", dict.fromkeys(CLASSES, 4), size=SIDE)
    _save(_checkpoint(), root / "model.pt")
    for name in ("model.onnx", "model.ts", "model.pt2"):
        done = run_torchkit_in_process("export", root / "model.pt", root / name, cwd=root)
        assert done.returncode == 0, done.stderr
    return root


def _invoke(runner, args, cwd: Path):
    import os

    old = os.getcwd()
    os.chdir(cwd)
    try:
        return runner.invoke(app, [str(a) for a in args])
    finally:
        os.chdir(old)


# -- 1. a checkpoint's arch never imports code without --trust-checkpoint ------------------------


def _marker_module(folder: Path, name: str) -> Path:
    """`name.py` in `folder`: importing it writes `name.imported`; `Net` builds a convnet."""
    (folder / f"{name}.py").write_text(
        textwrap.dedent(
            f"""
            from pathlib import Path
            Path(__file__).with_name("{name}.imported").write_text("imported")

            def Net(num_classes=3):
                from torchkit.core.models.convnet import convnet_class
                return convnet_class()(num_classes, 3, {SIDE})
            """
        )
    )
    return folder / f"{name}.imported"


COMMANDS = {
    "predict": ["predict", "{model}", "{images}"],
    "eval": ["eval", "{model}", "--data", "{images}"],
    "summary": ["summary", "{model}"],
    "benchmark": ["benchmark", "{model}", "--iters", "1", "--warmup", "0"],
    "export": ["export", "{model}", "{out}/x.onnx"],
    "extract-features": ["extract-features", "{model}", "{images}", "{out}/features"],
    "convert-syncbn": ["convert-syncbn", "{model}", "{out}/sync.pt"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_checkpoint_arch_naming_code_is_not_imported_without_trust(
    runner, world, tmp_path, command
):
    module = f"marker_{command.replace('-', '_')}"
    imported = _marker_module(tmp_path, module)
    model = _save(_checkpoint(f"{module}:Net"), tmp_path / "named.pt")
    args = [
        part.format(model=model, images=world / "images", out=tmp_path)
        for part in COMMANDS[command]
    ]
    result = _invoke(runner, args, tmp_path)
    assert result.exit_code == 1, result.output
    line = error_line(result.stderr)
    assert f"names the model code '{module}:Net'" in line
    assert "--trust-checkpoint" in line
    assert not imported.exists()
    assert result.stdout == ""


def test_a_trusted_checkpoint_arch_is_imported_and_used(runner, world, tmp_path):
    imported = _marker_module(tmp_path, "marker_trusted")
    model = _save(_checkpoint("marker_trusted:Net"), tmp_path / "named.pt")
    result = _invoke(
        runner,
        ["predict", model, world / "images", "--trust-checkpoint", "--format", "json", "-j", "0"],
        tmp_path,
    )
    assert result.exit_code == 0, result.stderr
    assert imported.exists()
    assert len(json.loads(result.stdout)) == 12


def test_os_abort_as_arch_is_one_error_line_not_a_crash(world, tmp_path):
    """The reported attack: `arch = "os:abort"` killed five commands with SIGABRT (134)."""
    model = _save(_checkpoint("os:abort"), tmp_path / "abort.pt")
    done = run_torchkit_process("predict", str(model), str(world / "images"), cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "names the model code 'os:abort'" in error_line(done.stderr)


def test_resume_of_a_run_whose_arch_is_code_needs_trust(runner, world, tmp_path):
    _marker_module(tmp_path, "marker_resume")
    run = tmp_path / "run"
    args = ["train", "--data", world / "images", "--model", "marker_resume:Net"]
    args += ["--epochs", "1", "--image-size", SIDE, "--val-split", "0.25", "-j", "0", "--out", run]
    result = _invoke(runner, args, tmp_path)
    assert result.exit_code == 0, result.stderr
    (tmp_path / "marker_resume.imported").unlink()
    resume = ["train", "--resume", run, "--epochs", "2"]
    result = _invoke(runner, resume, tmp_path)
    assert result.exit_code == 1, result.stderr
    assert "names the model code 'marker_resume:Net'" in error_line(result.stderr)
    assert not (tmp_path / "marker_resume.imported").exists()
    result = _invoke(runner, [*resume, "--trust-checkpoint"], tmp_path)
    assert result.exit_code == 0, result.stderr


def test_resume_of_a_pickled_file_says_trust_would_not_help(runner, tmp_path):
    """A run's checkpoints never need trust, so the hint must not send the user round to pass
    --trust-checkpoint, which --resume takes and still refuses such a file with."""
    import torch

    pickled = tmp_path / "net.pt"
    torch.save(torch.nn.Linear(2, 2), pickled)
    for extra in ([], ["--trust-checkpoint"]):
        result = _invoke(runner, ["train", "--resume", pickled, *extra], tmp_path)
        assert result.exit_code == 1, result.stderr
        line = error_line(result.stderr)
        assert f"{pickled} holds a pickled" in line
        assert "whose checkpoints need no trust" in line
        # The architecture is named too: --weights alone loads them into the default --model.
        assert line.endswith(
            "use --model ARCH --weights FILE --trust-checkpoint to start a new run from other "
            "weights)"
        )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_classes": "three"}, "has an invalid num_classes 'three'"),
        ({"num_classes": 0}, "has an invalid num_classes 0"),
        ({"arch": 7}, "has an invalid arch 7"),
        # Before: torch's "can't allocate memory" as the head of 10**12 outputs was built.
        (
            {"num_classes": 10**12},
            "has an invalid num_classes 1,000,000,000,000: none of its weights has that many "
            "outputs (the file is damaged or not torchkit's)",
        ),
        # One below the 314,819 values the weights hold: before, a head of that many outputs
        # was built (162 MB for a model of 1.3 MB; gigabytes for a larger model) before the
        # weights were found not to fit it.
        (
            {"num_classes": 314_818},
            "has an invalid num_classes 314,818: none of its weights has that many outputs",
        ),
    ],
)
def test_checkpoint_fields_of_the_wrong_kind_are_named(runner, world, tmp_path, changes, message):
    model = _save(_checkpoint(**changes), tmp_path / "bad.pt")
    result = _invoke(runner, ["predict", model, world / "images"], tmp_path)
    assert result.exit_code == 1, result.output
    assert message in error_line(result.stderr)
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda weights: [1, 2], "the model weights in the checkpoint are a list, not a state"),
        (
            lambda weights: dict.fromkeys(weights, "x"),
            "are not all tensors: 8 are not (first: features.0.weight is a str)",
        ),
        # Before: copied into the float model as whole numbers, without a word (uniform
        # probabilities from predict, chance accuracy from eval).
        (
            lambda weights: {key: value.long() for key, value in weights.items()},
            "are not all floating point: 8 are not (first: features.0.weight is int64)",
        ),
    ],
    ids=["a-list", "strings", "integers"],
)
def test_damaged_weights_of_a_checkpoint_are_one_clear_error(
    runner, world, tmp_path, damage, message
):
    checkpoint = _checkpoint()
    checkpoint["model"] = damage(checkpoint["model"])
    model = _save(checkpoint, tmp_path / "bad.pt")
    for args in (["predict", model, world / "images"], ["eval", model, "--data", world / "images"]):
        result = _invoke(runner, args, tmp_path)
        assert result.exit_code == 1, result.output
        assert message in error_line(result.stderr)
        assert "TORCHKIT_DEBUG" not in result.stderr


def test_damaged_ema_weights_are_named_as_the_ema_weights(runner, world, tmp_path):
    """`eval --ema` of a checkpoint whose EMA weights are a list: it said 'the model weights in
    the checkpoint are a list', of the model's own weights, which are sound."""
    checkpoint = _checkpoint()
    checkpoint["model_ema"] = [1]
    model = _save(checkpoint, tmp_path / "bad.pt")
    result = _invoke(runner, ["eval", model, "--data", world / "images", "--ema"], tmp_path)
    assert result.exit_code == 1, result.output
    assert error_line(result.stderr) == (
        f"Error: the EMA weights of {model} are a list, not a state dict (the file is damaged "
        "or not a checkpoint of model weights)"
    )


def test_a_checkpoint_without_num_classes_says_which_entry(runner, world, tmp_path):
    checkpoint = _checkpoint()
    del checkpoint["num_classes"]
    model = _save(checkpoint, tmp_path / "bad.pt")
    result = _invoke(runner, ["eval", model, "--data", world / "images"], tmp_path)
    assert result.exit_code == 1
    assert "has no 'num_classes' entry" in error_line(result.stderr)


# -- 2. random weights are refused where their answers would be used ----------------------------


@pytest.mark.parametrize("command", ["predict", "eval"])
def test_a_model_name_without_weights_is_refused(runner, world, tmp_path, command):
    args = COMMANDS[command]
    args = [part.format(model="convnet", images=world / "images") for part in args]
    result = _invoke(runner, args, tmp_path)
    assert result.exit_code == 2, result.output
    line = error_line(result.stderr)
    assert "convnet has random weights" in line and "--allow-untrained" in line
    assert result.stdout == ""


def test_a_callable_without_weights_is_refused_with_its_own_hint(runner, world, tmp_path):
    _marker_module(tmp_path, "marker_callable")
    result = _invoke(runner, ["predict", "marker_callable:Net", world / "images"], tmp_path)
    assert result.exit_code == 2
    line = error_line(result.stderr)
    assert "cannot tell whether its weights are trained" in line
    assert "--allow-untrained if marker_callable:Net loads trained weights itself" in line


def test_allow_untrained_runs_it_anyway(runner, world, tmp_path):
    args = ["predict", "convnet", world / "images", "--allow-untrained", "--format", "json"]
    args += ["--image-size", SIDE, "-j", "0"]
    result = _invoke(runner, args, tmp_path)
    assert result.exit_code == 0, result.stderr
    assert len(json.loads(result.stdout)) == 12


def test_export_of_random_weights_says_so(runner, tmp_path):
    args = ["export", "convnet", tmp_path / "random.onnx", "--format", "json"]
    result = _invoke(runner, args, tmp_path)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["random_weights"] is True
    # A note, as summary and benchmark give: a warning would say something is wrong.
    assert result.stderr.splitlines() == [
        "Note: convnet has random weights (no --weights given): the file holds them too: fine "
        "for trying a runtime, not for predictions"
    ]


def test_an_export_of_random_weights_is_refused_where_its_model_would_be(runner, world, tmp_path):
    """Was: predict and eval ran it silently, noise reported as predictions, while the model it
    was exported from (convnet, no --weights) is refused."""
    args = ["export", "convnet", "random.onnx", "--num-classes", len(CLASSES), "-q"]
    made = _invoke(runner, args, tmp_path)
    assert made.exit_code == 0, made.stderr
    for command in (
        ["predict", "random.onnx", world / "images"],
        ["eval", "random.onnx", "--data", world / "images"],
    ):
        refused = _invoke(runner, [*command, "--format", "json"], tmp_path)
        assert refused.exit_code == 2 and refused.stdout == "", refused.stderr
        assert error_line(refused.stderr).startswith(
            "Error: random.onnx holds random weights (exported from convnet without --weights)"
        )
        assert error_line(refused.stderr).endswith(
            "(export a trained checkpoint, or convnet with --weights FILE; --allow-untrained to "
            "run it anyway)"
        )
    allowed = [*command, "--allow-untrained", "--format", "json", "-j", "0"]
    assert _invoke(runner, allowed, tmp_path).exit_code == 0


def test_export_of_a_checkpoint_does_not_warn(world, runner, tmp_path):
    args = ["export", world / "model.pt", tmp_path / "m.onnx", "--format", "json"]
    result = _invoke(runner, args, tmp_path)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["random_weights"] is False
    assert "random weights" not in result.stderr


# -- 3. exported files are models everywhere (or one clear error) -------------------------------


def _eval_json(runner, model, world, *extra):
    args = ["eval", model, "--data", world / "images", "--format", "json", "-j", "0", *extra]
    result = _invoke(runner, [*args, "--device", "cpu"], world)  # the same figures: the CPU's
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("name", ["model.onnx", "model.ts", "model.pt2"])
def test_eval_of_an_exported_file_matches_its_checkpoint(runner, world, name):
    """The stored preprocessing and classes are used: the same figures as the checkpoint's
    (the reported `eval m.ts` fed 224 px images to a 16 px model)."""
    reference = _eval_json(runner, world / "model.pt", world)
    trust = [] if name.endswith(".onnx") else ["--trust-checkpoint"]
    exported = _eval_json(runner, world / name, world, *trust)
    for key in ("num_images", "num_classes", "accuracy", "topk_accuracy", "preprocess"):
        assert exported[key] == reference[key], key
    assert exported["loss"] == pytest.approx(reference["loss"], abs=1e-4)
    assert exported["model_source"] == f"exported ({exported['arch'] and _format(name)})"


def _format(name: str) -> str:
    return {"onnx": "onnx", "ts": "torchscript", "pt2": "exported-program"}[name.split(".")[1]]


@pytest.mark.parametrize("name", ["model.ts", "model.pt2"])
@pytest.mark.parametrize("command", ["predict", "eval"])
def test_code_archives_need_trust(runner, world, command, name):
    args = [part.format(model=world / name, images=world / "images") for part in COMMANDS[command]]
    result = _invoke(runner, args, world)
    assert result.exit_code == 1
    line = error_line(result.stderr)
    assert "whose code runs when it is loaded" in line and "--trust-checkpoint" in line
    assert "Error: Error:" not in result.stderr
    assert "ONNX files need no trust" in line


@pytest.mark.parametrize("command", ["summary", "benchmark"])
def test_untrusted_torchscript_hint_offers_no_onnx_where_onnx_is_refused(runner, world, command):
    """Before: summary and benchmark, which refuse ONNX files, hinted 'ONNX files need no
    trust' for an untrusted TorchScript file."""
    args = [part.format(model=world / "model.ts") for part in COMMANDS[command]]
    result = _invoke(runner, args, world)
    assert result.exit_code == 1
    line = error_line(result.stderr)
    assert "--trust-checkpoint" in line and "ONNX" not in line


@pytest.mark.parametrize(
    ("command", "name"),
    [
        ("summary", "model.onnx"),
        ("summary", "model.pt2"),
        ("benchmark", "model.onnx"),
        ("benchmark", "model.pt2"),
        ("extract-features", "model.onnx"),
        ("extract-features", "model.ts"),
        ("export", "model.onnx"),
        ("convert-syncbn", "model.ts"),
    ],
)
def test_commands_that_cannot_take_an_exported_file_say_so(runner, world, tmp_path, command, name):
    args = [
        part.format(model=world / name, images=world / "images", out=tmp_path)
        for part in COMMANDS[command]
    ]
    result = _invoke(runner, [*args, "--trust-checkpoint"], world)
    assert result.exit_code == 2, result.output
    line = error_line(result.stderr)
    assert f"{world / name} is " in line and "cannot" in line
    assert "Unpickling" not in result.stderr and "truncated" not in result.stderr


def test_train_from_an_exported_file_is_refused(runner, world, tmp_path):
    base = ["train", "--data", world / "images", "--val-split", "0.25", "--epochs", "1"]
    base += ["-j", "0", "--out", tmp_path / "run"]
    result = _invoke(runner, [*base, "--model", world / "model.onnx"], world)
    assert result.exit_code == 2
    assert "which train cannot take" in error_line(result.stderr)
    result = _invoke(
        runner, [*base, "--model", "convnet", "--weights", world / "model.onnx"], world
    )
    assert result.exit_code == 2
    assert "is an ONNX model, not a weights file" in error_line(result.stderr)
    assert error_line(result.stderr).endswith(
        "alone as MODEL where a command takes exported files, as predict and eval do, or give "
        "the checkpoint it was exported from)"
    )
    assert not (tmp_path / "run").exists()


def test_summary_and_benchmark_take_a_trusted_torchscript_file(runner, world):
    result = _invoke(runner, ["summary", world / "model.ts", "--trust-checkpoint"], world)
    assert result.exit_code == 0, result.stderr
    args = ["benchmark", world / "model.ts", "--trust-checkpoint", "--iters", "1"]
    result = _invoke(runner, [*args, "--warmup", "0", "--batch-size", "2"], world)
    assert result.exit_code == 0, result.stderr


def test_a_recorded_image_size_whose_convnet_outgrows_memory_is_refused_before_it_is_built(
    tmp_path, monkeypatch
):
    """A checkpoint (no trust needed) may record any image size; convnet's first linear layer
    grows with its square (18 GB at 1,500 px). Refused before the allocation, which would end
    in the OOM killer (before: the model was built, and only then its weights did not fit)."""
    import torch

    from torchkit.core.runtime import memory

    monkeypatch.setattr(memory, "available_memory", lambda: 4 * 10**8)
    crafted = tmp_path / "crafted.pt"
    checkpoint = _checkpoint()
    checkpoint["preprocess"] = {**checkpoint["preprocess"], "image_size": 200, "resize_size": 200}
    torch.save(checkpoint, crafted)
    for words in (["summary", crafted], ["summary", "convnet", "--image-size", "200"]):
        result = run_torchkit_in_process(*words)
        assert result.returncode == 2, result.stderr
        assert error_line(result.stderr).startswith(
            "Error: convnet at 200 px has 78,675,968 weights in its first linear layer (0.3 GB), "
            "more than half the 0.4 GB free here"
        ), result.stderr
    # Sizes that fit are built as before.
    assert run_torchkit_in_process("summary", "convnet", "--image-size", "28").returncode == 0
