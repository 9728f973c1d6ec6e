"""Hints an error gives, followed as written: the step a hint names does what the user wanted,
and does not end in the same error again."""

from __future__ import annotations

import pytest

from torchkit.core.inference.options import InferenceOptions, check_torch_options_apply
from torchkit.core.io.errors import UsageError


def test_amp_on_an_onnx_model_hints_to_drop_it_for_a_float16_file_too():
    """Was "drop --amp, or export a float16 file": a float16 file given with --amp is refused
    alike, as onnxruntime runs every ONNX file in its own precision."""
    with pytest.raises(UsageError) as refused:
        check_torch_options_apply(InferenceOptions(amp=True), "onnx")
    assert refused.value.hint == (
        "drop --amp; a float16 file runs in half precision: torchkit export ... --dtype float16"
    )


@pytest.mark.parametrize(("command", "amp"), [("summary", False), ("eval", True)])
def test_out_of_memory_hints_only_options_the_command_takes(runner, monkeypatch, command, amp):
    """A GPU out of memory that no command catches hinted `--amp` to summary too, which answers
    `No such option: --amp`."""
    import torch

    import torchkit.core.evaluate as evaluation
    from torchkit.cli import app
    from torchkit.core.summary import run as summary

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(summary, "summarize_model", out_of_memory)
    monkeypatch.setattr(evaluation, "evaluate", out_of_memory)
    args = ["convnet", "-i", "3,8,8"] if command == "summary" else ["convnet", "--data", "digits"]
    result = runner.invoke(app, [command, *args, "--device", "cpu"])
    assert result.exit_code == 1, result.stderr
    hint = (
        "use a smaller --batch-size, --amp or a smaller model"
        if amp
        else ("use a smaller --batch-size or a smaller model")
    )
    assert result.stderr.strip().splitlines()[-1] == f"Error: the GPU ran out of memory ({hint})"


def test_weights_of_another_size_hint_options_predict_takes(runner, tmp_path):
    """convnet weights of 28 px read at 32 px: the hint named --num-classes, which predict does
    not take and which cannot make weights fit (the head follows them); --image-size 28 does."""
    import torch
    from PIL import Image

    from torchkit.cli import app
    from torchkit.core.models.convnet import convnet_class

    torch.save(convnet_class()(3, 3, 28).state_dict(), tmp_path / "conv28.pt")
    Image.new("RGB", (28, 28)).save(tmp_path / "a.png")
    command = [
        "predict",
        "convnet",
        str(tmp_path / "a.png"),
        "--weights",
        str(tmp_path / "conv28.pt"),
    ]
    refused = runner.invoke(app, [*command, "--image-size", "32"])
    assert refused.exit_code == 1
    assert (
        refused.stderr.strip()
        .splitlines()[-1]
        .endswith("in the model) (check the model and --image-size)")
    )
    followed = runner.invoke(app, [*command, "--image-size", "28", "--format", "csv"])
    assert followed.exit_code == 0, followed.stderr
    assert followed.stdout.count("\n") == 2  # the header and the image's row


@pytest.mark.parametrize(
    ("page", "command"),
    [("split.md", ["split", "raw", "--data", "raw2"]),
     ("extract-features.md", ["extract-features", "convnet", "raw", "--data", "raw2"])],
)  # fmt: skip
def test_the_pages_line_for_a_data_folder_given_as_out_is_the_one_printed(
    runner, tmp_path, monkeypatch, page, command
):
    """The pages showed the line for an OUT torchkit wrote (`pass --force ...`) where they
    explain a data folder taken for OUT, which --force does not replace."""
    import re

    from image_folders import write_image_folder
    from output_checks import error_line
    from suite_paths import REPO

    from torchkit.cli import app

    text = (REPO / "docs" / "commands" / page).read_text(encoding="utf-8")
    quoted = re.search(r"```text\n(Error: output folder already exists: raw .*)\n```", text)
    assert quoted, page
    monkeypatch.chdir(tmp_path)
    for name in ("raw", "raw2"):
        write_image_folder(tmp_path / name, {"a": 2, "b": 2})
    result = runner.invoke(app, command)
    assert result.exit_code == 1
    assert error_line(result.stderr) == quoted.group(1)


def test_a_checkpoint_that_cannot_continue_names_its_architecture_for_a_new_run(tmp_path):
    """Was "use it with --weights": a new run loads --weights into --model, by default the data's
    (convnet for digits, resnet18 otherwise), which another architecture's weights do not fit."""
    import torch

    from torchkit.core.io.errors import CheckpointError
    from torchkit.core.train.checkpoints import load_for_resume

    path = tmp_path / "my avg.pt"  # an averaged checkpoint: no optimizer, no scheduler
    torch.save(
        {"format_version": 2, "torchkit_version": "1", "arch": "resnet18", "model": {}}, path
    )
    with pytest.raises(CheckpointError) as refused:
        load_for_resume(str(path))
    assert refused.value.hint == (
        f"use it with --model resnet18 --weights '{path}' to start a new run from its weights"
    )
