"""The engine factory: the one place that picks which engine model times a spec.

An ``sim:`` spec is timed by the calibrated roofline (:class:`EngineModel`), an ``aic:`` spec
by AIConfigurator's measured tables (:class:`AicEngineModel`). Every part of the simulator
that builds an engine from a spec (the cluster, the profiler, the oracle, the calibration)
builds it here, so none of them needs to know which one it asked for.
"""

from __future__ import annotations

from disagg_planner.simulator.aic_engine import AicEngineModel
from disagg_planner.simulator.catalogue import Efficiency
from disagg_planner.simulator.engine_model import EngineModel
from disagg_planner.simulator.engine_spec import EngineSpec, coerce


def engine_for(spec: EngineSpec | str, *, efficiency: Efficiency | None = None) -> EngineModel:
    """The engine model of ``spec`` (parsed or its string form): AIConfigurator's tables for
    an ``aic:`` spec (the ``[aic]`` extra; refused with how to install it when absent), the
    calibrated roofline otherwise."""
    parsed = coerce(spec)
    if parsed.timing == "aic":
        return AicEngineModel(parsed, efficiency=efficiency)
    return EngineModel(parsed, efficiency=efficiency)


__all__ = ["engine_for"]
