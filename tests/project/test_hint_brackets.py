"""An error line reads `Error: <what> (<hint>)`: a hint with brackets of its own would nest them,
`(pick another layer (--list-layers))`. The hints of the packages below (their error calls'
second argument, a `hint=` keyword, what a torchkit function's parameter named for a hint is
given, a value assigned to a name with `hint` in it, `HINT` alike, what a function with
`hint` in its name returns, and what the module assigns to a name these use or returns from a
function they call) hold no bracket, except in a quoted regular expression
(`'^(patient\\d+)_'`) or in code between backticks (`` `.to_dense()` ``).
A warning's hint, in brackets at the end of its text, nests none either. A grep-level check of
the source, nothing is run."""

from __future__ import annotations

import ast
import functools
import re

import pytest
from suite_paths import REPO

# Folders of torchkit/ whose hints are checked, and `*.py` patterns for the modules beside them.
PACKAGES = (
    "core/features",
    "core/predict",
    "core/evaluate",
    "core/split",
    "core/data",
    "core/convert",
    "core/models",
    "core/stats",
    "core/runtime",
    "core/benchmark",
    "core/summary",
    "core/export",
    "core/train",
    "core/io",
    "core/video",
    "core/inference",
    "core/*.py",
    "cli",
    "*.py",
)
# Quoted regular expressions and code keep their brackets.
QUOTED = re.compile(r"'\^[^']*'|`[^`]*`")


def _hint_parameter(function: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[int, str] | None:
    params = [arg.arg for arg in function.args.posonlyargs + function.args.args]
    bound = 1 if params[:1] in (["self"], ["cls"]) else 0
    found = None
    for position, param in enumerate(params[bound:]):
        if "hint" in param.lower():
            found = (position, param)
    return found


@functools.cache
def _hint_parameters() -> dict[str, tuple[int, str]]:
    """The functions of torchkit with a parameter named for a hint (`refuse(name, ..., hint)`),
    and its exceptions, whatever their names (`DamagedTar(what, hint)`, a constructor of its
    own alike): function or class name -> the parameter's position in a call and its name."""
    found = {}
    classes: dict[str, tuple[list[str], tuple[int, str] | None, bool]] = {}
    for path in sorted((REPO / "torchkit").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if (parameter := _hint_parameter(node)) is not None:
                    found[node.name] = parameter
            elif isinstance(node, ast.ClassDef):
                init = next(
                    (part for part in node.body if getattr(part, "name", None) == "__init__"),
                    None,
                )
                bases = [base.id if isinstance(base, ast.Name) else "" for base in node.bases]
                classes[node.name] = (bases, init and _hint_parameter(init), init is not None)

    def parameter(name: str, seen: frozenset = frozenset()) -> tuple[int, str] | None:
        if name == "TorchkitError":
            return (1, "hint")
        if name not in classes or name in seen:
            return None
        bases, own, has_init = classes[name]
        if has_init:
            return own if any(parameter(b, seen | {name}) for b in bases) else None
        return next((p for b in bases if (p := parameter(b, seen | {name}))), None)

    for name in classes:
        if (given := parameter(name)) is not None:
            found[name] = given
    return found


def _hint_literals(
    tree: ast.AST, parameters: dict[str, tuple[int, str]] | None = None
) -> list[tuple[int, str]]:
    hints: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if name.endswith("Error") and len(node.args) >= 2:
                hints.append(node.args[1])
            hints += [keyword.value for keyword in node.keywords if keyword.arg == "hint"]
            if not name.endswith("Error") and name in (parameters or {}):
                position, param = parameters[name]
                if len(node.args) > position:
                    hints.append(node.args[position])
                hints += [keyword.value for keyword in node.keywords if keyword.arg == param]
        elif isinstance(node, ast.FunctionDef) and "hint" in node.name.lower():
            hints += [
                part.value
                for part in ast.walk(node)
                if isinstance(part, ast.Return) and part.value is not None
            ]
        elif isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and "hint" in t.id.lower() for t in targets):
                hints.append(node.value)
    hints += _given_to(tree, hints)
    return [
        (part.lineno, part.value)
        for hint in hints
        for part in ast.walk(hint)
        if isinstance(part, ast.Constant) and isinstance(part.value, str)
    ]


def _given_to(tree: ast.AST, hints: list[ast.AST]) -> list[ast.AST]:
    """What the module assigns to a name a hint uses (`f"...: {remedy}"`) and what its
    functions a hint calls return (`suggest(name)`)."""
    names = {part.id for hint in hints for part in ast.walk(hint) if isinstance(part, ast.Name)}
    found: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id in names for t in targets):
                found.append(node.value)
        elif isinstance(node, ast.FunctionDef) and node.name in names:
            found += [
                part.value
                for part in ast.walk(node)
                if isinstance(part, ast.Return) and part.value is not None
            ]
    return found


def _sources(package: str) -> list:
    """The Python files of a folder of torchkit/, or those a `*.py` pattern names."""
    root = REPO / "torchkit"
    return sorted(root.glob(package) if package.endswith(".py") else (root / package).rglob("*.py"))


def test_every_module_of_torchkit_is_checked():
    checked = {path for package in PACKAGES for path in _sources(package)}
    missed = [
        str(p.relative_to(REPO)) for p in (REPO / "torchkit").rglob("*.py") if p not in checked
    ]
    assert not missed, missed


@pytest.mark.parametrize("package", PACKAGES)
def test_hints_hold_no_brackets(package):
    found = []
    parameters = _hint_parameters()
    for path in _sources(package):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for line, text in _hint_literals(tree, parameters):
            bare = QUOTED.sub("", text)
            if "(" in bare or ")" in bare:
                found.append(f"{path.relative_to(REPO)}:{line}: {text!r}")
    assert not found, "\n".join(found)


def _text(node: ast.AST) -> str | None:
    """A string's text, an f-string's with `{}` for each value, a `+` of them joined."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return (_text(node.left) or "{}") + (_text(node.right) or "{}")
    return None


def _nested_warnings(tree: ast.AST) -> list[tuple[int, str]]:
    """The warnings (`log.warning(...)`, `warn(...)`) whose text holds brackets in brackets,
    quoted code and regular expressions aside."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        text = _text(node.args[0]) if name in ("warning", "warn") else None
        depth = deepest = 0
        for char in QUOTED.sub("", text or ""):
            depth += {"(": 1, ")": -1}.get(char, 0)
            deepest = max(deepest, depth)
        if deepest > 1:
            found.append((node.lineno, text))
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_warnings_nest_no_brackets(package):
    found = [
        f"{path.relative_to(REPO)}:{line}: {text!r}"
        for path in _sources(package)
        for line, text in _nested_warnings(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert not found, "\n".join(found)


def test_the_check_finds_a_warning_with_nested_brackets():
    tree = ast.parse(
        'log.warning("%s is slow (reads it (twice))", path)\n'
        'log.warning(f"{path} is slow (see {x})")\n'
        'warn("rows (" + shown + ") left out (drop them)")\n'
        'log.warning("rewrite it (`write_table(..., row_group_size=1000)`)")\n'
    )
    assert _nested_warnings(tree) == [(1, "%s is slow (reads it (twice))")]


def test_the_check_finds_a_bracketed_hint():
    tree = ast.parse(
        'raise UsageError("what (a shape)", "pick another (--list-layers)")\n'
        'hint = "check (this)"\n'
        'raise InputError("what", hint=f"use {x} (a note)")\n'
        'SHARED_HINT = "see (this)"\n'
        'def _size_hint():\n    return "give (a size)"\n'
        'refuse(name, "whose (classes)", "rename (it)")\n'
        'refuse(name, "whose (classes)", advice="drop (it)")\n'
        'remedy = "unlink (a hard link)"\n'
        'raise InputError("what", f"one label: {remedy}")\n'
        'def suggest(name):\n    return "list_models (its names)"\n'
        'raise UsageError("unknown", suggest(name))\n'
    )
    texts = [text for _, text in _hint_literals(tree, {"refuse": (2, "advice")})]
    assert sorted(text for text in texts if "(" in text) == [
        " (a note)",
        "check (this)",
        "drop (it)",
        "give (a size)",
        "list_models (its names)",
        "pick another (--list-layers)",
        "rename (it)",
        "see (this)",
        "unlink (a hard link)",
    ]


def test_quoted_regular_expressions_and_code_keep_their_brackets():
    assert QUOTED.sub("", "group by '^(patient\\d+)_'") == "group by "
    assert QUOTED.sub("", "save `tensor.to_dense()` instead") == "save  instead"
    assert "(" in QUOTED.sub("", "save tensor.to_dense() instead")


def test_the_check_follows_exceptions_whatever_their_names():
    # TorchkitError's own (message, hint), or a constructor of the exception's own
    parameters = _hint_parameters()
    assert parameters["DamagedTar"] == parameters["RuntimeFailure"] == (1, "hint")
    assert parameters["_Unreachable"] == (2, "hint")  # (shown, why, hint, status)
    assert "_HttpStatus" not in parameters  # (url, code, reason, proxy): it words its own hint
    tree = ast.parse('raise DamagedTar("what", "write it (again)")\n')
    assert [text for _, text in _hint_literals(tree, parameters)] == ["write it (again)"]
