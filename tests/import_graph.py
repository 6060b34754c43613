"""The import graph of ``src/haltwire``, read from the source (nothing is imported).

Every ``import`` and ``from ... import`` counts, inside functions and ``TYPE_CHECKING`` blocks
too: an import that only runs late is still a dependency. ``from haltwire.control import stops``
is an edge to the module ``haltwire.control.stops``; ``from haltwire.control import create_app``
is an edge to the package ``haltwire.control``.

``imports_of_test_files`` reads ``tests/`` the same way, for the rule that no module there
imports a test file.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"


def modules(root: Path = SRC) -> dict[str, Path]:
    """Module name to file, for every module under ``root/haltwire``."""
    out = {}
    for path in (root / "haltwire").rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _owner(name: str, known: dict[str, Path]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """(imported module, line) for each haltwire module ``name`` imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if (target := _owner(alias.name, known)) is not None:
                    yield target, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            for alias in node.names:
                # A submodule by name is an edge to it; any other name, to the module it is in.
                full = f"{base}.{alias.name}"
                target = full if full in known else _owner(base, known)
                if target is not None:
                    yield target, node.lineno


def graph(root: Path = SRC) -> dict[str, set[str]]:
    known = modules(root)
    return {
        name: {t for t, _ in imports(name, path, known) if t != name} for name, path in known.items()
    }


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


TESTS = Path(__file__).resolve().parent


def imports_of_test_files(tests: Path = TESTS) -> list[tuple[str, int, str]]:
    """(file, line, imported test module) for each module in ``tests`` that imports a ``test_*``
    module: shared helpers belong in helper modules, not in test files."""
    found = []
    for path in sorted(tests.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            found += [(path.name, node.lineno, n) for n in names if n.split(".")[0].startswith("test_")]
    return found
