"""The elastic-EP settings of PlannerConfig: flags, defaults and the cross-field rules."""

from __future__ import annotations

from typing import Any

import pytest

from disagg_planner.config.loader import load_config
from disagg_planner.config.schema import PlannerConfig
from disagg_planner.config.sections.elastic_ep import parse_elastic_ep_timing
from disagg_planner.errors import ConfigError


def elastic(**overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "mode": "agg",
        "max_gpu_budget": -1,
        "elastic_ep": "agg",
        "elastic_ep_min_dp": 16,
        "elastic_ep_max_dp": 24,
        "elastic_ep_dp_step": 4,
    }
    values.update(overrides)
    return values


def test_flags_set_the_elastic_settings():
    loaded = load_config(
        environ={},
        flags=elastic(
            elastic_ep_mode="blocking",
            elastic_ep_admin_url="http://leader:8000/",
            elastic_ep_timing="99.72,99.62,56.21,56.25",
        ),
    )
    cfg = loaded.config
    assert (cfg.elastic_ep, cfg.elastic_ep_mode) == ("agg", "blocking")
    assert cfg.elastic_ep_admin_url == "http://leader:8000"
    assert cfg.elastic_ep_drain_timeout_seconds == 120  # vLLM's API default
    assert parse_elastic_ep_timing(cfg.elastic_ep_timing or "") == (99.72, 99.62, 56.21, 56.25)


def test_no_elastic_role_needs_no_elastic_settings():
    cfg = PlannerConfig(mode="disagg", elastic_ep_dp_step=4, elastic_ep_min_dp=16)
    assert cfg.elastic_ep is None


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"elastic_ep": "decode"}, r"elastic_ep = 'decode' .*: must be a role this planner scales"),
        ({"elastic_ep_max_dp": None}, r"elastic_ep_max_dp = None .*: is required"),
        ({"elastic_ep_max_dp": 12}, r"must not be below elastic_ep_min_dp \(16\)"),
        ({"elastic_ep_max_dp": 22}, r"plus a whole number of elastic_ep_dp_step \(4\)"),
        (
            {
                "environment": "virtual",
                "decode_engine_num_gpu": 16,
                "elastic_ep_follower_service": "decode-elastic",
            },
            r"elastic_ep_follower_service = 'decode-elastic' .*: needs environment=kubernetes",
        ),
    ],
)
def test_cross_field_rules_name_the_field(overrides, problem):
    with pytest.raises(ConfigError, match=problem):
        load_config(environ={}, flags=elastic(**overrides))


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("1,2,3", "expected four comma-separated seconds"),
        ("1,2,x,4", "DOWN_TOTAL = 'x' is not a number"),
        ("1,-2,3,4", "UP_DOWNTIME = '-2' must be a finite number >= 0"),
    ],
)
def test_bad_timing_is_rejected_with_the_item(text, problem):
    with pytest.raises(ConfigError, match=problem):
        load_config(environ={}, flags=elastic(elastic_ep_timing=text))


def test_admin_url_must_be_http():
    with pytest.raises(ConfigError, match=r"elastic_ep_admin_url.*http:// or https://"):
        load_config(environ={}, flags=elastic(elastic_ep_admin_url="leader:8000"))


def test_drain_timeout_is_refused_where_vllm_would_ignore_it():
    """Issue 20, problem 4: vLLM honours drain_timeout only with
    VLLM_ELASTIC_EP_DRAIN_REQUESTS=1; Dynamo's route takes none at all."""
    with pytest.raises(ConfigError, match=r"elastic_ep_drain_timeout_seconds.*DRAIN_REQUESTS"):
        load_config(environ={}, flags=elastic(elastic_ep_drain_timeout_seconds=30))
    drains = load_config(
        environ={},
        flags=elastic(elastic_ep_drain_timeout_seconds=30, elastic_ep_engine_drains_requests=True),
    )
    assert drains.config.elastic_ep_drain_timeout_seconds == 30
    with pytest.raises(
        ConfigError, match=r"elastic_ep_drain_timeout_seconds.*elastic_ep_api=dynamo"
    ):
        load_config(
            environ={},
            flags=elastic(
                elastic_ep_api="dynamo",
                elastic_ep_drain_timeout_seconds=30,
                elastic_ep_engine_drains_requests=True,
            ),
        )
    with pytest.raises(ConfigError, match=r"elastic_ep_ray_dashboard_url.*ep_capacity"):
        load_config(
            environ={},
            flags=elastic(elastic_ep_api="dynamo", elastic_ep_ray_dashboard_url="http://h:8265"),
        )
    # the default is accepted everywhere: it is what vLLM's router uses anyway
    assert load_config(environ={}, flags=elastic()).config.elastic_ep_api == "auto"
