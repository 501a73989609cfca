"""Elastic expert parallelism in the simulator: one scheduled resize of one replica.

How long a resize takes, per mode and direction, is a fact about the engine and lives in
:mod:`disagg_planner.profiles.elastic_resize` (the planner plans with the same numbers); this
module only plays it: the replica keeps serving during the preparation, serves nothing
during the downtime, then serves at the new size (:meth:`Cluster.resize_dp`).
"""

from __future__ import annotations

from dataclasses import dataclass

from disagg_planner.profiles import elastic_resize
from disagg_planner.profiles.elastic_resize import ElasticEpMode, timing
from disagg_planner.profiles.errors import ProfileError
from disagg_planner.simulator.errors import SimulatorInputError

# ``timing`` is read through this module by the cluster, with ``mode`` below.
__all__ = ["ResizePlan", "mode", "timing"]


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
    start_s: float
    downtime_start_s: float
    end_s: float

    @property
    def downtime_s(self) -> float:
        return self.end_s - self.downtime_start_s
