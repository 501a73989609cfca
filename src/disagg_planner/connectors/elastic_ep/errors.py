"""The typed errors of an elastic-EP resize: each says what state the engine is left in."""

from __future__ import annotations

from disagg_planner.errors import ConnectorError


class ElasticEpError(ConnectorError):
    """A resize did not happen as asked; the message says what state the engine is in."""


class ResizeRefused(ElasticEpError):
    """The engine refused or failed the resize before reconfiguring anything (vLLM: 400 or a
    500 on a resize that never reached the engines; Dynamo: ``"status": "error"``): it keeps
    its old size. ``minimum_dp`` is the engine's shrink floor when its answer named one
    (vLLM's "Cannot scale to data_parallel_size N, minimum is M")."""

    def __init__(
        self, message: str, *, status: int, detail: str, minimum_dp: int | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail
        self.minimum_dp = minimum_dp


class DrainTimeout(ElasticEpError):
    """vLLM answered 408 and is back to phase "idle" (current vLLM: the drain, only with
    ``VLLM_ELASTIC_EP_DRAIN_REQUESTS``, reset its scaling flag) or answered it within the
    drain window (vLLM 0.17.0): the engine keeps its old size."""


class PartialReconfiguration(ElasticEpError):
    """The engine may be half reconfigured: current vLLM still reports phase "committing"
    after a 408/500 (its commit failed part-way), vLLM 0.17.0 answered 408 after the running
    engines were told to reconfigure, a Dynamo worker said its failure is not recoverable,
    or refused a resize because an earlier prepare/commit left a reconfiguration active.
    The followers are left in place and the record stays; the engine needs a restart before
    it resizes again."""


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


class GrowFailed(ResizeRefused):
    """A grow failed and the engine is back at its old size: a Dynamo worker restarted
    itself without answering (fail-fast) and came back with the old size, or its rollback
    variant said so. The followers were lowered again; the next grow of this engine waits
    for the back-off recorded on the deployment."""


class ResizeBackingOff(ElasticEpError):
    """A grow is refused until the back-off after earlier failed grows has passed."""


class FollowersNotEmpty(ElasticEpError):
    """After a shrink, the follower pods to remove could not be shown to host no rank; the
    follower count was left as it is (the engine is already at the smaller size)."""


class ConnectionLost(NoAnswer):
    """The connection dropped before an answer (not a timeout): on Dynamo's worker, the
    process exiting on a failed resize (fail-fast) looks like this. Internal, as NoAnswer."""
