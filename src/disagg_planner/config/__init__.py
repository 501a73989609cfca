"""The planner's configuration: one schema (``PlannerConfig``), its loader and its flags."""

from disagg_planner.config.loader import LoadedConfig, load_config
from disagg_planner.config.schema import PlannerConfig

__all__ = ["LoadedConfig", "PlannerConfig", "load_config"]
