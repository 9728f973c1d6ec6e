"""An error line reads `Error: <what> (<hint>)`: a hint with brackets of its own would nest them,
`(pick another layer (--list-layers))`. The hints of the packages below (their error calls'
second argument, a `hint=` keyword, what a torchkit function's parameter named for a hint is
given, a value assigned to a name with `hint` in it, `HINT` alike, what a function with
`hint` in its name returns, and what the module assigns to a name these use or returns from a
function they call) hold no bracket, except in a quoted regular expression
(`'^(patient\\d+)_'`) or in code between backticks (`` `.to_dense()` ``).
A warning's hint, in brackets at the end of its text, nests none either. A grep-level check of
the source, nothing is run.

Covered, as far as the source shows it: an f-string hint's static text, read whole with `{}`
for each field (code between backticks stays code around a field); a `+`, a `%` and a
`sep.join([...])` of texts; what is appended (`parts.append`, `parts.extend`) or added (`+=`)
to a name a hint uses, as `"; ".join(parts)` joins it at run time; a name or function a hint
imports from another module of torchkit (its value or returns there). A warning's text is read
with the arguments logging puts in its `%s`, each branch of an `x if c else y`, and what its
function assigns a name the text is or holds. Not covered: a value known at run time alone (a
user's file name, an exception's text, a library's message), which may bring brackets of its
own, as may an attribute or a dictionary entry; names are followed one step (what a hint's name
is given, not what that value's names are given in turn), and a hint passed through a
parameter is checked where the call gives it (`refuse(..., hint)`), not in the callee."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

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
    tree: ast.AST,
    parameters: dict[str, tuple[int, str]] | None = None,
    path: Path | None = None,
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
    hints += _given_to(tree, hints, path)
    return [text for hint in hints for text in _static_texts(hint)]


def _static_texts(node: ast.AST) -> list[tuple[int, str]]:
    """The texts an expression holds as written: each string literal, an f-string's whole
    static text (`{}` for each field, so that code between backticks stays one piece around
    one), and the literals in its fields and elsewhere in the expression."""
    texts = []
    inner: set[int] = set()
    for part in ast.walk(node):
        if isinstance(part, ast.JoinedStr) and id(part) not in inner:
            inner.update(id(value) for value in part.values if isinstance(value, ast.Constant))
            texts.append((part.lineno, _text(part)))
        elif isinstance(part, ast.FormattedValue) and part.format_spec is not None:
            inner.add(id(part.format_spec))  # `{x:.2f}`: a format, no text
        elif (
            isinstance(part, ast.Constant) and isinstance(part.value, str) and id(part) not in inner
        ):
            texts.append((part.lineno, part.value))
    return texts


@functools.cache
def _module(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _imported(tree: ast.AST, path: Path | None) -> dict[str, tuple[Path, str]]:
    """The names a module imports from torchkit's modules: name -> (that module's file, the
    name there)."""
    found = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            if path is None:
                continue
            package = path.parent
            for _ in range(node.level - 1):
                package = package.parent
            base = package.joinpath(*(node.module or "").split(".")) if node.module else package
        elif (node.module or "").split(".")[0] == "torchkit":
            base = REPO.joinpath(*node.module.split("."))
        else:
            continue
        for alias in node.names:
            for source in (base.with_suffix(".py"), base / "__init__.py"):
                if source.is_file():
                    found[alias.asname or alias.name] = (source, alias.name)
                    break
    return found


def _given_to(tree: ast.AST, hints: list[ast.AST], path: Path | None = None) -> list[ast.AST]:
    """What a hint's names are given, as far as it is statically visible (one step, not from
    name to name): what the module assigns to a name a hint uses (`f"...: {remedy}"`), adds
    to it (`remedy += "..."`) or appends to it (`parts.append("...")`, then
    `"; ".join(parts)`), what its functions a hint calls return (`suggest(name)`), and the
    same for a name it imports from another module of torchkit (its assignment there, or its
    function's returns)."""
    names = {part.id for hint in hints for part in ast.walk(hint) if isinstance(part, ast.Name)}
    found = _given_in(tree, names)
    imported = _imported(tree, path)
    for name in sorted(names & imported.keys()):
        source, original = imported[name]
        found += _given_in(_module(source), {original}, top_level=True)
    return found


def _given_in(tree: ast.AST, names: set[str], *, top_level: bool = False) -> list[ast.AST]:
    """The values a module gives `names`: assigned, added (`+=`), appended or extended
    (`parts.append(x)`), or returned by a function of that name (at its top level alone
    where `top_level`)."""
    found: list[ast.AST] = []
    nodes = tree.body if top_level else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign) and node.value:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id in names for t in targets):
                found.append(node.value)
        elif isinstance(node, ast.FunctionDef) and node.name in names:
            found += [
                part.value
                for part in ast.walk(node)
                if isinstance(part, ast.Return) and part.value is not None
            ]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("append", "extend", "insert")
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in names
        ):
            found += node.args[-1:]
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
        for line, text in _hint_literals(tree, parameters, path):
            bare = QUOTED.sub("", text)
            if "(" in bare or ")" in bare:
                found.append(f"{path.relative_to(REPO)}:{line}: {text!r}")
    assert not found, "\n".join(found)


def _text(node: ast.AST) -> str | None:
    """A string's text, an f-string's with `{}` for each value, a `+` of them joined."""
    texts = _texts(node, {})
    return texts[0] if texts and texts[0] != "{}" else None


# The most texts one expression is read as (each choice of an `x if c else y` one more).
MOST_TEXTS = 16


def _texts(node: ast.AST | None, given: dict[str, list[ast.AST]], depth: int = 0) -> list[str]:
    """The texts an expression may have, as far as it is statically visible: a string's, an
    f-string's (a field `{}`, or the texts of what the function assigns the name in it), a `+`
    or `%` of them, `sep.join([...])` of listed ones, each branch of `x if c else y`, and for a
    name what the function assigns it. `{}` where nothing is known."""
    if node is None or depth > 3:
        return ["{}"]
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Name) and node.id in given:
        return [t for value in given[node.id] for t in _texts(value, {}, depth + 1)][:MOST_TEXTS]
    if isinstance(node, ast.IfExp):
        return (_texts(node.body, given, depth + 1) + _texts(node.orelse, given, depth + 1))[
            :MOST_TEXTS
        ]
    if isinstance(node, ast.JoinedStr):
        pieces = [
            [value.value]
            if isinstance(value, ast.Constant)
            else _texts(value.value, given, depth + 1)
            for value in node.values
        ]
        return _joined(pieces, "")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _joined([_texts(side, given, depth + 1) for side in (node.left, node.right)], "")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        values = node.right.elts if isinstance(node.right, ast.Tuple) else [node.right]
        return _formatted(_texts(node.left, given, depth + 1), values, given, depth)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "join"
        and isinstance(node.func.value, ast.Constant)
        and isinstance(node.func.value.value, str)
        and len(node.args) == 1
        and isinstance(node.args[0], ast.List | ast.Tuple)
    ):
        items = [_texts(item, given, depth + 1) for item in node.args[0].elts]
        return _joined(items, node.func.value.value)
    return ["{}"]


def _joined(pieces: list[list[str]], separator: str) -> list[str]:
    texts = [""]
    for index, choices in enumerate(pieces):
        glue = separator if index else ""
        texts = [text + glue + choice for text in texts for choice in choices][:MOST_TEXTS]
    return texts


def _formatted(
    templates: list[str], values: list[ast.AST], given: dict[str, list[ast.AST]], depth: int
) -> list[str]:
    """`template % values`, as logging formats a warning's arguments: each `%s` (`%d`, `%r`,
    `%.2f`) in turn given the texts of its value."""
    texts = []
    for template in templates:
        parts = re.split(r"%[-+ #0]*\d*(?:\.\d+)?[sdrfgx]", template)
        fields = [_texts(value, given, depth + 1) for value in values]
        fields = (fields + [["{}"]] * len(parts))[: len(parts) - 1]
        pieces = [[parts[0]]]
        for field, part in zip(fields, parts[1:], strict=True):
            pieces += [field, [part]]
        texts += _joined(pieces, "")
    return texts[:MOST_TEXTS]


def _assigned(function: ast.AST) -> dict[str, list[ast.AST]]:
    """What a function (or a module's top level) assigns each name, `+=` as a `+`."""
    given: dict[str, list[ast.AST]] = {}
    body = ast.walk(function) if not isinstance(function, ast.Module) else function.body
    for node in body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    given.setdefault(target.id, []).append(node.value)
    for node in body:
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            for value in given.get(node.target.id, [])[:]:
                given[node.target.id].append(ast.BinOp(value, ast.Add(), node.value))
    return given


def _nested_warnings(tree: ast.AST) -> list[tuple[int, str]]:
    """The warnings (`log.warning(...)`, `warn(...)`) whose text holds brackets in brackets,
    quoted code and regular expressions aside: their text as written, with the arguments
    logging puts in (`log.warning("%s is slow (%s)", path, why)`) and what the function
    assigns a name the text is or holds (`{reason}`) where those are string expressions of
    the function; a value known at run time alone (a path, an error's text) is `{}`."""
    found = []
    scopes = [tree] + [
        node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    module_given = _assigned(tree)
    seen: set[int] = set()
    for scope in reversed(scopes):  # the innermost function first
        given = {**module_given, **_assigned(scope)} if scope is not tree else module_given
        for node in ast.walk(scope):
            if not isinstance(node, ast.Call) or not node.args or id(node) in seen:
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if name not in ("warning", "warn"):
                continue
            seen.add(id(node))
            texts = _texts(node.args[0], given)
            if len(node.args) > 1:
                texts = _formatted(texts, node.args[1:], given, 0)
            for text in texts:
                depth = deepest = 0
                for char in QUOTED.sub("", text):
                    depth += {"(": 1, ")": -1}.get(char, 0)
                    deepest = max(deepest, depth)
                if deepest > 1:
                    found.append((node.lineno, text))
                    break
    return sorted(found)


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
    assert _nested_warnings(tree) == [(1, "{} is slow (reads it (twice))")]


def test_the_check_finds_brackets_a_warning_is_given_at_run_time():
    # logging's arguments, a name the function assigns, a join of listed texts, each branch
    tree = ast.parse(
        "def f(path, fate):\n"
        '    log.warning("%s is slow (%s)", path, "reads it (twice)")\n'
        '    why = "a link (to a folder)"\n'
        '    log.warning(f"{path} is not read ({why})")\n'
        '    log.warning("rows left out (" + "; ".join(["a", "b (c)"]) + ")")\n'
        '    more = " (and more)" if fate else ""\n'
        '    log.warning(f"{path} is not read (as {fate}{more})")\n'
        '    log.warning("%s is slow (%s)", path, fate)\n'
    )
    assert _nested_warnings(tree) == [
        (2, "{} is slow (reads it (twice))"),
        (4, "{} is not read (a link (to a folder))"),
        (5, "rows left out (a; b (c))"),
        (7, "{} is not read (as {} (and more))"),
    ]


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
        "check (this)",
        "drop (it)",
        "give (a size)",
        "list_models (its names)",
        "pick another (--list-layers)",
        "rename (it)",
        "see (this)",
        "unlink (a hard link)",
        "use {} (a note)",
    ]


def test_the_check_follows_hints_built_at_run_time():
    # appended, added to, joined, imported from another module of torchkit
    tree = ast.parse(
        "from torchkit.core.io.errors import FS_ENCODING_HINT\n"
        "def f(x):\n"
        "    parts = []\n"
        '    parts.append("fix it (or not)")\n'
        '    parts.extend(["drop it (later)"])\n'
        '    advice = "move it"\n'
        '    advice += " (first)"\n'
        '    raise InputError("what", "; ".join(parts) + advice)\n'
        'raise InputError("what", FS_ENCODING_HINT)\n'
    )
    texts = [text for _, text in _hint_literals(tree, {})]
    assert {"fix it (or not)", "drop it (later)", " (first)"} <= set(texts)
    errors = REPO / "torchkit" / "core" / "io" / "errors.py"
    assert _given_in(_module(errors), {"FS_ENCODING_HINT"}, top_level=True)[0] in [
        hint for hint in _given_to(tree, [ast.parse("FS_ENCODING_HINT", mode="eval").body])
    ]


def test_an_f_strings_code_between_backticks_is_one_piece_around_a_field():
    tree = ast.parse('raise UsageError("what", f"run `torchkit {command} --list (all)`")\n')
    assert [text for _, text in _hint_literals(tree, {})] == ["run `torchkit {} --list (all)`"]
    assert QUOTED.sub("", "run `torchkit {} --list (all)`") == "run "


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
