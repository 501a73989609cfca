"""Queueing headroom: how busy an engine may run and still meet a latency target for a given
share of requests.

Dynamo sizes prefill at the profiled throughput, i.e. engines at 100 % utilisation, where
queues grow without bound and the TTFT target is met only on average at best. Here an
engine is a single-server queue (GI/G/1) whose service time per request is ``s``; requests
wait ``W`` before their own prefill. Kingman's heavy-traffic approximation gives an
exponential tail

    P(W > t) ~= rho * exp(-2 (1 - rho) t / (s (ca2 + cs2)))

with ``rho`` the utilisation, ``ca2`` and ``cs2`` the squared coefficients of variation of
inter-arrival and service times (1 and 1 for Poisson arrivals and exponential service; a
deterministic service has ``cs2 = 0``). :func:`max_utilisation` inverts it: the largest
``rho`` with ``P(W > slack) <= 1 - quantile``, where ``slack`` is the latency target minus the
request's own service latency. Capacity under the target is then ``rho x`` throughput.

>>> round(max_utilisation(slack_s=0.46, service_s=0.029, quantile=0.99), 2)
0.73
>>> max_utilisation(slack_s=0.0, service_s=0.03, quantile=0.99)
0.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_ARRIVAL_SCV = 1.0
DEFAULT_SERVICE_SCV = 1.0


def wait_tail_probability(
    rho: float,
    *,
    wait_s: float,
    service_s: float,
    arrival_scv: float = DEFAULT_ARRIVAL_SCV,
    service_scv: float = DEFAULT_SERVICE_SCV,
) -> float:
    """Approximate ``P(W > wait_s)`` at utilisation ``rho`` (see the module doc)."""
    if rho <= 0:
        return 0.0
    if rho >= 1:
        return 1.0
    spread = service_s * max(arrival_scv + service_scv, 1e-9)
    return min(1.0, rho * math.exp(-2.0 * (1.0 - rho) * wait_s / spread))


def max_utilisation(
    *,
    slack_s: float,
    service_s: float,
    quantile: float,
    arrival_scv: float = DEFAULT_ARRIVAL_SCV,
    service_scv: float = DEFAULT_SERVICE_SCV,
) -> float:
    """The largest utilisation in [0, 1) whose waiting time exceeds ``slack_s`` for at most
    ``1 - quantile`` of the requests; 0 when no waiting is affordable."""
    if not 0 < quantile < 1:
        raise ValueError(f"quantile must be in (0, 1), got {quantile}")
    if service_s <= 0:
        raise ValueError(f"service_s must be > 0, got {service_s}")
    if slack_s <= 0:
        return 0.0
    allowed = 1.0 - quantile
    # P(W > t) rises with rho from 0 to 1, so bisection finds the crossing
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        p = wait_tail_probability(
            mid,
            wait_s=slack_s,
            service_s=service_s,
            arrival_scv=arrival_scv,
            service_scv=service_scv,
        )
        if p <= allowed:
            lo = mid
        else:
            hi = mid
    return lo


# --- pooled engines: GI/G/c ------------------------------------------------------------------
#
# The router spreads requests over all c prefill engines, so they form one c-server queue,
# not c single-server ones. For M/M/c, P(W > t) = C(c, a) exp(-(c - a) t / s) with ``a`` the
# offered load in engines (arrival rate x service time) and ``C`` Erlang's C formula (the
# probability that an arrival waits at all). The Allen-Cunneen approximation carries it to
# general arrivals and service by slowing the decay by (ca2 + cs2) / 2, which for c = 1 is
# exactly the Kingman tail above. At c = 8-16 the pooled tail allows a far higher
# utilisation for the same quantile than c separate queues would.


def erlang_c(servers: int, offered: float) -> float:
    """Erlang's C: probability that an arrival waits, ``servers`` engines, ``offered`` load
    (arrival rate x mean service time, in engines); 1 at or past saturation.

    >>> round(erlang_c(1, 0.5), 3)
    0.5
    >>> round(erlang_c(2, 1.0), 3)
    0.333
    """
    if servers < 1:
        raise ValueError(f"servers must be >= 1, got {servers}")
    if offered <= 0:
        return 0.0
    if offered >= servers:
        return 1.0
    blocking = 1.0  # Erlang B by its recursion, stable for any c
    for k in range(1, servers + 1):
        blocking = offered * blocking / (k + offered * blocking)
    rho = offered / servers
    return blocking / (1.0 - rho * (1.0 - blocking))


def pooled_wait_tail_probability(
    servers: int,
    offered: float,
    *,
    wait_s: float,
    service_s: float,
    arrival_scv: float = DEFAULT_ARRIVAL_SCV,
    service_scv: float = DEFAULT_SERVICE_SCV,
) -> float:
    """Approximate ``P(W > wait_s)`` of a GI/G/c queue (Erlang C, Allen-Cunneen)."""
    if offered <= 0:
        return 0.0
    if offered >= servers:
        return 1.0
    spread = service_s * max(arrival_scv + service_scv, 1e-9) / 2.0
    decay = (servers - offered) * wait_s / spread
    return min(1.0, erlang_c(servers, offered) * math.exp(-decay))


@dataclass(frozen=True)
class _PooledTail:
    """A pooled queue's target: at most ``1 - quantile`` of the requests wait longer than
    ``slack_s``, each needing ``service_s`` of an engine."""

    slack_s: float
    service_s: float
    quantile: float
    arrival_scv: float
    service_scv: float

    def met(self, servers: int, offered: float) -> bool:
        tail = pooled_wait_tail_probability(
            servers,
            offered,
            wait_s=max(self.slack_s, 0.0),
            service_s=self.service_s,
            arrival_scv=self.arrival_scv,
            service_scv=self.service_scv,
        )
        return tail <= 1.0 - self.quantile

    def servers_needed(self, offered: float, max_servers: int = 10_000) -> int:
        if offered <= 0:
            return 0
        servers = max(1, math.floor(offered) + 1)
        while servers < max_servers and not self.met(servers, offered):
            servers += 1
        return servers

    def capacity(self, servers: int, low: float = 0.0, high: float | None = None) -> float:
        """The most load ``servers`` engines carry at the target, bisected (the wait's tail
        grows with the load) within ``[low, high]``, a bracket the caller knows it lies in
        (default ``[0, servers]``), to a millionth of an engine."""
        if servers <= 0:
            return 0.0
        high = float(servers) if high is None else high
        while high - low > 1e-6:
            mid = (low + high) / 2.0
            low, high = (mid, high) if self.met(servers, mid) else (low, mid)
        return low


def _pooled_tail(
    slack_s: float, service_s: float, quantile: float, arrival_scv: float, service_scv: float
) -> _PooledTail:
    if not 0 < quantile < 1:
        raise ValueError(f"quantile must be in (0, 1), got {quantile}")
    if service_s <= 0:
        raise ValueError(f"service_s must be > 0, got {service_s}")
    return _PooledTail(slack_s, service_s, quantile, arrival_scv, service_scv)


def pooled_servers_needed(
    offered: float,
    *,
    slack_s: float,
    service_s: float,
    quantile: float,
    arrival_scv: float = DEFAULT_ARRIVAL_SCV,
    service_scv: float = DEFAULT_SERVICE_SCV,
    max_servers: int = 10_000,
) -> int:
    """The fewest engines, sharing one queue, for which at most ``1 - quantile`` of the
    requests wait longer than ``slack_s`` (0 when nothing is offered).

    >>> pooled_servers_needed(6.0, slack_s=0.4, service_s=0.05, quantile=0.99)
    7
    """
    tail = _pooled_tail(slack_s, service_s, quantile, arrival_scv, service_scv)
    return tail.servers_needed(offered, max_servers)


def pooled_offered_capacity(
    servers: int,
    *,
    slack_s: float,
    service_s: float,
    quantile: float,
    arrival_scv: float = DEFAULT_ARRIVAL_SCV,
    service_scv: float = DEFAULT_SERVICE_SCV,
) -> float:
    """The most load (in engines' worth of work) ``servers`` engines sharing one queue carry
    with at most ``1 - quantile`` of the requests waiting longer than ``slack_s``: the
    inverse of :func:`pooled_servers_needed` (0 for no servers).

    >>> c2 = pooled_offered_capacity(2, slack_s=0.4, service_s=0.05, quantile=0.99)
    >>> pooled_servers_needed(c2 * 0.999, slack_s=0.4, service_s=0.05, quantile=0.99)
    2
    """
    return _pooled_tail(slack_s, service_s, quantile, arrival_scv, service_scv).capacity(servers)


def pooled_need(
    offered: float,
    *,
    slack_s: float,
    service_s: float,
    quantile: float,
    arrival_scv: float = DEFAULT_ARRIVAL_SCV,
    service_scv: float = DEFAULT_SERVICE_SCV,
) -> float:
    """The engines ``offered`` takes before rounding up, for a queue shared by them: with
    ``c`` the fewest engines that meet the tail (:func:`pooled_servers_needed`),
    ``c - 1 + (offered - cap(c - 1)) / (cap(c) - cap(c - 1))``, where ``cap(n)`` is what
    ``n`` engines carry (:func:`pooled_offered_capacity`). It rounds up to ``c`` and grows
    continuously with the load, so a need just past a replica boundary reads as just past it
    (a tolerance can hold it), not as the whole engine it rounds up to.

    >>> round(pooled_need(0.0, slack_s=0.4, service_s=0.05, quantile=0.99), 2)
    0.0
    >>> need = pooled_need(6.0, slack_s=0.4, service_s=0.05, quantile=0.99)
    >>> 6 < need <= 7
    True
    """
    tail = _pooled_tail(slack_s, service_s, quantile, arrival_scv, service_scv)
    if offered <= 0:
        return 0.0
    servers = tail.servers_needed(offered)
    # the fewest that meet the target carry ``offered``; one fewer do not
    below = tail.capacity(servers - 1, high=min(offered, servers - 1))
    at = tail.capacity(servers, low=min(offered, servers))
    if at <= below:
        return float(servers)
    share = (offered - below) / (at - below)
    return servers - 1 + min(1.0, max(share, 1e-6))
