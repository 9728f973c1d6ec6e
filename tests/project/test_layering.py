"""The layering of torchkit, read from the source with `ast` (nothing is imported):

(a) no import cycles among `torchkit.core` modules, and none among its packages (`core.models`,
    `core.export`, `core.datasource`...) save the known ones listed below;
(b) `torchkit.core` never imports `torchkit.cli`, typer, click or rich.

Every import counts, at any level: one inside a function is as much an arrow as one at the top
(a function-local import that dodges a cycle is still a cycle).

Package `__init__` modules: a package's top-level imports of its own submodules are re-exports,
not arrows (they would put every package that a submodule imports from in a trivial cycle), so
they are left out, and `from pkg import name` counts as an import of the submodule `pkg/__init__`
re-exports `name` from (or of `pkg.name` when that is a submodule; of `pkg` itself otherwise).
Imports inside an `__init__`'s functions (lazy re-exports, as `core.train`'s `__getattr__`) are
kept. Dynamic imports (`importlib.import_module("...")`) are not seen.
"""

from __future__ import annotations

import ast
import contextlib
import gc
from collections import deque
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from suite_paths import REPO

PACKAGE = REPO / "torchkit"
CORE = "torchkit.core"
CLI_MODULES = ("torchkit.cli", "typer", "click", "rich")

# Package-level cycles known and allowed for now, each with the arrow that makes it.
KNOWN_PACKAGE_CYCLES: set[frozenset[str]] = set()
# Arrows that run back up a layer: (importer, imported) -> why the importer stays below.
FORBIDDEN_PACKAGE_ARROWS = {
    # benchmark uses summary's counter for FLOPs; what both need (the free memory) lives in
    # the floor module core.memory.
    ("torchkit.core.summary", "torchkit.core.benchmark"): "summary counts, benchmark times",
}
# The floors of core, lowest first (files and outputs; devices, processes and extras; the data
# path): each imports only itself and the floors below it, never a model, a command or train.
FLOORS = ("torchkit.core.io", "torchkit.core.runtime", "torchkit.core.data")


@contextlib.contextmanager
def garbage_collection_paused() -> Iterator[None]:
    """The cyclic garbage collector off while the block runs: a syntax tree has no cycles to
    collect, and each collection during a parse walks the tree built so far (and a test
    worker's whole young heap): 0.7 s of torchkit's 1.8 s parse."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class Module:
    """A module's name, file and import statements: its syntax tree is parsed, searched and let
    go (kept, the 240 trees of torchkit made each later garbage collection walk every node
    parsed so far: 1.6 s of a 2.7 s parse)."""

    def __init__(self, name: str, path: Path, is_package: bool) -> None:
        self.name = name
        self.path = path
        self.is_package = is_package
        source = path.read_text(encoding="utf-8")
        with garbage_collection_paused():
            tree = ast.parse(source, filename=str(path))
        top_level = {id(statement) for statement in tree.body}
        # Every import statement in `import_statements`' order, and whether it is top-level.
        self.imports = [(node, id(node) in top_level) for node in import_statements(tree)]


@cache
def modules() -> dict[str, Module]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        found[".".join(parts)] = Module(".".join(parts), path, is_package)
    return found


def _absolute(module: Module, node: ast.ImportFrom) -> str:
    """The module `from X import ...` names, relative imports made absolute."""
    if not node.level:
        return node.module or ""
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    parts = package.split(".")
    base = ".".join(parts[: len(parts) - (node.level - 1)])
    return f"{base}.{node.module}" if node.module else base


def _owner(name: str) -> str | None:
    """The torchkit module `name` is or lies in (`a.b.c` -> `a.b` when `a.b.c` is not a module)."""
    known = modules()
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _is_own_submodule(package: str, name: str) -> bool:
    return name.startswith(package + ".")


@cache
def _reexports(package: str) -> dict[str, str]:
    """Names a package `__init__` imports at top level from its own submodules -> that module."""
    module = modules()[package]
    found = {}
    for node, top_level in module.imports:
        if top_level and isinstance(node, ast.ImportFrom):
            source = _owner(_absolute(module, node))
            if source and _is_own_submodule(package, source):
                for alias in node.names:
                    found[alias.asname or alias.name] = source
    return found


def _defining_module(package: str, name: str) -> str:
    """The module `from package import name` reads `name` from."""
    known = modules()
    if f"{package}.{name}" in known:
        return f"{package}.{name}"
    if known[package].is_package and name in _reexports(package):
        source = _reexports(package)[name]
        return _defining_module(source, name) if known[source].is_package else source
    return package


# The nodes a statement can lie in: statements, `except` clauses and `case` blocks.
HOLDS_STATEMENTS = (ast.stmt, ast.excepthandler, ast.match_case)


def import_statements(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of `tree`, in `ast.walk`'s order (the top-level ones first, in
    order), found without visiting an expression (most of a tree's nodes; a statement never
    lies inside one): 0.08 s over torchkit's sources where `ast.walk` took 0.7."""
    todo: deque[ast.AST] = deque([tree])
    while todo:
        node = todo.popleft()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
            continue
        for field in node._fields:
            children = getattr(node, field, None)
            if isinstance(children, list):
                todo.extend(child for child in children if isinstance(child, HOLDS_STATEMENTS))


def imported_names(module: Module) -> Iterator[tuple[str, int, ast.AST]]:
    """(the full name imported, its line, the statement) for every import in `module`."""
    for node, _ in module.imports:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno, node
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, node)
            for alias in node.names:
                yield f"{base}.{alias.name}", node.lineno, node


@cache
def graph() -> dict[str, dict[str, int]]:
    """module -> {torchkit module it imports: the first line that does}."""
    known = modules()
    edges: dict[str, dict[str, int]] = {}
    for name, module in known.items():
        out: dict[str, int] = {}
        for node, top_level in module.imports:
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                targets = [_owner(alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(module, node)
                owner = _owner(base)
                if owner == base:
                    targets = [_defining_module(base, alias.name) for alias in node.names]
                else:
                    targets = [owner]
            for target in targets:
                if target is None or target == name:
                    continue
                if module.is_package and _is_own_submodule(name, target) and top_level:
                    continue  # a re-export
                out.setdefault(target, node.lineno)
        edges[name] = out
    return edges


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in edges:
                    continue
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(edges[successor])))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _core_graph() -> dict[str, dict[str, int]]:
    return {
        name: {target: line for target, line in out.items() if target.startswith(CORE)}
        for name, out in graph().items()
        if name.startswith(CORE + ".")
    }


def _unit(name: str) -> str:
    """`torchkit.core.X` for any module in or under it."""
    return ".".join(name.split(".")[:3])


def _package_graph() -> tuple[dict[str, dict[str, int]], dict[tuple[str, str], list[str]]]:
    edges: dict[str, dict[str, int]] = {}
    why: dict[tuple[str, str], list[str]] = {}
    for name, out in _core_graph().items():
        edges.setdefault(_unit(name), {})
        for target, line in out.items():
            if _unit(target) != _unit(name):
                edges[_unit(name)][_unit(target)] = line
                why.setdefault((_unit(name), _unit(target)), []).append(
                    f"{name}:{line} -> {target}"
                )
    return edges, why


def _describe(component: list[str], edges, why=None) -> str:
    lines = [" <-> ".join(component)]
    for source in component:
        for target, line in edges[source].items():
            if target in component:
                detail = why[(source, target)] if why else [f"{source}:{line} -> {target}"]
                lines.extend(f"    {d}" for d in detail)
    return "\n".join(lines)


def test_the_graph_sees_every_kind_of_import():
    edges = graph()
    assert len(modules()) > 50
    # a function-local import
    assert "torchkit.core.models.checkpoint" in edges["torchkit.core.models.resolver"]
    # `from torchkit.core.models import resolve_spec`: the submodule that defines it
    assert "torchkit.core.models.spec" in edges["torchkit.core.summary.run"]
    assert "torchkit.core.models" not in edges["torchkit.core.summary.run"]
    # a package's lazy re-export (inside `__getattr__`) is kept, its eager ones are not
    assert "torchkit.core.train.runner" in edges["torchkit.core.train"]
    assert "torchkit.core.models.resolver" not in edges["torchkit.core.models"]


def test_core_modules_import_each_other_without_cycles():
    edges = _core_graph()
    found = cycles(edges)
    assert not found, "import cycles among torchkit.core modules:\n" + "\n".join(
        _describe(component, edges) for component in found
    )


def test_core_packages_import_each_other_without_new_cycles():
    edges, why = _package_graph()
    found = [c for c in cycles(edges) if frozenset(c) not in KNOWN_PACKAGE_CYCLES]
    assert not found, "import cycles among torchkit.core packages:\n" + "\n".join(
        _describe(component, edges, why) for component in found
    )
    still = {frozenset(c) for c in cycles(edges)}
    stale = [sorted(known) for known in KNOWN_PACKAGE_CYCLES if known not in still]
    assert not stale, f"cut, so remove from KNOWN_PACKAGE_CYCLES: {stale}"


def test_no_core_package_imports_one_above_it():
    edges, why = _package_graph()
    offending = [
        f"{source} imports {target} ({reason}):\n    " + "\n    ".join(why[(source, target)])
        for (source, target), reason in FORBIDDEN_PACKAGE_ARROWS.items()
        if target in edges.get(source, {})
    ]
    assert not offending, "\n".join(offending)


def test_the_floors_import_only_the_floors_below():
    edges, why = _package_graph()
    offending = [
        f"{floor} imports {target}:\n    " + "\n    ".join(why[(floor, target)])
        for level, floor in enumerate(FLOORS)
        for target in edges.get(floor, {})
        if target not in FLOORS[: level + 1]
    ]
    assert not offending, "\n".join(offending)


def test_core_never_imports_the_cli_typer_click_or_rich():
    offending = [
        f"{module.path.relative_to(REPO)}:{line} imports {name}"
        for module in modules().values()
        if module.name == CORE or module.name.startswith(CORE + ".")
        for name, line, _ in imported_names(module)
        if any(name == top or name.startswith(top + ".") for top in CLI_MODULES)
    ]
    assert not offending, "\n".join(offending)
