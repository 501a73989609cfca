"""Discrete-event model of a disaggregated serving cluster and its engines, used by replay,
profiling sweeps and tests.

It may import the numeric libraries (``predictors``, ``profiles``, ``regression``, ``signals``)
and nothing else of the package (an import-linter contract).
"""
