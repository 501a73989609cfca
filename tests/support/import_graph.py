"""The import graph of a package, read from its source with ``ast``, and the circles in it.

Every ``import`` and ``from ... import`` statement counts, wherever it stands: at module level,
inside a function (a deferred import), under ``if TYPE_CHECKING:``. A deferred or type-only
import hides a circle from the interpreter, not from a reader: the modules still cannot be
understood, tested or moved one without the other.

An edge goes to the module named, or, for ``from PACKAGE import NAME``, to the submodule
``PACKAGE.NAME`` when there is one. Importing ``a.b.c`` also runs the ``__init__`` of ``a`` and
``a.b``; those implicit edges are left out, so that a package whose ``__init__`` re-exports its
modules' names (the usual way to give a package a face) is not a circle with each of them. A
module that imports a name its package's ``__init__`` defines (``from a.b import NAME``, NAME
no submodule) does depend on that ``__init__``, and that edge counts.

Only modules inside the walked folder are nodes: ``import_cycles(src / "disagg_planner")``
walks the whole package, ``import_cycles(src / "disagg_planner" / "simulator")`` one folder.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path


def _root_of(package_dir: Path) -> Path:
    """The folder on ``sys.path`` above ``package_dir``: the first without an ``__init__.py``."""
    root = package_dir.resolve()
    while (root / "__init__.py").exists():
        root = root.parent
    return root


def _modules(package_dir: Path) -> dict[str, Path]:
    """Dotted name -> file of every module under ``package_dir`` (a package is its
    ``__init__.py``)."""
    if not (package_dir / "__init__.py").exists():
        raise ValueError(f"{package_dir}: not a package (no __init__.py)")
    root = _root_of(package_dir)
    out: dict[str, Path] = {}
    for path in sorted(package_dir.resolve().rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(node: ast.ImportFrom, package: str) -> str:
    """The absolute module ``node`` imports from (``package``: the importing module's)."""
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = ".".join(parts[: len(parts) - (node.level - 1)])
    return f"{base}.{node.module}" if node.module else base


def _targets(tree: ast.Module, package: str, modules: dict[str, Path]) -> Iterator[str]:
    """The modules of ``modules`` each import statement of ``tree`` (anywhere) names."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node, package)
            for alias in node.names:
                # ``from X import Y``: the submodule X.Y when there is one, else X itself
                sub = f"{base}.{alias.name}"
                yield sub if sub in modules else base


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Module -> the modules under ``package_dir`` it imports (anywhere in its source)."""
    modules = _modules(package_dir)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = {t for t in _targets(tree, package, modules) if t in modules} - {name}
    return graph


def import_cycles(package_dir: Path) -> list[list[str]]:
    """The circles of :func:`import_graph`: each strongly connected group of two or more
    modules, as one cycle through them (first module repeated at the end), sorted."""
    graph = import_graph(package_dir)
    cycles = []
    for group in _strongly_connected(graph):
        if len(group) > 1:
            cycles.append(_cycle_through(graph, group))
    return sorted(cycles)


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative (no recursion limit on a long chain)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                groups.append(group)
    return groups


def _cycle_through(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """One cycle inside ``group`` (strongly connected) from its first module back to it:
    the shortest, found breadth first."""
    start = min(group)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & group):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"{sorted(group)} is not strongly connected")


def describe(cycles: list[list[str]]) -> str:
    """One line per cycle, ``a -> b -> a``, for an assertion message."""
    return "\n".join(" -> ".join(cycle) for cycle in cycles)


__all__ = ["describe", "import_cycles", "import_graph"]
