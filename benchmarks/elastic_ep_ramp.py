"""The ramp experiment of vLLM's elastic-EP post (seed 002), replayed on the simulator.

Usage::

    python benchmarks/elastic_ep_ramp.py [--json] [--seed N]

Scenario (the post's, with what it does not say filled in and marked):

- one aggregated DeepSeek wide-EP engine on GB200, TP1, DP/EP 16 (``sim:deepseek-v3@gb200:
  tp1:dp16:ep16``; the post served DeepSeek V4 Pro, which the simulator's catalogue does not
  have, so DeepSeek-V3's architecture stands in), 16 GPUs at the start;
- 11,391 requests whose rate ramps linearly from 8 to 16 req/s (949 s; Poisson arrivals
  conditioned on the count, so every seed has exactly 11,391);
- request lengths are not in the post: ISL uniform 8,500-13,500 and OSL uniform 1,200-2,800
  tokens, chosen so that the 16-GPU engine saturates (rolling p95 TTFT above 5 s) inside the
  ramp, at 13-14 req/s, and the 20-GPU engine carries 16 req/s, as in the post (the ISL was
  7,000-11,000 until issue 31's refit made vLLM prefill faster: at those lengths 16 GPUs
  carried the whole ramp, and the experiment no longer had an overload to resize for);
- SLO: rolling 30 s p95 TTFT below 5 s, by arrival time; a request without a first token
  within 30 s is abandoned by the client and counted as failed with a 30 s TTFT (the post's
  penalty). The simulated frontend drops queued requests after 30 s; an engine keeps working
  on abandoned requests it already holds (the simulator cannot abort them), which makes an
  overloaded engine somewhat worse than a real one.

Policies:

- ``fixed-16``: 16 GPUs throughout;
- ``restart-20``: the elastic policy times the change, which is done by restarting the engine
  with 20 GPUs: 197 s without service (the post's measurement), all 20 GPUs allocated;
- ``elastic-blocking`` / ``elastic-async`` / ``elastic-nixl``: the elastic policy
  (:mod:`disagg_planner.core.elastic`, every 30 s, DP 16 -> 20 in one step of 4 ranks) resizing in
  place with the mode's measured timings (:mod:`disagg_planner.profiles.elastic_resize`).

The policy sees what it would see in production: 30 s windows of the simulated frontend's
Prometheus metrics, and sizes from the bundled DeepSeek-V3 GB200 DP16 profile. GPU-hours
are metered from 0 to the last arrival. A simulated restart is an elastic resize without
preparation whose whole duration is downtime (the simulator has no restart operation).
The simulator queues requests that arrive while a resize pauses serving; vLLM answers them
503. The table counts them ("arrived in pause"): without a retrying frontend they are
rejected, so ``completed`` minus that count is what a real engine completes.

``--json`` prints ``{"policies": [{"name", "requests", "completed",
"max_rolling_p95_ttft_s", "seconds_above_slo", "gpu_hours", "arrived_in_pause",
"rejected"}]}``.

``--replay`` runs the same requests through ``planner replay`` instead of this script's own
driver (:mod:`disagg_planner.replay.session`, the live loop's elastic-EP driver on the
simulated engine): ``fixed-16`` (``static:1``), ``elastic-blocking`` / ``elastic-async`` /
``elastic-nixl`` (the planner with ``elastic_ep_mode`` set) and ``elastic-nixl-retry``
(``elastic_ep_frontend_retries``). There the engine answers requests arriving during a pause
503 as vLLM does: they are ``rejected`` (failed; counted as 30 s TTFTs in the rolling p95),
unless the frontend retries, which sends them after the pause. GPU-hours are replay's: every
GPU from 0 until the last request finished; the router is round robin, as this script's own
cluster's. ``restart-20`` has no replay counterpart (the
simulator has no engine restart), and replay has no client timeout (a request queued past
30 s is served late, and counted as a 30 s TTFT and not completed).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import math
import random
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# Run as a script, this folder comes first on sys.path, and benchmarks/predictors.py would
# shadow the predictors package: look in the repository root first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results_block import RESULTS, markers, write_block
from disagg_planner.config.schema import PlannerConfig
from disagg_planner.core.elastic import ElasticPlanner
from disagg_planner.observe.window import snapshot_from_text, traffic_from_snapshots
from disagg_planner.predictors.traces import TraceRequest
from disagg_planner.profiles import elastic_resize, load_profile
from disagg_planner.profiles.elastic_resize import ElasticEpMode, ResizeTiming
from disagg_planner.profiles.profile import Profile
from disagg_planner.profiles.registry import resolve_profile
from disagg_planner.replay import session
from disagg_planner.simulator.cluster import Cluster, ReplicaState
from disagg_planner.simulator.elastic_ep import ResizePlan
from disagg_planner.simulator.request import RequestRecord
from disagg_planner.simulator.workloads import LengthDist

ENGINE = "sim:deepseek-v3@gb200:tp1:dp16:ep16"
PROFILE = "gb200/vllm/deepseek-v3/tp1-dp16-ep16"
ROLE = "agg"
REQUESTS = 11_391
START_RPS, END_RPS = 8.0, 16.0
ISL = LengthDist("uniform", 8500, 13500)
OSL = LengthDist("uniform", 1200, 2800)
START_DP, MAX_DP, DP_STEP = 16, 20, 4
TTFT_SLO_S = 5.0
WINDOW_S = 30.0  # rolling p95 window
PENALTY_S = 30.0  # client timeout = TTFT counted for a failed request
RESTART_S = 197.0
INTERVAL_S = 30.0  # planner tick
ITL_TARGET_MS = 100.0  # the post sets no ITL target; decode is sized at this one
POLICIES = ("fixed-16", "restart-20", "elastic-blocking", "elastic-async", "elastic-nixl")
REPLAY_POLICIES = (
    "fixed-16",
    "elastic-blocking",
    "elastic-async",
    "elastic-nixl",
    "elastic-nixl-retry",
)
RESTART_MODE = "restart"


# --- workload --------------------------------------------------------------------------------


def ramp_duration_s(n: int, start_rps: float, end_rps: float) -> float:
    """Length of a linear ramp whose mean rate carries ``n`` requests."""
    return n / ((start_rps + end_rps) / 2.0)


def ramp_requests(
    n: int, *, start_rps: float, end_rps: float, seed: int, isl: LengthDist, osl: LengthDist
) -> list[TraceRequest]:
    """``n`` arrivals of a Poisson process with rate rising linearly from ``start_rps`` to
    ``end_rps``, conditioned on ``n`` arrivals: i.i.d. times with density proportional to the
    rate (inverse CDF of ``a t + (b - a) t^2 / 2D``), sorted."""
    if n < 1 or start_rps <= 0 or end_rps <= 0:
        raise ValueError(f"ramp: n={n}, start_rps={start_rps}, end_rps={end_rps} must be > 0")
    duration = ramp_duration_s(n, start_rps, end_rps)
    rng = random.Random(seed)
    lengths = random.Random(seed + 1_000_003)
    k = (end_rps - start_rps) / duration  # rate slope, req/s per s
    total = (start_rps + end_rps) / 2.0 * duration
    times = []
    for _ in range(n):
        u = rng.random() * total  # cumulative intensity to invert: a t + k t^2 / 2 = u
        t = u / start_rps if k == 0 else (-start_rps + math.sqrt(start_rps**2 + 2 * k * u)) / k
        times.append(min(t, duration))
    times.sort()
    return [
        TraceRequest(
            arrival_s=t, input_length=isl.sample(lengths), output_length=osl.sample(lengths)
        )
        for t in times
    ]


# --- accounting ------------------------------------------------------------------------------


def effective_ttft_s(record: RequestRecord, *, penalty_s: float = PENALTY_S) -> float:
    """TTFT as the client measures it: a failed request, or one without a first token within
    the client timeout, counts as ``penalty_s``."""
    if not record.ok or record.ttft_ms is None:
        return penalty_s
    return min(record.ttft_ms / 1000.0, penalty_s)


def completed(record: RequestRecord, *, penalty_s: float = PENALTY_S) -> bool:
    """Finished with its first token within the client timeout."""
    return record.ok and record.ttft_ms is not None and record.ttft_ms / 1000.0 <= penalty_s


def rolling_p95(
    records: Sequence[RequestRecord],
    *,
    end_s: float,
    window_s: float = WINDOW_S,
    step_s: float = 1.0,
    penalty_s: float = PENALTY_S,
) -> list[tuple[float, float]]:
    """``(t, p95)`` every ``step_s`` from ``window_s`` to ``end_s``: the 95th percentile
    (linear interpolation) of the effective TTFT of requests arriving in ``(t - window_s, t]``;
    a window without requests is skipped."""
    ordered = sorted(records, key=lambda r: r.arrival_s)
    arrivals = [r.arrival_s for r in ordered]
    ttfts = np.array([effective_ttft_s(r, penalty_s=penalty_s) for r in ordered])
    out: list[tuple[float, float]] = []
    steps = math.floor((end_s - window_s) / step_s + 1e-9)
    for i in range(steps + 1):
        t = window_s + i * step_s
        lo = bisect.bisect_right(arrivals, t - window_s)
        hi = bisect.bisect_right(arrivals, t)
        if hi > lo:
            out.append((t, float(np.percentile(ttfts[lo:hi], 95))))
    return out


def highest_per_minute(series: Sequence[tuple[float, float]]) -> list[float]:
    """The highest value of a rolling series in each minute it covers."""
    by_minute: dict[int, float] = {}
    for t, v in series:
        minute = int((t - 1e-9) // 60)
        by_minute[minute] = max(by_minute.get(minute, 0.0), v)
    return [by_minute[m] for m in sorted(by_minute)]


def seconds_above(series: Sequence[tuple[float, float]], threshold: float, step_s: float) -> float:
    """Time during which the rolling value exceeds ``threshold`` (one step per point)."""
    return float(sum(step_s for _, v in series if v > threshold))


# --- running one policy ----------------------------------------------------------------------


def arrivals_in_pauses(requests: Sequence[TraceRequest], resizes: Sequence[ResizePlan]) -> int:
    """Requests arriving while a resize paused serving (``[downtime start, end)``): the ones
    vLLM answers 503."""
    return sum(1 for r in requests for p in resizes if p.downtime_start_s <= r.arrival_s < p.end_s)


@contextlib.contextmanager
def restart_mode(downtime_s: float) -> Iterator[ElasticEpMode]:
    """A restart as the simulator can play it: a resize with no preparation whose whole
    duration is downtime, registered under ``restart`` while the block runs."""
    timing = ResizeTiming(total_s=downtime_s, downtime_s=downtime_s)
    mode = ElasticEpMode(RESTART_MODE, up=timing, down=timing, description="engine restart")
    elastic_resize.MODES[RESTART_MODE] = mode
    try:
        yield mode
    finally:
        elastic_resize.MODES.pop(RESTART_MODE, None)


@dataclass
class PolicyResult:
    name: str
    requests: int
    completed: int
    max_rolling_p95_ttft_s: float
    seconds_above_slo: float
    gpu_hours: float
    # Requests arriving while a resize paused serving: vLLM answers them 503 (rejected unless
    # the frontend retries); the simulator queues them, so ``completed`` still counts them.
    arrived_in_pause: int = 0
    # Rejected with 503 during a pause (--replay, frontend not retrying): failed requests.
    rejected: int = 0
    resizes: list[str] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)
    p95_by_minute: list[float] = field(default_factory=list)
    wall_s: float = 0.0

    def public(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "requests": self.requests,
            "completed": self.completed,
            "max_rolling_p95_ttft_s": round(self.max_rolling_p95_ttft_s, 3),
            "seconds_above_slo": round(self.seconds_above_slo, 1),
            "gpu_hours": round(self.gpu_hours, 3),
            "arrived_in_pause": self.arrived_in_pause,
            "rejected": self.rejected,
        }


def planner_config() -> PlannerConfig:
    return PlannerConfig(
        mode="agg",
        environment="virtual",
        decode_engine_num_gpu=START_DP,
        ttft_ms=TTFT_SLO_S * 1000.0,
        itl_ms=ITL_TARGET_MS,
        throughput_adjustment_interval_seconds=INTERVAL_S,
        max_gpu_budget=-1,
        elastic_ep=ROLE,
        elastic_ep_mode="nixl",
        elastic_ep_dp_step=DP_STEP,
        elastic_ep_min_dp=START_DP,
        elastic_ep_max_dp=MAX_DP,
        elastic_ep_gpus_per_rank=1,
    )


def run_policy(
    name: str, requests: Sequence[TraceRequest], *, profile: Profile, seed: int
) -> PolicyResult:
    """Replay ``requests`` under policy ``name`` (see the module doc)."""
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    wall0 = time.perf_counter()
    cluster = Cluster(
        engines={ROLE: ENGINE},
        mode="agg",
        replicas={ROLE: 1},
        request_timeout_s=PENALTY_S,
        seed=seed,
    )
    cluster.submit(requests)
    last_arrival = requests[-1].arrival_s
    decisions: list[str] = []
    with contextlib.ExitStack() as stack:
        mode_name: str | None = None
        timing: ElasticEpMode | None = None
        if name == "restart-20":
            timing = stack.enter_context(restart_mode(RESTART_S))
            mode_name = RESTART_MODE
        elif name.startswith("elastic-"):
            mode_name = {"blocking": "blocking", "async": "async", "nixl": "nixl_ep"}[
                name.removeprefix("elastic-")
            ]
            timing = elastic_resize.mode(mode_name)
        if mode_name is not None and timing is not None:
            _drive(
                cluster,
                ElasticPlanner(config=planner_config(), profile=profile, timing=timing),
                mode_name=mode_name,
                until_s=last_arrival,
                decisions=decisions,
            )
        cluster.run_until(last_arrival)
        gpu_seconds = cluster.gpu_seconds
        cluster.run_to_completion(limit_s=last_arrival + 3600.0)
    records = list(cluster.records)
    series = rolling_p95(records, end_s=last_arrival)
    return PolicyResult(
        name=name,
        requests=len(requests),
        completed=sum(1 for r in records if completed(r)),
        max_rolling_p95_ttft_s=max((v for _, v in series), default=0.0),
        seconds_above_slo=seconds_above(series, TTFT_SLO_S, 1.0),
        gpu_hours=gpu_seconds / 3600.0,
        arrived_in_pause=arrivals_in_pauses(requests, cluster.resizes),
        resizes=[
            f"{p.from_dp}->{p.to_dp} {p.mode} at {p.start_s:.0f} s, serving paused "
            f"{p.downtime_s:.1f} s from {p.downtime_start_s:.0f} s"
            for p in cluster.resizes
        ],
        decisions=decisions,
        p95_by_minute=highest_per_minute(series),
        wall_s=time.perf_counter() - wall0,
    )


def run_through_replay(name: str, requests: Sequence[TraceRequest], *, seed: int) -> PolicyResult:
    """Replay ``requests`` under ``name`` of :data:`REPLAY_POLICIES` with ``planner replay``'s
    session (see the module doc)."""
    if name not in REPLAY_POLICIES:
        raise ValueError(f"unknown replay policy {name!r}; known: {', '.join(REPLAY_POLICIES)}")
    wall0 = time.perf_counter()
    mode = name.removeprefix("elastic-").removesuffix("-retry")
    config = planner_config().model_copy(
        update={
            "profile": PROFILE,
            "elastic_ep_mode": mode if name.startswith("elastic-") else "nixl",
            "elastic_ep_frontend_retries": name.endswith("-retry"),
        }
    )
    # round robin, as the script's own cluster: replay's default least-loaded router sends
    # every arrival to the new, empty ranks right after a grow until their queued prompts
    # weigh as much as the old ranks' KV, which queues them for tens of seconds
    plan = session.prepare(
        config,
        session.WorkloadSpec(seed=seed),
        engine=ENGINE,
        initial={ROLE: 1},
        requests=requests,
        router="round_robin",
    )
    policy = "static:1" if name == "fixed-16" else "planner"
    result = session.run(plan, policy, progress=False, write_report=False, references=False)
    records = list(result.records)
    last_arrival = requests[-1].arrival_s
    series = rolling_p95(records, end_s=last_arrival)
    elastic = result.summary.elastic_ep
    resizes = () if elastic is None else elastic.resizes
    return PolicyResult(
        name=name,
        requests=len(requests),
        completed=sum(1 for r in records if completed(r)),
        max_rolling_p95_ttft_s=max((v for _, v in series), default=0.0),
        seconds_above_slo=seconds_above(series, TTFT_SLO_S, 1.0),
        gpu_hours=result.summary.gpu_hours,
        arrived_in_pause=sum(p.arrived_in_pause for p in resizes),
        rejected=result.summary.rejected,
        resizes=[
            f"{p.from_dp}->{p.to_dp} {p.mode} at {p.start_s:.0f} s, serving paused "
            f"{p.pause_s:.1f} s from {p.pause_start_s:.0f} s"
            for p in resizes
        ],
        decisions=[
            f"{row.t_s:.0f} s {row.message[row.message.index('elastic') :]}"
            for row in result.timeline
            if "resizing DP" in row.message
        ],
        p95_by_minute=highest_per_minute(series),
        wall_s=time.perf_counter() - wall0,
    )


def _drive(
    cluster: Cluster,
    planner: ElasticPlanner,
    *,
    mode_name: str,
    until_s: float,
    decisions: list[str],
) -> None:
    """Tick the policy every interval on 30 s windows of the simulated frontend's metrics."""
    labels = cluster.frontend.labels
    previous = snapshot_from_text(cluster.frontend.render_prometheus_text())
    t = INTERVAL_S
    while t <= until_s:
        cluster.run_until(t)
        current = snapshot_from_text(cluster.frontend.render_prometheus_text())
        traffic = traffic_from_snapshots(
            start=previous,
            end=current,
            start_s=t - INTERVAL_S,
            end_s=t,
            model_name=labels["model"],
            namespace=labels["dynamo_namespace"],
        )
        previous = current
        resizing = any(
            x.resizing is not None for x in cluster.replicas if x.state is not ReplicaState.STOPPED
        )
        decision = planner.tick(
            t, traffic, current_dp=cluster.engine_spec(ROLE).dp, resizing=resizing
        )
        if decision.target_dp is not None:
            cluster.resize_dp(ROLE, decision.target_dp, mode_name)
            decisions.append(f"{t:.0f} s {decision.reason.value}: {decision.message}")
        t += INTERVAL_S


# --- output ----------------------------------------------------------------------------------


def table(results: Sequence[PolicyResult]) -> str:
    head = (
        "| policy | requests | completed | max rolling p95 TTFT (s) | s above 5 s | GPU-hours |"
        " arrived in pause (503 on vLLM) | rejected | resize |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---|"
    )
    rows = [
        f"| {r.name} | {r.requests} | {r.completed} | {r.max_rolling_p95_ttft_s:.2f} | "
        f"{r.seconds_above_slo:.0f} | {r.gpu_hours:.2f} | {r.arrived_in_pause} | {r.rejected} | "
        f"{'; '.join(r.resizes) or '-'} |"
        for r in results
    ]
    return "\n".join([head, *rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the JSON summary only")
    parser.add_argument("--seed", type=int, default=0, help="workload and simulator seed")
    parser.add_argument(
        "--replay", action="store_true", help="run the requests through planner replay"
    )
    parser.add_argument(
        "--only", action="append", metavar="POLICY", help="run only this policy (repeatable)"
    )
    parser.add_argument(
        "--write",
        action="store_true",
        help="also write the output into benchmarks/RESULTS.md and its table into "
        "docs/elastic-ep.md (the blocks marked elastic-ep-ramp); every policy must run",
    )
    args = parser.parse_args(argv)
    if args.write and (args.only or args.json or args.replay or args.seed != 0):
        parser.error("--write records the default run: no --only, --json, --replay or --seed")
    profile = load_profile(resolve_profile(PROFILE))
    requests = ramp_requests(
        REQUESTS, start_rps=START_RPS, end_rps=END_RPS, seed=args.seed, isl=ISL, osl=OSL
    )
    known = REPLAY_POLICIES if args.replay else POLICIES
    names = args.only or list(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"--only {', '.join(unknown)}: expected one of {', '.join(known)}")
    results = []
    for name in names:
        if args.replay:
            result = run_through_replay(name, requests, seed=args.seed)
        else:
            result = run_policy(name, requests, profile=profile, seed=args.seed)
        results.append(result)
        if not args.json:
            print(f"{name}: {result.wall_s:.1f} s wall", file=sys.stderr)
    if args.json:
        print(json.dumps({"policies": [r.public() for r in results]}, indent=2))
        return 0
    lines = [table(results), "", "rolling 30 s p95 TTFT, highest per minute (s):"]
    lines += [f"  {r.name:17s} " + " ".join(f"{v:5.1f}" for v in r.p95_by_minute) for r in results]
    lines.append("")
    lines += [f"{r.name}: {line}" for r in results for line in r.decisions]
    output = "\n".join(lines)
    print(output)
    if args.write:
        write_ramp_blocks(results, output)
    return 0


def write_ramp_blocks(results: list[Any], output: str) -> None:
    """The run's output into RESULTS.md and its table into docs/elastic-ep.md, each between
    the markers of ``elastic-ep-ramp`` (generated, never typed)."""
    begin, end = markers("elastic-ep-ramp")
    command = "python benchmarks/elastic_ep_ramp.py --write"
    write_block(
        "elastic-ep-ramp",
        "\n".join([begin, f"`{command}`, as printed:", "", "```", output, "```", end]),
    )
    doc = Path(__file__).resolve().parent.parent / "docs" / "elastic-ep.md"
    note = (
        f"`{command}` (the script's table as printed; the full output is in "
        "`benchmarks/RESULTS.md`, section elastic-ep-ramp):"
    )
    write_block("elastic-ep-ramp", "\n".join([begin, note, "", table(results), end]), doc)
    print(f"wrote the elastic-ep-ramp blocks of {RESULTS.name} and {doc.name}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
