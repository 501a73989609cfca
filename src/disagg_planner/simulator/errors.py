"""Errors the simulator raises for bad input.

``simulator`` may not import ``disagg_planner.errors``; the command line maps these classes onto its
own exit codes with ``disagg_planner.errors.register_foreign_error``.
"""

from __future__ import annotations


class SimulatorInputError(ValueError):
    """Something the user gave the simulator is wrong (a name, a spec string, a workload)."""


class CatalogueError(SimulatorInputError):
    """An unknown GPU or model name, or a malformed catalogue entry."""


class EngineSpecError(SimulatorInputError):
    """A malformed engine spec string such as ``sim:llama-3.1-8b-fp8@h200_sxm:tp1``."""


class WorkloadError(SimulatorInputError):
    """A malformed workload spec or request."""


class ProfilingError(SimulatorInputError):
    """A profiling sweep could not run (bad endpoint, unusable measurements)."""
