"""The staged shutdown of a removed replica (Dynamo's worker: :mod:`.shutdown` has the
model), as the simulated cluster runs it: a part of :class:`~.cluster.Cluster`.

With ``worker_shutdown`` set, a removed ready replica goes through the stages on the
cluster's events: the router grace, its requests (until it is empty, or the drain deadline
cancels or migrates the rest), its KV transfers (a prefill replica, until no decode peer
reads its KV), then the cleanup; it stops (its GPUs free) at the end of the cleanup. The
pod's grace period (``drain_grace_s``) still ends it first if shorter (SIGKILL).
"""

from __future__ import annotations

from disagg_planner.simulator.cluster_core import EV_SHUTDOWN, ClusterCore
from disagg_planner.simulator.replica import Replica, ReplicaState
from disagg_planner.simulator.shutdown import (
    ENDED_BUDGET,
    ENDED_QUIESCENT,
    ShutdownSettings,
    ShutdownTrace,
    shutdown_page,
)


class ShutdownStages(ClusterCore):
    """The staged shutdown of the cluster's removed replicas (see the module doc)."""

    def _end_requests(self, replica: Replica, now: float, *, stop: bool) -> None:
        raise NotImplementedError  # the Cluster's: cancel or migrate what is left

    def shutdown_page(self, worker_id: str) -> str:
        """The shutdown gauges of the worker ``worker_id``'s ``/metrics`` page: with the
        stages once it is shutting down; empty without the staged shutdown (an older
        worker) or once it has exited (its page disappears with the process)."""
        x = next((x for x in self.replicas if x.worker_id == worker_id), None)
        if self.worker_shutdown is None or x is None or x.state is ReplicaState.STOPPED:
            return ""
        return shutdown_page(x.shutdown, component=x.role, total_s=self.worker_shutdown.total_s)

    def _inflight(self, x: Replica) -> int:
        return sum(e.num_requests for e in x.ranks)

    def _kv_busy(self, x: Replica) -> bool:
        return self._kv_out.get(x.worker_id, 0) > 0

    def _begin_shutdown(self, x: Replica, settings: ShutdownSettings, now: float) -> None:
        """SIGTERM: it leaves routing at once (``unregister``) and serves what was routed to
        it through the router grace; the drain deadline is set."""
        trace = x.shutdown = ShutdownTrace(settings, sigterm_s=now)
        trace.record("unregister", "started", now, inflight=self._inflight(x), kv=-1)
        trace.record("unregister", "completed", now, inflight=self._inflight(x), kv=-1)
        trace.record("router_grace", "started", now, inflight=self._inflight(x), kv=-1)
        grace = min(settings.router_grace_s, max(0.0, trace.drain_deadline_s - now))
        self._push(now + grace, EV_SHUTDOWN, x, "router_grace")
        self._push(trace.drain_deadline_s, EV_SHUTDOWN, x, "deadline")

    def _emptied(self, replica: Replica, now: float) -> None:
        if replica.shutdown is None:
            self._stop(replica, now)
        else:
            self._shutdown_progress(replica, now)

    def _kv_read(self, worker_id: str | None, now: float) -> None:
        """A decode peer finished reading a request's KV from prefill worker ``worker_id``."""
        if worker_id is None or worker_id not in self._kv_out:
            return
        self._kv_out[worker_id] -= 1
        if self._kv_out[worker_id] == 0:
            del self._kv_out[worker_id]
            for x in self.replicas:
                if x.worker_id == worker_id and x.shutdown is not None:
                    self._shutdown_progress(x, now)

    def _on_shutdown_step(self, x: Replica, step: str, now: float) -> None:
        trace = x.shutdown
        if trace is None or x.state is ReplicaState.STOPPED:
            return
        if step == "router_grace":
            trace.record("router_grace", "completed", now, inflight=self._inflight(x), kv=-1)
            trace.record("stop_admission", "completed", now, inflight=self._inflight(x), kv=-1)
            trace.record("inflight", "started", now, inflight=self._inflight(x), kv=-1)
            self._shutdown_progress(x, now)
        elif step == "deadline" and trace.phase in ("router_grace", "inflight", "kv_transfer"):
            # The drain deadline: the stage in progress times out; what is left is cancelled
            # (Dynamo cancels it in cleanup: the page's snapshots still count it).
            trace.ended_by = ENDED_BUDGET
            if trace.phase != "kv_transfer":
                left, stage = self._inflight(x), trace.phase
                trace.phase = "timed_out"  # the progress hooks wait while the rest ends
                self._end_requests(x, now, stop=False)
                trace.record(stage, "timed_out", now, inflight=left, kv=-1)
                if x.role == "prefill":
                    kv = 0 if self._kv_busy(x) else 1
                    trace.record("kv_transfer", "started", now, inflight=left, kv=kv)
                    trace.record("kv_transfer", "timed_out", now, inflight=left, kv=kv)
                else:
                    trace.record("kv_transfer", "skipped", now, inflight=left, kv=-1)
            else:
                trace.record("kv_transfer", "timed_out", now, inflight=0, kv=trace.kv)
            self._begin_cleanup(x, now)
        elif step == "cleanup":
            trace.record("cleanup", "completed", now, inflight=0, kv=trace.kv)
            trace.record("runtime", "completed", now, inflight=0, kv=trace.kv)
            self._stop(x, now)

    def _shutdown_progress(self, x: Replica, now: float) -> None:
        """Go on to the next stage if the one in progress is done: no request left
        (``inflight``), no KV left to read (``kv_transfer``; other roles skip it)."""
        trace = x.shutdown
        assert trace is not None
        if trace.phase == "inflight" and x.is_empty():
            trace.record("inflight", "completed", now, inflight=0, kv=-1)
            if x.role != "prefill":
                trace.record("kv_transfer", "skipped", now, inflight=0, kv=1)
                trace.ended_by = trace.ended_by or ENDED_QUIESCENT
                self._begin_cleanup(x, now)
                return
            kv = 0 if self._kv_busy(x) else 1
            trace.record("kv_transfer", "started", now, inflight=0, kv=kv)
        if trace.phase == "kv_transfer" and not self._kv_busy(x):
            trace.record("kv_transfer", "completed", now, inflight=0, kv=1)
            trace.ended_by = trace.ended_by or ENDED_QUIESCENT
            self._begin_cleanup(x, now)

    def _begin_cleanup(self, x: Replica, now: float) -> None:
        trace = x.shutdown
        assert trace is not None
        trace.record("cleanup", "started", now, inflight=trace.inflight, kv=trace.kv)
        took = min(trace.settings.teardown_s, max(0.0, trace.end_s - now))
        self._push(now + took, EV_SHUTDOWN, x, "cleanup")
