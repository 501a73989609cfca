"""Scripted policies for replay tests."""

from __future__ import annotations

import math

from disagg_planner.replay.policies import PolicyStep
from disagg_planner.simulator.cluster import Cluster


class ScaleDecodeAt:
    """Scales decode to ``n`` replicas at ``at_s`` (a policy for the replay runner)."""

    name = "scale-at"

    def __init__(self, at_s: float, n: int) -> None:
        self.at_s, self.n, self.done = at_s, n, False

    def next_wakeup_s(self) -> float:
        return math.inf if self.done else self.at_s

    def wake(self, cluster: Cluster) -> PolicyStep:
        self.done = True
        return PolicyStep(cluster.now, {"decode": self.n}, "test")
