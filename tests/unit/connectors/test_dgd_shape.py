"""Pure rules over a DGD object: service resolution, GPUs, model name, readiness."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from disagg_planner.connectors.base import check_replicas
from disagg_planner.connectors.dgd_shape import (
    claim_template_gpus,
    dgd_services,
    dgd_version,
    gpu_claim_templates,
    pods_per_replica,
    ready_count,
    replicas_patch,
    resolve_service,
    running_count,
    service_gpus,
    service_model_name,
    services_stable,
    written_version,
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


def test_malformed_objects_name_what_is_wrong() -> None:
    with pytest.raises(DeploymentError, match=r"spec.services.w is list"):
        dgd_services({"spec": {"services": {"w": []}}}, REF)
    with pytest.raises(DeploymentError, match=r"no spec.services map.*no spec.components list"):
        dgd_services({"apiVersion": "nvidia.com/v1alpha1", "spec": {}}, REF)
    with pytest.raises(DeploymentError, match=r"spec.components\[1\] is not a map with a"):
        dgd_services({"spec": {"components": [{"name": "a"}, {"type": "decode"}]}}, REF)
    with pytest.raises(DeploymentError, match=r"two entries of spec.components are named 'a'"):
        dgd_services({"spec": {"components": [{"name": "a"}, {"name": "a"}]}}, REF)


def beta_component(name: str, kind: str, replicas: int, gpus: str | None = "2") -> dict[str, Any]:
    """A v1beta1 component as Dynamo's v1beta1 examples write it."""
    main: dict[str, Any] = {"name": "main", "image": "vllm-runtime", "args": ["--model", "Q/W"]}
    if gpus is not None:
        main["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    return {
        "name": name,
        "type": kind,
        "replicas": replicas,
        "podTemplate": {"spec": {"containers": [{"name": "sidecar"}, main]}},
    }


BETA: dict[str, Any] = {
    "apiVersion": "nvidia.com/v1beta1",
    "metadata": {"annotations": {"a": "b"}},
    "spec": {
        "components": [
            {"name": "Frontend", "type": "frontend"},
            beta_component("pre", "prefill", 2),
            beta_component("dec", "decode", 3, gpus="4"),
            {"name": "planner", "type": "planner", "replicas": 1},
        ]
    },
    "status": {
        "components": {
            "Frontend": {"replicas": 1, "readyReplicas": 1},
            "pre": {"replicas": 2, "readyReplicas": 2, "availableReplicas": 1},
            "dec": {"replicas": 3, "readyReplicas": 3, "updatedReplicas": 3},
        }
    },
}


def test_v1beta1_components_read_like_services() -> None:
    services = dgd_services(BETA, REF)
    assert dgd_version(BETA) == "v1beta1"
    assert list(services) == ["Frontend", "pre", "dec", "planner"]
    # type: prefill/decode is the sub-role (v1beta1 has no subComponentType)
    assert resolve_service(services, "prefill", "vllm", REF) == ("pre", "subComponentType")
    assert resolve_service(services, "decode", "vllm", REF) == ("dec", "subComponentType")
    # GPUs and the model come from podTemplate's container named main, not the sidecar
    assert service_gpus(services["dec"], "dec", REF) == 4
    assert service_model_name(services["pre"]) == "q/w"
    assert (ready_count(BETA, "pre"), ready_count(BETA, "dec"), ready_count(BETA, "x")) == (1, 3, 0)
    assert running_count(BETA, "pre") == 2
    # pre has one replica not available yet; the planner component is not waited for
    assert services_stable(BETA, REF) is False
    ready = copy.deepcopy(BETA)
    ready["status"]["components"]["pre"]["availableReplicas"] = 2
    assert services_stable(ready, REF) is True


def test_v1beta1_bad_gpu_value_names_the_container_field() -> None:
    component = beta_component("dec", "decode", 1, gpus="half")
    with pytest.raises(
        DeploymentError,
        match=r"spec.components\[name=dec\].podTemplate.spec.containers\[main\].resources"
        r".limits.nvidia.com/gpu = 'half'",
    ):
        service_gpus(component, "dec", REF)


def test_version_from_api_version_then_shape() -> None:
    assert dgd_version({"apiVersion": "nvidia.com/v1alpha1", "spec": {"components": []}}) == (
        "v1alpha1"
    )
    assert dgd_version({"spec": {"components": []}}) == "v1beta1"
    assert dgd_version({"spec": {"services": {}}}) == "v1alpha1"


def test_written_version_is_the_first_spec_writer() -> None:
    def entry(api_version: str, fields: dict[str, Any]) -> dict[str, Any]:
        return {"manager": "m", "apiVersion": api_version, "fieldsV1": fields}

    dgd = {
        "metadata": {
            "managedFields": [
                entry("nvidia.com/v1beta1", {"f:status": {}}),  # status only: not a writer
                entry("nvidia.com/v1alpha1", {"f:spec": {}}),
                entry("nvidia.com/v1beta1", {"f:spec": {}}),
            ]
        }
    }
    assert written_version(dgd) == "v1alpha1"
    assert written_version({"metadata": {}}) is None


def test_replicas_patch_per_version() -> None:
    alpha = {"spec": {"services": {"d": {"replicas": 1, "resources": {}}}}}
    assert replicas_patch(alpha, {"d": 2}, {"k": "v"}, REF) == (
        "application/merge-patch+json",
        {"metadata": {"annotations": {"k": "v"}}, "spec": {"services": {"d": {"replicas": 2}}}},
    )
    content_type, ops = replicas_patch(
        BETA, {"dec": 5}, {"planner.autoscaling.dev/state": "s"}, REF
    )
    assert content_type == "application/json-patch+json"
    assert ops == [
        {"op": "add", "path": "/metadata/annotations/planner.autoscaling.dev~1state", "value": "s"},
        {"op": "test", "path": "/spec/components/2/name", "value": "dec"},
        {"op": "add", "path": "/spec/components/2/replicas", "value": 5},
    ]
    patched = jsonpatch.apply_patch(BETA, ops)
    assert patched["spec"]["components"][2]["replicas"] == 5
    # every other field of every component is kept (a merge patch would drop the list)
    assert patched["spec"]["components"][1] == BETA["spec"]["components"][1]
    bare = {"apiVersion": "nvidia.com/v1beta1", "spec": BETA["spec"]}
    _, ops = replicas_patch(bare, {"pre": 0}, {"k": "v"}, REF)
    assert ops[0] == {"op": "add", "path": "/metadata/annotations", "value": {"k": "v"}}
    with pytest.raises(DeploymentError, match="no component named 'gone'"):
        replicas_patch(BETA, {"gone": 1}, {}, REF)


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


def dra_component(claims: list[dict[str, Any]], pod_claims: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "name": "dec",
        "type": "decode",
        "podTemplate": {
            "spec": {
                "resourceClaims": pod_claims,
                "containers": [{"name": "main", "resources": {"claims": claims}}],
            }
        },
    }


def test_gpu_claims_lead_to_their_templates() -> None:
    component = dra_component(
        [{"name": "gpus"}], [{"name": "gpus", "resourceClaimTemplateName": "graph-dec-gpu"}]
    )
    assert gpu_claim_templates(component, "dec", REF) == ["graph-dec-gpu"]
    assert gpu_claim_templates(beta_component("x", "decode", 1), "x", REF) == []
    shared = dra_component([{"name": "gpus"}], [{"name": "gpus", "resourceClaimName": "pool"}])
    with pytest.raises(DeploymentError, match="ResourceClaim 'pool', shared by all its replicas"):
        gpu_claim_templates(shared, "dec", REF)
    undeclared = dra_component([{"name": "gpus"}], [])
    with pytest.raises(DeploymentError, match="claims 'gpus', which its pod's resourceClaims"):
        gpu_claim_templates(undeclared, "dec", REF)


def template(*requests: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"spec": {"devices": {"requests": list(requests)}}}}


GPU = "gpu.nvidia.com"
TEMPLATE_ROWS = [
    # (name, template, GPUs per claim)
    (
        "v1: count under exactly",
        template({"name": "g", "exactly": {"deviceClassName": GPU, "count": 4}}),
        4,
    ),
    ("v1beta1: flat request", template({"name": "g", "deviceClassName": GPU, "count": 2}), 2),
    ("count defaults to 1", template({"name": "g", "exactly": {"deviceClassName": GPU}}), 1),
    (
        "only GPU device classes count",
        template(
            {"name": "nic", "exactly": {"deviceClassName": "rdma.example.com", "count": 8}},
            {"name": "g", "exactly": {"deviceClassName": GPU, "count": 2}},
        ),
        2,
    ),
]


@pytest.mark.parametrize(
    ("tpl", "gpus"), [r[1:] for r in TEMPLATE_ROWS], ids=[r[0] for r in TEMPLATE_ROWS]
)
def test_gpus_of_a_claim_template(tpl: dict[str, Any], gpus: int) -> None:
    assert claim_template_gpus(tpl, "t") == gpus


def test_open_ended_claims_name_the_setting() -> None:
    all_gpus = template({"name": "g", "exactly": {"deviceClassName": GPU, "allocationMode": "All"}})
    with pytest.raises(DeploymentError, match=r"allocationMode = 'All'.*decode_engine_num_gpu"):
        claim_template_gpus(all_gpus, "t")
    alternatives = template({"name": "g", "firstAvailable": [{"deviceClassName": GPU}]})
    with pytest.raises(DeploymentError, match="firstAvailable"):
        claim_template_gpus(alternatives, "t")


def test_a_multinode_replica_has_its_nodes_pods() -> None:
    assert pods_per_replica({"multinode": {"nodeCount": 2}}) == 2
    assert pods_per_replica({}) == 1
