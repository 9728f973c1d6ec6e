"""Issue #13 for `torchkit eval`: --out and -o never replace, contain or land inside an input
(the data, a CSV index and its images, the checkpoint, --stats), --force replaces only an earlier
eval's folder, SIGTERM stops the DataLoader workers and leaves an old --out as it was, a second
run on the same --out is refused while the first runs, and a full disk is one `Error: cannot
write` line with nothing half-written under --out. Signals, a lock held by a running eval and a
full disk are real `python -m torchkit` processes; refusals and finished runs run in this
process."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import sklearn.metrics  # noqa: F401 - eval scores in this process, with no helper to wait for
import torch
from eval_plots import lay_out_eval_plots_only
from output_checks import error_line, hidden_siblings, tree_digest
from processes import (
    run_each_in_process,
    run_torchkit_in_process,
    start_torchkit_process,
)
from safety_world import check_locked_then_terminated, write_world

REPORTS = (
    "metrics.json",
    "per_class.csv",
    "confusion_matrix.csv",
    "predictions.csv",
    "confusion_matrix.png",
    "errors.png",
)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """Every input eval reads, made once: the shared world (an image folder `ds`, a CSV index
    naming its images, a torchkit checkpoint `run/best.pt`, a stats file, the gated model)
    and the gated model's weights `gated.pt`."""
    root = write_world(tmp_path_factory.mktemp("eval-safety"))
    gated = {
        "body.1.weight": torch.randn(16, 192) * 0.05,
        "body.1.bias": torch.zeros(16),
        "head.weight": torch.randn(2, 16) * 0.1,
        "head.bias": torch.zeros(2),
    }
    torch.save(gated, root / "gated.pt")
    return root


def _matplotlib_png() -> bytes:
    import io

    from PIL import Image, PngImagePlugin

    text = PngImagePlugin.PngInfo()
    text.add_text("Software", "Matplotlib version3.8.0, https://matplotlib.org/")
    made = io.BytesIO()
    Image.new("RGB", (4, 4)).save(made, format="PNG", pnginfo=text)
    return made.getvalue()


EARLIER = {
    "per_class.csv": b"label,index,support,predicted,precision\na,0,1,1,1.0\n",
    "confusion_matrix.csv": b"true \\ predicted,a,b\na,1,0\nb,0,1\n",
    "confusion_pairs.csv": b"true,predicted,count\n",
    "predictions.csv": b"path,label,label_index,class,class_index,probability\n",
    "confusion_matrix.png": _matplotlib_png(),
    "errors.png": _matplotlib_png(),
}


def older_eval_output(folder: Path, *, marker: bool) -> None:
    """An eval --out folder as an earlier torchkit wrote it (with or before the marker)."""
    folder.mkdir()
    for name in REPORTS:  # as --force's proofs read them: the CSVs' headers, Matplotlib's PNGs
        (folder / name).write_bytes(EARLIER.get(name, f"earlier {name}\n".encode()))
    earlier = {"num_images": 12, "num_skipped": 0, "accuracy": 0.5, "topk_accuracy": {"1": 0.5}}
    (folder / "metrics.json").write_text(json.dumps(earlier) + "\n")
    if marker:
        (folder / ".torchkit").write_text('{"written_by": "torchkit", "command": "eval"}\n')


EVAL = ["eval", "run/best.pt", "--data", "ds", "--workers", "0", "--format", "json"]
# No --format: -o's extension picks it, so -o index.csv is an overlap, not a contradiction.
EVAL_ANY_FORMAT = EVAL[:-2]

OVERLAPS = [
    (["--out", "ds", "--force"], "output folder ds is the data folder ds"),
    (["--out", "ds/a", "--force"], "output folder ds/a lies inside the data folder ds"),
    (["--out", "run", "--force"], "output folder run contains the checkpoint run/best.pt"),
    (["--out", ".", "--force"], "output folder . is the working directory"),
    (["--out", "..", "--force"], "output folder .. is a parent of the working directory"),
    (["-o", "run/best.pt", "--force"], "output run/best.pt is the checkpoint run/best.pt"),
    (["-o", "ds/a/new.json"], "output ds/a/new.json lies inside the data folder ds"),
    (["--stats", "stats.json", "-o", "stats.json", "--force"], "is the stats file stats.json"),
    (["--out", "rep", "-o", "rep/m.json"], "output rep/m.json lies inside the --out folder rep"),
    (["--out", "rep", "-o", "rep", "--format", "json"], "output rep is the --out folder rep"),
    # A CSV index: the index itself and the folders of the images it names.
    (["--data", "index.csv", "-o", "index.csv", "--force"], "is the data file index.csv"),
    (["--data", "index.csv", "--out", "ds", "--force"], "contains the images of index.csv"),
]


def without_data(command: list[str]) -> list[str]:
    at = command.index("--data")
    return command[:at] + command[at + 2 :]


def test_outputs_that_overlap_an_input_are_refused_and_nothing_changes(world):
    before = tree_digest(world)
    # A row that gives its own --data replaces EVAL's (twice would also warn on stderr).
    commands = [
        [*(EVAL_ANY_FORMAT if "--data" not in args else without_data(EVAL_ANY_FORMAT)), *args]
        for args, _ in OVERLAPS
    ]
    results = run_each_in_process(commands, cwd=world)
    for (args, message), result in zip(OVERLAPS, results, strict=True):
        assert result.returncode == 1, (args, result.stderr)
        assert message in error_line(result.stderr, besides="nothing"), args
        assert result.stdout == ""
    assert tree_digest(world) == before  # the inputs' bytes, and no new file anywhere


def test_report_file_is_never_the_source_of_the_model_callable_even_with_force(world):
    before = tree_digest(world)
    for model in (
        ["gatemod:Gated", "--weights", "gated.pt"],
        ["gated.pt", "--model", "gatemod:Gated"],
    ):
        command = ["eval", *model, "--data", "ds", "--image-size", "8", "--workers", "0"]
        result = run_torchkit_in_process(*command, "-o", "gatemod.py", "--force", cwd=world)
        assert result.returncode == 1, (model, result.stderr)
        assert "output gatemod.py is the model source gatemod.py" in error_line(result.stderr)
    assert tree_digest(world) == before


def test_force_replaces_an_earlier_eval_folder_and_nothing_else(world, tmp_path, monkeypatch):
    lay_out_eval_plots_only(monkeypatch)  # the PNGs' pictures are not this test's (eval_plots)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")
    (mine / "metrics.json").write_text("{}")
    mine_before = tree_digest(mine)
    refused = run_torchkit_in_process(*EVAL, "--out", str(mine), "--force", cwd=world)
    assert refused.returncode == 1
    assert "Error: output folder" in refused.stderr
    assert "was not written by torchkit" in refused.stderr
    assert tree_digest(mine) == mine_before
    # Only a name eval writes, but another tool's report: not an earlier eval's.
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "metrics.json").write_text('{"accuracy": 0.99, "tool": "another"}\n')
    theirs_before = tree_digest(theirs)
    refused = run_torchkit_in_process(*EVAL, "--out", str(theirs), "--force", cwd=world)
    assert refused.returncode == 1 and "was not written by torchkit" in error_line(refused.stderr)
    assert tree_digest(theirs) == theirs_before
    # Another torchkit command's output (a training run): not an earlier eval's either.
    trained = tmp_path / "trained"
    trained.mkdir()
    (trained / ".torchkit").write_text('{"written_by": "torchkit", "command": "train"}\n')
    (trained / "last.pt").write_bytes(b"hours of training")
    trained_before = tree_digest(trained)
    refused = run_torchkit_in_process(*EVAL, "--out", str(trained), "--force", cwd=world)
    assert refused.returncode == 1
    assert "holds the output of torchkit train, not of eval" in error_line(refused.stderr)
    assert tree_digest(trained) == trained_before

    older = tmp_path / "older"
    older_eval_output(older, marker=False)  # written before the .torchkit marker existed
    done = run_torchkit_in_process(*EVAL, "--out", str(older), "--force", cwd=world)
    assert done.returncode == 0, done.stderr
    metrics = json.loads((older / "metrics.json").read_text())
    assert metrics["accuracy"] == json.loads(done.stdout)["accuracy"]
    assert sorted(p.name for p in older.iterdir()) == sorted([".torchkit", *REPORTS])
    assert hidden_siblings(older) == []


def test_an_out_left_by_an_eval_killed_before_its_first_report_is_written_again(
    world, tmp_path, monkeypatch
):
    lay_out_eval_plots_only(monkeypatch)  # the PNGs' pictures are not this test's (eval_plots)
    # Killed between marking --out and its first report: the marker and a dead writer's
    # temporary were all there was, and the same command was refused ("already exists").
    out = tmp_path / "out"
    out.mkdir()
    (out / ".torchkit").write_text('{"written_by": "torchkit", "command": "eval"}\n')
    (out / ".metrics.json.abcd1234.tmp").write_text('{"accu')
    done = run_torchkit_in_process(*EVAL, "--out", str(out), cwd=world)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted([".torchkit", *REPORTS])
    assert hidden_siblings(out) == []


def test_sigterm_stops_the_workers_and_a_second_run_is_refused(world, tmp_path):
    previous = tmp_path / "previous"
    older_eval_output(previous, marker=True)
    before = tree_digest(previous)
    started = tmp_path / "started"
    gated = [
        "eval", "gated.pt", "--model", "gatemod:Gated", "--num-classes", "2", "--data", "ds",
        "--image-size", "8", "--workers", "2", "--batch-size", "2", "--out", str(previous),
        "--force",
    ]  # fmt: skip
    process = start_torchkit_process(*gated, cwd=world, env={"GATE_FILE": str(started)})
    second = [*EVAL, "--out", str(previous), "--force"]
    check_locked_then_terminated(process, started, second, cwd=world)
    assert tree_digest(previous) == before
    assert hidden_siblings(previous) == []  # no lock, no half-written folder


def test_full_disk_is_an_error_and_leaves_nothing_under_out(world, small_tmpfs):
    disk = small_tmpfs(16)  # too small for the two PNGs
    result = run_torchkit_in_process(*EVAL, "--out", str(disk / "rep"), cwd=world)
    assert result.returncode == 1, result.stderr
    assert "Error: cannot write " in result.stderr and "No space left" in result.stderr
    assert f"{disk / 'rep'}" in result.stderr  # named as --out, not its hidden temporary folder
    assert "Traceback" not in result.stderr
    assert os.listdir(disk) == []  # no report, no partial folder, no lock
