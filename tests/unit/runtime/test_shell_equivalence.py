"""The live loop and replay's shell decide alike on the same observations.

One scripted deployment (traffic at the frontend, one ForwardPassMetrics per engine per
second, replicas that start after a delay) is driven twice from scratch:

- live: :class:`DeploymentLoop` on the script's clock, an in-memory connector, a
  Prometheus stand-in that scrapes the frontend every second, and an FPM stream that hands
  the loop every report (busy time is then the sum of their ``wall_time``), as the ZMQ
  subscriber does (:class:`FpmStream`);
- replay: :class:`PlannerPolicy` driven as the replay runner drives it, on the simulated
  connector and sources of :mod:`disagg_planner.replay.connector` (one FPM sample per engine
  per second, busy time read from the engines, traffic from frontend snapshots).

Every tick must carry the same time, target, reasons and message (the message quotes the
estimates and busy shares, so it says the observations were the same too).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from disagg_planner.connectors.base import ConnectorDefaults, Hold, ScaleOutcome
from disagg_planner.core.load_scaling import EngineKey
from disagg_planner.core.types import (
    DeploymentStatus,
    MissingObservation,
    RoleStatus,
    TrafficObservation,
)
from disagg_planner.observe.window import Snapshot, snapshot_from_text, traffic_from_snapshots
from disagg_planner.profiles import Profile
from disagg_planner.replay.connector import SimulatedConnector
from disagg_planner.replay.policies import PlannerPolicy
from disagg_planner.runtime import observation
from disagg_planner.runtime.loop import DeploymentLoop, DeploymentRef
from disagg_planner.signals.fpm import ForwardPassMetrics
from disagg_planner.simulator.metrics import FrontendMetrics
from tests.unit.regression.fpm_factory import decode_law, fpm, prefill_law
from tests.unit.runtime.conftest import loop_config
from tests.unit.runtime.fpm_stream import FpmStream

ROLES = ("prefill", "decode")
STARTUP_S = 20.0
END_S = 360.0
MODEL = "scripted-model"
NAMESPACE = "dynamo"


def prefill_tokens_per_s(t: float) -> float:
    """Prompt tokens the prefill pool computes each second: busy, then quiet."""
    return 36_000.0 if t < 200 else 3_000.0


def decode_requests(t: float) -> int:
    """Requests in flight on the decode pool: a surge between 120 s and 320 s."""
    return 360 if 120 <= t < 320 else 60


def request_rate(t: float) -> int:
    return 2 if t < 300 else 1


@dataclass
class Engine:
    worker_id: str
    dp_rank: int = 0
    busy_time_s: float = 0.0
    counter: int = 1000  # past the warm-up iterations, as a long-running engine's
    latest: ForwardPassMetrics | None = None


@dataclass
class ScriptedDeployment:
    """A deployment whose load follows the script, one engine per ready replica; scale-ups
    are ready ``STARTUP_S`` later, scale-downs at once. What both shells observe."""

    now: float = 0.0
    roles: tuple[str, ...] = ROLES
    frontend: FrontendMetrics = field(
        default_factory=lambda: FrontendMetrics(model=MODEL, namespace=NAMESPACE)
    )
    desired: dict[str, int] = field(default_factory=lambda: {"prefill": 2, "decode": 1})
    live: dict[str, list[Engine]] = field(default_factory=dict)
    starting: list[tuple[float, str]] = field(default_factory=list)  # (ready at, role)
    on_report: list[Callable[[str, ForwardPassMetrics, float], None]] = field(default_factory=list)
    on_second: list[Callable[[float], None]] = field(default_factory=list)
    _ids: itertools.count = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        self.live = {r: [self._engine(r) for _ in range(n)] for r, n in self.desired.items()}

    def _engine(self, role: str) -> Engine:
        return Engine(f"{role}-{next(self._ids)}")

    # --- the part of a Cluster both shells read -----------------------------------------
    def desired_replicas(self, role: str) -> int:
        return self.desired[role]

    def ready_replicas(self, role: str) -> int:
        return len(self.live[role])

    def gpus_per_replica(self, role: str) -> int:
        return 1

    def set_replicas(self, role: str, n: int) -> None:
        self.desired[role] = n
        del self.live[role][n:]
        self.starting = [s for s in self.starting if s[1] != role]
        for _ in range(n - len(self.live[role])):
            self.starting.append((self.now + STARTUP_S, role))

    def latest_fpm(self, role: str) -> dict[EngineKey, ForwardPassMetrics]:
        return {(e.worker_id, e.dp_rank): e.latest for e in self.live[role] if e.latest}

    def engines(self, role: str) -> list[Engine]:
        return list(self.live[role])

    # --- the script ---------------------------------------------------------------------
    def advance_to(self, t: float) -> None:
        for second in range(int(self.now) + 1, int(t) + 1):
            self._second(float(second))
        self.now = t

    def _second(self, t: float) -> None:
        for ready_at, role in [s for s in self.starting if s[0] <= t]:
            self.starting.remove((ready_at, role))
            self.live[role].append(self._engine(role))
        pool = {r: max(1, len(e)) for r, e in self.live.items()}
        for role, engines in self.live.items():
            for i, engine in enumerate(engines):
                report = self._report(role, engine, t, pool[role], i)
                engine.latest = report
                engine.counter += 1
                engine.busy_time_s += report.wall_time
                for listener in self.on_report:
                    listener(role, report, t)
        for _ in range(request_rate(t)):
            self.frontend.on_started()
            self.frontend.on_first_token(0.08, 3000)
            self.frontend.itl.observe(0.02, 149)
            self.frontend.on_finished(3.0, 150)
        for second_listener in self.on_second:
            second_listener(t)

    @staticmethod
    def _report(role: str, engine: Engine, t: float, pool: int, i: int) -> ForwardPassMetrics:
        wobble = (int(t) + 3 * i) % 7 - 3  # spread the regression's samples
        if role == "prefill":
            tokens = int(prefill_tokens_per_s(t) / pool) + 200 * wobble
            return fpm(
                worker=engine.worker_id,
                counter=engine.counter,
                wall=prefill_law(tokens),
                prefill_reqs=1,
                prefill_tokens=tokens,
                queued_prefill_tokens=400,
            )
        num = max(1, decode_requests(t) // pool + 2 * wobble)
        kv = num * (2000 + (500 if int(t) % 2 else -500))
        return fpm(
            worker=engine.worker_id,
            counter=engine.counter,
            wall=decode_law(num, kv),
            decode_reqs=num,
            decode_kv=kv,
        )


# --- the live side's stand-ins for Kubernetes, Prometheus and the ZMQ subscriber -----------


class MemoryConnector(ConnectorDefaults):
    def __init__(self, world: ScriptedDeployment) -> None:
        self.world = world

    @property
    def model_name(self) -> str | None:
        return MODEL

    async def validate(self) -> None:
        return None

    async def status(self) -> DeploymentStatus:
        w = self.world
        return DeploymentStatus(
            {r: RoleStatus(w.desired[r], ready=len(w.live[r]), gpus_per_replica=1) for r in ROLES}
        )

    async def set_replicas(
        self, replicas: Mapping[str, int], *, blocking: bool = False
    ) -> ScaleOutcome:
        applied = {r: n for r, n in replicas.items() if n != self.world.desired[r]}
        for role, n in applied.items():
            self.world.set_replicas(role, n)
        return ScaleOutcome(requested=dict(replicas), applied=applied)

    def holds(self) -> dict[str, Hold]:
        return {}

    async def close(self) -> None:
        return None


class ScrapedTraffic:
    """Prometheus over the frontend: a scrape every second, ``increase()`` between the
    scrapes at a window's ends."""

    def __init__(self, world: ScriptedDeployment) -> None:
        self.world = world
        self.scrapes: dict[float, Snapshot] = {}
        self.scrape(world.now)
        world.on_second.append(self.scrape)

    def scrape(self, t: float) -> None:
        self.scrapes[t] = snapshot_from_text(self.world.frontend.render_prometheus_text())

    def observe(
        self, *, end_s: float | None = None, duration_s: float | None = None
    ) -> TrafficObservation | MissingObservation:
        assert end_s is not None and duration_s is not None
        return traffic_from_snapshots(
            start=self.scrapes[round(end_s - duration_s)],
            end=self.scrapes[round(end_s)],
            start_s=end_s - duration_s,
            end_s=end_s,
            model_name=MODEL,
            namespace=NAMESPACE,
        )


class ScriptClock:
    def __init__(self, world: ScriptedDeployment) -> None:
        self.world = world

    def now(self) -> float:
        return self.world.now

    async def sleep(self, seconds: float) -> None:
        raise AssertionError("the loop must not wait inside a tick")

    async def sleep_until(self, at_s: float, stop: asyncio.Event) -> bool:
        raise AssertionError("the test drives the ticks")


# --- the two shells ------------------------------------------------------------------------


Decision = tuple[float, dict[str, int] | None, str, str]


def config() -> Any:
    return loop_config(
        enable_load_scaling=True,
        load_adjustment_interval_seconds=5.0,
        ttft_ms=500.0,
        itl_ms=50.0,
        # the replicas found at start count as a need for one window: a short one lets the
        # 360 s script reach the scale-downs the comparison covers
        scale_down_stabilization_seconds=120.0,
    )


async def live_decisions(profile: Profile) -> list[Decision]:
    world = ScriptedDeployment()
    # every report as it is published; an engine silent for over a second (it reports every
    # second) is gone, as the subscriber's staleness filter would say
    streams = {role: FpmStream(silent_after_s=1.5) for role in ROLES}
    world.on_report.append(lambda role, report, t: streams[role].publish(report, t=t))
    loop = DeploymentLoop(
        config(),
        connector=MemoryConnector(world),
        ref=DeploymentRef(NAMESPACE, "live"),
        clock=ScriptClock(world),
        profile=profile,
        traffic_factory=lambda _model: ScrapedTraffic(world),
        engine_sources=streams,
    )
    assert await loop.start(asyncio.Event())
    out: list[Decision] = []
    while loop.next_wake_s <= END_S:
        world.advance_to(loop.next_wake_s)
        outcome = await loop.tick()
        assert outcome is not None and outcome.problems == (), outcome
        reason = "/".join(r for r in (outcome.throughput_reason, outcome.load_reason) if r)
        out.append((outcome.t_s, outcome.scale_to, reason, outcome.message))
    await loop.close()
    return out


def replay_decisions(profile: Profile) -> list[Decision]:
    world = ScriptedDeployment()
    policy = PlannerPolicy(name="replay", config=config(), profile=profile)
    policy.start(world, SimulatedConnector(world))
    out: list[Decision] = []
    while policy.next_wakeup_s() <= END_S:
        world.advance_to(policy.next_wakeup_s())
        step = policy.wake(world)
        if step.reason != "sample":
            out.append((step.t_s, step.scale_to, step.reason, step.message))
    policy.close()
    return out


def summary(decisions: list[Decision]) -> list[tuple[float, dict[str, int] | None, str]]:
    return [d[:3] for d in decisions]


@pytest.mark.slow
async def test_live_and_replay_take_the_same_decisions(profile: Profile) -> None:
    live = await live_decisions(profile)
    replay = replay_decisions(profile)

    assert summary(replay) == summary(live)
    assert replay == live  # messages too: the same estimates and busy shares
    # the script makes every kind of decision the comparison should cover
    reasons = {r for _, _, reason, _ in live for r in reason.split("/")}
    assert {"scale", "scale_up", "scale_down", "scale_down_refused_consolidation"} <= reasons
    assert sum(1 for d in live if d[1]) >= 3


@pytest.mark.slow
async def test_the_comparison_fails_when_one_shell_measures_busy_time_differently(
    profile: Profile, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The test would prove nothing if it could not fail: one shell with a shorter busy
    # window lets the prefill pool shrink sooner after the load drops.
    live = await live_decisions(profile)
    monkeypatch.setattr(observation, "BUSY_WINDOW_S", 10.0)
    replay = replay_decisions(profile)

    assert summary(replay) != summary(live)
