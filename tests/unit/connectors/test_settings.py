"""The connectors' settings as the application builds them from a config."""

from __future__ import annotations

import pytest

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.runtime.connector_settings import (
    elastic_ep_kubernetes_settings,
    elastic_ep_settings,
    kubernetes_settings,
    virtual_settings,
)


def test_configured_gpus_are_given_and_unset_ones_left_to_the_deployment() -> None:
    config = PlannerConfig(prefill_engine_num_gpu=2, kubernetes_namespace="ns", dgd_name="g")
    settings = kubernetes_settings(config)
    assert settings.roles == ("prefill", "decode")
    assert dict(settings.gpus_per_replica) == {"prefill": 2}
    assert (settings.namespace, settings.dgd_name) == ("ns", "g")
    virtual = virtual_settings(config.model_copy(update={"environment": "virtual"}))
    assert dict(virtual.gpus_per_replica) == {"prefill": 2}
    assert virtual.namespace == config.namespace  # the Dynamo namespace, not Kubernetes'


def test_a_manual_edit_is_held_for_one_interval_of_the_loop_that_would_undo_it() -> None:
    throughput = PlannerConfig(
        throughput_adjustment_interval_seconds=120.0, load_adjustment_interval_seconds=5.0
    )
    assert throughput.throughput_scaling_active
    assert kubernetes_settings(throughput).override_hold_s == 120.0
    load_only = throughput.model_copy(update={"optimization_target": "throughput"})
    assert not load_only.throughput_scaling_active
    assert kubernetes_settings(load_only).override_hold_s == 5.0


def test_elastic_settings_carry_the_follower_service_and_the_dp_bounds() -> None:
    config = PlannerConfig(
        mode="agg",
        elastic_ep="agg",
        elastic_ep_min_dp=16,
        elastic_ep_max_dp=24,
        elastic_ep_dp_step=4,
        elastic_ep_follower_service="followers",
        max_gpu_budget=-1,
    )
    assert elastic_ep_kubernetes_settings(config).follower_service == "followers"
    assert elastic_ep_kubernetes_settings(config).roles == ("agg",)
    controller = elastic_ep_settings(config)
    assert (controller.min_dp, controller.max_dp, controller.dp_step) == (16, 24, 4)
    with pytest.raises(ValueError, match="elastic_ep set"):
        elastic_ep_settings(PlannerConfig())
