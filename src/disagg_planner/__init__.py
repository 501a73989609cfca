"""The application: configuration, command line, decision core, reconcile loop, operator,
exporter and reports.

It is the only layer that imports all the others; the decision core in ``disagg_planner.core`` stays
free of I/O so the same code runs live, in replay and in tests.
"""

__version__ = "0.1.0"
