"""Offline replay: the planner and baseline policies against the simulated cluster,
driven by a real trace."""
