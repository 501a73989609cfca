"""What the comparison page of several replayed policies says, decided from their scores
(pure: summaries, tick reasons and arrivals in, the page's model out; no file, no HTML):

- each policy's **verdict** in one line: whether it meets its SLO attainment target, on how
  many GPU-hours, against the baseline (``hpa`` where it was replayed: what a cluster runs
  without a planner), and the **reason** when it misses: which latency target binds, requests
  that failed, and requests no replica count can serve (the references' idle-cluster check);
- the **winner**, by one stated rule (:data:`WINNER_RULE`), among the policies a user can run
  (the references, :data:`REFERENCE_POLICIES`, plan with the whole trace known: yardsticks,
  not candidates);
- each policy's ticks **tallied by reason** (:func:`disagg_planner.report.decisions.
  count_reasons`);
- the **offered load**: the requests and prompt tokens arriving per window.

:mod:`disagg_planner.replay.comparison` reads the folders and draws the page.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from disagg_planner.errors import SpecError
from disagg_planner.replay.replay_summary import ReplaySummary
from disagg_planner.report.decisions import ReasonCount, count_reasons
from disagg_planner.report.elements import fmt_percent, fmt_target

# The policies that are the references' searches (the parallel runner starts them once those
# are found): clairvoyant, so never named the winner.
REFERENCE_POLICIES = ("oracle", "reactive-oracle", "best-static")
# Each verdict's GPU-hours are compared with this policy's, where it was replayed: the
# Kubernetes autoscaler a cluster runs without a planner.
BASELINE_POLICY = "hpa"
OFFERED_LOAD_WINDOW_S = 60.0


class WinnerRule(enum.StrEnum):
    """Which branch of :data:`WINNER_RULE` named the winner."""

    CHEAPEST_MEETING_TARGET = "cheapest_meeting_target"
    HIGHEST_ATTAINMENT = "highest_attainment"  # no candidate meets its target


WINNER_RULE = (
    "the winner is the policy with the fewest GPU-hours among those that meet their SLO "
    "attainment target (cheapest_meeting_target); if none meets it, the one with the highest "
    "attainment (highest_attainment); ties go to the fewer GPU-hours, then the higher "
    f"attainment. The references ({', '.join(REFERENCE_POLICIES)}) plan with the whole trace "
    "known in advance: they are yardsticks, not candidates."
)


@dataclass(frozen=True)
class Verdict:
    """One policy's line on the page."""

    policy: str
    meets: bool | None  # None: scored without an attainment target
    attainment: float  # share of requests within both latency targets
    target: float | None
    gpu_hours: float
    ratio_to_baseline: float | None  # GPU-hours over the baseline's (None: no baseline)
    line: str  # "meets the 99% target on 1.97 GPU-h, 0.92x hpa"
    reason: str  # why it misses, or what it took to meet


@dataclass(frozen=True)
class Winner:
    policy: str
    rule: WinnerRule
    why: str


@dataclass(frozen=True)
class OfferedLoad:
    """Requests and prompt tokens arriving per window (by the window's start)."""

    t_s: tuple[float, ...]
    requests_per_s: tuple[float, ...]
    prompt_tokens_per_s: tuple[float, ...]
    window_s: float


@dataclass(frozen=True)
class Unservable:
    """Requests that miss the targets even alone on an idle cluster (the references'
    check): no policy serves them, so they cap every policy's attainment."""

    requests: int
    of: int
    target: float  # the attainment target the searches held

    @property
    def share(self) -> float:
        return self.requests / self.of if self.of else 0.0

    @property
    def ceiling(self) -> float:
        """The highest attainment any policy can reach."""
        return 1.0 - self.share

    @property
    def line(self) -> str:
        text = (
            f"{self.requests} of {self.of} requests ({fmt_percent(self.share)}) miss the latency "
            f"targets even alone on an idle cluster: {fmt_percent(self.ceiling)} is the most any "
            "policy reaches"
        )
        if self.ceiling < self.target:
            text += f", under the {fmt_target(self.target)} target: no policy can meet it here"
        return text


@dataclass(frozen=True)
class Comparison:
    """The page's model: verdicts in the policies' order (their colours' order too)."""

    verdicts: tuple[Verdict, ...]
    winner: Winner
    baseline: str | None
    tallies: Mapping[str, tuple[ReasonCount, ...]]
    unservable: Unservable | None  # None: no references, or every request servable


@dataclass(frozen=True)
class TickReason:
    """One tick of a policy's timeline: its reason, and whether it set replicas."""

    reason: str
    changed: bool


def _misses_because(summary: ReplaySummary) -> str:
    """What kept ``summary`` under its target: the latency target(s) below it, failed
    requests, and requests nothing could serve."""
    slo = summary.slo
    assert slo is not None  # called for a verdict of "misses"
    att, target = summary.slo_attainment, slo.attainment_target
    ttft = f"TTFT <= {slo.ttft_target_ms:g} ms for {fmt_percent(att.ttft)}"
    itl = f"ITL <= {slo.itl_target_ms:g} ms for {fmt_percent(att.itl)}"
    if att.ttft < target and att.itl < target:
        parts = [f"both latency targets bind ({ttft}, {itl})"]
    elif att.ttft < target:
        parts = [f"TTFT binds ({ttft}; {itl})"]
    elif att.itl < target:
        parts = [f"ITL binds ({itl}; {ttft})"]
    else:  # each alone passes; the requests missing one differ from those missing the other
        parts = [f"each target alone passes ({ttft}, {itl}), not both on the same requests"]
    if summary.failed:
        parts.append(f"{summary.failed} of {summary.requests} requests failed or never finished")
    return "; ".join(parts)


def verdict_of(summary: ReplaySummary, *, baseline: ReplaySummary | None) -> Verdict:
    """``summary``'s line; ``baseline``: the run its GPU-hours are compared with (None: no
    comparison; the baseline itself gets none)."""
    ratio = None
    if baseline is not None and baseline.policy != summary.policy and baseline.gpu_hours > 0:
        ratio = summary.gpu_hours / baseline.gpu_hours
    cost = f"{summary.gpu_hours:.2f} GPU-h"
    if ratio is not None and baseline is not None:
        cost += f", {ratio:.2f}x {baseline.policy}"
    att = summary.slo_attainment.both
    slo, meets = summary.slo, summary.meets_target
    if slo is None or meets is None:
        line = f"scored without an attainment target: {fmt_percent(att)} within both on {cost}"
        reason = "its summary.json names no SLO target (written before replays recorded one)"
    elif meets:
        line = f"meets the {fmt_target(slo.attainment_target)} target on {cost}"
        reason = (
            f"{fmt_percent(att)} of requests within TTFT {slo.ttft_target_ms:g} ms and ITL "
            f"{slo.itl_target_ms:g} ms"
        )
    else:
        line = (
            f"misses the {fmt_target(slo.attainment_target)} target: {fmt_percent(att)} on {cost}"
        )
        reason = _misses_because(summary)
    return Verdict(
        policy=summary.policy,
        meets=meets,
        attainment=att,
        target=None if slo is None else slo.attainment_target,
        gpu_hours=summary.gpu_hours,
        ratio_to_baseline=ratio,
        line=line,
        reason=reason,
    )


def pick_winner(verdicts: Sequence[Verdict]) -> Winner:
    """The winner by :data:`WINNER_RULE`; among every policy when only references ran."""
    if not verdicts:
        raise SpecError("nothing to compare: give at least one replay output folder")
    candidates = [v for v in verdicts if v.policy not in REFERENCE_POLICIES]
    among = ""
    if not candidates:
        candidates = list(verdicts)
        among = " (only references were replayed: chosen among them)"
    meeting = [v for v in candidates if v.meets]
    if meeting:
        best = min(meeting, key=lambda v: (v.gpu_hours, -v.attainment))
        others = len(meeting) - 1
        why = (
            f"the fewest GPU-hours ({best.gpu_hours:.2f}) of the {len(meeting)} "
            f"polic{'ies' if len(meeting) > 1 else 'y'} meeting the target"
            if others
            else "the only policy meeting the target"
        )
        return Winner(best.policy, WinnerRule.CHEAPEST_MEETING_TARGET, why + among)
    best = max(candidates, key=lambda v: (v.attainment, -v.gpu_hours))
    why = (
        f"no policy meets the target; the highest attainment ({fmt_percent(best.attainment)}, on "
        f"{best.gpu_hours:.2f} GPU-h)"
    )
    return Winner(best.policy, WinnerRule.HIGHEST_ATTAINMENT, why + among)


def compare(
    summaries: Sequence[ReplaySummary], ticks: Mapping[str, Iterable[TickReason]]
) -> Comparison:
    """The page's model of ``summaries`` (in their order) and each policy's ``ticks``."""
    if not summaries:
        raise SpecError("nothing to compare: give at least one replay output folder")
    names = [s.policy for s in summaries]
    if len(set(names)) != len(names):
        repeated = sorted({n for n in names if names.count(n) > 1})
        raise SpecError(
            f"policy {', '.join(repeated)} appears more than once among the folders: expected "
            "each policy's folder once (one summary.json per policy)"
        )
    baseline = next((s for s in summaries if s.policy == BASELINE_POLICY), None)
    verdicts = tuple(verdict_of(s, baseline=baseline) for s in summaries)
    return Comparison(
        unservable=unservable_of(summaries),
        verdicts=verdicts,
        winner=pick_winner(verdicts),
        baseline=None if baseline is None else baseline.policy,
        tallies={
            name: count_reasons((t.reason, t.changed) for t in ticks.get(name, ()))
            for name in names
        },
    )


def unservable_of(summaries: Sequence[ReplaySummary]) -> Unservable | None:
    """The references' count of unservable requests, from the first summary that has one
    (one replay's policies share their references)."""
    for summary in summaries:
        refs = summary.references
        if refs is not None and refs.unservable_requests:
            return Unservable(
                refs.unservable_requests, summary.requests, refs.search_attainment_target
            )
    return None


def offered_load(
    arrival_s: np.ndarray, isl: np.ndarray, *, window_s: float = OFFERED_LOAD_WINDOW_S
) -> OfferedLoad:
    """Requests and prompt tokens per second arriving in each ``window_s`` window, from
    time 0 to the last arrival (an empty window is a zero: no request arrived)."""
    if window_s <= 0:
        raise ValueError(f"window_s {window_s}: expected a positive number of seconds")
    end = float(arrival_s.max()) if len(arrival_s) else 0.0
    count = int(end // window_s) + 1
    index = np.minimum((arrival_s // window_s).astype(int), count - 1)
    requests = np.bincount(index, minlength=count)
    tokens = np.bincount(index, weights=isl, minlength=count)
    return OfferedLoad(
        t_s=tuple(float(k * window_s) for k in range(count)),
        requests_per_s=tuple(float(n) / window_s for n in requests),
        prompt_tokens_per_s=tuple(float(n) / window_s for n in tokens),
        window_s=window_s,
    )
