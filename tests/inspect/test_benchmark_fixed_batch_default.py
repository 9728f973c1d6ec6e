"""benchmark of a TorchScript file exported with `--static-batch -b N`, without --batch-size,
was refused ('takes batches of N only (exported with --static-batch), not 32'): the default
batch of 32 was taken as asked for, though the file runs batches of N only and summary counts
it at N without --batch-size. It is timed at N; a --batch-size other than N is still refused."""

from __future__ import annotations

import json

from output_checks import error_line

from torchkit.cli import app


def test_a_fixed_batch_file_is_timed_at_its_batch_without_batch_size(runner, tmp_path):
    path = tmp_path / "fixed.ts"
    exported = runner.invoke(
        app,
        ["export", "nets:TinyNet", str(path), "--image-size", "8", "--static-batch", "-b", "3"],
    )
    assert exported.exit_code == 0, exported.stderr
    args = ["benchmark", str(path), "--trust-checkpoint", "--device", "cpu", "--iters", "1"]
    timed = runner.invoke(app, [*args, "--warmup", "0", "--format", "json"])
    assert timed.exit_code == 0, timed.stderr
    assert [row["batch_size"] for row in json.loads(timed.stdout)["results"]] == [3]
    asked = runner.invoke(app, [*args, "-b", "32"])
    assert asked.exit_code == 2 and asked.stdout == ""
    assert error_line(asked.stderr).startswith(f"Error: {path} takes batches of 3 only")
