"""Elastic expert parallelism: resize a running vLLM engine's data-parallel group.

One module per piece:

- :mod:`.admin_client`: :class:`VllmElasticEpAdmin`, a client of vLLM's admin API
  (``/scale_elastic_ep``, ``/is_scaling_elastic_ep``) on the engine's API server;
- :mod:`.followers`: :class:`ElasticEpKubernetes`, the DGD connector plus the follower pods
  that bring the new ranks' GPUs on Kubernetes;
- :mod:`.progress`: :class:`ResizeRecord`, the progress of a resize kept on the deployment
  (the DGD annotation ``planner.nvidia.com/elastic-ep-resize``), and :class:`FollowerPool`,
  what the controller needs of the follower side;
- :mod:`.controller`: :class:`ElasticEpController`, single-flight resizes of one engine
  (grow: followers first; shrink: engine first; recovery of an unfinished resize);
- :mod:`.errors`: the typed errors of a resize.
"""

from __future__ import annotations

from disagg_planner.connectors.elastic_ep.admin_client import VllmElasticEpAdmin
from disagg_planner.connectors.elastic_ep.controller import (
    ElasticEpController,
    ElasticEpSettings,
    ResizeOutcome,
    ResizeResult,
)
from disagg_planner.connectors.elastic_ep.errors import (
    DrainTimeout,
    ElasticEpError,
    FollowersNotReady,
    ResizeInFlight,
    ResizeOutcomeUnknown,
    ResizeRefused,
)
from disagg_planner.connectors.elastic_ep.followers import (
    ElasticEpKubernetes,
    ElasticEpKubernetesSettings,
)
from disagg_planner.connectors.elastic_ep.progress import (
    RECORD_ANNOTATION,
    FollowerObservation,
    FollowerPool,
    ResizePhase,
    ResizeRecord,
)

__all__ = [
    "RECORD_ANNOTATION",
    "DrainTimeout",
    "ElasticEpController",
    "ElasticEpError",
    "ElasticEpKubernetes",
    "ElasticEpKubernetesSettings",
    "ElasticEpSettings",
    "FollowerObservation",
    "FollowerPool",
    "FollowersNotReady",
    "ResizeInFlight",
    "ResizeOutcome",
    "ResizeOutcomeUnknown",
    "ResizePhase",
    "ResizeRecord",
    "ResizeRefused",
    "ResizeResult",
    "VllmElasticEpAdmin",
]
