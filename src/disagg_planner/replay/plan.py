"""What the policies of one replay share: the plan :func:`disagg_planner.replay.session.prepare`
makes, which the references' searches (:mod:`disagg_planner.replay.bounds`), the reports
(:mod:`disagg_planner.replay.report`) and the parallel runner read. Its own module so that
those read it without importing the session that builds them."""

from __future__ import annotations

from dataclasses import dataclass

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.profiles import Profile
from disagg_planner.replay.oracle import WindowNeed
from disagg_planner.replay.runner import ClusterSetup
from disagg_planner.simulator.request import RequestLike


@dataclass(frozen=True)
class ReplayPlan:
    """Everything the policies of one replay share."""

    config: PlannerConfig
    profile: Profile | None
    setup: ClusterSetup
    requests: list[RequestLike]
    needs: list[WindowNeed]
