"""When each loop runs: the throughput and load cadences on one injected clock.

Ticks of both loops that fall within ``MERGE_TOLERANCE_S`` of each other run together, so a
throughput tick and a load tick at (nearly) the same instant see the same observation.

A due throughput tick names the traffic window the shell must read, so that the live loop and
replay read the same window without either re-deriving it from the configuration.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

from disagg_planner.config.schema import PlannerConfig

MERGE_TOLERANCE_S = 0.5


@dataclass(frozen=True)
class TrafficWindow:
    """The frontend traffic a throughput tick reads: ``[start_s, end_s]`` on the shell's clock.

    Kept as end and width (the throughput interval) rather than two instants, so that the
    width an observer is asked for is the interval exactly, not ``end - (end - interval)``
    rounded at Unix-time magnitudes.
    """

    end_s: float
    duration_s: float

    @property
    def start_s(self) -> float:
        return self.end_s - self.duration_s


@dataclass(frozen=True)
class DueTick:
    """The loops one tick runs; ``traffic_window`` is set exactly when the throughput loop runs."""

    at_s: float
    run_throughput: bool
    run_load: bool
    traffic_window: TrafficWindow | None = None
    # the fast path's short window; set exactly when a fast check runs (never together
    # with a throughput tick, which reads the traffic itself)
    fast_window: TrafficWindow | None = None

    @property
    def run_fast(self) -> bool:
        return self.fast_window is not None


class TickSchedule:
    """Next due time of each enabled loop, starting one interval after ``start_s``.

    The fast check (``fast_interval_s``, only beside a throughput loop) runs between
    throughput ticks: a throughput tick restarts its cadence, since it reads the traffic
    itself."""

    def __init__(
        self,
        *,
        start_s: float,
        throughput_interval_s: float | None,
        load_interval_s: float | None,
        fast_interval_s: float | None = None,
    ) -> None:
        if throughput_interval_s is None and load_interval_s is None:
            raise ValueError("at least one loop must be scheduled")
        self.throughput_interval_s = throughput_interval_s
        self.load_interval_s = load_interval_s
        # between throughput ticks only: no fast check as long as the interval itself
        self.fast_interval_s = (
            fast_interval_s
            if throughput_interval_s is not None
            and fast_interval_s is not None
            and fast_interval_s < throughput_interval_s
            else None
        )
        self.next_throughput_s: float | None = None
        self.next_load_s: float | None = None
        self.next_fast_s: float | None = None
        self.start(start_s)

    def start(self, start_s: float) -> None:
        """(Re)start every cadence at ``start_s``: each loop falls due one of its intervals
        later. The live loop starts it again once its set-up is done, so that a set-up that
        waited its turn (a thousand loops starting together) does not leave ticks already
        due."""
        if self.throughput_interval_s is not None:
            self.next_throughput_s = start_s + self.throughput_interval_s
        if self.load_interval_s is not None:
            self.next_load_s = start_s + self.load_interval_s
        if self.fast_interval_s is not None:
            self.next_fast_s = start_s + self.fast_interval_s

    @property
    def next_at_s(self) -> float:
        due = [
            t for t in (self.next_throughput_s, self.next_load_s, self.next_fast_s) if t is not None
        ]
        return min(due)

    def pop_due(self, now_s: float) -> DueTick | None:
        """The tick due at ``now_s`` (advancing the schedule), or None if nothing is due.

        A loop that fell behind (a long pause) runs once and is rescheduled a whole number of
        its intervals after the tick it missed (its phase kept: :func:`_advance`); missed
        ticks are not replayed in a burst.
        """
        limit = now_s + MERGE_TOLERANCE_S
        run_t = self.next_throughput_s is not None and self.next_throughput_s <= limit
        run_l = self.next_load_s is not None and self.next_load_s <= limit
        run_f = self.next_fast_s is not None and self.next_fast_s <= limit
        if not (run_t or run_l or run_f):
            return None
        fast = None
        if self.fast_interval_s is not None:
            if run_t:
                self.next_fast_s = now_s + self.fast_interval_s
            elif run_f:
                assert self.next_fast_s is not None
                self.next_fast_s = _advance(self.next_fast_s, self.fast_interval_s, now_s)
                fast = TrafficWindow(end_s=now_s, duration_s=self.fast_interval_s)
        window = None
        if run_t:
            assert self.next_throughput_s is not None and self.throughput_interval_s is not None
            self.next_throughput_s = _advance(
                self.next_throughput_s, self.throughput_interval_s, now_s
            )
            # The window ends at the tick and spans one interval, even for a tick that runs
            # early or late within the merge tolerance: the forecast is per interval.
            window = TrafficWindow(end_s=now_s, duration_s=self.throughput_interval_s)
        if run_l:
            assert self.next_load_s is not None and self.load_interval_s is not None
            self.next_load_s = _advance(self.next_load_s, self.load_interval_s, now_s)
        return DueTick(
            at_s=now_s,
            run_throughput=run_t,
            run_load=run_l,
            traffic_window=window,
            fast_window=fast,
        )


def _advance(due_s: float, interval_s: float, now_s: float) -> float:
    """The first due time after ``now_s`` (beyond the merge tolerance) a whole number of
    intervals after ``due_s``.

    A loop that fell behind (an API outage, a stalled event loop) keeps its phase instead of
    restarting from ``now_s``: a thousand loops woken together by the end of an outage would
    otherwise all fall due at the same instant ever after, losing the stagger of
    :func:`staggered_start`.
    """
    limit = now_s + MERGE_TOLERANCE_S
    nxt = due_s + interval_s
    if nxt <= limit:
        nxt = due_s + (math.floor((limit - due_s) / interval_s) + 1) * interval_s
        while nxt <= limit:  # float rounding at Unix-time magnitudes
            nxt += interval_s
    return nxt


# --- where in its cadence each deployment's loop ticks (issue 36: a thousand loops in one
# process must not all fall due at the same instant) ---------------------------------------


def stagger_fraction(key: str) -> float:
    """A stable fraction in [0, 1) of ``key``: where in its interval a deployment's reports
    fall (crc32 is stable across processes, unlike ``hash``)."""
    return zlib.crc32(key.encode()) / 2**32


def shortest_cadence_s(config: PlannerConfig) -> float:
    """The shortest interval between two ticks of a loop with ``config``: the throughput
    loop's, the load loop's or the fast check's, of those that run (a fast check not shorter
    than the throughput interval never runs, and would not be the shortest anyway)."""
    intervals = []
    if config.throughput_scaling_active:
        intervals.append(config.throughput_adjustment_interval_seconds)
        if config.fast_check_interval_seconds is not None:
            intervals.append(config.fast_check_interval_seconds)
    if config.load_scaling_active:
        intervals.append(config.load_adjustment_interval_seconds)
    return min(intervals)


def staggered_start(now_s: float, *, key: str, period_s: float) -> float:
    """The latest instant at or before ``now_s`` that lies at ``key``'s phase of
    ``period_s`` (a stable fraction of the deployment's name: :func:`stagger_fraction`).

    A schedule started there ticks first within one ``period_s`` of ``now_s`` (never in the
    past, when ``period_s`` is the shortest cadence) and then always at the same phase of
    the wall clock, whenever the loop was (re)started: loops started together spread their
    ticks evenly over the period instead of all falling due at the same instant.

    >>> staggered_start(1000.0, key="default/g0001", period_s=15.0)
    995.0345264060888
    """
    phase_s = stagger_fraction(key) * period_s
    return now_s - (now_s - phase_s) % period_s
