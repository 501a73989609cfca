"""The Grafana dashboard reads only series the planner exports (the exporter's registry),
filtered by the namespace and DGD variables, shows every one of them, and its ConfigMap form
holds the same JSON. (The live e2e test runs its queries against a real Prometheus.)"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import yaml

from disagg_planner.runtime.metrics import PlannerMetrics
from tests.unit.deploy.conftest import REPO

GRAFANA = REPO / "deploy" / "grafana"
DASHBOARD = json.loads((GRAFANA / "planner-dashboard.json").read_text())
SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}")
PLANNER_NAME = re.compile(r"\bdynamo_planner_[a-zA-Z0-9_]+")


def exported_names() -> set[str]:
    """Every sample name the planner's registry can expose."""
    names: set[str] = set()
    for family in PlannerMetrics().registry.collect():
        suffixes = {
            "counter": ("_total", "_created"),
            "histogram": ("_bucket", "_sum", "_count", "_created"),
            "summary": ("_sum", "_count", "_created"),
            "info": ("_info",),
        }.get(family.type, ("",))
        names |= {family.name + s for s in suffixes}
    return names


def panels() -> Iterator[dict[str, Any]]:
    for panel in DASHBOARD["panels"]:
        yield panel
        yield from panel.get("panels", [])


def expressions() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query, and the variables' queries."""
    out = [(p["title"], t["expr"]) for p in panels() for t in p.get("targets", [])]
    out += [
        (f"variable {v['name']}", v["query"]["query"])
        for v in DASHBOARD["templating"]["list"]
        if v["type"] == "query"
    ]
    return out


def test_every_metric_in_a_query_is_one_the_planner_exports():
    exported = exported_names()
    used = {name for _, expr in expressions() for name in PLANNER_NAME.findall(expr)}
    assert used, "the dashboard queries no planner metric"
    assert used <= exported, (
        f"not exported by src/disagg_planner/runtime/metrics.py: {sorted(used - exported)}"
    )


def test_every_panel_query_selects_planner_series_of_the_chosen_namespace_and_dgd():
    for title, expr in expressions():
        if title.startswith("variable"):
            continue  # the variables list the namespaces and DGDs themselves
        selectors = SELECTOR.findall(expr)
        assert selectors, f"{title}: {expr} has no label selector"
        for name, labels in selectors:
            assert name.startswith("dynamo_planner_"), f"{title}: foreign metric {name}"
            assert 'namespace=~"$namespace"' in labels, f"{title}: {expr}"
            assert 'dgd=~"$dgd"' in labels, f"{title}: {expr}"


def test_the_dashboard_shows_every_planner_metric():
    used = {name for _, expr in expressions() for name in PLANNER_NAME.findall(expr)}
    families = set()
    for family in PlannerMetrics().registry.collect():
        families.add(family.name + ("_total" if family.type == "counter" else ""))
    assert families - used == set()


def test_panels_cover_what_an_operator_of_the_planner_watches():
    titles = " | ".join(p["title"] for p in panels())
    for expected in (
        "Prefill replicas: current vs recommended",
        "Decode replicas: current vs recommended",
        "Request rate",
        "Time to first token: observed, estimated, SLO",
        "Inter-token latency: observed, estimated, SLO",
        "Correction factors",
        "Throughput loop decisions",
        "Load loop decisions",
        "GPU-hours",
        "Queued prefill tokens per engine",
    ):
        assert expected in titles


def test_layout_and_variables_are_well_formed():
    ids = [p["id"] for p in panels()]
    assert len(ids) == len(set(ids))
    for panel in panels():
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        refs = [t["refId"] for t in panel.get("targets", [])]
        assert len(refs) == len(set(refs)), panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel.get("description"), f"{panel['title']} has no description"
    variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    assert set(variables) == {"datasource", "namespace", "dgd"}
    assert variables["datasource"]["query"] == "prometheus"
    assert "$namespace" in variables["dgd"]["query"]["query"]
    for name in ("namespace", "dgd"):
        assert variables[name]["includeAll"] and variables[name]["multi"]
    assert DASHBOARD["uid"] == "planner-overview"


def test_the_config_map_form_holds_the_same_dashboard():
    config_map = yaml.safe_load((GRAFANA / "planner-dashboard-configmap.yaml").read_text())
    assert config_map["kind"] == "ConfigMap"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["planner-dashboard.json"]) == DASHBOARD
