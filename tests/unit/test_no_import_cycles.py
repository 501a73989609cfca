"""No import circle anywhere in ``disagg_planner``, deferred and type-only imports included
(issue 34).

The walker itself is tested on small packages in ``tests/unit/simulator/test_no_import_cycles.py``;
here it walks the whole package.
"""

from __future__ import annotations

from pathlib import Path

import disagg_planner
from tests.support.import_graph import describe, import_cycles, import_graph

PACKAGE = Path(disagg_planner.__file__).parent


def test_the_package_has_no_import_circle() -> None:
    graph = import_graph(PACKAGE)
    # The walk saw every layer: the CRD generator reaches the pool's CRD, and the core and
    # simulator are in the graph (a walk of the wrong folder would pass with no circle).
    assert {
        "disagg_planner.operator.pool",
        "disagg_planner.operator.conditions",
    } <= graph["disagg_planner.operator.crd"]
    assert "disagg_planner.core.elastic" in graph
    assert "disagg_planner.simulator.engines" in graph
    cycles = import_cycles(PACKAGE)
    assert cycles == [], "import circles in disagg_planner:\n" + describe(cycles)
