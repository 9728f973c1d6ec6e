"""A model that masks classes with -inf logits (eval, predict): softmax gives them 0, they rank
last, and the image is scored as any other; only NaN, +inf or a row of -inf alone is a
non-finite output. An image whose true class is masked has an infinite loss: left out of the
mean loss (counted in `num_masked`, said once), as train leaves it out."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from eval_plots import lay_out_eval_plots_only
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


def test_eval_of_a_masking_model_leaves_masked_images_out_of_the_loss(data, tmp_path, monkeypatch):
    """As train's validation and test losses: the images whose true class is masked are left
    out of the loss (the mean was inf, null in JSON) and counted in `num_masked`."""
    lay_out_eval_plots_only(monkeypatch)  # the PNGs' pictures are not this test's (eval_plots)
    out = tmp_path / "report"
    done = _run("eval", data, "--num-classes", "3", "--out", out)
    assert done.returncode == 0, done.stderr
    assert "not finite" not in done.stderr
    (masked_row,) = [line for line in done.stdout.splitlines() if "Masked" in line]
    assert [cell.strip() for cell in masked_row.split("│")][1:3] == ["Masked (not in loss)", "2"]
    warnings = [line for line in done.stderr.splitlines() if line.startswith("Warning:")]
    assert warnings == [
        "Warning: the model gives the true class of 2 of 7 images a -inf logit (it masks that "
        "class): their loss is infinite, so the loss is the mean over the others (the "
        f"accuracies count every image; num_masked counts them; first: {data / 'c' / 'c_0.png'})"
    ]
    result = _strict_json((out / "metrics.json").read_text())
    assert result["num_nonfinite"] == 0 and result["num_images"] == 7
    assert result["num_masked"] == 2
    rows = (out / "predictions.csv").read_text().splitlines()
    header = rows[0].split(",")
    losses = []
    for line in rows[1:]:
        row = dict(zip(header, line.split(","), strict=True))
        assert float(row["probability_3"]) == 0.0 and row["class_3"] == "c"
        assert (row["loss"] == "inf") == (row["label"] == "c")
        losses += [] if row["label"] == "c" else [float(row["loss"])]
    assert len(losses) == 5 and result["loss"] == pytest.approx(np.mean(losses), rel=1e-6)
    per_class = {row["label"]: row for row in result["per_class"]}
    assert per_class["c"]["loss"] is None and per_class["c"]["masked"] == 2
    assert per_class["a"]["masked"] == per_class["b"]["masked"] == 0
    assert math.isfinite(per_class["a"]["loss"]) and math.isfinite(per_class["b"]["loss"])
    header, *rows = (out / "per_class.csv").read_text().splitlines()
    masked = header.split(",").index("masked")
    assert [row.split(",")[masked] for row in rows] == ["0", "0", "2"]


def test_train_and_eval_of_the_same_masking_checkpoint_give_the_same_loss(tmp_path, monkeypatch):
    """train's test loss of best.pt and eval's loss of best.pt on the same test images leave
    out the same masked images: one number (eval's was inf)."""
    root = tmp_path / "data"
    for split in ("train", "val", "test"):
        write_image_folder(root / split, dict.fromkeys("abc", 3), seed=len(split))
    run = tmp_path / "run"
    trained = run_torchkit_in_process(
        "train", "--data", root, "--model", "nets:EvalMaskedNet", "--epochs", "1",
        "--image-size", "8", "--resize-size", "8", "--batch-size", "4", "--workers", "0",
        "--device", "cpu", "--no-ema", "--out", run, "--format", "json",
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    reported = json.loads(trained.stdout)
    assert reported["test_size"] == 9 and math.isfinite(reported["test_loss"])
    done = run_torchkit_in_process(
        "eval", run / "best.pt", "--data", root, "--split", "test", "--device", "cpu",
        "--workers", "0", "--format", "json", "--trust-checkpoint",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = _strict_json(done.stdout)
    assert result["num_images"] == 9 and result["num_masked"] == 3
    assert result["accuracy"] == reported["test_top1"]
    assert result["loss"] == pytest.approx(reported["test_loss"], rel=1e-6, abs=1e-6)


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


def test_extract_features_counts_masked_logits_scaled_to_nan_by_normalize(data, tmp_path):
    """--normalize l2 of a row with a -inf gives NaN there and 0 elsewhere: rows that mean
    nothing, counted and warned of as non-finite (an error with --strict), not kept silently."""
    out = tmp_path / "features"
    done = _run("extract-features", data, out, "--layer", "logits", "--normalize", "l2")
    assert done.returncode == 0, done.stderr
    assert "7 of the 7 rows have non-finite features" in done.stderr
    assert "or drop --normalize l2, which makes NaN of a row of logits with a -inf" in done.stderr
    assert _strict_json((out / "meta.json").read_text())["num_nonfinite"] == 7
    assert np.isnan(np.load(out / "logits.npy")[:, 2]).all()
    strict = _run("extract-features", data, tmp_path / "strict", "--layer", "logits",
                  "--normalize", "l2", "--strict")  # fmt: skip
    assert strict.returncode == 1
    assert "layer logits gives non-finite values (NaN or inf)" in strict.stderr


def test_the_masked_loss_rule_reads_arrays_and_tensors_alike():
    """One rule for train's sums (tensors on the device) and eval's predictions (NumPy): a +inf
    loss of a scorable row is masked, a NaN or +inf one of an unscorable row is not."""
    from torchkit.core.inference.masked_loss import dataset_loss, masked_true_class

    losses, scorable = [0.5, math.inf, math.inf, math.nan], [True, True, False, False]
    assert masked_true_class(np.array(losses), np.array(scorable)).tolist() == [
        False, True, False, False
    ]  # fmt: skip
    assert masked_true_class(torch.tensor(losses), torch.tensor(scorable)).tolist() == [
        False, True, False, False
    ]  # fmt: skip
    some = dataset_loss(3.0, 4, 1)
    assert some.loss == 1.0 and some.masked_warning("test").startswith(
        "the model gives the true class of 1 of 4 test images a -inf logit"
    )
    assert dataset_loss(3.0, 4, 0).masked_warning() is None
    every = dataset_loss(0.0, 2, 2)
    assert every.loss is None
    assert every.none_left("validation") == (
        "the model gives the true class of every one of the 2 validation images a -inf logit "
        "(it masks that class): no validation loss can be computed"
    )
