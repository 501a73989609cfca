"""The throughput reason a tick reports is named by the rule that decided what happened: the
throughput loop's, or the connector hold that kept its change from the deployment."""

from __future__ import annotations

import pytest

from disagg_planner.connectors.base import Hold, HoldReason
from disagg_planner.core.planner import Effects
from disagg_planner.core.types import ThroughputReason
from disagg_planner.runtime.outcome import decided_throughput_reason

TR = ThroughputReason


@pytest.mark.parametrize(
    ("name", "decided", "holds", "reported"),
    [
        ("a change nothing held", TR.SCALE, (), TR.SCALE),
        (
            "a manual edit respected",
            TR.SCALE,
            (HoldReason.MANUAL_OVERRIDE,),
            TR.MANUAL_OVERRIDE_HOLD,
        ),
        ("advisory mode", TR.SCALE, (HoldReason.ADVISORY,), TR.ADVISORY),
        (
            "a virtual decision not acknowledged",
            TR.SCALE,
            (HoldReason.AWAITING_ACKNOWLEDGEMENT,),
            TR.SCALING_IN_PROGRESS,
        ),
        (
            "a budget reconcile while a change from before a restart converges",
            TR.GPU_BUDGET_RECONCILE,
            (HoldReason.AWAITING_CONVERGENCE,),
            TR.SCALING_IN_PROGRESS,
        ),
        ("a drain: the change goes ahead, later", TR.SCALE, (HoldReason.DRAINING,), TR.SCALE),
        (
            "the first held role names it",
            TR.SCALE,
            (HoldReason.DRAINING, HoldReason.MANUAL_OVERRIDE),
            TR.SCALE,
        ),
        (
            "no change asked: a hold names nothing",
            TR.NO_CHANGE,
            (HoldReason.ADVISORY,),
            TR.NO_CHANGE,
        ),
        ("a load-only tick", None, (HoldReason.MANUAL_OVERRIDE,), None),
    ],
)
def test_the_rule_that_decided_names_the_reason(
    name: str,
    decided: ThroughputReason | None,
    holds: tuple[HoldReason, ...],
    reported: ThroughputReason | None,
) -> None:
    effects = Effects(
        now_s=0.0, scale_to={"decode": 3}, next_tick_at_s=60.0, throughput_reason=decided
    )
    roles = ("decode", "prefill")
    held = {role: Hold(role, why, "test") for role, why in zip(roles, holds, strict=False)}
    assert decided_throughput_reason(effects, held) is reported
