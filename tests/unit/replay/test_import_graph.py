"""No import circle runs through replay/ or report/ (issue 34), deferred and type-only imports
included: every ``import`` statement of ``src/`` counts, wherever it stands in its module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import disagg_planner

SRC = Path(disagg_planner.__file__).resolve().parent.parent


def import_graph() -> dict[str, set[str]]:
    """Each module of the package and the modules of the package it imports anywhere in it."""
    modules = {}
    for path in (SRC / "disagg_planner").rglob("*.py"):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # "from package import module" imports the module
                candidates = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
                found.update(c for c in candidates if c in modules)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name in modules)
        graph[name] = found - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_walk_sees_deferred_imports_and_finds_circles() -> None:
    graph = import_graph()
    # imported inside a method (a live process renders in a child and never loads plotly)
    assert "disagg_planner.report.html" in graph["disagg_planner.report.recorder"]
    # "from package import module" is an edge to the module
    assert "disagg_planner.simulator.startup" in graph["disagg_planner.replay.session"]
    # the shape replay/session and replay/parallel had, one of the edges deferred
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("folder", ["disagg_planner.replay", "disagg_planner.report"])
def test_no_import_circle_runs_through(folder: str) -> None:
    through = [c for c in circles(import_graph()) if any(m.startswith(folder + ".") for m in c)]
    assert through == []
