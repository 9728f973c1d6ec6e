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
