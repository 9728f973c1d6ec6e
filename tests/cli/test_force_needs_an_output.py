"""`--force` replaces existing outputs: in predict, eval and extract-features --list-layers,
where no output option names anything to replace, it was accepted and did nothing, while eval's
--normalize and --show-errors without --out were refused. Now it is refused the same way (exit 2,
one `Error:` line, before any work). A command that always writes an output (an
extract-features run, into OUT) keeps it."""

from __future__ import annotations

import pytest
from checkpoints import write_convnet_checkpoint
from image_folders import write_image_folder
from processes import run_torchkit_in_process

PREDICT_REFUSAL = (
    "Error: --force replaces existing outputs, and no -o FILE is given "
    "(add -o FILE, or drop --force)\n"
)
EVAL_REFUSAL = (
    "Error: --force replaces existing outputs, and neither -o FILE nor --out DIR is given "
    "(add -o FILE or --out DIR, or drop --force)\n"
)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A convnet checkpoint for 8x8 RGB images of classes a and b, and two such images."""
    root = tmp_path_factory.mktemp("force")
    write_convnet_checkpoint(root / "model.pt", in_channels=3, image_size=8, classes="ab")
    write_image_folder(root / "images", {"a": 1, "b": 1})
    return root


@pytest.mark.parametrize(
    ("words", "refusal"),
    [
        (["predict", "{model}", "{images}"], PREDICT_REFUSAL),
        (["predict", "{model}", "{images}", "-o", "-"], PREDICT_REFUSAL),  # stdout
        (["eval", "{model}", "--data", "{images}"], EVAL_REFUSAL),
        (["eval", "{model}", "--data", "{images}", "-o", "-"], EVAL_REFUSAL),
        (["extract-features", "{model}", "--list-layers"], PREDICT_REFUSAL),
    ],
    ids=["predict", "predict-stdout", "eval", "eval-stdout", "list-layers"],
)
def test_force_with_nothing_to_replace_is_refused(inputs, words, refusal):
    """Before: each ran (exit 0, its result on stdout) as if --force were not there."""
    paths = {"model": inputs / "model.pt", "images": inputs / "images"}
    args = [word.format(**paths) for word in words]
    refused = run_torchkit_in_process(*args, "--force", "-j", "0")
    assert (refused.returncode, refused.stdout) == (2, ""), refused.stderr
    assert refused.stderr == refusal
