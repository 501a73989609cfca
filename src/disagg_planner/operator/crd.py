"""The ``PlannerPolicy`` CustomResourceDefinition, generated from :class:`PlannerConfig`.

Group ``planner.autoscaling.dev``, version ``v1alpha1``, kind ``PlannerPolicy`` (plural
``plannerpolicies``, short name ``plp``), namespaced. A policy's ``spec`` holds planner
settings under the same keys as a config file (field names, plus Dynamo's alias spellings)
and ``targetRef`` naming the DynamoGraphDeployment in the policy's own namespace. Four
fields are not in the spec because the operator sets them: ``environment`` (always
``kubernetes``), ``dgd_name`` (``targetRef.name``), ``kubernetes_namespace`` (the policy's
namespace) and ``metric_reporting_prometheus_port`` (one port per operator process).

The schema carries no defaults on purpose: a default written into every stored object by the
API server would override the operator's own settings (its ``--config``, environment and
flags), which rank below the policy. Defaults are named in the descriptions instead.

Also generated: kopf's peering CRDs (``kopf.dev/v1`` ``KopfPeering`` namespaced and
``ClusterKopfPeering``), which the operator's leader election needs.

``python -m disagg_planner.operator.crd`` writes the YAML under ``deploy/crds``; ``--check`` fails
when the committed files differ from what the schema generates.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from disagg_planner.config.loader import field_names_by_key
from disagg_planner.config.schema import PlannerConfig
from disagg_planner.generated import sync_generated
from disagg_planner.operator.conditions import conditions_schema
from disagg_planner.operator.pool import POOL_PLURAL, pool_crd

GROUP = "planner.autoscaling.dev"
VERSION = "v1alpha1"
KIND = "PlannerPolicy"
PLURAL = "plannerpolicies"
SINGULAR = "plannerpolicy"
SHORT_NAMES = ("plp",)
API_VERSION = f"{GROUP}/{VERSION}"

# Settings the operator fills in for every policy; a spec may not set them.
OPERATOR_SET_FIELDS: tuple[str, ...] = (
    "environment",
    "dgd_name",
    "kubernetes_namespace",
    "metric_reporting_prometheus_port",
)

TARGET_KIND = "DynamoGraphDeployment"
TARGET_API_VERSION = "nvidia.com/v1alpha1"

PEERING_GROUP = "kopf.dev"
PEERING_VERSION = "v1"

CRD_FILE = f"{PLURAL}.{GROUP}.yaml"
PEERING_FILE = "kopf-peerings.kopf.dev.yaml"
DEFAULT_OUTPUT_DIR = Path(__file__).resolve().parents[3] / "deploy" / "crds"

# JSON-schema keywords pydantic emits that a structural schema keeps as they are.
_KEPT = frozenset({"type", "description", "enum", "minimum", "maximum", "minLength", "maxLength"})
# Pydantic and our json_schema_extra keys with no place in an OpenAPI schema.
_DROPPED = frozenset({"title", "default", "group", "flags", "env"})


class SchemaError(ValueError):
    """A config field whose JSON schema has no Kubernetes structural equivalent."""


def _structural(field: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    """One field's pydantic JSON schema as an OpenAPI v3 structural schema.

    ``anyOf [X, null]`` becomes X with ``nullable: true``; draft-2020 numeric
    ``exclusiveMinimum: n`` becomes ``minimum: n, exclusiveMinimum: true``; titles, defaults
    and our flag/env metadata are dropped. Anything else raises, naming the field.
    """
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _DROPPED:
            continue
        if key in _KEPT:
            out[key] = value
        elif key == "anyOf":
            options = [o for o in value if o != {"type": "null"}]
            if len(options) != 1 or len(options) == len(value):
                raise SchemaError(f"config field {field}: anyOf {value} is not 'X or null'")
            out.update(_structural(field, options[0]))
            out["nullable"] = True
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            bound = "minimum" if key == "exclusiveMinimum" else "maximum"
            out[bound] = value
            out[key] = True
        elif key == "items":
            out["items"] = _structural(field, value)
        else:
            raise SchemaError(
                f"config field {field}: JSON-schema keyword {key!r} has no mapping to a "
                "Kubernetes structural schema; extend src/disagg_planner/operator/crd.py"
            )
    return out


def _described(schema: dict[str, Any], default: Any, *, alias_of: str | None = None) -> None:
    text = schema.get("description", "")
    if alias_of is not None:
        text = f"Alias of {alias_of} (Dynamo's spelling). {text}"
    if default is not None and default != ():
        shown = default if isinstance(default, str) else json.dumps(default)
        text = f"{text} Default: {shown}."
    schema["description"] = text.strip()


def spec_schema() -> dict[str, Any]:
    """The ``spec`` schema: every config field the policy may set, its aliases, and
    ``targetRef``."""
    config_schema = PlannerConfig.model_json_schema()["properties"]
    properties: dict[str, Any] = {
        "targetRef": {
            "type": "object",
            "description": "The DynamoGraphDeployment this policy scales, in the policy's "
            "namespace.",
            "required": ["name"],
            "properties": {
                "apiVersion": {
                    "type": "string",
                    "enum": [TARGET_API_VERSION],
                    "description": f"API version of the target. Default: {TARGET_API_VERSION}.",
                },
                "kind": {
                    "type": "string",
                    "enum": [TARGET_KIND],
                    "description": f"Kind of the target. Default: {TARGET_KIND}.",
                },
                "name": {
                    "type": "string",
                    "minLength": 1,
                    "description": "Name of the DynamoGraphDeployment.",
                },
            },
        }
    }
    for name, info in PlannerConfig.model_fields.items():
        if name in OPERATOR_SET_FIELDS:
            continue
        schema = _structural(name, config_schema[name])
        _described(schema, info.default)
        properties[name] = schema
    for key, name in sorted(field_names_by_key().items()):
        if key == name or name in OPERATOR_SET_FIELDS:
            continue
        alias = _structural(name, config_schema[name])
        _described(alias, PlannerConfig.model_fields[name].default, alias_of=name)
        properties[key] = alias
    return {
        "type": "object",
        "description": "Planner settings for one DynamoGraphDeployment: the keys of a planner "
        "config file (see `planner config show`), plus targetRef. Unset keys take the "
        "operator's settings (its --config, environment and flags), then the defaults.",
        "required": ["targetRef"],
        "properties": properties,
    }


def _int_map(description: str) -> dict[str, Any]:
    return {
        "type": "object",
        "description": description,
        "additionalProperties": {"type": "integer"},
    }


def status_schema() -> dict[str, Any]:
    """The ``status`` the operator writes (see :mod:`disagg_planner.operator.status`)."""
    number = {"type": "number", "nullable": True}
    return {
        "type": "object",
        "properties": {
            "observedGeneration": {"type": "integer"},
            "lastTickTime": {"type": "string", "format": "date-time"},
            "target": {"type": "string", "description": "namespace/name of the DGD planned."},
            "replicas": {
                "type": "object",
                "description": "Replicas per role as the DGD reports them.",
                "additionalProperties": {
                    "type": "object",
                    "properties": {
                        "desired": {"type": "integer"},
                        "ready": {"type": "integer"},
                        "gpusPerReplica": {"type": "integer"},
                    },
                },
            },
            "replicasSummary": {"type": "string", "description": "ready/desired per role."},
            "lastDecision": {
                "type": "object",
                "properties": {
                    "time": {"type": "string", "format": "date-time"},
                    "reason": {"type": "string"},
                    "scaleTo": _int_map("Replicas the planner recommended."),
                    "applied": _int_map("Replicas written to the deployment."),
                    "held": {
                        "type": "object",
                        "description": "Roles not changed, and why.",
                        "additionalProperties": {"type": "string"},
                    },
                    "advisory": {"type": "boolean"},
                },
            },
            "reasons": {
                "type": "object",
                "properties": {
                    "throughput": {"type": "string", "nullable": True},
                    "load": {"type": "string", "nullable": True},
                },
            },
            "message": {"type": "string"},
            "observed": {
                "type": "object",
                "properties": {
                    "requestsPerSecond": number,
                    "ttftMs": number,
                    "itlMs": number,
                    "inputSequenceTokens": number,
                    "outputSequenceTokens": number,
                },
            },
            "predicted": {
                "type": "object",
                "properties": {
                    "requestsPerSecond": number,
                    "inputSequenceTokens": number,
                    "outputSequenceTokens": number,
                    "estimatedTtftMs": number,
                    "estimatedItlMs": number,
                },
            },
            "lastDegraded": {
                "type": "object",
                "description": "The latest time the planner lacked an input, and what.",
                "properties": {
                    "reason": {"type": "string"},
                    "message": {"type": "string"},
                    "since": {"type": "string", "format": "date-time"},
                    "until": {"type": "string", "format": "date-time"},
                },
            },
            "gpusInUse": {"type": "integer"},
            "gpuHours": {"type": "number"},
            "conditions": conditions_schema(),
        },
    }


PRINTER_COLUMNS: tuple[dict[str, Any], ...] = (
    {"name": "Target", "type": "string", "jsonPath": ".spec.targetRef.name"},
    {"name": "Replicas", "type": "string", "jsonPath": ".status.replicasSummary"},
    {"name": "Reason", "type": "string", "jsonPath": ".status.lastDecision.reason"},
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
    },
    {
        "name": "Degraded",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Degraded")].status',
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1},
)


def policy_crd() -> dict[str, Any]:
    """The PlannerPolicy CRD object."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": ["dynamo"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [dict(c) for c in PRINTER_COLUMNS],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "How the planner scales one DynamoGraphDeployment.",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema(),
                                "status": status_schema(),
                            },
                        }
                    },
                }
            ],
        },
    }


def peering_crds() -> list[dict[str, Any]]:
    """kopf's peering resources: one object per peering name holds each operator replica's
    identity, priority and lease in ``status``."""
    crds = []
    for kind, plural, scope in (
        ("ClusterKopfPeering", "clusterkopfpeerings", "Cluster"),
        ("KopfPeering", "kopfpeerings", "Namespaced"),
    ):
        crds.append(
            {
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": f"{plural}.{PEERING_GROUP}"},
                "spec": {
                    "group": PEERING_GROUP,
                    "scope": scope,
                    "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
                    "versions": [
                        {
                            "name": PEERING_VERSION,
                            "served": True,
                            "storage": True,
                            "schema": {
                                "openAPIV3Schema": {
                                    "type": "object",
                                    "x-kubernetes-preserve-unknown-fields": True,
                                }
                            },
                        }
                    ],
                },
            }
        )
    return crds


_HEADER = (
    "# Generated by `python -m disagg_planner.operator.crd` from "
    "src/disagg_planner/config/schema.py; do not edit.\n"
)


def render(documents: Sequence[Mapping[str, Any]]) -> str:
    """YAML documents, stable key order, with the do-not-edit header."""
    body = "---\n".join(
        yaml.safe_dump(dict(doc), sort_keys=False, width=100, allow_unicode=True)
        for doc in documents
    )
    return _HEADER + body


def generated_files() -> dict[str, str]:
    """File name -> YAML text of every generated CRD file."""
    return {
        CRD_FILE: render([policy_crd()]),
        f"{POOL_PLURAL}.{GROUP}.yaml": render([pool_crd(GROUP, VERSION, _structural)]),
        PEERING_FILE: render(peering_crds()),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m disagg_planner.operator.crd",
        description="Write the PlannerPolicy and kopf peering CRDs generated from the config "
        "schema.",
    )
    parser.add_argument(
        "--output-dir", type=Path, default=DEFAULT_OUTPUT_DIR, help="Default: deploy/crds."
    )
    parser.add_argument(
        "--check", action="store_true", help="Exit 1 if the files differ; write nothing."
    )
    args = parser.parse_args(argv)
    files = {args.output_dir / name: text for name, text in generated_files().items()}
    return sync_generated(files, check=args.check, command="python -m disagg_planner.operator.crd")


if __name__ == "__main__":
    sys.exit(main())
