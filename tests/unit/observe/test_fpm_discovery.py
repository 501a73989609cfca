"""FPM discovery's pure parts: Dynamo's event-plane frames, and which workers' publishers
count (ready pod of a planner role, registered FPM channel over ZMQ)."""

from __future__ import annotations

import struct
from typing import Any

import msgspec

from disagg_planner.observe.fpm_discovery import (
    FPM_TOPIC,
    event_plane_payload,
    fpm_channels,
    publishers,
)


def event_plane_message(payload: bytes, *, version: int = 1, sequence: int = 0) -> list[bytes]:
    """What Dynamo's ZMQ event plane sends: [topic, publisher_id, sequence, frame]."""
    envelope = msgspec.msgpack.encode(
        {
            "publisher_id": 7,
            "sequence": sequence,
            "published_at": 1_700_000_000_000,
            "topic": FPM_TOPIC,
            "payload": payload,
            "published_at_ns": 1_700_000_000_000_000_000,
        }
    )
    frame = struct.pack(">BI", version, len(envelope)) + envelope
    return [FPM_TOPIC.encode(), (7).to_bytes(8, "big"), sequence.to_bytes(8, "big"), frame]


def test_event_plane_payload_unwraps_the_envelope() -> None:
    assert event_plane_payload(event_plane_message(b"\x81\xa1a\x01")) == b"\x81\xa1a\x01"


def test_other_messages_are_not_event_plane() -> None:
    good = event_plane_message(b"x")
    assert event_plane_payload([b"", (1).to_bytes(8, "big"), b"payload"]) is None  # raw engine
    assert event_plane_payload(event_plane_message(b"x", version=2)) is None
    assert event_plane_payload([*good[:3], good[3][:-1]]) is None  # truncated
    assert event_plane_payload([*good[:3], struct.pack(">BI", 1, 2) + b"\xc1\xc1"]) is None


def channel(topic: str, transport: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "EventChannel",
        "namespace": "dyn",
        "component": "backend",
        "topic": topic,
        "instance_id": 42,
        "transport": transport,
    }


def worker_metadata(pod: str, endpoint: str, *, owner: bool = True) -> dict[str, Any]:
    """A DynamoWorkerMetadata as Dynamo's workers write it (``kube/crd.rs``)."""
    meta: dict[str, Any] = {"name": f"{pod}-main" if owner else pod}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": "u"}]
    zmq = {"kind": "Zmq", "config": {"endpoint": endpoint}}
    return {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "DynamoWorkerMetadata",
        "metadata": meta,
        "spec": {
            "data": {
                "endpoints": {},
                "model_cards": {},
                "event_channels": {
                    "dyn/backend/forward-pass-metrics/2a": channel(FPM_TOPIC, zmq),
                    "dyn/backend/kv-events/2a": channel(
                        "kv-events", {"kind": "Zmq", "config": {"endpoint": "tcp://x:1"}}
                    ),
                },
            }
        },
    }


def pod(name: str, service: str, *, ready: bool = True, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "labels": {
            "nvidia.com/dynamo-graph-deployment-name": "graph",
            "nvidia.com/dynamo-component": service,
        },
    }
    if deleting:
        meta["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


ROLES = {"prefill-pool": "prefill", "decode-pool": "decode"}


def test_ready_registered_workers_of_planner_roles_are_publishers() -> None:
    pods = [
        pod("p-0", "prefill-pool"),
        pod("d-0", "decode-pool"),
        pod("d-1", "decode-pool", ready=False),  # starting: not yet
        pod("d-2", "decode-pool", deleting=True),  # terminating: no longer
        pod("f-0", "Frontend"),  # not a planner role
        pod("d-3", "decode-pool"),  # ready, but has not registered
    ]
    metadatas = [
        worker_metadata("p-0", "tcp://10.0.0.1:5001"),
        worker_metadata("d-0", "tcp://10.0.0.2:5001", owner=False),  # pod mode: named after it
        worker_metadata("d-1", "tcp://10.0.0.3:5001"),
        worker_metadata("d-2", "tcp://10.0.0.4:5001"),
        worker_metadata("f-0", "tcp://10.0.0.5:5001"),
        worker_metadata("gone", "tcp://10.0.0.6:5001"),  # its pod is gone
    ]
    assert publishers(pods, metadatas, ROLES) == {
        "prefill": frozenset({"tcp://10.0.0.1:5001"}),
        "decode": frozenset({"tcp://10.0.0.2:5001"}),
    }


def test_channels_over_nats_are_not_publishers_but_are_named() -> None:
    nats = worker_metadata("d-0", "unused")
    fpm_key = "dyn/backend/forward-pass-metrics/2a"
    nats["spec"]["data"]["event_channels"][fpm_key]["transport"] = {
        "kind": "Nats",
        "config": {"subject_prefix": "namespace.dyn.component.backend"},
    }
    assert fpm_channels(nats) == ([], ["Nats"])
    assert publishers([pod("d-0", "decode-pool")], [nats], ROLES)["decode"] == frozenset()
