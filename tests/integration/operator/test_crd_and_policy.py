"""The PlannerPolicy CRD is generated from the config schema (and committed up to date), and
a policy's spec becomes its loop's config with the documented precedence."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from disagg_planner.config.loader import field_names_by_key
from disagg_planner.config.schema import PlannerConfig
from disagg_planner.errors import ConfigError
from disagg_planner.operator import crd
from disagg_planner.operator.policy import OperatorDefaults, config_from_spec

REPO = Path(__file__).resolve().parents[3]
STRUCTURAL_KEYWORDS = {
    "type",
    "description",
    "enum",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "nullable",
    "items",
    "properties",
    "required",
    "additionalProperties",
    "format",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-preserve-unknown-fields",
}


def walk_schemas(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = [(path, schema)]
    for name, child in (schema.get("properties") or {}).items():
        out += walk_schemas(child, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        out += walk_schemas(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        out += walk_schemas(schema["additionalProperties"], f"{path}{{}}")
    return out


def test_committed_crds_are_what_the_schema_generates() -> None:
    for name, text in crd.generated_files().items():
        committed = REPO / "deploy" / "crds" / name
        assert committed.read_text(encoding="utf-8") == text, (
            f"{committed} is stale: run `python -m disagg_planner.operator.crd`"
        )


def test_check_mode_reports_stale_files_and_write_mode_fixes_them(tmp_path: Path, capsys) -> None:
    assert crd.main(["--output-dir", str(tmp_path), "--check"]) == 1
    assert "out of date" in capsys.readouterr().err
    assert crd.main(["--output-dir", str(tmp_path)]) == 0
    assert crd.main(["--output-dir", str(tmp_path), "--check"]) == 0
    docs = list(yaml.safe_load_all((tmp_path / crd.CRD_FILE).read_text()))
    assert [d["metadata"]["name"] for d in docs] == ["plannerpolicies.planner.autoscaling.dev"]


def test_spec_schema_has_every_setting_and_alias_and_only_structural_keywords() -> None:
    spec = crd.spec_schema()
    properties = spec["properties"]
    for name in PlannerConfig.model_fields:
        assert (name in properties) == (name not in crd.OPERATOR_SET_FIELDS), name
    for alias, name in field_names_by_key().items():
        if name not in crd.OPERATOR_SET_FIELDS:
            assert alias in properties, alias
    assert properties["ttft"]["description"].startswith("Alias of ttft_ms")
    assert spec["required"] == ["targetRef"]
    for path, schema in walk_schemas(
        crd.policy_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    ):
        unknown = set(schema) - STRUCTURAL_KEYWORDS
        assert not unknown, f"{path}: {unknown}"
        assert "default" not in schema, path  # defaults would override the operator's own
        if "exclusiveMinimum" in schema:
            assert schema["exclusiveMinimum"] is True and "minimum" in schema, path


def test_optional_settings_are_nullable_and_numbers_keep_their_bounds() -> None:
    properties = crd.spec_schema()["properties"]
    assert properties["model_name"] == {
        "description": properties["model_name"]["description"],
        "type": "string",
        "nullable": True,
    }
    quantile = properties["load_predictor_quantile"]
    assert (quantile["minimum"], quantile["maximum"], quantile["nullable"]) == (0, 1, True)
    assert quantile["exclusiveMinimum"] is True and quantile["exclusiveMaximum"] is True
    assert properties["load_predictor"]["enum"] == [
        "constant",
        "arima",
        "kalman",
        "prophet",
        "auto",
    ]
    assert "Default: 500.0." in properties["ttft_ms"]["description"]


def test_printer_columns_read_the_status_the_operator_writes() -> None:
    version = crd.policy_crd()["spec"]["versions"][0]
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Target"] == ".spec.targetRef.name"
    assert columns["Ready"] == '.status.conditions[?(@.type=="Ready")].status'
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert {"replicasSummary", "lastDecision", "conditions"} <= set(status)
    assert version["subresources"] == {"status": {}}


def defaults(**flags: Any) -> OperatorDefaults:
    return OperatorDefaults(flags=flags, environ={})


def test_a_spec_overrides_the_operator_and_the_operator_fills_the_rest() -> None:
    config = config_from_spec(
        {"targetRef": {"name": "graph"}, "ttft": 200},  # Dynamo's alias spelling
        namespace="team-a",
        policy="p",
        defaults=defaults(ttft_ms="300", itl_ms="40", environment="virtual"),
    )
    assert config.ttft_ms == 200  # the policy wins
    assert config.itl_ms == 40  # the operator's flag where the policy is silent
    assert (config.environment, config.dgd_name, config.kubernetes_namespace) == (
        "kubernetes",
        "graph",
        "team-a",
    )
    assert config.namespace == "team-a-graph"  # Dynamo operator's DYN_NAMESPACE convention


def test_an_explicit_dynamo_namespace_is_kept() -> None:
    config = config_from_spec(
        {"targetRef": {"name": "graph"}, "namespace": "prod"},
        namespace="team-a",
        policy="p",
        defaults=defaults(),
    )
    assert config.namespace == "prod"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({}, "spec.targetRef"),
        ({"targetRef": {"name": ""}}, "spec.targetRef.name"),
        ({"targetRef": {"name": "g", "kind": "Deployment"}}, "spec.targetRef.kind"),
        ({"targetRef": {"name": "g"}, "dgd_name": "other"}, "spec.dgd_name"),
        ({"targetRef": {"name": "g"}, "ttft_msx": 1}, "did you mean 'ttft_ms'"),
        ({"targetRef": {"name": "g"}, "max_gpu_budget": 0}, "max_gpu_budget = 0"),
    ],
)
def test_bad_specs_name_the_field(spec: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_spec(spec, namespace="ns", policy="p", defaults=defaults())
    assert expected in str(caught.value)
    assert "PlannerPolicy ns/p" in str(caught.value) or "spec.targetRef" in str(caught.value)
