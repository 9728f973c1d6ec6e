"""A file output named with a trailing slash (`-o reports/`, `export ck.pt exports/`) names a
folder: refused with one line before any work, never written as a FILE named without the slash
(a Path drops it). Folder outputs (`--out DIR/`) keep taking one."""

from __future__ import annotations

from pathlib import Path

import pytest
from eval_plots import lay_out_eval_plots_only
from output_checks import error_line, tree_digest, write_command_inputs

from torchkit.cli import app
from torchkit.core.io.errors import UsageError
from torchkit.core.io.file_outputs import check_output_file


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    return write_command_inputs(tmp_path, per_class=3)


# Each command's file outputs, `NEW/` standing for the name ending in a slash; the rest valid.
FILE_OUTPUTS = {
    "env -o": ["env", "-o", "NEW/"],
    "dataset-stats -o": ["dataset-stats", "IMAGES", "-j", "0", "-o", "NEW/"],
    "dataset-stats --plot": ["dataset-stats", "IMAGES", "-j", "0", "--plot", "NEW/"],
    "dataset-stats --leakage-csv": [
        "dataset-stats", "IMAGES", "-j", "0", "--near-duplicates", "--leakage-csv", "NEW/",
    ],
    "summary -o": ["summary", "MODEL", "-o", "NEW/"],
    "eval -o": ["eval", "MODEL", "--data", "IMAGES", "-j", "0", "-o", "NEW/"],
    "predict -o": ["predict", "MODEL", "IMAGES", "-j", "0", "-o", "NEW/"],
    "benchmark -o": ["benchmark", "convnet", "-o", "NEW/"],
    "split -o": ["split", "IMAGES", "ROOT/parts", "-o", "NEW/"],
    "train -o": ["train", "--data", "IMAGES", "--out", "ROOT/run", "-j", "0", "-o", "NEW/"],
    "extract-features -o": ["extract-features", "convnet", "--list-layers", "-o", "NEW/"],
    "export OUT": ["export", "MODEL", "NEW/", "--to", "onnx"],
    "export --out": ["export", "MODEL", "--out", "NEW/", "--to", "onnx"],
    "export --model OUT": ["export", "--model", "MODEL", "NEW/", "--to", "onnx"],
    "export -o": ["export", "MODEL", "ROOT/model.onnx", "-o", "NEW/"],
    "convert-syncbn DST": ["convert-syncbn", "MODEL", "NEW/"],
    "convert-syncbn --out": ["convert-syncbn", "MODEL", "--out", "NEW/"],
    "convert checkpoint DST": ["convert", "checkpoint", "ROOT/weights.pt", "NEW/"],
    "convert checkpoint --out": ["convert", "checkpoint", "ROOT/weights.pt", "--out", "NEW/"],
    "convert checkpoint --average": [
        "convert", "checkpoint", "--average", "ROOT/weights.pt", "ROOT/weights.pt", "NEW/",
    ],
    "convert tensor -o": ["convert", "tensor", "IMAGE", "ROOT/a.npy", "-o", "NEW/"],
}  # fmt: skip


def _filled(args: list[str], root: Path) -> list[str]:
    named = {
        "IMAGES": str(root / "images"),
        "IMAGE": str(root / "images" / "a" / "a_0.png"),
        "MODEL": str(root / "model.pt"),
        "NEW/": str(root / "new") + "/",
    }
    return [named.get(arg, arg.replace("ROOT", str(root))) for arg in args]


@pytest.mark.parametrize("case", sorted(FILE_OUTPUTS))
def test_a_file_output_ending_in_a_slash_is_refused(runner, inputs, case):
    before = tree_digest(inputs)
    result = runner.invoke(app, _filled(FILE_OUTPUTS[case], inputs))
    assert result.exit_code == 2, (result.stdout, result.stderr)
    line = error_line(result.stderr)
    assert f"{inputs / 'new'}/ names a folder (ends in /)" in line
    assert "give a file name" in line
    assert tree_digest(inputs) == before  # no file `new`, nothing else written


def test_a_file_named_dash_in_a_folder_name_is_refused_too(runner, tmp_path, monkeypatch):
    """`-o ./-` is a file called `-` (not stdout); `-o ./-/` names a folder like any `x/`."""
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["env", "-o", "./-/"])
    assert result.exit_code == 2
    assert "./-/ names a folder (ends in /)" in error_line(result.stderr)
    assert list(tmp_path.iterdir()) == []


def test_the_library_check_refuses_it_too(tmp_path):
    with pytest.raises(UsageError, match="names a folder"):
        check_output_file(f"{tmp_path / 'new'}/", force=False)
    assert not (tmp_path / "new").exists()


def test_stdout_is_still_dash(runner, inputs, monkeypatch):
    monkeypatch.chdir(inputs)
    before = tree_digest(inputs)
    result = runner.invoke(app, ["summary", "model.pt", "--format", "csv", "-o", "-"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("depth,name,type,")
    assert tree_digest(inputs) == before  # no file named `-`


# Folder outputs still take a trailing slash: the folder is made and filled.
FOLDER_OUTPUTS = {
    "split OUT/": ["split", "IMAGES", "NEW/"],
    "split --out OUT/": ["split", "IMAGES", "--out", "NEW/"],
    "convert tensor DST/": ["convert", "tensor", "IMAGES", "NEW/", "--to", "npy", "-j", "0"],
    "eval --out DIR/": ["eval", "MODEL", "--data", "IMAGES", "-j", "0", "--out", "NEW/"],
}


@pytest.mark.parametrize("case", sorted(FOLDER_OUTPUTS))
def test_a_folder_output_ending_in_a_slash_is_made(runner, inputs, case, monkeypatch):
    lay_out_eval_plots_only(monkeypatch)  # eval's PNGs are not read here: laid out, not drawn
    result = runner.invoke(app, _filled(FOLDER_OUTPUTS[case], inputs))
    assert result.exit_code == 0, result.stderr
    assert (inputs / "new").is_dir()
    assert any((inputs / "new").iterdir())


# convert tensor's DST is a file or a folder: a slash makes it a folder whatever its extension
# (`out.npy/` was the FILE out.npy).
@pytest.mark.parametrize("where", ["DST", "--out"])
def test_convert_tensor_dst_with_an_extension_and_a_slash_is_a_folder(runner, inputs, where):
    image, target = inputs / "images" / "a" / "a_0.png", f"{inputs / 'out.npy'}/"
    dst = [target] if where == "DST" else ["--out", target]
    result = runner.invoke(app, ["convert", "tensor", str(image), *dst, "--to", "npy"])
    assert result.exit_code == 0, result.stderr
    assert [p.name for p in (inputs / "out.npy").iterdir()] == ["a_0.npy"]

    before = tree_digest(inputs)
    result = runner.invoke(app, ["convert", "tensor", str(image), f"{inputs / 'b.png'}/"])
    assert result.exit_code == 2
    assert f"{inputs / 'b.png'}/ names a folder (ends in /)" in error_line(result.stderr)
    assert tree_digest(inputs) == before
