"""The import-linter layer contracts inside replay/, simulator/ and report/ (pyproject.toml)
name every module of their folder: a module left out of a layers contract is checked by none,
so a new file must be placed in a tier when it is added."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "disagg_planner"


def layer_contracts() -> dict[str, list[str]]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    return {
        container: contract["layers"]
        for contract in contracts
        if contract["type"] == "layers"
        for container in contract["containers"]
    }


def named_in(layers: list[str]) -> list[str]:
    return [
        name.strip()
        for layer in layers
        for name in layer.replace("|", ":").split(":")
        if name.strip()
    ]


def children(folder: Path) -> set[str]:
    """The modules and packages directly inside ``folder`` (its ``__init__`` aside)."""
    return {
        p.stem if p.is_file() else p.name
        for p in folder.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()
    }


@pytest.mark.parametrize("folder", ["replay", "simulator", "report"])
def test_every_module_of_the_folder_sits_in_one_tier(folder: str) -> None:
    layers = layer_contracts()[f"disagg_planner.{folder}"]
    named = named_in(layers)
    assert len(named) == len(set(named)), f"a module named twice in {folder}'s layers"
    missing = children(PACKAGE / folder) - set(named)
    assert not missing, f"{folder}/: {sorted(missing)} in no tier of its layers contract"
    gone = set(named) - children(PACKAGE / folder)
    assert not gone, f"{folder}/'s layers name modules that do not exist: {sorted(gone)}"


def test_the_package_contract_names_every_top_level_folder() -> None:
    named = set(named_in(layer_contracts()["disagg_planner"]))
    missing = children(PACKAGE) - named - {"__main__"}
    assert not missing, f"{sorted(missing)} in no layer of the package's contract"
