"""KubernetesConnector against kmock (the API server) with the real ``kubernetes`` client."""

from __future__ import annotations

import copy
import json
import logging
from typing import Any

import kmock as kmock_lib
import pytest

from disagg_planner.connectors.base import Connector, HoldReason
from disagg_planner.connectors.kubernetes import STATE_ANNOTATION, KubernetesConnector
from disagg_planner.errors import ConnectorError, DeploymentError
from tests.integration.connectors.conftest import (
    DGD_PLURAL,
    DGDSA_PLURAL,
    GROUP,
    VERSION,
    Cluster,
    FakeTime,
    frontend,
    k8s_settings,
    replicas_patch,
    worker,
)
from tests.kube_dynamo import BETA

# kmock's bundled discovery data is read through a deprecated importlib API.
pytestmark = pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")


def disagg_services() -> dict[str, dict[str, Any]]:
    return {
        "Frontend": frontend(),
        "prefill-pool": worker("prefill", 2, gpu_limit="2"),
        "decode-pool": worker("decode", 3, gpu_limit=None, gpu_request="4"),
    }


def connector(api_client: Any, fake_time: FakeTime, **overrides: Any) -> KubernetesConnector:
    return KubernetesConnector(
        k8s_settings(**overrides),
        api_client=api_client,
        clock=fake_time.clock,
        sleep=fake_time.sleep,
    )


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


# --- finding the DGD and its services ------------------------------------------------------


@pytest.mark.parametrize("version", [VERSION, BETA])
async def test_validate_resolves_roles_by_sub_component_type(kmock, api_client, fake_time, version):
    # v1beta1 (issue 35): type prefill/decode, GPUs from podTemplate's main container
    cluster = Cluster(kmock, version=version)
    cluster.add_dgd(disagg_services(), ready={"Frontend": 1, "prefill-pool": 1, "decode-pool": 3})
    conn = connector(api_client, fake_time)
    assert isinstance(conn, Connector)

    await conn.validate()
    status = await conn.status()

    assert conn.model_name == "qwen/qwen3-0.6b"
    prefill, decode = status.roles["prefill"], status.roles["decode"]
    assert (prefill.desired, prefill.ready, prefill.gpus_per_replica) == (2, 1, 2)
    # GPUs from resources.requests when there is no limit
    assert (decode.desired, decode.ready, decode.gpus_per_replica) == (3, 3, 4)
    assert cluster.requests("PATCH", DGD_PLURAL) == []


async def test_missing_dgd_is_a_deployment_error(cluster, api_client, fake_time):
    cluster.add_dgd(disagg_services(), name="other-graph")
    conn = connector(api_client, fake_time)

    with pytest.raises(DeploymentError, match=r"default/graph.*not found"):
        await conn.validate()


def test_no_dgd_name_is_a_deployment_error(api_client):
    with pytest.raises(DeploymentError, match="DYN_PARENT_DGD_K8S_NAME"):
        KubernetesConnector(k8s_settings(dgd_name=None), api_client=api_client)


@pytest.mark.parametrize(
    ("backend", "prefill_name", "decode_name"),
    [
        ("vllm", "VllmPrefillWorker", "VllmDecodeWorker"),
        ("trtllm", "TRTLLMPrefillWorker", "TRTLLMDecodeWorker"),
        ("sglang", "prefill", "decode"),
    ],
)
async def test_legacy_service_names_per_backend(
    cluster, api_client, fake_time, backend, prefill_name, decode_name
):
    cluster.add_dgd(
        {
            "Frontend": frontend(),
            prefill_name: worker(None, 1),
            decode_name: worker(None, 5),
        }
    )
    conn = connector(api_client, fake_time, backend=backend)

    await conn.validate()
    await conn.set_replicas({"decode": 6})

    assert cluster.dgd()["spec"]["services"][decode_name]["replicas"] == 6
    assert (await conn.status()).desired("prefill") == 1


async def test_sub_component_type_wins_over_legacy_name(cluster, api_client, fake_time):
    cluster.add_dgd(
        {
            "VllmDecodeWorker": worker(None, 1),  # legacy name, but another service is tagged
            "decoders": worker("decode", 4),
            "VllmPrefillWorker": worker(None, 2),
        }
    )
    conn = connector(api_client, fake_time)
    status = await conn.status()
    assert status.desired("decode") == 4
    assert status.desired("prefill") == 2


async def test_legacy_name_with_another_sub_component_type_is_rejected(
    cluster, api_client, fake_time
):
    cluster.add_dgd({"VllmPrefillWorker": worker("decode", 1), "d2": worker("decode", 1)})
    conn = connector(api_client, fake_time, mode="prefill")
    with pytest.raises(
        DeploymentError,
        match=r"service 'VllmPrefillWorker' \(the vllm legacy name\) has subComponentType 'decode'",
    ):
        await conn.validate()


async def test_duplicate_sub_component_type_is_rejected(cluster, api_client, fake_time):
    services = disagg_services()
    services["decode-pool-b"] = worker("decode", 1)
    cluster.add_dgd(services)
    conn = connector(api_client, fake_time)

    with pytest.raises(DeploymentError, match=r"\['decode-pool', 'decode-pool-b'\].*'decode'"):
        await conn.validate()


async def test_missing_role_names_what_was_looked_for(cluster, api_client, fake_time):
    cluster.add_dgd({"Frontend": frontend(), "decode-pool": worker("decode", 1)})
    conn = connector(api_client, fake_time)
    with pytest.raises(DeploymentError, match=r"subComponentType 'prefill'.*VllmPrefillWorker"):
        await conn.validate()


async def test_model_names_must_agree(cluster, api_client, fake_time):
    services = disagg_services()
    services["decode-pool"] = worker("decode", 1, model="meta-llama/Llama-3.1-8B")
    cluster.add_dgd(services)
    with pytest.raises(DeploymentError, match="model names disagree"):
        await connector(api_client, fake_time).validate()


async def test_configured_model_name_must_match_the_deployment(cluster, api_client, fake_time):
    cluster.add_dgd(disagg_services())
    with pytest.raises(DeploymentError, match=r"serves model 'qwen/qwen3-0\.6b'.*'other-model'"):
        await connector(api_client, fake_time, model_name="other-model").validate()


async def test_unknown_gpus_need_the_config_value(cluster, api_client, fake_time):
    services = disagg_services()
    services["prefill-pool"] = worker("prefill", 1, gpu_limit=None)
    cluster.add_dgd(services)
    with pytest.raises(DeploymentError, match="prefill_engine_num_gpu"):
        await connector(api_client, fake_time).validate()

    conn = connector(api_client, fake_time, prefill_engine_num_gpu=4)
    await conn.validate()
    assert (await conn.status()).roles["prefill"].gpus_per_replica == 4


# --- writing replicas ---------------------------------------------------------------------------


async def test_merge_patch_changes_only_the_target_service(cluster, api_client, fake_time):
    cluster.add_dgd(disagg_services())
    before = cluster.dgd()
    conn = connector(api_client, fake_time)

    outcome = await conn.set_replicas({"decode": 7, "prefill": 2})

    assert outcome.applied == {"decode": 7}
    assert outcome.unchanged == ("prefill",)
    (patch,) = cluster.requests("PATCH", DGD_PLURAL)
    assert patch.headers["Content-Type"] == "application/merge-patch+json"
    assert replicas_patch(patch) == {"spec": {"services": {"decode-pool": {"replicas": 7}}}}
    expected = copy.deepcopy(before)
    expected["spec"]["services"]["decode-pool"]["replicas"] = 7
    # ... and the planner's state, in the same patch (read back after a restart)
    expected["metadata"]["annotations"] = patch.data["metadata"]["annotations"]
    assert canonical(cluster.dgd()) == canonical(expected)


async def test_two_roles_change_in_one_patch(cluster, api_client, fake_time):
    cluster.add_dgd(disagg_services())
    conn = connector(api_client, fake_time)

    outcome = await conn.set_replicas({"prefill": 4, "decode": 5})

    assert outcome.applied == {"prefill": 4, "decode": 5}
    (patch,) = cluster.requests("PATCH", DGD_PLURAL)
    assert replicas_patch(patch) == {
        "spec": {"services": {"prefill-pool": {"replicas": 4}, "decode-pool": {"replicas": 5}}}
    }
    status = await conn.status()
    assert (status.desired("prefill"), status.desired("decode")) == (4, 5)


async def test_a_rebalance_lowers_in_one_patch_then_raises_in_another(
    cluster, api_client, fake_time
):
    # The budget-safe order (test_budget_safe_writes.py has the GPU accounting).
    cluster.add_dgd(disagg_services())
    cluster.simulate_dynamo(fake_time, grace_s=2.0)
    conn = connector(api_client, fake_time)

    outcome = await conn.set_replicas({"prefill": 4, "decode": 1})

    assert outcome.applied == {"prefill": 4, "decode": 1}
    first, second = cluster.requests("PATCH", DGD_PLURAL)
    assert replicas_patch(first) == {"spec": {"services": {"decode-pool": {"replicas": 1}}}}
    assert replicas_patch(second) == {"spec": {"services": {"prefill-pool": {"replicas": 4}}}}
    status = await conn.status()
    assert (status.desired("prefill"), status.desired("decode")) == (4, 1)


async def test_scaling_adapter_scale_subresource_is_used_when_present(
    cluster, api_client, fake_time
):
    cluster.add_dgd(disagg_services())
    adapter = cluster.add_adapter("decode-pool", 3)
    cluster.simulate_dynamo(fake_time)
    conn = connector(api_client, fake_time)
    await conn.validate()

    outcome = await conn.set_replicas({"decode": 5, "prefill": 1})

    assert outcome.applied == {"decode": 5, "prefill": 1}
    (scale,) = cluster.requests("PATCH", DGDSA_PLURAL, "scale")
    assert scale.name == adapter
    assert scale.data == {"spec": {"replicas": 5}}
    assert scale.headers["Content-Type"] == "application/merge-patch+json"
    # the DGD's replicas are patched only for the role without an adapter (the decrease,
    # first); the state annotation is written before the adapter's /scale, naming it pending
    patch, state = cluster.requests("PATCH", DGD_PLURAL)
    assert set(state.data) == {"metadata"}
    pending = json.loads(state.data["metadata"]["annotations"][STATE_ANNOTATION])["pending"]
    assert pending == {"decode": 5}
    assert replicas_patch(patch) == {"spec": {"services": {"prefill-pool": {"replicas": 1}}}}
    assert cluster.adapter(adapter)["spec"]["replicas"] == 5
    # the adapter controller (a kmock reaction here) carried the value into the DGD
    assert cluster.dgd()["spec"]["services"]["decode-pool"]["replicas"] == 5
    assert (await conn.status()).desired("decode") == 5


async def test_adapter_of_another_service_is_refused(cluster, api_client, fake_time):
    cluster.add_dgd(disagg_services())
    name = cluster.add_adapter("decode-pool", 3)
    cluster.kmock.objects[f"nvidia.com/v1alpha1/{DGDSA_PLURAL}", "default", name].patch(
        {"spec": {"dgdRef": {"serviceName": "prefill-pool"}}}
    )
    with pytest.raises(DeploymentError, match="refusing to scale through it"):
        await connector(api_client, fake_time).validate()


async def test_blocking_scale_waits_for_readiness(cluster, api_client, fake_time):
    cluster.add_dgd(disagg_services())
    conn = connector(api_client, fake_time, scaling_max_wait_seconds=5.0)

    outcome = await conn.set_replicas({"decode": 4}, blocking=True)
    assert outcome.ready is False  # status never reached 4 ready decode replicas
    assert sum(fake_time.sleeps) == pytest.approx(5.0)

    cluster.set_ready("decode-pool", 4)
    assert await conn.wait_until_ready(5.0) is True
    assert (await conn.set_replicas({"decode": 4}, blocking=True)).ready is True


async def test_readiness_ignores_the_planner_service(cluster, api_client, fake_time):
    services = disagg_services()
    services["Planner"] = {"componentType": "planner", "replicas": 1}
    cluster.add_dgd(services, ready={"Frontend": 1, "prefill-pool": 2, "decode-pool": 3})
    conn = connector(api_client, fake_time)
    assert await conn.wait_until_ready(1.0) is True


# --- manual edits -------------------------------------------------------------------------------


async def test_manual_edit_is_respected_for_one_interval(cluster, api_client, fake_time):
    cluster.add_dgd(disagg_services())
    conn = connector(api_client, fake_time, throughput_adjustment_interval_seconds=60.0)
    await conn.validate()
    await conn.set_replicas({"decode": 4})

    cluster.edit_dgd({"spec": {"services": {"decode-pool": {"replicas": 9}}}})
    status = await conn.status()

    assert status.desired("decode") == 9
    (override,) = conn.last_manual_overrides
    assert (override.role, override.expected, override.observed, override.action) == (
        "decode",
        4,
        9,
        "respected",
    )
    assert conn.holds()["decode"].reason is HoldReason.MANUAL_OVERRIDE
    (event,) = cluster.events()
    assert event["reason"] == "ManualScaleRespected"
    assert event["type"] == "Normal"
    assert event["involvedObject"]["kind"] == "DynamoGraphDeployment"
    assert event["involvedObject"]["name"] == "graph"
    assert "from 4" in event["message"] and "to 9" in event["message"]

    # during the hold the role is left alone; the other role still scales
    outcome = await conn.set_replicas({"decode": 2, "prefill": 5})
    assert set(outcome.held) == {"decode"}
    assert outcome.applied == {"prefill": 5}
    assert cluster.dgd()["spec"]["services"]["decode-pool"]["replicas"] == 9

    fake_time.now += 60.0
    assert "decode" not in conn.holds()
    outcome = await conn.set_replicas({"decode": 2})
    assert outcome.applied == {"decode": 2}
    assert cluster.dgd()["spec"]["services"]["decode-pool"]["replicas"] == 2
    assert len(cluster.events()) == 1  # our own writes are never taken for manual edits


@pytest.mark.parametrize("policy", ["respect", "revert"])
async def test_a_recreated_dgd_is_a_new_deployment_not_a_manual_edit(
    cluster, api_client, fake_time, policy
):
    # Issue 19, problem 5: deleted and applied again (a new uid), at its manifest's replicas.
    cluster.add_dgd(disagg_services())
    conn = connector(api_client, fake_time, manual_override=policy)
    await conn.validate()
    await conn.set_replicas({"decode": 5, "prefill": 4})

    services = disagg_services()  # decode 3, prefill 2
    cluster.add_dgd(services, uid="7c1d-uid")
    status = await conn.status()

    assert (status.desired("decode"), status.desired("prefill")) == (3, 2)
    assert conn.last_manual_overrides == ()
    assert conn.holds() == {}
    assert cluster.events() == []
    assert len(cluster.requests("PATCH", DGD_PLURAL)) == 1  # nothing written back
    # planning goes on at once, from the new object's values
    assert (await conn.set_replicas({"decode": 4})).applied == {"decode": 4}
    assert cluster.dgd()["spec"]["services"]["decode-pool"]["replicas"] == 4
    assert cluster.dgd()["metadata"]["uid"] == "7c1d-uid"


async def test_manual_edit_is_reverted_by_policy(cluster, api_client, fake_time):
    cluster.add_dgd(disagg_services())
    conn = connector(api_client, fake_time, manual_override="revert")
    await conn.validate()

    cluster.edit_dgd({"spec": {"services": {"prefill-pool": {"replicas": 6}}}})
    status = await conn.status()

    assert status.desired("prefill") == 2
    assert cluster.dgd()["spec"]["services"]["prefill-pool"]["replicas"] == 2
    assert conn.holds() == {}
    (event,) = cluster.events()
    assert (event["reason"], event["type"]) == ("ManualScaleReverted", "Warning")
    assert (await conn.set_replicas({"prefill": 3})).applied == {"prefill": 3}


async def test_manual_edit_of_an_adapter_is_detected(cluster, api_client, fake_time):
    cluster.add_dgd(disagg_services())
    adapter = cluster.add_adapter("decode-pool", 3)
    conn = connector(api_client, fake_time)
    await conn.validate()

    # e.g. an HPA or `kubectl scale dgdsa` changed the adapter
    cluster.kmock.objects[f"nvidia.com/v1alpha1/{DGDSA_PLURAL}", "default", adapter].patch(
        {"spec": {"replicas": 8}}
    )
    assert (await conn.status()).desired("decode") == 8
    assert conn.holds()["decode"].reason is HoldReason.MANUAL_OVERRIDE
    assert adapter in cluster.events()[0]["message"]


async def test_event_failure_does_not_stop_scaling(cluster, api_client, fake_time, caplog):
    cluster.add_dgd(disagg_services())
    cluster.fail("POST", "events", [403], group="", version="v1")
    dynamo = cluster.simulate_dynamo(fake_time)
    conn = connector(api_client, fake_time)
    await conn.validate()
    cluster.edit_dgd({"spec": {"services": {"decode-pool": {"replicas": 1}}}})
    dynamo.reconcile()

    assert (await conn.status()).desired("decode") == 1
    assert "decode" in conn.holds()
    assert len(cluster.requests("POST", "events")) == 1  # tried once, refused, not retried
    assert "could not record a Kubernetes Event" in caplog.text
    assert "forbidden" in caplog.text
    assert (await conn.set_replicas({"prefill": 3})).applied == {"prefill": 3}


# --- API errors ---------------------------------------------------------------------------------


async def test_conflict_on_patch_is_retried_with_backoff(cluster, api_client, fake_time):
    cluster.add_dgd(disagg_services())
    cluster.fail("PATCH", DGD_PLURAL, [409, 409])
    conn = connector(api_client, fake_time, kubernetes_api_backoff_seconds=0.5)

    outcome = await conn.set_replicas({"decode": 5})

    assert outcome.applied == {"decode": 5}
    assert len(cluster.requests("PATCH", DGD_PLURAL)) == 3
    assert fake_time.sleeps == [0.5, 1.0]  # exponential backoff
    assert cluster.dgd()["spec"]["services"]["decode-pool"]["replicas"] == 5


async def test_too_many_requests_is_retried(cluster, api_client, fake_time):
    cluster.add_dgd(disagg_services())
    cluster.fail("GET", DGD_PLURAL, [429, 429, 429])
    conn = connector(api_client, fake_time, kubernetes_api_backoff_seconds=0.25)

    status = await conn.status()

    assert status.desired("decode") == 3
    assert len(cluster.requests("GET", DGD_PLURAL)) == 4
    assert fake_time.sleeps == [0.25, 0.5, 1.0]


async def test_each_logged_attempt_is_one_request_and_retry_after_is_honoured_once(
    cluster, kmock, api_client, fake_time, caplog
):
    """Issue 36 item 4: urllib3's own Retry(3) honoured Retry-After under each attempt, so
    one logged attempt was up to 4 GETs; now the connector's retry is the only one."""
    cluster.add_dgd(disagg_services())
    remaining = [429, 429, 429]

    def too_many(request: Any) -> Any:
        if not remaining or request.name != "graph":
            raise NotImplementedError  # kmock: the emulator serves it
        remaining.pop()
        status = {"kind": "Status", "status": "Failure", "code": 429, "message": "slow down"}
        return kmock_lib.Response(status=429, headers={"Retry-After": "1"}, payload=status)

    kmock["GET", kmock_lib.resource(GROUP, VERSION, DGD_PLURAL)] << too_many
    conn = connector(api_client, fake_time, kubernetes_api_backoff_seconds=0.25)

    with caplog.at_level(logging.WARNING, logger="disagg_planner.connectors.kubernetes"):
        status = await conn.status()

    logged = [r for r in caplog.records if "attempt" in r.getMessage()]
    gets = [r for r in cluster.requests("GET", DGD_PLURAL) if r.name == "graph"]
    assert (status.desired("decode"), len(logged), len(gets), fake_time.sleeps) == (
        3,
        3,
        4,  # three refused attempts and the one that was served
        [1.0, 1.0, 1.0],  # the server's Retry-After, by the connector, once per attempt
    )


async def test_server_error_is_retried_then_surfaced(cluster, api_client, fake_time):
    cluster.add_dgd(disagg_services())
    cluster.fail("GET", DGD_PLURAL, [500] * 4)
    conn = connector(api_client, fake_time, kubernetes_api_max_attempts=4)

    with pytest.raises(ConnectorError, match=r"failed after 4 attempt\(s\); last: 500"):
        await conn.status()
    assert len(cluster.requests("GET", DGD_PLURAL)) == 4

    # the API recovers (the injected answers are used up): the same connector works again
    assert (await conn.status()).desired("prefill") == 2


async def test_forbidden_is_surfaced_at_once_with_the_missing_permission(
    cluster, api_client, fake_time
):
    cluster.add_dgd(disagg_services())
    cluster.fail("PATCH", DGD_PLURAL, [403])
    conn = connector(api_client, fake_time)

    with pytest.raises(ConnectorError, match=r"forbidden.*'patch' on 'dynamographdeployments'"):
        await conn.set_replicas({"decode": 1})
    assert len(cluster.requests("PATCH", DGD_PLURAL)) == 1
    assert fake_time.sleeps == []


async def test_not_found_during_scaling_is_a_deployment_error(cluster, api_client, fake_time):
    cluster.add_dgd(disagg_services())
    cluster.fail("PATCH", DGD_PLURAL, [404])
    conn = connector(api_client, fake_time)

    with pytest.raises(DeploymentError, match="not found"):
        await conn.set_replicas({"decode": 1})
    assert len(cluster.requests("PATCH", DGD_PLURAL)) == 1


async def test_a_write_whose_answer_was_lost_is_not_a_manual_edit(cluster, api_client, fake_time):
    # kmock stores a PATCH before the injected 500 answers it: the write landed, the
    # planner was told it failed.
    cluster.add_dgd(disagg_services())
    cluster.fail("PATCH", DGD_PLURAL, [500, 500])
    conn = connector(api_client, fake_time, kubernetes_api_max_attempts=2)
    await conn.validate()

    with pytest.raises(ConnectorError):
        await conn.set_replicas({"decode": 6})
    assert cluster.dgd()["spec"]["services"]["decode-pool"]["replicas"] == 6

    assert (await conn.status()).desired("decode") == 6
    assert conn.last_manual_overrides == ()
    assert conn.holds() == {}
    assert cluster.events() == []


async def test_kubeconfig_set_after_import_is_used(cluster, kmock, tmp_path, monkeypatch):
    cluster.add_dgd(disagg_services())
    kubeconfig = tmp_path / "kubeconfig.yaml"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "kmock",
                "clusters": [{"name": "kmock", "cluster": {"server": str(kmock.url).rstrip("/")}}],
                "users": [{"name": "kmock", "user": {"token": "dummy"}}],
                "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock"}}],
            }
        )
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    conn = KubernetesConnector(k8s_settings())  # no api_client: kubeconfig (not in a pod)
    try:
        await conn.validate()
        assert (await conn.status()).desired("decode") == 3
    finally:
        await conn.close()


async def test_advisory_mode_never_writes(cluster, api_client, fake_time):
    cluster.add_dgd(disagg_services())
    conn = connector(api_client, fake_time, advisory=True, manual_override="revert")
    await conn.validate()

    outcome = await conn.set_replicas({"decode": 8, "prefill": 2})
    assert outcome.applied == {}
    assert outcome.held["decode"].reason is HoldReason.ADVISORY
    assert outcome.unchanged == ("prefill",)

    cluster.edit_dgd({"spec": {"services": {"decode-pool": {"replicas": 1}}}})
    assert (await conn.status()).desired("decode") == 1  # not reverted
    assert cluster.requests("PATCH", DGD_PLURAL) == []
