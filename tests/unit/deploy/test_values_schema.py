"""values.schema.json: generated from PlannerConfig, accepts the chart's defaults and every
valid planner config, refuses what the planner would refuse field by field."""

from __future__ import annotations

import json
import subprocess
import sys
import typing
from typing import Any

import jsonschema
import pytest
import yaml

from disagg_planner.config.loader import field_names_by_key
from disagg_planner.config.schema import DYNAMO_KEYS_NOT_APPLICABLE, PlannerConfig
from disagg_planner.operator.crd import OPERATOR_SET_FIELDS
from tests.unit.deploy.conftest import CHART, REPO

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
VALIDATOR = jsonschema.Draft7Validator(SCHEMA)


def errors(values: dict[str, Any]) -> list[str]:
    return [
        f"/{'/'.join(str(p) for p in e.absolute_path)}: {e.message}"
        for e in VALIDATOR.iter_errors(values)
    ]


def with_config(**config: Any) -> dict[str, Any]:
    return {**VALUES, "config": config}


@pytest.mark.slow
def test_generated_files_are_up_to_date():
    for script in ("deploy/helm/generate.py", "deploy/grafana/generate.py"):
        result = subprocess.run(
            [sys.executable, script, "--check"], cwd=REPO, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_the_schema_is_valid_draft7_and_accepts_the_defaults():
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    assert errors(VALUES) == []


def test_config_block_lists_every_setting_a_policy_may_leave_to_the_operator():
    properties = set(SCHEMA["properties"]["config"]["properties"])
    fields = set(PlannerConfig.model_fields) - set(OPERATOR_SET_FIELDS)
    aliases = {k for k, name in field_names_by_key().items() if name not in OPERATOR_SET_FIELDS}
    assert properties == fields | aliases | set(DYNAMO_KEYS_NOT_APPLICABLE)
    assert not properties & set(OPERATOR_SET_FIELDS)


def test_choices_match_the_config_literals():
    config = SCHEMA["properties"]["config"]["properties"]
    for name, info in PlannerConfig.model_fields.items():
        if name in OPERATOR_SET_FIELDS:
            continue
        literals = [a for a in typing.get_args(info.annotation) or (info.annotation,)]
        choices = {
            v
            for a in literals
            if typing.get_origin(a) is typing.Literal
            for v in typing.get_args(a)
        }
        if choices:
            schema = config[name]
            enums = schema.get("enum") or next(o["enum"] for o in schema["anyOf"] if "enum" in o)
            assert set(enums) == choices, name


def test_every_default_of_the_config_is_a_valid_value():
    defaults = PlannerConfig().model_dump(mode="json")
    config = {k: v for k, v in defaults.items() if k not in OPERATOR_SET_FIELDS}
    assert errors(with_config(**config)) == []


def test_dynamo_spellings_and_ignored_dynamo_keys_are_accepted():
    assert (
        errors(with_config(ttft=200, itl=20, adjustment_interval=60, live_dashboard_port=8080))
        == []
    )


@pytest.mark.parametrize(
    ("config", "where"),
    [
        ({"ttft_ms": 0}, "/config/ttft_ms"),
        ({"itl_ms": "fast"}, "/config/itl_ms"),
        ({"load_predictor": "oracle"}, "/config/load_predictor"),
        ({"mode": "split"}, "/config/mode"),
        ({"min_endpoint": -1}, "/config/min_endpoint"),
        ({"load_scaling_down_sensitivity": 101}, "/config/load_scaling_down_sensitivity"),
        ({"ttft_attainment_target": 1.0}, "/config/ttft_attainment_target"),
        ({"prefill_fpm_endpoints": [5]}, "/config/prefill_fpm_endpoints/0"),
        ({"enable_load_scaling": "maybe"}, "/config/enable_load_scaling"),
        ({"ttft_msec": 1}, "/config"),
    ],
)
def test_a_wrong_setting_is_refused_naming_it(config: dict[str, Any], where: str):
    found = errors(with_config(**config))
    assert found and all(e.startswith(where) for e in found), found
    # the planner refuses the same value (it is what the pod would do at start)
    with pytest.raises(ValueError):
        PlannerConfig(**config)


def test_settings_the_operator_owns_are_refused():
    for name in (
        "kubernetes_namespace",
        "dgd_name",
        "environment",
        "metric_reporting_prometheus_port",
    ):
        found = errors(with_config(**{name: PlannerConfig.model_fields[name].default or "x"}))
        assert any(name in e for e in found), (name, found)


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"replicaCount": 0}, "/replicaCount"),
        ({"watch": {"scope": "namespaces", "namespaces": ["UPPER"]}}, "/watch/namespaces/0"),
        (
            {"image": {"repository": "", "tag": "", "pullPolicy": "IfNotPresent"}},
            "/image/repository",
        ),
        (
            {
                "metrics": {
                    **VALUES["metrics"],
                    "serviceMonitor": {"enabled": True, "interval": "soon"},
                }
            },
            "/metrics/serviceMonitor/interval",
        ),
        ({"logFormat": "xml"}, "/logFormat"),
    ],
)
def test_a_wrong_chart_value_is_refused(values: dict[str, Any], where: str):
    found = errors({**VALUES, **values})
    assert found and all(e.startswith(where) for e in found), found
