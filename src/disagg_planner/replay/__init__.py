"""Offline replay: the planner and baseline policies against the simulated cluster, driven by
a trace or a generated workload.

Replay is a second clock and a second connector, not a second shell: the planner policy
gathers its observation with the live loop's code (:mod:`disagg_planner.runtime`)."""
