"""Feedback: the rules that let what is observed overrule the profile.

The profile and the forecast are the feed-forward part of a decision; these rules close the
loop on the quantities the user set targets for (the TTFT tail at the attainment quantile,
the ITL), each a pure function returning its value and the sentence the reason carries:

- :func:`observed_breach`: a role's observed tail over its SLO for
  :data:`BREACH_CONFIRMATIONS` fast checks in a row (one, within a stabilisation window of
  a cut of that role) is a breach the model did not foresee;
- :func:`breach_replicas`: what the observation asks for then: the ready replicas times the
  larger of the tail over the SLO and the observed busy fraction over
  :data:`BUSY_TARGET`, at most :data:`MAX_BREACH_GROWTH` times, never +1 at a time;
- :func:`learn_capacity`: a per-role capacity correction (work per token relative to the
  profile: above 1 the engines are slower than profiled), learned both ways, from the
  observed busy fraction against the offered load (below 1 only while the tail is under
  :data:`SCALE_DOWN_MARGIN` of its SLO: :func:`busy_capacity_estimate`) and from breaches,
  and decaying back towards what the busy fraction says (1 without one) while the tail is
  under the SLO by :data:`SCALE_DOWN_MARGIN`;
- :func:`faster_than_profiled`: a correction below 1 (the engines serve more than their
  profile says) holds the replicas a role has where the profile asks for more; it never
  cuts below what the profile needs;
- :func:`scale_down_margin`: a role goes down only when its observed tail is under
  :data:`SCALE_DOWN_MARGIN` of its SLO;
- :func:`within_tolerance`: a tick's scale-up for a need within :data:`SCALE_UP_TOLERANCE`
  of the running replicas waits while the role's tail is under that margin;
- :func:`margin_window`: a role whose observed tail is under :data:`STABILISATION_MARGIN`
  of its SLO remembers its need for one time-to-ready, not the whole stabilisation window
  (the observation is the evidence the window stands in for);
- :func:`cut_floor`: after a scale-down that breached, the replicas that were cut count as
  a need until one stabilisation window after the cut.

Which tail belongs to which role: prefill answers for the TTFT, decode for the ITL, an
aggregated engine for both (:data:`ROLE_TAILS`). No I/O, no clock.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from disagg_planner.core.rules import RuleValue
from disagg_planner.core.types import TrafficObservation, histogram_quantile

# Fast checks in a row whose tail is over the SLO before a breach overrules the model: one
# window can be a single slow request; two at 15 s are half a minute of it.
BREACH_CONFIRMATIONS = 2
# A breach scales a role at most this many times its ready replicas at once (a tail many
# times the SLO is a queue, which the backlog rule sizes; the next breach can ask again).
MAX_BREACH_GROWTH = 2.0
# A breach after a breach scale-up must have fallen to this share of the tail ratio that
# ordered it, or more replicas are not what it lacks (prompts whose own prefill takes most of
# the SLO: no replica count fixes their tail).
BREACH_RESPONSE = 0.9
# The busy fraction an engine is planned at (the HPA's usual target utilisation).
BUSY_TARGET = 0.8
# A role goes down only while its observed tail is under this share of its SLO.
SCALE_DOWN_MARGIN = 0.8
# A role whose observed tail is under this share of its SLO has the observed margin that
# the stabilisation window stands in for: it remembers its need for one time-to-ready only
# (a cut that breaches comes back at once, and its need is kept: :func:`cut_floor`).
STABILISATION_MARGIN = 0.5
# The capacity correction stays within these bounds (a profile off by more is a wrong
# profile, which the decision's reason should show rather than learn).
CORRECTION_BOUNDS = (0.5, 4.0)
# Weight of a new busy-fraction estimate in the correction (an exponential average).
CORRECTION_GAIN = 0.2
# Share of the correction's distance from its estimate kept per throughput tick while the
# tail is comfortably under its SLO.
CORRECTION_DECAY = 0.5
# Below this predicted utilisation a busy fraction says too little to learn from.
MIN_LEARN_UTILISATION = 0.2

# The latency estimate learnt is the lowest of this many fast windows' (a minute at 15 s):
# waiting only ever adds to a TTFT, so the least-queued window says the most about the
# engine's own speed (bursty arrivals wait longer than Poisson ones, which the model assumes).
LATENCY_WINDOWS = 4
# Fast windows served calmly remembered per role (an hour at 15 s).
SERVED_HISTORY = 240

# The observed tails each role answers for.
ROLE_TAILS: dict[str, tuple[str, ...]] = {
    "prefill": ("ttft",),
    "decode": ("itl",),
    "agg": ("ttft", "itl"),
}


@dataclass(frozen=True)
class Tails:
    """Observed latencies of one window and their SLOs (None: not observed)."""

    ttft_ms: float | None  # TTFT at the attainment quantile (the mean without a histogram)
    itl_ms: float | None  # mean ITL (the frontend's histogram gives no per-request tail)
    ttft_target_ms: float
    itl_target_ms: float
    quantile: float

    @property
    def text(self) -> str:
        parts = []
        if self.ttft_ms is not None:
            parts.append(
                f"TTFT p{self.quantile * 100:g} {self.ttft_ms:.0f} ms / "
                f"{self.ttft_target_ms:.0f} ms"
            )
        if self.itl_ms is not None:
            parts.append(f"ITL {self.itl_ms:.1f} ms / {self.itl_target_ms:.1f} ms")
        return ", ".join(parts) or "no latency observed"

    def ratio(self, role: str) -> float | None:
        """The worst observed latency over its SLO among those ``role`` answers for."""
        seen = []
        if "ttft" in ROLE_TAILS.get(role, ()) and self.ttft_ms is not None:
            seen.append(self.ttft_ms / self.ttft_target_ms)
        if "itl" in ROLE_TAILS.get(role, ()) and self.itl_ms is not None:
            seen.append(self.itl_ms / self.itl_target_ms)
        return max(seen) if seen else None


def observed_tails(
    obs: TrafficObservation, *, ttft_target_ms: float, itl_target_ms: float, quantile: float
) -> Tails:
    """A window's TTFT at ``quantile`` (its histogram's, the mean TTFT without one) and its
    mean ITL, with their SLOs. An idle window has none."""
    tail_s = (
        histogram_quantile(obs.ttft_histogram, quantile) if obs.ttft_histogram is not None else None
    )
    ttft = tail_s * 1000.0 if tail_s is not None else obs.ttft_ms
    return Tails(ttft, obs.itl_ms, ttft_target_ms, itl_target_ms, quantile)


@dataclass(frozen=True)
class Served:
    """A fast window a role's ready replicas served: when, the tokens per second each
    carried, how many, and the tail over its SLO."""

    at_s: float
    per_replica: float
    replicas: int
    ratio: float

    def text(self, role: str) -> str:
        return (
            f"{role}: {self.replicas} replica(s) served {self.per_replica * self.replicas:.0f} "
            f"tok/s at {self.at_s:.0f} s, the tail at {self.ratio:.0%} of its SLO"
        )


@dataclass
class FeedbackMemory:
    """What the feedback rules remember between checks, per role: the fast checks in a row
    over the SLO, the learned capacity correction, the last scale-down (when, from how
    many) and the need it cut that a breach brought back (until when)."""

    streak: dict[str, int] = field(default_factory=dict)
    capacity: dict[str, float] = field(default_factory=dict)
    cut: dict[str, tuple[float, int]] = field(default_factory=dict)
    cut_need: dict[str, tuple[float, int]] = field(default_factory=dict)
    busy_estimate: dict[str, float] = field(default_factory=dict)  # the last, per role
    # (when, tail ratio) of the last breach scale-up, per role
    last_breach: dict[str, tuple[float, float]] = field(default_factory=dict)
    estimate_source: dict[str, str] = field(default_factory=dict)  # of busy_estimate
    # the fast windows each role served within its SLO
    served: dict[str, deque[Served]] = field(default_factory=dict)
    latency: dict[str, deque[float]] = field(default_factory=dict)  # the last estimates

    def latency_estimate(self, role: str, estimate: float) -> float:
        """The lowest of ``role``'s last :data:`LATENCY_WINDOWS` latency estimates, this
        one included."""
        seen = self.latency.setdefault(role, deque(maxlen=LATENCY_WINDOWS))
        seen.append(estimate)
        return min(seen)

    def serve(
        self, role: str, *, now_s: float, tokens_per_s: float, ready: int, ratio: float
    ) -> None:
        """Remember that ``ready`` replicas of ``role`` served ``tokens_per_s`` with their
        tail at ``ratio`` of its SLO (kept when within it: :func:`served_calmly`)."""
        if ready > 0 and tokens_per_s > 0 and ratio <= 1.0:
            seen = self.served.setdefault(role, deque(maxlen=SERVED_HISTORY))
            seen.append(Served(now_s, tokens_per_s / ready, ready, ratio))

    def proven(self, role: str, *, since_s: float, within: float = 1.0) -> Served | None:
        """The highest load per replica ``role`` served since ``since_s`` with its tail
        under ``within`` of its SLO."""
        seen = [s for s in self.served.get(role, ()) if s.at_s >= since_s and s.ratio <= within]
        return max(seen, key=lambda s: s.per_replica) if seen else None

    def see(self, role: str, ratio: float | None) -> int:
        """Count a check's tail for ``role``; returns the fast checks in a row over SLO."""
        n = self.streak.get(role, 0) + 1 if ratio is not None and ratio > 1.0 else 0
        self.streak[role] = n
        return n

    def correction(self, role: str) -> float:
        return self.capacity.get(role, 1.0)

    def learn(
        self,
        role: str,
        *,
        busy_estimate: float | None = None,
        breach: float | None = None,
        calm: bool = False,
        source: str = "busy fraction",
    ) -> list[str]:
        """Update ``role``'s capacity correction (:func:`learn_capacity`; ``busy_estimate``
        the last observed estimate, from ``source``); its sentence."""
        rule = learn_capacity(
            role,
            self.correction(role),
            busy_estimate=busy_estimate,
            breach=breach,
            calm=calm,
            source=source,
        )
        self.capacity[role] = rule.value
        if busy_estimate is not None:
            self.busy_estimate[role] = busy_estimate
            self.estimate_source[role] = source
        return [rule.reason] if rule.reason else []


def observed_breach(
    role: str,
    *,
    ratio: float | None,
    streak: int,
    recently_cut: bool,
    tails: Tails,
    starting: int = 0,
    queue_left: float = 0.0,
    queued_for: str | None = None,
) -> RuleValue:
    """The tail ratio when ``role``'s observed tail has been over its SLO for
    :data:`BREACH_CONFIRMATIONS` fast checks in a row (one when the role was cut within the
    stabilisation window: that cut is the likely cause), counted from its convergence on
    (while ``starting`` ordered replicas start, the tail holds requests that queued before
    they served, and for a drain period after they became ready the ``queue_left`` waiting
    beyond the arrival rate is that queue, which the backlog rule sizes; ``queued_for``: the
    role whose replicas it waited for, when not ``role`` itself: decode, which that queue
    reaches all at once); 0 otherwise."""
    needed = 1 if recently_cut else BREACH_CONFIRMATIONS
    if ratio is None or ratio <= 1.0:
        return RuleValue(0.0, "")
    if starting > 0:
        return RuleValue(
            0.0,
            f"{role}: over its SLO ({tails.text}) while {starting} ordered replica(s) start: "
            "not counted",
        )
    if queue_left >= 1:
        whose = "its" if queued_for in (None, role) else f"{queued_for}'s"
        return RuleValue(
            0.0,
            f"{role}: over its SLO ({tails.text}) while the {queue_left:.0f} requests that "
            f"queued before {whose} last replicas were ready drain: not counted",
        )
    if streak < needed:
        return RuleValue(0.0, f"{role}: over its SLO ({tails.text}), {streak} of {needed} checks")
    why = "after a cut of it" if recently_cut else f"for {streak} fast checks"
    return RuleValue(ratio, f"{role}: observed tail over its SLO {why} ({tails.text})")


def breach_responds(
    role: str, *, now_s: float, previous: tuple[float, float] | None, ratio: float, window_s: float
) -> RuleValue:
    """1 when a confirmed breach of ``role`` may scale it: the first within ``window_s`` (the
    stabilisation window) of the last breach scale-up, or one whose tail ratio fell below
    :data:`BREACH_RESPONSE` of the one that ordered it (the replicas helped, more may help
    more); 0 when more replicas did not lower the tail: what it lacks is not capacity."""
    if previous is None or now_s - previous[0] > window_s:
        return RuleValue(1.0, "")
    if ratio < BREACH_RESPONSE * previous[1]:
        return RuleValue(1.0, "")
    previous_ratio = previous[1]
    return RuleValue(
        0.0,
        f"{role}: more replicas did not lower the tail (x{previous_ratio:.2f} -> x{ratio:.2f} "
        f"the SLO since {previous[0]:.0f} s): not a capacity breach, the model stands",
    )


# The servable quantile is read no lower than this: where more than half the prompts cannot
# meet the TTFT SLO on their own, the SLO is the prompts' problem, not the replicas'.
MIN_SERVABLE_QUANTILE = 0.5


def servable_quantile(quantile: float, *, unservable_share: float, max_isl: float) -> RuleValue:
    """The quantile at which the TTFT tail says what replicas can change: the prompts longer
    than ``max_isl`` (the length whose prefill alone takes the SLO, at the profile) miss it
    however many replicas serve, and they are the slowest, so the attainment quantile of
    the others is ``quantile x (1 - unservable_share)`` of all (at least
    :data:`MIN_SERVABLE_QUANTILE`). A tail there over the SLO is requests that could have
    met it waiting: a breach of capacity, where the tail of all would be the long prompts'
    own."""
    if unservable_share <= 0 or not math.isfinite(unservable_share):
        return RuleValue(quantile, "")
    servable = max(MIN_SERVABLE_QUANTILE, quantile * (1.0 - min(1.0, unservable_share)))
    return RuleValue(
        servable,
        f"prefill: {unservable_share:.1%} of the prompts (over {max_isl:.0f} tokens) take the "
        f"TTFT SLO of prefill alone: the TTFT tail is read at p{servable * 100:.3g}, the "
        f"attainment quantile of the others",
    )


def unfixable_tail(*, own_ms: float, target_ms: float, isl: float) -> RuleValue:
    """1 when the prompt at the attainment quantile alone takes the TTFT SLO or more of
    prefill (``own_ms``: the profile's TTFT at its length, times the learned correction where
    the engines are slower): its tail is the prompt's, which no replica count shortens, so
    it is no breach of capacity; 0 otherwise."""
    if own_ms < target_ms:
        return RuleValue(0.0, "")
    return RuleValue(
        1.0,
        f"prefill: the tail's own prompts ({isl:.0f} tokens) take {own_ms:.0f} ms of prefill "
        f"alone, over the {target_ms:.0f} ms SLO: no breach of capacity",
    )


def breach_replicas(
    role: str,
    *,
    ready: int,
    desired: int,
    sized: int,
    tail_ratio: float,
    busy: float | None,
) -> RuleValue:
    """Observed breach beats the model: with the sizing saying ``sized`` replicas suffice
    (no more than ``desired``), ``ceil(ready x g)`` with ``g`` the larger of the tail over
    its SLO and the busy fraction over :data:`BUSY_TARGET`, within ``[1,``
    :data:`MAX_BREACH_GROWTH` ``]``; at least one more than ready, never below ``desired``.
    Based on the ready replicas, so that a breach that lasts while the ordered ones start
    orders nothing more; 0 (no rule) when the sizing already asks for more than desired."""
    if sized > desired:
        return RuleValue(0.0, "")
    by_busy = busy / BUSY_TARGET if busy is not None else 0.0
    growth = min(MAX_BREACH_GROWTH, max(1.0, tail_ratio, by_busy))
    base = max(1, ready)
    want = max(desired, base + 1, math.ceil(base * growth - 1e-9))
    basis = (
        f"the tail over the SLO x{tail_ratio:.2f}"
        if tail_ratio >= by_busy
        else f"busy {busy:.0%} over {BUSY_TARGET:.0%}"
    )
    return RuleValue(
        float(want),
        f"observed breach beats the model: the sizing says {sized} suffice, the observation "
        f"asks {role} {ready} ready x{growth:.2f} ({basis}) -> {want}",
    )


def learn_capacity(
    role: str,
    previous: float,
    *,
    busy_estimate: float | None = None,
    breach: float | None = None,
    calm: bool = False,
    source: str = "busy fraction",
) -> RuleValue:
    """The role's capacity correction (work per token over the profile's), both ways:

    - an observed estimate (``source``: the busy fraction's ``busy / predicted busy``, or
      the mean TTFT's, :mod:`disagg_planner.core.latency_capacity`) moves it by
      :data:`CORRECTION_GAIN` towards the estimate: ``c' = c + gain x (e - c)``;
    - a breach the sizing did not foresee raises it to at least ``c x breach`` (the model
      needed that much more than it said);
    - ``calm`` (the tail under :data:`SCALE_DOWN_MARGIN` of its SLO over a whole interval)
      decays it towards the estimate, 1 without one: ``c' = t + decay x (c - t)``.

    Bounded by :data:`CORRECTION_BOUNDS`."""
    lo, hi = CORRECTION_BOUNDS
    value, why = previous, ""
    if busy_estimate is not None and math.isfinite(busy_estimate) and busy_estimate > 0:
        value = value + CORRECTION_GAIN * (busy_estimate - value)
        why = f"{source} says x{busy_estimate:.2f}"
    if breach is not None and breach > 1.0:
        value = max(value, previous * breach)
        why = f"a breach the sizing did not foresee x{breach:.2f}"
    elif calm:
        toward = busy_estimate if busy_estimate is not None and busy_estimate > 0 else 1.0
        value = toward + CORRECTION_DECAY * (value - toward)
        why = why or "the tail under the SLO's margin: decaying to the profile"
    value = min(hi, max(lo, value))
    if abs(value - previous) < 0.005:  # no sentence for a change the sizing cannot show
        return RuleValue(value, "")
    return RuleValue(value, f"{role} capacity correction {previous:.2f} -> {value:.2f} ({why})")


def busy_capacity_estimate(
    *, busy: float | None, offered_engines: float, ready: int, calm: bool = False
) -> float | None:
    """``busy / (offered / ready)``: how much more (above 1) or less (below 1) of its time an
    engine spends than the profile says the offered load takes (``offered`` in engines' worth
    of profiled work); None without a busy fraction, below :data:`MIN_LEARN_UTILISATION`
    predicted, or saturated (busy then says only "at least").

    Below 1 only while the role's tail is ``calm`` (under :data:`SCALE_DOWN_MARGIN` of its
    SLO), else ``max(1, ...)``. The profile's throughput is a lone request's (``ISL / TTFT``);
    an engine that batches the prompts waiting at an iteration pays its fixed cost once for
    all of them, so under load it serves more than that (busy 0.6 to 0.9 of the profile's
    prediction on the default replay, more as the load grows), and an engine faster than its
    profile shows the same. Believed while the tail agrees: a tail near its SLO says the
    time the busy fraction leaves free does not serve it, and a breach raises the correction
    at once (:func:`learn_capacity`)."""
    if busy is None or ready <= 0 or offered_engines <= 0:
        return None
    predicted = offered_engines / ready
    if predicted < MIN_LEARN_UTILISATION or busy >= 0.999:
        return None
    estimate = busy / predicted
    return estimate if calm else max(1.0, estimate)


# A tick's scale-up for a need within this share above the replicas running is held while
# the tail is calm: the Kubernetes HPA's default tolerance, which keeps a need hovering at a
# replica boundary from ordering and cutting a replica every few intervals.
SCALE_UP_TOLERANCE = 0.1


def within_tolerance(role: str, *, current: int, sized: int, need: float, calm: bool) -> RuleValue:
    """``current`` where the sizing asks ``sized > current`` replicas for a need of ``need``
    replicas (before rounding up) within :data:`SCALE_UP_TOLERANCE` of ``current`` and the
    role's tail is ``calm`` (under the scale-down margin): the observation says those
    running serve it; ``sized`` otherwise (a tail that rises is the fast check's to act
    on)."""
    if sized <= current or current <= 0 or not calm or not math.isfinite(need):
        return RuleValue(float(sized), "")
    if need > current * (1.0 + SCALE_UP_TOLERANCE):
        return RuleValue(float(sized), "")
    return RuleValue(
        float(current),
        f"{role}: a need of {need:.2f} replicas is within {SCALE_UP_TOLERANCE:.0%} of the "
        f"{current} running and its tail is under its margin: held (the HPA's tolerance)",
    )


def faster_than_profiled(
    role: str,
    *,
    current: int,
    profiled: int,
    observed: int,
    correction: float,
    source: str = "busy fraction",
) -> RuleValue:
    """The replicas ``role`` is sized to when its learned capacity correction is below 1:
    where the profile's sizing (``profiled``, the correction floored at 1) asks for more than
    the ``current`` replicas and the sizing at the learned correction (``observed``) for
    fewer than it, ``max(current, observed)``; ``profiled`` otherwise.

    ``source`` names the observation the correction was learned from. The busy fraction
    (or the mean TTFT under load) is measured on the engines running: it says they serve
    this load with time to spare, not that fewer of them would (each would then carry a
    load never observed, where a batching engine's gain from the prompts it batches stops
    growing).
    So the observation may hold replicas against the profile's call for more, or add fewer;
    a scale-down goes by the profile. A breach raises the correction at once
    (:func:`learn_capacity`)."""
    if correction >= 1.0 or profiled <= current or observed >= profiled:
        return RuleValue(float(profiled), "")
    held = max(current, observed)
    return RuleValue(
        float(held),
        f"{role}: faster than profiled: the profile asks {profiled}, its {source} says "
        f"x{correction:.2f} the profile's work (tail under its margin): {held} suffice "
        f"({current} running; a cut still goes by the profile)",
    )


def served_calmly(
    role: str,
    *,
    floor: int,
    peak_tokens_per_s: float,
    proven: Served | None,
) -> RuleValue:
    """The burst memory's ``floor`` for ``role``, or fewer where fewer were seen serving its
    peak: ``proven`` is the highest load per replica the role's replicas served with their
    tail under the scale-down margin of its SLO (the caller's choice), and
    ``ceil(peak / proven per replica)`` replicas carry
    ``peak_tokens_per_s`` at that rate (the floor keeps capacity for a burst seen before:
    what served it within the SLO is that capacity).
    The profile's call for more is a model's, which the observation of that load
    overrules; the sizing of the load at hand still goes by the profile."""
    if proven is None or floor <= 1 or peak_tokens_per_s <= 0:
        return RuleValue(float(floor), "")
    enough = max(1, math.ceil(peak_tokens_per_s / proven.per_replica - 1e-9))
    if enough >= floor:
        return RuleValue(float(floor), "")
    return RuleValue(
        float(enough),
        f"served calmly: {proven.text(role)}: {enough} carry the burst memory's peak "
        f"{peak_tokens_per_s:.0f} tok/s, not the profile's {floor}",
    )


def scale_down_margin(role: str, *, ratio: float | None) -> RuleValue:
    """1 when ``role`` may go down: its observed tail over the interval under
    :data:`SCALE_DOWN_MARGIN` of its SLO (or none observed: no traffic to serve); 0 with the
    sentence saying why not."""
    if ratio is None or ratio <= SCALE_DOWN_MARGIN:
        return RuleValue(1.0, "")
    return RuleValue(
        0.0,
        f"{role}: no scale-down: its observed tail is at {ratio:.0%} of its SLO "
        f"(a scale-down needs it under {SCALE_DOWN_MARGIN:.0%})",
    )


def margin_window(
    role: str, *, ratio: float | None, window_s: float, time_to_ready_s: float
) -> RuleValue:
    """How long ``role``'s need is remembered for its scale-down stabilisation: one
    ``time_to_ready_s`` (a dip shorter than that still costs no round trip) when its observed
    tail over the interval is under :data:`STABILISATION_MARGIN` of its SLO, ``window_s``
    otherwise (no latency observed: no evidence, the whole window). The window remembers a
    need in case the load comes back; a tail this far under its SLO says the load the
    replicas serve now leaves them idle, and a cut that breaches is restored at once."""
    if ratio is None or ratio > STABILISATION_MARGIN or time_to_ready_s >= window_s:
        return RuleValue(window_s, "")
    return RuleValue(
        time_to_ready_s,
        f"{role}: observed margin: its tail is at {ratio:.0%} of its SLO (under "
        f"{STABILISATION_MARGIN:.0%}): its need is remembered for one time-to-ready "
        f"({time_to_ready_s:.0f} s), not the {window_s:.0f} s stabilisation window",
    )


def cut_floor(role: str, *, now_s: float, cut_need: tuple[float, int] | None) -> RuleValue:
    """The replicas a breached cut of ``role`` took away, kept as a floor until the time
    remembered with them; 0 (no floor) after it or without one."""
    if cut_need is None or now_s >= cut_need[0]:
        return RuleValue(0.0, "")
    until, need = cut_need
    return RuleValue(
        float(need),
        f"{role}: kept at {need} until {until:.0f} s: a cut to fewer breached its SLO",
    )


def mean_busy(fractions: Mapping[Any, float] | None) -> float | None:
    """The mean of the engines' busy fractions; None when none is known."""
    if not fractions:
        return None
    values = [v for v in fractions.values() if math.isfinite(v)]
    return sum(values) / len(values) if values else None
