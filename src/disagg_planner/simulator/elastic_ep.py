"""Elastic expert parallelism in the simulator: one scheduled resize of one replica.

How long a resize takes, per mode and direction, is a fact about the engine and lives in
:mod:`disagg_planner.profiles.elastic_resize` (the planner plans with the same numbers); this
module only plays it (:meth:`Cluster.resize_dp`): a grow's follower ranks start and join
first (their GPUs held), the replica keeps serving during that and the preparation, serves
nothing during the downtime, then serves at the new size. What vLLM does with a request that
arrives during the downtime is answer it 503 (:data:`PAUSE_REJECTED`): the simulator fails
it with ``Cluster(retry_paused=False)``; a frontend that retries (the cluster's default)
resends it after the pause. On a shrink vLLM pauses the removed ranks with ``mode="abort"``:
the requests running there fail (:data:`SHRINK_ABORTED`), not moved, unless the engine
drains first (``Cluster.shrink_drains_first``; the drain's own 503 window is not played).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from disagg_planner.profiles import elastic_resize
from disagg_planner.profiles.elastic_resize import ElasticEpMode, timing
from disagg_planner.profiles.errors import ProfileError
from disagg_planner.simulator.errors import SimulatorInputError

# ``timing`` is read through this module by the cluster, with ``mode`` below.
__all__ = [
    "PAUSE_REJECTED",
    "SHRINK_ABORTED",
    "ElasticEpMode",
    "ResizePlan",
    "dp_at",
    "mode",
    "timing",
]

# The error of a request a paused engine answered (vLLM's 503 while it scales).
PAUSE_REJECTED = "rejected: HTTP 503, the engine is paused for an elastic-EP resize"
# The error of a request running on a rank an elastic-EP shrink removed (vLLM aborts it).
SHRINK_ABORTED = "aborted: its rank was removed by an elastic-EP shrink"


def mode(name: str) -> ElasticEpMode:
    """:func:`disagg_planner.profiles.elastic_resize.mode`; an unknown name is bad input to
    the simulator, reported as such."""
    try:
        return elastic_resize.mode(name)
    except ProfileError as exc:
        raise SimulatorInputError(str(exc)) from exc


@dataclass(frozen=True)
class ResizePlan:
    """One scheduled resize of one replica."""

    worker_id: str
    from_dp: int
    to_dp: int
    mode: str
    start_s: float  # the resize itself starts (after a grow's followers have joined)
    downtime_start_s: float
    end_s: float
    requested_s: float | None = None  # when it was asked for (None: at ``start_s``)

    @property
    def downtime_s(self) -> float:
        return self.end_s - self.downtime_start_s

    @property
    def followers_ready_s(self) -> float:
        """How long the added ranks took to start and join before the resize began."""
        return 0.0 if self.requested_s is None else self.start_s - self.requested_s


def dp_at(plans: Sequence[ResizePlan], t_s: float, *, initial: int) -> int:
    """The DP size serving at ``t_s`` of one replica whose resizes are ``plans`` (in the
    order made) and whose size before the first was ``initial``: a resize counts from its
    end, when the new topology serves."""
    dp = initial
    for plan in plans:
        if plan.end_s <= t_s:
            dp = plan.to_dp
        else:
            break
    return dp
