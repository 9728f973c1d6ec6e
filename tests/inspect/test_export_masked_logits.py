"""`export` of a model that masks classes with -inf logits: the verification compares the finite
outputs within the tolerance and the infinities exactly, instead of an infinite tolerance that
any export passes."""

from __future__ import annotations

import json
import math

import torch
from processes import run_torchkit_in_process


def test_an_export_of_a_masking_model_is_verified_within_a_finite_tolerance(tmp_path):
    out = tmp_path / "model.ts"
    done = run_torchkit_in_process(
        "export", "nets:MaskedNet", out, "--image-size", "8", "--format", "json"
    )
    assert done.returncode == 0, done.stderr
    assert "inconclusive" not in done.stderr
    report = json.loads(done.stdout, parse_constant=lambda token: 1 / 0)
    assert report["verification"] == "passed"
    assert report["max_abs_diff"] == 0.0
    assert 0 < report["tolerance"] < 1e-3 and 0 < report["output_spread"] < math.inf


def test_an_export_that_loses_the_mask_differs_by_inf():
    from torchkit.core.export.verification import Verification, _max_abs_diff, output_spread

    inf = math.inf
    reference = torch.tensor([[0.5, -inf], [0.25, -inf]])
    assert _max_abs_diff(reference.clone(), reference) == 0.0
    lost = torch.tensor([[0.5, -1e9], [0.25, -1e9]])
    assert _max_abs_diff(lost, reference) == inf
    assert _max_abs_diff(torch.tensor([[0.5, inf], [0.25, -inf]]), reference) == inf
    assert output_spread([reference]) == 0.25  # the masked column does not move
    check = Verification([2], inf, 0.5, 1e-4, 0.25)
    assert not check.passed and check.conclusive
