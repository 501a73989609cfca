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
