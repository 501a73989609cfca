"""The typed errors of an elastic-EP resize: each says what state the engine is left in."""

from __future__ import annotations

from disagg_planner.errors import ConnectorError


class ElasticEpError(ConnectorError):
    """A resize did not happen as asked; the message says what state the engine is in."""


class ResizeRefused(ElasticEpError):
    """The engine refused or failed the resize before reconfiguring anything (vLLM: 400 or a
    500 on a resize that never reached the engines; Dynamo: ``"status": "error"``): it keeps
    its old size."""

    def __init__(self, message: str, *, status: int, detail: str) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail


class DrainTimeout(ElasticEpError):
    """vLLM answered 408 while draining (only with ``VLLM_ELASTIC_EP_DRAIN_REQUESTS``, before
    anything was reconfigured): the engine keeps its old size."""


class PartialReconfiguration(ElasticEpError):
    """The engine may be half reconfigured: vLLM answered 408 after the running engines were
    told to reconfigure (the new engines never started), or refused a resize because an
    earlier prepare/commit left a reconfiguration active. The followers are left in place and
    the record stays; the engine needs a restart before it resizes again."""


class ResizeInFlight(ElasticEpError):
    """The engine is resizing (someone else's resize) and did not finish in time."""


class ResizeOutcomeUnknown(ElasticEpError):
    """No answer to a resize and the engine never reported it finished; the record stays."""


class FollowersNotReady(ElasticEpError):
    """The follower pods a grow needs were not ready, or their GPUs had not joined the
    engine's Ray cluster, in time; they were lowered again."""


class NoAnswer(Exception):
    """The resize call timed out or lost its connection: the outcome is unknown.

    Internal to this package (the admin clients raise it, the controller follows the resize
    through); callers see :class:`ResizeOutcomeUnknown` instead.
    """
