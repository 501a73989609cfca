"""The sizing formulas (:mod:`disagg_planner.core.sizing`) applied with one deployment's
settings, its learned corrections and what its traffic memory knows of the prompt lengths:
what the throughput tick, the fast check and the burst memory size with.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.core.demand import DemandSignals, decode_requests, prefill_requests
from disagg_planner.core.memory import TrafficMemory
from disagg_planner.core.rules import RuleValue, backlog_replica_cap, length_mix
from disagg_planner.core.sizing import (
    DECODE_SEQ_UTILISATION,
    CapacityProfile,
    CorrectionFactors,
    LoadForecast,
    RoleSizing,
    size_agg,
    size_decode,
    size_prefill,
)
from disagg_planner.core.types import DeploymentStatus


class Sizer:
    """Sizes each role of one deployment (see the module doc); ``corrections`` reads the
    planner's current corrections."""

    def __init__(
        self,
        *,
        config: PlannerConfig,
        profile: CapacityProfile,
        traffic: TrafficMemory,
        corrections: Callable[[], CorrectionFactors],
        demand: DemandSignals | None = None,
        decode_max_num_seqs: int | None = None,
    ) -> None:
        self.config = config
        self.profile = profile
        self.traffic = traffic
        self.demand = demand if demand is not None else DemandSignals()
        self.corrections = corrections
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
    ) -> tuple[dict[str, RoleSizing], dict[str, RoleSizing], list[str]]:
        """The sizing with the backlog drained over ``backlog_drain_seconds``, each role at
        most :func:`disagg_planner.core.rules.backlog_replica_cap` above its sizing without
        the backlog; that sizing (what the stabilisation remembers: a drained backlog does
        not come back, so it is no reason to keep its replicas); the cap's sentences."""
        steady = self.size(forecast, gpus, burst=burst, length_mix=length_mix)
        if backlog.value <= 0:
            return steady, steady, []
        sizing = self.size(
            forecast,
            gpus,
            burst=burst,
            backlog_tokens_per_s=backlog.value / self.config.backlog_drain_seconds,
            length_mix=length_mix,
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

    def size(
        self,
        forecast: LoadForecast,
        gpus: Mapping[str, int],
        *,
        burst: float = 1.0,
        backlog_tokens_per_s: float = 0.0,
        length_mix: float = 1.0,
    ) -> dict[str, RoleSizing]:
        """Each role's sizing (:mod:`disagg_planner.core.sizing`) with this deployment's
        settings and its corrections (none with ``no_correction``)."""
        cfg = self.config
        interval = cfg.throughput_adjustment_interval_seconds
        corr = self.corrections() if not cfg.no_correction else CorrectionFactors()
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
                service_scv=self.traffic.isl_scv,
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

    @staticmethod
    def explain(
        forecast: LoadForecast, sizing: Mapping[str, RoleSizing], target: Mapping[str, int]
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
        return "; ".join(parts)
