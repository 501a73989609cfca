"""Single-flight resizes of one engine:

- grow: record ``AddingFollowers``; raise the followers; wait until they are ready *and*
  their GPUs have joined the engine's Ray cluster (a :class:`JoinProbe`, when one is given),
  all within ``scaling_max_wait_seconds`` of the start, else lower them again; record
  ``Resizing``; call the resize; clear the record;
- shrink: record ``Resizing``; call the resize; record ``RemovingFollowers``; lower the
  followers; clear the record;
- a refused resize (vLLM 400/500, a drain 408, Dynamo "error") rolls the followers back and
  raises a typed error; a resize that may have half reconfigured the engine
  (:class:`PartialReconfiguration`: a 408 past the drain, "reconfiguration is already
  active") keeps the followers and the record, and every later resize is refused until a
  person restarts the engine and removes the record;
- never two resizes at once: callers queue on a lock, and a resize the engine reports in
  flight (someone else's) is waited for (``elastic_ep_resize_timeout_seconds``): through
  ``/is_scaling_elastic_ep`` on bare vLLM, by retrying "busy" answers on Dynamo's route
  (which has no such query);
- a resize call that gets no answer in ``elastic_ep_resize_timeout_seconds`` (or loses its
  connection) is followed until the engine is idle and then re-issued once: a completed
  resize makes it a no-op;
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
from dataclasses import replace

from disagg_planner.connectors.elastic_ep.admin_client import ElasticEpAdmin
from disagg_planner.connectors.elastic_ep.errors import (
    ConnectionLost,
    DrainTimeout,
    FollowersNotReady,
    GrowFailed,
    NoAnswer,
    PartialReconfiguration,
    ResizeBackingOff,
    ResizeInFlight,
    ResizeOutcomeUnknown,
    ResizeRefused,
)
from disagg_planner.connectors.elastic_ep.join_probe import JoinProbe
from disagg_planner.connectors.elastic_ep.progress import (
    RECORD_ANNOTATION,
    FollowerPool,
    GrowBackoff,
    ResizePhase,
    ResizeRecord,
)
from disagg_planner.connectors.elastic_ep.resize import (
    ElasticEpSettings,
    ResizeOutcome,
    ResizeResult,
)
from disagg_planner.errors import ConnectorError, DeploymentError

log = logging.getLogger(__name__)

# How often the controller asks /is_scaling_elastic_ep while it waits on a resize (s).
DEFAULT_POLL_S = 5.0
# 503 answers (another resize started between our check and our call) waited out per call.
MAX_BUSY_RETRIES = 3
# The record's message of a resize that may have half reconfigured the engine.
PARTIAL_MARK = "partial reconfiguration"
# The back-off after failed grows doubles per failure up to this many times the base.
MAX_BACKOFF_FACTOR = 8


class ElasticEpController:
    """Single-flight resizes of one engine (see the module doc).

    ``admin`` is the engine's resize route (:class:`VllmElasticEpAdmin` or
    :class:`DynamoElasticEpAdmin`). ``followers`` (a :class:`FollowerPool`, e.g.
    :class:`ElasticEpKubernetes`) enables the two-stage flow; without it only the engine is
    resized and ``initial_dp`` (default ``settings.min_dp``) is its size at start.
    ``join_probe`` says how many GPUs the engine's Ray cluster has: with it a grow waits
    until ``to_dp x gpus_per_rank`` have joined, not only until the pods are Ready.
    ``clock`` (monotonic) bounds waits, ``wall_clock`` (epoch) stamps records, ``sleep``
    waits; all injectable for tests.
    """

    def __init__(
        self,
        settings: ElasticEpSettings,
        *,
        admin: ElasticEpAdmin,
        followers: FollowerPool | None = None,
        join_probe: JoinProbe | None = None,
        initial_dp: int | None = None,
        poll_interval_s: float = DEFAULT_POLL_S,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.settings = settings
        self.admin = admin
        self.followers = followers
        self.join_probe = join_probe
        self.min_dp = settings.min_dp
        self.max_dp = settings.max_dp
        self.step = settings.dp_step
        self.poll_interval_s = poll_interval_s
        self._clock = clock
        self._wall = wall_clock
        self._sleep = sleep
        self._lock = asyncio.Lock()
        self._dp = initial_dp if initial_dp is not None else self.min_dp
        # Why the engine may be half reconfigured (no record store to keep it in), else None.
        self._partial: str | None = None
        self._followers_ready_s: float | None = None

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
        """The engine's DP size as far as can be told: what the engine reports (Dynamo's
        route), else from the followers and the record (the size before a resize that is not
        confirmed), else the last resize's. With followers and no resize recorded, an engine
        whose reported size is not ``min_dp + followers x step`` was resized by someone else:
        DeploymentError, so the policy holds and says why."""
        reported = await self.admin.engine_dp()
        if self.followers is None:
            if reported is not None:
                self._dp = reported
            return self._dp
        obs = await self.followers.observe_followers()
        record = obs.record
        if record is None:
            derived = self.dp_for(obs.desired)
            if reported is not None and reported != derived:
                raise DeploymentError(
                    f"elastic EP: the engine at {self.admin.base_url} reports DP {reported}, "
                    f"but {obs.desired} follower(s) make DP {derived} and no resize is "
                    "recorded: someone else resized the engine or changed the followers; "
                    "not resizing until they agree"
                )
            return derived
        return record.to_dp if record.phase is ResizePhase.REMOVING_FOLLOWERS else record.from_dp

    async def partial_reconfiguration(self) -> str | None:
        """Why the engine may be half reconfigured (a resize of ours left it so; it needs a
        restart before it resizes again), else None."""
        if self._partial is not None:
            return self._partial
        if self.followers is not None:
            record = (await self.followers.observe_followers()).record
            if record is not None and record.message.startswith(PARTIAL_MARK):
                return record.message
        return None

    async def is_resizing(self) -> bool:
        """A resize of ours is running, one is recorded unfinished, or the engine says so."""
        if self.in_flight or self._partial is not None:
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
        rolling back), :class:`ResizeInFlight`, :class:`ResizeOutcomeUnknown` or
        :class:`PartialReconfiguration` (the record stays) or ConnectorError/DeploymentError
        from the backends.
        """
        self._check_target(new_dp)
        async with self._lock:
            await self._recover_locked()
            if self._partial is not None:
                raise PartialReconfiguration(f"elastic EP: not resizing: {self._partial}")
            await self._wait_engine_idle()
            current = await self.current_dp()
            if new_dp == current:
                return ResizeResult(
                    ResizeOutcome.UNCHANGED, current, new_dp, current, f"already at DP {current}"
                )
            self._followers_ready_s = None
            if self.followers is None:
                started = self._clock()
                try:
                    message = await self._scale(new_dp)
                except PartialReconfiguration as exc:
                    self._partial = str(exc)
                    raise
                self._dp = new_dp
                return ResizeResult(
                    ResizeOutcome.RESIZED,
                    current,
                    new_dp,
                    new_dp,
                    message,
                    resize_s=self._clock() - started,
                    pause_s=self._measured_pause(),
                )
            obs = await self.followers.observe_followers()
            now = self._wall()
            if new_dp > current and obs.backoff is not None and now < obs.backoff.not_before_s:
                b = obs.backoff
                raise ResizeBackingOff(
                    f"elastic EP: not growing DP {current} -> {new_dp} for another "
                    f"{b.not_before_s - now:.0f} s: {b.failures} failed grow(s), the last to "
                    f"DP {b.to_dp} ({b.reason}: {b.message}); elastic_ep_grow_backoff_seconds"
                )
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
        if record.message.startswith(PARTIAL_MARK):
            raise PartialReconfiguration(
                f"elastic EP: DP {record.from_dp} -> {record.to_dp} left the engine possibly "
                f"half reconfigured ({record.message}); restart the engine and remove the "
                f"DGD annotation {RECORD_ANNOTATION} before the planner resizes it again"
            )
        resize_s: float | None = None
        if record.phase is ResizePhase.ADDING_FOLLOWERS:
            raised_at = self._clock()
            await pool.set_followers(record.to_followers)
            missing = await self._wait_followers_ready(record)
            if missing is not None:
                await self._roll_back(record)
                raise FollowersNotReady(
                    f"elastic EP: {missing} by the deadline "
                    f"({self.settings.scaling_max_wait_s:g} s after the start); followers "
                    f"lowered to {record.from_followers}, engine stays at DP {record.from_dp}"
                )
            self._followers_ready_s = self._clock() - raised_at
            record = replace(record, phase=ResizePhase.RESIZING)
            await pool.write_record(record)
        if record.phase is ResizePhase.RESIZING:
            try:
                if record.called_s is not None:  # a restarted controller: never re-fire blindly
                    done = await self._called_before(record)
                    if done is not None:
                        return done
                await self._wait_engine_idle()  # e.g. the call a restarted controller made
                record = replace(
                    record, called_s=self._wall(), leader_restarts=await pool.leader_restarts()
                )
                await pool.write_record(record)
                started = self._clock()
                message = await self._scale(record.to_dp)
                resize_s = self._clock() - started
            except (ResizeRefused, DrainTimeout) as exc:
                await self._roll_back(record)
                if record.grow:
                    await self._back_off(record, exc)
                raise
            except PartialReconfiguration as exc:
                # The new ranks may live on the followers: leave them, keep the record.
                await pool.write_record(replace(record, message=f"{PARTIAL_MARK}: {exc}"))
                raise
            except ResizeOutcomeUnknown as exc:
                await pool.write_record(replace(record, message=f"outcome unknown: {exc}"))
                raise
            if record.grow:
                await pool.write_record(None)
                if (await pool.observe_followers()).backoff is not None:
                    await pool.write_backoff(None)  # the engine grows again
                self._dp = record.to_dp
                return ResizeResult(
                    ResizeOutcome.RESIZED,
                    record.from_dp,
                    record.to_dp,
                    record.to_dp,
                    message,
                    followers_ready_s=self._followers_ready_s,
                    resize_s=resize_s,
                    pause_s=self._measured_pause(),
                )
            record = replace(record, phase=ResizePhase.REMOVING_FOLLOWERS, message=message)
            await pool.write_record(record)
        await self._retire(record)
        await pool.set_followers(record.to_followers)
        await pool.write_record(None)
        self._dp = record.to_dp
        return ResizeResult(
            ResizeOutcome.RESIZED,
            record.from_dp,
            record.to_dp,
            record.to_dp,
            record.message or f"DP {record.to_dp}",
            resize_s=resize_s,
            pause_s=self._measured_pause() if resize_s is not None else None,
        )

    async def _retire(self, record: ResizeRecord) -> None:
        """Mark the follower pods whose ranks the shrink removed, shown empty by the join
        probe, before the follower count drops (FollowersNotEmpty keeps the record)."""
        assert self.followers is not None
        leaving = record.from_followers - record.to_followers
        if leaving <= 0:
            return
        if self.join_probe is None:
            count, ips = 0, None
        else:
            count, ips = await self.join_probe.empty_nodes()
        await self.followers.retire_followers(leaving, empty_ips=ips, empty_nodes=count)

    async def _called_before(self, record: ResizeRecord) -> ResizeResult | None:
        """A resize call a previous controller made (``record.called_s``): finished when the
        engine reports the new size; failed (rolled back, backed off) when the leader pods
        restarted since or the engine reports the old size after a restart; None when it may
        still run (re-issued: the engine's single flight answers "in progress" meanwhile)."""
        assert self.followers is not None
        reported = await self._engine_dp_or_none()
        if reported == record.to_dp:
            await self.followers.write_record(None)
            self._dp = record.to_dp
            if not record.grow:
                await self._retire(record)
                await self.followers.set_followers(record.to_followers)
            return ResizeResult(
                ResizeOutcome.RESIZED,
                record.from_dp,
                record.to_dp,
                record.to_dp,
                f"DP {record.to_dp}: the previous planner's resize had finished",
            )
        restarts = await self.followers.leader_restarts()
        if (
            record.grow
            and record.leader_restarts is not None
            and restarts is not None
            and restarts > record.leader_restarts
        ):
            exc = GrowFailed(
                f"elastic EP: DP {record.from_dp} -> {record.to_dp}: the engine's leader pods "
                f"restarted {restarts - record.leader_restarts} time(s) since the resize call "
                f"(engine reports DP {reported!r}): the grow failed; not re-issuing it",
                status=0,
                detail="leader restarted",
            )
            await self._roll_back(record)
            await self._back_off(record, exc)
            raise exc
        return None

    async def _engine_dp_or_none(self) -> int | None:
        try:
            return await self.admin.engine_dp()
        except ConnectorError:
            return None

    async def _back_off(self, record: ResizeRecord, exc: Exception) -> None:
        """Record a failed grow: the next waits ``grow_backoff_s``, doubled per failure."""
        assert self.followers is not None
        previous = (await self.followers.observe_followers()).backoff
        failures = (previous.failures if previous is not None else 0) + 1
        delay = self.settings.grow_backoff_s * min(MAX_BACKOFF_FACTOR, 2 ** (failures - 1))
        now = self._wall()
        reason = "WorkerRestarted" if isinstance(exc, GrowFailed) else type(exc).__name__
        await self.followers.write_backoff(
            GrowBackoff(
                failures=failures,
                not_before_s=now + delay,
                to_dp=record.to_dp,
                reason=reason,
                message=f"grow DP {record.from_dp} -> {record.to_dp} failed ({exc}); "
                f"followers lowered to {record.from_followers}; next grow in {delay:.0f} s",
                at_s=now,
            )
        )

    def _measured_pause(self) -> float | None:
        measured = self.admin.measured()
        return measured.pause_s if measured is not None else None

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

    async def _wait_followers_ready(self, record: ResizeRecord) -> str | None:
        """Wait until the followers are Ready and (with a join probe) their GPUs have joined;
        None when they have, else what was missing at the record's deadline."""
        assert self.followers is not None
        remaining_wall = record.deadline_s - self._wall()
        deadline = self._clock() + max(0.0, remaining_wall)
        per_rank = self.settings.gpus_per_rank
        need_ranks = record.to_dp - record.from_dp
        while True:
            obs = await self.followers.observe_followers()
            if obs.ready < record.to_followers:
                missing = (
                    f"{record.to_followers} follower pod(s) of DP {record.to_dp} were not "
                    f"ready ({obs.ready} ready)"
                )
            elif self.join_probe is None:
                return None
            else:
                # vLLM places each new rank's TP GPUs on one node: count per node.
                fits = await self.join_probe.placeable_ranks(per_rank, current_dp=record.from_dp)
                if fits >= need_ranks:
                    return None
                missing = (
                    f"the follower pods are ready but only {fits} of the {need_ranks} new "
                    f"ranks of DP {record.to_dp} fit on a node with {per_rank} GPU(s) of the "
                    f"engine's Ray cluster ({self.join_probe.where})"
                )
            left = deadline - self._clock()
            if left <= 0:
                return missing
            await self._sleep(min(self.settings.scaling_check_interval_s, left))

    async def _wait_engine_idle(self) -> None:
        """Wait until the engine reports no resize in flight (a route that cannot tell, like
        Dynamo's, shows a resize in flight only as a "busy" answer to the next call)."""
        if not self.admin.reports_scaling:
            return
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

    async def _busy_wait(self, deadline: float, exc: ResizeInFlight) -> None:
        """A "busy" answer on a route without ``is_scaling``: wait a poll, or give up at
        ``deadline``."""
        left = deadline - self._clock()
        if left <= 0:
            raise ResizeInFlight(
                f"{exc}; still busy after {self.settings.resize_timeout_s:g} s "
                "(elastic_ep_resize_timeout_seconds); not starting another resize"
            ) from None
        await self._sleep(min(self.poll_interval_s, left))

    async def _after_lost_connection(self, new_dp: int, exc: NoAnswer) -> str:
        """Dynamo's worker dropped the call: its process exits on a failed resize and the
        pod restarts (fail-fast). Wait for the route to answer again and read the size: the
        new one is a success whose answer was lost; any other is a failure, never re-fired."""
        deadline = self._clock() + self.settings.resize_timeout_s
        while True:
            reported = await self._engine_dp_or_none()
            if reported is not None:
                break
            left = deadline - self._clock()
            if left <= 0:
                raise ResizeOutcomeUnknown(
                    f"elastic EP: DP {new_dp}: {exc}; the worker did not answer again within "
                    f"{self.settings.resize_timeout_s:g} s (elastic_ep_resize_timeout_seconds)"
                ) from None
            await self._sleep(min(self.poll_interval_s, left))
        if reported == new_dp:
            return f"DP {new_dp} (the worker's answer was lost)"
        raise GrowFailed(
            f"elastic EP: DP {new_dp}: {exc}; the worker is back at DP {reported}: it "
            "restarted on a failed resize (Dynamo's fail-fast); not re-issuing it",
            status=0,
            detail=str(exc),
        )

    async def _scale(self, new_dp: int) -> str:
        """One resize call, made safe: a resize in flight (503, "busy") is waited out; a call
        without an answer is followed until the engine is idle, then re-issued once."""
        timeout = self.settings.resize_timeout_s
        reissued = False
        busy = 0
        deadline = self._clock() + timeout
        while True:
            try:
                return await self.admin.scale(new_dp, timeout_s=timeout)
            except ResizeInFlight as exc:
                if not self.admin.reports_scaling:
                    try:
                        await self._busy_wait(deadline, exc)
                    except ResizeInFlight as still:
                        if reissued:  # our first call may still be running
                            raise ResizeOutcomeUnknown(
                                f"elastic EP: DP {new_dp}: {still}"
                            ) from None
                        raise
                    continue
                busy += 1
                if busy > MAX_BUSY_RETRIES:
                    raise
                await self._wait_engine_idle()
            except NoAnswer as exc:
                if isinstance(exc, ConnectionLost) and not self.admin.reports_scaling:
                    return await self._after_lost_connection(new_dp, exc)
                if reissued:
                    raise ResizeOutcomeUnknown(
                        f"elastic EP: DP {new_dp}: {exc}; re-issued once without an answer"
                    ) from None
                log.warning("elastic EP: %s; following it until the engine is idle", exc)
                try:
                    await self._wait_engine_idle()
                except ResizeInFlight as still:
                    raise ResizeOutcomeUnknown(f"elastic EP: DP {new_dp}: {still}") from None
                # A completed resize makes this a no-op; a failed one is tried once more. On a
                # route without is_scaling the re-issued call answers "busy" until the first
                # one is over, and is waited out above.
                reissued = True
                deadline = self._clock() + timeout
