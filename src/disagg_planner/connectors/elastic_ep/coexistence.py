"""Whether Dynamo's own elastic-EP reconciler drives a DGD's engine: then the planner must not.

Dynamo's operator has an elastic-EP autoscale reconciler (feature ``ElasticEPAutoscale``,
default off, enabled in the operator's environment with
``DYN_OPERATOR_ENABLE_ELASTIC_EP_AUTOSCALE=1``). For every component whose main container is
an elastic-EP Ray launch (``--enable-elastic-ep`` with the Ray data-parallel backend) it reads
the worker's ``/engine/control/ep_capacity`` and calls ``/engine/control/scale_elastic_ep`` to
set DP to ``1 + followers``, the followers being the replicas of the Deployment it synthesizes
as ``<leader>-flw``. The planner scales a declared follower service and calls the same route,
so with both on one engine there are two writers.

The gate is an operator setting and leaves nothing on the DGD; what the object does show is
the shape the reconciler drives: an elastic-EP Ray launch whose follower is the operator's
synthesized ``<leader>-flw`` component. :func:`dynamo_reconciler_claim` is a pure function
of the DGD; the live loop (``planner run`` and every loop of ``planner operator``) calls it
each tick and reports a claim as a problem with reason :data:`CLAIM_REASON`, which the
operator shows as its ``Degraded`` condition (``DeploymentInvalid``, the claim as message).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from disagg_planner.connectors.dgd_shape import dgd_services, flag_value, main_container_tokens
from disagg_planner.errors import DeploymentError

DYNAMO_FOLLOWER_SUFFIX = "-flw"
ELASTIC_EP_FLAG = "--enable-elastic-ep"
DP_BACKEND_FLAGS = ("--data-parallel-backend", "-dpb")
CLAIM_REASON = "DynamoElasticEpReconciler"


def is_elastic_ep_ray_launch(service: Mapping[str, Any]) -> bool:
    """Whether the service's main container launches vLLM elastic EP on the Ray DP backend
    (the components Dynamo's reconciler selects)."""
    tokens = main_container_tokens(service)
    if ELASTIC_EP_FLAG not in tokens:
        return False
    backend = flag_value(tokens, DP_BACKEND_FLAGS)
    return backend is not None and backend.lower() == "ray"


def _status_names(dgd: Mapping[str, Any]) -> set[str]:
    status = dgd.get("status")
    if not isinstance(status, Mapping):
        return set()
    names: set[str] = set()
    for key in ("services", "components"):  # v1alpha1, v1beta1
        entries = status.get(key)
        if isinstance(entries, Mapping):
            names |= {str(name).lower() for name in entries}
    return names


def dynamo_reconciler_claim(dgd: Mapping[str, Any], *, leader_service: str) -> str | None:
    """Why Dynamo's elastic-EP reconciler drives ``leader_service`` of ``dgd``, or None.

    It does when the leader is an elastic-EP Ray launch and the DGD carries the operator's
    synthesized follower ``<leader>-flw`` (in ``spec.services`` or ``status.services``).
    """
    try:
        services = dgd_services(dgd, leader_service)
    except DeploymentError:
        return None
    leader = services.get(leader_service)
    if not isinstance(leader, Mapping) or not is_elastic_ep_ray_launch(leader):
        return None
    follower = (leader_service + DYNAMO_FOLLOWER_SUFFIX).lower()
    spec_names = {str(name).lower() for name in services}
    if follower not in spec_names | _status_names(dgd):
        return None
    return (
        f"service {leader_service} is an elastic-EP Ray launch ({ELASTIC_EP_FLAG}, Ray DP "
        f"backend) with Dynamo's operator-synthesized follower {follower}: Dynamo's elastic-EP "
        "reconciler (ElasticEPAutoscale) sets its DP size from that follower; the planner does "
        "not drive it too. Turn the operator's gate off and declare a follower service "
        "(elastic_ep_follower_service), or leave this engine to Dynamo"
    )
