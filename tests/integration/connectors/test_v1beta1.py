"""The connector on ``nvidia.com/v1beta1`` DGDs (``spec.components``) against kmock: found,
planned and scaled like v1alpha1 ones, on whichever version the server serves (issue 35).

kmock converts nothing between versions; where both are served, the object is stored in
both, as Dynamo's conversion webhook would show it."""

from __future__ import annotations

import copy
import json
from typing import Any

import kmock as kmock_lib
import pytest

from disagg_planner.connectors.kubernetes import STATE_ANNOTATION, KubernetesConnector
from disagg_planner.errors import DeploymentError
from tests.integration.connectors.conftest import (
    DGD_NAME,
    DGD_PLURAL,
    DGDSA_PLURAL,
    NS,
    Cluster,
    FakeTime,
    as_component,
    frontend,
    k8s_settings,
    services_of,
    worker,
)
from tests.kube_dynamo import BETA, GROUP, VERSION

pytestmark = pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")

PREFILL, DECODE = "prefill-pool", "decode-pool"


def disagg(prefill: int = 2, decode: int = 3) -> dict[str, dict[str, Any]]:
    return {
        "Frontend": frontend(),
        PREFILL: worker("prefill", prefill, gpu_limit="2"),
        DECODE: worker("decode", decode, gpu_limit=None, gpu_request="4"),
    }


@pytest.fixture
def beta(kmock: Any) -> Cluster:
    """A server that serves DGDs only as v1beta1."""
    return Cluster(kmock, version=BETA)


def connector(api_client: Any, time: FakeTime, **overrides: Any) -> KubernetesConnector:
    return KubernetesConnector(
        k8s_settings(**overrides), api_client=api_client, clock=time.clock, sleep=time.sleep
    )


async def test_scaling_a_v1beta1_dgd_patches_only_the_replicas(beta, api_client, fake_time):
    beta.add_dgd(disagg())
    before = beta.dgd()
    conn = connector(api_client, fake_time)

    outcome = await conn.set_replicas({"prefill": 2, "decode": 5})

    assert outcome.applied == {"decode": 5}
    after = beta.dgd()
    assert beta.replicas(DECODE) == 5
    # a JSON patch: every other field of every component is as it was
    expected = copy.deepcopy(before["spec"])
    for component in expected["components"]:
        if component["name"] == DECODE:
            component["replicas"] = 5
    assert after["spec"] == expected
    (patch,) = beta.requests("PATCH", DGD_PLURAL)
    ops = {op["path"]: op for op in patch.data}
    assert ops["/spec/components/2/name"] == {
        "op": "test",
        "path": "/spec/components/2/name",
        "value": DECODE,
    }
    state = json.loads(after["metadata"]["annotations"][STATE_ANNOTATION])
    assert state["pending"]["decode"] == 5  # the write in flight, travelling with it


async def test_a_v1beta1_adapter_is_scaled_through_scale(beta, api_client, fake_time):
    beta.add_dgd(disagg())
    adapter = beta.add_adapter(DECODE, 3)
    conn = connector(api_client, fake_time)

    await conn.set_replicas({"prefill": 2, "decode": 6})

    assert beta.adapter(adapter)["spec"]["replicas"] == 6
    assert beta.replicas(DECODE) == 6  # the adapter controller carried it into the DGD
    assert len(beta.requests("PATCH", DGDSA_PLURAL, "scale")) == 1


async def test_a_v1beta1_rebalance_keeps_the_budget(beta, api_client):
    time = FakeTime()
    beta.add_dgd(
        {
            "Frontend": frontend(),
            PREFILL: worker("prefill", 4, gpu_limit="4"),
            DECODE: worker("decode", 8, gpu_limit="4"),
        }
    )
    dynamo = beta.simulate_dynamo(time, grace_s=3.0)
    conn = connector(api_client, time, scaling_max_wait_seconds=10.0)

    outcome = await conn.set_replicas({"prefill": 5, "decode": 7})

    assert outcome.applied == {"prefill": 5, "decode": 7}
    assert max(dynamo.gpus_in_use({PREFILL: 4, DECODE: 4})) <= 48
    assert (beta.replicas(PREFILL), beta.replicas(DECODE)) == (5, 7)


async def test_a_manual_edit_of_a_v1beta1_component_is_respected(beta, api_client, fake_time):
    beta.add_dgd(disagg())
    conn = connector(api_client, fake_time, manual_override="respect")
    await conn.set_replicas({"prefill": 2, "decode": 4})

    beta.set_service_replicas(DECODE, 7)
    status = await conn.status()

    assert status.desired("decode") == 7
    assert "decode" in conn.holds()
    (override,) = conn.last_manual_overrides
    assert override.target == f"spec.components[name={DECODE}]"


def _store_in_both(cluster: Cluster, written_in: str | None) -> None:
    """The DGD as both versions show it; ``written_in``: its creator's managedFields."""
    alpha = cluster.dgd()
    if written_in is not None:
        alpha["metadata"]["managedFields"] = [
            {
                "manager": "kubectl",
                "operation": "Update",
                "apiVersion": f"{GROUP}/{written_in}",
                "fieldsV1": {"f:spec": {}},
            }
        ]
    components = [as_component(name, svc) for name, svc in services_of(alpha).items()]
    cluster.kmock.objects[f"{GROUP}/{BETA}/{DGD_PLURAL}", NS, DGD_NAME] = {
        **alpha,
        "apiVersion": f"{GROUP}/{BETA}",
        "spec": {"components": components},
        "status": {"components": alpha["status"]["services"]},
    }
    cluster.kmock.objects[cluster.dgd_key, NS, DGD_NAME] = alpha


@pytest.mark.parametrize(
    ("written_in", "used"),
    [(VERSION, VERSION), (BETA, BETA), (None, BETA)],
    ids=["written-v1alpha1", "written-v1beta1", "unknown-storage-version"],
)
async def test_with_both_served_the_version_it_was_written_in_is_used(
    kmock, api_client, fake_time, written_in, used
):
    cluster = Cluster(kmock, version=VERSION, served=(VERSION, BETA))
    cluster.add_dgd(disagg())
    _store_in_both(cluster, written_in)
    conn = connector(api_client, fake_time)

    await conn.set_replicas({"prefill": 2, "decode": 5})

    (patch,) = [r for r in cluster.requests("PATCH", DGD_PLURAL)]
    assert patch.resource.version == used


async def test_no_served_version_is_a_deployment_error(kmock, api_client, fake_time):
    kmock.resources.load_bundled()
    conn = connector(api_client, fake_time)
    with pytest.raises(DeploymentError, match="serves no version of dynamographdeployments"):
        await conn.validate()


async def test_a_restarted_planner_reads_its_state_back_from_a_v1beta1_dgd(
    beta, api_client, fake_time
):
    beta.add_dgd(disagg())
    await connector(api_client, fake_time).set_replicas({"prefill": 2, "decode": 5})
    beta.set_ready(DECODE, 5)  # the change converged

    successor = connector(api_client, fake_time)
    status = await successor.status()

    # its predecessor's write is its own, not a manual edit
    assert status.desired("decode") == 5
    assert successor.last_manual_overrides == ()
    assert successor.holds() == {}  # converged: no awaiting_convergence hold


async def test_a_v1beta1_scale_down_drains_the_idle_worker(beta, api_client, fake_time):
    beta.add_dgd(
        {"Frontend": frontend(), PREFILL: worker("prefill", 3), DECODE: worker("decode", 1)}
    )
    dynamo = beta.simulate_dynamo(fake_time, ready=True)
    pods = [p.name for p in dynamo.pods if p.service == PREFILL]
    conn = connector(api_client, fake_time, kubernetes_drain_timeout_seconds=30)
    conn.use_worker_loads(lambda: {pods[0]: 4, pods[1]: 0, pods[2]: 2})

    await conn.set_replicas({"prefill": 2, "decode": 1})
    await conn.drained()

    assert beta.replicas(PREFILL) == 2
    assert dynamo.removed == [pods[1]]


DRA_TEMPLATES = "resource.k8s.io/v1/resourceclaimtemplates"


async def test_gpus_declared_through_dra_claims_are_counted_by_the_budget(
    beta, api_client, fake_time
):
    beta.kmock.resources[DRA_TEMPLATES] = kmock_lib.ResourceInfo(
        kind="ResourceClaimTemplate",
        singular="resourceclaimtemplate",
        namespaced=True,
        verbs={"get"},
    )
    beta.kmock.objects[DRA_TEMPLATES, NS, "graph-decode-gpu"] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "graph-decode-gpu", "namespace": NS},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 4},
                        }
                    ]
                }
            }
        },
    }
    beta.add_dgd(disagg(decode=3))
    # the decode component declares its GPUs as a DRA claim, over two nodes per replica
    components = beta.dgd()["spec"]["components"]
    decode = next(c for c in components if c["name"] == DECODE)
    main = decode["podTemplate"]["spec"]["containers"][0]
    main["resources"] = {"claims": [{"name": "gpus"}]}
    decode["podTemplate"]["spec"]["resourceClaims"] = [
        {"name": "gpus", "resourceClaimTemplateName": "graph-decode-gpu"}
    ]
    decode["multinode"] = {"nodeCount": 2}
    beta.edit_dgd({"spec": {"components": components}})
    conn = connector(api_client, fake_time, max_gpu_budget=64)

    status = await conn.status()
    await conn.status()  # the template is read once

    assert status.roles["decode"].gpus_per_replica == 8  # 4 per pod x 2 pods
    assert status.gpus_in_use == 2 * 2 + 3 * 8
    assert (
        len(
            [
                r
                for r in beta.kmock
                if r.resource is not None and r.resource.plural == "resourceclaimtemplates"
            ]
        )
        == 1
    )
