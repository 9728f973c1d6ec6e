"""An error line reads `Error: <what> (<hint>)`: a hint with brackets of its own would nest them,
`(pick another layer (--list-layers))`. The hints of extract-features, predict, eval and split
(their error calls' second argument, a `hint=` keyword and a value assigned to a name with `hint`
in it) hold no bracket, except in a quoted regular expression (`'^(patient\\d+)_'`). A grep-level
check of the source, nothing is run."""

from __future__ import annotations

import ast
import re

import pytest
from suite_paths import REPO

PACKAGES = ("features", "predict", "evaluate", "split")
QUOTED_REGEX = re.compile(r"'\^[^']*'")


def _hint_literals(tree: ast.AST) -> list[tuple[int, str]]:
    hints: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if name.endswith("Error") and len(node.args) >= 2:
                hints.append(node.args[1])
            hints += [keyword.value for keyword in node.keywords if keyword.arg == "hint"]
        elif isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and "hint" in t.id for t in targets):
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
    for path in sorted((REPO / "torchkit" / "core" / package).rglob("*.py")):
        for line, text in _hint_literals(ast.parse(path.read_text(encoding="utf-8"))):
            bare = QUOTED_REGEX.sub("", text)
            if "(" in bare or ")" in bare:
                found.append(f"{path.relative_to(REPO)}:{line}: {text!r}")
    assert not found, "\n".join(found)


def test_the_check_finds_a_bracketed_hint():
    tree = ast.parse(
        'raise UsageError("what (a shape)", "pick another (--list-layers)")\n'
        'hint = "check (this)"\n'
        'raise InputError("what", hint=f"use {x} (a note)")\n'
    )
    texts = [text for _, text in _hint_literals(tree)]
    assert sorted(text for text in texts if "(" in text) == [
        " (a note)",
        "check (this)",
        "pick another (--list-layers)",
    ]
