"""Scoring a replay: SLO attainment, latency percentiles, GPU-hours, scale actions and flaps,
and the files every figure can be recomputed from (requests.csv, timeline.csv)."""

from __future__ import annotations

import csv
import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from disagg_planner.replay.replay_summary import Attainment, Percentiles, ReplaySummary
from disagg_planner.report.elements import fmt_target
from disagg_planner.simulator.request import RequestRecord
from disagg_planner.simulator.startup import STARTUP_PHASES

REQUEST_COLUMNS = (
    "arrival_s",
    "isl",
    "osl",
    "first_token_s",
    "finish_s",
    "ttft_ms",
    "itl_ms",
    "ok",
)


# A flap is a reversal of a role's desired replicas within this many seconds of the change
# before it: one wall-clock window for every policy, whatever its own interval, so a policy
# that decides often is not excused for reversing often.
FLAP_WINDOW_S = 600.0


@dataclass(frozen=True)
class TimelineRow:
    """The deployment from ``t_s`` until the next row's ``t_s`` (the last row closes the
    metered span), so integrating ``gpus_in_use`` over the rows gives ``gpu_hours``."""

    t_s: float
    desired: dict[str, int]
    ready: dict[str, int]
    gpus_in_use: int
    decision: str  # the replicas asked for, "" when nothing changed
    reason: str
    message: str = ""
    # every replica that exists (and is metered): starting, ready or draining
    replicas: dict[str, int] = field(default_factory=dict)
    starting: dict[str, int] = field(default_factory=dict)
    draining: dict[str, int] = field(default_factory=dict)
    # of the starting ones, how many are in each start-up phase (simulator/startup.py), per
    # role; all zero under a constant --startup-delay, which has no phases
    startup_phases: dict[str, dict[str, int]] = field(default_factory=dict)
    # "start" (t = 0), "tick" (the policy decided), "state" (a replica started, became ready,
    # began draining or stopped between ticks) or "end" (the last request finished)
    event: str = "tick"
    # the elastic-EP role only (empty otherwise): its engine's serving DP size, and whether a
    # resize pauses it (1) at this instant
    dp: dict[str, int] = field(default_factory=dict)
    paused: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Reversal:
    """One flap: a change of ``role``'s desired replicas by ``first_by`` at ``first_s``,
    reversed by the next change (``second_by``, the other sign) at ``second_s``, within the
    flap window."""

    role: str
    first_s: float
    first_by: int
    second_s: float
    second_by: int


@dataclass
class ScaleLog:
    """Every change of a role's desired replicas, to count actions and flaps."""

    changes: dict[str, list[tuple[float, int]]] = field(default_factory=dict)

    def add(self, t_s: float, role: str, before: int, after: int) -> None:
        if after != before:
            self.changes.setdefault(role, []).append((t_s, after - before))

    def actions(self) -> dict[str, int]:
        return {role: len(c) for role, c in self.changes.items()}

    def reversals(self, window_s: float = FLAP_WINDOW_S) -> list[Reversal]:
        """Direction reversals of a role's desired replicas at most ``window_s`` seconds after
        the change they reverse, in time order: the flaps, each with its two changes."""
        out = [
            Reversal(role, t0, d0, t1, d1)
            for role, changes in self.changes.items()
            for (t0, d0), (t1, d1) in itertools.pairwise(changes)
            if (d0 > 0) != (d1 > 0) and t1 - t0 <= window_s
        ]
        return sorted(out, key=lambda r: (r.first_s, r.role))

    def flaps(self, window_s: float = FLAP_WINDOW_S) -> dict[str, int]:
        """How many :meth:`reversals` each role that changed made."""
        out = dict.fromkeys(self.changes, 0)
        for reversal in self.reversals(window_s):
            out[reversal.role] += 1
        return out


def percentiles(values: Sequence[float]) -> Percentiles:
    if not values:
        return Percentiles(None, None, None, None)
    arr = np.asarray(values, dtype=float)
    p50, p90, p95, p99 = np.percentile(arr, [50, 90, 95, 99])
    return Percentiles(float(p50), float(p90), float(p95), float(p99))


@dataclass(frozen=True)
class RequestScore:
    """What the requests' outcomes say: the first figures of ``summary.json``."""

    requests: int  # submitted
    completed: int
    failed: int
    slo_attainment: Attainment
    ttft_ms: Percentiles  # observed
    itl_ms: Percentiles  # observed


def score_requests(
    records: Sequence[RequestRecord], *, submitted: int, ttft_slo_ms: float, itl_slo_ms: float
) -> RequestScore:
    """Attainment over every submitted request: one that failed or never finished misses
    both targets. A one-token answer has no ITL and meets the ITL target."""
    ok = [r for r in records if r.ok]
    ttft_ok = sum(1 for r in ok if r.ttft_ms is not None and r.ttft_ms <= ttft_slo_ms)
    itl_ok = sum(1 for r in ok if r.itl_ms is None or r.itl_ms <= itl_slo_ms)
    both_ok = sum(
        1
        for r in ok
        if r.ttft_ms is not None
        and r.ttft_ms <= ttft_slo_ms
        and (r.itl_ms is None or r.itl_ms <= itl_slo_ms)
    )
    denominator = max(submitted, 1)
    return RequestScore(
        requests=submitted,
        completed=len(ok),
        failed=submitted - len(ok),
        slo_attainment=Attainment(
            ttft=ttft_ok / denominator, itl=itl_ok / denominator, both=both_ok / denominator
        ),
        ttft_ms=percentiles([r.ttft_ms for r in ok if r.ttft_ms is not None]),
        itl_ms=percentiles([r.itl_ms for r in ok if r.itl_ms is not None]),
    )


def write_requests_csv(
    path: Path,
    records: Iterable[RequestRecord],
    *,
    dp_at: Callable[[float], int] | None = None,
) -> None:
    """One line per request. ``dp_at`` (an elastic-EP replay: the elastic engine's serving
    DP size at a time) adds ``dp_at_arrival`` and ``error`` (why a request failed, e.g. the
    503 of a resize's pause)."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(REQUEST_COLUMNS + (("dp_at_arrival", "error") if dp_at else ()))
        for r in sorted(records, key=lambda r: (r.arrival_s, r.request_id)):
            extra = [dp_at(r.arrival_s), r.error or ""] if dp_at is not None else []
            writer.writerow(
                [
                    f"{r.arrival_s:.6f}",
                    r.isl,
                    r.osl,
                    "" if r.first_token_s is None else f"{r.first_token_s:.6f}",
                    f"{r.finish_s:.6f}",
                    "" if r.ttft_ms is None else f"{r.ttft_ms:.3f}",
                    "" if r.itl_ms is None else f"{r.itl_ms:.3f}",
                    int(r.ok),
                    *extra,
                ]
            )


def write_timeline_csv(path: Path, rows: Sequence[TimelineRow], roles: Sequence[str]) -> None:
    """One line per row; an elastic-EP role adds ``dp_ROLE`` and ``paused_ROLE``."""
    elastic = [r for r in roles if any(r in row.dp for row in rows)]
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            ["t_s"]
            + [f"desired_{r}" for r in roles]
            + [f"ready_{r}" for r in roles]
            + [f"starting_{r}" for r in roles]
            + [f"draining_{r}" for r in roles]
            + [f"replicas_{r}" for r in roles]
            + [f"{p}_{r}" for p in STARTUP_PHASES for r in roles]
            + [f"dp_{r}" for r in elastic]
            + [f"paused_{r}" for r in elastic]
            + ["gpus_in_use", "event", "decision", "reason", "message"]
        )
        for row in rows:
            writer.writerow(
                # microseconds: at milliseconds a long replay's integral drifts visibly
                [f"{row.t_s:.6f}"]
                + [row.desired.get(r, 0) for r in roles]
                + [row.ready.get(r, 0) for r in roles]
                + [row.starting.get(r, 0) for r in roles]
                + [row.draining.get(r, 0) for r in roles]
                + [row.replicas.get(r, 0) for r in roles]
                + [row.startup_phases.get(p, {}).get(r, 0) for p in STARTUP_PHASES for r in roles]
                + [row.dp.get(r, 0) for r in elastic]
                + [row.paused.get(r, 0) for r in elastic]
                + [row.gpus_in_use, row.event, row.decision, row.reason, row.message]
            )


def finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def summary_table(rows: Sequence[ReplaySummary]) -> str:
    """A short text table of several policies' summaries (printed at the end of a run);
    ``meets target`` says whether each policy's share of requests within both SLOs reaches
    the attainment target it was scored against (``-``: it says none)."""
    header = (
        "policy",
        "SLO both",
        "meets target",
        "TTFT p99 ms",
        "ITL p99 ms",
        "GPU-h",
        "x oracle",
        "x static",
        "actions",
    )
    lines = ["  ".join(f"{h:>12}" for h in header)]
    for s in rows:
        refs = s.references
        lines.append(
            "  ".join(
                f"{v:>12}"
                for v in (
                    s.policy,
                    f"{s.slo_attainment.both:.2%}",
                    _verdict(s),
                    _fmt(s.ttft_ms.p99),
                    _fmt(s.itl_ms.p99),
                    f"{s.gpu_hours:.2f}",
                    _ratio(None if refs is None else refs.gpu_hours_ratio_to_oracle),
                    _ratio(None if refs is None else refs.gpu_hours_ratio_to_best_static),
                    sum(s.scale_actions.values()),
                )
            )
        )
    return "\n".join(lines)


def _verdict(summary: ReplaySummary) -> str:
    slo, meets = summary.slo, summary.meets_target
    if slo is None or meets is None:
        return "-"
    return f"{'yes' if meets else 'no'} ({fmt_target(slo.attainment_target)})"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"
