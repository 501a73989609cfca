"""The shell around the decision core: one async reconcile loop per deployment.

``DeploymentLoop`` (:mod:`disagg_planner.runtime.loop`) owns the clock and every per-tick I/O
(connector, Prometheus, FPM, gauges, diagnostics); ``planner run`` drives one
(:func:`disagg_planner.runtime.service.serve`), ``planner operator`` one per policy object.
"""

from disagg_planner.runtime.clock import Clock, WallClock
from disagg_planner.runtime.loop import DeploymentLoop, DeploymentRef, EngineSource
from disagg_planner.runtime.outcome import Problem, ProblemKind, TickOutcome

__all__ = [
    "Clock",
    "DeploymentLoop",
    "DeploymentRef",
    "EngineSource",
    "Problem",
    "ProblemKind",
    "TickOutcome",
    "WallClock",
]
