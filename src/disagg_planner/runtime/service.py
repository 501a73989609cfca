"""``planner run``: one planner loop for one deployment, as a long-running service.

Wires the parts for a config: the connector of ``config.environment`` (a DGD through the
Kubernetes API, or the virtual decision-id protocol over etcd), the profile (loaded before
anything starts, so a bad profile exits at once with the spec-error code), the exporter
(``/metrics``, ``/healthz``, ``/readyz`` on ``metric_reporting_prometheus_port`` when it is
not 0; ready after the first successful observation; ``/report/<namespace>/<name>`` renders
the diagnostics on demand) and the diagnostics recorder (when ``report_interval_hours`` is
set). SIGTERM and SIGINT stop the loop: the tick in flight gets a short grace, then the
subscribers, the connector and the HTTP server are closed (no report is rendered on stop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import weakref
from pathlib import Path
from typing import Any

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.connectors.base import Connector
from disagg_planner.connectors.elastic_ep import ElasticEpKubernetes
from disagg_planner.connectors.kubernetes import KubernetesConnector
from disagg_planner.connectors.kubernetes.cache import WatchCaches
from disagg_planner.connectors.virtual import VirtualConnector
from disagg_planner.profiles import Profile, resolve_profile
from disagg_planner.report.recorder import DiagnosticsRecorder
from disagg_planner.runtime.clock import Clock, WallClock
from disagg_planner.runtime.connector_settings import (
    elastic_ep_kubernetes_settings,
    kubernetes_settings,
    virtual_settings,
)
from disagg_planner.runtime.loop import DeploymentLoop, DeploymentRef
from disagg_planner.runtime.metrics import HealthState, MetricsServer, PlannerMetrics
from disagg_planner.runtime.wiring import profile_for

log = logging.getLogger(__name__)

# How many loops of one process set up (validate and build their core) at once: the
# operator's start-up gate (DeploymentLoop ``startup_gate``). A thousand policies starting
# together would otherwise queue a thousand set-ups in the worker threads ahead of the
# first ticks of the loops already running; a few at once finish the herd no later (1,000
# policies on 2 cores: benchmarks/operator_scale.py).
SETUPS_AT_ONCE = 4


def make_connector(
    config: PlannerConfig,
    *,
    clock: Clock,
    api_client: Any | None = None,
    caches: WatchCaches | None = None,
) -> Connector:
    """The connector for ``config.environment``; ``api_client`` (a ``kubernetes`` ApiClient)
    defaults to the in-cluster service account, else the kubeconfig. ``caches``: the
    process's watch caches of DGDs and adapters (None: every read is a GET)."""
    if config.environment == "virtual":
        return VirtualConnector(virtual_settings(config), clock=clock.now, sleep=clock.sleep)
    if config.elastic_ep is not None and config.elastic_ep_follower_service:
        # The DGD connector that also scales the elastic role's follower pods (two stages).
        return ElasticEpKubernetes(
            elastic_ep_kubernetes_settings(config),
            api_client=api_client,
            clock=clock.now,
            sleep=clock.sleep,
            caches=caches,
        )
    return KubernetesConnector(
        kubernetes_settings(config),
        api_client=api_client,
        clock=clock.now,
        sleep=clock.sleep,
        caches=caches,
    )


def deployment_ref(config: PlannerConfig, connector: Connector) -> DeploymentRef:
    """The ``namespace``/``dgd`` metric labels: the DGD's Kubernetes namespace and name, or
    for the virtual protocol the Dynamo namespace (and ``dgd_name`` when set)."""
    namespace = getattr(connector, "namespace", None)
    name = getattr(connector, "dgd_name", None)
    if isinstance(namespace, str) and isinstance(name, str):
        return DeploymentRef(namespace, name)
    return DeploymentRef(config.namespace, config.dgd_name or config.namespace)


def make_recorder(
    config: PlannerConfig, ref: DeploymentRef, *, subdirectory: bool = False
) -> DiagnosticsRecorder | None:
    """A recorder when periodic reports are on; ``subdirectory`` puts each deployment's
    reports under ``<report_output_dir>/<namespace>/<name>`` (one process, many DGDs)."""
    if config.report_interval_hours is None:
        return None
    output = Path(config.report_output_dir)
    if subdirectory:
        output = output / ref.namespace / ref.name
    return DiagnosticsRecorder(
        output_dir=output,
        report_interval_hours=config.report_interval_hours,
        filename=config.report_filename,
        write_gzip_log=config.report_write_gzip_log,
        ttft_slo_ms=config.ttft_ms,
        itl_slo_ms=config.itl_ms,
        title=f"Planner diagnostics: {ref}",
        window_hours=config.report_window_hours,
        keep_files=config.report_keep_files,
        max_bytes=config.report_max_bytes,
        disk_root=config.report_output_dir,
        stagger_key=str(ref),
        render_in_child=True,  # a live process keeps no render's modules or peak heap
    )


# The profiles in use, shared by every loop of the process that names the same directory in
# the same state (key: the resolved directory and each file's size and mtime). A profile is
# read-only once built and holds ~3.7 MB (its interpolators' grids): one copy per policy was
# most of an operator's memory per policy (issue 36). Weak values: a profile no loop holds
# any more is freed; an edited profile directory is a new key, read again.
_PROFILES: weakref.WeakValueDictionary[tuple[object, ...], Profile] = weakref.WeakValueDictionary()
_PROFILES_LOCK = threading.Lock()  # loads run in worker threads; one load per key


def _profile_key(directory: Path) -> tuple[object, ...]:
    files = sorted(
        (str(p.relative_to(directory)), p.stat().st_size, p.stat().st_mtime_ns)
        for p in directory.rglob("*")
        if p.is_file()
    )
    return (str(directory.resolve()), *files)


def load_profile_for(config: PlannerConfig) -> Profile | None:
    """The throughput loop's profile, or None when that loop is off; one shared copy per
    profile directory (unchanged on disk) in the process."""
    if not config.throughput_scaling_active:
        return None
    directory = resolve_profile(config.profile or config.profile_results_dir)
    key = _profile_key(directory)
    with _PROFILES_LOCK:
        profile = _PROFILES.get(key)
        if profile is None:
            profile = profile_for(config)
            _PROFILES[key] = profile
        return profile


async def serve(
    config: PlannerConfig,
    *,
    stop: asyncio.Event | None = None,
    api_client: Any | None = None,
    clock: Clock | None = None,
    metrics_host: str = "0.0.0.0",
    handle_signals: bool = True,
) -> int:
    """Run one deployment's loop until SIGTERM/SIGINT (or ``stop``); returns the exit status.

    Raises the spec error (exit code 2 on the command line) when the profile cannot be read.
    """
    clock = clock or WallClock()
    stop = stop or asyncio.Event()
    profile = await asyncio.to_thread(load_profile_for, config)
    loop = asyncio.get_running_loop()
    if handle_signals:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, _request_stop, stop, signum)
    metrics = PlannerMetrics()
    health = HealthState()
    server: MetricsServer | None = None
    connector = make_connector(config, clock=clock, api_client=api_client)
    ref = deployment_ref(config, connector)
    try:
        recorder = make_recorder(config, ref)

        def report(namespace: str, name: str) -> str | None:
            if recorder is None or (namespace, name) != (ref.namespace, ref.name):
                return None
            return recorder.render_html()

        if config.metric_reporting_prometheus_port:
            server = MetricsServer(
                metrics,
                health,
                host=metrics_host,
                port=config.metric_reporting_prometheus_port,
                reports=report,
            ).start()
            log.info("serving /metrics, /healthz, /readyz and /report on port %d", server.port)
        planner_loop = DeploymentLoop(
            config,
            connector=connector,
            ref=ref,
            clock=clock,
            profile=profile,
            metrics=metrics,
            health=health,
            recorder=recorder,
        )
        await planner_loop.run(stop)
        log.info("%s: planner stopped after %d tick(s)", ref, planner_loop.ticks)
        return 0
    finally:
        if server is not None:
            server.stop()
        if handle_signals:
            for signum in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(Exception):
                    loop.remove_signal_handler(signum)


def _request_stop(stop: asyncio.Event, signum: int) -> None:
    log.info("received %s; stopping", signal.Signals(signum).name)
    stop.set()
