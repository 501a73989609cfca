"""What of the forecast load costs engine capacity: the prefix-cache discount of prefill and
the speculative-decoding gain of decode, as named rules.

Model (tokens per second of work the sizing divides by the profiled throughput per GPU):

- **KV prefix hits** (:func:`kv_hit_rate`, :func:`discount_prefill`): a prompt token whose
  KV blocks an engine already holds is not computed again (Dynamo's router counts
  ``new prefill tokens = input tokens - overlap blocks x block size``), so prefill work is
  ``num_req x isl x (1 - h)`` with ``h`` the share of prompt tokens served from cache. The
  profile's throughput is still read at the full ISL (attention over the cached prefix
  costs as before), which makes the discount conservative.
- **Speculative decoding** (:func:`accept_length`, :func:`discount_decode`): with ``n``
  draft tokens per step (MTP ``nextn``, EAGLE steps) a sequence emits on average ``A``
  tokens per engine iteration, ``1 <= A <= n + 1`` (every step emits at least the verified
  token, at most all drafts plus it). The profile's decode throughput counts iterations x
  sequences, so the output-token demand is ``num_req x osl / A`` in those units.

Both act on the forecast by scaling the request count the role sees
(:func:`prefill_requests`, :func:`decode_requests`), leaving the lengths (and so the profile
points, the KV context, the TTFT of one prompt) as they are.

No I/O, no clock: every input is an argument.

>>> prefill_requests(100.0, kv_hit_rate(configured=0.5, observed=None))
50.0
>>> decode_requests(100.0, accept_length(configured=2.0, observed=None, num_speculative_tokens=3))
50.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.core.rules import RuleValue
from disagg_planner.core.types import TrafficObservation

# A hit rate this close to 1 would size prefill to nothing; a cache that serves every prompt
# token still leaves the last token of each prompt to compute.
MAX_KV_HIT_RATE = 0.99


def kv_hit_rate(
    *, configured: float | None, observed: float | None, unseen_because: str | None = None
) -> RuleValue:
    """Rule ``kv_hit_discount``: the share of prompt tokens served from the prefix cache.

    The configured value wins (an operator who knows the workload, or a replay that models
    it); else the router's observed mean (``dynamo_component_router_kv_hit_rate``); else 0,
    no discount (``unseen_because``: why none observed is used, e.g. stale). Values are
    clamped to ``[0, MAX_KV_HIT_RATE]``.

    >>> kv_hit_rate(configured=None, observed=None, unseen_because="stale").reason
    'kv_hit_discount: none (no KV hit rate configured or observed: stale)'
    """
    for value, source in ((configured, "configured"), (observed, "observed by the router")):
        if value is not None and math.isfinite(value):
            h = min(max(value, 0.0), MAX_KV_HIT_RATE)
            return RuleValue(
                h, f"kv_hit_discount: prefill work x {1 - h:.2f} ({source} hit {h:.0%})"
            )
    why = f": {unseen_because}" if unseen_because else ""
    return RuleValue(0.0, f"kv_hit_discount: none (no KV hit rate configured or observed{why})")


def accept_length(
    *,
    configured: float | None,
    observed: float | None,
    num_speculative_tokens: int | None,
    unseen_because: str | None = None,
) -> RuleValue:
    """Rule ``spec_decode_accept``: output tokens per sequence per decode iteration.

    1 (no speculative decoding) unless ``num_speculative_tokens`` (``nextn``) is set; then
    the configured accept length, else the observed one (vLLM's counters,
    ``1 + accepted / drafts``), else 1; clamped to ``[1, nextn + 1]`` (an accept length
    above it is a misread metric, below 1 impossible). ``unseen_because`` says why none was
    observed (the reason of the fallback to 1).

    >>> accept_length(configured=None, observed=2.5, num_speculative_tokens=3).reason
    'spec_decode_accept: decode work / 2.50 (observed accept length)'
    >>> accept_length(configured=None, observed=None, num_speculative_tokens=3,
    ...               unseen_because="no drafts").reason
    'spec_decode_accept: none (accept length neither configured nor seen: no drafts)'
    """
    if not num_speculative_tokens:
        return RuleValue(1.0, "spec_decode_accept: none (no speculative tokens configured)")
    upper = float(num_speculative_tokens + 1)
    for value, source in ((configured, "configured"), (observed, "observed")):
        if value is not None and math.isfinite(value):
            a = min(max(value, 1.0), upper)
            clamp = "" if a == value else f", clamped to [1, {upper:g}]"
            return RuleValue(
                a, f"spec_decode_accept: decode work / {a:.2f} ({source} accept length{clamp})"
            )
    why = f": {unseen_because}" if unseen_because else ""
    return RuleValue(
        1.0, f"spec_decode_accept: none (accept length neither configured nor seen{why})"
    )


def prefill_requests(num_req: float, hit: RuleValue) -> float:
    """Prompts' worth of prefill work in ``num_req`` requests (or tokens of whole prompts,
    such as a backlog counted from the queues): ``num_req x (1 - h)``."""
    return num_req * (1.0 - hit.value)


def decode_requests(num_req: float, accept: RuleValue) -> float:
    """Sequences' worth of decode iterations in ``num_req`` requests: ``num_req / A``."""
    return num_req / max(accept.value, 1.0)


@dataclass(frozen=True)
class DemandRules:
    """The two rules of one sizing; the sentences of those that act join the decision's reason."""

    kv_hit: RuleValue
    accept: RuleValue
    # speculative decoding configured (nextn set): the accept rule is reported even when it
    # falls back to 1, so that the decision says why decode was not discounted
    speculative: bool = False
    # an observed KV hit rate went stale: the fallback to no discount is reported
    kv_hit_stale: bool = False

    def acting(self) -> list[str]:
        """The reasons of the rules that change the demand (none at 0 % hits, accept 1), the
        accept rule's whenever speculative decoding is configured, and the KV rule's when an
        observed hit rate went stale (why prefill is no longer discounted)."""
        kv_shown = self.kv_hit.value > 0 or self.kv_hit_stale
        acting = [self.kv_hit.reason] if kv_shown else []
        shown = self.accept.value > 1 or self.speculative
        return acting + ([self.accept.reason] if shown else [])


class DemandSignals:
    """The last KV hit rate and accept length observed (a window without them keeps the
    previous value: an idle router reports no hit rate, which says nothing about the cache;
    idle engines make no drafts). For the accept length the latest reason none was read is
    kept for the fallback's reason.

    Either goes stale (:meth:`expire`) by the rule that holds the throughput loop on a stale
    window (``stale_traffic_data``: ended more than one interval before the tick), applied
    to the window that should have replaced it: it is stale when the window it was read
    from ended more than two intervals ago (the next window came and went without one; an
    idle router or idle engines report nothing for one window, not for two). The rules then
    fall back to what sizes more, never fewer: no KV discount (prefill sized for every
    prompt token) and an accept length of 1 (decode sized for one token per iteration), and
    say why, until the signal is read again."""

    def __init__(self) -> None:
        self.kv_hit_rate: float | None = None
        # the end of the window the KV hit rate was read from
        self.kv_hit_rate_end_s: float | None = None
        # why the last observed KV hit rate was forgotten (expire), until one is seen
        self.kv_hit_rate_stale: str | None = None
        self.accept_length: float | None = None
        self.accept_length_missing: str | None = None
        # the end of the window the accept length was read from
        self.accept_length_end_s: float | None = None
        # why the last observed accept length was forgotten (expire), until one is seen
        self.accept_length_stale: str | None = None

    def observe(self, obs: TrafficObservation) -> None:
        if obs.kv_hit_rate is not None:
            self.kv_hit_rate = obs.kv_hit_rate
            self.kv_hit_rate_end_s = obs.end_s
            self.kv_hit_rate_stale = None
        if obs.accept_length is not None:
            self.accept_length = obs.accept_length
            self.accept_length_end_s = obs.end_s
            self.accept_length_stale = self.accept_length_missing = None
        else:
            self.accept_length_missing = obs.accept_length_missing

    def expire(self, now_s: float, interval_s: float) -> None:
        """Forget an observed KV hit rate or accept length read from a window that ended
        more than two throughput intervals (``interval_s``) before ``now_s`` (class doc).
        The rules' fallbacks say so (the accept length's with the latest reason none was
        read since).

        >>> signals = DemandSignals()
        >>> signals.accept_length, signals.accept_length_end_s = 2.5, 100.0
        >>> signals.kv_hit_rate, signals.kv_hit_rate_end_s = 0.4, 100.0
        >>> signals.expire(now_s=400.0, interval_s=180.0)
        >>> signals.accept_length, signals.kv_hit_rate
        (2.5, 0.4)
        >>> signals.expire(now_s=500.0, interval_s=180.0)
        >>> signals.accept_length, signals.unseen_because()
        (None, 'stale: the last observed (2.50) was read 400 s ago, over 2 intervals of 180 s')
        >>> signals.kv_hit_rate, signals.kv_hit_rate_stale
        (None, 'stale: the last observed (0.40) was read 400 s ago, over 2 intervals of 180 s')
        """
        stale = _stale(self.accept_length, self.accept_length_end_s, now_s, interval_s)
        if stale:
            self.accept_length_stale = stale
            self.accept_length = self.accept_length_end_s = None
        stale = _stale(self.kv_hit_rate, self.kv_hit_rate_end_s, now_s, interval_s)
        if stale:
            self.kv_hit_rate_stale = stale
            self.kv_hit_rate = self.kv_hit_rate_end_s = None

    def unseen_because(self) -> str | None:
        """Why no observed accept length is used: stale (and the latest window's reason
        none was read since), or the latest window's reason."""
        latest = self.accept_length_missing
        if self.accept_length_stale is None:
            return latest
        return self.accept_length_stale + (f"; since: {latest}" if latest else "")

    def rules(self, config: PlannerConfig) -> DemandRules:
        """Both rules for the next sizing, configured values first."""
        return DemandRules(
            kv_hit=kv_hit_rate(
                configured=config.kv_hit_rate,
                observed=self.kv_hit_rate,
                unseen_because=self.kv_hit_rate_stale,
            ),
            accept=accept_length(
                configured=config.speculative_accept_length,
                observed=self.accept_length,
                num_speculative_tokens=config.num_speculative_tokens,
                unseen_because=self.unseen_because(),
            ),
            speculative=bool(config.num_speculative_tokens),
            kv_hit_stale=self.kv_hit_rate_stale is not None,
        )


def _stale(value: float | None, end_s: float | None, now_s: float, interval_s: float) -> str:
    """Why a signal read from a window ending at ``end_s`` is stale at ``now_s`` (more
    than two intervals since: :class:`DemandSignals`), or "" while it is not."""
    if value is None or end_s is None or now_s - end_s <= 2 * interval_s:
        return ""
    return (
        f"stale: the last observed ({value:.2f}) was read {now_s - end_s:.0f} s ago, over 2 "
        f"intervals of {interval_s:g} s"
    )
