"""`--force` replaces the files torchkit writes under names others use too (curves.png,
split.csv, lr_find.*, eval's CSVs and plots) only where their content shows torchkit wrote
them (`core.io.output_proofs`): a user's own file of such a name in an earlier output is refused,
byte for byte untouched, and every command's own output is replaced on a re-run. Before, these
were judged by name alone, and a user's curves.png went with the run folder."""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import pytest
from output_checks import error_line, tree_digest
from processes import run_torchkit_in_process, run_torchkit_process
from safety_world import write_world

from torchkit.core.evaluate.runner import OWNED_REPORTS, _is_eval_plot
from torchkit.core.io.folder_contents import ProvenPattern
from torchkit.core.io.output_proofs import torchkit_png
from torchkit.core.train.outputs import RUN_OUTPUTS

pytestmark = pytest.mark.drawn_curves  # the real curves.png and lr_find.png (tests/conftest.py)

RUN_PROOFS = {p: p.proof for p in RUN_OUTPUTS if isinstance(p, ProvenPattern)}
TINY = ["--model", "convnet", "--image-size", "8", "--batch-size", "4", "--workers", "0"]
TRAIN = ["train", *TINY, "--data", "ds", "--val-split", "0.5", "--epochs", "1", "--out", "out"]
EVAL = ["eval", "run/best.pt", "--data", "ds", "-j", "0", "--out", "rep"]


def _png(size: tuple[int, int], software: str | None) -> bytes:
    """A PNG of `size` pixels, with a Software text where given (as Matplotlib writes one)."""
    from PIL import Image, PngImagePlugin

    info = PngImagePlugin.PngInfo()
    if software is not None:
        info.add_text("Software", software)
    image = io.BytesIO()
    Image.new("RGB", size, "white").save(image, format="PNG", pnginfo=info)
    return image.getvalue()


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> Path:
    """The world, a run (`train`, with --find-lr's files beside it) and an eval's reports, each
    written twice by the real commands: the second time with --force over the first (a
    re-run is never refused over the command's own output)."""
    root = write_world(tmp_path_factory.mktemp("proofs"))
    for args in (TRAIN, [*TRAIN[:-1], "lr"], EVAL):
        if args[-1] == "lr":
            args = [*args, "--find-lr", "--find-lr-iters", "5"]
        for again in ([], ["--force"]):
            done = run_torchkit_in_process(*args, *again, cwd=root)
            assert done.returncode == 0, done.stderr
    shutil.copytree(root / "lr", root / "findlr")
    for name in ("lr_find.csv", "lr_find.png"):  # a run folder holding --find-lr's files too
        shutil.copy(root / "lr" / name, root / "out" / name)
    shutil.rmtree(root / "lr")
    return root


def test_each_file_a_command_writes_passes_its_proof(outputs):
    """The files the real commands wrote (above), each named by its proven pattern."""
    for folder, owned in [("out", RUN_OUTPUTS), ("rep", OWNED_REPORTS)]:
        proofs = {p: p.proof for p in owned if isinstance(p, ProvenPattern)}
        for path in sorted((outputs / folder).iterdir()):
            if path.name in proofs:
                assert proofs[path.name](path), path
    written = {p.name for p in (outputs / "out").iterdir()} | {
        p.name for p in (outputs / "rep").iterdir()
    }
    assert {"curves.png", "split.csv", "lr_find.csv", "lr_find.png", "predictions.csv"} <= written
    assert {"per_class.csv", "confusion_matrix.png", "confusion_matrix.csv"} <= written


@pytest.fixture
def world(outputs, tmp_path) -> Path:
    return Path(shutil.copytree(outputs, tmp_path / "world", symlinks=True))


USERS_FILES = {
    "curves.png": _png((640, 480), "Matplotlib version3.9.0, https://matplotlib.org/"),
    "split.csv": b"path,label,fold\nds/a/a_0.png,a,1\n",
    "lr_find.csv": b"lr,loss\n0.1,2.0\n",
    "lr_find.png": _png((600, 400), None),  # the size of torchkit's, not Matplotlib's
}


@pytest.mark.parametrize("name", list(USERS_FILES))
def test_force_keeps_a_users_file_in_a_run_folder(world, name):
    """`train --force` over a run folder where the user's own file took the name of one the
    run wrote: refused before any work, the file's bytes as they were (in process: a real
    train process, its plot helper's start, cost 8 s; eval's refusal below is a real one)."""
    (world / "out" / name).write_bytes(USERS_FILES[name])
    before = tree_digest(world)
    done = run_torchkit_in_process(*TRAIN, "--force", cwd=world)
    assert done.returncode == 1, done.stderr
    assert f"run folder out holds out/{name} that torchkit did not write" in error_line(
        done.stderr, besides="warnings"
    )
    assert (world / "out" / name).read_bytes() == USERS_FILES[name]
    assert tree_digest(world) == before


EVAL_USERS_FILES = {
    "predictions.csv": b"id,prediction\n1,a\n",
    "per_class.csv": b"class,f1\na,0.5\n",
    "confusion_pairs.csv": b"true,predicted,count,share\na,b,1,0.5\n",
    "confusion_matrix.png": _png((640, 480), "Matplotlib version3.9.0, https://matplotlib.org/"),
}


@pytest.mark.parametrize("name", list(EVAL_USERS_FILES))
def test_force_keeps_a_users_file_in_an_eval_folder(world, name):
    (world / "rep" / name).write_bytes(EVAL_USERS_FILES[name])
    made = (world / "rep" / "metrics.json").stat().st_mtime + 3600  # made an hour after the eval
    os.utime(world / "rep" / name, (made, made))
    before = tree_digest(world)
    run = run_torchkit_process if name == "predictions.csv" else run_torchkit_in_process
    done = run(*EVAL, "--force", cwd=world)
    assert done.returncode == 1, done.stderr
    assert f"output folder rep holds rep/{name} that torchkit did not write" in error_line(
        done.stderr, besides="warnings"
    )
    assert tree_digest(world) == before


def test_a_plot_drawn_before_the_software_text_is_proven_by_its_size(tmp_path):
    """curves.png and lr_find.png of an earlier version (Matplotlib's Software text, the
    figure's own pixel size) are the run's; the same text at another size is not."""
    matplotlib = "Matplotlib version3.8.0, https://matplotlib.org/"
    for size, proven in [((1500, 400), True), ((1000, 400), True), ((640, 480), False)]:
        (tmp_path / "curves.png").write_bytes(_png(size, matplotlib))
        assert (
            torchkit_png(legacy_sizes={(1500, 400), (1000, 400)})(tmp_path / "curves.png") is proven
        )
    # eval's plots (their size depends on the data): Matplotlib's, written with the record
    (tmp_path / "metrics.json").write_text(
        '{"num_images": 1, "num_skipped": 0, "accuracy": 1.0, "topk_accuracy": {}}'
    )
    (tmp_path / "errors.png").write_bytes(_png((700, 300), matplotlib))
    assert _is_eval_plot(tmp_path / "errors.png")
    later = (tmp_path / "metrics.json").stat().st_mtime + 3600
    os.utime(tmp_path / "errors.png", (later, later))
    assert not _is_eval_plot(tmp_path / "errors.png")
    (tmp_path / "x.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 10)  # cut short
    assert not torchkit_png()(tmp_path / "x.png")


# per_class.csv and predictions.csv as eval wrote them before their columns were renamed
# (`Class,Label,# occurrence`; `path,true_label,true_class,predicted_label`), a row each.
EARLIER_EVAL_FILES = {
    "per_class.csv": b"Class,Label,# occurrence,Precision,Recall,F1,Confused class 1,"
    b"Confused class 2,Confused class 3,Confused class 4,Confused class 5\n"
    b"a,0,3,0.0,0.0,0.0,b:3,,,,\n",
    "predictions.csv": b"path,true_label,true_class,predicted_label,predicted_class,confidence,"
    b"correct,loss,top1_label,top1_prob,top2_label,top2_prob\n"
    b"a/a_0.png,0,a,1,b,0.517027676,0,0.727795959,1,0.517027676,0,0.482972324\n",
}


def test_force_replaces_an_earlier_versions_eval_csvs(world):
    """A re-run of eval over the folder an earlier version wrote (its CSVs under the headers
    of then) replaces them: before, it was refused as holding files torchkit did not write."""
    for name, text in EARLIER_EVAL_FILES.items():
        (world / "rep" / name).write_bytes(text)
    done = run_torchkit_in_process(*EVAL, "--force", cwd=world)
    assert done.returncode == 0, done.stderr
    assert (world / "rep" / "per_class.csv").read_text().startswith("label,index,support,")
    assert (world / "rep" / "predictions.csv").read_text().startswith("path,label,label_index,")


def _png_with_ztxt(software: bytes) -> bytes:
    """A 10x10 PNG whose Software text is a compressed (zTXt) chunk."""
    from PIL import Image, PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("Software", software, zip=True)
    image = io.BytesIO()
    Image.new("RGB", (10, 10), "white").save(image, format="PNG", pnginfo=info)
    return image.getvalue()


def test_a_png_text_that_unpacks_to_much_is_read_a_little(tmp_path):
    """A curves.png whose compressed text chunk unpacks to 64 MB (65 KB on disk; 1 MB of it to
    1 GB, 7 s): the proof unpacks the few bytes it looks at, never the whole text."""
    import tracemalloc

    path = tmp_path / "curves.png"
    path.write_bytes(_png_with_ztxt(b"\0" * (64 << 20)))
    tracemalloc.start()
    try:
        assert not torchkit_png()(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20  # before: the 64 MB unpacked
    path.write_bytes(_png_with_ztxt(b"torchkit 0.1.0"))
    assert torchkit_png()(path)  # a compressed Software text is still read


def test_an_earlier_versions_plots_after_a_long_predictions_csv_are_the_evals(world):
    """An earlier version's eval folder whose predictions.csv (millions of rows) was written
    minutes after metrics.json, its plots right after it: a re-run replaces them. Before, the
    plots were judged by metrics.json's time alone and the re-run was refused."""
    rep = world / "rep"
    matplotlib = "Matplotlib version3.8.0, https://matplotlib.org/"
    for name in ("confusion_matrix.png", "errors.png"):
        (rep / name).write_bytes(_png((700, 300), matplotlib))
    written = (rep / "predictions.csv").stat().st_mtime
    os.utime(rep / "metrics.json", (written - 300, written - 300))
    for name in ("confusion_matrix.png", "errors.png"):
        os.utime(rep / name, (written + 2, written + 2))
    assert _is_eval_plot(rep / "errors.png")
    done = run_torchkit_in_process(*EVAL, "--force", cwd=world)
    assert done.returncode == 0, done.stderr
    # a plot of yours made an hour after both is still not the eval's
    (rep / "errors.png").write_bytes(_png((700, 300), matplotlib))
    later = max((rep / n).stat().st_mtime for n in ("metrics.json", "predictions.csv")) + 3600
    os.utime(rep / "errors.png", (later, later))
    assert not _is_eval_plot(rep / "errors.png")


def test_an_earlier_versions_plots_of_another_size_drawn_with_their_csv_are_the_runs(world):
    """An earlier version's curves.png and lr_find.png under a matplotlibrc's `savefig.bbox:
    tight` (1442x392 and 590x390, not the figures' 1500x400 and 600x400), each written with
    the CSV it plots: a re-run replaces them. Before, judged by their size alone, the re-run
    was refused. A Matplotlib plot larger than the figure is not the run's."""
    matplotlib = "Matplotlib version3.8.0, https://matplotlib.org/"
    tight = {"curves.png": (1442, 392), "lr_find.png": (590, 390)}
    for name, csv_name in [("curves.png", "metrics.csv"), ("lr_find.png", "lr_find.csv")]:
        written = (world / "out" / csv_name).stat().st_mtime
        (world / "out" / name).write_bytes(_png((640, 480), matplotlib))  # Matplotlib's default
        os.utime(world / "out" / name, (written + 1, written + 1))
        assert not RUN_PROOFS[name](world / "out" / name)
        (world / "out" / name).write_bytes(_png(tight[name], matplotlib))
        os.utime(world / "out" / name, (written + 1, written + 1))
        assert RUN_PROOFS[name](world / "out" / name)
    done = run_torchkit_in_process(*TRAIN, "--force", cwd=world)
    assert done.returncode == 0, done.stderr
    # a plot of yours made an hour after the run's CSV is still not the run's
    (world / "out" / "curves.png").write_bytes(_png((1442, 392), matplotlib))
    later = (world / "out" / "metrics.csv").stat().st_mtime + 3600
    os.utime(world / "out" / "curves.png", (later, later))
    assert not RUN_PROOFS["curves.png"](world / "out" / "curves.png")
