"""The operator's policies at scale: N whole planner loops in one process against a light
cluster (``benchmarks/light_cluster.py``), for ``operator_scale.py --policies``.

One run (``python benchmarks/operator_policies.py N --duration-s S``, its own process so that
each N starts from a fresh heap) builds what :class:`disagg_planner.operator.app.PolicyRunner`
builds for every PlannerPolicy: the connector with the process's watch caches, the
Prometheus observer, the diagnostics recorder (reports rendered in a child), the status
writer patching the policy's status, all on one API client with the operator's 64 worker
threads and its start-up gate (``SETUPS_AT_ONCE`` loops validate and build at once), and
runs every loop for S seconds of wall time. It prints one JSON line:

- ``lag``: due -> decided for every tick (the tick's own deadline, ``next_wake_s``, to the
  end of its outcome hook: the status write included), with the interval the tick served
  (the fast check's, or the throughput interval's): over the whole run (the start-up herd
  of N loops started at once included) and over the steady part (``steady``);
- ``steady_wake_s`` (due -> the tick started: the event loop and the worker threads busy with
  other ticks), ``steady_tick_s`` (started -> decided) and ``event_loop_late_s`` (how late a
  50 ms timer fires in the steady part): where the lag goes;
- ``startup``: the same for the ticks before the steady part, and the late ones (decided,
  s after the start; due -> started; started -> decided), each loop's set-up on the event
  loop thread (its connector, recorder and loop built), when the loops were ready (their
  schedules set); ``gc_pauses``: the collector's pauses of 50 ms or more over the run;
- ``server_cores``: the CPU the light cluster used in the steady part (a saturated stand-in
  shows as lag that is not the planner's), and the machine's 1-minute load average;
- ``cpu_ms_per_tick`` and ``api_per_dgd_min`` in the steady part of the run (after the
  first throughput tick of every loop and one fast-check interval more), the API calls by
  kind (the light cluster's counts; Prometheus queries apart);
- ``rss_base_mib`` (the process with its imports, the API client and the metrics, before
  any policy), ``rss_mib`` at the end, and their difference per policy;
- ``shutdown``: every loop stopped (as a policy deletion stops it): seconds to stop them all,
  then the threads, watch caches, metric series and asyncio tasks left, and the RSS.

Every loop runs with ``stagger_ticks`` as the operator runs it (each policy's schedule at a
phase of its own); ``--no-stagger`` starts each schedule when its loop starts (the loops before
that change: the baseline).

kopf itself (its watch of the policies, its daemons and their bookkeeping) is not run: the
loops are started directly, as the daemons would start them.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import gc
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for path in (REPO / "src", REPO / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from kubernetes import client as k8s_client  # noqa: E402
from operator_scale import NS, dgd, rss_bytes  # noqa: E402

from disagg_planner.config.schema import PlannerConfig  # noqa: E402
from disagg_planner.connectors.kubernetes import (  # noqa: E402
    API_WORKER_THREADS,
    planner_api_client,
)
from disagg_planner.connectors.kubernetes.cache import WatchCaches  # noqa: E402
from disagg_planner.operator.crd import GROUP, PLURAL, VERSION  # noqa: E402
from disagg_planner.operator.status import StatusWriter  # noqa: E402
from disagg_planner.runtime.clock import WallClock  # noqa: E402
from disagg_planner.runtime.loop import DeploymentLoop, DeploymentRef  # noqa: E402
from disagg_planner.runtime.metrics import PlannerMetrics  # noqa: E402
from disagg_planner.runtime.outcome import TickOutcome  # noqa: E402
from disagg_planner.runtime.service import (  # noqa: E402
    SETUPS_AT_ONCE,
    load_profile_for,
    make_connector,
    make_recorder,
)

PROFILE = "h200_sxm/vllm/llama-3.3-70b-fp8/tp4"
THROUGHPUT_INTERVAL_S = 60.0
FAST_CHECK_S = 15.0
# Steady load one prefill and one decode replica serve (the 70B TP4 profile): the steady
# state this measures is a deployment that needs no change.
RATE = 2.0
EXECUTOR = "planner-worker"  # the operator's 64 worker threads stay for the process


def own_threads() -> list[str]:
    """The threads alive, but the worker pool's (it lives as long as the process)."""
    return sorted(t.name for t in threading.enumerate() if not t.name.startswith(EXECUTOR))


def rss_mib() -> float:
    return rss_bytes() / 2**20


def post(url: str, path: str, body: dict[str, Any]) -> None:
    request = urllib.request.Request(
        url + path,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=30).read()


def stats(url: str) -> Counter[str]:
    return Counter(json.loads(urllib.request.urlopen(url + "/_stats", timeout=30).read()))


def cpu_of(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def within_10pct(lags: list[tuple[float, float]]) -> float:
    """The share of ticks decided within 10% of their interval after they were due."""
    return sum(1 for lag, interval in lags if lag <= 0.1 * interval) / max(1, len(lags))


def quantiles(ordered: list[float]) -> dict[str, float | None]:
    """p50, p99 and max of sorted values."""
    if not ordered:
        return {"p50": None, "p99": None, "max": None}
    return {
        "p50": ordered[len(ordered) // 2],
        "p99": ordered[int(len(ordered) * 0.99)],
        "max": ordered[-1],
    }


class LoopMonitor:
    """How late the event loop runs a callback due every ``period_s`` (time it spent
    blocked by synchronous work, or busy with other callbacks)."""

    def __init__(self, period_s: float = 0.05) -> None:
        self.period_s = period_s
        self.late: list[tuple[float, float]] = []  # (monotonic s, late s)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            before = time.monotonic()
            await asyncio.sleep(self.period_s)
            now = time.monotonic()
            self.late.append((now, max(0.0, now - before - self.period_s)))


class GcPauses:
    """The garbage collector's pauses of at least ``min_s`` (gc.callbacks): (monotonic s at
    their end, generation, seconds); a full collection of a large heap stops every thread."""

    def __init__(self, min_s: float = 0.05) -> None:
        self.min_s = min_s
        self.pauses: list[tuple[float, int, float]] = []
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        now = time.monotonic()
        if phase == "start":
            self._began = now
        elif now - self._began >= self.min_s:
            self.pauses.append((now, int(info["generation"]), now - self._began))


def lag_summary(lags: list[tuple[float, float]]) -> dict[str, float | int | None]:
    ordered = sorted(lag for lag, _ in lags)
    return {
        "ticks": len(lags),
        "within_10pct": within_10pct(lags),
        "lag_p50_s": ordered[len(ordered) // 2] if ordered else None,
        "lag_p99_s": ordered[int(len(ordered) * 0.99)] if ordered else None,
        "lag_max_s": ordered[-1] if ordered else None,
    }


class TimedLoop(DeploymentLoop):
    """A loop that notes, for every tick, how long after its deadline it was decided."""

    lags: list[tuple[float, float, float]]  # (decided at, lag s, interval s)
    # (decided at, due -> tick started s, tick started -> decided s)
    parts: list[tuple[float, float, float]]
    ready_at: float | None  # when start() returned (the schedule set): monotonic s

    async def start(self, stop: asyncio.Event) -> bool:
        ready = await super().start(stop)
        self.ready_at = time.monotonic()
        return ready

    async def tick(self) -> TickOutcome | None:
        due = self.next_wake_s
        began = self.clock.now()
        outcome = await super().tick()
        now = self.clock.now()
        if outcome is not None:
            interval = THROUGHPUT_INTERVAL_S if outcome.ran_throughput else FAST_CHECK_S
            self.lags.append((now, max(0.0, now - due), interval))
            self.parts.append((now, max(0.0, began - due), now - began))
        return outcome


async def run(
    n: int,
    duration_s: float,
    url: str,
    reports: Path,
    status_interval_s: float,
    server_pid: int,
    *,
    stagger: bool,
) -> dict[str, Any]:
    asyncio.get_running_loop().set_default_executor(
        concurrent.futures.ThreadPoolExecutor(
            max_workers=API_WORKER_THREADS, thread_name_prefix=EXECUTOR
        )
    )
    configuration = k8s_client.Configuration()
    configuration.host = url
    api = planner_api_client(configuration)
    metrics = PlannerMetrics()
    caches = WatchCaches(api)
    gc.collect()
    threads_before = own_threads()
    rss_base = rss_mib()
    loops: list[TimedLoop] = []
    stops: list[asyncio.Event] = []
    tasks = []
    setup_s: list[float] = []  # each loop's set-up here, on the event loop thread
    gate = asyncio.Semaphore(SETUPS_AT_ONCE)  # the operator's start-up gate (PolicyRunner)
    monitor, monitor_stop = LoopMonitor(), asyncio.Event()
    monitoring = asyncio.create_task(monitor.run(monitor_stop))
    gc_pauses = GcPauses()
    gc.callbacks.append(gc_pauses)
    started = time.monotonic()
    for i in range(n):
        name = f"g{i:04d}"
        began = time.monotonic()
        config = PlannerConfig(
            dgd_name=name,
            kubernetes_namespace=NS,
            backend="vllm",
            profile=PROFILE,
            throughput_adjustment_interval_seconds=THROUGHPUT_INTERVAL_S,
            fast_check_interval_seconds=FAST_CHECK_S,
            metric_pulling_prometheus_endpoint=url,
            report_output_dir=str(reports),
        )
        spent = time.monotonic() - began
        profile = await asyncio.to_thread(load_profile_for, config)
        began = time.monotonic()
        ref = DeploymentRef(NS, name)
        clock = WallClock()
        writer = StatusWriter(
            api, namespace=NS, name=f"p-{name}", previous={}, min_interval_s=status_interval_s
        )
        writer.target = ref
        loop = TimedLoop(
            config,
            connector=make_connector(config, clock=clock, api_client=api, caches=caches),
            ref=ref,
            clock=clock,
            profile=profile,
            metrics=metrics,
            recorder=make_recorder(config, ref, subdirectory=True),
            on_outcome=writer.write_outcome,
            tick_log_level=logging.DEBUG,
            stagger_ticks=stagger,
            startup_gate=gate,
        )
        loop.lags = []
        loop.parts = []
        loop.ready_at = None
        stop = asyncio.Event()
        loops.append(loop)
        stops.append(stop)
        tasks.append(asyncio.create_task(loop.run(stop)))
        setup_s.append(spent + time.monotonic() - began)
    created_s = time.monotonic() - started
    # Steady: every loop has made its first throughput tick, then one fast check more.
    steady_at = started + THROUGHPUT_INTERVAL_S + FAST_CHECK_S
    await asyncio.sleep(max(0.0, steady_at - time.monotonic()))
    first_stats, first_cpu = stats(url), time.process_time()
    first_server_cpu = cpu_of(server_pid)
    steady_clock = WallClock().now()
    first_ticks = sum(len(loop.lags) for loop in loops)
    steady_start = time.monotonic()
    await asyncio.sleep(max(0.0, started + duration_s - steady_start))
    last_stats, last_cpu = stats(url), time.process_time()
    monitor_stop.set()
    await monitoring
    server_cores = (cpu_of(server_pid) - first_server_cpu) / (time.monotonic() - steady_start)
    steady_s = time.monotonic() - steady_start
    ticks = sum(len(loop.lags) for loop in loops) - first_ticks
    rss_end = rss_mib()
    calls = last_stats - first_stats
    prometheus = calls.pop("prometheus query", 0)
    api_calls = sum(calls.values())

    gc.callbacks.remove(gc_pauses)
    stop_started = time.monotonic()
    for stop in stops:
        stop.set()
    await asyncio.gather(*tasks)
    stop_s = time.monotonic() - stop_started
    for loop in loops:
        metrics.forget(loop.ref.namespace, loop.ref.name)
    lags = [(lag, interval) for loop in loops for _, lag, interval in loop.lags]
    steady = [
        (lag, interval) for loop in loops for t, lag, interval in loop.lags if t >= steady_clock
    ]
    wake = sorted(w for loop in loops for t, w, _ in loop.parts if t >= steady_clock)
    inside = sorted(d for loop in loops for t, _, d in loop.parts if t >= steady_clock)
    # The start-up part: the ticks decided before the steady part, where the late ones are.
    early = [
        (t, lag, interval, w, d)
        for loop in loops
        for (t, lag, interval), (_, w, d) in zip(loop.lags, loop.parts, strict=True)
        if t < steady_clock
    ]
    late_ticks = sorted(
        (round(t - (steady_clock - (steady_start - started)), 2), round(w, 3), round(d, 3))
        for t, lag, interval, w, d in early
        if lag > 0.1 * interval
    )
    ready = sorted(loop.ready_at - started for loop in loops if loop.ready_at is not None)
    startup = {
        "ticks": len(early),
        "within_10pct": within_10pct([(lag, interval) for _, lag, interval, _, _ in early]),
        "wake_s": quantiles(sorted(w for *_, w, _ in early)),
        "tick_s": quantiles(sorted(d for *_, d in early)),
        "event_loop_late_s": quantiles(sorted(x for t, x in monitor.late if t < steady_start)),
        # (decided, s after the start; due -> started; started -> decided) of each late tick
        "late_ticks": late_ticks[:50],
        "setup_on_event_loop_s": {"sum": sum(setup_s), **quantiles(sorted(setup_s))},
        "created_s": created_s,
        "ready_s": quantiles(ready),
        "setups_at_once": SETUPS_AT_ONCE,
    }
    # (s after the start, generation, s) of each collection of at least 50 ms
    pauses = [(round(t - started, 2), g, round(d, 3)) for t, g, d in gc_pauses.pauses]
    series = sum(
        1
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.labels.get("dgd", "").startswith("g")
    )
    del loops
    gc.collect()
    await asyncio.sleep(1.0)  # the watch threads see their stop
    shutdown = {
        "stop_s": stop_s,
        "threads_left": sorted(set(own_threads()) - set(threads_before)),
        "watch_caches_left": len(caches._caches),
        "metric_series_left": series,
        "tasks_left": len([t for t in asyncio.all_tasks() if t is not asyncio.current_task()]),
        "rss_mib": rss_mib(),
    }
    caches.close()
    await asyncio.to_thread(api.close)
    ordered = sorted(lag for lag, _ in lags)
    return {
        "n": n,
        "stagger": stagger,
        "duration_s": duration_s,
        "status_interval_s": status_interval_s,
        "steady_s": steady_s,
        "ticks": len(lags),
        "within_10pct": within_10pct(lags),
        "lag_p50_s": ordered[len(ordered) // 2] if ordered else None,
        "lag_p99_s": ordered[int(len(ordered) * 0.99)] if ordered else None,
        "lag_max_s": ordered[-1] if ordered else None,
        "steady": lag_summary(steady),
        "steady_wake_s": quantiles(wake),
        "steady_tick_s": quantiles(inside),
        "event_loop_late_s": quantiles(sorted(x for t, x in monitor.late if t >= steady_start)),
        "startup": startup,
        "gc_pauses": pauses,
        "server_cores": server_cores,
        "loadavg_1m": os.getloadavg()[0],
        "cpu_ms_per_tick": 1000.0 * (last_cpu - first_cpu) / max(1, ticks),
        "cpu_cores": (last_cpu - first_cpu) / steady_s,
        "api_per_dgd_min": api_calls / n / (steady_s / 60.0),
        "api_calls": dict(calls),
        "prometheus_per_dgd_min": prometheus / n / (steady_s / 60.0),
        "rss_base_mib": rss_base,
        "rss_mib": rss_end,
        "mib_per_policy": (rss_end - rss_base) / n,
        "shutdown": shutdown,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("n", type=int)
    parser.add_argument("--duration-s", type=float, default=150.0)
    # the operator's --status-interval (its default): measurements are written at most this often
    parser.add_argument("--status-interval", type=float, default=30.0)
    # the loops as before issue 36's stagger: each schedule starts when its loop starts
    parser.add_argument("--no-stagger", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.duration_s <= THROUGHPUT_INTERVAL_S + FAST_CHECK_S:
        parser.error(f"--duration-s must exceed {THROUGHPUT_INTERVAL_S + FAST_CHECK_S:g}")
    with tempfile.TemporaryDirectory(prefix="planner-policies-") as folder:
        server = subprocess.Popen(
            [sys.executable, str(REPO / "benchmarks" / "light_cluster.py"), "--rate", str(RATE)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert server.stdout is not None
            url = server.stdout.readline().strip().removeprefix("URL=")
            for i in range(args.n):
                name = f"g{i:04d}"
                post(
                    url,
                    f"/apis/nvidia.com/v1alpha1/namespaces/{NS}/dynamographdeployments",
                    dgd(name),
                )
                post(
                    url,
                    f"/apis/{GROUP}/{VERSION}/namespaces/{NS}/{PLURAL}",
                    {
                        "metadata": {"name": f"p-{name}", "namespace": NS},
                        "spec": {"targetRef": {"name": name}},
                    },
                )
            result = asyncio.run(
                run(
                    args.n,
                    args.duration_s,
                    url,
                    Path(folder),
                    args.status_interval,
                    server.pid,
                    stagger=not args.no_stagger,
                )
            )
        finally:
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
