"""The ``status.conditions`` schema both of our CRDs carry (PlannerPolicy and PlannerPool).

Its own module because ``operator.crd`` generates the PlannerPool CRD from ``operator.pool``,
and ``operator.pool`` needs this schema: kept in either, the two would import each other.
"""

from __future__ import annotations

from typing import Any


def conditions_schema() -> dict[str, Any]:
    """``status.conditions``: Kubernetes' condition list, keyed by type."""
    return {
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": {
            "type": "object",
            "required": ["type", "status"],
            "properties": {
                "type": {"type": "string"},
                "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                "reason": {"type": "string"},
                "message": {"type": "string"},
                "lastTransitionTime": {"type": "string", "format": "date-time"},
            },
        },
    }
