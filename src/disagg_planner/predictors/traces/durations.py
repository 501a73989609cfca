"""Durations written as ``600``, ``600s``, ``10m``, ``1.5h`` or ``2d``: one parser for the
trace options (``servegen:...,start=1d``) and the synthetic workload specs of the simulator."""

from __future__ import annotations

import math

DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
DURATION_HINT = "seconds, e.g. 600, 10m, 1.5h, 2d"


def parse_seconds(text: str) -> float:
    """The seconds ``text`` names; ValueError (saying what was expected) if it is not a
    finite duration >= 0."""
    t = text.strip().lower()
    scale = 1.0
    if t and t[-1] in DURATION_UNITS:
        scale = DURATION_UNITS[t[-1]]
        t = t[:-1]
    try:
        value = float(t) * scale
    except ValueError:
        raise ValueError(f"expected {DURATION_HINT}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"expected a finite duration >= 0 ({DURATION_HINT})")
    return value
