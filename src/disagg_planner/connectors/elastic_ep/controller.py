"""Single-flight resizes of one engine:

- grow: record ``AddingFollowers``; raise the followers; wait until they are ready
  (``scaling_max_wait_seconds``, else lower them again); record ``Resizing``; call the
  resize; clear the record;
- shrink: record ``Resizing``; call the resize; record ``RemovingFollowers``; lower the
  followers; clear the record;
- a refused resize (400, 408, 500) rolls the followers back and raises a typed error;
- never two resizes at once: callers queue on a lock, and a resize the engine reports in
  flight (someone else's) is waited for (``elastic_ep_resize_timeout_seconds``);
- a resize call that gets no answer in ``elastic_ep_resize_timeout_seconds`` (or loses its
  connection) is followed through ``/is_scaling_elastic_ep`` and then re-issued once: a
  completed resize makes it a no-op;
- :meth:`ElasticEpController.recover` (called by every resize, and by a restarted
  controller) finishes or rolls back what the record says was in progress: followers not
  ready by the recorded deadline are lowered again; an interrupted resize call is waited
  for and re-issued; an interrupted follower removal is completed. A resize whose outcome
  stays unknown keeps its record (with the reason in ``message``), so nothing is left
  half-done without a record saying so.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from enum import StrEnum

from disagg_planner.connectors.elastic_ep.admin_client import IS_SCALING_PATH, VllmElasticEpAdmin
from disagg_planner.connectors.elastic_ep.errors import (
    DrainTimeout,
    FollowersNotReady,
    NoAnswer,
    ResizeInFlight,
    ResizeOutcomeUnknown,
    ResizeRefused,
)
from disagg_planner.connectors.elastic_ep.progress import FollowerPool, ResizePhase, ResizeRecord

log = logging.getLogger(__name__)

# How often the controller asks /is_scaling_elastic_ep while it waits on a resize (s).
DEFAULT_POLL_S = 5.0
# 503 answers (another resize started between our check and our call) waited out per call.
MAX_BUSY_RETRIES = 3


class ResizeOutcome(StrEnum):
    RESIZED = "resized"
    UNCHANGED = "unchanged"
    ROLLED_BACK = "rolled_back"


@dataclass(frozen=True)
class ResizeResult:
    """What a resize (or a recovery) did; ``dp`` is the engine's size afterwards."""

    outcome: ResizeOutcome
    from_dp: int
    to_dp: int
    dp: int
    message: str


@dataclass(frozen=True, kw_only=True)
class ElasticEpSettings:
    """What the controller reads, built by the application from its config
    (:func:`disagg_planner.runtime.connector_settings.elastic_ep_settings`); the config's
    names are in the error messages, since that is where a user changes them."""

    min_dp: int  # elastic_ep_min_dp: the engine's size without followers
    max_dp: int  # elastic_ep_max_dp
    dp_step: int  # elastic_ep_dp_step: ranks per follower
    drain_timeout_s: int  # elastic_ep_drain_timeout_seconds, sent to vLLM
    resize_timeout_s: float  # elastic_ep_resize_timeout_seconds: one resize call, or a wait
    scaling_max_wait_s: float  # scaling_max_wait_seconds: until added followers are ready
    scaling_check_interval_s: float  # scaling_check_interval_seconds: polling the followers


class ElasticEpController:
    """Single-flight resizes of one engine (see the module doc).

    ``followers`` (a :class:`FollowerPool`, e.g. :class:`ElasticEpKubernetes`) enables the
    two-stage flow; without it only the engine is resized and ``initial_dp`` (default
    ``settings.min_dp``) is its size at start. ``clock`` (monotonic) bounds waits,
    ``wall_clock`` (epoch) stamps records, ``sleep`` waits; all injectable for tests.
    """

    def __init__(
        self,
        settings: ElasticEpSettings,
        *,
        admin: VllmElasticEpAdmin,
        followers: FollowerPool | None = None,
        initial_dp: int | None = None,
        poll_interval_s: float = DEFAULT_POLL_S,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.settings = settings
        self.admin = admin
        self.followers = followers
        self.min_dp = settings.min_dp
        self.max_dp = settings.max_dp
        self.step = settings.dp_step
        self.poll_interval_s = poll_interval_s
        self._clock = clock
        self._wall = wall_clock
        self._sleep = sleep
        self._lock = asyncio.Lock()
        self._dp = initial_dp if initial_dp is not None else self.min_dp

    # --- state ----------------------------------------------------------------------------

    @property
    def in_flight(self) -> bool:
        """Whether this controller is resizing now."""
        return self._lock.locked()

    def followers_for(self, dp: int) -> int:
        return (dp - self.min_dp) // self.step

    def dp_for(self, followers: int) -> int:
        return self.min_dp + followers * self.step

    async def current_dp(self) -> int:
        """The engine's DP size as far as can be told: from the followers and the record
        (the size before a resize that is not confirmed), else the last resize's."""
        if self.followers is None:
            return self._dp
        obs = await self.followers.observe_followers()
        record = obs.record
        if record is None:
            return self.dp_for(obs.desired)
        return record.to_dp if record.phase is ResizePhase.REMOVING_FOLLOWERS else record.from_dp

    async def is_resizing(self) -> bool:
        """A resize of ours is running, one is recorded unfinished, or the engine says so."""
        if self.in_flight:
            return True
        if self.followers is not None and (await self.followers.observe_followers()).record:
            return True
        return await self.admin.is_scaling()

    # --- resize ---------------------------------------------------------------------------

    def _check_target(self, new_dp: int) -> None:
        if isinstance(new_dp, bool) or not isinstance(new_dp, int):
            raise ValueError(f"new DP size must be an integer, got {new_dp!r}")
        if not self.min_dp <= new_dp <= self.max_dp:
            raise ValueError(
                f"new DP size {new_dp} is outside [{self.min_dp}, {self.max_dp}] "
                "(elastic_ep_min_dp, elastic_ep_max_dp)"
            )
        if self.followers is not None and (new_dp - self.min_dp) % self.step:
            raise ValueError(
                f"new DP size {new_dp} is not elastic_ep_min_dp ({self.min_dp}) plus whole "
                f"followers of elastic_ep_dp_step ({self.step}) ranks"
            )

    async def resize(self, new_dp: int) -> ResizeResult:
        """Resize the engine to ``new_dp`` ranks (see the module doc for the flow).

        Waits for a resize already in flight (ours or the engine's) first. Raises
        :class:`ResizeRefused`, :class:`DrainTimeout`, :class:`FollowersNotReady` (each after
        rolling back), :class:`ResizeInFlight` or :class:`ResizeOutcomeUnknown` (the record
        stays) or ConnectorError/DeploymentError from the backends.
        """
        self._check_target(new_dp)
        async with self._lock:
            await self._recover_locked()
            await self._wait_engine_idle()
            current = await self.current_dp()
            if new_dp == current:
                return ResizeResult(
                    ResizeOutcome.UNCHANGED, current, new_dp, current, f"already at DP {current}"
                )
            if self.followers is None:
                message = await self._scale(new_dp)
                old, self._dp = self._dp, new_dp
                return ResizeResult(ResizeOutcome.RESIZED, old, new_dp, new_dp, message)
            obs = await self.followers.observe_followers()
            now = self._wall()
            record = ResizeRecord(
                phase=(ResizePhase.ADDING_FOLLOWERS if new_dp > current else ResizePhase.RESIZING),
                from_dp=current,
                to_dp=new_dp,
                from_followers=obs.desired,
                to_followers=self.followers_for(new_dp),
                started_s=now,
                deadline_s=now + self.settings.scaling_max_wait_s,
                message=f"DP {current} -> {new_dp}",
            )
            await self.followers.write_record(record)
            log.info("elastic EP: DP %d -> %d started (%s)", current, new_dp, record.phase)
            return await self._continue(record)

    async def recover(self) -> ResizeResult | None:
        """Finish or roll back a resize recorded as unfinished (e.g. by a controller that was
        restarted); None when there was none."""
        async with self._lock:
            return await self._recover_locked()

    async def _recover_locked(self) -> ResizeResult | None:
        if self.followers is None:
            return None
        record = (await self.followers.observe_followers()).record
        if record is None:
            return None
        log.warning(
            "elastic EP: resuming an unfinished resize DP %d -> %d at %s",
            record.from_dp,
            record.to_dp,
            record.phase.value,
        )
        return await self._continue(record)

    async def _continue(self, record: ResizeRecord) -> ResizeResult:
        """Drive ``record`` from its phase to the end (or a rollback)."""
        pool = self.followers
        assert pool is not None
        if record.phase is ResizePhase.ADDING_FOLLOWERS:
            await pool.set_followers(record.to_followers)
            if not await self._wait_followers_ready(record):
                await self._roll_back(record)
                raise FollowersNotReady(
                    f"elastic EP: {record.to_followers} follower pod(s) of DP {record.to_dp} "
                    f"were not ready by the deadline ({self.settings.scaling_max_wait_s:g} s"
                    f" after the start); followers lowered to {record.from_followers}, engine "
                    f"stays at DP {record.from_dp}"
                )
            record = replace(record, phase=ResizePhase.RESIZING)
            await pool.write_record(record)
        if record.phase is ResizePhase.RESIZING:
            try:
                await self._wait_engine_idle()  # e.g. the call a restarted controller made
                message = await self._scale(record.to_dp)
            except (ResizeRefused, DrainTimeout):
                await self._roll_back(record)
                raise
            except ResizeOutcomeUnknown as exc:
                await pool.write_record(replace(record, message=f"outcome unknown: {exc}"))
                raise
            if record.grow:
                await pool.write_record(None)
                self._dp = record.to_dp
                return ResizeResult(
                    ResizeOutcome.RESIZED, record.from_dp, record.to_dp, record.to_dp, message
                )
            record = replace(record, phase=ResizePhase.REMOVING_FOLLOWERS, message=message)
            await pool.write_record(record)
        await pool.set_followers(record.to_followers)
        await pool.write_record(None)
        self._dp = record.to_dp
        return ResizeResult(
            ResizeOutcome.RESIZED,
            record.from_dp,
            record.to_dp,
            record.to_dp,
            record.message or f"DP {record.to_dp}",
        )

    async def _roll_back(self, record: ResizeRecord) -> None:
        """Undo a resize that did not happen: the engine is at ``from_dp``."""
        assert self.followers is not None
        if record.grow:
            await self.followers.set_followers(record.from_followers)
        await self.followers.write_record(None)
        self._dp = record.from_dp
        log.warning(
            "elastic EP: DP %d -> %d rolled back; engine at DP %d",
            record.from_dp,
            record.to_dp,
            record.from_dp,
        )

    async def _wait_followers_ready(self, record: ResizeRecord) -> bool:
        assert self.followers is not None
        remaining_wall = record.deadline_s - self._wall()
        deadline = self._clock() + max(0.0, remaining_wall)
        while True:
            obs = await self.followers.observe_followers()
            if obs.ready >= record.to_followers:
                return True
            left = deadline - self._clock()
            if left <= 0:
                return False
            await self._sleep(min(self.settings.scaling_check_interval_s, left))

    async def _wait_engine_idle(self) -> None:
        """Wait until the engine reports no resize in flight."""
        timeout = self.settings.resize_timeout_s
        deadline = self._clock() + timeout
        while await self.admin.is_scaling():
            left = deadline - self._clock()
            if left <= 0:
                raise ResizeInFlight(
                    f"elastic EP: the engine at {self.admin.base_url} has been resizing for more "
                    f"than {timeout:g} s (elastic_ep_resize_timeout_seconds); not starting "
                    "another resize"
                )
            await self._sleep(min(self.poll_interval_s, left))

    async def _scale(self, new_dp: int) -> str:
        """One resize call, made safe: a 503 (someone else resizing) is waited out; a call
        without an answer is followed until the engine is idle, then re-issued once."""
        settings = self.settings
        reissued = False
        busy = 0
        while True:
            try:
                return await self.admin.scale(
                    new_dp,
                    drain_timeout_s=settings.drain_timeout_s,
                    timeout_s=settings.resize_timeout_s,
                )
            except ResizeInFlight:
                busy += 1
                if busy > MAX_BUSY_RETRIES:
                    raise
                await self._wait_engine_idle()
            except NoAnswer as exc:
                if reissued:
                    raise ResizeOutcomeUnknown(
                        f"elastic EP: DP {new_dp}: {exc}; re-issued once without an answer"
                    ) from None
                log.warning("elastic EP: %s; following it through %s", exc, IS_SCALING_PATH)
                try:
                    await self._wait_engine_idle()
                except ResizeInFlight as still:
                    raise ResizeOutcomeUnknown(f"elastic EP: DP {new_dp}: {exc}; {still}") from None
                # A completed resize makes this a no-op; a failed one is tried once more.
                reissued = True
