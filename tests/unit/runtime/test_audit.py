"""Issue 35: the audit event stream. Every line a replay emits is one ``AUDIT {json}`` that
validates against the committed schema; kinds follow what the tick did; the README's
example lines are valid events."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import jsonschema
import pytest

from disagg_planner.cli.main import main
from disagg_planner.core.planner import Effects
from disagg_planner.core.types import DeploymentStatus, RoleStatus
from disagg_planner.runtime.audit import (
    AUDIT_LOGGER,
    AUDIT_PREFIX,
    SCHEMA_FILE,
    AuditKind,
    audit_event,
    audit_kind,
    audit_line,
    schema_text,
)
from disagg_planner.runtime.outcome import Problem, ProblemKind, TickOutcome

ROOT = Path(__file__).resolve().parents[3]
SCHEMA = json.loads((ROOT / SCHEMA_FILE).read_text())


def events_of(lines: list[str]) -> list[dict[str, object]]:
    events = []
    for line in lines:
        assert line.startswith(AUDIT_PREFIX), line
        event = json.loads(line.removeprefix(AUDIT_PREFIX))
        jsonschema.validate(event, SCHEMA)
        events.append(event)
    return events


def test_the_committed_schema_is_current() -> None:
    assert (ROOT / SCHEMA_FILE).read_text() == schema_text(), (
        "run python -m disagg_planner.runtime.audit"
    )


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def audit_lines():
    """The audit logger's lines (its own handler: the CLI replaces the root's handlers)."""
    logger = logging.getLogger(AUDIT_LOGGER)
    handler, level = Lines(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler.lines
    logger.removeHandler(handler)
    logger.setLevel(level)


@pytest.mark.slow
def test_every_line_a_replay_emits_validates(tmp_path: Path, audit_lines: list[str]) -> None:
    argv = [
        "replay",
        "--workload",
        "step:rates=3/45,at=120,duration=300,isl=2000,osl=200",
        "--profile",
        "h200_sxm/vllm/llama-3.1-8b-fp8/tp1",
        "--ttft",
        "300",
        "--itl",
        "20",
        "--policy",
        "planner",
        # one engine of each at the start: the faster engine of issue 31 served the step at
        # 12 req/s on the replicas sized for it up front, so nothing was scaled
        "--initial",
        "prefill=1",
        "--initial",
        "decode=1",
        "--jobs",
        "1",  # in this process, where the handler listens
        "-o",
        str(tmp_path),
    ]
    assert main(argv) == 0
    events = events_of(audit_lines)
    assert len(events) > 10  # one per tick
    kinds = {e["kind"] for e in events}
    assert AuditKind.SCALE_UP.value in kinds  # the step up is followed
    assert kinds <= {k.value for k in AuditKind}


def status(prefill: int, decode: int) -> DeploymentStatus:
    return DeploymentStatus(
        {"prefill": RoleStatus(prefill, prefill, 1), "decode": RoleStatus(decode, decode, 1)}
    )


EFFECTS = Effects(now_s=1.0, scale_to=None, next_tick_at_s=2.0)

KIND_ROWS = [
    # (name, outcome, kind)
    ("nothing recommended: hold", TickOutcome(t_s=1, status=status(1, 1), effects=EFFECTS), "hold"),
    (
        "written up",
        TickOutcome(
            t_s=1,
            status=status(1, 1),
            effects=EFFECTS,
            scale_to={"prefill": 2, "decode": 1},
            applied={"prefill": 2},
        ),
        "scale_up",
    ),
    (
        "written down",
        TickOutcome(
            t_s=1,
            status=status(2, 2),
            effects=EFFECTS,
            scale_to={"prefill": 2, "decode": 1},
            applied={"decode": 1},
        ),
        "scale_down",
    ),
    (
        "one up, one down",
        TickOutcome(
            t_s=1,
            status=status(2, 2),
            effects=EFFECTS,
            scale_to={"prefill": 3, "decode": 1},
            applied={"prefill": 3, "decode": 1},
        ),
        "rebalance",
    ),
    (
        "recommended, held by a manual edit",
        TickOutcome(
            t_s=1,
            status=status(1, 1),
            effects=EFFECTS,
            scale_to={"prefill": 2, "decode": 1},
            held={"prefill": "manual_override"},
        ),
        "blocked",
    ),
    (
        "deployment unread",
        TickOutcome(
            t_s=1,
            problems=(Problem(ProblemKind.CONNECTOR_ERROR, "connector_error", "503", "status"),),
        ),
        "failed",
    ),
]


@pytest.mark.parametrize(
    ("outcome", "kind"), [r[1:] for r in KIND_ROWS], ids=[r[0] for r in KIND_ROWS]
)
def test_the_kind_says_what_the_tick_did(outcome: TickOutcome, kind: str) -> None:
    assert audit_kind(outcome).value == kind
    (event,) = events_of([audit_line(audit_event(outcome, namespace="ns", name="graph"))])
    assert event["kind"] == kind


def test_the_readme_examples_are_valid_events() -> None:
    readme = (ROOT / "README.md").read_text()
    lines = re.findall(r"^AUDIT \{.*\}$", readme, flags=re.MULTILINE)
    assert len(lines) >= 2, "the README's audit section shows two example lines"
    events_of(lines)
