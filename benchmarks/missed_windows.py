"""Where a run's missed requests arrived, window by window: the speed sweep's first breach and
recovery are read from these windows, and the scorecard prints their account beside a missed
attainment target.

Requests are scored by arrival in fixed windows (60 s by default) with the summary's own
:func:`disagg_planner.replay.summary.score_requests`, so a request that failed or never
finished misses, as it does in the run's attainment. A run of consecutive windows under the
bar is a breach span; the cause names the span that lost the most requests, the arrival rate
in it against the window before it, and the first scale-up ordered in it with the time its
replicas were ready: whether the load outran a start-up (the order came, late) or no order came.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Loaded by a test as a file, this folder is not on sys.path for its sibling (scorecard's note).
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.append(str(Path(__file__).resolve().parent))

from excess_gpu_hours import Row

from disagg_planner.replay.summary import score_requests

WINDOW_S = 60.0


@dataclass(frozen=True)
class WindowScore:
    """The requests that arrived in ``[start_s, start_s + window_s)``, and how many met both
    SLOs."""

    start_s: float
    offered: int
    met: int

    @property
    def missed(self) -> int:
        return self.offered - self.met

    @property
    def attainment(self) -> float:
        return self.met / self.offered if self.offered else 1.0


def window_scores(
    arrivals: Sequence[float],
    records: Sequence[Any],
    *,
    ttft_ms: float,
    itl_ms: float,
    window_s: float = WINDOW_S,
) -> list[WindowScore]:
    """One score per ``window_s`` window from 0 to the last arrival: ``arrivals`` are every
    submitted request's, ``records`` the outcomes of those that finished or failed."""
    if not arrivals:
        return []
    n = int(max(arrivals) // window_s) + 1
    offered = [0] * n
    for t in arrivals:
        offered[int(t // window_s)] += 1
    done: list[list[Any]] = [[] for _ in range(n)]
    for r in records:
        done[min(int(r.arrival_s // window_s), n - 1)].append(r)
    scores = []
    for i in range(n):
        met = 0
        if offered[i]:
            score = score_requests(
                done[i], submitted=offered[i], ttft_slo_ms=ttft_ms, itl_slo_ms=itl_ms
            )
            met = round(score.slo_attainment.both * offered[i])
        scores.append(WindowScore(i * window_s, offered[i], met))
    return scores


def breach_and_recovery(
    scores: Sequence[WindowScore], *, target: float
) -> tuple[float | None, float | None]:
    """(start of the first window whose requests meet the SLO less often than ``target``;
    start of the first later window that meets it again), None where there is none. A window
    with no arrivals says nothing."""
    breach = None
    for w in scores:
        if not w.offered:
            continue
        ok = w.attainment >= target
        if breach is None and not ok:
            breach = w.start_s
        elif breach is not None and ok:
            return breach, w.start_s
    return breach, None


@dataclass(frozen=True)
class Span:
    """Consecutive windows under the bar (empty windows inside it kept)."""

    windows: tuple[WindowScore, ...]

    @property
    def start_s(self) -> float:
        return self.windows[0].start_s

    def end_s(self, window_s: float) -> float:
        return self.windows[-1].start_s + window_s

    @property
    def missed(self) -> int:
        return sum(w.missed for w in self.windows)


def breach_spans(scores: Sequence[WindowScore], *, target: float) -> list[Span]:
    """The runs of consecutive windows whose attainment is under ``target``."""
    spans: list[Span] = []
    run: list[WindowScore] = []
    for w in scores:
        if w.offered and w.attainment < target:
            run.append(w)
        elif w.offered and run:
            spans.append(Span(tuple(run)))
            run = []
    if run:
        spans.append(Span(tuple(run)))
    return spans


def where_missed(
    scores: Sequence[WindowScore],
    timeline: Sequence[Row],
    *,
    target: float,
    window_s: float = WINDOW_S,
) -> str:
    """One sentence: the share of the missed requests that arrived in the costliest breach
    span, the rate in it against the window before, and the first scale-up ordered in it (the
    role, the counts and when they were ready); empty when no request missed."""
    total = sum(w.missed for w in scores)
    if total <= 0:
        return ""
    spans = breach_spans(scores, target=target)
    if not spans:
        return f"{total} missed requests, no {window_s:.0f} s window under {target:.2%}"
    worst = max(spans, key=lambda s: s.missed)
    start, end = worst.start_s, worst.end_s(window_s)
    rate = sum(w.offered for w in worst.windows) / (end - start)
    before = [w for w in scores if w.start_s == start - window_s]
    head = (
        f"{worst.missed / total:.0%} of the {total} missed requests arrived in "
        f"{start:.0f}-{end:.0f} s ({len(spans)} span(s) of {window_s:.0f} s windows under "
        f"{target:.2%}), at {rate:.1f} req/s"
        + (f" after {before[0].offered / window_s:.1f} in the window before" if before else "")
    )
    return f"{head}: {_first_scale_up(timeline, start, end)}"


def _first_scale_up(timeline: Sequence[Row], start_s: float, end_s: float) -> str:
    """The first decision in ``[start_s, end_s)`` that raised a role, and when that role was
    first ready at the raised count."""
    desired: dict[str, int] = {}
    for i, row in enumerate(timeline):
        raised = [r for r, n in row.desired.items() if n > desired.get(r, n)]
        if row.event == "tick" and row.decision and raised and start_s <= row.t_s < end_s:
            role = raised[0]
            to = row.desired[role]
            ready = next(
                (later.t_s for later in timeline[i:] if later.ready.get(role, 0) >= to), None
            )
            when = f"ready at {ready:.0f} s" if ready is not None else "never ready in the run"
            return (
                f"the first scale-up in it, at {row.t_s:.0f} s, took {role} "
                f"{desired[role]} -> {to} ({when})"
            )
        desired.update(row.desired)
    return "no scale-up was ordered in it"
