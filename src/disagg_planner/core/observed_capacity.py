"""What the throughput loop learns from what it observes, beside what its profile predicts:
the prefill capacity correction from its engines' busy fraction or, without one, the
frontend's mean TTFT; the replicas seen serving a load calmly (which lower the burst memory's
floors); the window's tails against the SLO and which roles are calm.

:class:`LearnsFromObservation` is the part of
:class:`disagg_planner.core.throughput.ThroughputPlanner` that the tick and the fast check
(:mod:`disagg_planner.core.fast_check`) share for this; the rules themselves are the pure
functions of :mod:`disagg_planner.core.feedback`. No clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.core.feedback import (
    LATENCY_WINDOWS,
    SCALE_DOWN_MARGIN,
    FeedbackMemory,
    Tails,
    busy_capacity_estimate,
    observed_tails,
    scale_down_margin,
    servable_quantile,
    served_calmly,
)
from disagg_planner.core.latency_capacity import (
    TtftReading,
    latency_capacity_estimate,
    loaded_capacity_estimate,
)
from disagg_planner.core.memory import TrafficMemory
from disagg_planner.core.rules import RuleValue
from disagg_planner.core.served_load import served_holds
from disagg_planner.core.sizer import Sizer
from disagg_planner.core.sizing import (
    CapacityProfile,
    CorrectionFactors,
    LoadForecast,
    RoleSizing,
    latency_ratios,
)
from disagg_planner.core.types import (
    DeploymentStatus,
    TrafficObservation,
    histogram_share_above,
)

# The TTFT quantile the fast path reads when no attainment target is configured.
DEFAULT_FAST_TTFT_QUANTILE = 0.99
# The ITL ratio below 1 the sizing believes is the slowest of the tick windows this recent.
ITL_RATIO_SPAN_S = 1800.0
# The longest prompt the servable quantile considers (tokens): beyond any model's context.
LONGEST_PROMPT = 10_000_000.0


class LearnsFromObservation:
    """The observation side of the throughput planner (its state is the planner's)."""

    config: PlannerConfig
    profile: CapacityProfile
    sizer: Sizer
    feedback: FeedbackMemory
    traffic: TrafficMemory
    latency: CorrectionFactors
    # whether the decoding role's tail was calm in the last window seen (:meth:`see_calm`):
    # the sizing believes an ITL ratio below 1 only then (:meth:`sizing_corrections`)
    decode_calm: bool = False

    def learn_from_busy(
        self,
        status: DeploymentStatus,
        busy: Mapping[str, float] | None,
        *,
        rate: float,
        isl: float,
        calm: Mapping[str, bool],
        window: TrafficObservation | None = None,
    ) -> list[str]:
        """The prefill capacity correction from what is observed against the offered load:
        its engines' busy fraction where they report one
        (:func:`disagg_planner.core.feedback.busy_capacity_estimate`; below 1 only while
        prefill is ``calm``: :meth:`calm`), else the frontend's mean TTFT of ``window`` at
        its own rate and prompts (:meth:`learn_from_latency`)."""
        if self.config.no_correction or "prefill" not in status.roles:
            return []
        prefill_busy = busy.get("prefill") if busy is not None else None
        if prefill_busy is None and window is not None:
            return self.learn_from_latency(status, window, calm=calm.get("prefill", False))
        if prefill_busy is None or isl <= 0:
            return []
        offered = self.offered_prefill_engines(status, rate=rate, isl=isl)
        estimate = busy_capacity_estimate(
            busy=prefill_busy,
            offered_engines=offered,
            ready=status.ready("prefill"),
            calm=calm.get("prefill", False),
        )
        if estimate is None:
            return []
        return self.feedback.learn("prefill", busy_estimate=estimate)

    def offered_prefill_engines(
        self, status: DeploymentStatus, *, rate: float, isl: float
    ) -> float:
        """The offered prefill load in engines' worth of profiled work (the length mix's)."""
        thpt = self.profile.prefill.thpt_per_gpu(isl) if isl > 0 else 0.0
        gpus = status.roles["prefill"].gpus_per_replica
        if thpt <= 0:
            return 0.0
        return rate * isl * self.sizer.length_mix().value / (thpt * gpus)

    def learn_from_latency(
        self, status: DeploymentStatus, window: TrafficObservation, *, calm: bool = False
    ) -> list[str]:
        """The prefill capacity correction the window's mean TTFT says at its own rate and
        mean prompt (:mod:`disagg_planner.core.latency_capacity`), while prefill has
        converged (a queue left by a change still starting is no engine's speed): at light
        load the engine's own speed, never below 1, the lowest of the last
        :data:`disagg_planner.core.feedback.LATENCY_WINDOWS` (waiting only adds); under load
        and ``calm`` (the tail under the scale-down margin), a mean under what the
        profile's queue predicts, below 1 only."""
        if (
            window.num_req <= 0
            or window.isl is None
            or window.isl <= 0
            or status.ready("prefill") < status.desired("prefill")
        ):
            return []
        reading = TtftReading(
            ttft_ms=window.ttft_ms,
            own_ms=self.profile.prefill.ttft_ms(window.isl) * self.sizer.length_mix().value,
            offered_engines=self.offered_prefill_engines(
                status, rate=window.request_rate, isl=window.isl
            ),
            ready=status.ready("prefill"),
            service_scv=self.traffic.service_scv,
            # the frontend's TTFT ends at the decode engine's first step, one ITL
            first_token_ms=(window.itl_ms or 0.0) if "decode" in self.config.roles else 0.0,
        )
        estimate = latency_capacity_estimate(reading)
        if estimate is not None:
            lowest = self.feedback.latency_estimate("prefill", estimate)
            return self.feedback.learn(
                "prefill",
                busy_estimate=lowest,
                source=f"mean TTFT (lowest of {LATENCY_WINDOWS})",
            )
        loaded = loaded_capacity_estimate(reading) if calm else None
        if loaded is None:
            return []
        return self.feedback.learn("prefill", busy_estimate=loaded, source="mean TTFT at load")

    @staticmethod
    def role_tokens(role: str, *, rate: float, isl: float, osl: float) -> float:
        """The tokens per second ``role`` works on at ``rate`` requests per second."""
        per_request = {"prefill": isl, "decode": osl}.get(role, isl + osl)
        return rate * per_request

    def see_served(
        self,
        now_s: float,
        status: DeploymentStatus,
        window: TrafficObservation,
        *,
        backlog: float,
    ) -> None:
        """Remember each role whose ready replicas served ``window`` within its SLO with no
        backlog (:func:`disagg_planner.core.feedback.served_calmly`; replicas still
        starting serve nothing yet)."""
        if window.num_req <= 0 or window.isl is None or window.osl is None or backlog > 0:
            return
        tails = self.tails(window)
        for role in self.config.roles:
            ratio = tails.ratio(role)
            if ratio is None:
                continue
            tokens = self.role_tokens(
                role, rate=window.request_rate, isl=window.isl, osl=window.osl
            )
            self.feedback.serve(
                role, now_s=now_s, tokens_per_s=tokens, ready=status.ready(role), ratio=ratio
            )

    def held_by_served(
        self,
        sizing: Mapping[str, RoleSizing],
        *,
        current: Mapping[str, int],
        sized_for: LoadForecast,
        burst: float,
    ) -> tuple[dict[str, RoleSizing], list[str]]:
        """``sizing`` with each role's scale-up held where its current replicas were seen
        serving the load sized for (at its short-window peak, the burst factor's: the
        windows served were short ones) with the tail under the margin a cut needs
        (:data:`disagg_planner.core.feedback.SCALE_DOWN_MARGIN` of its SLO:
        :func:`disagg_planner.core.served_load.served_holds`); the rule's sentences."""
        interval = self.config.throughput_adjustment_interval_seconds
        rate = sized_for.num_req / interval * max(1.0, burst)
        out, notes = dict(sizing), []
        for role, sized in sizing.items():
            if role not in current or self.config.no_correction:
                continue
            rule = served_holds(
                role,
                current=current[role],
                sized=sized.replicas,
                load_tokens_per_s=self.role_tokens(
                    role, rate=rate, isl=sized_for.isl, osl=sized_for.osl
                ),
                proven=self.feedback.proven(role, since_s=-math.inf, within=SCALE_DOWN_MARGIN),
                margin=SCALE_DOWN_MARGIN,
            )
            if rule.reason:
                out[role] = replace(sized, replicas=int(rule.value))
                notes.append(rule.reason)
        return out, notes

    def served_floors(
        self,
        now_s: float,
        floors: Mapping[str, RuleValue],
        *,
        peak_rate: float,
        sized_for: LoadForecast,
    ) -> tuple[dict[str, RuleValue], list[str]]:
        """The burst memory's floors, each lowered to the replicas seen serving its peak
        calmly within the burst memory's span: their tail under the scale-down margin, as
        any cut needs (:func:`disagg_planner.core.feedback.served_calmly`); a window served
        just inside the SLO is often the one before a breach. The rule's sentences."""
        span = self.config.burst_memory_seconds
        if not floors or span is None or self.config.no_correction:
            return dict(floors), []
        out = dict(floors)
        notes: list[str] = []
        for role, floor in floors.items():
            rule = served_calmly(
                role,
                floor=int(floor.value),
                peak_tokens_per_s=self.role_tokens(
                    role, rate=peak_rate, isl=sized_for.isl, osl=sized_for.osl
                ),
                proven=self.feedback.proven(role, since_s=now_s - span, within=SCALE_DOWN_MARGIN),
            )
            if rule.reason:
                out[role] = rule
                notes.append(rule.reason)
        return out, notes

    def tails(self, obs: TrafficObservation, *, servable: bool = False) -> Tails:
        """The window's observed latencies against the SLO
        (:func:`disagg_planner.core.feedback.observed_tails`); with ``servable``, the TTFT
        tail at the attainment quantile of the prompts prefill can serve within it
        (:meth:`servable_quantile`)."""
        quantile = self.config.ttft_attainment_target or DEFAULT_FAST_TTFT_QUANTILE
        return observed_tails(
            obs,
            ttft_target_ms=self.config.ttft_ms,
            itl_target_ms=self.config.itl_ms,
            quantile=self.servable_quantile(obs).value if servable else quantile,
        )

    def servable_quantile(self, obs: TrafficObservation) -> RuleValue:
        """The attainment quantile read among the prompts whose own prefill
        (:meth:`own_prefill_ms`) fits in the TTFT SLO
        (:func:`disagg_planner.core.feedback.servable_quantile`; the window's prompt-length
        histogram, else the last interval's); the configured one where no histogram says
        how many do not."""
        quantile = self.config.ttft_attainment_target or DEFAULT_FAST_TTFT_QUANTILE
        histogram = obs.isl_histogram or self.traffic.isl_histogram
        if histogram is None or ("prefill" not in self.config.roles and self.config.mode != "agg"):
            return RuleValue(quantile, "")
        longest = self.longest_prompt_within_slo()
        if longest is None:
            return RuleValue(quantile, "")
        return servable_quantile(
            quantile, unservable_share=histogram_share_above(histogram, longest), max_isl=longest
        )

    def own_prefill_ms(self, isl: float) -> float:
        """A prompt of ``isl`` tokens' own prefill: the profile's TTFT at its length times
        the learned prefill capacity correction where that is above 1 (engines slower than
        profiled; below 1 it reads what batching gains under load, not one prompt's
        speed)."""
        return self.profile.prefill.ttft_ms(isl) * max(1.0, self.feedback.correction("prefill"))

    def longest_prompt_within_slo(self) -> float | None:
        """The prompt length whose prefill alone takes the TTFT SLO (:meth:`own_prefill_ms`,
        found by bisection on its rising TTFT curve); None where every length up to
        :data:`LONGEST_PROMPT` fits, or none does."""
        target = self.config.ttft_ms
        ttft = self.own_prefill_ms
        lo, hi = 1.0, LONGEST_PROMPT
        if ttft(lo) >= target or ttft(hi) < target:
            return None
        for _ in range(40):
            mid = math.sqrt(lo * hi)  # lengths span decades: halve the ratio
            lo, hi = (mid, hi) if ttft(mid) < target else (lo, mid)
        return lo

    def see_latency(self, obs: TrafficObservation, status: DeploymentStatus) -> None:
        """Dynamo's latency ratios of the tick's window
        (:func:`disagg_planner.core.sizing.latency_ratios`), its ITL ratio remembered when
        the window measured one (its ITL, request duration and requests)."""
        self.latency = latency_ratios(obs, self.profile, status, self.latency)
        if obs.num_req > 0 and obs.itl_ms is not None and obs.request_duration_s is not None:
            self.traffic.itl_ratios.append((obs.end_s, self.latency.decode))

    def see_calm(self, obs: TrafficObservation) -> dict[str, bool]:
        """:meth:`calm`, the decoding role's remembered for :meth:`sizing_corrections`."""
        calm = self.calm(obs)
        self.decode_calm = calm.get("decode" if "decode" in calm else "agg", False)
        return calm

    def sizing_corrections(self, learned: CorrectionFactors) -> CorrectionFactors:
        """What the sizing sizes with, of the ``learned`` corrections: the capacity
        corrections at least 1 (below 1, only :func:`disagg_planner.core.feedback.
        faster_than_profiled` believes them), and Dynamo's ITL ratio below 1 (engines
        decoding faster than profiled at the observed load: speculative decoding, a faster
        engine version) only while the decoding role's tail was calm in the last window seen
        (under :data:`disagg_planner.core.feedback.SCALE_DOWN_MARGIN` of its SLO). A tail
        that rises past the margin puts it back at 1 at the next window; a cut it licensed
        that breaches comes back at once (the fast check's cut rule)."""
        decode = max(1.0, learned.decode)
        if self.decode_calm and learned.decode < 1.0:
            # the slowest of the recent windows: the ratio shrinks towards 1 as the batch
            # grows, and the sizing plans for the peak, not the trough it is read at
            ratios = self.traffic.itl_ratios
            since = ratios[-1][0] - ITL_RATIO_SPAN_S if ratios else 0.0
            decode = min(1.0, max([learned.decode, *(r for t, r in ratios if t >= since)]))
        return replace(
            learned,
            decode=decode,
            prefill_capacity=max(1.0, learned.prefill_capacity),
            decode_capacity=max(1.0, learned.decode_capacity),
        )

    def calm(self, obs: TrafficObservation) -> dict[str, bool]:
        """Per role: its observed tail in ``obs`` under the scale-down margin
        (:func:`disagg_planner.core.feedback.scale_down_margin`); False with none observed."""
        tails = self.tails(obs)
        return {
            r: tails.ratio(r) is not None and scale_down_margin(r, ratio=tails.ratio(r)).value > 0
            for r in self.config.roles
        }
