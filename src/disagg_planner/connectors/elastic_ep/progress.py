"""The progress of a resize as the deployment keeps it, and what the controller reads there.

The record is the DGD annotation ``planner.nvidia.com/elastic-ep-resize``, a condition-like
JSON object; a restarted controller finds an unfinished resize in it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from disagg_planner.errors import DeploymentError

RECORD_ANNOTATION = "planner.nvidia.com/elastic-ep-resize"
RECORD_TYPE = "ElasticEpResizing"
# The condition of the last failed grows and the back-off they set (issue 32, item 4).
BACKOFF_ANNOTATION = "planner.nvidia.com/elastic-ep-grow-failed"
BACKOFF_TYPE = "ElasticEpGrowFailed"


class ResizePhase(StrEnum):
    """Where a resize stands (the record's ``reason``)."""

    ADDING_FOLLOWERS = "AddingFollowers"
    RESIZING = "Resizing"
    REMOVING_FOLLOWERS = "RemovingFollowers"


@dataclass(frozen=True)
class ResizeRecord:
    """The progress of one resize, kept where a restarted controller finds it.

    Times are wall-clock epoch seconds; ``deadline_s`` is when followers being added must be
    ready.
    """

    phase: ResizePhase
    from_dp: int
    to_dp: int
    from_followers: int
    to_followers: int
    started_s: float
    deadline_s: float
    message: str = ""
    called_s: float | None = None  # when the resize call was made (epoch s)
    leader_restarts: int | None = None  # the leader pods' restarts then

    @property
    def grow(self) -> bool:
        return self.to_dp > self.from_dp

    def to_json(self) -> str:
        return json.dumps(
            {
                "type": RECORD_TYPE,
                "status": "True",
                "reason": self.phase.value,
                "message": self.message,
                "fromDp": self.from_dp,
                "toDp": self.to_dp,
                "fromFollowers": self.from_followers,
                "toFollowers": self.to_followers,
                "startedAt": self.started_s,
                "deadline": self.deadline_s,
                "calledAt": self.called_s,
                "leaderRestarts": self.leader_restarts,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str, *, where: str) -> ResizeRecord:
        """Parse a record; DeploymentError naming ``where`` and the bad key otherwise."""
        raw = _json_mapping(text, where)
        try:
            phase = ResizePhase(str(raw.get("reason")))
        except ValueError:
            known = ", ".join(p.value for p in ResizePhase)
            raise DeploymentError(
                f"{where}: reason = {raw.get('reason')!r}, expected one of {known}"
            ) from None
        ints: dict[str, int] = {}
        for key in ("fromDp", "toDp", "fromFollowers", "toFollowers"):
            value = raw.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise DeploymentError(f"{where}: {key} = {value!r}, expected an integer >= 0")
            ints[key] = value
        times: dict[str, float] = {}
        for key in ("startedAt", "deadline"):
            value = raw.get(key)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise DeploymentError(f"{where}: {key} = {value!r}, expected epoch seconds")
            times[key] = float(value)
        return cls(
            phase=phase,
            from_dp=ints["fromDp"],
            to_dp=ints["toDp"],
            from_followers=ints["fromFollowers"],
            to_followers=ints["toFollowers"],
            started_s=times["startedAt"],
            deadline_s=times["deadline"],
            message=str(raw.get("message") or ""),
            called_s=_optional_number(raw, "calledAt", where),
            leader_restarts=_optional_count(raw, "leaderRestarts", where),
        )


def _json_mapping(text: str, where: str) -> Mapping[str, object]:
    """A JSON object from an annotation; DeploymentError naming ``where`` otherwise."""
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise DeploymentError(f"{where}: not JSON ({exc}): {text[:200]!r}") from None
    if not isinstance(raw, Mapping):
        raise DeploymentError(f"{where}: expected a JSON object, got {text[:200]!r}")
    return raw


def _optional_number(raw: Mapping[str, object], key: str, where: str) -> float | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DeploymentError(f"{where}: {key} = {value!r}, expected epoch seconds or null")
    return float(value)


def _optional_count(raw: Mapping[str, object], key: str, where: str) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DeploymentError(f"{where}: {key} = {value!r}, expected an integer >= 0 or null")
    return value


@dataclass(frozen=True)
class GrowBackoff:
    """Failed grows of one engine and when the next may start, kept on the deployment as a
    condition-like object (``reason`` says what failed) so a restarted planner waits too."""

    failures: int
    not_before_s: float  # epoch s
    to_dp: int
    reason: str  # e.g. "WorkerRestarted", "Refused"
    message: str
    at_s: float  # the last failure (epoch s)

    def to_json(self) -> str:
        return json.dumps(
            {
                "type": BACKOFF_TYPE,
                "status": "True",
                "reason": self.reason,
                "message": self.message,
                "lastTransitionTime": self.at_s,
                "failures": self.failures,
                "notBefore": self.not_before_s,
                "toDp": self.to_dp,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str, *, where: str) -> GrowBackoff:
        raw = _json_mapping(text, where)
        failures = _optional_count(raw, "failures", where)
        to_dp = _optional_count(raw, "toDp", where)
        not_before = _optional_number(raw, "notBefore", where)
        at = _optional_number(raw, "lastTransitionTime", where)
        if failures is None or to_dp is None or not_before is None or at is None:
            raise DeploymentError(
                f"{where}: failures, toDp, notBefore and lastTransitionTime are required"
            )
        return cls(
            failures=failures,
            not_before_s=not_before,
            to_dp=to_dp,
            reason=str(raw.get("reason") or ""),
            message=str(raw.get("message") or ""),
            at_s=at,
        )


@dataclass(frozen=True)
class FollowerObservation:
    """The follower service as the deployment reports it, and the resize record if any."""

    desired: int
    ready: int
    record: ResizeRecord | None
    backoff: GrowBackoff | None = None


class FollowerPool(Protocol):
    """Where the follower pods and the resize record live (a DGD, or a test double)."""

    async def observe_followers(self) -> FollowerObservation: ...

    async def set_followers(self, replicas: int) -> None: ...

    async def write_record(self, record: ResizeRecord | None) -> None: ...

    async def write_backoff(self, backoff: GrowBackoff | None) -> None:
        """Keep (None: clear) the failed grows' condition; a new one is also an Event."""
        ...

    async def leader_restarts(self) -> int | None:
        """How often the engine's leader pods restarted (None: not known)."""
        ...

    async def retire_followers(
        self, count: int, *, empty_ips: frozenset[str] | None, empty_nodes: int
    ) -> list[str]:
        """Choose the ``count`` follower pods that leave and mark them so Kubernetes removes
        those (deletion cost), after showing they host no rank (``empty_ips``: the nodes'
        addresses without an engine, where known; ``empty_nodes``: how many there are);
        FollowersNotEmpty otherwise. Returns their names."""
        ...


class ElasticFollowers(FollowerPool, Protocol):
    """The follower pods of an elastic-EP engine whose connector raises them before a grow
    (:meth:`disagg_planner.connectors.base.Connector.elastic_followers`), on a deployment
    Dynamo's own elastic-EP reconciler may drive instead."""

    async def reconciler_claim(self, role: str) -> str | None:
        """Why Dynamo's reconciler drives ``role``'s engine, or None when it does not."""
        ...
