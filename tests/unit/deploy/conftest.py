"""The Helm chart rendered by Helm itself, once per test session, for a set of value cases.

Each case is ``helm install`` of deploy/helm/planner into a fresh kmock API server (see
helm_render.py). Valid cases cover every RBAC shape (one namespace, several, globs,
cluster-wide; with and without peering) and every optional object; invalid ones must be
refused by Helm (values.schema.json or a template ``fail``) with a message naming the value.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "deploy" / "helm" / "planner"
RELEASE_NAMESPACE = "planner"

# name -> values; the release is "planner" in namespace "planner" unless the case says.
VALID_CASES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "namespaces": {
        "watch": {"namespaces": ["team-a", "team-b"]},
        "config": {"ttft_ms": 300, "itl_ms": 25, "enable_load_scaling": True},
    },
    "globs": {"watch": {"namespaces": ["team-*", "inference"]}},
    # one of N shards: its own label and peering (README, Fleet: Sharding)
    "shard": {"shard": "planner.autoscaling.dev/shard=a", "peering": {"name": "planner-a"}},
    "cluster": {"watch": {"scope": "cluster"}},
    "standalone": {"replicaCount": 1, "peering": {"enabled": False}},
    "cluster-standalone": {
        "replicaCount": 1,
        "watch": {"scope": "cluster"},
        "peering": {"enabled": False},
    },
    "everything": {
        "metrics": {
            "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
            "podMonitor": {"enabled": True},
        },
        "podDisruptionBudget": {"enabled": True},
        "grafanaDashboard": {"enabled": True},
        "config": {
            "metric_pulling_prometheus_endpoint": "http://prometheus.monitoring:9090",
            "profile": "h200_sxm/vllm/llama-3.1-8b-fp8/tp1",
            "load_predictor": "kalman",
            "ttft": 250,  # Dynamo's spelling
            "max_gpu_budget": 64,
            "report_interval_hours": None,
        },
        "extraEnv": [{"name": "EXTRA", "value": "1"}],
        "podLabels": {"team": "inference"},
    },
}

# name -> (values, text the error must contain)
INVALID_CASES: dict[str, tuple[dict[str, Any], str]] = {
    "negative-ttft": ({"config": {"ttft_ms": -1}}, "/config/ttft_ms"),
    "unknown-setting": ({"config": {"ttft_milliseconds": 300}}, "ttft_milliseconds"),
    "shard-without-value": ({"shard": "planner.autoscaling.dev/shard"}, "/shard"),
    "bad-predictor": ({"config": {"load_predictor": "oracle"}}, "/config/load_predictor"),
    "operator-owned-setting": ({"config": {"dgd_name": "x"}}, "dgd_name"),
    "bad-scope": ({"watch": {"scope": "everywhere"}}, "/watch/scope"),
    "bad-namespace": ({"watch": {"namespaces": ["Team_A"]}}, "/watch/namespaces/0"),
    "metrics-port-zero": ({"metrics": {"port": 0}}, "/metrics/port"),
    "typo-top-level": ({"replicas": 3}, "replicas"),
    "replicas-without-peering": (
        {"replicaCount": 2, "peering": {"enabled": False}},
        "replicaCount > 1 needs peering.enabled=true",
    ),
    "servicemonitor-without-service": (
        {"metrics": {"service": {"enabled": False}, "serviceMonitor": {"enabled": True}}},
        "metrics.serviceMonitor.enabled needs metrics.service.enabled",
    ),
}


@dataclass(frozen=True)
class Rendered:
    name: str
    values: dict[str, Any]
    manifest: str | None
    error: str | None

    @property
    def docs(self) -> list[dict[str, Any]]:
        assert self.manifest is not None, f"case {self.name} failed: {self.error}"
        return [d for d in yaml.safe_load_all(self.manifest) if d]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == kind]

    def one(self, kind: str) -> dict[str, Any]:
        found = self.of_kind(kind)
        assert len(found) == 1, f"{self.name}: expected one {kind}, got {len(found)}"
        return found[0]


def render_cases(cases: list[dict[str, Any]]) -> dict[str, Any]:
    try:
        import helm_sdkpy  # noqa: F401
    except ImportError:
        pytest.fail(
            "helm-sdkpy is not installed: .ci/run installs it (pip install "
            "--ignore-requires-python -c ci-constraints.txt helm-sdkpy)"
        )
    env = {**os.environ, "HELM_DRIVER": "memory", "PYTHONPATH": str(REPO)}
    env.pop("KUBECONFIG", None)
    result = subprocess.run(
        [sys.executable, "-m", "tests.unit.deploy.helm_render", str(CHART)],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(f"helm_render failed ({result.returncode}):\n{result.stderr[-4000:]}")
    out: dict[str, Any] = json.loads(result.stdout)
    return out


@pytest.fixture(scope="session")
def helm_output() -> dict[str, Any]:
    """``helm lint`` of the chart and every case (valid and invalid), from one Helm process."""
    cases: list[dict[str, Any]] = [
        {"name": name, "namespace": RELEASE_NAMESPACE, "values": values}
        for name, values in VALID_CASES.items()
    ] + [
        {"name": name, "namespace": RELEASE_NAMESPACE, "values": values}
        for name, (values, _) in INVALID_CASES.items()
    ]
    out = render_cases(cases)
    out["values"] = {c["name"]: c["values"] for c in cases}
    return out


@pytest.fixture(scope="session")
def rendered(helm_output: dict[str, Any]) -> dict[str, Rendered]:
    values = helm_output["values"]
    return {
        r["name"]: Rendered(r["name"], values[r["name"]], r["manifest"], r["error"])
        for r in helm_output["cases"]
    }
