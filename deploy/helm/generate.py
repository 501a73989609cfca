"""Write the generated files of the Helm chart in deploy/helm/planner.

- ``values.schema.json``: the chart's values; its ``config`` block is generated from
  :class:`disagg_planner.config.schema.PlannerConfig` (every setting a policy may leave to the
  operator, plus Dynamo's alias spellings), so that Helm rejects a wrong setting before the
  pod starts. Cross-field rules (e.g. the load interval below the throughput interval) are
  not expressible here; the operator checks them at start and exits naming the field.
- ``crds/``: the PlannerPolicy and kopf peering CRDs, as ``python -m disagg_planner.operator.crd``
  writes them to deploy/crds.
- ``files/planner-dashboard.json``: the Grafana dashboard of deploy/grafana, for the
  chart's optional dashboard ConfigMap.

Usage: ``python deploy/helm/generate.py`` (write) or ``--check`` (exit 1 when a committed
file differs from what would be written; CI runs this).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "src") not in sys.path:  # run as a script from anywhere, installed or not
    sys.path.insert(0, str(REPO / "src"))

from disagg_planner.config.loader import field_names_by_key  # noqa: E402
from disagg_planner.config.schema import DYNAMO_KEYS_NOT_APPLICABLE, PlannerConfig  # noqa: E402
from disagg_planner.generated import sync_generated  # noqa: E402
from disagg_planner.operator.crd import OPERATOR_SET_FIELDS, generated_files  # noqa: E402

CHART = REPO / "deploy" / "helm" / "planner"
DASHBOARD = REPO / "deploy" / "grafana" / "planner-dashboard.json"

# pydantic's JSON-schema keys, and our json_schema_extra keys, that are not validation
_DROPPED = frozenset({"title", "group", "flags", "env"})
K8S_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
NAMESPACE_PATTERN = r"^[a-z0-9*?!\[\]]([-a-z0-9*?!\[\]]*[a-z0-9*?!\[\]])?$"


def _clean(schema: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _DROPPED:
            continue
        if key == "anyOf":
            out[key] = [_clean(v) for v in value]
        elif key == "items":
            out[key] = _clean(value)
        else:
            out[key] = value
    return out


def config_schema() -> dict[str, Any]:
    """The ``config:`` block: PlannerConfig's fields (without the four the operator sets per
    policy), Dynamo's alias spellings, and Dynamo keys this planner accepts and ignores."""
    fields = PlannerConfig.model_json_schema()["properties"]
    properties: dict[str, Any] = {}
    for name in PlannerConfig.model_fields:
        if name in OPERATOR_SET_FIELDS:
            continue
        properties[name] = _clean(fields[name])
    for key, name in sorted(field_names_by_key().items()):
        if key == name or name in OPERATOR_SET_FIELDS:
            continue
        alias = _clean(fields[name])
        alias["description"] = (
            f"Alias of {name} (Dynamo's spelling). {alias.get('description', '')}"
        )
        properties[key] = alias
    for key in sorted(DYNAMO_KEYS_NOT_APPLICABLE):
        properties[key] = {
            "description": "A Dynamo setting of a subsystem this planner does not have: "
            "accepted and ignored (the operator logs it)."
        }
    return {
        "type": "object",
        "description": "Planner settings under every PlannerPolicy (keys of a planner config "
        "file, see `planner config show`); a policy's spec overrides them. environment, "
        "dgd_name and kubernetes_namespace are set per policy by the operator, "
        "metric_reporting_prometheus_port by metrics.port.",
        "additionalProperties": False,
        "properties": properties,
    }


def _obj(properties: dict[str, Any], *, description: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "additionalProperties": False}
    if description:
        out["description"] = description
    out["properties"] = properties
    return out


_ANY_OBJECT: dict[str, Any] = {"type": "object"}
_ANY_ARRAY: dict[str, Any] = {"type": "array"}
_STRING_MAP: dict[str, Any] = {"type": "object", "additionalProperties": {"type": "string"}}
_DURATION: dict[str, Any] = {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"}
_PORT: dict[str, Any] = {"type": "integer", "minimum": 1, "maximum": 65535}


def _probe() -> dict[str, Any]:
    positive = {"type": "integer", "minimum": 1}
    return _obj(
        {
            "initialDelaySeconds": {"type": "integer", "minimum": 0},
            "periodSeconds": positive,
            "timeoutSeconds": positive,
            "failureThreshold": positive,
            "successThreshold": positive,
        }
    )


def values_schema() -> dict[str, Any]:
    """The whole values schema (JSON Schema draft-07, as Helm reads it)."""
    monitor = _obj(
        {
            "enabled": {"type": "boolean"},
            "interval": _DURATION,
            "scrapeTimeout": _DURATION,
            "labels": _STRING_MAP,
        }
    )
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "Values of the planner chart",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "global": {"type": "object", "description": "Helm's global values (unused)."},
            "replicaCount": {"type": "integer", "minimum": 1},
            "image": _obj(
                {
                    "repository": {"type": "string", "minLength": 1},
                    "tag": {"type": "string"},
                    "pullPolicy": {"type": "string", "enum": ["Always", "IfNotPresent", "Never"]},
                }
            ),
            "imagePullSecrets": _ANY_ARRAY,
            "nameOverride": {"type": "string"},
            "fullnameOverride": {"type": "string"},
            "watch": _obj(
                {
                    "scope": {"type": "string", "enum": ["namespaces", "cluster"]},
                    "namespaces": {
                        "type": "array",
                        "uniqueItems": True,
                        "items": {"type": "string", "pattern": NAMESPACE_PATTERN},
                    },
                }
            ),
            "peering": _obj(
                {
                    "enabled": {"type": "boolean"},
                    "name": {"type": "string", "pattern": K8S_NAME},
                    "create": {"type": "boolean"},
                }
            ),
            "config": config_schema(),
            "statusIntervalSeconds": {"type": "number", "minimum": 0},
            "shard": {"type": "string", "pattern": "^([^=]+=[^=]+)?$"},
            "logLevel": {"type": "string", "enum": ["DEBUG", "INFO", "WARNING", "ERROR"]},
            "logFormat": {"type": "string", "enum": ["text", "json"]},
            "metrics": _obj(
                {
                    "port": _PORT,
                    "service": _obj(
                        {
                            "enabled": {"type": "boolean"},
                            "type": {
                                "type": "string",
                                "enum": ["ClusterIP", "NodePort", "LoadBalancer"],
                            },
                            "port": _PORT,
                            "annotations": _STRING_MAP,
                        }
                    ),
                    "serviceMonitor": monitor,
                    "podMonitor": monitor,
                }
            ),
            "grafanaDashboard": _obj(
                {
                    "enabled": {"type": "boolean"},
                    "namespace": {"type": "string"},
                    "labels": _STRING_MAP,
                    "annotations": _STRING_MAP,
                }
            ),
            "podDisruptionBudget": _obj(
                {
                    "enabled": {"type": "boolean"},
                    "minAvailable": {"type": ["integer", "string"]},
                }
            ),
            "serviceAccount": _obj(
                {
                    "create": {"type": "boolean"},
                    "name": {"type": "string"},
                    "annotations": _STRING_MAP,
                }
            ),
            "rbac": _obj(
                {"create": {"type": "boolean"}, "podAnnotationPolicy": {"type": "boolean"}}
            ),
            "resources": _ANY_OBJECT,
            "podSecurityContext": _ANY_OBJECT,
            "securityContext": _ANY_OBJECT,
            "tmpSizeLimit": {"type": "string"},
            "reportsSizeLimit": {"type": "string"},
            "livenessProbe": _probe(),
            "readinessProbe": _probe(),
            "startupProbe": _probe(),
            "podAnnotations": _STRING_MAP,
            "podLabels": _STRING_MAP,
            "priorityClassName": {"type": "string"},
            "nodeSelector": _STRING_MAP,
            "tolerations": _ANY_ARRAY,
            "affinity": _ANY_OBJECT,
            "topologySpreadConstraints": _ANY_ARRAY,
            "extraEnv": _ANY_ARRAY,
            "extraVolumes": _ANY_ARRAY,
            "extraVolumeMounts": _ANY_ARRAY,
        },
    }


def generated() -> dict[Path, str]:
    """Path -> text of every generated file of the chart."""
    files = {
        CHART / "values.schema.json": json.dumps(values_schema(), indent=2) + "\n",
    }
    for name, text in generated_files().items():
        files[CHART / "crds" / name] = text
    files[CHART / "files" / "planner-dashboard.json"] = DASHBOARD.read_text(encoding="utf-8")
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    return sync_generated(generated(), check=args.check, command="python deploy/helm/generate.py")


if __name__ == "__main__":
    sys.exit(main())
