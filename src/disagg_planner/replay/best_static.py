"""The cheapest static deployment that meets the SLO target: the number a user compares an
autoscaler with first.

A static policy keeps the same replicas from time 0 (ready then, as a deployment sized in
advance is) to the end. A candidate *qualifies* when it meets the target over the requests
some deployment can serve (:class:`disagg_planner.replay.oracle.LoneLimits`: those that miss
even alone on an idle cluster, and those rejected on arrival, are left out; on most traces
there are none, and qualifying is meeting the target). The search simulates the whole trace
for each candidate, dropping it as soon as more requests have missed than that allows (misses
only accumulate, so the verdict is exact, and an undersized candidate usually fails at its
first peak, long before the trace ends). Qualifying is taken as monotone in each role's
replicas:

1. ``upper``, every window's need of the oracle plan at once (each window met the target with
   those counts or fewer), is presumed to qualify: with decode held there, a binary search
   finds the fewest prefill replicas that qualify; then, with that prefill, the fewest
   decode replicas (for an aggregated deployment, one binary search on its one role);
2. the result is simulated unless it already was (it is ``upper`` itself only when every
   smaller count failed); when it does not qualify, the role whose target is missed more
   grows by a quarter (at least one), up to ``growth_limit`` times ``upper``, and the search
   starts again from there.

The result qualifies (or, when nothing up to the limit does, is the largest tried, marked
``qualifies=False``). Presuming ``upper`` saves simulating it in full where a smaller count
qualifies, which is the rule. Holding one role
generous while searching the other can miss a cheaper trade between the two; with prefill
and decode engines of the same GPU count such trades cost the same.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from disagg_planner.replay.policies import StaticPolicy
from disagg_planner.replay.search import ClusterFactory, LoneLimits, MissTally, SearchLog, Slo
from disagg_planner.simulator import oracle as probes
from disagg_planner.simulator.request import RequestLike, RequestRecord

log = logging.getLogger(__name__)

GROWTH_LIMIT = 4


@dataclass(frozen=True)
class StaticTrial:
    replicas: dict[str, int]
    qualifies: bool
    misses: int  # all of them (rejections apart) when it qualifies; when dropped, until then


@dataclass(frozen=True)
class BestStatic:
    replicas: dict[str, int]
    qualifies: bool
    trials: list[StaticTrial] = field(default_factory=list)
    wall_s: float = 0.0


@dataclass
class _Search:
    requests: Sequence[RequestLike]
    build: ClusterFactory
    roles: tuple[str, ...]
    slo: Slo
    limits: LoneLimits
    trials: dict[tuple[int, ...], StaticTrial] = field(default_factory=dict)
    tallies: dict[tuple[int, ...], MissTally] = field(default_factory=dict)

    pace: SearchLog = field(default_factory=SearchLog)

    def meets(self, counts: tuple[int, ...]) -> bool:
        known = self.trials.get(counts)
        if known is None:
            known = self.trials[counts] = self._run(counts)
            if self.pace.due():
                log.info(
                    "best static: %d deployments simulated, the latest %s, %.0f s elapsed",
                    len(self.trials),
                    known.replicas,
                    self.pace.elapsed_s,
                )
        return known.qualifies

    def _run(self, counts: tuple[int, ...]) -> StaticTrial:
        replicas = dict(zip(self.roles, counts, strict=True))
        cluster = self.build(replicas)
        cluster.submit(self.requests)
        n = len(self.requests)
        unservable = self.limits.unservable_count(self.requests)
        tally = self.tallies[counts] = MissTally(self.slo, self.limits)

        def over(records: Sequence[RequestRecord]) -> bool:
            tally.add(records)
            return tally.misses > tally.allowance(n, unservable)

        # steps of a minute: a check costs a pass over the engines, a drop comes soon enough
        dropped = probes.run_watched(cluster, math.inf, over, step_s=60.0)
        return StaticTrial(replicas, not dropped, tally.misses)

    def smallest(self, counts: tuple[int, ...], i: int, low: int) -> tuple[int, ...]:
        """Fewest replicas of role ``i`` (at least ``low``) that qualify, the other roles as
        in ``counts``, which is presumed to (and returned unchecked when nothing less does)."""
        bad, good = low - 1, counts[i]
        while good - bad > 1:
            mid = (bad + good) // 2
            if self.meets(_with(counts, i, mid)):
                good = mid
            else:
                bad = mid
        return _with(counts, i, good)


def _with(counts: tuple[int, ...], i: int, n: int) -> tuple[int, ...]:
    return (*counts[:i], n, *counts[i + 1 :])


def search_best_static(
    requests: Sequence[RequestLike],
    *,
    build: ClusterFactory,
    upper: Mapping[str, int],
    lower: Mapping[str, int],
    slo: Slo,
    limits: LoneLimits | None = None,
    growth_limit: int = GROWTH_LIMIT,
) -> BestStatic:
    """The cheapest static replicas qualifying for ``slo`` (see the module doc). ``build``
    makes a cluster ready with the given replicas at time 0; ``upper`` is where the search
    starts (e.g. the oracle plan's peak), ``lower`` the fewest replicas a role may have;
    ``limits`` from :func:`disagg_planner.replay.oracle.lone_limits` (none: every request
    counts as servable)."""
    wall0 = time.perf_counter()
    roles = tuple(upper)
    search = _Search(requests, build, roles, slo, limits or LoneLimits())
    counts = tuple(max(1, lower.get(r, 1), upper[r]) for r in roles)
    limit = tuple(growth_limit * c for c in counts)
    while True:
        for i, role in enumerate(roles):
            counts = search.smallest(counts, i, max(1, lower.get(role, 1)))
        if search.meets(counts):
            return _result(search, counts, wall0)
        tally = search.tallies[counts]
        grow = 1 if len(roles) == 2 and tally.itl_misses > tally.ttft_misses else 0
        order = [grow] + [i for i in range(len(roles)) if i != grow]
        for i in order:
            if counts[i] < limit[i]:
                counts = _with(counts, i, min(limit[i], counts[i] + max(1, counts[i] // 4)))
                break
        else:
            return _result(search, counts, wall0)


def _result(search: _Search, counts: tuple[int, ...], wall0: float) -> BestStatic:
    return BestStatic(
        replicas=dict(zip(search.roles, counts, strict=True)),
        qualifies=search.meets(counts),
        trials=list(search.trials.values()),
        wall_s=time.perf_counter() - wall0,
    )


class BestStaticPolicy(StaticPolicy):
    """The search's replicas as a policy, ready at time 0 (``initial_replicas``), as the
    search simulated them."""

    def __init__(self, replicas: Mapping[str, int]) -> None:
        super().__init__(replicas)
        self.name = "best-static"
        self.initial_replicas = dict(replicas)
