"""A model that masks classes with -inf logits (eval, predict): softmax gives them 0, they rank
last, and the image is scored as any other; only NaN, +inf or a row of -inf alone is a
non-finite output. An image whose true class is masked has an infinite loss, said once."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from image_folders import write_image_folder
from processes import run_torchkit_in_process

from torchkit.core.data.batches import Batch

CLASSES = 40  # k * 8 < 40 for k = 1 and 3: the candidates' ranking, and the full sort for ties
ROWS = 8


def _logits() -> torch.Tensor:
    """One row per image: 0 unmasked; 1 most classes masked; 2 its true class masked (an
    infinite loss); 3 one class left, the rest tied at -inf; 4 every class masked; 5 a NaN;
    6 a +inf; 7 two classes left, the true one among them."""
    rows = torch.randn(ROWS, CLASSES, generator=torch.Generator().manual_seed(0))
    rows[1, 5:] = -math.inf
    rows[2, 7] = -math.inf
    rows[3, :-1] = -math.inf
    rows[4] = -math.inf
    rows[5, 3] = math.nan
    rows[6, 9] = math.inf
    rows[7, :] = -math.inf
    rows[7, [4, 11]] = torch.tensor([0.5, 2.0])
    return rows


LOGITS = _logits()
LABELS = torch.tensor([0, 0, 7, 39, 0, 0, 0, 4])


class _Table(torch.nn.Module):
    """The row of LOGITS an image's pixels name (every pixel holds it: a mirror names it too)."""

    def forward(self, x):
        return LOGITS[x[:, 0, 0, 0].long()].clone()


def _batches() -> list[Batch]:
    batches = []
    for rows in (range(0, 4), range(4, 8)):
        indices = torch.tensor(list(rows))
        images = indices.float()[:, None, None, None].expand(-1, 3, 4, 4).contiguous()
        batches.append(Batch(images, LABELS[indices], indices, []))
    return batches


def _expected(k: int):
    """NumPy's softmax, cross-entropy and stable ranking (equal scores: lower index first)."""
    x = LOGITS.double().numpy()
    scorable = ~np.isnan(x).any(1) & ~np.isposinf(x).any(1) & ~np.isneginf(x).all(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        shifted = x - x.max(1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
    top = np.argsort(-x, axis=1, kind="stable")[:, :k]
    probs = np.exp(np.take_along_axis(log_probs, top, 1))
    loss = -log_probs[np.arange(ROWS), LABELS.numpy()]
    return scorable, top, probs, loss


@pytest.mark.parametrize("tta", ["none", "flip"])
@pytest.mark.parametrize("k", [1, 3])
def test_masked_classes_are_scored_as_numpy_scores_them(k, tta):
    from torchkit.core.evaluate.runner import predict

    predictions, errors, bad_batches = predict(_Table(), _batches(), torch.device("cpu"), k=k,
                                               tta=tta)  # fmt: skip
    scorable, top, probs, loss = _expected(k)
    assert errors == [] and len(predictions) == ROWS
    assert predictions.finite.tolist() == scorable.tolist() == [True] * 4 + [False] * 3 + [True]
    assert bad_batches == 1  # the second batch only
    ok = np.flatnonzero(scorable)
    assert predictions.topk_labels[ok].tolist() == top[ok].tolist()
    np.testing.assert_allclose(predictions.topk_probs[ok], probs[ok], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(predictions.loss[ok], loss[ok], rtol=1e-5)
    assert math.isinf(predictions.loss[2]) and predictions.loss[2] > 0
    if k == 3:  # one class left, then the masked ones in index order, each with probability 0
        assert predictions.topk_labels[3].tolist() == [39, 0, 1]
        assert predictions.topk_probs[3].tolist() == [1.0, 0.0, 0.0]


def _strict_json(text: str):
    """JSON as any parser reads it: NaN and Infinity tokens are not JSON."""

    def refuse(token):
        raise AssertionError(f"{token} in JSON output")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """7 images in a, b, c; nets:MaskedNet (3 classes) masks c, the true class of 2 of them."""
    return write_image_folder(tmp_path_factory.mktemp("masked") / "data", {"a": 3, "b": 2, "c": 2})


def _run(command: str, data, *more):
    """`command` of nets:MaskedNet on `data`, then `more` (extract-features: OUT first)."""
    model = ["nets:MaskedNet", *(["--data"] if command == "eval" else []), data]
    return run_torchkit_in_process(
        command, *model, "--device", "cpu", "--workers", "0", "--image-size", "8",
        "--allow-untrained", *more,
    )  # fmt: skip


def test_eval_of_a_masking_model_warns_only_of_the_infinite_loss(data, tmp_path):
    out = tmp_path / "report"
    done = _run("eval", data, "--num-classes", "3", "--format", "json", "--out", out)
    assert done.returncode == 0, done.stderr
    assert "not finite" not in done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("Warning:")]
    assert warnings == [
        "Warning: the loss is infinite for 2 of 7 image(s): the model gives their true class a "
        f"-inf logit, a probability of 0 (first: {data / 'c' / 'c_0.png'}) (the mean loss is "
        "inf, null in JSON; the accuracy and the other metrics count them as any other image)"
    ]
    result = _strict_json(done.stdout)
    assert result["num_nonfinite"] == 0 and result["num_images"] == 7
    assert result["loss"] is None
    losses = {row["label"]: row["loss"] for row in result["per_class"]}
    assert losses["c"] is None and math.isfinite(losses["a"]) and math.isfinite(losses["b"])
    metrics = _strict_json((out / "metrics.json").read_text())
    assert metrics["loss"] is None and metrics["num_nonfinite"] == 0
    rows = (out / "predictions.csv").read_text().splitlines()
    header = rows[0].split(",")
    for line in rows[1:]:
        row = dict(zip(header, line.split(","), strict=True))
        assert float(row["probability_3"]) == 0.0 and row["class_3"] == "c"
        assert (row["loss"] == "inf") == (row["label"] == "c")


def test_predict_of_a_masking_model_writes_probability_0_and_no_error(data):
    done = _run("predict", data, "--logits", "--topk", "3", "--format", "json")
    assert done.returncode == 0, done.stderr
    assert "non-finite" not in done.stderr
    rows = _strict_json(done.stdout)
    assert len(rows) == 7
    for row in rows:
        assert row["error"] in ("", None) and row["class_3"] == "c"
        assert row["probability_3"] == 0.0 and row["logit_2"] is None  # -inf: null in JSON
        assert math.isclose(row["probability_1"] + row["probability_2"], 1.0, rel_tol=1e-6)
    table = _run("predict", data, "--logits", "--format", "csv")
    lines = table.stdout.splitlines()
    header = lines[0].split(",")
    assert [dict(zip(header, line.split(","), strict=True))["logit_2"] for line in lines[1:]] == [
        "-inf"
    ] * 7
    assert all(line.endswith(",") for line in lines[1:])  # an empty error column


def test_extract_features_keeps_masked_logits_without_a_warning(data, tmp_path):
    """The logits layer holds the -inf as computed; only NaN, +inf (a float16 overflow among
    them) or a row of -inf alone are non-finite features."""
    out = tmp_path / "features"
    done = _run("extract-features", data, out, "--layer", "logits", "--strict")
    assert done.returncode == 0, done.stderr
    assert "non-finite" not in done.stderr
    assert _strict_json((out / "meta.json").read_text())["num_nonfinite"] == 0
    logits = np.load(out / "logits.npy")
    assert logits.shape == (7, 3) and np.isneginf(logits[:, 2]).all()
    assert np.isfinite(logits[:, :2]).all()
