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
