"""The fast check between throughput ticks, from the frontend alone (every
``fast_check_interval_seconds``). Its stages, in order:

1. hold when the short window is missing; else record its rate (burst factor, burst memory,
   rising trend), its lengths and the window itself (the tick's window when that is missing);
   until a tick has seen the prompt-length histogram, the windows' own pooled stand for it;
2. the observed tails over their SLOs per role (TTFT tail at the attainment quantile for
   prefill, ITL for decode, both for an aggregated engine), counted towards a breach (a
   TTFT tail the long prompts' own prefill makes is none, nor one while the queue a
   start-up left drains, through prefill and on into decode, except for a prefill role cut
   within its stabilisation window, judged at the servable quantile:
   :func:`disagg_planner.core.feedback.servable_quantile`); the prefill capacity
   correction from the engines' busy fraction;
3. :func:`disagg_planner.core.rules.slo_at_risk`,
   :func:`disagg_planner.core.feedback.observed_breach` and a significant rising trend
   (capped at the burst memory's earlier peak while the rate is under it:
   :func:`disagg_planner.core.rules.trend_within_peak`): nothing changes unless one fires;
4. the sizing of the observed demand (the rising trend after the opening interval, the
   backlog, the length mix), held where the engines serve more than profiled
   (:func:`disagg_planner.core.feedback.faster_than_profiled`);
5. observed breach beats the model (:func:`disagg_planner.core.feedback.breach_replicas`):
   a confirmed breach where the sizing says the replicas suffice scales the role by what
   the observation asks for, and the capacity correction learns by how much the model
   was off; a breach right after a cut of the role restores the cut replicas at once and
   keeps them for a stabilisation window;
6. per role, only what is at risk moves (:func:`roles_at_risk`): a role whose own tails are
   within their SLOs keeps its replicas, unless the rising trend asks for more and its tail
   has used more than half its SLO, or it is decode, whose ITL shows no rise before its
   batch saturates (and it was not cut within one time-to-ready), and even then not where
   the observation says its replicas suffice (:func:`_ahead_held`);
7. the guard chain (:func:`disagg_planner.core.guards.guard_chain`), up only: a fast check
   never removes what the tick planned.

No I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from disagg_planner.core.arrival import pooled_rate
from disagg_planner.core.feedback import (
    ROLE_TAILS,
    SCALE_DOWN_MARGIN,
    STABILISATION_MARGIN,
    Tails,
    breach_replicas,
    breach_responds,
    observed_breach,
    unfixable_tail,
)
from disagg_planner.core.guards import guard_chain
from disagg_planner.core.memory import pool_windows
from disagg_planner.core.rules import (
    LengthSample,
    RateSample,
    RuleValue,
    pooled_lengths,
    prior_peak,
    rising_trend,
    slo_at_risk,
    trend_within_peak,
)
from disagg_planner.core.served_load import served_holds
from disagg_planner.core.sizing import LoadForecast, RoleSizing
from disagg_planner.core.throughput import (
    ThroughputDecision,
    ThroughputDiagnostics,
    ThroughputPlanner,
)
from disagg_planner.core.types import (
    DeploymentStatus,
    MissingObservation,
    ThroughputReason,
    TrafficObservation,
    histogram_quantile,
)


def fast_check(
    tp: ThroughputPlanner,
    now_s: float,
    recent: TrafficObservation | MissingObservation,
    status: DeploymentStatus,
    queued_prefill_tokens: float | None = None,
    busy: Mapping[str, float] | None = None,
) -> ThroughputDecision:
    """One fast check of ``tp``'s deployment (the module doc lists its stages)."""
    cfg = tp.config
    tp.convergence.track(now_s, status)
    tp.demand.expire(now_s, cfg.throughput_adjustment_interval_seconds)
    if isinstance(recent, MissingObservation):
        detail = f": {recent.detail}" if recent.detail else ""
        return tp.hold(
            now_s,
            ThroughputReason.NO_TRAFFIC_DATA,
            f"fast check: traffic unavailable ({recent.reason}{detail}); holding",
            ThroughputDiagnostics(),
        )
    memory = tp.traffic
    memory.see_traffic(recent)
    memory.short_rates.append(recent.request_rate)
    memory.rate_samples.append(RateSample(recent.end_s, recent.request_rate, recent.duration_s))
    memory.fast_windows.append(recent)
    if recent.num_req > 0 and recent.isl is not None and recent.osl is not None:
        memory.length_windows.append(LengthSample(recent.num_req, recent.isl, recent.osl))
    if not memory.lengths_from_tick:
        # before a tick has seen the prompt lengths, the fast windows since the start say
        # what they are: the length mix and the work's variability the first minutes are
        # sized with (a heavy-tailed mix at the mean's cost is sized short of its need)
        seen_so_far = pool_windows(memory.fast_windows)
        if seen_so_far is not None and seen_so_far.isl_histogram is not None:
            tp.see_lengths(seen_so_far.isl_histogram)
    pooled = pooled_lengths(memory.length_windows)
    if pooled is not None:
        isl, osl, lengths_reason = pooled
    else:
        isl, osl = memory.last_lengths or (0.0, 0.0)
        lengths_reason = "no lengths in the recent windows: the last ones seen"

    tails = seen = tp.tails(recent)
    unfixable = _unfixable(tp, recent, quantile=tails.quantile)
    window = cfg.scale_down_stabilization_seconds
    cut_recently = {r: cut_within(tp, r, now_s, window) for r in cfg.roles}
    servable = RuleValue(0.0, "")
    if unfixable.value:  # the prompts' own prefill: no replica count shortens that tail
        tails = replace(seen, ttft_ms=None)
        if any(cut_recently[r] for r in ("prefill", "agg") if r in cfg.roles):
            # ... but a cut can lengthen the others' waits: a role just cut is judged by the
            # tail of the prompts it can serve within the SLO, so a cut that breaches it
            # comes back (:func:`disagg_planner.core.feedback.servable_quantile`)
            servable = tp.servable_quantile(recent)
            tails = tp.tails(recent, servable=True)
    # The waiting requests are counted at the short window's own mean prompt (those
    # reaching their first token now come out of the queue, long prompts among the last);
    # the arrivals' need at the pooled lengths.
    queued_isl = recent.isl if recent.num_req > 0 and recent.isl is not None else isl
    backlog = tp.backlog(recent, queued_isl, queued_prefill_tokens)
    tp.see_served(now_s, status, recent, backlog=backlog.value)
    excess = backlog.value / queued_isl if queued_isl > 0 else 0.0
    # A breach is counted from the role's convergence on: while ordered replicas start, the
    # tail holds the requests that queued before they served, and so it does while that
    # queue drains (one drain period after they became ready, for the roles that serve the
    # first token).
    # That queue drains through decode too: the requests it held reach their first tokens
    # together and decode them in one batch, whose ITL passes the SLO until they finish
    # (on/off bursts at half the profile's speed: 45 s over it as 676 queued requests left
    # prefill), sooner than a decode replica ordered then could start.
    ready_at = {r: tp.convergence.ready_at(r) for r in cfg.roles}
    first_token = [r for r in cfg.roles if "ttft" in ROLE_TAILS.get(r, ())]
    draining = [
        r
        for r in first_token
        if (at := ready_at[r]) is not None and now_s - at <= cfg.backlog_drain_seconds
    ]
    queue_left = {
        r: excess if (r in draining or (draining and r not in first_token)) else 0.0
        for r in cfg.roles
    }
    streaks = {
        r: tp.feedback.see(
            r,
            tails.ratio(r) if status.ready(r) >= status.desired(r) and queue_left[r] < 1 else None,
        )
        for r in cfg.roles
    }
    calm = tp.see_calm(recent)
    learnt = tp.learn_from_busy(
        status, busy, rate=_busy_window_rate(tp, now_s), isl=isl, calm=calm, window=recent
    )
    risk = slo_at_risk(
        ttft_tail_ms=seen.ttft_ms,
        ttft_target_ms=cfg.ttft_ms,
        itl_ms=recent.itl_ms,
        itl_target_ms=cfg.itl_ms,
        excess_in_flight=excess,
    )
    # the roles the risk is with (a TTFT tail of long prompts included: the sizing of the
    # window's load may add prefill; only the breach rule leaves that tail out)
    at_risk = roles_at_risk(cfg.roles, seen, excess_in_flight=excess)
    breaches = {
        r: observed_breach(
            r,
            ratio=tails.ratio(r),
            streak=streaks[r],
            recently_cut=cut_recently[r],
            tails=tails,
            starting=max(0, status.desired(r) - status.ready(r)),
            queue_left=queue_left[r],
            queued_for=r if r in draining else (draining[0] if draining else None),
        )
        for r in cfg.roles
    }
    watching = [b.reason for b in breaches.values() if b.reason and not b.value]
    watching += [unfixable.reason] if unfixable.value else []
    watching += [servable.reason] if servable.reason else []
    diagnostics = ThroughputDiagnostics(
        observed=recent, rules=(risk.reason, backlog.reason, *watching, *learnt)
    )
    interval = cfg.throughput_adjustment_interval_seconds
    # The opening ramp is the run starting, no trend, unless the TTFT tail already breaches
    # the SLO on it (a run started at full load on a deployment too small for it): a tail
    # replicas can shorten (the long prompts' own prefill over the SLO is not that).
    breached = tails.ttft_ms is not None and tails.ttft_ms > cfg.ttft_ms
    opening = "" if breached else memory.opening_rule(now_s, interval)
    trend = rising_trend(
        memory.rate_samples if breached else memory.after_opening(memory.rate_samples, interval),
        now_s=now_s,
        span_s=interval,
        reach_s=tp.deployment_time_to_ready().value + recent.duration_s,
    )
    # A significant rising trend is checked with the SLO still met: the replicas it needs
    # one time-to-ready from now are ordered now, not when the tail shows them missing.
    rising = trend.value > recent.request_rate
    span = cfg.burst_memory_seconds
    if rising and not risk.value and span:
        trend = trend_within_peak(
            trend,
            rate=recent.request_rate,
            peak=prior_peak(memory.rate_samples, since_s=now_s - span, until_s=now_s - interval),
            span_s=span,
        )
        rising = trend.value > recent.request_rate
    if not risk.value and not rising and not any(b.value for b in breaches.values()):
        return ThroughputDecision(
            now_s,
            None,
            ThroughputReason.NO_CHANGE,
            f"fast check: {risk.reason}",
            diagnostics,
        )

    rate = max(recent.request_rate, trend.value)
    observed = LoadForecast(num_req=rate * interval, isl=isl, osl=osl)
    gpus = {r: status.roles[r].gpus_per_replica for r in cfg.roles}
    # the window is itself a short one: its rate is a burst's, no factor on top
    burst = RuleValue(1.0, "burst factor 1 (the fast check's window is a short window)")
    mix = tp.sizer.length_mix()
    sizing, steady, capped = tp.sizer.size_with_backlog(
        observed, gpus, status, burst=burst.value, backlog=backlog, length_mix=mix.value
    )
    if any(not s.feasible for s in sizing.values()):
        return tp.hold_if_infeasible(now_s, sizing, diagnostics) or tp.hold(
            now_s, ThroughputReason.PROFILE_INFEASIBLE, "infeasible", diagnostics
        )
    desired = {r: status.desired(r) for r in cfg.roles}
    sizing, steady, held = tp.sizer.held_by_observation(
        observed,
        gpus,
        status,
        sized=(sizing, steady),
        current=desired,
        calm=calm,
        burst=burst.value,
        backlog=backlog,
        length_mix=mix.value,
    )
    capped += held
    wanted, breach_notes = _breach_targets(
        tp,
        now_s,
        status,
        breaches,
        steady,
        busy,
        desired,
        cut_recently,
        restore_only=frozenset(r for r in cfg.roles if servable.reason and cut_recently[r]),
    )
    proposed = {r: max(sizing[r].replicas, wanted.get(r, 0)) for r in cfg.roles}
    memory_since = now_s - span if span else -math.inf
    for role in cfg.roles:
        # a fast check reacts to what is at risk: a role whose own tail is within its SLO
        # is left to the tick (the short window's rate is a burst's, which its engines
        # serve within the SLO), unless a rising trend asks for more when what is ordered
        # now serves and the observation agrees: the role's tail has used more than
        # STABILISATION_MARGIN of its SLO (under it, the rise has not reached what the
        # replicas serve; a decode role's ITL says nothing of that: it stays flat until the
        # batch saturates, then leaps past the SLO within a minute, so decode goes by the
        # model, itself corrected by the observed ITL ratio), and the role was not cut
        # within one time-to-ready (a rise that breaches that cut brings it back at once)
        ratio = seen.ratio(role)
        ahead = (
            rising
            and ratio is not None
            and (ratio > STABILISATION_MARGIN or ROLE_TAILS.get(role) == ("itl",))
            and not cut_within(tp, role, now_s, tp.time_to_ready(role).value)
        )
        if not (at_risk[role] or ahead or role in wanted) and proposed[role] > desired[role]:
            proposed[role] = desired[role]
            capped.append(f"{role}: within its SLO ({tails.text}): left to the tick")
        elif ahead and not (at_risk[role] or role in wanted) and proposed[role] > desired[role]:
            why = _ahead_held(
                tp,
                role,
                sized=sizing[role],
                current=desired[role],
                load_tokens_per_s=tp.role_tokens(role, rate=rate, isl=isl, osl=osl),
                calm=calm,
                since_s=memory_since,
            )
            if why:
                proposed[role] = desired[role]
                capped.append(f"rising trend: {why}")
    guarded = guard_chain(
        proposed,
        current=desired,
        limits=tp.limits(gpus, step_cap=False),
        kept={"cut_need": tp.cut_floors(now_s)},
        up_only=True,
    )
    target = guarded.stages["budget"]
    budget = guarded.budget
    rules = (
        risk.reason,
        lengths_reason,
        opening,
        trend.reason,
        burst.reason,
        backlog.reason,
        mix.reason,
        *capped,
        *learnt,
        *breach_notes,
        *guarded.notes,
    )
    diagnostics = ThroughputDiagnostics(
        observed=recent,
        sizing=sizing,
        stages=guarded.stages,
        rules=tuple(r for r in rules if r),
        corrections=tp.corrections,
    )
    drain_s = cfg.backlog_drain_seconds
    explain = "fast check: " + "; ".join((risk.reason, backlog.reason))
    explain += f" (drained over {drain_s:.0f} s); " + tp.sizer.explain(observed, sizing, target)
    notes = (
        lengths_reason,
        opening,
        trend.reason,
        *capped,
        *watching,
        *breach_notes,
    )
    explain += "".join(f"; {note}" for note in (*notes, *guarded.notes) if note)
    if budget.limited_by:
        explain += f"; limited by {budget.limited_by}: {budget.message}"
    if target == desired:
        return ThroughputDecision(
            now_s,
            None,
            ThroughputReason.NO_CHANGE,
            explain + "; the current replicas cover the observed demand",
            diagnostics,
        )
    tp.convergence.note_scale(now_s, target, desired)
    # remembered for the stabilisation: the need of the observed rate, not the replicas
    # ordered to drain the backlog (a breach's is in the corrected sizing of the next ticks)
    floors = tp.limits(gpus, step_cap=False).floors
    tp.remember_need(now_s, {r: max(floors[r], steady[r].replicas) for r in cfg.roles})
    return ThroughputDecision(now_s, target, ThroughputReason.SCALE, explain, diagnostics)


def cut_within(tp: ThroughputPlanner, role: str, now_s: float, span_s: float) -> bool:
    """Whether ``role`` was cut within the last ``span_s``."""
    return role in tp.feedback.cut and now_s - tp.feedback.cut[role][0] <= span_s


def roles_at_risk(
    roles: tuple[str, ...], tails: Tails, *, excess_in_flight: float
) -> dict[str, bool]:
    """Per role, whether what it answers for is at risk in the window: its observed tails
    (:data:`disagg_planner.core.feedback.ROLE_TAILS`) over their SLOs, or requests waiting
    beyond the arrival rate for the roles that serve the first token."""
    risky = {}
    for role in roles:
        ratio = tails.ratio(role)
        waiting = excess_in_flight >= 1 and "ttft" in ROLE_TAILS.get(role, ())
        risky[role] = (ratio is not None and ratio > 1.0) or waiting
    return risky


def _breach_targets(
    tp: ThroughputPlanner,
    now_s: float,
    status: DeploymentStatus,
    breaches: Mapping[str, RuleValue],
    steady: Mapping[str, RoleSizing],
    busy: Mapping[str, float] | None,
    desired: Mapping[str, int],
    cut_recently: Mapping[str, bool],
    restore_only: frozenset[str] = frozenset(),
) -> tuple[dict[str, int], list[str]]:
    """What each confirmed breach asks for
    (:func:`disagg_planner.core.feedback.breach_replicas`), the capacity correction it
    teaches, and a breached cut restored and remembered (only restored, for the roles in
    ``restore_only``: their breach was read at the servable quantile)."""
    window = tp.config.scale_down_stabilization_seconds
    wanted: dict[str, int] = {}
    notes: list[str] = []
    for role, breach in breaches.items():
        if not breach.value:
            continue
        tp.feedback.streak[role] = 0  # the next breach is confirmed afresh
        responds = breach_responds(
            role,
            now_s=now_s,
            previous=tp.feedback.last_breach.get(role),
            ratio=breach.value,
            window_s=window,
        )
        if not responds.value and not cut_recently[role]:
            notes += [breach.reason, responds.reason]
            notes += tp.feedback.learn(role, calm=True)
            continue
        tp.feedback.last_breach[role] = (now_s, breach.value)
        sized = steady[role].replicas
        rule = breach_replicas(
            role,
            ready=status.ready(role),
            desired=desired[role],
            sized=sized,
            tail_ratio=breach.value,
            busy=(busy or {}).get(role),
        )
        want = observed = int(rule.value)
        if cut_recently[role]:
            cut_s, before = tp.feedback.cut[role]
            if role in restore_only:
                # read among the servable prompts: the cut is what it shows, not the
                # count before it (a short window's tail of them is a few requests')
                if before <= desired[role]:
                    continue
                want = observed = before
            if before > want:
                want = before
            # kept one stabilisation window from now: the restore is a scale-up, which a
            # cut within the window would reverse (a flap)
            tp.feedback.cut_need[role] = (now_s + window, before)
            notes.append(
                f"{role}: breached after the cut at {cut_s:.0f} s: back to at least {before}, "
                f"kept until {now_s + window:.0f} s"
            )
        if want <= 0:
            continue
        wanted[role] = want
        notes += [breach.reason, rule.reason]
        if sized > 0 and observed > sized:
            # the model's error is what the observation asks over what it said
            notes += tp.feedback.learn(role, breach=observed / sized)
    return wanted, notes


def _ahead_held(
    tp: ThroughputPlanner,
    role: str,
    *,
    sized: RoleSizing,
    current: int,
    load_tokens_per_s: float,
    calm: Mapping[str, bool],
    since_s: float,
) -> str:
    """Why a rising trend's scale-up of ``role`` (its tail within its SLO) is held, or '':
    the need is within the HPA's tolerance of the replicas running while the tail is calm
    (:func:`disagg_planner.core.feedback.within_tolerance`, as the tick holds it), or the
    replicas were seen carrying the load it is sized for with the tail under the
    scale-down margin since ``since_s`` (a recurring peak:
    :func:`disagg_planner.core.served_load.served_holds`). What the trend anticipates was
    observed not to breach; a tail that rises to the SLO is at risk, which this does not
    hold."""
    _, tolerated = tp.sizer.within_tolerance({role: sized}, current={role: current}, calm=calm)
    if role in tolerated:
        return tolerated[role]
    proven = tp.feedback.proven(role, since_s=since_s, within=SCALE_DOWN_MARGIN)
    return served_holds(
        role,
        current=current,
        sized=sized.replicas,
        load_tokens_per_s=load_tokens_per_s,
        proven=proven,
        margin=SCALE_DOWN_MARGIN,
    ).reason


def _busy_window_rate(tp: ThroughputPlanner, now_s: float, span_s: float = 60.0) -> float:
    """The arrival rate over the last ``span_s`` of short windows (the busy fraction's own
    span), pooled."""
    return pooled_rate(tp.traffic.rate_samples, now_s=now_s, span_s=span_s)


def _unfixable(tp: ThroughputPlanner, recent: TrafficObservation, *, quantile: float) -> RuleValue:
    """:func:`disagg_planner.core.feedback.unfixable_tail` at the prompt length of the
    ``quantile`` the tail is read at (the window's ISL histogram, else the last
    interval's): past the servable quantile's floor, the prompts' own."""
    histogram = recent.isl_histogram or tp.traffic.isl_histogram
    if histogram is None or ("prefill" not in tp.config.roles and tp.config.mode != "agg"):
        return RuleValue(0.0, "")
    isl = histogram_quantile(histogram, quantile)
    if isl is None or isl <= 0:
        return RuleValue(0.0, "")
    own = tp.own_prefill_ms(isl)
    return unfixable_tail(own_ms=own, target_ms=tp.config.ttft_ms, isl=isl)
