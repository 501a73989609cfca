"""Profiling sweeps in the manner of Dynamo's pre-deployment profiler, against the simulated
engine or a real OpenAI-compatible endpoint, dense enough to cover the SLA range.

The sweep (what is measured, at which points) is :mod:`disagg_planner.simulator.sweep`; a real
endpoint is :mod:`disagg_planner.simulator.http_endpoint`. This module is their face and holds
the simulated engine as a sweep target, the manifests and the bundled profiles' layout.

The result is written in Dynamo's NPZ layout with ``disagg_planner.profiles.write_profile`` plus a
``profile.yaml`` manifest (``source: modelled`` for the simulator, ``measured`` for an
endpoint).
"""

from __future__ import annotations

import datetime as _dt
import math
from pathlib import Path

import numpy as np

from disagg_planner.predictors.traces import TraceRequest
from disagg_planner.profiles import EngineShape, ProfileManifest
from disagg_planner.signals.fpm import ForwardPassMetrics
from disagg_planner.simulator.cluster import Cluster
from disagg_planner.simulator.engine_spec import EngineSpec, coerce
from disagg_planner.simulator.engines import engine_for
from disagg_planner.simulator.errors import ProfilingError
from disagg_planner.simulator.http_endpoint import (
    DEFAULT_MAX_CONTEXT,
    HttpEndpoint,
    StreamResult,
    endpoint_manifest,
)
from disagg_planner.simulator.request import RequestRecord
from disagg_planner.simulator.sweep import (
    DEFAULT_GRANULARITY_CONCURRENCY,
    DEFAULT_GRANULARITY_DECODE,
    DEFAULT_GRANULARITY_PREFILL,
    DEFAULT_MAX_KV_USAGE,
    DEFAULT_MIN_CONTEXT,
    DecodeMeasurement,
    SweepConfig,
    SweepResult,
    SweepTarget,
    run_sweep,
)


class SimulatedEngine:
    """A :class:`SweepTarget` running the cluster simulator: prefill on one aggregated
    replica, decode on one decode replica fed by enough prefill replicas that prefill never
    limits the loop (as a profiler measures a decode worker)."""

    def __init__(self, spec: EngineSpec | str, *, seed: int = 0) -> None:
        self.spec = coerce(spec)
        self.model = engine_for(self.spec)
        self.gpus = self.spec.gpus
        self.dp = self.spec.dp
        self.max_kv_tokens = self.model.max_kv_tokens * self.spec.dp
        self.max_context = self.model.max_model_len
        self.max_num_seqs: int | None = self.spec.max_num_seqs * self.spec.dp
        self.seed = seed

    def prefill_ttft_ms(self, isl: int, *, concurrent: int) -> float:
        # One request per data-parallel rank at once on an idle engine (round-robin routing
        # puts one on each rank); the simulator is deterministic, so one round suffices.
        cluster = Cluster(engines={"agg": self.spec}, mode="agg", replicas={"agg": 1})
        n = max(1, concurrent)
        cluster.submit(
            TraceRequest(arrival_s=0.0, input_length=isl, output_length=1) for _ in range(n)
        )
        cluster.run_until(math.inf)
        ttfts = [r.ttft_ms for r in cluster.records if r.ttft_ms is not None]
        if len(ttfts) != n:
            raise ProfilingError(f"simulated prefill at ISL {isl} produced no first token")
        return float(np.mean(ttfts))

    def decode_point(
        self, isl: int, osl: int, *, concurrency: int, measured: int
    ) -> DecodeMeasurement:
        # Enough prefill replicas to keep the decode engine at ``concurrency``.
        t_prefill = self.model.prefill_time_s(isl)
        t_decode = osl * self.model.decode_step_time_s(
            max(1, concurrency // self.dp), isl + osl / 2
        )
        prefill_replicas = max(1, math.ceil(2 * concurrency * t_prefill / max(t_decode, 1e-6)))
        refills: list[RequestRecord] = []
        preemptions = 0
        # (time, duration, decoding requests, rank) of every decode iteration.
        steps: list[tuple[float, float, int, int]] = []
        # A warm-up wave, the measured requests, then one more wave so that the measured ones
        # finish before the batch drains (requests ending in the drain run with a shrinking
        # batch and would read several percent fast).
        target = 2 * concurrency + measured
        issued = concurrency
        last_submit_s = 0.0

        def on_record(rec: RequestRecord) -> None:
            nonlocal issued, last_submit_s, preemptions
            preemptions += rec.preemptions
            if rec.arrival_s > 0.0 and rec.osl == osl:
                refills.append(rec)
            if issued < target:
                issued += 1
                last_submit_s = cluster.now
                cluster.submit(
                    [TraceRequest(arrival_s=cluster.now, input_length=isl, output_length=osl)]
                )

        def on_fpm(fpm: ForwardPassMetrics) -> None:
            if fpm.worker_id.startswith("decode") and fpm.wall_time > 0:
                # Every row of a decode worker's step makes a token: the decoding requests
                # and the arrivals whose transferred KV lacks only the last prompt token
                # (recomputed, sampled in the same step). Counting the decoders alone paired
                # a step's time with a batch smaller than the one it ran: at short outputs,
                # where an arrival joins every few steps, the profile read 4-5% slow.
                sched = fpm.scheduled_requests
                steps.append(
                    (
                        cluster.now,
                        fpm.wall_time,
                        sched.num_decode_requests + sched.num_prefill_requests,
                        fpm.dp_rank,
                    )
                )

        cluster = Cluster(
            engines={"prefill": self.spec, "decode": self.spec},
            replicas={"prefill": prefill_replicas, "decode": 1},
            on_record=on_record,
            on_fpm=on_fpm,
            seed=self.seed,
        )
        # The first wave has staggered lengths so that completions (and refills) spread out
        # as in a steady state instead of finishing in lockstep.
        cluster.submit(
            TraceRequest(
                arrival_s=0.0,
                input_length=isl,
                output_length=max(2, round(osl * (i + 1) / concurrency)),
            )
            for i in range(concurrency)
        )
        cluster.run_until(math.inf)
        if not refills:
            raise ProfilingError(f"simulated decode at ISL {isl} x {concurrency} gave no ITL")
        # The steady state: from the first refill's finish (the warm-up wave is mixed in by
        # then) to the last submission (after it the batch drains).
        start_s = refills[0].finish_s
        window = [(t, d, b, r) for t, d, b, r in steps if start_s < t <= last_submit_s and b > 0]
        if not window:
            window = [(t, d, b, r) for t, d, b, r in steps if b > 0]
        # The engine's own view: the mean step time and the mean batch of a step (requests
        # between prefill and decode are not in it), so that ``running / ITL`` is the tokens
        # per second the engine made and a step time linear in batch and KV is reproduced
        # exactly. The client-side ITL would add each request's KV-transfer wait to its
        # first decode step, several percent at short outputs.
        itl_ms = 1000.0 * sum(d for _t, d, _b, _r in window) / len(window)
        ranks = {r for _t, _d, _b, r in window}
        if len(ranks) == 1:
            return DecodeMeasurement(
                itl_ms=itl_ms,
                running=sum(b for _t, _d, b, _r in window) / len(window),
                preemptions=preemptions,
            )
        # Data-parallel ranks step on their own and, below one request per rank, not all of
        # them all the time: the engine's batch is each rank's mean batch weighted by the
        # share of the window that rank was stepping.
        span = max(t for t, *_ in window) - min(t - d for t, d, *_ in window)
        running = 0.0
        for rank in ranks:
            mine = [(d, b) for _t, d, b, r in window if r == rank]
            busy = min(1.0, sum(d for d, _b in mine) / span) if span > 0 else 1.0
            running += busy * sum(b for _d, b in mine) / len(mine)
        return DecodeMeasurement(itl_ms=itl_ms, running=running, preemptions=preemptions)


def simulated_manifest(spec: EngineSpec, *, tool: str) -> ProfileManifest:
    shape = EngineShape(
        tp=spec.tp,
        dp=spec.dp,
        ep=spec.ep,
        gpus_per_engine=spec.gpus,
        max_num_batched_tokens=spec.max_num_batched_tokens,
        max_num_seqs=spec.max_num_seqs,
    )
    return ProfileManifest(
        model=spec.model.name,
        gpu=spec.gpu.name,
        backend=spec.backend,
        source="modelled",
        kv_block_size=spec.block_size,
        tool=tool,
        date=_dt.date.today().isoformat(),
        engine=shape,
        prefill_engine=shape,
        decode_engine=shape,
        extra={
            "engine_spec": str(spec),
            "model_notes": (
                "simulator roofline model calibrated in disagg_planner/simulator/CALIBRATION.md"
            ),
        },
    )


def parallelism_dirname(spec: EngineSpec) -> str:
    """``tp1``, ``tp4``, ``tp1-dp16-ep16``: the last folder of a bundled profile."""
    name = f"tp{spec.tp}"
    if spec.dp != 1:
        name += f"-dp{spec.dp}"
    if spec.ep != 1:
        name += f"-ep{spec.ep}"
    return name


def bundled_path(root: str | Path, spec: EngineSpec) -> Path:
    """``root/<gpu>/<backend>/<model>/<parallelism>`` for ``spec``."""
    return Path(root) / spec.gpu.name / spec.backend / spec.model.name / parallelism_dirname(spec)


__all__ = [
    "DEFAULT_GRANULARITY_CONCURRENCY",
    "DEFAULT_GRANULARITY_DECODE",
    "DEFAULT_GRANULARITY_PREFILL",
    "DEFAULT_MAX_CONTEXT",
    "DEFAULT_MAX_KV_USAGE",
    "DEFAULT_MIN_CONTEXT",
    "DecodeMeasurement",
    "HttpEndpoint",
    "SimulatedEngine",
    "StreamResult",
    "SweepConfig",
    "SweepResult",
    "SweepTarget",
    "bundled_path",
    "endpoint_manifest",
    "parallelism_dirname",
    "run_sweep",
    "simulated_manifest",
]
