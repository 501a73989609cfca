"""Write the planner's Grafana dashboard: ``planner-dashboard.json`` and its ConfigMap form
for the Grafana sidecar (``planner-dashboard-configmap.yaml``, label ``grafana_dashboard:
"1"``).

Every query reads the operator's own ``dynamo_planner_*`` series
(src/disagg_planner/runtime/metrics.py), all filtered by the ``namespace`` and ``dgd``
variables (each series carries both labels, one operator serving many DGDs). Rows: replicas,
load, latency against the SLO, corrections and decisions, cost, engines, health.

Usage: ``python deploy/grafana/generate.py`` (write) or ``--check`` (exit 1 when a committed
file differs; CI runs this).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "src") not in sys.path:  # run as a script from anywhere, installed or not
    sys.path.insert(0, str(REPO / "src"))

from disagg_planner.generated import sync_generated  # noqa: E402

HERE = Path(__file__).resolve().parent
DASHBOARD_FILE = HERE / "planner-dashboard.json"
CONFIGMAP_FILE = HERE / "planner-dashboard-configmap.yaml"
UID = "planner-overview"
SEL = 'namespace=~"$namespace", dgd=~"$dgd"'
P = "dynamo_planner_"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


class Layout:
    """Panels left to right, rows of 24 grid units."""

    def __init__(self) -> None:
        self.y = 0
        self.x = 0
        self.row_height = 0
        self.next_id = 1
        self.panels: list[dict[str, Any]] = []

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append(
            {
                "type": "row",
                "id": self._id(),
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y},
                "panels": [],
            }
        )
        self.y += 1

    def add(self, panel: dict[str, Any], *, w: int, h: int = 8) -> None:
        if self.x + w > 24:
            self._newline()
        panel["id"] = self._id()
        panel["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
        panel["datasource"] = DATASOURCE
        self.panels.append(panel)
        self.x += w
        self.row_height = max(self.row_height, h)

    def _newline(self) -> None:
        if self.x:
            self.y += self.row_height
        self.x = 0
        self.row_height = 0

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id - 1


def target(expr: str, legend: str, ref: str) -> dict[str, Any]:
    return {"refId": ref, "expr": expr, "legendFormat": legend, "datasource": DATASOURCE}


def timeseries(
    title: str,
    description: str,
    targets: list[tuple[str, str]],
    *,
    unit: str = "short",
    dashed: tuple[str, ...] = (),
    stepped: bool = False,
) -> dict[str, Any]:
    """A time series panel; series whose legend is in ``dashed`` (SLO lines, forecasts) are
    drawn dashed."""
    overrides = [
        {
            "matcher": {"id": "byRegexp", "options": f".*{legend}.*"},
            "properties": [
                {
                    "id": "custom.lineStyle",
                    "value": {"fill": "dash", "dash": [10, 10]},
                }
            ],
        }
        for legend in dashed
    ]
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "targets": [target(e, legend, chr(ord("A") + i)) for i, (e, legend) in enumerate(targets)],
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "custom": {
                    "drawStyle": "line",
                    "lineInterpolation": "stepAfter" if stepped else "linear",
                    "lineWidth": 2,
                    "fillOpacity": 0,
                    "showPoints": "never",
                    "spanNulls": True,
                },
            },
            "overrides": overrides,
        },
        "options": {
            "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull"]},
            "tooltip": {"mode": "multi", "sort": "none"},
        },
    }


def stat(title: str, description: str, expr: str, legend: str, *, unit: str) -> dict[str, Any]:
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "targets": [target(expr, legend, "A")],
        "fieldConfig": {"defaults": {"unit": unit, "decimals": 2}, "overrides": []},
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "textMode": "value_and_name",
        },
    }


def decisions(title: str, description: str, metric: str) -> dict[str, Any]:
    """An enum gauge as a timeline: one lane per DGD, coloured by the active state."""
    return {
        "type": "state-timeline",
        "title": title,
        "description": description,
        "targets": [
            target(
                f"max by (namespace, dgd, {metric}) ({metric}{{{SEL}}}) == 1",
                f"{{{{dgd}}}}: {{{{{metric}}}}}",
                "A",
            )
        ],
        "fieldConfig": {
            "defaults": {"color": {"mode": "palette-classic"}, "custom": {"fillOpacity": 80}},
            "overrides": [],
        },
        "options": {
            "showValue": "never",
            "mergeValues": True,
            "rowHeight": 0.8,
            "legend": {"displayMode": "list", "placement": "bottom"},
        },
    }


def replicas_targets(role: str) -> list[tuple[str, str]]:
    return [
        (f"{P}num_{role}_replicas{{{SEL}}}", "{{dgd}} ready"),
        (f"{P}desired_num_{role}_replicas{{{SEL}}}", "{{dgd}} desired"),
        (f"{P}predicted_num_{role}_replicas{{{SEL}}}", "{{dgd}} recommended"),
    ]


def panels() -> list[dict[str, Any]]:
    lay = Layout()
    lay.row("Replicas")
    for role, text in (("prefill", "Prefill"), ("decode", "Decode"), ("agg", "Aggregated")):
        lay.add(
            timeseries(
                f"{text} replicas: current vs recommended",
                f"Ready and desired {role} replicas in the DGD, and the planner's last "
                "recommendation (dashed). A gap between desired and ready is a scale in "
                "progress; between recommended and desired, a held decision.",
                replicas_targets(role),
                dashed=("recommended",),
                stepped=True,
            ),
            w=8,
        )

    lay.row("Load: observed vs predicted")
    lay.add(
        timeseries(
            "Request rate",
            "Requests per second over the last throughput interval (from Prometheus) and the "
            "forecast for the next one (dashed).",
            [
                (f"{P}observed_requests_per_second{{{SEL}}}", "{{dgd}} observed"),
                (f"{P}predicted_requests_per_second{{{SEL}}}", "{{dgd}} predicted"),
            ],
            unit="reqps",
            dashed=("predicted",),
        ),
        w=8,
    )
    lay.add(
        timeseries(
            "Input sequence length",
            "Mean input tokens per request, observed and forecast (dashed).",
            [
                (f"{P}observed_input_sequence_tokens{{{SEL}}}", "{{dgd}} observed"),
                (f"{P}predicted_input_sequence_tokens{{{SEL}}}", "{{dgd}} predicted"),
            ],
            dashed=("predicted",),
        ),
        w=8,
    )
    lay.add(
        timeseries(
            "Output sequence length",
            "Mean output tokens per request, observed and forecast (dashed).",
            [
                (f"{P}observed_output_sequence_tokens{{{SEL}}}", "{{dgd}} observed"),
                (f"{P}predicted_output_sequence_tokens{{{SEL}}}", "{{dgd}} predicted"),
            ],
            dashed=("predicted",),
        ),
        w=8,
    )

    lay.row("Latency against the SLO")
    for short, text in (("ttft", "Time to first token"), ("itl", "Inter-token latency")):
        lay.add(
            timeseries(
                f"{text}: observed, estimated, SLO",
                f"Observed mean {short.upper()} (frontend, over the throughput interval), the "
                "load loop's estimate (worst engine, from ForwardPassMetrics) and the SLO "
                "target (dashed).",
                [
                    (f"{P}observed_{short}_ms{{{SEL}}}", "{{dgd}} observed"),
                    (f"{P}estimated_{short}_ms{{{SEL}}}", "{{dgd}} estimated"),
                    (f"{P}sla_target_{short}_ms{{{SEL}}}", "{{dgd}} SLO"),
                ],
                unit="ms",
                dashed=("SLO",),
            ),
            w=12,
        )

    lay.row("Corrections and decisions")
    lay.add(
        timeseries(
            "Correction factors",
            "Observed over profiled latency: prefill (TTFT) and decode (ITL). Above 1 the "
            "engines are slower than the profile and the planner sizes for that.",
            [
                (f"{P}prefill_correction_factor{{{SEL}}}", "{{dgd}} prefill"),
                (f"{P}decode_correction_factor{{{SEL}}}", "{{dgd}} decode"),
            ],
        ),
        w=8,
    )
    lay.add(
        decisions(
            "Throughput loop decisions",
            "Outcome of each throughput tick (scale, no_change, no_traffic_data, ...).",
            f"{P}throughput_scaling_decision",
        ),
        w=8,
    )
    lay.add(
        decisions(
            "Load loop decisions",
            "Outcome of each load tick (scale_up, scale_down, scaling_in_progress, ...).",
            f"{P}load_scaling_decision",
        ),
        w=8,
    )

    lay.row("Cost")
    lay.add(
        stat(
            "GPU-hours",
            "GPU-hours of the scaled roles since the planner started planning the DGD.",
            f"{P}gpu_hours{{{SEL}}}",
            "{{dgd}}",
            unit="none",
        ),
        w=8,
    )
    lay.add(
        timeseries(
            "GPUs in use",
            "GPUs of the scaled roles now (replicas x GPUs per replica).",
            [(f"{P}gpus_in_use{{{SEL}}}", "{{dgd}}")],
            stepped=True,
        ),
        w=8,
    )
    lay.add(
        timeseries(
            "Scaling latency",
            "Time from a scaling decision to the new replicas being ready, per role.",
            [(f"{P}scaling_latency_seconds{{{SEL}}}", "{{dgd}} {{role}}")],
            unit="s",
            stepped=True,
        ),
        w=8,
    )

    lay.row("Engines")
    for metric, title, text in (
        ("engine_queued_prefill_tokens", "Queued prefill tokens", "Prompt tokens waiting"),
        (
            "engine_queued_decode_kv_tokens",
            "Queued decode KV tokens",
            "KV tokens of preempted requests waiting",
        ),
        (
            "engine_inflight_decode_kv_tokens",
            "In-flight decode KV tokens",
            "KV tokens of the requests decoding",
        ),
    ):
        lay.add(
            timeseries(
                f"{title} per engine",
                f"{text} in each engine (worker, data-parallel rank), from its latest "
                "ForwardPassMetrics.",
                [(f"{P}{metric}{{{SEL}}}", "{{dgd}} {{worker_id}}/{{dp_rank}}")],
            ),
            w=8,
        )

    lay.row("Planner health")
    lay.add(
        timeseries(
            "Observation failures",
            "Inputs the planner could not read, per second, by source and reason (it holds "
            "rather than guesses; the PlannerPolicy reports Degraded).",
            [
                (
                    f"sum by (dgd, source, reason) "
                    f"(rate({P}observation_failures_total{{{SEL}}}[$__rate_interval]))",
                    "{{dgd}} {{source}}: {{reason}}",
                )
            ],
            unit="ops",
        ),
        w=12,
    )
    lay.add(
        timeseries(
            "ForwardPassMetrics frames dropped",
            "Engine reports dropped per second, by why (undecodable, stale, gaps ...).",
            [
                (
                    f"sum by (dgd, kind) "
                    f"(rate({P}fpm_frames_dropped_total{{{SEL}}}[$__rate_interval]))",
                    "{{dgd}} {{kind}}",
                )
            ],
            unit="ops",
        ),
        w=12,
    )
    return lay.panels


def variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": f"{name}-query"},
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
        "hide": 0,
    }


def dashboard() -> dict[str, Any]:
    # Every managed DGD exports its SLO targets, so they list the DGDs of every mode.
    anchor = f"{P}sla_target_ttft_ms"
    return {
        "uid": UID,
        "title": "Planner",
        "description": "The planner's view of each DynamoGraphDeployment it scales: replicas, "
        "load, latency against the SLO, corrections, decisions, cost and engine queues.",
        "tags": ["planner", "dynamo", "autoscaling"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "schemaVersion": 39,
        "version": 1,
        "annotations": {"list": []},
        "links": [],
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "refresh": 1,
                    "hide": 0,
                    "current": {},
                },
                variable("namespace", "Namespace", f"label_values({anchor}, namespace)"),
                variable(
                    "dgd",
                    "DynamoGraphDeployment",
                    f'label_values({anchor}{{namespace=~"$namespace"}}, dgd)',
                ),
            ]
        },
        "panels": panels(),
    }


def configmap(text: str) -> str:
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "planner-grafana-dashboard",
            "labels": {"grafana_dashboard": "1", "app.kubernetes.io/name": "planner"},
        },
        "data": {"planner-dashboard.json": text},
    }

    class Literal(str):
        pass

    def literal(dumper: yaml.SafeDumper, data: Literal) -> yaml.ScalarNode:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")

    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_representer(Literal, literal)
    body["data"] = {"planner-dashboard.json": Literal(text)}
    header = (
        "# The planner Grafana dashboard for the Grafana sidecar (kube-prometheus-stack picks\n"
        "# up ConfigMaps labelled grafana_dashboard=1). Apply it in Grafana's namespace:\n"
        "#   kubectl apply -n monitoring -f deploy/grafana/planner-dashboard-configmap.yaml\n"
        "# Generated by `python deploy/grafana/generate.py`; do not edit.\n"
    )
    return header + yaml.dump(body, Dumper=Dumper, sort_keys=False, width=1000)


def generated() -> dict[Path, str]:
    text = json.dumps(dashboard(), indent=2) + "\n"
    return {DASHBOARD_FILE: text, CONFIGMAP_FILE: configmap(text)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    return sync_generated(
        generated(), check=args.check, command="python deploy/grafana/generate.py"
    )


if __name__ == "__main__":
    sys.exit(main())
