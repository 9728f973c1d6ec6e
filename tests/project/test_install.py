"""How torchkit is installed (issue #33): optional extras fail with one line naming the extra, no
private typer/click module is imported, the wheel ships the shell completions, and the install
documentation names no package-index install of a name someone else owns."""

from __future__ import annotations

import re
import sys

import pytest
from output_checks import error_line
from suite_paths import REPO

from torchkit.cli import app
from torchkit.core.io.errors import TorchkitError
from torchkit.core.runtime.extras import EXTRAS, MissingExtraError, import_extra, install_hint

tomllib = pytest.importorskip("tomllib")  # Python 3.11+


PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_every_extra_the_code_names_is_declared_with_its_packages():
    declared = PYPROJECT["project"]["optional-dependencies"]
    for extra, packages in EXTRAS.items():
        names = {re.split(r"[<>=!~ \[]", requirement)[0] for requirement in declared[extra]}
        assert set(packages) <= names, (extra, declared[extra])
    runtime = {re.split(r"[<>=!~ \[]", r)[0] for r in PYPROJECT["project"]["dependencies"]}
    assert not runtime & {"onnx", "onnxruntime", "timm", "tensorboard"}


def test_the_dev_environment_has_every_extra():
    """README: the development environment (`uv sync`) has every extra, so their tests run."""
    dev = {re.split(r"[<>=!~ \[]", r)[0] for r in PYPROJECT["dependency-groups"]["dev"]}
    for extra, packages in PYPROJECT["project"]["optional-dependencies"].items():
        names = {re.split(r"[<>=!~ \[]", requirement)[0] for requirement in packages}
        assert names <= dev, (extra, names - dev)


def test_a_missing_extra_is_one_error_naming_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails as if not installed
    with pytest.raises(MissingExtraError) as caught:
        import_extra("onnxruntime", "export", "running the ONNX model m.onnx")
    text = str(caught.value)
    assert text.startswith("running the ONNX model m.onnx needs the onnxruntime package")
    assert "uv sync --extra export" in text and "[export]" in text
    assert "pip install torchkit" not in text and "\n" not in text
    assert caught.value.hint == (
        "install torchkit's export extra: `uv sync --extra export` in a clone, or `uv tool install "
        "--reinstall 'CLONE[export]'` / `pip install 'CLONE[export]'`; CLONE is the torchkit "
        "folder or git URL"
    )


def test_a_broken_package_of_an_extra_is_not_reported_as_missing(monkeypatch):
    """onnx installed but one of its own dependencies missing: the real error, not 'install'."""
    import types

    fake = types.ModuleType("onnx_broken_probe")
    monkeypatch.setitem(sys.modules, "onnx", None)
    monkeypatch.setitem(EXTRAS, "probe", ("onnx_broken_probe",))
    monkeypatch.setitem(sys.modules, "onnx_broken_probe", fake)
    assert import_extra("onnx_broken_probe", "probe", "x") is fake
    with pytest.raises(ModuleNotFoundError):
        import_extra("onnx", "probe", "x")  # onnx is not a package of the probe extra


def test_export_to_onnx_without_the_extra_writes_nothing(runner, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnx", None)
    out = tmp_path / "m.onnx"
    result = runner.invoke(app, ["export", "convnet", str(out), "--num-classes", "3"])
    assert result.exit_code == 1, result.output
    line = error_line(result.stderr)
    assert line.startswith("Error: exporting to ONNX needs the onnx package"), line
    assert "--extra export" in line
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == []


def test_export_to_onnx_without_onnxruntime_says_so_before_any_work(runner, monkeypatch, tmp_path):
    """The verification's runtime was found missing after the model was built and traced, in an
    error naming the temporary file (`.m.x1y2.tmp.onnx`) instead of OUT."""
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    out = tmp_path / "m.onnx"
    result = runner.invoke(app, ["export", "convnet", str(out), "--num-classes", "3"])
    assert result.exit_code == 1, result.output
    line = error_line(result.stderr)
    assert line.startswith(
        "Error: verifying an ONNX export (--no-verify skips it) needs the onnxruntime package"
    ), line
    assert "Note:" not in result.stderr  # said before the model is built (its random weights)
    assert sorted(tmp_path.iterdir()) == []


def test_running_an_onnx_file_without_the_extra_is_one_error(runner, monkeypatch, tmp_path):
    model = tmp_path / "m.onnx"
    model.write_bytes(b"\x08\x07")  # the runtime is asked for before the file is parsed
    images = tmp_path / "images"
    images.mkdir()
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    for command in (
        ["eval", str(model), "--data", str(images)],
        ["predict", str(model), str(images)],
    ):
        result = runner.invoke(app, command)
        assert result.exit_code == 1, (command, result.output)
        line = error_line(result.stderr)
        assert "needs the onnxruntime package" in line and "--extra export" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images", "m.onnx"]


def test_install_hints_never_name_the_package_index_project():
    for extra in EXTRAS:
        assert "pip install torchkit" not in install_hint(extra)
        assert "pip install 'torchkit[" not in install_hint(extra)
    sources = [*REPO.joinpath("torchkit").rglob("*.py"), REPO / "README.md"]
    sources += REPO.joinpath("docs").rglob("*.md")
    for path in sources:
        text = path.read_text()
        assert "pip install 'torchkit[" not in text, path
        assert not re.search(r"pip install torchkit\b(?![-\w])", text), path


def test_no_private_typer_or_click_module_is_imported():
    """typer vendors click privately (typer._click since 0.26): importing it breaks on other
    typer versions; torchkit uses typer's public names only."""
    for path in REPO.joinpath("torchkit").rglob("*.py"):
        text = path.read_text()
        assert "typer._click" not in text, path
        assert not re.search(r"^\s*(from|import) click\b", text, re.M), path


def test_the_wheel_ships_the_shell_completions():
    wheel = PYPROJECT["tool"]["hatch"]["build"]["targets"]["wheel"]
    shipped = wheel.get("force-include", {})
    assert shipped.get("completions") == "torchkit/completions"
    assert sorted(p.name for p in (REPO / "completions").iterdir()) == [
        "torchkit.bash",
        "torchkit.fish",
        "torchkit.zsh",
    ]


def test_missing_extra_errors_are_torchkit_errors():
    assert issubclass(MissingExtraError, TorchkitError)
    assert MissingExtraError.exit_code == 1


def test_every_runtime_dependency_floor_is_tested_by_the_ci_script():
    script = (REPO / ".ci" / "other-environments").read_text()
    assert "--resolution lowest-direct" in script and "-r pyproject.toml" in script
    assert "find_python 3.10" in script and "find_python 3.13" in script
    assert "bash .ci/other-environments" in (REPO / ".ci" / "run").read_text()


def test_readme_installs_from_source_and_shows_the_cpu_build():
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Install") : readme.index("## Commands")]
    assert (
        "uv tool install --compile-bytecode ./torchkit" in section
        and "pipx install ./torchkit" in section
    )
    assert "--torch-backend cpu" in section
    assert "--index-url https://download.pytorch.org/whl/cpu" in section
