"""Elastic expert parallelism: resize a running vLLM engine's data-parallel group.

One module per piece:

- :mod:`.admin_client`: :class:`ElasticEpAdmin`, what a resize route's client does, and
  :class:`VllmElasticEpAdmin`, vLLM's API server (``/scale_elastic_ep``,
  ``/is_scaling_elastic_ep``);
- :mod:`.dynamo_admin`: :class:`DynamoElasticEpAdmin`, Dynamo's vLLM worker
  (``/engine/control/scale_elastic_ep``, ``/engine/control/ep_capacity``);
- :mod:`.join_probe`: :class:`JoinProbe`, whether new GPUs joined the engine's Ray cluster,
  and :class:`RayDashboardJoinProbe`, read from the Ray dashboard;
- :mod:`.routes`: the routes' paths, the HTTP calls the clients share, :func:`detect_api`;
- :mod:`.coexistence`: :func:`dynamo_reconciler_claim`, whether Dynamo's own elastic-EP
  reconciler drives a DGD's engine (then the planner must not);
- :mod:`.followers`: :class:`ElasticEpKubernetes`, the DGD connector plus the follower pods
  that bring the new ranks' GPUs on Kubernetes;
- :mod:`.progress`: :class:`ResizeRecord`, the progress of a resize kept on the deployment
  (the DGD annotation ``planner.nvidia.com/elastic-ep-resize``), and :class:`FollowerPool`,
  what the controller needs of the follower side;
- :mod:`.controller`: :class:`ElasticEpController`, single-flight resizes of one engine
  (grow: followers first; shrink: engine first; recovery of an unfinished resize);
- :mod:`.resize`: :class:`ElasticEpSettings`, what the controller reads, and
  :class:`ResizeResult`, what a resize did;
- :mod:`.errors`: the typed errors of a resize.
"""

from __future__ import annotations

from disagg_planner.connectors.elastic_ep.admin_client import (
    ElasticEpAdmin,
    MeasuredResize,
    VllmElasticEpAdmin,
)
from disagg_planner.connectors.elastic_ep.coexistence import (
    CLAIM_REASON,
    DYNAMO_FOLLOWER_SUFFIX,
    dynamo_reconciler_claim,
)
from disagg_planner.connectors.elastic_ep.controller import ElasticEpController
from disagg_planner.connectors.elastic_ep.dynamo_admin import DynamoElasticEpAdmin
from disagg_planner.connectors.elastic_ep.errors import (
    DrainTimeout,
    ElasticEpError,
    FollowersNotEmpty,
    FollowersNotReady,
    GrowFailed,
    PartialReconfiguration,
    ResizeBackingOff,
    ResizeInFlight,
    ResizeOutcomeUnknown,
    ResizeRefused,
)
from disagg_planner.connectors.elastic_ep.followers import (
    ElasticEpKubernetes,
    ElasticEpKubernetesSettings,
)
from disagg_planner.connectors.elastic_ep.join_probe import JoinProbe, RayDashboardJoinProbe
from disagg_planner.connectors.elastic_ep.progress import (
    RECORD_ANNOTATION,
    ElasticFollowers,
    FollowerObservation,
    FollowerPool,
    ResizePhase,
    ResizeRecord,
)
from disagg_planner.connectors.elastic_ep.resize import (
    ElasticEpSettings,
    ResizeOutcome,
    ResizeResult,
)
from disagg_planner.connectors.elastic_ep.routes import detect_api

__all__ = [
    "CLAIM_REASON",
    "DYNAMO_FOLLOWER_SUFFIX",
    "RECORD_ANNOTATION",
    "DrainTimeout",
    "DynamoElasticEpAdmin",
    "ElasticEpAdmin",
    "ElasticEpController",
    "ElasticEpError",
    "ElasticEpKubernetes",
    "ElasticEpKubernetesSettings",
    "ElasticEpSettings",
    "ElasticFollowers",
    "FollowerObservation",
    "FollowerPool",
    "FollowersNotEmpty",
    "FollowersNotReady",
    "GrowFailed",
    "JoinProbe",
    "MeasuredResize",
    "PartialReconfiguration",
    "RayDashboardJoinProbe",
    "ResizeBackingOff",
    "ResizeInFlight",
    "ResizeOutcome",
    "ResizeOutcomeUnknown",
    "ResizePhase",
    "ResizeRecord",
    "ResizeRefused",
    "ResizeResult",
    "VllmElasticEpAdmin",
    "detect_api",
    "dynamo_reconciler_claim",
]
