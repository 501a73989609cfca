"""``planner operator``: a kopf operator running one planner loop per ``PlannerPolicy``.

One kopf daemon per policy object runs :class:`DeploymentLoop` for the policy's target DGD
(see :mod:`disagg_planner.operator.crd` for the resource and :mod:`disagg_planner.operator.policy`
for how a spec becomes a config). The daemon

- rebuilds the loop when the spec changes (the live spec is compared every
  :data:`SPEC_POLL_S` seconds);
- refuses a second policy for a DGD that another policy already plans (``DuplicateTarget``)
  until the first one goes away;
- writes ``Starting`` when it adopts the DGD and the status after every tick
  (:mod:`disagg_planner.operator.status`), and reports an invalid spec or profile as a
  condition and a Warning Event on the policy instead of crashing;
- on deletion of the policy, stops the loop (the tick in flight gets a short grace) and
  leaves the DGD exactly as it is; its metric series are dropped.

One process serves every policy in its namespaces (``--watch-namespace``, repeatable) or the whole
cluster (``--all-namespaces``). kopf peering elects the replica that acts: each replica
registers in the ``KopfPeering`` (``ClusterKopfPeering`` with ``--all-namespaces``) object
named by ``--peering`` and the highest priority acts while the others pause; a replica whose
lease lapses (60 s) is presumed dead and the next one resumes. The priority defaults to a
random number per start, so two replicas of one Deployment differ (a tie pauses both, as
kopf does, and is logged). ``--standalone`` runs without peering (one replica only).

Kubernetes API calls of the operator itself (beyond the connector's, listed in
:mod:`disagg_planner.connectors.kubernetes`; checked against the requests kmock recorded in the
tests):

========================  =========================  ============================================
verb                      API group                  resource
========================  =========================  ============================================
list, watch               planner.autoscaling.dev    plannerpolicies
patch                     planner.autoscaling.dev    plannerpolicies (kopf's finalizer, annotations)
patch                     planner.autoscaling.dev    plannerpolicies/status
list, watch, patch        planner.autoscaling.dev    plannerpools (kopf's timer, annotations)
patch                     planner.autoscaling.dev    plannerpools/status (grants, arbiter memory)
list, watch, patch        kopf.dev                   kopfpeerings (clusterkopfpeerings with -A);
                                                     none with --standalone
create                    "" (core v1)               events (invalid specs; kopf's warnings)
list, watch               "" (core v1)               namespaces (only for --watch-namespace globs)
========================  =========================  ============================================

plus API discovery (``/api``, ``/apis/...``), which every authenticated client may read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import kopf
from kubernetes import client as k8s_client

from disagg_planner.connectors.kubernetes.cache import WatchCaches
from disagg_planner.errors import is_spec_error
from disagg_planner.operator.crd import GROUP, KIND, PLURAL, VERSION
from disagg_planner.operator.policy import OperatorDefaults, config_from_spec, plain, target_of
from disagg_planner.operator.pool import (
    POOL_PERIOD_S,
    PooledConnector,
    PoolMember,
    register_pool_handlers,
)
from disagg_planner.operator.status import MESSAGE_LIMIT, StatusWriter
from disagg_planner.runtime.clock import WallClock
from disagg_planner.runtime.loop import DeploymentLoop, DeploymentRef
from disagg_planner.runtime.metrics import HealthState, MetricsServer, PlannerMetrics
from disagg_planner.runtime.outcome import Problem, ProblemKind
from disagg_planner.runtime.service import (
    SETUPS_AT_ONCE,
    load_profile_for,
    make_connector,
    make_recorder,
)

log = logging.getLogger(__name__)

SPEC_POLL_S = 1.0
DAEMON_CANCELLATION_TIMEOUT_S = 30.0
_GLOB_CHARS = frozenset("*?[]!")


@dataclass(frozen=True)
class OperatorOptions:
    """How the operator runs; ``defaults`` are the config sources under every policy."""

    defaults: OperatorDefaults = field(default_factory=OperatorDefaults)
    namespaces: tuple[str, ...] = ()
    all_namespaces: bool = False
    standalone: bool = False
    peering_name: str = "planner"
    priority: int | None = None  # None: random per start
    peering_lifetime_s: int = 60
    identity: str | None = None  # None: kopf's (POD_ID, else host and user)
    metrics_port: int = 0
    metrics_host: str = "0.0.0.0"
    status_min_interval_s: float = 30.0
    pool_period_s: float = POOL_PERIOD_S  # how often each PlannerPool is arbitrated
    # serve only the policies and pools with these labels (one shard of several operators)
    shard_labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.all_namespaces == bool(self.namespaces):
            raise ValueError("give either --namespace (one or more) or --all-namespaces")


@dataclass(frozen=True)
class PolicyKey:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class PolicyRunner:
    """Runs and tracks the loops of every policy this process serves."""

    def __init__(
        self,
        options: OperatorOptions,
        *,
        api_client: k8s_client.ApiClient,
        metrics: PlannerMetrics,
    ) -> None:
        self.options = options
        self.api_client = api_client
        self.metrics = metrics
        self.loops: dict[PolicyKey, DeploymentLoop] = {}
        self.writers: dict[PolicyKey, StatusWriter] = {}
        self.claims: dict[DeploymentRef, PolicyKey] = {}
        # One list-and-watch of the DGDs and of their adapters per namespace, for every loop.
        self.caches = WatchCaches(api_client)
        # A few loops set up at once (runtime/service.py SETUPS_AT_ONCE), in start order.
        self.startup_gate = asyncio.Semaphore(SETUPS_AT_ONCE)

    def render_report(self, namespace: str, name: str) -> str | None:
        """The diagnostics report of the DGD ``namespace/name`` (None: not planned here, or
        no recorder); called from the metrics server's thread."""
        for loop in list(self.loops.values()):
            if (loop.ref.namespace, loop.ref.name) == (namespace, name):
                return loop.recorder.render_html() if loop.recorder is not None else None
        return None

    def pool_members(self, namespace: str, pool: str) -> list[PoolMember]:
        """The loops of the policies of ``namespace`` that name ``pool``."""
        members = []
        for key, loop in self.loops.items():
            if key.namespace != namespace or loop.config.pool != pool:
                continue
            if not isinstance(loop.connector, PooledConnector):
                continue
            outcome = loop.last_outcome
            members.append(
                PoolMember(
                    name=key.name,
                    config=loop.config,
                    connector=loop.connector,
                    status=outcome.status if outcome is not None else None,
                    throughput_need=dict(loop.core.throughput_floor) if loop.core else {},
                    fast_scale_up_s=loop.core.fast_scale_up_s if loop.core else None,
                    now_s=loop.clock.now(),
                )
            )
        return members

    async def run_policy(
        self,
        *,
        namespace: str,
        name: str,
        spec: Mapping[str, Any],
        body: Mapping[str, Any],
        stopped: Any,
    ) -> None:
        """The daemon of one policy: plan its DGD until the policy goes away."""
        key = PolicyKey(namespace, name)
        writer = StatusWriter(
            self.api_client,
            namespace=namespace,
            name=name,
            previous=plain(body.get("status") or {}),
            min_interval_s=self.options.status_min_interval_s,
        )
        self.writers[key] = writer
        try:
            while not stopped:
                current = plain(spec)
                await self._run_once(key, current, spec, body, writer, stopped)
        finally:
            self.writers.pop(key, None)
            log.info("%s %s: stopped; its DynamoGraphDeployment is left as it is", KIND, key)

    async def _run_once(
        self,
        key: PolicyKey,
        current: dict[str, Any],
        live_spec: Mapping[str, Any],
        body: Mapping[str, Any],
        writer: StatusWriter,
        stopped: Any,
    ) -> None:
        target: DeploymentRef | None = None
        try:
            target = target_of(current, namespace=key.namespace, policy=key.name)
            config = config_from_spec(
                current, namespace=key.namespace, policy=key.name, defaults=self.options.defaults
            )
            profile = await asyncio.to_thread(load_profile_for, config)
        except Exception as exc:
            if not is_spec_error(exc):
                raise
            problem = Problem(ProblemKind.INVALID_SPEC, type(exc).__name__, str(exc), "spec")
            log.warning("%s %s: %s", KIND, key, problem.render())
            _warn(body, "InvalidSpec", problem.render())
            await writer.write_problem(problem, target=target)
            await self._wait(live_spec, current, stopped)
            return

        owner = self.claims.get(target)
        if owner is not None and owner != key:
            problem = Problem(
                ProblemKind.INVALID_SPEC,
                "duplicate_target",
                f"DynamoGraphDeployment {target} is already planned by {KIND} {owner}",
                "spec",
            )
            log.warning("%s %s: %s", KIND, key, problem.render())
            _warn(body, "DuplicateTarget", problem.render())
            await writer.write_problem(problem, target=target)
            await self._wait(live_spec, current, stopped, claim=target)
            return

        self.claims[target] = key
        writer.target = target
        clock = WallClock()
        connector = make_connector(
            config, clock=clock, api_client=self.api_client, caches=self.caches
        )
        if config.pool is not None:
            connector = PooledConnector(connector, config)  # its pool's grant caps it
        loop = DeploymentLoop(
            config,
            connector=connector,
            ref=target,
            clock=clock,
            profile=profile,
            metrics=self.metrics,
            recorder=make_recorder(config, target, subdirectory=True),
            on_outcome=writer.write_outcome,
            stagger_ticks=True,  # a thousand policies must not all tick at once
            startup_gate=self.startup_gate,
        )
        self.loops[key] = loop
        loop_stop = asyncio.Event()
        watcher = asyncio.create_task(self._wait(live_spec, current, stopped, then=loop_stop))
        try:
            # Until the first tick, which can be an interval away, the status says so.
            await writer.write_starting(target)
            await loop.run(loop_stop)
        except Exception as exc:
            if not is_spec_error(exc):
                raise
            log.warning("%s %s: %s", KIND, key, exc)  # the loop already reported it
            _warn(body, "InvalidSpec", str(exc))
            await self._wait(live_spec, current, stopped)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            self.loops.pop(key, None)
            if self.claims.get(target) == key:
                del self.claims[target]
            self.metrics.forget(target.namespace, target.name)
        if not stopped:
            log.info("%s %s: spec changed; restarting its loop", KIND, key)

    async def _wait(
        self,
        live_spec: Mapping[str, Any],
        current: dict[str, Any],
        stopped: Any,
        *,
        claim: DeploymentRef | None = None,
        then: asyncio.Event | None = None,
    ) -> None:
        """Until the daemon is stopped, the spec differs from ``current``, or (with
        ``claim``) that DGD is no longer planned by another policy; then set ``then``."""
        while not stopped:
            if plain(live_spec) != current:
                break
            if claim is not None and claim not in self.claims:
                break
            await stopped.wait(SPEC_POLL_S)  # wakes at once when kopf stops the daemon
        if then is not None:
            then.set()


def _warn(body: Mapping[str, Any], reason: str, message: str) -> None:
    """A Warning Event on the policy: ``kubectl describe`` shows why it is not planned."""
    # kopf posts it from its own queue; the handler context of the daemon provides it.
    kopf.warn(cast(kopf.Body, body), reason=reason, message=message[:MESSAGE_LIMIT])


def connection_info(configuration: k8s_client.Configuration) -> kopf.ConnectionInfo:
    """kopf's credentials from the ``kubernetes`` client's configuration, so that kopf and
    the connectors always talk to the same server as the same identity."""
    header = configuration.get_api_key_with_prefix(
        "BearerToken"
    ) or configuration.get_api_key_with_prefix("authorization")
    parts = header.split(" ", 1) if header else []
    scheme, token = (None, None) if not parts else (None, parts[0]) if len(parts) == 1 else parts
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        username=configuration.username or None,
        password=configuration.password or None,
        scheme=scheme,
        token=token,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
    )


def build_registry(runner: PolicyRunner) -> kopf.OperatorRegistry:
    """The operator's handlers, in a registry of its own (never kopf's global one)."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info(runner.api_client.configuration)

    @kopf.daemon(
        GROUP,
        VERSION,
        PLURAL,
        id="planner",
        registry=registry,
        labels=dict(runner.options.shard_labels) or None,
        backoff=5.0,
        cancellation_timeout=DAEMON_CANCELLATION_TIMEOUT_S,
    )
    async def planner_daemon(
        stopped: kopf.DaemonStopped,
        namespace: str | None,
        name: str,
        spec: kopf.Spec,
        body: kopf.Body,
        **_: Any,
    ) -> None:
        assert namespace is not None  # PlannerPolicy is namespaced
        await runner.run_policy(
            namespace=namespace, name=name, spec=spec, body=body, stopped=stopped
        )

    register_pool_handlers(
        registry,
        group=GROUP,
        version=VERSION,
        members_of=runner.pool_members,
        period_s=runner.options.pool_period_s,
        labels=dict(runner.options.shard_labels),
    )
    return registry


def build_settings(options: OperatorOptions) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    # Only globs need the namespace list; plain names need no namespace RBAC at all.
    settings.scanning.disabled = not any(_GLOB_CHARS & set(ns) for ns in options.namespaces)
    settings.peering.name = options.peering_name
    settings.peering.standalone = options.standalone
    settings.peering.mandatory = not options.standalone
    settings.peering.priority = (
        options.priority if options.priority is not None else random.randint(1, 2**31 - 1)
    )
    settings.peering.lifetime = options.peering_lifetime_s
    settings.peering.clusterwide = options.all_namespaces
    settings.peering.stealth = True
    # Our own per-tick logs go to the log, not to Kubernetes Events.
    settings.posting.level = logging.WARNING
    settings.posting.reporting_component = "planner-operator"
    settings.persistence.finalizer = f"{GROUP}/planner"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.watching.server_timeout = 600
    settings.watching.client_timeout = 660
    return settings


def default_identity() -> str:
    """``POD_ID`` (the pod name, by the downward API), else host and process id."""
    return os.environ.get("POD_ID") or f"{socket.gethostname()}-{os.getpid()}"


async def run_operator(
    options: OperatorOptions,
    *,
    api_client: k8s_client.ApiClient | None = None,
    stop: asyncio.Event | None = None,
    ready: asyncio.Event | None = None,
    runner_ready: asyncio.Future[PolicyRunner] | None = None,
) -> None:
    """Run until ``stop`` is set (or SIGTERM/SIGINT when in the main thread).

    ``api_client`` defaults to the in-cluster service account, else the kubeconfig.
    ``runner_ready`` receives the :class:`PolicyRunner` (tests inspect its loops).
    """
    from disagg_planner.connectors.kubernetes import default_api_client

    owns_client = api_client is None
    api = api_client if api_client is not None else default_api_client()
    metrics = PlannerMetrics()
    health = HealthState()
    runner = PolicyRunner(options, api_client=api, metrics=metrics)
    if runner_ready is not None:
        runner_ready.set_result(runner)
    settings = build_settings(options)
    started = ready or asyncio.Event()
    server: MetricsServer | None = None
    if options.metrics_port:
        server = MetricsServer(
            metrics,
            health,
            host=options.metrics_host,
            port=options.metrics_port,
            reports=runner.render_report,
        ).start()
        log.info("serving /metrics, /healthz, /readyz and /report on port %d", server.port)

    async def mark_ready() -> None:
        # The operator is ready once its watches run; each DGD's state is in its policy.
        await started.wait()
        health.mark_ready()

    readiness = asyncio.create_task(mark_ready())
    log.info(
        "planner operator: %s, %s (priority %d)",
        "all namespaces"
        if options.all_namespaces
        else f"namespaces {', '.join(options.namespaces)}",
        "standalone" if options.standalone else f"peering '{options.peering_name}'",
        settings.peering.priority,
    )
    try:
        await kopf.operator(
            registry=build_registry(runner),
            settings=settings,
            clusterwide=options.all_namespaces,
            namespaces=list(options.namespaces),
            standalone=options.standalone,
            # kopf's Identity is a NewType of str that kopf does not export.
            identity=cast(Any, options.identity or default_identity()),
            stop_flag=stop,
            ready_flag=started,
        )
    finally:
        readiness.cancel()
        runner.caches.close()
        if server is not None:
            server.stop()
        if owns_client:
            await asyncio.to_thread(api.close)
