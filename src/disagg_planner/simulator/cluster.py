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

import heapq
import math
from collections.abc import Iterable, Iterator
from typing import Any

from disagg_planner.simulator import elastic_ep
from disagg_planner.simulator.cluster_core import (
    DEFAULT_KV_TRANSFER_BPS,
    EV_DISPATCH,
    EV_ENGINE,
    EV_GRACE,
    EV_KV_DONE,
    EV_READY,
    EV_RESIZE,
    EV_SHUTDOWN,
    EV_TIMEOUT,
    ROLES_BY_MODE,
    Mode,
    RouterPolicy,
)
from disagg_planner.simulator.cluster_shutdown import ShutdownStages
from disagg_planner.simulator.engine_model import EngineModel
from disagg_planner.simulator.engine_spec import EngineSpec
from disagg_planner.simulator.engines import engine_for
from disagg_planner.simulator.errors import SimulatorInputError, WorkloadError
from disagg_planner.simulator.replica import (
    DEFAULT_DRAIN_GRACE_S,
    DRAIN_CANCELLED,
    Replica,
    ReplicaState,
)
from disagg_planner.simulator.request import RequestLike, SimRequest
from disagg_planner.simulator.scheduler import EngineCore, Role
from disagg_planner.simulator.shutdown import ENDED_KILLED


class Cluster(ShutdownStages):
    """A simulated disaggregated (or aggregated) serving cluster; see the module doc.

    ``engines`` maps each role of the mode (``prefill`` and ``decode``, or ``agg``) to an
    engine spec (object or ``sim:...`` string); ``replicas`` gives the replicas ready at
    time 0 (default one per role). ``startup_delay_s`` (one value or one per role) is the
    constant start-up of a replica added later; ``None`` (the default, and a role a mapping
    leaves out) draws each replica's start-up from the phase model of
    :mod:`disagg_planner.simulator.startup` (seeded by ``seed``); ``120.0`` is the constant
    the simulator defaulted to before.
    ``drain_grace_s`` bounds a removed replica's drain (``None``: no bound, every in-flight
    request finishes); after it, its requests fail, or with ``migrate_on_drain`` move to
    another replica. ``worker_shutdown`` (Dynamo's staged shutdown,
    :mod:`disagg_planner.simulator.shutdown`) makes a removed ready replica go through its
    stages inside one total budget and report them on its page (:meth:`shutdown_page`);
    ``None`` keeps the older drain (until empty or the grace period). ``on_fpm`` receives every
    iteration's ForwardPassMetrics (slower; without it only the latest per rank is kept);
    ``on_record`` receives each request's record as it finishes (it may call ``submit``, e.g.
    for a closed-loop client). ``bulk_decode=False`` steps every decode iteration on its own
    (the same results, slower; for validation).
    """

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
                if kind == EV_ENGINE:
                    obj.on_event(arg, t)
                elif kind == EV_DISPATCH:
                    self._dispatch(obj, self.roles[0], t)
                elif kind == EV_KV_DONE:
                    self._kv_read(obj.prefill_worker, t)
                    obj.decode_worker = None
                    self._dispatch(obj, "decode", t)
                elif kind == EV_READY:
                    self._on_ready(obj, t)
                elif kind == EV_RESIZE:
                    self._on_resize_phase(obj, arg, t)
                elif kind == EV_TIMEOUT:
                    self._on_timeout(obj, arg, t)
                elif kind == EV_GRACE:
                    self._on_grace_end(obj, t)
                elif kind == EV_SHUTDOWN:
                    self._on_shutdown_step(obj, arg, t)
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
        self._push(now + self.frontend_latency_s, EV_DISPATCH, req)
        if self.request_timeout_s is not None:
            self._push(now + self.request_timeout_s, EV_TIMEOUT, req, None)

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

    def _on_timeout(self, req: SimRequest, _arg: Any, now: float) -> None:
        for queue in self._frontend_queue.values():
            if req in queue:
                queue.remove(req)
                self._fail(req, now, f"no ready replica within {self.request_timeout_s} s")
                return

    # ------------------------------------------------------------------------------------------
    # Replicas
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
            if self.worker_shutdown is not None:
                self._begin_shutdown(x, self.worker_shutdown, now)
            elif x.is_empty():
                self._stop(x, now)
            if x.state is not ReplicaState.STOPPED and self.drain_grace_s is not None:
                self._push(now + self.drain_grace_s, EV_GRACE, x)

    def _on_grace_end(self, replica: Replica, now: float) -> None:
        """The drain's grace period ended: stop the replica; cancel or migrate what is left."""
        if replica.state is not ReplicaState.DRAINING:
            return  # it emptied in time
        if replica.shutdown is not None and replica.shutdown.ended_by is None:
            replica.shutdown.ended_by = ENDED_KILLED
        self._end_requests(replica, now, stop=True)

    def _end_requests(self, replica: Replica, now: float, *, stop: bool) -> None:
        """Cancel or migrate what is left on ``replica`` (and stop it with ``stop``)."""
        for e in replica.ranks:
            e.sync(now)  # tokens of a planned decode run up to now were delivered
            if replica.state is ReplicaState.STOPPED or (not stop and replica.is_empty()):
                return  # those were its last requests
        left = [req for e in replica.ranks for req in e.evacuate()]
        if stop:
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
            self._push(plan.downtime_start_s, EV_RESIZE, x, "pause")
            self._push(plan.end_s, EV_RESIZE, x, "commit")
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


__all__ = [
    "DEFAULT_DRAIN_GRACE_S",
    "DEFAULT_KV_TRANSFER_BPS",
    "DRAIN_CANCELLED",
    "ROLES_BY_MODE",
    "Cluster",
    "Mode",
    "Replica",
    "ReplicaState",
    "RouterPolicy",
]
