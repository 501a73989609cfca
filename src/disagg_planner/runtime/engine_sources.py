"""Where a deployment loop's load loop reads its engines' ForwardPassMetrics: one source per
role, started for the loop, which stops them when it closes."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.connectors.base import Connector
from disagg_planner.runtime.observation import EngineSource

log = logging.getLogger(__name__)


class Stoppable(Protocol):
    def stop(self, timeout_s: float = ...) -> None: ...


def start_engine_sources(
    config: PlannerConfig,
    connector: Connector,
    *,
    clock: Callable[[], float],
    label: str,
    name: str,
    owned: list[Stoppable],
) -> dict[str, EngineSource]:
    """One FPM source per role. Where the connector's engines are pods (its
    ``pod_discovery()``), their publishers are discovered (Dynamo's worker metadata of the
    DGD's ready pods, followed by watches) unless the config lists them
    (``prefill_fpm_endpoints`` / ``decode_fpm_endpoints``: the override); elsewhere the
    config's lists are all there is. What was started is appended to ``owned``; ``label``
    names the deployment in the log, ``name`` the sources' threads."""
    cfg = config
    # The services' roles are known once validate() read the DGD (start() ran it).
    pods = connector.pod_discovery()
    if pods is not None:
        from disagg_planner.observe.fpm_discovery import DiscoveredEngines

        engines = DiscoveredEngines(
            cfg,
            api_client=pods.api_client,
            namespace=pods.namespace,
            dgd_name=pods.dgd_name,
            service_roles=pods.service_roles,
            clock=clock,
            name=name,
        )
        engines.start()
        owned.append(engines)
        # A scale-down lets the least-loaded workers leave, after they drained.
        connector.use_worker_loads(engines.in_flight_by_pod)
        for role in cfg.roles:
            static = cfg.prefill_fpm_endpoints if role == "prefill" else cfg.decode_fpm_endpoints
            log.info(
                "%s: %s engines' ForwardPassMetrics %s",
                label,
                role,
                f"from the configured endpoints {list(static)}"
                if static
                else "from the publishers discovered in the cluster",
            )
        return dict(engines.sources)

    from disagg_planner.observe.fpm_subscriber import FpmSubscriber

    sources: dict[str, EngineSource] = {}
    for role in cfg.roles:
        endpoints = cfg.prefill_fpm_endpoints if role == "prefill" else cfg.decode_fpm_endpoints
        if not endpoints:
            log.warning(
                "%s: no ForwardPassMetrics endpoints for %s (set %s_fpm_endpoints); the "
                "load loop holds with no_fpm_data",
                label,
                role,
                "prefill" if role == "prefill" else "decode",
            )
        subscriber = FpmSubscriber(
            endpoints=endpoints,
            staleness_s=cfg.fpm_staleness_seconds,
            clock=clock,
            name=f"{name}-{role}",
        )
        subscriber.start()
        owned.append(subscriber)
        sources[role] = subscriber
    return sources
