"""The Kubernetes API calls the controller makes: (verb, API group, resource).

This is the list the Helm chart's RBAC must grant, no more and no less. It is written out
here (the operator issue's closing list) and checked three ways: against the tables in the
docstrings of ``disagg_planner.connectors.kubernetes`` and ``disagg_planner.operator.app``
(test_api_calls.py),
against the rules the chart renders (test_chart.py), and against the requests the operator
process really sends in the live end-to-end test (tests/e2e).
"""

from __future__ import annotations

from typing import Any

Call = tuple[str, str, str]  # verb, API group ("" = core), resource[/subresource]

POLICY_GROUP = "planner.autoscaling.dev"

# src/disagg_planner/connectors/kubernetes/: the DGD, its scaling adapters (read through
# watch caches, GET before they are synced), its pods (the
# engines still terminating, before an increase; the ones that leave, marked with their
# deletion cost, before a decrease), Events about manual edits, the DRA claim templates a
# service's GPUs are declared in (issue 35).
CONNECTOR_CALLS: frozenset[Call] = frozenset(
    {
        ("get", "nvidia.com", "dynamographdeployments"),
        ("list", "nvidia.com", "dynamographdeployments"),
        ("watch", "nvidia.com", "dynamographdeployments"),
        ("patch", "nvidia.com", "dynamographdeployments"),
        ("get", "nvidia.com", "dynamographdeploymentscalingadapters"),
        ("list", "nvidia.com", "dynamographdeploymentscalingadapters"),
        ("watch", "nvidia.com", "dynamographdeploymentscalingadapters"),
        ("patch", "nvidia.com", "dynamographdeploymentscalingadapters/scale"),
        ("get", "resource.k8s.io", "resourceclaimtemplates"),
        ("list", "", "pods"),
        ("patch", "", "pods"),
        ("create", "", "events"),
    }
)

# src/disagg_planner/observe/fpm_discovery.py: Dynamo's Kubernetes discovery of the engines'
# FPM publishers (the workers' pods and their DynamoWorkerMetadata), followed by watches.
DISCOVERY_CALLS: frozenset[Call] = frozenset(
    {
        ("list", "", "pods"),
        ("watch", "", "pods"),
        ("list", "nvidia.com", "dynamoworkermetadatas"),
        ("watch", "nvidia.com", "dynamoworkermetadatas"),
    }
)

# src/disagg_planner/operator/app.py: kopf's watch of the policies, its finalizer and annotations,
# the status writer, kopf's warnings as Events.
POLICY_CALLS: frozenset[Call] = frozenset(
    {
        ("list", POLICY_GROUP, "plannerpolicies"),
        ("watch", POLICY_GROUP, "plannerpolicies"),
        ("patch", POLICY_GROUP, "plannerpolicies"),
        ("patch", POLICY_GROUP, "plannerpolicies/status"),
        # src/disagg_planner/operator/pool.py: kopf's timer on the pools, their status
        ("list", POLICY_GROUP, "plannerpools"),
        ("watch", POLICY_GROUP, "plannerpools"),
        ("patch", POLICY_GROUP, "plannerpools"),
        ("patch", POLICY_GROUP, "plannerpools/status"),
        ("create", "", "events"),
    }
)


def peering_calls(*, cluster_wide: bool) -> frozenset[Call]:
    """kopf's leader election: it watches and patches one existing peering object."""
    resource = "clusterkopfpeerings" if cluster_wide else "kopfpeerings"
    return frozenset((verb, "kopf.dev", resource) for verb in ("list", "watch", "patch"))


# Only with namespace globs (``--watch-namespace 'team-*'``): kopf's scanning lists and
# watches the namespaces to match, and the CRDs (kopf's resource observer runs whenever
# scanning is on). Without the CRD permission kopf only logs a warning, but it is a call
# the process makes, so the chart grants it in that mode.
SCANNING_CALLS: frozenset[Call] = frozenset(
    {
        ("list", "", "namespaces"),
        ("watch", "", "namespaces"),
        ("list", "apiextensions.k8s.io", "customresourcedefinitions"),
        ("watch", "apiextensions.k8s.io", "customresourcedefinitions"),
    }
)


def expected_calls(*, cluster_wide: bool, peering: bool, globs: bool) -> frozenset[Call]:
    """Every call of one operator configuration."""
    calls = set(CONNECTOR_CALLS | DISCOVERY_CALLS | POLICY_CALLS)
    if peering:
        calls |= peering_calls(cluster_wide=cluster_wide)
    if globs and not cluster_wide:
        calls |= SCANNING_CALLS
    return frozenset(calls)


# The e2e test's operator: one namespace by name, --standalone.
OPERATOR_CALLS = expected_calls(cluster_wide=False, peering=False, globs=False)

_VERBS = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}


def request_call(request: dict[str, Any]) -> Call | None:
    """The RBAC call of one logged request (tests/e2e/kmock_server.py's request log); None
    for discovery (``/api``, ``/apis/<group>/<version>``), which needs no RBAC rule."""
    plural = request.get("plural")
    if not plural:
        return None
    method = request["method"]
    if method == "GET":
        verb = "watch" if request.get("watch") else "get" if request.get("name") else "list"
    else:
        verb = _VERBS.get(method, method.lower())
    resource = f"{plural}/{request['subresource']}" if request.get("subresource") else plural
    return verb, request.get("group") or "", resource
