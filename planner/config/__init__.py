"""The planner's configuration: one schema (``PlannerConfig``), its loader and its flags."""

from planner.config.loader import LoadedConfig, load_config
from planner.config.schema import PlannerConfig

__all__ = ["LoadedConfig", "PlannerConfig", "load_config"]
