"""One engine rank in simulated time: its iterations, their commits and its forward-pass metrics.

What each iteration runs is the batch's (:mod:`~disagg_planner.simulator.batch`: vLLM v1
continuous batching over a paged KV cache). The rank starts the iteration, asks its cluster
(:class:`EngineSink`) to wake it when the iteration ends, then commits it: prompt tokens
computed, tokens generated, inter-token gaps, finished requests handed back, the FPM.

Speed: when a pass schedules only decodes, admits nothing and preempts nothing, the rank plans
a whole run of decode-only iterations at once (:mod:`~disagg_planner.simulator.decode_run`); a
later arrival cuts it after the iteration in progress. Results are the same as stepping one
iteration at a time. The iteration's records (prefill chunks, scheduled work, queue totals,
the latest iteration's FPM figures) are named in :mod:`~disagg_planner.simulator.iteration`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from disagg_planner.signals.fpm import ForwardPassMetrics
from disagg_planner.simulator.batch import RankBatch, Role
from disagg_planner.simulator.decode_run import (
    DecodeRun,
    account_stepped,
    grouped_run_length,
    stepped_run_length,
)
from disagg_planner.simulator.engine_model import EngineModel
from disagg_planner.simulator.iteration import (
    IDLE,
    LastIteration,
    Scheduled,
    VarSource,
    build_fpm,
    variance,
    variance_of,
)
from disagg_planner.simulator.metrics import Histogram, ItlSink, PerTokenItl, array_sum
from disagg_planner.simulator.request import SimRequest

FpmCallback = Callable[[ForwardPassMetrics], None]


class EngineSink(Protocol):
    """What an engine needs from its cluster."""

    def schedule(self, time_s: float, engine: EngineCore, token: int) -> None:
        """Call ``engine.on_event(token, time_s)`` at ``time_s``."""

    def on_first_token(self, req: SimRequest, time_s: float) -> None: ...

    def on_leave(self, engine: EngineCore, req: SimRequest, time_s: float) -> None:
        """``req`` is done on this engine (prefill finished on a prefill engine, or the
        request finished on a decode/agg engine)."""


class EngineCore(RankBatch):
    """One data-parallel rank of one engine replica (``tp`` GPUs in lockstep): runs the
    iterations its batch builds, in simulated time, and accounts them."""

    def __init__(
        self,
        *,
        model: EngineModel,
        role: Role,
        worker_id: str,
        dp_rank: int,
        sink: EngineSink,
        itl: Histogram,
        on_fpm: FpmCallback | None = None,
        prefix_block_tokens: int = 512,
        bulk_decode: bool = True,
    ) -> None:
        super().__init__(model=model, role=role, prefix_block_tokens=prefix_block_tokens)
        self.bulk_decode = bulk_decode
        self.worker_id = worker_id
        self.dp_rank = dp_rank
        self.sink = sink
        spec = model.spec
        # speculative decoding: an iteration's gap is shared by the tokens it emits
        self.itl: ItlSink = (
            PerTokenItl(itl, spec.accept_length) if spec.num_speculative_tokens else itl
        )
        self.on_fpm = on_fpm
        self.busy = False
        self.paused = False
        self._token = 0
        # A planned run of decode-only iterations in progress (else the single ``_step``).
        self._run: DecodeRun | None = None
        # The FPM counter (0: no iteration or heartbeat yet) and the latest FPM's figures,
        # built into one lazily.
        self.counter_id = 0
        self._last = LastIteration()
        self._was_active = False
        # Counters (tests and reports; ``preemptions`` is the batch's).
        self.iterations = 0
        self.requests_received = 0
        self.prefill_tokens_computed = 0
        self.tokens_generated = 0
        self.busy_time_s = 0.0

    # -- entry points (called by the cluster) --------------------------------------------------
    def add(self, req: SimRequest, now: float) -> None:
        """Queue a request (its KV, if transferred, is already counted in ``computed``)."""
        req.blocks = 0
        self.requests_received += 1
        self._enqueue(req)
        if self.paused:
            return
        if not self.busy:
            self._schedule(now)
        elif self._run is not None:
            self.interrupt(now)

    def interrupt(self, now: float) -> None:
        """New work arrived during a planned decode run: end it after the iteration in
        progress so that the next pass sees the new request."""
        run = self._run
        if run is None:
            return
        end = run.cut_after(now)
        if end is not None:
            self._token += 1
            self.sink.schedule(end, self, self._token)

    def sync(self, now: float) -> None:
        """Account the iterations of a planned run that ended by ``now`` (tokens, ITL,
        KV blocks, FPM), so that state read at ``now`` is exact."""
        run = self._run
        if run is None:
            return
        done = run.ended_by(now)
        if run.done < done < len(run.ends):
            self._commit_run(run, done - run.done, final=False)

    def on_event(self, token: int, now: float) -> None:
        if token != self._token:
            return  # superseded by a truncation
        run = self._run
        if run is not None:
            self._commit_run(run, len(run.ends) - run.done, final=True)
            self._run = None
        else:
            self._commit_step(now)
        self.busy = False
        if not self.paused:
            self._schedule(now)

    def pause(self, now: float) -> None:
        """Stop starting iterations (elastic-EP downtime); the one in progress finishes."""
        self.paused = True
        self.interrupt(now)

    def resume(self, now: float) -> None:
        self.paused = False
        if not self.busy:
            self._schedule(now)

    def evacuate(self) -> list[SimRequest]:
        """Remove every request (this rank is going away); each loses its KV and will be
        recomputed wherever it lands. Work of an unfinished iteration is discarded."""
        self._ungroup()
        if self.busy:
            self._token += 1
            self.busy = False
            self._run = None
            self._step.prefill = []
            self._step.decode = []
        out = list(self._running) + list(self.waiting)
        self._running = []
        self._clear_queue()
        for req in out:
            if req.computed or req.generated:
                req.preemptions += 1  # it loses its KV like a preempted request
            self._reset_for_recompute(req)
        self.free_blocks = self.total_blocks
        return out

    def _schedule(self, now: float) -> None:
        if not self._running and not self.waiting:
            if self._was_active:
                self._was_active = False
                self._emit_idle()
            return
        outcome = self._schedule_pass()
        step = self._step
        prefill = step.prefill
        n_decode = step.n_decode
        if not prefill and not n_decode:
            # Nothing fits (cannot happen with the cluster's admission checks); stay idle
            # rather than spin.
            return
        self._was_active = True
        self.busy = True
        if (
            self.bulk_decode
            and not prefill
            and not outcome.preempted
            and not outcome.admitted
            and n_decode == len(self._running)
        ):
            self._plan_run(now)
            return
        p = c = 0
        pairs = 0.0
        for _req, n, ctx in prefill:
            p += n
            c += ctx
            pairs += n * (ctx + (n + 1) / 2.0)
        k = step.k
        dur = self.model.iteration_time_s(
            p, c, n_decode, k, prefill_requests=len(prefill), prefill_attention_pairs=pairs
        )
        # The decode variance is left to the FPM (``step.var``): most are never built.
        # Counts stay ints (``build_fpm`` converts).
        step.scheduled = Scheduled(
            len(prefill),
            p,
            variance([chunk.tokens for chunk in prefill]) if len(prefill) > 1 else 0.0,
            c,
            n_decode,
            k,
        )
        step.dur = dur
        step.end = now + dur
        self._token += 1
        self.sink.schedule(step.end, self, self._token)

    def _plan_run(self, now: float) -> None:
        """Plan a run of decode-only iterations of every running request (the pass just
        scheduled each as a decode, in order)."""
        step = self._step
        var_src = step.var
        assert not isinstance(var_src, float)
        group = self._group
        if group is None:
            group = self._try_group(var_src[0], now)
        if group is None:
            b = len(self._running)
            k = stepped_run_length(
                self._running, var_src[0], free=self.free_blocks, block_size=self.block_size
            )
        else:
            b = group.n
            k = grouped_run_length(group, free=self.free_blocks, block_size=self.block_size)
        durs = self.model.decode_run_s(b, step.k, k)
        run = self._run = DecodeRun.planned(now, durs, step.k, var_src)
        self._token += 1
        self.sink.schedule(run.ends[-1], self, self._token)

    # -- commits ----------------------------------------------------------------------------------
    def _commit_step(self, now: float) -> None:
        step = self._step
        prefill = step.prefill
        visible = self.role != "prefill"
        group = self._group if step.grouped else None
        # Inter-token gaps in the order tokens are emitted (the histogram's float sum depends
        # on it), and the requests that finish, in the order they leave.
        gaps: list[float] = []
        done: list[SimRequest] = []
        joining: list[SimRequest] = []
        unfinished = False
        tokens = 0
        prefix = self._prefix
        for req, n, _ctx in prefill:
            req.computed += n
            tokens += n
            if req.computed >= req.prompt_len:
                req.generated += 1
                if prefix is not None and req.gen_base == 0:
                    prefix.insert(req)
                if visible:
                    if req.first_token_s is None:
                        req.first_token_s = now
                        self.sink.on_first_token(req, now)
                    else:
                        gaps.append(now - req.last_token_s)
                    req.last_token_s = now
                    self.tokens_generated += 1
                if req.generated >= req.target:
                    done.append(req)
                else:
                    joining.append(req)
            else:
                unfinished = True
        self.prefill_tokens_computed += tokens
        itl = self.itl
        finished: list[SimRequest] = []
        if group is not None:
            # Every member's gap is this iteration (their previous tokens came together).
            if gaps:
                itl.observe_seq(gaps)
            n_decode = group.n
            itl.observe_repeat(now - group.last_s, n_decode)
            group.epoch += 1
            group.lag = 1
            group.last_s = now
            if group.finish_heap[0][0] <= group.epoch:
                finished = group.pop_finished()
        else:
            for req in step.decode:
                # A scheduled decode has had its first token (its prefill emitted it).
                gen = req.generated + 1
                req.generated = gen
                gaps.append(now - req.last_token_s)
                req.last_token_s = now
                if gen >= req.target:
                    done.append(req)
            itl.observe_seq(gaps)
            n_decode = len(step.decode)
        self.tokens_generated += n_decode
        wall = step.dur
        self.busy_time_s += wall
        self._record_fpm(wall, step.scheduled, step.var, emit=self.on_fpm is not None)
        step.prefill = []
        step.decode = []
        if group is not None:
            if finished:
                self._leave_group(group, finished)
            self._remove_running(done)
            if unfinished or not visible:
                self._ungroup()
            else:
                bs = self.block_size
                for req in joining:
                    ctx = req.prompt_len + req.generated - req.gen_base
                    if req.blocks != -(-(ctx - 1) // bs):
                        self._ungroup()
                        break
                    group.join(req, ctx, req.target - req.generated)
            done.extend(finished)
        else:
            self._remove_running(done)
        self._hand_back(done, now)

    def _hand_back(self, done: list[SimRequest], now: float) -> None:
        """``done`` (no longer running) have their last token: free their KV, hand them
        back to the cluster."""
        reserved = self._reserved_by
        for req in done:
            self.free_blocks += req.blocks
            req.blocks = 0
            if reserved:
                self._reserved -= reserved.pop(id(req), 0)
            self.sink.on_leave(self, req, now)
        if self._group is not None and self._group.n == 0:
            self._group = None

    def _commit_run(self, run: DecodeRun, m: int, *, final: bool) -> None:
        """Account the next ``m`` iterations of the planned ``run`` (all that are left when
        ``final``)."""
        ends, durs = run.ends, run.durs
        c = run.done
        seg = durs[c : c + m]
        seg_s = array_sum(seg)
        last_end = ends[c + m - 1]
        b = len(self._running)
        self.itl.observe_weighted(seg, seg_s, b)
        group = self._group
        done: list[SimRequest] = []
        if group is not None:
            # Members' previous tokens came at the run's start: no longer first gap.
            group.epoch += m
            group.last_s = last_end
            # Blocks for the next iteration (partial commit) or the last one run (final).
            group.lag = 1 if final else 0
            held = group.blocks_at(group.epoch - group.lag)
            self.free_blocks -= held - group.held
            group.held = held
            if final:
                done = group.pop_finished()
        else:
            done, self.free_blocks = account_stepped(
                run,
                self._running,
                m=m,
                final=final,
                itl=self.itl,
                block_size=self.block_size,
                free=self.free_blocks,
            )
        self.tokens_generated += m * b
        self.busy_time_s += seg_s
        on_fpm = self.on_fpm
        if on_fpm is not None:
            var = run.decode_var()
            # The waiting queue does not change during the run's iterations: one section.
            queued = self._queue_now().metrics()
            for j in range(c, c + m):
                sched = Scheduled(0.0, 0.0, 0.0, 0.0, float(b), float(run.k0 + j * b))
                self._record_fpm(durs[j], sched, var, emit=False)
                on_fpm(
                    build_fpm(
                        worker_id=self.worker_id,
                        dp_rank=self.dp_rank,
                        counter=self.counter_id,
                        wall=durs[j],
                        scheduled=sched,
                        var=var,
                        queued=queued,
                    )
                )
        else:
            j = c + m - 1
            sched = Scheduled(0.0, 0.0, 0.0, 0.0, float(b), float(run.k0 + j * b))
            self.counter_id += m - 1
            self.iterations += m - 1
            var_src = run.ctx if run.var is None else run.var
            self._record_fpm(durs[j], sched, var_src, emit=False)
        run.done = c + m
        if final:
            if group is not None:
                self._leave_group(group, done)
            else:
                self._remove_running(done)
            self._hand_back(done, last_end)

    # -- forward-pass metrics ------------------------------------------------------------------
    # An FPM is kept as its figures (``LastIteration``) until one is actually built: a replay
    # reads only the latest FPM of each rank once per tick, so most are never needed.
    def _record_fpm(self, wall: float, scheduled: Scheduled, var: VarSource, *, emit: bool) -> None:
        """The iteration that just ended: counted, and its figures (with the waiting queue's
        totals now) kept as the latest."""
        self.counter_id += 1
        self.iterations += 1
        last = self._last
        last.wall = wall
        last.scheduled = scheduled
        last.var = var
        last.queued = self._queue_now()
        if emit and self.on_fpm is not None:
            self.on_fpm(self._build_fpm())

    def _emit_idle(self) -> None:
        self.counter_id += 1
        last = self._last
        last.wall = 0.0
        last.scheduled = IDLE
        last.var = 0.0
        last.queued = self._queue_now()
        if self.on_fpm is not None:
            self.on_fpm(self._build_fpm())

    def _build_fpm(self) -> ForwardPassMetrics:
        last = self._last
        return build_fpm(
            worker_id=self.worker_id,
            dp_rank=self.dp_rank,
            counter=self.counter_id,
            wall=last.wall,
            scheduled=last.scheduled,
            var=last.var,
            queued=last.queued.metrics(),
        )

    def latest_fpm(self) -> ForwardPassMetrics | None:
        """The FPM of the last iteration (or idle heartbeat) this rank finished."""
        if self.counter_id == 0:
            return None
        last = self._last
        if not isinstance(last.var, float):
            # once: it is read again each tick while the rank idles
            last.var = variance_of(last.var)
        return self._build_fpm()
