"""Discrete-event model of a disaggregated serving cluster and its engines, used by replay,
profiling sweeps and tests.

It may import the numeric libraries (predictors, interpolation, regression) but never
``planner`` or ``connectors``.
"""
