"""The state of a simulated cluster and what its engines and its router need from it.

:class:`ClusterCore` holds the replicas and their ranks, the event heap, the frontend's
metrics and the requests' outcomes; it is the engines' :class:`EngineSink` (an iteration's
end is an event, a request leaving an engine goes on to the KV transfer or finishes) and the
router (round-robin or least-loaded over the ready, unpaused ranks of a role). What moves the
cluster in time (arrivals, scaling, drains, elastic-EP resizes) is
:class:`~disagg_planner.simulator.cluster.Cluster`, built on it.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal

from disagg_planner.signals.fpm import ForwardPassMetrics
from disagg_planner.simulator import catalogue, elastic_ep, startup
from disagg_planner.simulator.engine_model import EngineCapabilities, EngineModel
from disagg_planner.simulator.engine_spec import EngineSpec, coerce
from disagg_planner.simulator.engines import engine_for
from disagg_planner.simulator.errors import SimulatorInputError
from disagg_planner.simulator.metrics import FrontendMetrics
from disagg_planner.simulator.replica import DEFAULT_DRAIN_GRACE_S, Replica, ReplicaState
from disagg_planner.simulator.request import RequestRecord, SimRequest
from disagg_planner.simulator.scheduler import EngineCore, FpmCallback, Role
from disagg_planner.simulator.shutdown import ShutdownSettings

Mode = Literal["disagg", "agg"]
RouterPolicy = Literal["round_robin", "least_loaded"]
ROLES_BY_MODE: dict[str, tuple[Role, ...]] = {"disagg": ("prefill", "decode"), "agg": ("agg",)}
DEFAULT_KV_TRANSFER_BPS = 64e9  # Dynamo mocker default ("inter-node InfiniBand")

EV_ENGINE, EV_DISPATCH, EV_KV_DONE, EV_READY, EV_RESIZE, EV_TIMEOUT, EV_GRACE, EV_SHUTDOWN = range(
    8
)


class ClusterCore:
    """A cluster's state, its engines' sink and its router (see the module doc); the
    parameters are :class:`~disagg_planner.simulator.cluster.Cluster`'s."""

    def __init__(
        self,
        *,
        engines: Mapping[str, EngineSpec | str],
        mode: Mode = "disagg",
        replicas: Mapping[str, int] | None = None,
        startup_delay_s: float | Mapping[str, float | None] | None = None,
        drain_grace_s: float | None = DEFAULT_DRAIN_GRACE_S,
        migrate_on_drain: bool = False,
        router: RouterPolicy = "round_robin",
        seed: int = 0,
        kv_transfer_bandwidth_bps: float = DEFAULT_KV_TRANSFER_BPS,
        model_label: str | None = None,
        namespace: str = "dynamo",
        frontend_latency_s: float | None = None,
        request_timeout_s: float | None = None,
        on_fpm: FpmCallback | None = None,
        on_record: Callable[[RequestRecord], None] | None = None,
        prefix_block_tokens: int = 512,
        bulk_decode: bool = True,
        retry_paused: bool = True,
        worker_shutdown: ShutdownSettings | None = None,
    ) -> None:
        if mode not in ROLES_BY_MODE:
            raise SimulatorInputError(f"mode {mode!r}: expected 'disagg' or 'agg'")
        roles = ROLES_BY_MODE[mode]
        if set(engines) != set(roles):
            raise SimulatorInputError(
                f"engines: mode {mode!r} needs exactly the roles {list(roles)}, "
                f"got {sorted(engines)}"
            )
        if router not in ("round_robin", "least_loaded"):
            raise SimulatorInputError(
                f"router {router!r}: expected 'round_robin' or 'least_loaded'"
            )
        if kv_transfer_bandwidth_bps <= 0:
            raise SimulatorInputError(
                f"kv_transfer_bandwidth_bps={kv_transfer_bandwidth_bps}: must be > 0"
            )
        self.mode: Mode = mode
        self.roles: tuple[Role, ...] = roles
        self._specs: dict[Role, EngineSpec] = {r: coerce(engines[r]) for r in roles}
        self._models: dict[Role, EngineModel] = {r: engine_for(s) for r, s in self._specs.items()}
        self._shortest_context = min(m.max_model_len for m in self._models.values())
        delays: dict[str, float | None]
        if isinstance(startup_delay_s, Mapping):
            delays = {r: startup_delay_s.get(r) for r in roles}
        else:
            delays = dict.fromkeys(roles, startup_delay_s)
        for r, d in delays.items():
            if d is not None and (d < 0 or not math.isfinite(d)):
                raise SimulatorInputError(f"startup_delay_s[{r}]={d}: must be finite and >= 0")
        specs: dict[str, EngineSpec] = {str(r): s for r, s in self._specs.items()}
        self._startup = startup.StartupSampler(delays, specs, seed=seed)
        if drain_grace_s is not None and (drain_grace_s < 0 or not math.isfinite(drain_grace_s)):
            raise SimulatorInputError(
                f"drain_grace_s={drain_grace_s}: must be finite and >= 0 (None: no limit)"
            )
        self.drain_grace_s = drain_grace_s
        self.migrate_on_drain = migrate_on_drain
        # requests taken off a replica whose grace period ended, waiting for another one
        self._migrating: dict[Role, deque[SimRequest]] = {r: deque() for r in roles}
        self.cancelled_at_drain = 0
        self.migrated_at_drain = 0
        # Dynamo's staged shutdown of a removed worker (simulator/shutdown.py); None: it
        # drains until empty or the grace period (older releases' model)
        self.worker_shutdown = worker_shutdown
        # KV transfers still reading from each prefill worker (its requests' KV in flight)
        self._kv_out: dict[str, int] = {}
        # vLLM aborts a shrink's removed ranks' requests (elastic_ep.SHRINK_ABORTED); an engine
        # that drains first (VLLM_ELASTIC_EP_DRAIN_REQUESTS) lets them finish.
        self.shrink_drains_first = False
        self.aborted_at_shrink = 0
        self.router: RouterPolicy = router
        self.seed = seed
        self._rng = random.Random(seed)
        self.kv_transfer_bandwidth_bps = float(kv_transfer_bandwidth_bps)
        first_model = self._specs[roles[-1]].model.name
        self.frontend = FrontendMetrics(
            model=model_label or first_model,
            namespace=namespace,
            speculative=any(s.num_speculative_tokens for s in self._specs.values()),
        )
        eff = catalogue.efficiency()
        self.frontend_latency_s = (
            eff.ttft_overhead_s if frontend_latency_s is None else float(frontend_latency_s)
        )
        self.request_timeout_s = request_timeout_s
        self.on_fpm = on_fpm
        self.on_record = on_record
        self.prefix_block_tokens = prefix_block_tokens
        self.bulk_decode = bulk_decode
        # the frontend retries what a paused engine answers 503 (else those requests fail;
        # see the module doc)
        self.retry_paused = retry_paused
        self.rejected_in_pause = 0

        self.records: list[RequestRecord] = []
        self.replicas: list[Replica] = []
        self._desired: dict[Role, int] = dict.fromkeys(roles, 0)
        self._counter: dict[Role, int] = dict.fromkeys(roles, 0)
        self._targets: dict[Role, list[EngineCore] | None] = dict.fromkeys(roles)
        self._rr: dict[Role, int] = dict.fromkeys(roles, 0)
        self._frontend_queue: dict[Role, deque[SimRequest]] = {r: deque() for r in roles}
        self._heap: list[tuple[float, int, int, Any, Any]] = []
        self._seq = 0
        self._now = 0.0
        self._sources: list[tuple[float, int, Any, Iterator[Any], int]] = []
        self._source_count = 0
        self._next_rid = 0
        self.submitted = 0
        self.failed = 0
        self._engine_of_replica: dict[int, Replica] = {}
        self._resize_log: list[elastic_ep.ResizePlan] = []
        self._resize_models: dict[str, EngineModel] = {}

        initial = dict(replicas) if replicas is not None else dict.fromkeys(roles, 1)
        unknown = set(initial) - set(roles)
        if unknown:
            raise SimulatorInputError(
                f"replicas: unknown roles {sorted(unknown)} for mode {mode!r}"
            )
        for role in roles:
            n = int(initial.get(role, 0))
            if n < 0:
                raise SimulatorInputError(f"replicas[{role}]={n}: must be >= 0")
            for _ in range(n):
                self._add_replica(role, ready_now=True)
            self._desired[role] = n

    # ------------------------------------------------------------------------------------------
    # Public views
    @property
    def now(self) -> float:
        """Current virtual time in seconds."""
        return self._now

    def engine_spec(self, role: str) -> EngineSpec:
        return self._specs[self._role(role)]

    def engine_model(self, role: str) -> EngineModel:
        return self._models[self._role(role)]

    def capabilities(self, role: str) -> EngineCapabilities:
        return self._models[self._role(role)].capabilities

    def gpus_per_replica(self, role: str) -> int:
        return self._specs[self._role(role)].gpus

    def desired_replicas(self, role: str) -> int:
        return self._desired[self._role(role)]

    def ready_replicas(self, role: str) -> int:
        r = self._role(role)
        return sum(1 for x in self.replicas if x.role == r and x.state is ReplicaState.READY)

    def replica_counts(self, role: str) -> dict[str, int]:
        """Replicas of ``role`` by state (starting, ready, draining)."""
        r = self._role(role)
        out = {s.value: 0 for s in ReplicaState if s is not ReplicaState.STOPPED}
        for x in self.replicas:
            if x.role == r and x.state is not ReplicaState.STOPPED:
                out[x.state.value] += 1
        return out

    @property
    def gpu_seconds(self) -> float:
        """GPU-seconds consumed so far by every replica (startup and drain included)."""
        return sum(r.gpu_seconds(self._now) for r in self.replicas)

    def gpu_seconds_by_role(self) -> dict[str, float]:
        out: dict[str, float] = dict.fromkeys(self.roles, 0.0)
        for r in self.replicas:
            out[r.role] += r.gpu_seconds(self._now)
        return out

    def gpus_in_use(self) -> int:
        now = self._now
        return sum(r.gpus_at(now) for r in self.replicas if r.state is not ReplicaState.STOPPED)

    @property
    def in_flight(self) -> int:
        """Requests that arrived and have not finished or failed."""
        return self.submitted - len(self.records)

    @property
    def idle(self) -> bool:
        """No request pending, in flight or still to arrive."""
        return not self._sources and self.in_flight == 0

    def engines(self, role: str | None = None) -> list[EngineCore]:
        """Every live rank (of ``role``), in replica order."""
        r = None if role is None else self._role(role)
        return [
            e
            for x in self.replicas
            if x.state is not ReplicaState.STOPPED and (r is None or x.role == r)
            for e in x.ranks
        ]

    def latest_fpm(self, role: str | None = None) -> dict[tuple[str, int], ForwardPassMetrics]:
        """The latest ForwardPassMetrics of every live rank, keyed ``(worker_id, dp_rank)``."""
        out: dict[tuple[str, int], ForwardPassMetrics] = {}
        for e in self.engines(role):
            fpm = e.latest_fpm()
            if fpm is not None:
                out[(e.worker_id, e.dp_rank)] = fpm
        return out

    @property
    def resizes(self) -> list[elastic_ep.ResizePlan]:
        return list(self._resize_log)

    def _role(self, role: str) -> Role:
        if role not in self.roles:
            raise SimulatorInputError(
                f"role {role!r}: this {self.mode} cluster has {list(self.roles)}"
            )
        return role

    def _push(self, t: float, kind: int, obj: Any, arg: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, obj, arg))

    # -- EngineSink
    def schedule(self, time_s: float, engine: EngineCore, token: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (time_s, self._seq, EV_ENGINE, engine, token))

    # ------------------------------------------------------------------------------------------
    # Routing
    def _paused(self, role: Role) -> bool:
        """Whether a ready engine of ``role`` is paused by a resize (it answers 503)."""
        return any(
            x.paused for x in self.replicas if x.role == role and x.state is ReplicaState.READY
        )

    def _send(self, req: SimRequest, engine: EngineCore, now: float) -> None:
        if engine.role == "decode":
            req.decode_worker = engine.worker_id
            req.prompt_len = req.isl
            req.gen_base = 0
            req.generated = 0
            # The transferred KV covers the prompt but its last token, which the decode
            # engine recomputes to sample the first output token.
            req.computed = req.isl - 1
            req.remote_kv = True
            # with speculative decoding, fewer iterations than tokens
            req.target = engine.model.spec.decode_iterations(req.osl)
        elif engine.role == "prefill":
            req.prefill_worker = engine.worker_id
            req.target = 1
        else:
            req.prefill_worker = req.decode_worker = engine.worker_id
            req.target = engine.model.spec.decode_iterations(req.osl)
        req.dispatch_s = now
        engine.add(req, now)

    def _pick(self, role: Role) -> EngineCore | None:
        targets = self._targets[role]
        if targets is None:
            targets = [
                e
                for x in self.replicas
                if x.role == role and x.state is ReplicaState.READY and not x.paused
                for e in x.ranks
            ]
            self._targets[role] = targets
        if not targets:
            return None
        if self.router == "round_robin":
            i = self._rr[role] % len(targets)
            self._rr[role] = i + 1
            return targets[i]
        best = targets[0]
        best_load = best.load()
        for e in targets[1:]:
            load = e.load()
            if load < best_load:
                best, best_load = e, load
        return best

    # EngineSink
    def on_first_token(self, req: SimRequest, time_s: float) -> None:
        self.frontend.on_first_token(time_s - req.arrival_s, req.isl, req.cached_tokens)

    def on_leave(self, engine: EngineCore, req: SimRequest, time_s: float) -> None:
        if engine.role == "prefill":
            # The prefill engine's sampled token is discarded; the decode engine streams all.
            delay = req.isl * self._models["prefill"].kv_bytes_per_token
            delay /= self.kv_transfer_bandwidth_bps
            self._push(time_s + delay, EV_KV_DONE, req)
            self._kv_out[engine.worker_id] = self._kv_out.get(engine.worker_id, 0) + 1
        else:
            if engine.model.spec.num_speculative_tokens:
                self.frontend.on_decoded(req.osl, req.target)
            self._finish(req, time_s)
        replica = self._engine_of_replica.get(id(engine))
        if replica is not None and replica.state is ReplicaState.DRAINING and replica.is_empty():
            self._emptied(replica, time_s)

    def _emptied(self, replica: Replica, now: float) -> None:
        """A draining replica served its last request: it stops (the Cluster's staged
        shutdown goes on to its next stage instead)."""
        self._stop(replica, now)

    def _record(self, record: RequestRecord) -> None:
        self.records.append(record)
        if self.on_record is not None:
            self.on_record(record)

    def _finish(self, req: SimRequest, now: float) -> None:
        self.frontend.on_finished(now - req.arrival_s, req.osl)
        self._record(RequestRecord.served(req, now))

    def _fail(self, req: SimRequest, now: float, error: str) -> None:
        self.failed += 1
        self.frontend.on_finished(now - req.arrival_s, 0)
        self._record(
            RequestRecord(
                request_id=req.rid,
                arrival_s=req.arrival_s,
                isl=req.isl,
                osl=req.osl,
                first_token_s=None,
                finish_s=now,
                ttft_ms=None,
                itl_ms=None,
                ok=False,
                error=error,
            )
        )

    def _stop(self, replica: Replica, now: float) -> None:
        replica.state = ReplicaState.STOPPED
        replica.stop_s = now
        self._targets[replica.role] = None
        for e in replica.ranks:
            self._engine_of_replica.pop(id(e), None)

    def _add_replica(self, role: Role, *, ready_now: bool) -> Replica:
        spec = self._specs[role]
        index = self._counter[role]
        self._counter[role] += 1
        now = self._now
        plan = None if ready_now else self._startup.plan(role)
        delay = 0.0 if plan is None else plan.total_s
        segments = [(now, spec.gpus)]
        if plan is not None and plan.gpu_hold_offset_s > 0:
            # a pending pod holds no GPU yet (startup module doc)
            segments = [(now, 0), (now + plan.gpu_hold_offset_s, spec.gpus)]
        replica = Replica(
            role=role,
            worker_id=f"{role}-{index}",
            spec=spec,
            model=self._models[role],
            state=ReplicaState.READY if ready_now else ReplicaState.STARTING,
            start_s=now,
            ready_s=now + delay,
            gpu_segments=segments,
            startup_plan=plan,
        )
        replica.ranks = [self._make_rank(replica, rank) for rank in range(spec.dp)]
        self.replicas.append(replica)
        if ready_now:
            self._targets[role] = None
        else:
            self._push(now + delay, EV_READY, replica)
        return replica

    def _make_rank(self, replica: Replica, rank: int) -> EngineCore:
        engine = EngineCore(
            model=replica.model,
            role=replica.role,
            worker_id=replica.worker_id,
            dp_rank=rank,
            sink=self,
            itl=self.frontend.itl,
            on_fpm=self.on_fpm,
            prefix_block_tokens=self.prefix_block_tokens,
            bulk_decode=self.bulk_decode,
        )
        self._engine_of_replica[id(engine)] = replica
        return engine


__all__ = [
    "DEFAULT_KV_TRANSFER_BPS",
    "ROLES_BY_MODE",
    "ClusterCore",
    "Mode",
    "RouterPolicy",
]
