"""A closed-loop serving benchmark on the simulated engine, run as vLLM's serving benchmark
client runs one (``vllm bench serve`` / ``benchmark_serving.py``) with ``--request-rate inf
--max-concurrency C --num-prompts N --dataset-name random --ignore-eos``.

The client samples every prompt's lengths first, uniformly from ``[int(r * L), L]`` per
request (the random dataset's ``--random-range-ratio r`` in its older releases), then keeps
``C`` requests in flight: ``C`` start at t = 0 and each finished one is followed at once by
the next, until ``N`` were sent. With ``--ignore-eos`` every output runs to its drawn length.
It reports, as that client does: the median TTFT, the median TPOT (per request, ``(e2e -
TTFT) / (osl - 1)``), and the total token throughput, input plus output tokens over the run's
duration (first send to last finish), here divided by the engine's GPUs.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

from disagg_planner.predictors.traces import TraceRequest
from disagg_planner.simulator.engines import engine_for
from disagg_planner.simulator.request import RequestRecord


@dataclass(frozen=True)
class ServingSettings:
    """The client's settings (its command-line flags)."""

    concurrency: int  # --max-concurrency
    prompts: int  # --num-prompts
    isl: int  # --random-input-len
    osl: int  # --random-output-len
    range_ratio: float  # --random-range-ratio

    def __post_init__(self) -> None:
        if min(self.concurrency, self.prompts, self.isl, self.osl) < 1:
            raise ValueError(f"serving benchmark {self}: counts and lengths must be >= 1")
        if not 0.0 < self.range_ratio <= 1.0:
            raise ValueError(f"serving benchmark {self}: range_ratio must be in (0, 1]")


def draw_lengths(settings: ServingSettings, seed: int) -> list[tuple[int, int]]:
    """Every prompt's (input, output) length, in the order the client sends them."""
    rng = random.Random(seed)
    s = settings
    low_in, low_out = max(1, int(s.isl * s.range_ratio)), max(1, int(s.osl * s.range_ratio))
    return [(rng.randint(low_in, s.isl), rng.randint(low_out, s.osl)) for _ in range(s.prompts)]


@dataclass(frozen=True)
class ServingResult:
    """One run's records and the client's metrics of it."""

    records: tuple[RequestRecord, ...]
    gpus: int

    @property
    def duration_s(self) -> float:
        # Every client starts at t = 0, so the run lasts until the last finish.
        return max(r.finish_s for r in self.records)

    @property
    def median_ttft_ms(self) -> float:
        return statistics.median(r.ttft_ms for r in self.records if r.ttft_ms is not None)

    @property
    def median_tpot_ms(self) -> float:
        # A one-token answer has no TPOT; the client leaves it out of the median.
        return statistics.median(r.itl_ms for r in self.records if r.itl_ms is not None)

    @property
    def throughput_per_gpu(self) -> float:
        tokens = sum(r.isl + r.osl for r in self.records)
        return tokens / self.duration_s / self.gpus


def run_serving(spec: str, settings: ServingSettings, seed: int) -> ServingResult:
    """The benchmark on one aggregated replica of ``spec`` with the lengths of ``seed``."""
    # Imported here: the cluster pulls in the whole scheduler.
    from disagg_planner.simulator.cluster import Cluster

    lengths = draw_lengths(settings, seed)
    sent = 0

    def request(arrival_s: float) -> TraceRequest:
        nonlocal sent
        isl, osl = lengths[sent]
        sent += 1
        return TraceRequest(arrival_s, isl, osl)

    def next_on_finish(_: RequestRecord) -> None:
        # The client's slot is free: it sends its next prompt at once.
        if sent < settings.prompts:
            cluster.submit([request(cluster.now)])

    cluster = Cluster(
        engines={"agg": spec}, mode="agg", replicas={"agg": 1}, on_record=next_on_finish
    )
    cluster.submit([request(0.0) for _ in range(min(settings.concurrency, settings.prompts))])
    cluster.run_to_completion()
    records = tuple(cluster.records)
    failed = [r for r in records if not r.ok]
    if failed or len(records) != settings.prompts:
        raise RuntimeError(
            f"serving benchmark on {spec}: {len(failed)} of {settings.prompts} requests failed "
            f"({failed[0].error if failed else f'{len(records)} records'})"
        )
    return ServingResult(records, cluster.engine_model("agg").spec.gpus)


@dataclass(frozen=True)
class SeededRuns:
    """The benchmark once per seed, and how many answers left the aic engine's grid."""

    results: tuple[ServingResult, ...]
    extrapolations: int

    def values(self, metric: str) -> list[float]:
        """Each seed's value of ``metric`` (``ttft``, ``itl``: the TPOT, or ``throughput``)."""
        of = {
            "ttft": lambda r: r.median_ttft_ms,
            "itl": lambda r: r.median_tpot_ms,
            "throughput": lambda r: r.throughput_per_gpu,
        }[metric]
        return [of(r) for r in self.results]


def seeded_runs(spec: str, settings: ServingSettings, seeds: int) -> SeededRuns:
    """The runs of seeds ``0 .. seeds - 1`` (not cached: the fit runs them at trial factors;
    the calibration caches them so that one benchmark's metrics share them)."""
    results = tuple(run_serving(spec, settings, seed) for seed in range(seeds))
    model = engine_for(spec)
    # Only the aic engine model has a measured grid to leave (its counts are shared by spec).
    outside = sum(getattr(model, "extrapolations", {}).values())
    return SeededRuns(results, outside)


__all__ = [
    "SeededRuns",
    "ServingResult",
    "ServingSettings",
    "draw_lengths",
    "run_serving",
    "seeded_runs",
]
