"""The sizing formulas (:mod:`disagg_planner.core.sizing`) applied with one deployment's
settings, its learned corrections and what its traffic memory knows of the prompt lengths:
what the throughput tick, the fast check and the burst memory size with.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.core.demand import DemandSignals, decode_requests, prefill_requests
from disagg_planner.core.feedback import faster_than_profiled, within_tolerance
from disagg_planner.core.memory import TrafficMemory
from disagg_planner.core.rules import RuleValue, backlog_replica_cap, burst_memory, length_mix
from disagg_planner.core.sizing import (
    DECODE_SEQ_UTILISATION,
    CapacityProfile,
    CorrectionFactors,
    LoadForecast,
    RoleSizing,
    fractional_need,
    size_agg,
    size_decode,
    size_prefill,
)
from disagg_planner.core.types import DeploymentStatus
from disagg_planner.profiles.prefill import LoadedPrefill


class Sizer:
    """Sizes each role of one deployment (see the module doc); ``corrections`` reads the
    planner's current corrections (capacity at least the profile's), ``learned`` the
    corrections as learned (:meth:`held_by_observation`)."""

    def __init__(
        self,
        *,
        config: PlannerConfig,
        profile: CapacityProfile,
        traffic: TrafficMemory,
        corrections: Callable[[], CorrectionFactors],
        learned: Callable[[], CorrectionFactors] | None = None,
        sources: Mapping[str, str] | None = None,
        demand: DemandSignals | None = None,
        decode_max_num_seqs: int | None = None,
    ) -> None:
        self.config = config
        self.profile = profile
        self.traffic = traffic
        self.demand = demand if demand is not None else DemandSignals()
        self.corrections = corrections
        self.learned = learned if learned is not None else corrections
        # what each role's learned correction was read from (FeedbackMemory.estimate_source)
        self.sources = sources if sources is not None else {}
        self.decode_max_num_seqs = decode_max_num_seqs

    def length_mix(self) -> RuleValue:
        if "prefill" not in self.config.roles and self.config.mode != "agg":
            return RuleValue(1.0, "prompt-length mix: no prefill role")
        return length_mix(
            self.traffic.isl_histogram,
            self.profile.prefill.thpt_per_gpu,
            enabled=self.config.prefill_length_mix,
        )

    def size_with_backlog(
        self,
        forecast: LoadForecast,
        gpus: Mapping[str, int],
        status: DeploymentStatus,
        *,
        burst: float,
        backlog: RuleValue,
        length_mix: float,
        corrections: CorrectionFactors | None = None,
    ) -> tuple[dict[str, RoleSizing], dict[str, RoleSizing], list[str]]:
        """The sizing with the backlog drained over ``backlog_drain_seconds``, each role at
        most :func:`disagg_planner.core.rules.backlog_replica_cap` above its sizing without
        the backlog; that sizing (what the stabilisation remembers: a drained backlog does
        not come back, so it is no reason to keep its replicas); the cap's sentences.
        ``corrections`` replaces the planner's current ones."""
        steady = self.size(
            forecast, gpus, burst=burst, length_mix=length_mix, corrections=corrections
        )
        if backlog.value <= 0:
            return steady, steady, []
        sizing = self.size(
            forecast,
            gpus,
            burst=burst,
            backlog_tokens_per_s=backlog.value / self.config.backlog_drain_seconds,
            length_mix=length_mix,
            corrections=corrections,
        )
        notes: list[str] = []
        for role, sized in sizing.items():
            if not (sized.feasible and steady[role].feasible):
                continue
            cap = backlog_replica_cap(
                role,
                with_backlog=sized.replicas,
                without_backlog=steady[role].replicas,
                holding=status.ready(role) if role in status.roles else 0,
            )
            if cap.reason:
                sizing[role] = replace(sized, replicas=int(cap.value))
                notes.append(cap.reason)
        return sizing, steady, notes

    def burst_floor(
        self,
        now_s: float,
        sized_for: LoadForecast,
        gpus: Mapping[str, int],
        length_mix: float,
        time_to_ready_s: float,
        *,
        current: Mapping[str, int] | None = None,
        calm: Mapping[str, bool] | None = None,
    ) -> tuple[RuleValue, dict[str, RuleValue]]:
        """The burst memory rule (:func:`disagg_planner.core.rules.burst_memory`, over the
        windows after the opening) and the floor its remembered peak rate sets per role
        (sized as the forecast is, without the burst factor, which the short-window peak
        already is, and without a backlog); no floor when it remembers none or the profile
        cannot size it. Given the ``current`` replicas and which roles are ``calm``, a
        floor whose need is within the HPA's tolerance of those running is held at them, as
        the tick's own sizing is (:meth:`within_tolerance`): the peak remembered is one
        those replicas are sized to carry."""
        interval = self.config.throughput_adjustment_interval_seconds
        memory = burst_memory(
            self.traffic.after_opening(self.traffic.rate_samples, interval),
            now_s=now_s,
            time_to_ready_s=time_to_ready_s,
            memory_s=self.config.burst_memory_seconds,
        )
        if memory.value <= 0:
            return memory, {}
        peak = replace(sized_for, num_req=memory.value * interval)
        sizing = self.size(peak, gpus, length_mix=length_mix)
        if any(not s.feasible for s in sizing.values()):
            return memory, {}
        tolerated: dict[str, str] = {}
        if current is not None:
            sizing, tolerated = self.within_tolerance(sizing, current=current, calm=calm or {})
        return memory, {
            r: RuleValue(
                float(s.replicas),
                f"{r}: kept at {s.replicas}: the burst memory's floor"
                + (f" ({tolerated[r]})" if r in tolerated else ""),
            )
            for r, s in sizing.items()
        }

    def held_by_observation(
        self,
        forecast: LoadForecast,
        gpus: Mapping[str, int],
        status: DeploymentStatus,
        *,
        sized: tuple[dict[str, RoleSizing], dict[str, RoleSizing]],
        current: Mapping[str, int],
        calm: Mapping[str, bool],
        burst: float,
        backlog: RuleValue,
        length_mix: float,
    ) -> tuple[dict[str, RoleSizing], dict[str, RoleSizing], list[str]]:
        """``sized`` (:meth:`size_with_backlog`'s sizing and steady sizing) with each role
        whose tail is ``calm`` and whose learned capacity correction is below 1 held by
        :func:`disagg_planner.core.feedback.faster_than_profiled` against the ``current``
        replicas; the rule's sentences."""
        learned = self.learned()
        factor = {"decode": learned.decode_capacity}
        sizing, steady = dict(sized[0]), dict(sized[1])
        roles = [
            r
            for r in sizing
            if calm.get(r) and factor.get(r, learned.prefill_capacity) < 1.0 and r in current
        ]
        if not roles or self.config.no_correction:
            return sizing, steady, []
        faster = self.size_with_backlog(
            forecast,
            gpus,
            status,
            burst=burst,
            backlog=backlog,
            length_mix=length_mix,
            corrections=learned,
        )
        notes: list[str] = []
        for role in roles:
            for held, observed in ((sizing, faster[0]), (steady, faster[1])):
                rule = faster_than_profiled(
                    role,
                    current=current[role],
                    profiled=held[role].replicas,
                    observed=observed[role].replicas,
                    correction=factor.get(role, learned.prefill_capacity),
                    source=self.sources.get(role, "busy fraction"),
                )
                if rule.reason:  # the arithmetic shown is the learned correction's
                    held[role] = replace(observed[role], replicas=int(rule.value))
                    if held is sizing:
                        notes.append(rule.reason)
        return sizing, steady, notes

    def within_tolerance(
        self,
        sizing: Mapping[str, RoleSizing],
        *,
        current: Mapping[str, int],
        calm: Mapping[str, bool],
    ) -> tuple[dict[str, RoleSizing], dict[str, str]]:
        """``sizing`` with each role's scale-up for a need within the HPA's tolerance of its
        running replicas held while its tail is calm
        (:func:`disagg_planner.core.feedback.within_tolerance`); the rule's sentence per role
        it held."""
        out = dict(sizing)
        notes: dict[str, str] = {}
        if self.config.no_correction:
            return out, notes
        for role, sized in sizing.items():
            if role not in current:
                continue
            rule = within_tolerance(
                role,
                current=current[role],
                sized=sized.replicas,
                need=fractional_need(sized),
                calm=calm.get(role, False),
            )
            if rule.reason:
                out[role] = replace(sized, replicas=int(rule.value))
                notes[role] = rule.reason
        return out, notes

    def size(
        self,
        forecast: LoadForecast,
        gpus: Mapping[str, int],
        *,
        burst: float = 1.0,
        backlog_tokens_per_s: float = 0.0,
        length_mix: float = 1.0,
        corrections: CorrectionFactors | None = None,
    ) -> dict[str, RoleSizing]:
        """Each role's sizing (:mod:`disagg_planner.core.sizing`) with this deployment's
        settings and its corrections (``corrections`` when given; none with
        ``no_correction``)."""
        cfg = self.config
        interval = cfg.throughput_adjustment_interval_seconds
        if cfg.no_correction:
            corr = CorrectionFactors()
        else:
            corr = corrections if corrections is not None else self.corrections()
        engine_gpus_p = gpus.get("prefill", gpus.get("agg", 1))
        engine_gpus_d = gpus.get("decode", gpus.get("agg", 1))
        # issue 35: only uncached prompt tokens are prefilled; an iteration emits A tokens
        rules = self.demand.rules(cfg)
        prefill_forecast = replace(
            forecast, num_req=prefill_requests(forecast.num_req, rules.kv_hit)
        )
        decode_forecast = replace(forecast, num_req=decode_requests(forecast.num_req, rules.accept))

        def prefill_at(share: float) -> RoleSizing:
            return size_prefill(
                prefill_forecast,
                self.profile.prefill,
                interval_s=interval,
                correction=corr.prefill_capacity,
                gpus_per_replica=engine_gpus_p,
                ttft_target_ms=cfg.ttft_ms,
                attainment=cfg.ttft_attainment_target,
                service_scv=self.traffic.service_scv,
                pooled=cfg.prefill_queueing == "pooled",
                burst=burst,
                backlog_tokens_per_s=prefill_requests(backlog_tokens_per_s, rules.kv_hit),
                length_mix=length_mix,
                engine_share=share,
            )

        prefill = prefill_at(1.0)
        decode = size_decode(
            decode_forecast,
            self.profile.decode,
            interval_s=interval,
            itl_target_ms=cfg.itl_ms,
            correction=corr.decode,
            gpus_per_replica=engine_gpus_d,
            max_num_seqs=self.decode_max_num_seqs,
            seq_utilisation=DECODE_SEQ_UTILISATION,
            capacity=corr.decode_capacity,
            slower_iterations=cfg.mode != "agg",
        )
        if cfg.mode == "agg":
            return {
                "agg": size_agg(
                    prefill, decode, gpus_per_replica=gpus["agg"], prefill_at=prefill_at
                )
            }
        out: dict[str, RoleSizing] = {}
        if "prefill" in cfg.roles:
            out["prefill"] = prefill
        if "decode" in cfg.roles:
            out["decode"] = decode
        return out

    def explain(
        self, forecast: LoadForecast, sizing: Mapping[str, RoleSizing], target: Mapping[str, int]
    ) -> str:
        parts = [
            f"forecast {forecast.num_req:.1f} req, ISL {forecast.isl:.0f}, OSL {forecast.osl:.0f}"
        ]
        for role, s in sizing.items():
            at = f" at {s.utilisation:.0%}" if s.utilisation < 1 else ""
            parts.append(
                f"{role}: {s.demand_tokens_per_s:.0f} tok/s / {s.thpt_per_gpu:.0f} tok/s/GPU{at} "
                f"/ {s.gpus_per_replica} GPU -> {s.replicas}, after guards {target[role]}"
            )
        prefill = self.profile.prefill
        if isinstance(prefill, LoadedPrefill) and forecast.isl > 0:
            parts.append(prefill.describe(forecast.isl))
        return "; ".join(parts)
