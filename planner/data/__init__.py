"""Data files bundled with the planner (request traces for replay and benchmarks)."""
