"""The connectors' settings, built from the planner's config.

Connectors never import the config (the import contract "connectors import no config"): each
takes a small frozen settings object holding exactly what it reads, and this module is the
one place that maps the config's fields (and derived values such as the override hold) onto
them.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.connectors.base import ConnectorSettings
from disagg_planner.connectors.elastic_ep import ElasticEpKubernetesSettings, ElasticEpSettings
from disagg_planner.connectors.kubernetes import KubernetesSettings
from disagg_planner.connectors.virtual import VirtualSettings


def _shared(config: PlannerConfig) -> dict[str, Any]:
    """The :class:`ConnectorSettings` fields, as keywords for any connector's settings."""
    shared = ConnectorSettings(
        roles=config.roles,
        model_name=config.model_name,
        gpus_per_replica={
            role: gpus
            for role in config.roles
            if (gpus := config.engine_num_gpu_for(role)) is not None
        },
        advisory=config.advisory,
        scaling_max_wait_s=config.scaling_max_wait_seconds,
        scaling_check_interval_s=config.scaling_check_interval_seconds,
    )
    return _as_keywords(shared)


def _as_keywords(settings: ConnectorSettings) -> dict[str, Any]:
    # Shallow on purpose: dataclasses.asdict would copy the mappings into new dicts.
    return {f.name: getattr(settings, f.name) for f in fields(settings)}


def kubernetes_settings(config: PlannerConfig) -> KubernetesSettings:
    """The DGD connector's settings."""
    return KubernetesSettings(
        **_shared(config),
        dgd_name=config.dgd_name,
        namespace=config.kubernetes_namespace,
        backend=config.backend,
        manual_override=config.manual_override,
        # A manual edit is respected for one interval of the loop that would undo it.
        override_hold_s=(
            config.throughput_adjustment_interval_seconds
            if config.throughput_scaling_active
            else config.load_adjustment_interval_seconds
        ),
        api_max_attempts=config.kubernetes_api_max_attempts,
        api_timeout_s=config.kubernetes_api_timeout_seconds,
        api_backoff_s=config.kubernetes_api_backoff_seconds,
        convergence_timeout_s=config.scaling_convergence_timeout_seconds,
        drain_timeout_s=config.kubernetes_drain_timeout_seconds,
    )


def elastic_ep_kubernetes_settings(config: PlannerConfig) -> ElasticEpKubernetesSettings:
    """The settings of the DGD connector that also scales the elastic role's followers."""
    return ElasticEpKubernetesSettings(
        **_as_keywords(kubernetes_settings(config)),
        follower_service=config.elastic_ep_follower_service,
        elastic_role=config.elastic_ep,
    )


def virtual_settings(config: PlannerConfig) -> VirtualSettings:
    """The virtual (decision-id protocol) connector's settings."""
    return VirtualSettings(
        **_shared(config),
        namespace=config.namespace,
        etcd_endpoint=config.virtual_etcd_endpoint,
        etcd_key_prefix=config.virtual_etcd_key_prefix,
        etcd_timeout_s=config.virtual_etcd_timeout_seconds,
    )


def elastic_ep_settings(config: PlannerConfig) -> ElasticEpSettings:
    """The elastic-EP controller's settings; ValueError without ``elastic_ep`` (a caller bug:
    the config's own checks require ``elastic_ep_max_dp`` with it)."""
    if config.elastic_ep is None or config.elastic_ep_max_dp is None:
        raise ValueError("ElasticEpController needs a config with elastic_ep set")
    return ElasticEpSettings(
        min_dp=config.elastic_ep_min_dp,
        max_dp=config.elastic_ep_max_dp,
        dp_step=config.elastic_ep_dp_step,
        resize_timeout_s=config.elastic_ep_resize_timeout_seconds,
        scaling_max_wait_s=config.scaling_max_wait_seconds,
        scaling_check_interval_s=config.scaling_check_interval_seconds,
        gpus_per_rank=config.elastic_ep_gpus_per_rank,
        grow_backoff_s=config.elastic_ep_grow_backoff_seconds,
    )
