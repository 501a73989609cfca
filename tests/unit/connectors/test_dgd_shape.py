"""Pure rules over a DGD object: service resolution, GPUs, model name, readiness."""

from __future__ import annotations

from typing import Any

import pytest

from disagg_planner.connectors.base import check_replicas
from disagg_planner.connectors.dgd_shape import (
    dgd_services,
    ready_count,
    resolve_service,
    service_gpus,
    service_model_name,
    services_stable,
)
from disagg_planner.connectors.etcd import prefix_end
from disagg_planner.errors import DeploymentError

REF = "ns/graph"


def test_resolution_prefers_sub_component_type_then_legacy_name() -> None:
    services: dict[str, Any] = {
        "VllmPrefillWorker": {},
        "VllmDecodeWorker": {},
        "tagged": {"subComponentType": "decode"},
    }
    assert resolve_service(services, "decode", "vllm", REF) == ("tagged", "subComponentType")
    assert resolve_service(services, "prefill", "vllm", REF) == (
        "VllmPrefillWorker",
        "legacy name",
    )


def test_resolution_errors_name_the_services() -> None:
    dup = {"a": {"subComponentType": "prefill"}, "b": {"subComponentType": "prefill"}}
    with pytest.raises(DeploymentError, match=r"\['a', 'b'\] all have subComponentType"):
        resolve_service(dup, "prefill", "vllm", REF)
    with pytest.raises(DeploymentError, match=r"no service named 'TRTLLMDecodeWorker'.*\['x'\]"):
        resolve_service({"x": {}}, "decode", "trtllm", REF)


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        ({"limits": {"gpu": "2"}, "requests": {"gpu": "1"}}, 2),
        ({"requests": {"gpu": 4}}, 4),
        ({"limits": {"gpu": "0"}}, None),  # a CPU mocker: let the config decide
        ({"limits": {"cpu": "8"}}, None),
        (None, None),
    ],
)
def test_gpus_per_replica(resources: Any, expected: int | None) -> None:
    service = {} if resources is None else {"resources": resources}
    assert service_gpus(service, "w", REF) == expected


def test_bad_gpu_value_names_the_field() -> None:
    with pytest.raises(DeploymentError, match=r"spec.services.w.resources.limits.gpu = '1.5'"):
        service_gpus({"resources": {"limits": {"gpu": "1.5"}}}, "w", REF)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--model", "Org/Big", "--served-model-name", "Served"], "served"),
        (["--served-model-name=Short"], "short"),
        (["python3 -m dynamo.mocker --model-name Mock-1 --speedup 10"], "mock-1"),
        (["--model", "a/b"], "a/b"),
        (["--model"], None),
        ([], None),
    ],
)
def test_model_name_from_the_command_line(args: list[str], expected: str | None) -> None:
    service = {"extraPodSpec": {"mainContainer": {"args": args}}}
    assert service_model_name(service) == expected


def test_ready_count_prefers_available_replicas() -> None:
    dgd = {"status": {"services": {"w": {"readyReplicas": 3, "availableReplicas": 2}}}}
    assert ready_count(dgd, "w") == 2
    assert ready_count(dgd, "missing") == 0


def test_stability_needs_every_non_planner_service_updated_and_ready() -> None:
    dgd: dict[str, Any] = {
        "spec": {
            "services": {
                "w": {"replicas": 2},
                "p": {"componentType": "planner", "replicas": 1},
            }
        },
        "status": {"services": {"w": {"readyReplicas": 2, "updatedReplicas": 1}}},
    }
    assert services_stable(dgd, REF) is False  # one replica still on the old spec
    dgd["status"]["services"]["w"]["updatedReplicas"] = 2
    assert services_stable(dgd, REF) is True
    assert services_stable({"spec": dgd["spec"]}, REF) is False  # no status yet


def test_v1beta1_object_is_explained() -> None:
    with pytest.raises(DeploymentError, match="v1beta1"):
        dgd_services({"spec": {"components": []}}, REF)
    with pytest.raises(DeploymentError, match=r"spec.services.w is list"):
        dgd_services({"spec": {"services": {"w": []}}}, REF)


def test_replica_requests_are_checked() -> None:
    assert check_replicas({"prefill": 0}, ("prefill", "decode")) == {"prefill": 0}
    with pytest.raises(ValueError, match="role 'agg'"):
        check_replicas({"agg": 1}, ("prefill", "decode"))
    with pytest.raises(ValueError, match=r"'decode' must be an integer >= 0, got -1"):
        check_replicas({"decode": -1}, ("prefill", "decode"))
    with pytest.raises(ValueError, match="integer"):
        check_replicas({"decode": True}, ("prefill", "decode"))
    with pytest.raises(ValueError, match="at least one role"):
        check_replicas({}, ("decode",))


def test_prefix_end_selects_exactly_the_prefix() -> None:
    assert prefix_end(b"v1/ns/") == b"v1/ns0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff\xff") == b"\x00"
