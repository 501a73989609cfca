"""The terms of a resize: what the controller reads (:class:`ElasticEpSettings`) and what a
resize, or a recovery, did (:class:`ResizeResult`)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ResizeOutcome(StrEnum):
    RESIZED = "resized"
    UNCHANGED = "unchanged"
    ROLLED_BACK = "rolled_back"


@dataclass(frozen=True)
class ResizeResult:
    """What a resize (or a recovery) did; ``dp`` is the engine's size afterwards.

    ``followers_ready_s`` is how long added followers took from the raise until their GPUs
    had joined (a grow of this controller's, else None); ``resize_s`` how long the resize
    call took (None when none was made): the measurements the policy's lead time learns."""

    outcome: ResizeOutcome
    from_dp: int
    to_dp: int
    dp: int
    message: str
    followers_ready_s: float | None = None
    resize_s: float | None = None
    pause_s: float | None = None  # how long the engine paused serving (None: not measured)


@dataclass(frozen=True, kw_only=True)
class ElasticEpSettings:
    """What the controller reads, built by the application from its config
    (:func:`disagg_planner.runtime.connector_settings.elastic_ep_settings`); the config's
    names are in the error messages, since that is where a user changes them."""

    min_dp: int  # elastic_ep_min_dp: the engine's size without followers
    max_dp: int  # elastic_ep_max_dp
    dp_step: int  # elastic_ep_dp_step: ranks per follower
    resize_timeout_s: float  # elastic_ep_resize_timeout_seconds: one resize call, or a wait
    scaling_max_wait_s: float  # scaling_max_wait_seconds: until added followers are ready
    scaling_check_interval_s: float  # scaling_check_interval_seconds: polling the followers
    gpus_per_rank: int = 1  # elastic_ep_gpus_per_rank: GPUs that must join per rank
    grow_backoff_s: float = 300.0  # elastic_ep_grow_backoff_seconds: after a failed grow
