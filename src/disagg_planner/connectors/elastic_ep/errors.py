"""The typed errors of an elastic-EP resize: each says what state the engine is left in."""

from __future__ import annotations

from disagg_planner.errors import ConnectorError


class ElasticEpError(ConnectorError):
    """A resize did not happen as asked; the message says what state the engine is in."""


class ResizeRefused(ElasticEpError):
    """The engine answered 400 or 500: it did not resize and keeps its old size."""

    def __init__(self, message: str, *, status: int, detail: str) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail


class DrainTimeout(ElasticEpError):
    """The engine answered 408: in-flight requests did not drain within ``drain_timeout``;
    the engine keeps its old size."""


class ResizeInFlight(ElasticEpError):
    """The engine is resizing (someone else's resize) and did not finish in time."""


class ResizeOutcomeUnknown(ElasticEpError):
    """No answer to a resize and the engine never reported it finished; the record stays."""


class FollowersNotReady(ElasticEpError):
    """The follower pods a grow needs were not ready in time; they were lowered again."""


class NoAnswer(Exception):
    """The resize call timed out or lost its connection: the outcome is unknown.

    Internal to this package (the admin client raises it, the controller follows the resize
    through); callers see :class:`ResizeOutcomeUnknown` instead.
    """
