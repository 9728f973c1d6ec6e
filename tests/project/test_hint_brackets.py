"""An error line reads `Error: <what> (<hint>)`: a hint with brackets of its own would nest them,
`(pick another layer (--list-layers))`. The hints of the packages below (their error calls'
second argument, a `hint=` keyword, a value assigned to a name with `hint` in it, `HINT`
alike, and what a function with `hint` in its name returns) hold no bracket, except in a quoted
regular expression (`'^(patient\\d+)_'`) or in code between backticks (`` `.to_dense()` ``).
A grep-level check of the source, nothing is run."""

from __future__ import annotations

import ast
import re

import pytest
from suite_paths import REPO

# Folders of torchkit/ whose hints are checked.
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
    "cli",
)
# Quoted regular expressions and code keep their brackets.
QUOTED = re.compile(r"'\^[^']*'|`[^`]*`")


def _hint_literals(tree: ast.AST) -> list[tuple[int, str]]:
    hints: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if name.endswith("Error") and len(node.args) >= 2:
                hints.append(node.args[1])
            hints += [keyword.value for keyword in node.keywords if keyword.arg == "hint"]
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
    return [
        (part.lineno, part.value)
        for hint in hints
        for part in ast.walk(hint)
        if isinstance(part, ast.Constant) and isinstance(part.value, str)
    ]


@pytest.mark.parametrize("package", PACKAGES)
def test_hints_hold_no_brackets(package):
    found = []
    for path in sorted((REPO / "torchkit" / package).rglob("*.py")):
        for line, text in _hint_literals(ast.parse(path.read_text(encoding="utf-8"))):
            bare = QUOTED.sub("", text)
            if "(" in bare or ")" in bare:
                found.append(f"{path.relative_to(REPO)}:{line}: {text!r}")
    assert not found, "\n".join(found)


def test_the_check_finds_a_bracketed_hint():
    tree = ast.parse(
        'raise UsageError("what (a shape)", "pick another (--list-layers)")\n'
        'hint = "check (this)"\n'
        'raise InputError("what", hint=f"use {x} (a note)")\n'
        'SHARED_HINT = "see (this)"\n'
        'def _size_hint():\n    return "give (a size)"\n'
    )
    texts = [text for _, text in _hint_literals(tree)]
    assert sorted(text for text in texts if "(" in text) == [
        " (a note)",
        "check (this)",
        "give (a size)",
        "pick another (--list-layers)",
        "see (this)",
    ]


def test_quoted_regular_expressions_and_code_keep_their_brackets():
    assert QUOTED.sub("", "group by '^(patient\\d+)_'") == "group by "
    assert QUOTED.sub("", "save `tensor.to_dense()` instead") == "save  instead"
    assert "(" in QUOTED.sub("", "save tensor.to_dense() instead")
