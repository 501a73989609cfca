"""dynamo_reconciler_claim: which DGDs Dynamo's own elastic-EP reconciler drives."""

from __future__ import annotations

from typing import Any

from disagg_planner.connectors.elastic_ep import dynamo_reconciler_claim


def leader(*args: str, command: list[str] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"args": list(args)}
    if command is not None:
        container["command"] = command
    return {"componentType": "worker", "extraPodSpec": {"mainContainer": container}}


RAY_ELASTIC = (
    "--model",
    "m",
    "--enable-elastic-ep",
    "--enable-eplb",
    "--data-parallel-backend",
    "ray",
)


def dgd(services: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {"spec": {"services": services}}
    if status is not None:
        obj["status"] = {"services": status}
    return obj


def test_an_elastic_ray_leader_with_dynamos_follower_is_claimed():
    for services, status in (
        ({"VllmWorker": leader(*RAY_ELASTIC), "VllmWorker-flw": {}}, None),
        ({"VllmWorker": leader(*RAY_ELASTIC)}, {"vllmworker-flw": {"replicas": 0}}),
    ):
        claim = dynamo_reconciler_claim(dgd(services, status), leader_service="VllmWorker")
        assert claim is not None
        assert "vllmworker-flw" in claim and "elastic_ep_follower_service" in claim


def test_every_spelling_of_the_ray_backend_counts():
    for spelling in (
        ("--data-parallel-backend=ray",),
        ("-dpb", "ray"),
        ("-dpb=RAY",),
    ):
        services = {"w": leader("--enable-elastic-ep", *spelling), "w-flw": {}}
        assert dynamo_reconciler_claim(dgd(services), leader_service="w") is not None
    # the vLLM invocation written in command: as one shell string
    shell = leader(command=["sh", "-c", "exec vllm serve m --enable-elastic-ep -dpb ray"])
    assert dynamo_reconciler_claim(dgd({"w": shell, "w-flw": {}}), leader_service="w")


def test_no_claim_without_both_marks():
    cases = [
        {"w": leader(*RAY_ELASTIC), "w-elastic": {}},  # a declared follower: ours
        {"w": leader("--enable-elastic-ep", "--data-parallel-backend", "mp"), "w-flw": {}},
        {"w": leader("--data-parallel-backend", "ray"), "w-flw": {}},  # not elastic
        {"other": leader(*RAY_ELASTIC), "other-flw": {}},  # another service's follower
    ]
    for services in cases:
        assert dynamo_reconciler_claim(dgd(services), leader_service="w") is None
    assert dynamo_reconciler_claim({"spec": {}}, leader_service="w") is None
