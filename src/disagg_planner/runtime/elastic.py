"""The live loop's elastic-EP axis: plan a DP size each throughput tick, resize in the background.

When ``config.elastic_ep`` names a role, that role's capacity moves by the data-parallel size
of its engine (vLLM elastic EP) instead of its replica count. :class:`ElasticDriver` joins the
pure policy (:class:`disagg_planner.core.elastic.ElasticPlanner`) to the actuator
(:class:`disagg_planner.connectors.elastic_ep.ElasticEpController`) for one :class:`DeploymentLoop`:

- at start, the engine's resize route is chosen (``elastic_ep_api``; "auto" asks the admin
  URL which one it serves) and an unfinished resize recorded on the deployment is finished or
  rolled back (``recover()``), in the background; until the route is known each tick tries
  again and reports why it could not;
- on Kubernetes, a DGD whose engine Dynamo's own elastic-EP reconciler drives is refused
  every tick with a problem saying why (:func:`disagg_planner.connectors.elastic_ep.
  dynamo_reconciler_claim`): two writers must not resize one engine. With
  ``elastic_ep_followers_only_when_claimed`` the planner instead only raises the follower
  replicas a grow needs and leaves the resize to Dynamo's reconciler; it holds shrinks there
  (Dynamo's design defers returning followers, since a plain decrement can remove a pod that
  still hosts ranks);
- each throughput tick reads the engine's DP size and whether a resize is in flight, asks
  the policy (with the tick's traffic window and the elastic role's queued prefill tokens
  from FPM: the observations the throughput loop's backlog rule reads), and when it names
  a target (and the planner is not advisory) starts ``resize(target)`` as a background
  task: a resize takes seconds to minutes and the loop keeps its cadence meanwhile; the
  policy holds (``resize_in_flight``) until it is over;
- a resize that failed is reported as a :class:`Problem` of the next tick (``source``
  ``"elastic"``); a refusal naming the engine's shrink floor (vLLM's "minimum is M") teaches
  the policy that floor; one that succeeded teaches the policy its measured follower
  start-up + join, resize and pause times (the lead time and the pause's price), and a
  pause that contradicts ``elastic_ep_mode`` (e.g. 60 s under NIXL EP) is reported as a
  problem (``ElasticEpPauseContradictsMode``); nothing here raises into the loop except
  cancellation.

The controller's waits run on real time (``time.monotonic`` / ``asyncio.sleep``), not on the
loop's clock: they bound HTTP calls and pod start-up, which a test's jumping clock does not
speed up.

A connector that is an :class:`ElasticEngineProvider` (replay's simulated deployment) hands
the driver its own :class:`ElasticController` instead: one whose ``resize`` only schedules
the resize on an engine that plays it in the connector's own time, and so returns at once;
the driver runs it to completion in place rather than as a background task. Everything else
(the policy, the route of its decisions, the reports) is the same code.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.connectors.base import Connector
from disagg_planner.connectors.elastic_ep import (
    CLAIM_REASON,
    DynamoElasticEpAdmin,
    ElasticEpAdmin,
    ElasticEpController,
    ElasticFollowers,
    JoinProbe,
    RayDashboardJoinProbe,
    ResizeRefused,
    ResizeResult,
    VllmElasticEpAdmin,
    detect_api,
)
from disagg_planner.core.elastic import ElasticDecision, ElasticPlanner
from disagg_planner.core.types import DeploymentStatus, MissingObservation, TrafficObservation
from disagg_planner.errors import ConnectorError, DeploymentError, SpecError
from disagg_planner.profiles import Profile
from disagg_planner.runtime.connector_settings import elastic_ep_settings
from disagg_planner.runtime.outcome import Problem, ProblemKind

log = logging.getLogger(__name__)


class ElasticController(Protocol):
    """What the driver asks of an engine's resizer (:class:`ElasticEpController` live)."""

    async def current_dp(self) -> int: ...
    async def partial_reconfiguration(self) -> str | None: ...
    async def is_resizing(self) -> bool: ...
    async def resize(self, new_dp: int) -> ResizeResult: ...
    async def recover(self) -> ResizeResult | None: ...


@runtime_checkable
class ElasticEngineProvider(Protocol):
    """A connector whose deployment resizes its own engine (replay's simulated one): its
    controller's coroutines never suspend (see the module doc)."""

    def elastic_controller(self, config: PlannerConfig) -> ElasticController: ...


def _run_inline(work: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
    """A coroutine that never suspends, run to its end: a done future of its outcome."""
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    try:
        work.send(None)
    except StopIteration as done:
        future.set_result(done.value)
    except Exception as exc:
        future.set_exception(exc)
    else:
        work.close()
        future.set_exception(RuntimeError("an inline elastic-EP controller suspended"))
    return future


@dataclass(frozen=True)
class ElasticTick:
    """What the elastic axis did in one tick: the policy's decision (None when it could not
    be asked) and whether this tick started a resize."""

    decision: ElasticDecision | None
    started_resize: bool = False
    resizing: bool = False

    def render(self, role: str, *, advisory: bool) -> str:
        """One line for the tick's message."""
        if self.decision is None:
            return f"elastic {role}: not planned this tick"
        d = self.decision
        if d.target_dp is None:
            action = f"hold DP {d.current_dp}"
        elif advisory:
            action = f"DP {d.current_dp} -> {d.target_dp} [ADVISORY: not resized]"
        elif self.started_resize:
            action = f"resizing DP {d.current_dp} -> {d.target_dp}"
        else:
            action = f"DP {d.current_dp} -> {d.target_dp} waits for the resize in flight"
        return f"elastic {role}: {action} ({d.reason.value}: {d.message})"

    def as_extra(self) -> dict[str, object]:
        """Plain values for the diagnostics snapshot."""
        d = self.decision
        return {
            "reason": d.reason.value if d else None,
            "current_dp": d.current_dp if d else None,
            "target_dp": d.target_dp if d else None,
            "started_resize": self.started_resize,
            "resizing": self.resizing,
        }


class ElasticDriver:
    """The elastic-EP axis of one deployment's loop (see the module doc).

    ``profile`` is the throughput loop's capacity profile (the policy sizes ranks with it);
    ``connector`` is the loop's: when its :meth:`Connector.elastic_followers` answers
    follower pods (the Kubernetes connector with a follower service, pooled or not), they
    are scaled in two stages; otherwise the GPUs are someone else's and the engine starts at
    ``elastic_ep_min_dp``. Raises :class:`SpecError` when the settings cannot drive an
    engine.
    """

    def __init__(
        self, config: PlannerConfig, *, profile: Profile | None, connector: Connector
    ) -> None:
        role = config.elastic_ep
        if role is None:
            raise ValueError("ElasticDriver needs a config with elastic_ep set")
        if profile is None:
            raise SpecError(
                f"elastic_ep={role}: the elastic policy sizes DP ranks with the throughput "
                "loop's profile; enable throughput scaling and give --profile or "
                "--profile-results-dir"
            )
        self.config = config
        self.role: str = role
        self.planner = ElasticPlanner(config=config, profile=profile)
        self._task: asyncio.Task[ResizeResult | None] | concurrent.futures.Future[Any] | None
        self._task = None
        self._task_what = ""
        self._inline = isinstance(connector, ElasticEngineProvider)
        self._controller: ElasticController | None = None
        self.followers: ElasticFollowers | None = None
        self.admin_url: str = ""
        if isinstance(connector, ElasticEngineProvider):
            self._controller = connector.elastic_controller(config)
            return
        if not config.elastic_ep_admin_url:
            raise SpecError(
                f"elastic_ep={role}: elastic_ep_admin_url is required (vLLM's API server, "
                "e.g. http://leader:8000, or a Dynamo vLLM worker's system port)"
            )
        self.admin_url = config.elastic_ep_admin_url
        self.followers = connector.elastic_followers()
        if config.elastic_ep_api != "auto":
            self._controller = self._make_controller(config.elastic_ep_api)

    def _make_controller(self, api: str) -> ElasticEpController:
        """The controller of the engine behind ``elastic_ep_admin_url`` speaking ``api``."""
        config = self.config
        admin: ElasticEpAdmin
        probe: JoinProbe | None = None
        if api == "dynamo":
            admin = probe = DynamoElasticEpAdmin(self.admin_url)
        else:
            admin = VllmElasticEpAdmin(
                self.admin_url,
                drain_timeout_s=config.elastic_ep_drain_timeout_seconds,
                drains_requests=config.elastic_ep_engine_drains_requests,
            )
            if config.elastic_ep_ray_dashboard_url:
                probe = RayDashboardJoinProbe(config.elastic_ep_ray_dashboard_url)
        log.info("elastic EP (%s): %s route at %s", self.role, api, self.admin_url)
        return ElasticEpController(
            elastic_ep_settings(config), admin=admin, followers=self.followers, join_probe=probe
        )

    @property
    def controller(self) -> ElasticController:
        """The engine's controller; RuntimeError before :meth:`connect` found the route."""
        if self._controller is None:
            raise RuntimeError("elastic EP: the engine's route is not known yet")
        return self._controller

    async def connect(self) -> ElasticController:
        """The controller, choosing the route first when ``elastic_ep_api = "auto"``
        (ConnectorError when the admin URL serves neither)."""
        if self._controller is None:
            self._controller = self._make_controller(await detect_api(self.admin_url))
        return self._controller

    @property
    def busy(self) -> bool:
        """Whether a background resize (or recovery) of ours is running."""
        return self._task is not None and not self._task.done()

    async def wait_idle(self) -> None:
        """Wait for the background resize, if any, to end (its outcome is kept for the next
        tick's report)."""
        if isinstance(self._task, asyncio.Task):
            await asyncio.wait({self._task})

    def start(self) -> None:
        """Finish or roll back a resize a previous planner left unfinished (background)."""
        if self.config.advisory:
            return  # advisory never acts, not even to finish someone's resize
        self._spawn(self._recover(), "recovery of an unfinished resize")

    async def _recover(self) -> ResizeResult | None:
        controller = await self.connect()
        if self.followers is not None and await self.followers.reconciler_claim(self.role):
            return None  # not ours to finish: every tick reports why
        return await controller.recover()

    async def close(self) -> None:
        """Cancel a resize in flight; its record on the deployment lets the next planner
        finish or roll it back."""
        if self.busy:
            assert isinstance(self._task, asyncio.Task)  # an inline one is always done
            log.warning("elastic EP: stopping during the %s; its record stays", self._task_what)
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def tick(
        self,
        now: float,
        traffic: TrafficObservation | MissingObservation,
        status: DeploymentStatus | MissingObservation,
        problems: list[Problem],
        queued_prefill_tokens: float | None = None,
    ) -> ElasticTick:
        """One throughput tick of the elastic axis; problems are appended, never raised.

        ``traffic`` and ``queued_prefill_tokens`` (the elastic role's engines' FPM, None
        where none reports) are the observations the throughput loop's backlog rule reads;
        the policy sizes for the backlog they show."""
        self._collect(problems)
        if not isinstance(status, DeploymentStatus):
            # Without the other roles' GPUs the budget cap is unknown: do not size blind.
            return ElasticTick(None)
        other_gpus = sum(
            max(s.desired, s.ready) * s.gpus_per_replica
            for r, s in status.roles.items()
            if r != self.role
        )
        try:
            controller = await self.connect()
            if self.followers is not None:
                claim = await self.followers.reconciler_claim(self.role)
                if claim is not None and self.config.elastic_ep_followers_only_when_claimed:
                    return await self._followers_only(now, traffic, other_gpus, problems)
                if claim is not None:
                    problems.append(
                        Problem(
                            ProblemKind.DEPLOYMENT_INVALID,
                            CLAIM_REASON,
                            f"not resizing: {claim}",
                            "elastic",
                        )
                    )
                    return ElasticTick(None)
            partial = await controller.partial_reconfiguration()
            if partial is not None:
                # Reported every tick: a person must restart the engine (the policy holds).
                problems.append(
                    Problem(
                        ProblemKind.CONNECTOR_ERROR,
                        "PartialReconfiguration",
                        f"not resizing: {partial}",
                        "elastic",
                    )
                )
            current_dp = await controller.current_dp()
            resizing = await controller.is_resizing()
        except (ConnectorError, DeploymentError) as exc:
            problems.append(_problem(exc))
            return ElasticTick(None)
        decision = self.planner.tick(
            now,
            traffic,
            current_dp=current_dp,
            resizing=resizing,
            other_gpus=other_gpus,
            queued_prefill_tokens=queued_prefill_tokens,
        )
        started = False
        if decision.target_dp is not None and not self.config.advisory and not self.busy:
            self._spawn(
                controller.resize(decision.target_dp),
                f"resize DP {current_dp} -> {decision.target_dp}",
            )
            started = True
        return ElasticTick(decision, started_resize=started, resizing=resizing)

    async def _followers_only(
        self,
        now: float,
        traffic: TrafficObservation | MissingObservation,
        other_gpus: int,
        problems: list[Problem],
    ) -> ElasticTick:
        """Dynamo's reconciler resizes this engine: raise the followers a grow needs and let
        it fire the resize (its target is 1 + the follower replicas' ranks); hold shrinks."""
        pool = self.followers
        assert pool is not None
        controller = self.controller
        assert isinstance(controller, ElasticEpController)
        obs = await pool.observe_followers()
        reported = await controller.admin.engine_dp()
        followers_dp = controller.dp_for(obs.desired)
        current_dp = reported if reported is not None else followers_dp
        # the reconciler has not resized to the followers' size yet: a resize in flight
        resizing = self.busy or current_dp != followers_dp
        decision = self.planner.tick(
            now, traffic, current_dp=current_dp, resizing=resizing, other_gpus=other_gpus
        )
        target = decision.target_dp
        if target is None or self.config.advisory:
            return ElasticTick(decision, resizing=resizing)
        if target < current_dp:
            problems.append(
                Problem(
                    ProblemKind.DEPLOYMENT_INVALID,
                    "ElasticEpShrinkLeftToDynamo",
                    f"DP {current_dp} -> {target} held: Dynamo's reconciler drives this engine "
                    "and its design defers returning followers (a decrement can remove a pod "
                    "still hosting ranks)",
                    "elastic",
                )
            )
            return ElasticTick(decision)
        wanted = controller.followers_for(target)
        if wanted > obs.desired:
            self._spawn(pool.set_followers(wanted), f"followers {obs.desired} -> {wanted}")
            return ElasticTick(decision, started_resize=True)
        return ElasticTick(decision)

    def _spawn(self, work: object, what: str) -> None:
        assert asyncio.iscoroutine(work)
        if self._inline:
            self._task = _run_inline(work)
        else:
            self._task = asyncio.create_task(work, name=f"elastic EP {what}")
        self._task_what = what
        log.info("elastic EP (%s): %s started", self.role, what)

    def _collect(self, problems: list[Problem]) -> None:
        """Report how the last background resize ended, once."""
        task = self._task
        if task is None or not task.done():
            return
        self._task = None
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            result = task.result()
            if isinstance(result, ResizeResult):
                log.info("elastic EP (%s): %s: %s", self.role, self._task_what, result.message)
                warning = self.planner.observe_resize(
                    grow=result.to_dp > result.from_dp,
                    followers_ready_s=result.followers_ready_s,
                    resize_s=result.resize_s,
                    pause_s=result.pause_s,
                )
                if warning is not None:
                    log.warning("elastic EP (%s): %s", self.role, warning)
                    problems.append(
                        Problem(
                            ProblemKind.CONNECTOR_ERROR,
                            "ElasticEpPauseContradictsMode",
                            warning,
                            "elastic",
                        )
                    )
            return
        if isinstance(exc, ResizeRefused) and exc.minimum_dp is not None:
            self.planner.observe_min_dp(exc.minimum_dp)
        if isinstance(exc, ConnectorError | DeploymentError):
            log.warning("elastic EP (%s): %s failed: %s", self.role, self._task_what, exc)
            problems.append(_problem(exc))
        else:  # a bug: keep the traceback, keep the loop
            log.error("elastic EP (%s): %s raised", self.role, self._task_what, exc_info=exc)
            problems.append(
                Problem(ProblemKind.TICK_FAILED, type(exc).__name__, str(exc), "elastic")
            )


def _problem(exc: ConnectorError | DeploymentError) -> Problem:
    if isinstance(exc, DeploymentError):
        return Problem(ProblemKind.DEPLOYMENT_INVALID, "deployment_error", str(exc), "elastic")
    return Problem(ProblemKind.CONNECTOR_ERROR, type(exc).__name__, str(exc), "elastic")
