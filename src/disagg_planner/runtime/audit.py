"""The audit event stream: one log line per tick of a deployment's loop, ``AUDIT {json}``, so
that a log pipeline can follow the planner's decisions without scraping prose.

Each line is ``AUDIT `` followed by one JSON object (keys sorted, no spaces) of the schema
:func:`audit_schema` (committed as ``deploy/audit/audit-event.schema.json``; regenerate with
``python -m disagg_planner.runtime.audit``). ``kind`` is one of :class:`AuditKind`, a stable
enum: values are added, never renamed or removed, and ``schema`` counts incompatible
changes. The lines go to the logger ``disagg_planner.audit`` at the loop's tick log level
(INFO live, DEBUG in replay), so that a deployment can route or silence them alone.

Fields: ``schema`` (1), ``kind``, ``t_s`` (the loop clock's time of the tick, Unix s live,
virtual s in replay), ``namespace``/``name`` (the DGD), ``current`` (desired replicas per
role before the tick, null when unread), ``recommended`` (the loops' target, null when
they recommend none), ``applied`` (what was written), ``held`` (role -> hold reason),
``throughput_reason``/``load_reason`` (the loops' reason enums, null when the loop did not
run), ``advisory``, ``problems`` (``kind``/``reason``/``source``, bounded values) and
``message`` (the decision's sentence, for people).
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any

from disagg_planner.core.types import DeploymentStatus
from disagg_planner.generated import sync_generated
from disagg_planner.runtime.outcome import TickOutcome

AUDIT_LOGGER = "disagg_planner.audit"
AUDIT_PREFIX = "AUDIT "
SCHEMA_VERSION = 1
SCHEMA_FILE = Path("deploy/audit/audit-event.schema.json")

log = logging.getLogger(AUDIT_LOGGER)


class AuditKind(StrEnum):
    """What a tick did to its deployment (stable: values are only ever added)."""

    SCALE_UP = "scale_up"  # some role raised, none lowered
    SCALE_DOWN = "scale_down"  # some role lowered, none raised
    REBALANCE = "rebalance"  # one role raised, another lowered
    HOLD = "hold"  # nothing to change
    BLOCKED = "blocked"  # a change was recommended and not written (hold, advisory, failure)
    FAILED = "failed"  # the tick could not decide (deployment unread, tick error)


def _direction(status: DeploymentStatus, replicas: Mapping[str, int]) -> AuditKind:
    ups = any(n > status.desired(r) for r, n in replicas.items() if r in status.roles)
    downs = any(n < status.desired(r) for r, n in replicas.items() if r in status.roles)
    if ups and downs:
        return AuditKind.REBALANCE
    return AuditKind.SCALE_UP if ups else AuditKind.SCALE_DOWN if downs else AuditKind.HOLD


def audit_kind(outcome: TickOutcome) -> AuditKind:
    """The kind of one tick: what was written, else whether a change was wanted."""
    status = outcome.status
    if status is None or outcome.effects is None:
        return AuditKind.FAILED
    written = _direction(status, outcome.applied)
    if written is not AuditKind.HOLD:
        return written
    wanted = _direction(status, outcome.scale_to or {})
    return AuditKind.HOLD if wanted is AuditKind.HOLD else AuditKind.BLOCKED


def audit_event(outcome: TickOutcome, *, namespace: str, name: str) -> dict[str, Any]:
    """The audit event of one tick (a JSON-ready dict of the schema)."""
    status = outcome.status
    return {
        "schema": SCHEMA_VERSION,
        "kind": audit_kind(outcome).value,
        "t_s": outcome.t_s,
        "namespace": namespace,
        "name": name,
        "current": {r: s.desired for r, s in status.roles.items()} if status else None,
        "recommended": dict(outcome.scale_to) if outcome.scale_to else None,
        "applied": dict(outcome.applied),
        "held": dict(outcome.held),
        "throughput_reason": outcome.throughput_reason,
        "load_reason": outcome.load_reason,
        "advisory": outcome.advisory,
        "problems": [
            {"kind": p.kind.value, "reason": p.reason, "source": p.source} for p in outcome.problems
        ],
        "message": outcome.message,
    }


def audit_line(event: Mapping[str, Any]) -> str:
    """``AUDIT `` and the event as one line of compact, key-sorted JSON."""
    return AUDIT_PREFIX + json.dumps(event, sort_keys=True, separators=(",", ":"))


def log_audit(outcome: TickOutcome, *, namespace: str, name: str, level: int) -> None:
    """Write the tick's audit line to the audit logger (nothing when it is off at ``level``)."""
    if log.isEnabledFor(level):
        log.log(level, "%s", audit_line(audit_event(outcome, namespace=namespace, name=name)))


def audit_schema() -> dict[str, Any]:
    """The JSON schema (draft 2020-12) of one event, the enum from :class:`AuditKind`."""
    replicas = {
        "type": ["object", "null"],
        "additionalProperties": {"type": "integer", "minimum": 0},
    }
    reason = {"type": ["string", "null"]}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://planner.autoscaling.dev/schemas/audit-event.schema.json",
        "title": "Planner audit event",
        "description": "One tick of one deployment's planner loop, logged as 'AUDIT {json}' "
        "(generated from disagg_planner.runtime.audit; do not edit).",
        "type": "object",
        "additionalProperties": False,
        "required": [
            "schema",
            "kind",
            "t_s",
            "namespace",
            "name",
            "current",
            "recommended",
            "applied",
            "held",
            "throughput_reason",
            "load_reason",
            "advisory",
            "problems",
            "message",
        ],
        "properties": {
            "schema": {"const": SCHEMA_VERSION},
            "kind": {"enum": [k.value for k in AuditKind]},
            "t_s": {"type": "number"},
            "namespace": {"type": "string"},
            "name": {"type": "string"},
            "current": replicas,
            "recommended": replicas,
            "applied": {"type": "object", "additionalProperties": {"type": "integer"}},
            "held": {"type": "object", "additionalProperties": {"type": "string"}},
            "throughput_reason": reason,
            "load_reason": reason,
            "advisory": {"type": "boolean"},
            "problems": {
                "type": "array",
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["kind", "reason", "source"],
                    "properties": {
                        "kind": {"type": "string"},
                        "reason": {"type": "string"},
                        "source": {"type": "string"},
                    },
                },
            },
            "message": {"type": "string"},
        },
    }


def schema_text() -> str:
    return json.dumps(audit_schema(), indent=2, sort_keys=True) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the audit event JSON schema.")
    parser.add_argument("--root", type=Path, default=Path("."), help="repository root")
    parser.add_argument("--check", action="store_true", help="fail if the file is stale")
    args = parser.parse_args(argv)
    return sync_generated(
        {args.root / SCHEMA_FILE: schema_text()},
        check=args.check,
        command="python -m disagg_planner.runtime.audit",
    )


if __name__ == "__main__":
    raise SystemExit(main())
