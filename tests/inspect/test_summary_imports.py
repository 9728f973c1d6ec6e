"""summary imports neither torch._dynamo nor sympy (`core.summary.plain_shapes`): in a fresh
process, since this one has loaded both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from processes import INHERITED
from suite_paths import REPO

# resnet18 is built on the meta device: its random draws ran torch's references there
# (torch._dynamo, sympy); its BatchNorm and convolutions run meta kernels and decompositions
# that ask symbolic_shapes and sympy on every call. An LSTM, built for real, runs its meta
# copy through the same. The figures are those the summary tests check.
SCRIPT = """
    import json, sys
    import torch
    from torchkit.cli import main
    from torchkit.core.summary import summarize

    HEAVY = ("torch._dynamo", "sympy", "torch.fx.experimental.symbolic_shapes")

    def loaded():
        return [name for name in HEAVY if name in sys.modules]

    # a caller of main(), not the program: it raises SystemExit and the process goes on
    sys.argv = ["python -m torchkit", "summary", "resnet18", "--image-size", "32",
                "--format", "json", "-o", sys.argv[1]]
    try:
        main()
    except SystemExit as ended:
        assert ended.code in (0, None), ended.code
    cli = loaded()
    lstm = summarize(torch.nn.LSTM(8, 16, batch_first=True), [(2, 10, 8)])
    print(json.dumps({"cli": cli, "lstm": loaded(), "lstm_mult_adds": lstm.total_mult_adds,
                      "lstm_flops": lstm.flops, "lstm_out": lstm.layers[0].output_shape}))
"""


def test_summary_imports_neither_dynamo_nor_sympy_and_counts_the_same(tmp_path):
    report = tmp_path / "summary.json"
    env = {key: value for key, value in os.environ.items() if key not in INHERITED}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), str(report)],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["cli"] == [] and seen["lstm"] == []
    totals = json.loads(report.read_text())["totals"]
    # resnet18: 11,689,512 parameters; at 32 px 1x1 after the stem's four halvings
    assert totals["total_params"] == 11_689_512
    assert totals["flops"] > 0 and totals["total_mult_adds"] > 0
    # an LSTM(8, 16): 4 gates of 16 x (8 + 16) weights and two biases of 64, at 2 x 10 steps
    assert seen["lstm_mult_adds"] == 2 * 10 * (64 * 8 + 64 * 16 + 64 + 64)
    assert seen["lstm_out"] == [[2, 10, 16], [[1, 2, 16], [1, 2, 16]]]
    assert seen["lstm_flops"] > 0
