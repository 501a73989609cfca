"""The clairvoyant oracle: a replica plan that knows the whole trace, judged by simulation.

For each window of ``window_s`` seconds the oracle needs the fewest prefill and decode
replicas (or aggregated ones) such that a simulation of that window, with its true requests
and the queue carried in from the previous window under the counts already chosen, meets
the SLO target (:func:`plan_feasible`). Its search starts from a cheap estimate
(:func:`plan_needs`: the window's request rate and mean ISL/OSL against the engine model's
capacity, :func:`disagg_planner.simulator.oracle.capacity`), climbs one replica at a time
while the window misses too often (the role whose target is missed more first), then tries
one fewer of each role it did not have to add.

Judging a window: the search keeps the simulated cluster at the window's start. A candidate
runs a copy of it (:func:`disagg_planner.simulator.oracle.fork`) through the window and then,
on a second copy, to the end of every request arrived so far. The misses it *adds* are the
misses predicted then over every request arrived so far, minus those predicted when the
previous window was chosen (so a candidate that lets the carried backlog wait longer pays for
it, and a request already late when the window starts does not count against it). It may add
at most ``floor((1 - target) * n)`` misses for the window's ``n`` servable requests, plus the
misses earlier windows were allowed and did not add (the target holds over the whole trace,
as a static deployment's does: a burst may spend what a quiet minute saved), plus its
unservable ones (:class:`LoneLimits`: a prompt too long to meet the TTFT target, or a context
too long to meet the ITL target, even alone on an idle cluster, misses at any replica count;
a request rejected on arrival is not counted at all). A candidate is dropped as soon as it has
added more than that, so most rejected candidates cost a fraction of a window. The chosen
candidate's cluster at the window's end starts the next window (a window's search keeps the
clusters of its latest complete runs only, and simulates the chosen one again where it is not
among them, so its memory does not grow with the number of candidates tried).

:class:`OraclePolicy` runs the plan in the replay simulator like any policy: at time ``t`` it
holds the largest need over every window that ``[t, t + startup_delay]`` touches, so a
replica a window needs is ordered one startup delay ahead and ready when the window starts,
as the search assumed (:func:`initial_replicas`: what the first startup delay needs is ready
at time 0).
"""

from __future__ import annotations

import bisect
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from disagg_planner.replay.policies import PolicyStep
from disagg_planner.replay.search import (
    ClusterFactory,
    LoneLimits,
    MissTally,
    SearchLog,
    Slo,
)
from disagg_planner.simulator import oracle as capacity_model
from disagg_planner.simulator.cluster import Cluster
from disagg_planner.simulator.engine_spec import EngineSpec
from disagg_planner.simulator.request import RequestLike, RequestRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WindowNeed:
    start_s: float
    rate_rps: float
    mean_isl: float
    mean_osl: float
    replicas: dict[str, int]


def _round2(x: float) -> int:
    """Two significant digits: capacity barely changes within them, and caching works."""
    if x <= 0:
        return 1
    digits = max(0, math.floor(math.log10(x)) - 1)
    return int(round(x, -digits))


# The oracle meets the TTFT target for this share of requests (the SLO attainment a good
# policy is held to), not merely on average.
ORACLE_TTFT_QUANTILE = 0.99


@lru_cache(maxsize=4096)
def _capacity(
    spec: EngineSpec, isl: int, osl: int, ttft_ms: float, itl_ms: float, bw: float
) -> capacity_model.EngineCapacity:
    return capacity_model.capacity(
        spec,
        isl=isl,
        osl=osl,
        ttft_ms=ttft_ms,
        itl_ms=itl_ms,
        kv_transfer_bandwidth_bps=bw,
        ttft_quantile=ORACLE_TTFT_QUANTILE,
    )


def plan_needs(
    requests: Iterable[RequestLike],
    *,
    specs: dict[str, EngineSpec],
    mode: str,
    window_s: float,
    duration_s: float,
    ttft_ms: float,
    itl_ms: float,
    floors: dict[str, int],
    kv_transfer_bandwidth_bps: float,
) -> list[WindowNeed]:
    """Replicas each window needs for its true load (see the module doc)."""
    n_windows = max(1, math.ceil(duration_s / window_s))
    count = [0] * n_windows
    isl_sum = [0.0] * n_windows
    osl_sum = [0.0] * n_windows
    for r in requests:
        k = min(int(r.arrival_s // window_s), n_windows - 1)
        count[k] += 1
        isl_sum[k] += r.input_length
        osl_sum[k] += r.output_length
    needs: list[WindowNeed] = []
    for k in range(n_windows):
        rate = count[k] / window_s
        isl = isl_sum[k] / count[k] if count[k] else 0.0
        osl = osl_sum[k] / count[k] if count[k] else 0.0
        replicas: dict[str, int] = {}
        if count[k]:
            if mode == "agg":
                cap = _capacity(
                    specs["agg"],
                    _round2(isl),
                    _round2(osl),
                    ttft_ms,
                    itl_ms,
                    kv_transfer_bandwidth_bps,
                )
                # an aggregated engine time-shares both phases: capacities combine harmonically
                per = (
                    1.0 / (1.0 / cap.prefill_rps + 1.0 / cap.decode_rps)
                    if cap.prefill_rps > 0 and cap.decode_rps > 0
                    else 0.0
                )
                replicas["agg"] = capacity_model.replicas_needed(rate, per)
            else:
                cap_p = _capacity(
                    specs["prefill"],
                    _round2(isl),
                    _round2(osl),
                    ttft_ms,
                    itl_ms,
                    kv_transfer_bandwidth_bps,
                )
                cap_d = _capacity(
                    specs["decode"],
                    _round2(isl),
                    _round2(osl),
                    ttft_ms,
                    itl_ms,
                    kv_transfer_bandwidth_bps,
                )
                replicas["prefill"] = capacity_model.replicas_needed(rate, cap_p.prefill_rps)
                replicas["decode"] = capacity_model.replicas_needed(rate, cap_d.decode_rps)
        for role, floor in floors.items():
            replicas[role] = max(replicas.get(role, 0), floor)
        needs.append(WindowNeed(k * window_s, rate, isl, osl, replicas))
    return needs


# Window-end clusters a window's search keeps (see _Window.states).
KEPT_STATES = 2


@dataclass
class _Trial:
    """One candidate's run through one window (see the module doc)."""

    counts: tuple[int, ...]
    complete: bool  # ran the window and its drain; False: dropped early
    added: int  # misses it adds to the plan's prediction
    allowed: int
    stopped_s: float  # when it was dropped (inf when complete)
    tally: MissTally
    finished_misses: int = 0  # misses among requests finished by the window's end
    predicted_misses: int = 0  # misses predicted over every request arrived so far

    @property
    def ok(self) -> bool:
        return self.complete and self.added <= self.allowed

    def better_than(self, other: _Trial) -> bool:
        """Closer to qualifying: complete with fewer added misses, or dropped later."""
        if self.complete != other.complete:
            return self.complete
        if self.complete:
            return self.added < other.added
        return self.stopped_s > other.stopped_s + 1e-9


@dataclass(frozen=True)
class WindowChoice:
    """What the search chose for one window, and what it took."""

    start_s: float
    requests: int
    estimate: dict[str, int]
    replicas: dict[str, int]
    added_misses: int
    allowed_misses: int
    unservable: int  # requests no replica count serves within the targets
    trials: int
    met: bool  # False: no count tried qualified (the window is infeasible, or saturated)


@dataclass(frozen=True)
class FeasiblePlan:
    windows: list[WindowChoice]
    wall_s: float

    @property
    def trials(self) -> int:
        return sum(w.trials for w in self.windows)

    def needs(self, estimate: Sequence[WindowNeed]) -> list[WindowNeed]:
        """The plan as window needs (what :class:`OraclePolicy` runs)."""
        return [
            WindowNeed(e.start_s, e.rate_rps, e.mean_isl, e.mean_osl, dict(w.replicas))
            for e, w in zip(estimate, self.windows, strict=True)
        ]


@dataclass
class _Window:
    """The search state of one window: the cluster at its start and the plan's misses."""

    base: Cluster
    requests: Sequence[RequestLike]
    end_s: float
    slo: Slo
    roles: tuple[str, ...]
    finished_misses: int  # among requests finished before the window starts
    predicted_misses: int  # predicted, when the previous window was chosen
    limits: LoneLimits
    slack: int  # misses earlier windows were allowed and did not add
    trials: dict[tuple[int, ...], _Trial] = field(default_factory=dict)
    runs: int = 0
    pace: SearchLog = field(default_factory=SearchLog)
    label: str = "a window"  # how its progress line names it
    # The clusters at the window's end of the latest complete trials, at most KEPT_STATES
    # (the one chosen is nearly always among them; another is simulated again): a search
    # that tries hundreds of counts must not hold a cluster for each.
    states: OrderedDict[tuple[int, ...], Cluster] = field(default_factory=OrderedDict)

    def trial(self, counts: tuple[int, ...], *, stop_early: bool = True) -> _Trial:
        known = self.trials.get(counts)
        if known is not None and (known.complete or stop_early):
            return known
        self.runs += 1
        result = self._run(counts, stop_early=stop_early)
        self.trials[counts] = result
        if self.pace.due():
            log.info(
                "oracle plan: %s, %d candidate runs in it so far (the latest %s), %.0f s elapsed",
                self.label,
                self.runs,
                counts,
                self.pace.elapsed_s,
            )
        return result

    def state_of(self, chosen: _Trial) -> Cluster:
        """The cluster at the window's end under ``chosen`` (a complete trial)."""
        state = self.states.get(chosen.counts)
        if state is None:
            again = self._run(chosen.counts, stop_early=False)  # deterministic: same trial
            assert again.added == chosen.added, "the simulator is not deterministic"
            state = self.states[chosen.counts]
        return state

    def _keep(self, counts: tuple[int, ...], state: Cluster) -> None:
        self.states[counts] = state
        self.states.move_to_end(counts)
        while len(self.states) > KEPT_STATES:
            self.states.popitem(last=False)

    def _run(self, counts: tuple[int, ...], *, stop_early: bool) -> _Trial:
        cluster = capacity_model.fork(self.base)
        for role, n in zip(self.roles, counts, strict=True):
            cluster.set_replicas(role, n)
        cluster.submit(self.requests)
        n = len(self.requests)
        unservable = self.limits.unservable_count(self.requests)
        tally = MissTally(self.slo, self.limits)
        carried = self.finished_misses - self.predicted_misses
        slack = self.slack

        def over(records: Sequence[RequestRecord]) -> bool:
            tally.add(records)
            # exact: misses only grow, and the allowance only shrinks
            return stop_early and carried + tally.misses > tally.allowance(n, unservable) + slack

        stopped = capacity_model.run_watched(cluster, self.end_s, over)
        finished = self.finished_misses + tally.misses
        drain = cluster
        if not stopped:
            drain = capacity_model.fork(cluster)
            stopped = capacity_model.run_watched(drain, math.inf, over)
        if not stopped:
            self._keep(counts, cluster)
        return _Trial(
            counts,
            complete=not stopped,
            added=carried + tally.misses,
            allowed=tally.allowance(n, unservable) + slack,
            stopped_s=drain.now if stopped else math.inf,
            tally=tally,
            finished_misses=finished,
            predicted_misses=self.finished_misses + tally.misses,
        )


def _search_window(
    window: _Window, start: tuple[int, ...], lower: tuple[int, ...], cap: tuple[int, ...]
) -> _Trial:
    """The fewest replicas for one window (see the module doc)."""
    counts = start
    current = window.trial(counts)
    added: set[int] = set()
    while not current.ok:
        step = _climb(window, counts, current, cap)
        if step is None:
            break
        counts, current, role = step
        added.add(role)
    if not current.ok:
        # Saturated: no count within reach qualifies; keep the best complete run.
        return window.trial(counts, stop_early=False)
    for i in range(len(counts)):
        if i in added:
            continue  # one fewer was tried on the way up
        counts, current = _descend(window, counts, current, i, lower[i])
    return current


def _descend(
    window: _Window, counts: tuple[int, ...], current: _Trial, i: int, low: int
) -> tuple[tuple[int, ...], _Trial]:
    """The fewest replicas of role ``i`` (at least ``low``) that still qualify, from
    ``counts`` (which do): one fewer, then twice as many fewer at each step while they
    qualify, then halving the gap between the last count that did and the first that did not.
    An estimate far above the need (a window of long prompts under a tight TTFT target is
    estimated at hundreds of replicas) costs a few dozen runs, not one per replica."""
    step = 1
    bad = low - 1  # the largest count known not to qualify (none yet: below the floor)
    while counts[i] > low:
        fewer = _bump(counts, i, -min(step, counts[i] - low))
        trial = window.trial(fewer)
        if not trial.ok:
            bad = fewer[i]
            break
        counts, current = fewer, trial
        step *= 2
    while counts[i] - bad > 1:
        middle = _bump(counts, i, (bad - counts[i]) // 2)
        trial = window.trial(middle)
        if trial.ok:
            counts, current = middle, trial
        else:
            bad = middle[i]
    return counts, current


def _bump(counts: tuple[int, ...], i: int, delta: int) -> tuple[int, ...]:
    return (*counts[:i], counts[i] + delta, *counts[i + 1 :])


def _climb(
    window: _Window, counts: tuple[int, ...], current: _Trial, cap: tuple[int, ...]
) -> tuple[tuple[int, ...], _Trial, int] | None:
    """One more replica of the role that helps: the one whose target is missed more first.
    When no single step gets closer with early dropping, compare complete runs; None when
    that does not help either (more replicas do not serve the misses)."""
    tally = current.tally
    order = list(range(len(counts)))
    if len(counts) == 2 and tally.itl_misses > tally.ttft_misses:
        order.reverse()  # (prefill, decode): decode first when ITL is missed more
    options = [(i, _bump(counts, i, 1)) for i in order if counts[i] + 1 <= cap[i]]
    for i, more in options:
        trial = window.trial(more)
        if trial.ok or trial.better_than(current):
            return more, trial, i
    full = window.trial(counts, stop_early=False)
    best: tuple[tuple[int, ...], _Trial, int] | None = None
    for i, more in options:
        trial = window.trial(more, stop_early=False)
        if trial.added < (best[1] if best else full).added:
            best = (more, trial, i)
    return best


def plan_feasible(
    requests: Sequence[RequestLike],
    *,
    estimate: Sequence[WindowNeed],
    build: ClusterFactory,
    window_s: float,
    slo: Slo,
    floors: Mapping[str, int],
    limits: LoneLimits | None = None,
) -> FeasiblePlan:
    """The oracle's plan: per window, the fewest replicas that meet ``slo`` in simulation
    (see the module doc). ``requests`` sorted by arrival; ``estimate`` from
    :func:`plan_needs` (one entry per window, the search's starting point); ``limits``
    from :func:`lone_limits` (none: every request counts as servable)."""
    wall0 = time.perf_counter()
    roles = tuple(estimate[0].replicas)
    lower = tuple(max(1, floors.get(r, 0)) for r in roles)
    arrivals = [r.arrival_s for r in requests]
    n = len(estimate)
    first = tuple(max(lo, estimate[0].replicas[r]) for lo, r in zip(lower, roles, strict=True))
    base = build(dict(zip(roles, first, strict=True)))
    finished = predicted = slack = 0
    limits = limits or LoneLimits()
    choices: list[WindowChoice] = []
    pace = SearchLog()
    log.info(
        "oracle plan: searching the replicas of %d windows of %g s (%d requests), "
        "a line every %g s",
        n,
        window_s,
        len(requests),
        pace.every_s,
    )
    for k, guess in enumerate(estimate):
        lo = bisect.bisect_left(arrivals, k * window_s) if k else 0
        last = k == n - 1
        hi = len(arrivals) if last else bisect.bisect_left(arrivals, (k + 1) * window_s)
        end = max((k + 1) * window_s, arrivals[-1] if last else 0.0)
        window = _Window(
            base, requests[lo:hi], end, slo, roles, finished, predicted, limits, slack,
            pace=pace, label=f"window {k + 1} of {n}",
        )  # fmt: skip
        start = tuple(max(m, guess.replicas[r]) for m, r in zip(lower, roles, strict=True))
        cap = tuple(4 * s + 8 for s in start)
        chosen = _search_window(window, start, lower, cap)
        base = window.state_of(chosen)
        finished, predicted = chosen.finished_misses, chosen.predicted_misses
        slack = max(0, chosen.allowed - chosen.added)
        choices.append(
            WindowChoice(
                start_s=k * window_s,
                requests=hi - lo,
                estimate=dict(zip(roles, start, strict=True)),
                replicas=dict(zip(roles, chosen.counts, strict=True)),
                added_misses=chosen.added,
                allowed_misses=chosen.allowed,
                unservable=limits.unservable_count(window.requests),
                trials=window.runs,
                met=chosen.ok,
            )
        )
        if pace.due():
            done = k + 1
            log.info(
                "oracle plan: window %d of %d, %d candidate runs, %.0f s elapsed, "
                "about %.0f s left",
                done,
                n,
                sum(c.trials for c in choices),
                pace.elapsed_s,
                pace.elapsed_s * (n - done) / done,
            )
        log.debug(
            "oracle window %d: %d requests, estimate %s, chose %s (%d trials)",
            k,
            hi - lo,
            start,
            chosen.counts,
            window.runs,
        )
    return FeasiblePlan(choices, time.perf_counter() - wall0)


def initial_replicas(
    needs: Sequence[WindowNeed], *, window_s: float, lead_s: float
) -> dict[str, int]:
    """Replicas to start with: what the first ``lead_s`` seconds need (a warm deployment)."""
    return _max_over(needs, 0.0, lead_s, window_s)


def _max_over(needs: Sequence[WindowNeed], t0: float, t1: float, window_s: float) -> dict[str, int]:
    first = max(0, int(t0 // window_s))
    last = min(len(needs) - 1, int(t1 // window_s))
    chosen = needs[first : last + 1] or needs[-1:]
    roles = chosen[0].replicas.keys()
    return {role: max(n.replicas[role] for n in chosen) for role in roles}


class _PlanPolicy:
    """A per-window plan run at set times: each wake sets the replicas ``_target`` gives
    (the subclass's), written only where they change."""

    name: str
    _times: list[float]
    _i: int = 0

    def next_wakeup_s(self) -> float:
        return self._times[self._i] if self._i < len(self._times) else math.inf

    def wake(self, cluster: Cluster) -> PolicyStep:
        now = cluster.now
        while self._i < len(self._times) and self._times[self._i] <= now + 1e-9:
            self._i += 1
        target = self._target(now)
        changed = any(target[r] != cluster.desired_replicas(r) for r in target)
        return PolicyStep(now, target if changed else None, self.name)

    def _target(self, now: float) -> dict[str, int]:
        raise NotImplementedError


class OraclePolicy(_PlanPolicy):
    """Runs the clairvoyant plan: at each window boundary, and one startup delay before it."""

    def __init__(self, needs: Sequence[WindowNeed], *, window_s: float, startup_delay_s: float):
        self.name = "oracle"
        self.needs = list(needs)
        self.window_s = window_s
        self.delay = startup_delay_s
        # ready at time 0: what the first startup delay needs, as the plan assumed
        self.initial_replicas = initial_replicas(self.needs, window_s=window_s, lead_s=self.delay)
        times = set()
        for k in range(len(self.needs) + 1):
            times.add(k * window_s)
            if k * window_s - startup_delay_s > 0:
                times.add(k * window_s - startup_delay_s)
        self._times = sorted(times)

    def _target(self, now: float) -> dict[str, int]:
        return _max_over(self.needs, now, now + self.delay + 1e-6, self.window_s)


# How long after a window begins a controller that reacts to what it observes can know the
# window's need: one fast check (the default fast-check interval).
REACTIVE_DETECTION_S = 15.0


class ReactiveOraclePolicy(_PlanPolicy):
    """The clairvoyant plan's needs, each ordered only once its window has begun (one fast
    check in, ``detection_s``), none ahead: a controller that sizes exactly to each
    minute's load as it is seen, with no model error, no headroom and no term for the
    backlog a late order leaves (each window's need is the one it has starting empty),
    whose orders serve one startup delay later. A yardstick for what reacting costs, not a
    bound: where a rise no trend foretells (a step, a first burst) outruns the start-up, it
    loses what a controller sized to the observed load loses; a controller that also drains
    the backlog loses less, and only capacity held ahead (a bigger static deployment, the
    oracle's foresight) avoids the loss. Starts with the replicas the other policies start
    with."""

    def __init__(
        self,
        needs: Sequence[WindowNeed],
        *,
        window_s: float,
        detection_s: float = REACTIVE_DETECTION_S,
    ):
        self.name = "reactive-oracle"
        self.needs = list(needs)
        self.window_s = window_s
        self._times = [k * window_s + detection_s for k in range(len(self.needs))]

    def _target(self, now: float) -> dict[str, int]:
        # the last window whose need has been seen (its wake passed)
        k = min(len(self.needs) - 1, max(0, self._i - 1))
        return dict(self.needs[k].replicas)
