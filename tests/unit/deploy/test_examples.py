"""deploy/examples: every PlannerPolicy is valid for the CRD, for the operator (the config it
becomes) and as Helm ``config:`` values; every example DGD is one the Kubernetes connector
accepts for its policy (validated through kmock with the real client)."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from kubernetes import client as k8s_client

from disagg_planner.connectors.kubernetes import KubernetesConnector
from disagg_planner.operator.crd import API_VERSION, KIND, policy_crd
from disagg_planner.operator.policy import OperatorDefaults, config_from_spec, target_of
from disagg_planner.profiles.registry import list_bundled
from disagg_planner.runtime.connector_settings import kubernetes_settings
from tests.e2e.kmock_server import declare_resources
from tests.kube_dynamo import DGD
from tests.unit.deploy.conftest import CHART, REPO

EXAMPLES = sorted((REPO / "deploy" / "examples").glob("*.yaml"))
DEFAULTS = OperatorDefaults(environ={})


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def policies() -> list[Any]:
    return [
        pytest.param(p, d, id=f"{p.name}:{d['metadata']['name']}")
        for p in EXAMPLES
        for d in documents(p)
        if d["kind"] == KIND
    ]


def dgds() -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (d["metadata"]["namespace"], d["metadata"]["name"]): d
        for p in EXAMPLES
        for d in documents(p)
        if d["kind"] == "DynamoGraphDeployment"
    }


def openapi_to_jsonschema(schema: Any) -> Any:
    """A Kubernetes structural (OpenAPI v3.0) schema as JSON Schema draft 4: ``nullable``
    becomes a null type; ``x-kubernetes-*`` extensions are dropped."""
    if isinstance(schema, list):
        return [openapi_to_jsonschema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: openapi_to_jsonschema(v) for k, v in schema.items() if not k.startswith("x-")}
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    return out


POLICY_SCHEMA = openapi_to_jsonschema(
    policy_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
)


def test_the_examples_are_the_four_the_docs_name():
    assert [p.name for p in EXAMPLES] == [
        "agg-vllm.yaml",
        "disagg-vllm.yaml",
        "policy-load-only.yaml",
        "policy-throughput-only.yaml",
    ]


@pytest.mark.parametrize(("path", "policy"), policies())
def test_policy_is_valid_for_the_crd_the_operator_and_helm(path: Path, policy: dict[str, Any]):
    assert policy["apiVersion"] == API_VERSION
    jsonschema.Draft4Validator(POLICY_SCHEMA).validate(policy)
    meta = policy["metadata"]
    config = config_from_spec(
        policy["spec"], namespace=meta["namespace"], policy=meta["name"], defaults=DEFAULTS
    )
    if config.profile is not None:
        assert config.profile in {name for name, _ in list_bundled()}, config.profile
    # the same settings are valid operator-wide defaults in the chart's values
    values_schema = json.loads((CHART / "values.schema.json").read_text())
    settings = {k: v for k, v in policy["spec"].items() if k != "targetRef"}
    jsonschema.Draft7Validator(values_schema["properties"]["config"]).validate(settings)
    name = path.name
    if "throughput-only" in name:
        assert config.throughput_scaling_active and not config.load_scaling_active
    if "load-only" in name:
        assert config.load_scaling_active and not config.throughput_scaling_active
    # Pod IPs change with every scale event and restart: the operator discovers the
    # engines' FPM publishers, and no example pins them by hand.
    assert not config.prefill_fpm_endpoints and not config.decode_fpm_endpoints, name


@pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")
@pytest.mark.parametrize(("path", "policy"), policies())
async def test_the_target_dgd_passes_the_connectors_validation(
    path: Path, policy: dict[str, Any], kmock: Any
):
    meta = policy["metadata"]
    target = target_of(policy["spec"], namespace=meta["namespace"], policy=meta["name"])
    dgd = dgds().get((target.namespace, target.name))
    assert dgd is not None, f"{path.name}: {target} is not an example DGD"
    config = config_from_spec(
        policy["spec"], namespace=meta["namespace"], policy=meta["name"], defaults=DEFAULTS
    )
    declare_resources(kmock)
    kmock.objects[DGD, target.namespace, target.name] = copy.deepcopy(dgd)
    configuration = k8s_client.Configuration()
    configuration.host = str(kmock.url).rstrip("/")
    api = k8s_client.ApiClient(configuration)
    try:
        connector = KubernetesConnector(kubernetes_settings(config), api_client=api)
        await connector.validate()
        assert connector.model_name is not None
        status = await connector.status()  # GPUs per replica from resources.limits.gpu
        assert set(status.roles) == set(config.roles)
        assert all(s.gpus_per_replica >= 1 for s in status.roles.values())
    finally:
        await asyncio.to_thread(api.close)
