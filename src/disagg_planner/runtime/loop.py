"""One deployment's reconcile loop: the shell around the pure :class:`PlannerCore`.

The loop owns the clock and all per-tick I/O; the core decides. Shared by ``planner run``
(one loop in the process), ``planner operator`` (one loop per policy object) and ``planner
replay`` (one loop per replayed policy, on the simulated cluster's clock, connector and
sources: :mod:`disagg_planner.replay.policies`), so that a replay runs this very code::

    validate the deployment (retry with backoff until it passes or the loop stops)
    build the core, the traffic observer, the FPM subscribers; the schedule starts when
    that is done (with ``stagger_ticks`` at the deployment's own phase: staggered_start())
    repeat until stopped:
        sleep until core.next_tick_at_s (later while the connector keeps failing)
        due = core.due(now)                       which loops run this tick
        learn from every FPM iteration received since the last tick
        status  <- connector.status()             always
        traffic <- the window due names           throughput ticks only
        engines <- latest FPM per engine          load ticks only
        observation <- ObservationBuilder          (disagg_planner.runtime.observation)
        effects = core.tick(now, observation)
        elastic EP role (if any): dropped from scale_to; its DP size is planned and resized
                                  in the background (disagg_planner.runtime.elastic)
        connector.set_replicas(scale_to)          unless advisory or held
        gauges, diagnostics snapshot, outcome callback (the operator's status)

Never dies on bad data: a missing observation is passed to the core, which holds and says
why; a :class:`DeploymentError` or :class:`ConnectorError` becomes a :class:`Problem` of the
tick (and, when it repeats, a longer pause before the next tick, up to
:data:`MAX_BACKOFF_S`); any other exception in a tick is logged with its traceback and the
next tick runs as scheduled. Only a configuration problem found while building the core
(a :class:`SpecError` or a library error classified as one, e.g. an unreadable profile)
ends :meth:`DeploymentLoop.run`, by raising it.

Beside it: :mod:`.calls` (the connector's and the observer's calls, each failure a Problem),
:mod:`.engine_sources` (the FPM sources it starts), :mod:`.outcome` (the tick's record, and
the throughput reason it reports), :mod:`.summary` (the ``[summary]`` line).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.connectors.base import Connector
from disagg_planner.core.planner import Effects, PlannerCore, queued_prefill_tokens
from disagg_planner.core.schedule import (
    DueTick,
    TrafficWindow,
    shortest_cadence_s,
    staggered_start,
)
from disagg_planner.core.types import DeploymentStatus, MissingObservation, TrafficObservation
from disagg_planner.errors import is_spec_error
from disagg_planner.observe import TrafficObserver
from disagg_planner.profiles import Profile
from disagg_planner.report.recorder import DiagnosticsRecorder
from disagg_planner.runtime.audit import log_audit
from disagg_planner.runtime.calls import apply_scale, observe_traffic, read_status, validate
from disagg_planner.runtime.clock import Clock, Offload, WallClock
from disagg_planner.runtime.elastic import ElasticDriver, ElasticTick
from disagg_planner.runtime.engine_sources import Stoppable, start_engine_sources
from disagg_planner.runtime.metrics import HealthState, PlannerMetrics
from disagg_planner.runtime.observation import EngineSource, ObservationBuilder, engine_queues
from disagg_planner.runtime.outcome import (
    Problem,
    ProblemKind,
    TickOutcome,
    build_snapshot,
    decided_throughput_reason,
    held_reasons,
)
from disagg_planner.runtime.summary import summary_line
from disagg_planner.runtime.wiring import build_core, profile_for

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 300.0
SHUTDOWN_GRACE_S = 5.0


@dataclass(frozen=True)
class DeploymentRef:
    """Which deployment a loop drives; ``namespace``/``name`` label its metrics."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


TrafficFactory = Callable[[str | None], TrafficObserver]
OutcomeHook = Callable[[TickOutcome], Awaitable[None]]


class DeploymentLoop:
    """The reconcile loop of one deployment (see the module docstring).

    ``profile`` is the throughput loop's capacity profile, loaded by the caller (so that a
    bad profile fails before anything starts); None loads it from the config.
    ``traffic_factory(model_name)`` builds the traffic observer once the deployment's model
    name is known (default: :class:`PrometheusTrafficObserver`). ``engine_sources`` maps each
    role to its FPM source; by default one :class:`FpmSubscriber` per role is started when the
    load loop runs, on this loop's clock. ``on_outcome`` is awaited after every tick and
    every failed start-up attempt; an exception in it is logged and ignored.

    Replay's knobs: ``offload`` runs the blocking calls of a tick (default
    ``asyncio.to_thread``; replay calls its never-blocking sources in place); each tick's
    summary line is logged at ``tick_log_level``; with ``raise_tick_errors`` an exception in a
    tick propagates instead of becoming a ``tick_failed`` problem (in replay it is a bug, not
    an outage to ride out).

    ``stagger_ticks`` (the operator's many loops in one process) starts the schedule at the
    deployment's own phase of its shortest cadence (:func:`staggered_start`) instead of at
    the instant the loop started, so that loops started together (an operator restart with
    a thousand policies) do not all tick at the same instants and queue behind each other.
    ``startup_gate`` (the operator's, one for all its loops) bounds the set-ups (validate
    and build) running at once: a thousand at once would fill the worker threads and hold
    up the ticks of the loops already running.
    """

    def __init__(
        self,
        config: PlannerConfig,
        *,
        connector: Connector,
        ref: DeploymentRef,
        clock: Clock | None = None,
        profile: Profile | None = None,
        traffic_factory: TrafficFactory | None = None,
        engine_sources: Mapping[str, EngineSource] | None = None,
        metrics: PlannerMetrics | None = None,
        health: HealthState | None = None,
        recorder: DiagnosticsRecorder | None = None,
        on_outcome: OutcomeHook | None = None,
        shutdown_grace_s: float = SHUTDOWN_GRACE_S,
        offload: Offload = asyncio.to_thread,
        tick_log_level: int = logging.INFO,
        raise_tick_errors: bool = False,
        stagger_ticks: bool = False,
        startup_gate: asyncio.Semaphore | None = None,
    ) -> None:
        self.config = config
        self.connector = connector
        self.ref = ref
        self.clock: Clock = clock or WallClock()
        self.metrics = metrics
        self.health = health
        self.recorder = recorder
        self._profile = profile
        self._traffic_factory = traffic_factory
        self._given_engine_sources = engine_sources
        self._on_outcome = on_outcome
        self._shutdown_grace_s = shutdown_grace_s
        self._offload = offload
        self._tick_log_level = tick_log_level
        self._raise_tick_errors = raise_tick_errors
        self._stagger_ticks = stagger_ticks
        self._startup_gate = startup_gate
        self.core: PlannerCore | None = None
        self.traffic: TrafficObserver | None = None
        self.engine_sources: dict[str, EngineSource] = {}
        self.observations = ObservationBuilder({})
        self._owned_sources: list[Stoppable] = []  # FPM sources and discovery, for close()
        self.last_outcome: TickOutcome | None = None
        self.ticks = 0
        self._gpu_hours = 0.0
        self._last_gpu_sample: tuple[float, int] | None = None
        self._failures = 0  # consecutive ticks (or start attempts) the connector failed
        self._traffic_problem: Problem | None = None  # the last throughput tick's, if any
        self._not_before_s = float("-inf")
        self._wake: asyncio.Event | None = None  # set by the deployment's watch (run())
        self.elastic: ElasticDriver | None = None
        self._dropped_seen: dict[tuple[str, str], int] = {}
        intervals = []
        if config.throughput_scaling_active:
            intervals.append(config.throughput_adjustment_interval_seconds)
        if config.load_scaling_active:
            intervals.append(config.load_adjustment_interval_seconds)
        self._base_backoff_s = min(intervals)

    # --- lifecycle --------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Validate, then tick until ``stop`` is set; releases everything on the way out.

        Raises :class:`SpecError` when the core cannot be built from the configuration.
        """
        unwatch = self._watch_deployment()
        try:
            if not await self.start(stop):
                return
            while not stop.is_set():
                if await self._sleep_until(self.next_wake_s, stop):
                    break
                await self._tick_or_stop(stop)
        finally:
            unwatch()
            await self.close()

    def _watch_deployment(self) -> Callable[[], None]:
        """Wake this loop when its deployment appears or changes while it is failing (a
        DGD deleted and applied again), instead of waiting out the backoff."""
        wake = self._wake = asyncio.Event()
        running = asyncio.get_running_loop()

        def changed() -> None:
            if self._failures > 0:
                running.call_soon_threadsafe(wake.set)

        unwatch = self.connector.on_deployment_change(changed)
        if unwatch is None:  # a connector that hears of no change: sleep out the backoff
            self._wake = None
            return lambda: None
        return unwatch

    async def _sleep_until(self, at_s: float, stop: asyncio.Event) -> bool:
        """Sleep until ``at_s``, ``stop`` (then True) or a wake-up from the deployment's
        watch (which ends the backoff)."""
        wake = self._wake
        if wake is None:
            return await self.clock.sleep_until(at_s, stop)
        interrupt = asyncio.Event()

        async def relay(event: asyncio.Event) -> None:
            await event.wait()
            interrupt.set()

        relays = [asyncio.create_task(relay(stop)), asyncio.create_task(relay(wake))]
        try:
            await self.clock.sleep_until(at_s, interrupt)
        finally:
            for task in relays:
                task.cancel()
        if wake.is_set() and not stop.is_set():
            wake.clear()
            self._not_before_s = float("-inf")
            log.info("%s: the deployment changed; retrying now instead of backing off", self.ref)
        return stop.is_set()

    @property
    def next_wake_s(self) -> float:
        """When the next tick runs: the core's schedule, later while the connector fails."""
        if self.core is None:
            raise RuntimeError("DeploymentLoop.next_wake_s before start()")
        return max(self.core.next_tick_at_s, self._not_before_s)

    async def start(self, stop: asyncio.Event) -> bool:
        """Validate the deployment (retrying with backoff), then build the observers and the
        core. False when ``stop`` was set first."""
        while True:
            if stop.is_set():
                return False
            async with self._startup_gate or contextlib.nullcontext():
                problem = await validate(self.connector, str(self.ref))
                if problem is None:
                    self._failures = 0
                    await self._build()
                    return True
            self._failures += 1
            delay = self._backoff_s()
            log.warning(
                "%s: cannot start: %s; retrying in %.0f s", self.ref, problem.render(), delay
            )
            failed = TickOutcome(t_s=self.clock.now(), problems=(problem,))
            self._count_problems(failed)
            await self._emit(failed)
            if await self._sleep_until(self.clock.now() + delay, stop):
                return False

    async def close(self) -> None:
        """Stop the FPM subscribers this loop started, close the observer and the connector
        (no report is rendered on stop: a spec edit or SIGTERM must not cost a render)."""
        if self.elastic is not None:
            await self.elastic.close()
        for source in self._owned_sources:
            await self._offload(source.stop)
        self._owned_sources.clear()
        close_observer = getattr(self.traffic, "close", None)
        if callable(close_observer):
            close_observer()
        try:
            await self.connector.close()
        except Exception:  # closing must never mask why the loop ended
            log.exception("%s: closing the connector failed", self.ref)

    async def _build(self) -> None:
        cfg = self.config
        model_name = self.connector.model_name
        if cfg.throughput_scaling_active:
            if self._traffic_factory is not None:
                self.traffic = self._traffic_factory(model_name)
            else:
                from disagg_planner.observe.prometheus import PrometheusTrafficObserver

                self.traffic = PrometheusTrafficObserver(cfg, model_name=model_name)
        if cfg.load_scaling_active:
            if self._given_engine_sources is not None:
                self.engine_sources = dict(self._given_engine_sources)
            else:
                self.engine_sources = start_engine_sources(
                    cfg,
                    self.connector,
                    clock=self.clock.now,
                    label=str(self.ref),
                    name=self.ref.name,
                    owned=self._owned_sources,
                )
        self.observations = ObservationBuilder(self.engine_sources)
        try:
            profile = self._profile
            if profile is None and cfg.throughput_scaling_active:
                profile = await self._offload(profile_for, cfg)  # file I/O
            # offloaded (a thread live): a predictor warm-up trace may take seconds to fit
            core = await self._offload(build_core, cfg, start_s=self.clock.now(), profile=profile)
            # The schedule starts once set up: a set-up that waited its turn in the worker
            # threads (a thousand loops starting) must not leave its first ticks already late.
            start_s = self.clock.now()
            if self._stagger_ticks:
                start_s = staggered_start(
                    start_s, key=str(self.ref), period_s=shortest_cadence_s(cfg)
                )
            core.schedule.start(start_s)
            self.core = core
            if cfg.elastic_ep is not None:
                self.elastic = ElasticDriver(cfg, profile=profile, connector=self.connector)
        except Exception as exc:
            if not is_spec_error(exc):
                raise
            problem = Problem(ProblemKind.INVALID_SPEC, type(exc).__name__, str(exc), "spec")
            await self._emit(TickOutcome(t_s=self.clock.now(), problems=(problem,)))
            raise
        if self.elastic is not None:
            self.elastic.start()
        if self.metrics is not None:
            self.metrics.set_slo(
                self.ref.namespace, self.ref.name, ttft_ms=cfg.ttft_ms, itl_ms=cfg.itl_ms
            )
        log.info(
            "%s: planning %s (throughput loop %s, load loop %s)%s",
            self.ref,
            ", ".join(cfg.roles),
            f"every {cfg.throughput_adjustment_interval_seconds:g} s"
            if cfg.throughput_scaling_active
            else "off",
            f"every {cfg.load_adjustment_interval_seconds:g} s"
            if cfg.load_scaling_active
            else "off",
            " [ADVISORY: replicas are never changed]" if cfg.advisory else "",
        )

    # --- ticking ----------------------------------------------------------------------------

    async def _tick_or_stop(self, stop: asyncio.Event) -> None:
        """Run one tick; if ``stop`` is set meanwhile, give it a short grace, then cancel it
        (a blocking API call must not hold up a SIGTERM)."""
        tick = asyncio.create_task(self.tick(), name=f"tick {self.ref}")
        stopped = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({tick, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not tick.done():
                await asyncio.wait({tick}, timeout=self._shutdown_grace_s)
            if not tick.done():
                log.warning("%s: stopping in the middle of a tick", self.ref)
                tick.cancel()
            await asyncio.gather(tick, return_exceptions=True)
        finally:
            stopped.cancel()
            if not tick.done():  # we were cancelled ourselves: take the tick along
                tick.cancel()

    async def tick(self) -> TickOutcome | None:
        """Run the tick due now, if any. Never raises except for cancellation."""
        if self.core is None:
            raise RuntimeError("DeploymentLoop.tick() before start()")
        now = self.clock.now()
        due = self.core.due(now)
        if due is None:
            return None
        self.ticks += 1
        try:
            outcome = await self._tick(now, due)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if self._raise_tick_errors:
                raise
            log.exception("%s: tick at %.3f failed; the next tick runs as scheduled", self.ref, now)
            problem = Problem(ProblemKind.TICK_FAILED, type(exc).__name__, str(exc), "tick")
            outcome = TickOutcome(
                t_s=now,
                ran_throughput=due.run_throughput,
                ran_load=due.run_load,
                problems=(problem,),
                message=f"tick failed: {type(exc).__name__}: {exc}",
                advisory=self.config.advisory,
            )
        self._count_problems(outcome)
        await self._emit(outcome)
        return outcome

    async def _tick(self, now: float, due: DueTick) -> TickOutcome:
        assert self.core is not None
        core = self.core
        problems: list[Problem] = []
        self.observations.learn(core)  # every iteration since the last tick, not only at ticks
        status = await read_status(self.connector, problems)
        traffic: TrafficObservation | MissingObservation | None = None
        if due.traffic_window is not None and self.traffic is not None:
            traffic = await self._observe(due.traffic_window, problems)
            self._traffic_problem = next(
                (p for p in problems if p.kind is ProblemKind.TRAFFIC_MISSING), None
            )
        elif self._traffic_problem is not None:
            # Traffic is read on throughput ticks only: an outage stands until the next one
            # reads it again, so load-only ticks in between do not clear Degraded.
            problems.append(self._traffic_problem)
        recent: TrafficObservation | MissingObservation | None = None
        if due.fast_window is not None and self.traffic is not None:
            # The fast check's own outage is the core's hold reason; the throughput tick
            # reports the traffic problem (a 15 s cadence would flood the problem counters).
            recent = await self._observe(due.fast_window, [])
        observation, engines = self.observations.observation(
            now, due, status=status, traffic=traffic, recent=recent
        )
        effects = core.tick(now, observation)
        elastic: ElasticTick | None = None
        if self.elastic is not None:
            effects = self._without_elastic_role(effects, status)
            if traffic is not None:
                queued = queued_prefill_tokens(observation, roles=(self.elastic.role,))
                elastic = await self.elastic.tick(now, traffic, status, problems, queued)
        applied, holds = await apply_scale(
            self.connector, effects, status, problems, advisory=self.config.advisory
        )
        held = held_reasons(holds)
        decided = decided_throughput_reason(effects, holds)
        tp_reason = decided.value if decided is not None else None
        load_reason = effects.load_reason.value if effects.load_reason else None

        status_ok = status if isinstance(status, DeploymentStatus) else None
        traffic_ok = traffic if isinstance(traffic, TrafficObservation) else None
        gpu_hours = self._account_gpu_hours(now, status_ok)
        self._track_failures(now, problems)
        message = effects.message
        if held:
            message += f" | held: {', '.join(f'{r} ({why})' for r, why in held.items())}"
        extra: dict[str, object] = {
            "applied": applied,
            "held": held,
            "problems": [p.render() for p in problems],
        }
        if elastic is not None and self.elastic is not None:
            message += " | " + elastic.render(self.elastic.role, advisory=self.config.advisory)
            extra["elastic"] = elastic.as_extra()
        snapshot = build_snapshot(
            t_s=now,
            status=status_ok,
            gpu_hours=gpu_hours,
            effects=effects,
            traffic=traffic_ok,
            throughput_reason=tp_reason,
            load_reason=load_reason,
            message=message,
            engines=engine_queues(engines),
            extra=extra,
        )
        outcome = TickOutcome(
            t_s=now,
            ran_throughput=due.run_throughput,
            ran_load=due.run_load,
            status=status_ok,
            traffic=traffic_ok,
            effects=effects,
            throughput_reason=tp_reason,
            load_reason=load_reason,
            scale_to=dict(effects.scale_to) if effects.scale_to else None,
            applied=applied,
            held=held,
            problems=tuple(problems),
            message=message,
            advisory=self.config.advisory,
            snapshot=snapshot,
            elastic=elastic.decision if elastic is not None else None,
        )
        self._publish(outcome)
        if self.recorder is not None:
            try:
                await self._offload(self.recorder.record, snapshot)
            except OSError as exc:
                log.warning("%s: could not write the diagnostics report: %s", self.ref, exc)
        if self.health is not None and outcome.observed_ok and not self.health.ready:
            self.health.mark_ready()
            log.info("%s: first successful observation; ready", self.ref)
        if log.isEnabledFor(self._tick_log_level):  # replay ticks thousands of times
            log.log(self._tick_log_level, "%s", summary_line(outcome, str(self.ref)))
        return outcome

    async def _observe(
        self, window: TrafficWindow, problems: list[Problem]
    ) -> TrafficObservation | MissingObservation:
        assert self.traffic is not None
        return await observe_traffic(
            self.traffic, window, problems, offload=self._offload, label=str(self.ref)
        )

    def _without_elastic_role(
        self, effects: Effects, status: DeploymentStatus | MissingObservation
    ) -> Effects:
        """The core's effects without a replica target for the elastic role: its capacity
        moves by DP size, and a replica change would fight the resize."""
        assert self.elastic is not None
        role = self.elastic.role
        if not effects.scale_to or role not in effects.scale_to:
            return effects
        wanted = effects.scale_to[role]
        current = status.desired(role) if isinstance(status, DeploymentStatus) else None
        if wanted != current:
            log.log(
                self._tick_log_level,  # once a tick: replay's ticks log at DEBUG
                "%s: not scaling %s to %d replicas: it is the elastic-EP role, whose capacity "
                "changes by data-parallel size",
                self.ref,
                role,
                wanted,
            )
        rest = {r: n for r, n in effects.scale_to.items() if r != role}
        return replace(effects, scale_to=rest or None)

    # --- bookkeeping ------------------------------------------------------------------------

    def _account_gpu_hours(self, now: float, status: DeploymentStatus | None) -> float:
        """Cumulative GPU-hours: the GPUs seen at the previous tick times the time since."""
        if self._last_gpu_sample is not None:
            then, gpus = self._last_gpu_sample
            self._gpu_hours += gpus * max(0.0, now - then) / 3600.0
        if status is not None:
            self._last_gpu_sample = (now, status.gpus_in_use)
        elif self._last_gpu_sample is not None:
            self._last_gpu_sample = (now, self._last_gpu_sample[1])
        return self._gpu_hours

    def _track_failures(self, now: float, problems: list[Problem]) -> None:
        """Back off while the connector keeps failing: the first failure keeps the cadence,
        each further one doubles the pause (from the shortest loop interval)."""
        failed = any(
            p.kind in (ProblemKind.CONNECTOR_ERROR, ProblemKind.DEPLOYMENT_INVALID)
            for p in problems
        )
        if not failed:
            self._failures = 0
            self._not_before_s = float("-inf")
            return
        self._failures += 1
        if self._failures >= 2:
            self._not_before_s = now + self._backoff_s()

    def _backoff_s(self) -> float:
        exponent = max(0, self._failures - 1)
        return float(min(self._base_backoff_s * 2.0**exponent, MAX_BACKOFF_S))

    def _count_problems(self, outcome: TickOutcome) -> None:
        if self.metrics is None:
            return
        for problem in outcome.problems:
            self.metrics.observation_failures.labels(
                self.ref.namespace, self.ref.name, problem.source or "tick", problem.reason
            ).inc()

    def _publish(self, outcome: TickOutcome) -> None:
        if self.metrics is None or outcome.snapshot is None:
            return
        self.metrics.publish(self.ref.namespace, self.ref.name, outcome.snapshot)
        for role, source in self.engine_sources.items():
            for kind, total in source.dropped.items():
                before = self._dropped_seen.get((role, kind), 0)
                if total > before:
                    self.metrics.fpm_dropped.labels(self.ref.namespace, self.ref.name, kind).inc(
                        total - before
                    )
                self._dropped_seen[(role, kind)] = total

    async def _emit(self, outcome: TickOutcome) -> None:
        self.last_outcome = outcome
        log_audit(
            outcome, namespace=self.ref.namespace, name=self.ref.name, level=self._tick_log_level
        )
        if self._on_outcome is None:
            return
        try:
            await self._on_outcome(outcome)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s: the outcome hook failed", self.ref)
