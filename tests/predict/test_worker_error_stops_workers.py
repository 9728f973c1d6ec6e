"""predict's and extract-features' loader workers stop with a run that an error of one of them
ended (a shard written again since it was listed: `StoredReadError`, raised again in the main
process): the error's traceback holds the loader iterator's own frame, so dropping the iterator
left its forked workers alive for as long as a library caller kept the error."""

from __future__ import annotations

import multiprocessing

import pytest
from image_folders import write_image_folder

from torchkit.core.data import dataset
from torchkit.core.data.stored_image import StoredReadError
from torchkit.core.inference.options import InferenceOptions


class _RewrittenShard:
    """The paths the workers read, as of a shard written again after it was listed."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        raise StoredReadError("d/train-0.tar was written again after it was listed")


@pytest.fixture
def data(tmp_path, monkeypatch):
    monkeypatch.setattr(dataset, "worker_paths", lambda paths: _RewrittenShard(len(paths)))
    write_image_folder(tmp_path / "data", {"a": 1, "b": 1})
    return tmp_path / "data"


def test_predict_stops_its_workers_after_an_error_of_one(data):
    from torchkit.core.models import ModelSpec
    from torchkit.core.predict.run import PredictRequest, PredictRun

    run = PredictRun(
        PredictRequest(
            spec=ModelSpec("convnet", allow_untrained=True),
            images=[str(data)],
            run=InferenceOptions(device="cpu", workers=1),
        )
    )
    run.setup()
    with pytest.raises(StoredReadError, match="written again") as caught:
        list(run.rows())
    assert caught.value.__traceback__ is not None  # kept, with the loader iterator's frame
    assert multiprocessing.active_children() == []


def test_extract_features_stops_its_workers_after_an_error_of_one(data, tmp_path):
    from torchkit.core.features import FeatureRequest, extract_features
    from torchkit.core.models import ModelSpec

    request = FeatureRequest(
        spec=ModelSpec("convnet", allow_untrained=True),
        images=str(data),
        out=str(tmp_path / "out"),
        run=InferenceOptions(device="cpu", workers=1),
    )
    with pytest.raises(StoredReadError, match="written again") as caught:
        extract_features(request)
    assert caught.value.__traceback__ is not None
    assert multiprocessing.active_children() == []
