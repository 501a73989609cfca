"""No import circle runs through replay/ or report/ (issue 34), deferred and type-only imports
included: the walk of ``tests/support/import_graph.py`` counts every ``import`` statement,
wherever it stands in its module."""

from __future__ import annotations

from pathlib import Path

import pytest

import disagg_planner
from tests.support.import_graph import describe, import_cycles, import_graph

PACKAGE = Path(disagg_planner.__file__).parent


def test_the_walk_sees_deferred_imports_and_package_imports_of_modules() -> None:
    graph = import_graph(PACKAGE)
    # imported inside a method (a live process renders in a child and never loads plotly)
    assert "disagg_planner.report.html" in graph["disagg_planner.report.recorder"]
    # "from package import module" is an edge to the module
    assert "disagg_planner.simulator.startup" in graph["disagg_planner.replay.session"]


@pytest.mark.parametrize("folder", ["replay", "report"])
def test_no_import_circle_runs_through(folder: str) -> None:
    cycles = import_cycles(PACKAGE / folder)
    assert cycles == [], f"import circles in {folder}/:\n" + describe(cycles)
