"""Kubernetes connector: the replicas of a DynamoGraphDeployment (DGD), changed the way the
Dynamo operator expects.

Model of the deployment (the pure rules over the object are in
:mod:`disagg_planner.connectors.dgd_shape`):

- Version: Dynamo serves ``nvidia.com/v1alpha1`` (``spec.services``, a map) and ``v1beta1``
  (``spec.components``, a list of ``{name, type, replicas, podTemplate}``), converting
  between them. The connector asks the API server's discovery which versions it serves (two
  GETs, once); the only one served is used, else the one the DGD was written in (its first
  spec writer's ``managedFields`` entry), else v1beta1. The DGD, its adapters, the watch
  caches and the Events all use that version. Below, "service" is a v1alpha1 service or a
  v1beta1 component alike.
- A role resolves to the one service whose ``subComponentType`` is the role's (``prefill``;
  ``decode`` for both ``decode`` and ``agg``), a component type ``prefill``/``decode``
  counting as one (v1beta1 has no ``subComponentType``). Only when no service has it does the
  backend's legacy name (``VllmPrefillWorker`` ...) apply, and only to a service without
  one. Two services with the same ``subComponentType`` are an error.
- GPUs per replica: the config value when given, else the service's limits, else its
  requests: ``resources.*.gpu`` (v1alpha1), the ``nvidia.com/gpu`` of the container named
  ``main`` in ``podTemplate`` (v1beta1); without those, the GPU-class devices its DRA claims
  allocate (``resources.claims`` -> the pod's ``resourceClaims`` -> each
  ResourceClaimTemplate's device requests, read once); times ``multinode.nodeCount`` (the
  pods of one replica).
- Desired replicas: ``spec.replicas`` of the service's DynamoGraphDeploymentScalingAdapter
  (DGDSA, named ``{dgd}-{service lower case}``) when it exists (the adapter controller then
  owns the DGD's field), else the service's ``replicas``. Ready replicas:
  ``status.services.<name>`` (v1alpha1) or ``status.components.<name>`` (v1beta1)
  ``availableReplicas``, else ``readyReplicas``.
- Writes: the DGDSA ``/scale`` subresource when the adapter exists, else one patch for all
  roles without an adapter that touches nothing else: v1alpha1, a JSON merge patch
  ``{"spec": {"services": {<name>: {"replicas": n}}}}``; v1beta1, a JSON patch (a merge
  patch would replace the whole components list) that tests each component's ``name`` at
  the index read and adds its ``replicas``.
- Budget-safe order: when a change lowers some roles and raises others, the decreases are
  written first, and the increases only once no role runs more engines than it is asked for,
  counting the pods still terminating (the pods of a service carry Dynamo's labels
  ``nvidia.com/dynamo-graph-deployment-name`` and ``nvidia.com/dynamo-component``; the DGD's
  status counts only non-terminated replicas). So the engines x GPUs in use never exceed
  what the old or the new targets add up to, both within the budget. When the lowered roles
  have not let go within one adjustment interval (``override_hold_s``; at most
  ``scaling_max_wait_s``), the increases are not written and the call fails
  (:class:`ConnectorError`; the next tick plans again).

Graceful scale-down: before a role's replicas are lowered, the connector chooses the pods that
leave and marks them so that Kubernetes removes those and no others. It lists the service's
pods (not terminating) and ranks them the way a ReplicaSet ranks pods for deletion, with the
load the planner knows: pods not ready first (they serve nothing, and a ReplicaSet removes
them first whatever their cost), then ready pods by the requests in flight on their engines
(scheduled and queued, from each engine's latest ForwardPassMetrics; the runtime hands the
connector that reading, :meth:`KubernetesConnector.use_worker_loads`), least first, then the
pods whose load is unknown. Each chosen pod gets the annotation
``controller.kubernetes.io/pod-deletion-cost`` at the lowest value (a ReplicaSet deletes the
pods of lowest cost first) and ``planner.autoscaling.dev/draining-since`` (when, UTC); a pod
marked earlier that no longer leaves has both removed. The order then depends on the
worker. Dynamo's current worker enters a staged shutdown on SIGTERM and only then reports it
on its own metrics page (at the pod IP and the container's literal ``DYN_SYSTEM_PORT``:
:mod:`disagg_planner.signals.shutdown`). A chosen ready pod whose page carries the
``dynamo_component_shutdown_*`` gauges (not yet a stage), or whose container declares the
total budget by its current name, has its count lowered FIRST (the decreases; an increase
of the same request waits, held, for the GPUs to be released); the connector then follows
the pods the operator made terminating (the marked ones, or, where its controller ignores the
deletion cost, as Grove's PodClique does, the ones it removed instead, logged) until each
reports no request in flight and KV transfers quiescent (``kv_quiescent``), a stage past
serving (``shutdown_stage``), no request in flight with KV quiescence unknown
(``shutdown_inflight_zero``), its pod gone (``pod_gone``), or its own total budget spent
(``worker_budget``: declared ``DYN_WORKER_SHUTDOWN_TOTAL_TIMEOUT_SECS``, else the legacy
``DYN_WORKER_GRACEFUL_SHUTDOWN_TIMEOUT``, else 30 s, from the lowering; or the page's
``remaining_seconds``), at most ``drain_timeout_s``. Its GPUs count (terminating pods) until
its pod is gone. Any other worker keeps the older order: the chosen ready pods are given time
to finish what they serve, the count dropping once each reports no request in flight by its
FPM (``fpm_idle``), or when ``drain_timeout_s`` has passed (0: no wait), with a log line
saying which way it ended; its page's reason for not being used is logged once. Dynamo has no
drain call of its own (a worker drain admin API is proposed upstream, not released): on
SIGTERM a worker leaves discovery, so that no new request reaches it, and serves what it holds
within its staged shutdown's one total budget (router grace, requests in flight, KV-transfer
quiescence, cleanup; older releases: a grace period,
``DYN_GRACEFUL_SHUTDOWN_GRACE_PERIOD_SECS``, 5 s) before the rest is cancelled (Dynamo issue
13559). Choosing an idle worker is what keeps that cancellation empty.

State that survives restarts: the annotation ``planner.autoscaling.dev/state`` on the DGD
holds JSON with what the planner set per role (``set``), a write whose outcome is unknown
(``pending``), the last change (``lastActionAt``, Unix s, and ``waitingFor``) and the
manual-edit holds (``holds``: reason and end, Unix s), and the DGD's ``uid``. It travels in
the replicas merge patch itself; with a scaling adapter it is written before the ``/scale``
call. A connector reads it back when it first reads the DGD (a restarted or failed-over
planner): its predecessor's values are its own (not manual edits; an edit made while no
planner ran is one), the holds run on until their end, and while the last change has not
converged (a role with fewer ready replicas than desired) and is younger than
``convergence_timeout_s`` every role is held (``awaiting_convergence``). A state of another
uid, or one that cannot be read, is ignored with a log line. Advisory mode writes none.

A manual edit is a desired count that differs from what this planner last set (or first saw)
and is not a write of its own that merely reported failure. A DGD with another
``metadata.uid`` than the one read before is a new deployment (deleted and applied again):
its counts are the new baseline, with no Event, and the holds and unsettled writes of the
old one are forgotten. Policy ``respect`` adopts the
new value and holds the role for one adjustment interval; ``revert`` writes the planner's
value back. Both record a Kubernetes Event on the DGD. With ``advisory`` the connector
never writes replicas (``revert`` then behaves as ``respect``).

Reads: with watch caches (:mod:`.cache`; the operator uses them, ``planner run`` polls its
one DGD) the DGD and its adapters are read from one list-and-watch per namespace and resource,
shared by every deployment of the process; a GET only while the cache is not synced, or until
it shows this connector's own last write. Writes are made only when something changes.

API errors: 409, 429, 5xx and connection failures are retried with exponential backoff
(a 429's ``Retry-After`` first), then reported as :class:`ConnectorError`; 404 of the DGD is a
:class:`DeploymentError`; 401/403 and other 4xx are :class:`ConnectorError` at once (403 names
the missing permission). The sync ``kubernetes`` client runs in worker threads.

Kubernetes API calls this connector makes (the Helm chart's RBAC; all namespaced; plus the
discovery GETs of ``/apis/nvidia.com/v1alpha1`` and ``/v1beta1``, which every authenticated
user may make, Kubernetes' ``system:discovery`` role):

========  ================  =============================================  =====================
verb      API group         resource                                       when
========  ================  =============================================  =====================
get       nvidia.com        dynamographdeployments                         a read the watch cache
                                                                           cannot serve, wait
list      nvidia.com        dynamographdeployments                         the watch cache
watch     nvidia.com        dynamographdeployments                         ... as DGDs change
patch     nvidia.com        dynamographdeployments                         scale without adapter,
                                                                           revert a manual edit
get       nvidia.com        dynamographdeploymentscalingadapters           a read the watch cache
                                                                           cannot serve (404: none)
list      nvidia.com        dynamographdeploymentscalingadapters           the watch cache
watch     nvidia.com        dynamographdeploymentscalingadapters           ... as adapters change
patch     nvidia.com        dynamographdeploymentscalingadapters/scale     scale with an adapter
get       resource.k8s.io   resourceclaimtemplates                         GPUs declared as DRA
                                                                           claims (once each)
list      "" (core v1)      pods                                           before an increase,
                                                                           before a decrease
patch     "" (core v1)      pods                                           mark the pods that
                                                                           leave (decrease)
create    "" (core v1)      events                                         manual edit detected
========  ================  =============================================  =====================
"""

from disagg_planner.connectors.kubernetes.api import (
    API_WORKER_THREADS,
    DGD_POD_LABEL,
    SERVICE_ACCOUNT_NAMESPACE,
    SERVICE_POD_LABEL,
    DgdApi,
    default_api_client,
    planner_api_client,
)
from disagg_planner.connectors.kubernetes.connector import (
    KubernetesConnector,
    KubernetesSettings,
)
from disagg_planner.connectors.kubernetes.drain import (
    DRAINING_ANNOTATION,
    LEAVING_COST,
    POD_DELETION_COST,
)
from disagg_planner.connectors.kubernetes.state import STATE_ANNOTATION

__all__ = [
    "API_WORKER_THREADS",
    "DGD_POD_LABEL",
    "DRAINING_ANNOTATION",
    "LEAVING_COST",
    "POD_DELETION_COST",
    "SERVICE_ACCOUNT_NAMESPACE",
    "SERVICE_POD_LABEL",
    "STATE_ANNOTATION",
    "DgdApi",
    "KubernetesConnector",
    "KubernetesSettings",
    "default_api_client",
    "planner_api_client",
]
