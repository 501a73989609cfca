"""No import circle inside the simulator, deferred and type-only imports included (issue 34).

The walker (``tests/support/import_graph.py``) is checked first on small packages written
here, so that a walker that missed an import kind could not pass the simulator by accident.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import disagg_planner.simulator
from tests.support.import_graph import describe, import_cycles, import_graph

SIMULATOR = Path(disagg_planner.simulator.__file__).parent


def _package(root: Path, files: dict[str, str]) -> Path:
    """Write ``pkg/<name>.py`` for each entry (plus ``pkg/__init__.py``); returns ``pkg``."""
    pkg = root / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(files.pop("__init__", ""))
    for name, text in files.items():
        path = pkg / f"{name.replace('.', '/')}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.parent != pkg and not (path.parent / "__init__.py").exists():
            (path.parent / "__init__.py").write_text("")
        path.write_text(text)
    return pkg


CIRCLES = [
    pytest.param(
        {"a": "import pkg.b\n", "b": "def f():\n    from pkg import a\n"},
        [["pkg.a", "pkg.b", "pkg.a"]],
        id="deferred import inside a function",
    ),
    pytest.param(
        {
            "a": "from pkg.b import B\n",
            "b": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\n"),
        },
        [["pkg.a", "pkg.b", "pkg.a"]],
        id="type-only import",
    ),
    pytest.param(
        {"a": "from . import b\n", "b": "from .c import x\n", "c": "from .a import y\n"},
        [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]],
        id="relative imports, three modules",
    ),
    pytest.param(
        {"sub.a": "from ..b import x\n", "b": "import pkg.sub.a as a\n"},
        [["pkg.b", "pkg.sub.a", "pkg.b"]],
        id="two levels up from a subpackage",
    ),
    pytest.param(
        {"a": "import pkg.b\nimport json\n", "b": "from pkg import c\n", "c": "import os\n"},
        [],
        id="a chain is no circle",
    ),
    pytest.param(
        {"__init__": "from pkg.a import x\n", "a": "from pkg.b import y\n", "b": "z = 1\n"},
        [],
        id="a package face re-exporting its modules is no circle",
    ),
]


@pytest.mark.parametrize(("files", "expected"), CIRCLES)
def test_the_walker_finds_every_kind_of_circle(
    tmp_path: Path, files: dict[str, str], expected: list[list[str]]
) -> None:
    assert import_cycles(_package(tmp_path, dict(files))) == expected


def test_the_walker_sees_the_submodule_not_the_package_of_a_from_import(tmp_path: Path) -> None:
    pkg = _package(tmp_path, {"a": "from pkg import b, c\n", "b": "", "c": ""})
    assert import_graph(pkg)["pkg.a"] == {"pkg.b", "pkg.c"}


def test_the_walker_refuses_a_folder_that_is_not_a_package(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a package"):
        import_graph(tmp_path)


def test_the_simulator_has_no_import_circle() -> None:
    graph = import_graph(SIMULATOR)
    # The walk saw the simulator: its engine factory imports both engine models.
    assert {
        "disagg_planner.simulator.aic_engine",
        "disagg_planner.simulator.engine_model",
    } <= graph["disagg_planner.simulator.engines"]
    cycles = import_cycles(SIMULATOR)
    assert cycles == [], "import circles in the simulator:\n" + describe(cycles)
