"""eval's loader workers stop with a run that fails while it scores (an error of the model, a
stop): a library caller that keeps the error (a notebook's last traceback, a test runner's
result) kept the frame that held the loader's iterator, and so its forked workers, alive."""

from __future__ import annotations

import multiprocessing

import pytest
from image_folders import write_image_folder

from torchkit.core.evaluate import runner as eval_runner
from torchkit.core.inference.options import InferenceOptions


class _ModelError(RuntimeError):
    pass


def test_a_model_error_while_scoring_stops_the_loader_workers(tmp_path, monkeypatch):
    from torchkit.core.evaluate import EvalOptions, evaluate
    from torchkit.core.models import ModelSpec

    def failing_model(*args, **kwargs):
        raise _ModelError("the model failed on its first batch")

    monkeypatch.setattr(eval_runner, "score_batch", failing_model)
    write_image_folder(tmp_path / "data", {"a": 2, "b": 2})
    options = EvalOptions(
        data=str(tmp_path / "data"), run=InferenceOptions(device="cpu", workers=1)
    )
    with pytest.raises(_ModelError) as caught:
        evaluate(ModelSpec(model="convnet", allow_untrained=True, classes=["a", "b"]), options)
    assert caught.value.__traceback__ is not None  # the failed run's frames are still held
    assert multiprocessing.active_children() == []
