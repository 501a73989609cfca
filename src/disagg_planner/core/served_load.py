"""Served load: a scale-up the model asks for waits where the replicas running have been
seen serving that load comfortably.

The feed-forward sizing orders replicas ahead of a load from the profile; where the profile
underrates the engines (a faster GPU clock, a prompt mix that batches better than the
profiling's), it asks for more than the load needs, and the next tick's observed margin
takes them back: a flap per interval of the load. The observation it aims at says so
first: the feedback memory keeps each fast window a role's ready replicas served within its
SLO with no backlog, for an hour (:meth:`disagg_planner.core.feedback.FeedbackMemory.serve`,
:data:`disagg_planner.core.feedback.SERVED_HISTORY` windows). When the
current replicas were seen carrying at least the load the tick sizes for, per replica, with
the role's tail under :data:`disagg_planner.core.feedback.STABILISATION_MARGIN` of its SLO
(half of it: room to spare, not just within), that load is proven to be served by them and
the model's call for more yields to it. A load above anything they were seen serving, or
served only near the SLO, goes by the model.

No I/O, no clock.
"""

from __future__ import annotations

from disagg_planner.core.feedback import STABILISATION_MARGIN, Served
from disagg_planner.core.rules import RuleValue


def served_holds(
    role: str,
    *,
    current: int,
    sized: int,
    load_tokens_per_s: float,
    proven: Served | None,
    margin: float = STABILISATION_MARGIN,
) -> RuleValue:
    """``current`` when the sizing asks ``role`` for more (``sized``) and ``proven`` (the
    highest load per replica its replicas served with the tail under ``margin`` of its SLO,
    :data:`STABILISATION_MARGIN` unless given) times ``current`` carries
    ``load_tokens_per_s``; 0 (no rule) otherwise.

    >>> seen = Served(at_s=600.0, per_replica=30000.0, replicas=2, ratio=0.4)
    >>> served_holds("prefill", current=2, sized=3, load_tokens_per_s=55000.0, proven=seen).value
    2.0
    >>> served_holds("prefill", current=2, sized=3, load_tokens_per_s=65000.0, proven=seen).value
    0.0
    """
    if sized <= current or current <= 0 or proven is None or load_tokens_per_s <= 0:
        return RuleValue(0.0, "")
    if proven.ratio > margin or proven.per_replica * current < load_tokens_per_s:
        return RuleValue(0.0, "")
    return RuleValue(
        float(current),
        f"{role}: held at {current}, not {sized}: {proven.replicas} replica(s) served "
        f"{proven.per_replica * proven.replicas:.0f} tok/s at {proven.at_s:.0f} s with the "
        f"tail at {proven.ratio:.0%} of its SLO; {current} carry the "
        f"{load_tokens_per_s:.0f} tok/s sized for at that rate (the model's call for more "
        f"yields to a load served with the tail under {margin:.0%} of its SLO)",
    )
