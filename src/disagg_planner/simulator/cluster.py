"""A simulated Dynamo deployment: frontend, router, prefill and decode pools, KV transfer.

Request path (disaggregated): arrival -> frontend latency -> router picks a prefill rank ->
prefill (chunked, batched) -> KV transfer ``isl * kv_bytes_per_token / bandwidth`` -> router
picks a decode rank -> the decode engine loads the KV, recomputes the last prompt token and
streams every output token (so TTFT includes the transfer and the first decode pass, as in
vLLM's disaggregated flow). Aggregated mode runs prefill and decode in one engine.

Replicas: ``set_replicas(role, n)`` starts new replicas, which serve after their start-up
(a constant delay, or the phases of :mod:`disagg_planner.simulator.startup`), or removes
replicas: starting ones are cancelled first, then the least-loaded ready ones drain (no new
requests; in-flight ones go on). A drain lasts at most the grace period (60 s by default, as
Dynamo's graceful shutdown); then the replica stops and the requests still on it are
cancelled (failed), or, with migration, re-queued on another replica of the role, which
recomputes their prompt and the tokens generated so far and goes on generating. The GPU
meter counts a replica from the start-up phase that holds GPUs to the end of its drain (or
cancellation). ``resize_dp`` changes one engine's
data-parallel size with the elastic-EP timing of :mod:`disagg_planner.simulator.elastic_ep`
(a grow's follower ranks first start and join, holding their GPUs). While the resize pauses
serving, a request that finds no other engine of the role waits at the frontend and is sent
once the pause ends, the wait counting in its TTFT (``retry_paused``, the default: a frontend
that retries), or with ``retry_paused=False`` is answered 503 as vLLM does: failed, counted
in ``rejected_in_pause`` (replay sets it from ``elastic_ep_frontend_retries``).

Virtual time only advances in :meth:`Cluster.run_until`; everything read after it (frontend
metrics, FPMs, records, GPU-seconds) is exact at that time.
"""

from __future__ import annotations

import enum
import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from disagg_planner.signals.fpm import ForwardPassMetrics
from disagg_planner.simulator import catalogue, elastic_ep, startup
from disagg_planner.simulator.engine_model import EngineCapabilities, EngineModel
from disagg_planner.simulator.engine_spec import EngineSpec, coerce
from disagg_planner.simulator.engines import engine_for
from disagg_planner.simulator.errors import SimulatorInputError, WorkloadError
from disagg_planner.simulator.metrics import FrontendMetrics
from disagg_planner.simulator.request import RequestLike, RequestRecord, SimRequest
from disagg_planner.simulator.scheduler import EngineCore, FpmCallback, Role

Mode = Literal["disagg", "agg"]
RouterPolicy = Literal["round_robin", "least_loaded"]
ROLES_BY_MODE: dict[str, tuple[Role, ...]] = {"disagg": ("prefill", "decode"), "agg": ("agg",)}
DEFAULT_KV_TRANSFER_BPS = 64e9  # Dynamo mocker default ("inter-node InfiniBand")

# Dynamo's graceful shutdown: a removed worker's pod gets 60 s before its requests are ended
DEFAULT_DRAIN_GRACE_S = 60.0
DRAIN_CANCELLED = "cancelled: its replica was removed and the drain grace period ended"

_EV_ENGINE, _EV_DISPATCH, _EV_KV_DONE, _EV_READY, _EV_RESIZE, _EV_TIMEOUT, _EV_GRACE = range(7)


class ReplicaState(enum.StrEnum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"


@dataclass
class Replica:
    """One engine replica: ``dp`` ranks of ``tp`` GPUs each."""

    role: Role
    worker_id: str
    spec: EngineSpec
    model: EngineModel
    state: ReplicaState
    start_s: float
    ready_s: float
    ranks: list[EngineCore] = field(default_factory=list)
    stop_s: float | None = None
    # when it was asked to drain (it serves its running requests and takes no new ones), so a
    # replay's timeline can say at every instant which replicas were starting, ready, draining
    drain_s: float | None = None
    gpu_segments: list[tuple[float, int]] = field(default_factory=list)
    resizing: elastic_ep.ResizePlan | None = None
    paused: bool = False
    # the start-up it went through (None: ready at time 0)
    startup_plan: startup.StartupPlan | None = None

    def startup_phase(self, t: float) -> str | None:
        """The start-up phase at time ``t`` (None when not starting then)."""
        if self.startup_plan is None or not self.start_s <= t < self.ready_s:
            return None
        if self.stop_s is not None and t >= self.stop_s:
            return None
        phase = None
        for name, begin in self.startup_plan.phase_starts(self.start_s):
            if begin > t:
                break
            phase = name
        return phase

    def gpus_at(self, t: float) -> int:
        """GPUs held at time ``t`` (none before the start-up phase that takes them)."""
        held = 0
        for s, gpus in self.gpu_segments:
            if s > t:
                break
            held = gpus
        return held

    def gpu_seconds(self, now: float) -> float:
        end = self.stop_s if self.stop_s is not None else now
        total = 0.0
        for i, (t, gpus) in enumerate(self.gpu_segments):
            t_next = self.gpu_segments[i + 1][0] if i + 1 < len(self.gpu_segments) else end
            total += gpus * max(0.0, min(t_next, end) - t)
        return total

    @property
    def gpus(self) -> int:
        return self.gpu_segments[-1][1] if self.gpu_segments else self.spec.gpus

    def is_empty(self) -> bool:
        return all(r.is_empty for r in self.ranks)


class Cluster:
    """A simulated disaggregated (or aggregated) serving cluster; see the module doc.

    ``engines`` maps each role of the mode (``prefill`` and ``decode``, or ``agg``) to an
    engine spec (object or ``sim:...`` string); ``replicas`` gives the replicas ready at
    time 0 (default one per role). ``startup_delay_s`` (one value or one per role) is the
    constant start-up of a replica added later; ``None`` draws each replica's start-up from
    the phase model of :mod:`disagg_planner.simulator.startup` (seeded by ``seed``).
    ``drain_grace_s`` bounds a removed replica's drain (``None``: no bound, every in-flight
    request finishes); after it, its requests fail, or with ``migrate_on_drain`` move to
    another replica. ``on_fpm`` receives every
    iteration's ForwardPassMetrics (slower; without it only the latest per rank is kept);
    ``on_record`` receives each request's record as it finishes (it may call ``submit``, e.g.
    for a closed-loop client). ``bulk_decode=False`` steps every decode iteration on its own
    (the same results, slower; for validation).
    """

    def __init__(
        self,
        *,
        engines: Mapping[str, EngineSpec | str],
        mode: Mode = "disagg",
        replicas: Mapping[str, int] | None = None,
        startup_delay_s: float | Mapping[str, float | None] | None = 120.0,
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
            delays = {r: startup_delay_s.get(r, 120.0) for r in roles}
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
        # vLLM aborts a shrink's removed ranks' requests (elastic_ep.SHRINK_ABORTED); an engine
        # that drains first (VLLM_ELASTIC_EP_DRAIN_REQUESTS) lets them finish.
        self.shrink_drains_first = False
        self.aborted_at_shrink = 0
        self.router: RouterPolicy = router
        self.seed = seed
        self._rng = random.Random(seed)
        self.kv_transfer_bandwidth_bps = float(kv_transfer_bandwidth_bps)
        first_model = self._specs[roles[-1]].model.name
        self.frontend = FrontendMetrics(model=model_label or first_model, namespace=namespace)
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

    # ------------------------------------------------------------------------------------------
    # Workload
    def submit(self, requests: Iterable[RequestLike]) -> None:
        """Add requests (sorted by ``arrival_s``, seconds from time 0); consumed lazily as
        time advances, so a generator of a long trace costs no memory. Several sources
        are merged by arrival time."""
        it = iter(requests)
        self._source_count += 1
        self._pull(it, self._source_count, previous=-math.inf, index=0)

    def _pull(self, it: Iterator[Any], source: int, *, previous: float, index: int) -> None:
        for req in it:
            arrival = float(req.arrival_s)
            if not math.isfinite(arrival) or arrival < previous:
                raise WorkloadError(
                    f"request #{index} of workload {source}: arrival_s={arrival} is not finite "
                    f"or earlier than the previous request ({previous})"
                )
            heapq.heappush(self._sources, (arrival, source, req, it, index))
            return

    def _take_arrival(self) -> Any:
        arrival, source, req, it, index = heapq.heappop(self._sources)
        if arrival < self._now:
            raise WorkloadError(
                f"request #{index} of workload {source} arrives at {arrival} s, before the "
                f"simulation time {self._now} s (submit it before running past its arrival)"
            )
        self._pull(it, source, previous=arrival, index=index + 1)
        return req

    # ------------------------------------------------------------------------------------------
    # Time
    def run_until(self, t_s: float, *, stop_when_idle: bool = False) -> None:
        """Advance virtual time to ``t_s`` (``math.inf``: until nothing is left to do).

        With ``stop_when_idle``, stop as soon as every submitted request has finished and no
        more are to arrive; the clock then stays at that moment.
        """
        if t_s < self._now:
            raise SimulatorInputError(f"run_until({t_s}): time is already {self._now}")
        heap = self._heap
        sources = self._sources
        stopped_idle = False
        while True:
            ta = sources[0][0] if sources else math.inf
            te = heap[0][0] if heap else math.inf
            if ta <= te:
                if ta > t_s or ta == math.inf:
                    break
                item = self._take_arrival()
                self._now = ta
                self._on_arrival(item)
            else:
                if te > t_s:
                    break
                t, _seq, kind, obj, arg = heapq.heappop(heap)
                self._now = t
                if kind == _EV_ENGINE:
                    obj.on_event(arg, t)
                elif kind == _EV_DISPATCH:
                    self._dispatch(obj, self.roles[0], t)
                elif kind == _EV_KV_DONE:
                    obj.decode_worker = None
                    self._dispatch(obj, "decode", t)
                elif kind == _EV_READY:
                    self._on_ready(obj, t)
                elif kind == _EV_RESIZE:
                    self._on_resize_phase(obj, arg, t)
                elif kind == _EV_TIMEOUT:
                    self._on_timeout(obj, arg, t)
                elif kind == _EV_GRACE:
                    self._on_grace_end(obj, t)
            if stop_when_idle and not sources and self.submitted == len(self.records):
                stopped_idle = True
                break
        if math.isfinite(t_s) and not stopped_idle:
            self._now = t_s
        for replica in self.replicas:
            if replica.state is not ReplicaState.STOPPED:
                for e in replica.ranks:
                    e.sync(self._now)
        self.frontend.time_s = self._now

    def run_to_completion(self, *, limit_s: float = math.inf) -> None:
        """Run until every submitted request has finished, or until ``limit_s``; the clock
        stops at the last finish (replicas stay up and keep metering GPU time after it)."""
        if self.idle:
            return
        self.run_until(max(limit_s, self._now), stop_when_idle=True)

    def _push(self, t: float, kind: int, obj: Any, arg: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, obj, arg))

    # EngineSink
    def schedule(self, time_s: float, engine: EngineCore, token: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (time_s, self._seq, _EV_ENGINE, engine, token))

    # ------------------------------------------------------------------------------------------
    # Request flow
    def _on_arrival(self, item: Any) -> None:
        now = self._now
        isl = int(item.input_length)
        osl = max(1, int(item.output_length))
        hash_ids = getattr(item, "hash_ids", None)
        rid = self._next_rid
        self._next_rid += 1
        req = SimRequest(
            rid=rid,
            arrival_s=now,
            isl=isl,
            osl=osl,
            hash_ids=tuple(hash_ids) if hash_ids else None,
        )
        self.submitted += 1
        self.frontend.on_started()
        error = self._admission_error(req)
        if error is not None:
            self._fail(req, now, error)
            return
        self._push(now + self.frontend_latency_s, _EV_DISPATCH, req)
        if self.request_timeout_s is not None:
            self._push(now + self.request_timeout_s, _EV_TIMEOUT, req, None)

    def _admission_error(self, req: SimRequest) -> str | None:
        if req.isl < 1:
            return f"input_length={req.isl}: a request needs at least one prompt token"
        # the common case in one comparison: the longest any role keeps fits every engine
        if req.isl + req.osl <= self._shortest_context:
            return None
        for role in self.roles:
            model = self._models[role]
            need = req.isl + (req.osl if role != "prefill" else 1)
            if need > model.max_model_len:
                return (
                    f"{need} tokens exceed the {role} engine's max_model_len {model.max_model_len}"
                )
        return None

    def _dispatch(self, req: SimRequest, role: Role, now: float) -> None:
        # ``role`` is one of this cluster's (the event loop passes its own roles)
        engine = self._pick(role)
        if engine is None:
            if not self.retry_paused and self._paused(role):
                self.rejected_in_pause += 1
                self._fail(req, now, elastic_ep.PAUSE_REJECTED)
                return
            self._frontend_queue[role].append(req)
            return
        self._send(req, engine, now)

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
            req.target = req.osl
        elif engine.role == "prefill":
            req.prefill_worker = engine.worker_id
            req.target = 1
        else:
            req.prefill_worker = req.decode_worker = engine.worker_id
            req.target = req.osl
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
            self._push(time_s + delay, _EV_KV_DONE, req)
        else:
            self._finish(req, time_s)
        replica = self._engine_of_replica.get(id(engine))
        if replica is not None and replica.state is ReplicaState.DRAINING and replica.is_empty():
            self._stop(replica, time_s)

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

    def _on_timeout(self, req: SimRequest, _arg: Any, now: float) -> None:
        for queue in self._frontend_queue.values():
            if req in queue:
                queue.remove(req)
                self._fail(req, now, f"no ready replica within {self.request_timeout_s} s")
                return

    # ------------------------------------------------------------------------------------------
    # Replicas
    def _role(self, role: str) -> Role:
        if role not in self.roles:
            raise SimulatorInputError(
                f"role {role!r}: this {self.mode} cluster has {list(self.roles)}"
            )
        return role

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
            self._push(now + delay, _EV_READY, replica)
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

    def _on_ready(self, replica: Replica, now: float) -> None:
        if replica.state is not ReplicaState.STARTING:
            return  # cancelled while starting
        replica.state = ReplicaState.READY
        self._targets[replica.role] = None
        self._flush_frontend_queue(replica.role, now)

    def _flush_frontend_queue(self, role: Role, now: float) -> None:
        migrating = self._migrating[role]
        while migrating:
            engine = self._pick(role)
            if engine is None:
                return
            self._migrate_to(migrating.popleft(), engine, now)
        queue = self._frontend_queue[role]
        while queue:
            engine = self._pick(role)
            if engine is None:
                return
            self._send(queue.popleft(), engine, now)

    def _stop(self, replica: Replica, now: float) -> None:
        replica.state = ReplicaState.STOPPED
        replica.stop_s = now
        self._targets[replica.role] = None
        for e in replica.ranks:
            self._engine_of_replica.pop(id(e), None)

    def set_replicas(self, role: str, n: int, *, leaving: Iterable[str] = ()) -> None:
        """Scale ``role`` to ``n`` replicas (see the module doc for what happens when).
        ``leaving`` names ready replicas (worker ids) that drain before any other, as the
        orchestrator chose them; the others go least loaded first."""
        chosen = frozenset(leaving)
        r = self._role(role)
        if n < 0:
            raise SimulatorInputError(f"set_replicas({role!r}, {n}): n must be >= 0")
        self._desired[r] = n
        now = self._now
        live = [
            x
            for x in self.replicas
            if x.role == r and x.state in (ReplicaState.STARTING, ReplicaState.READY)
        ]
        if n > len(live):
            for _ in range(n - len(live)):
                self._add_replica(r, ready_now=False)
            return
        excess = len(live) - n
        starting = sorted(
            (x for x in live if x.state is ReplicaState.STARTING), key=lambda x: -x.start_s
        )
        for x in starting[:excess]:
            self._stop(x, now)
            excess -= 1
        if excess <= 0:
            return
        ready = [x for x in live if x.state is ReplicaState.READY and x.resizing is None]
        ready.sort(
            key=lambda x: (
                x.worker_id not in chosen,
                sum(e.num_requests for e in x.ranks),
                -x.start_s,
            )
        )
        for x in ready[:excess]:
            x.state = ReplicaState.DRAINING
            x.drain_s = now
            self._targets[r] = None
            if x.is_empty():
                self._stop(x, now)
            elif self.drain_grace_s is not None:
                self._push(now + self.drain_grace_s, _EV_GRACE, x)

    def _on_grace_end(self, replica: Replica, now: float) -> None:
        """The drain's grace period ended: stop the replica; cancel or migrate what is left."""
        if replica.state is not ReplicaState.DRAINING:
            return  # it emptied in time
        for e in replica.ranks:
            e.sync(now)  # tokens of a planned decode run up to now were delivered
            if replica.state is ReplicaState.STOPPED:
                return  # those were its last requests
        left = [req for e in replica.ranks for req in e.evacuate()]
        self._stop(replica, now)
        for req in left:
            if self.migrate_on_drain:
                self.migrated_at_drain += 1
                engine = self._pick(replica.role)
                if engine is None:
                    self._migrating[replica.role].append(req)
                else:
                    self._migrate_to(req, engine, now)
            else:
                self.cancelled_at_drain += 1
                self._fail(req, now, DRAIN_CANCELLED)

    def _migrate_to(self, req: SimRequest, engine: EngineCore, now: float) -> None:
        """Go on with ``req`` on ``engine``: it recomputes the prompt and the tokens sent so
        far (evacuation reset them) and generates the rest."""
        if engine.role == "prefill":
            req.prefill_worker = engine.worker_id
        elif engine.role == "decode":
            req.decode_worker = engine.worker_id
        else:
            req.prefill_worker = req.decode_worker = engine.worker_id
        engine.add(req, now)

    # ------------------------------------------------------------------------------------------
    # Elastic EP
    def resize_dp(
        self,
        role: str,
        new_dp: int,
        mode: str | elastic_ep.ElasticEpMode = "nixl_ep",
        *,
        replica: str | None = None,
        followers_ready_s: float = 0.0,
    ) -> list[elastic_ep.ResizePlan]:
        """Change the data-parallel (and expert-parallel) size of the ready replicas of
        ``role`` (or only ``replica``, a worker id) to ``new_dp``.

        ``mode`` names the timing (or is one). A grow's added ranks first start and join the
        engine for ``followers_ready_s`` (follower pods), then the resize runs. The replica
        keeps serving at its old size meanwhile and during preparation, serves nothing during
        the downtime, then serves at the new size. Added GPUs are metered from the request
        (followers included while they start); removed GPUs until the end. Requests on
        removed ranks are aborted, as vLLM does (``shrink_drains_first``: recomputed on the
        others, the drained engine's approximation). When every replica is resized, later
        replicas start at the new size.
        """
        r = self._role(role)
        spec = self._specs[r]
        if spec.model.moe is None:
            raise SimulatorInputError(
                f"resize_dp: {spec.model.name} is dense; elastic EP resizes MoE engines"
            )
        if new_dp < 1:
            raise SimulatorInputError(f"resize_dp: new_dp={new_dp} must be >= 1")
        if not (math.isfinite(followers_ready_s) and followers_ready_s >= 0):
            raise SimulatorInputError(
                f"resize_dp: followers_ready_s={followers_ready_s} must be finite and >= 0"
            )
        timings = mode if isinstance(mode, elastic_ep.ElasticEpMode) else elastic_ep.mode(mode)
        self._resized_model(spec.with_dp(new_dp))  # fails now if the new size cannot fit
        targets = [
            x
            for x in self.replicas
            if x.role == r
            and x.state is ReplicaState.READY
            and (replica is None or x.worker_id == replica)
        ]
        if replica is not None and not targets:
            raise SimulatorInputError(f"resize_dp: no ready {r} replica called {replica!r}")
        plans = []
        now = self._now
        for x in targets:
            old = len(x.ranks)
            if old == new_dp:
                continue
            if x.resizing is not None:
                raise SimulatorInputError(f"resize_dp: {x.worker_id} is already resizing")
            up = new_dp > old
            timing = timings.up if up else timings.down
            begin = now + (followers_ready_s if up else 0.0)
            plan = elastic_ep.ResizePlan(
                worker_id=x.worker_id,
                from_dp=old,
                to_dp=new_dp,
                mode=timings.name,
                start_s=begin,
                downtime_start_s=begin + timing.preparation_s,
                end_s=begin + timing.preparation_s + timing.downtime_s,
                requested_s=now,
            )
            x.resizing = plan
            if up:
                x.gpu_segments.append((now, x.spec.tp * new_dp))
            self._push(plan.downtime_start_s, _EV_RESIZE, x, "pause")
            self._push(plan.end_s, _EV_RESIZE, x, "commit")
            plans.append(plan)
            self._resize_log.append(plan)
        if replica is None:
            self._specs[r] = spec.with_dp(new_dp)
            self._startup.set_spec(r, self._specs[r])
        return plans

    def _resized_model(self, spec: EngineSpec) -> EngineModel:
        key = str(spec)
        model = self._resize_models.get(key)
        if model is None:
            model = self._resize_models[key] = engine_for(spec)
        return model

    def _on_resize_phase(self, x: Replica, phase: str, now: float) -> None:
        plan = x.resizing
        if plan is None or x.state is ReplicaState.STOPPED:
            return
        if phase == "pause":
            x.paused = True
            self._targets[x.role] = None
            for e in x.ranks:
                e.pause(now)
            return
        new_spec = x.spec.with_dp(plan.to_dp)
        x.spec = new_spec
        x.model = self._resized_model(new_spec)
        orphans: list[SimRequest] = []
        if plan.to_dp < len(x.ranks):
            for e in x.ranks[plan.to_dp :]:
                orphans.extend(e.evacuate())
                self._engine_of_replica.pop(id(e), None)
            x.ranks = x.ranks[: plan.to_dp]
            x.gpu_segments.append((now, new_spec.gpus))
        else:
            x.ranks.extend(self._make_rank(x, k) for k in range(len(x.ranks), plan.to_dp))
        for e in x.ranks:
            e.model = x.model  # the MoE all-to-all spans the new group
        x.resizing = None
        x.paused = False
        self._targets[x.role] = None
        for i, req in enumerate(orphans):
            if self.shrink_drains_first:  # a drained engine has none: they finish elsewhere
                x.ranks[i % len(x.ranks)].add(req, now)
            else:
                self.aborted_at_shrink += 1
                self._fail(req, now, elastic_ep.SHRINK_ABORTED)
        for e in x.ranks:
            e.resume(now)
        self._flush_frontend_queue(x.role, now)

    # ------------------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Counts for logs and tests."""
        return {
            "time_s": self._now,
            "submitted": self.submitted,
            "finished": len(self.records) - self.failed,
            "failed": self.failed,
            "cancelled_at_drain": self.cancelled_at_drain,
            "migrated_at_drain": self.migrated_at_drain,
            "in_flight": self.in_flight,
            "gpu_seconds": self.gpu_seconds,
            "replicas": {r: self.replica_counts(r) for r in self.roles},
        }
