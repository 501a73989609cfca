"""One engine rank's scheduler: vLLM v1 continuous batching over a paged KV cache.

Each iteration (``_schedule_pass``), as vLLM v1 does:

1. one token budget (``max_num_batched_tokens``) shared by decodes and prefill chunks;
2. running requests first, in admission order: a decode takes one token, an unfinished
   prefill takes ``min(remaining prompt, remaining budget)`` (chunked prefill);
3. a running request whose KV blocks cannot be allocated preempts the most recently admitted
   running request (LIFO) and retries; preempted requests lose their KV and are recomputed
   (prompt plus generated tokens) when readmitted at the head of the waiting queue;
4. only if nothing was preempted, waiting requests are admitted in FCFS order while budget,
   ``max_num_seqs`` and KV blocks allow; prefix-cache hits (Mooncake ``hash_ids``) skip
   compute but still hold blocks;
5. a prefill that completes samples its first token in the same pass.

Speed: a pass that schedules only decodes may plan a whole run of decode-only iterations at
once (:mod:`~disagg_planner.simulator.decode_run`); while every running request decodes in
lockstep, the rank keeps them as one :class:`~disagg_planner.simulator.decode_group.DecodeGroup`,
so that an iteration costs the same whatever the batch size. The iteration's records (prefill
chunks, scheduled work, queue totals, the latest iteration's FPM figures) are named in
:mod:`~disagg_planner.simulator.iteration`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Literal, Protocol

from disagg_planner.signals.fpm import ForwardPassMetrics
from disagg_planner.simulator.decode_group import DecodeGroup
from disagg_planner.simulator.decode_run import (
    DecodeRun,
    account_stepped,
    grouped_run_length,
    stepped_run_length,
)
from disagg_planner.simulator.engine_model import EngineModel
from disagg_planner.simulator.iteration import (
    ADMITTED,
    EMPTY_QUEUE,
    IDLE,
    NOTHING_NEW,
    PREEMPTED,
    LastIteration,
    PassOutcome,
    PrefillChunk,
    Scheduled,
    Step,
    build_fpm,
    variance,
    variance_of,
)
from disagg_planner.simulator.metrics import Histogram, array_sum
from disagg_planner.simulator.prefix_cache import PrefixCache
from disagg_planner.simulator.request import SimRequest

Role = Literal["prefill", "decode", "agg"]
FpmCallback = Callable[[ForwardPassMetrics], None]


class EngineSink(Protocol):
    """What an engine needs from its cluster."""

    def schedule(self, time_s: float, engine: EngineCore, token: int) -> None:
        """Call ``engine.on_event(token, time_s)`` at ``time_s``."""

    def on_first_token(self, req: SimRequest, time_s: float) -> None: ...

    def on_leave(self, engine: EngineCore, req: SimRequest, time_s: float) -> None:
        """``req`` is done on this engine (prefill finished on a prefill engine, or the
        request finished on a decode/agg engine)."""


class EngineCore:
    """One data-parallel rank of one engine replica (``tp`` GPUs in lockstep)."""

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
        spec = model.spec
        self.bulk_decode = bulk_decode
        self.model = model
        self.role: Role = role
        self.worker_id = worker_id
        self.dp_rank = dp_rank
        self.sink = sink
        self.itl = itl
        self.on_fpm = on_fpm
        self.block_size = spec.block_size
        self.budget = spec.max_num_batched_tokens
        self.max_seqs = spec.max_num_seqs
        self.total_blocks = model.kv_blocks
        self.free_blocks = model.kv_blocks
        # TensorRT-LLM's default capacity scheduler (GUARANTEED_NO_EVICT) admits a request
        # only when the KV blocks of its whole prompt and output fit beside the reservations
        # of the running ones, so it never preempts; vLLM and SGLang admit on the prompt alone.
        self._no_evict = spec.backend == "trtllm"
        self._reserved = 0
        self._reserved_by: dict[int, int] = {}
        self.waiting: deque[SimRequest] = deque()
        self._queue = EMPTY_QUEUE  # the waiting queue's totals, for the FPM and routing
        self._running: list[SimRequest] = []
        # Set while every running request decodes in lockstep (see the module doc); its
        # members are the first ``n`` of ``_running``, the rest are just admitted.
        self._group: DecodeGroup | None = None
        self.busy = False
        self.paused = False
        self._token = 0
        # The iteration in progress: a single step, or a planned run of decode-only iterations.
        self._step = Step()
        self._run: DecodeRun | None = None
        # Latest FPM, built lazily.
        self.counter_id = 0
        self._last: LastIteration | None = None
        self._was_active = False
        # Counters (tests and reports).
        self.iterations = 0
        self.requests_received = 0
        self.prefill_tokens_computed = 0
        self.tokens_generated = 0
        self.preemptions = 0
        self.busy_time_s = 0.0
        self._prefix: PrefixCache | None = None
        if spec.prefix_caching and role != "decode":
            capacity = max(1, model.max_kv_tokens // prefix_block_tokens)
            self._prefix = PrefixCache(capacity=capacity, block_tokens=prefix_block_tokens)

    # -- public state ------------------------------------------------------------------------------
    @property
    def running(self) -> list[SimRequest]:
        """The running requests, in admission order, their fields exact at this time."""
        group = self._group
        if group is not None:
            for req in self._running[: group.n]:
                group.write_back(req)
        return self._running

    @property
    def used_blocks(self) -> int:
        return self.total_blocks - self.free_blocks

    @property
    def num_requests(self) -> int:
        return len(self._running) + len(self.waiting)

    @property
    def is_empty(self) -> bool:
        """No request held (an iteration in progress always holds its requests)."""
        return not self._running and not self.waiting

    def load(self) -> float:
        """Routing load in tokens: queued prompt tokens plus KV tokens held (O(1))."""
        q = self._queue
        return float(
            q.prefill_tokens
            + q.decode_kv_tokens
            + (self.total_blocks - self.free_blocks) * self.block_size
        )

    # -- waiting queue -------------------------------------------------------------------------
    def _enqueue(self, req: SimRequest, *, front: bool = False) -> None:
        self._queue = self._queue.changed(req, 1)
        if front:
            self.waiting.appendleft(req)
        else:
            self.waiting.append(req)

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
        self.waiting.clear()
        self._queue = EMPTY_QUEUE
        for req in out:
            if req.computed or req.generated:
                req.preemptions += 1  # it loses its KV like a preempted request
            self._reset_for_recompute(req)
        self.free_blocks = self.total_blocks
        return out

    # -- the decode group ------------------------------------------------------------------------
    def _ungroup(self) -> None:
        """Back to per-request bookkeeping: every member gets its own fields."""
        group = self._group
        if group is not None:
            for req in self._running[: group.n]:
                group.write_back(req)
            self._group = None

    def _try_group(self, ctxs: list[int], now: float) -> DecodeGroup | None:
        """Form the group from a pass that scheduled every running request as a decode,
        if their previous tokens all came at ``now`` (no starved request)."""
        running = self._running
        for req in running:
            if req.last_token_s != now:
                return None
        group = DecodeGroup(self.block_size, now)
        for req, ctx in zip(running, ctxs, strict=True):
            group.join(req, ctx, req.target - req.generated)
        self._group = group
        return group

    def _leave_group(self, group: DecodeGroup, done: list[SimRequest]) -> None:
        """``done`` (members that generated their last token) leave the batch."""
        running = self._running
        for req in done:
            group.write_back(req)
            index = running.index(req)
            del running[index]
            group.remove(req, index)

    # -- the scheduler ---------------------------------------------------------------------------
    def _reset_for_recompute(self, req: SimRequest) -> None:
        if self._reserved_by:
            self._reserved -= self._reserved_by.pop(id(req), 0)
        self.free_blocks += req.blocks
        req.blocks = 0
        req.prompt_len = req.isl + req.generated
        req.gen_base = req.generated
        req.computed = 0
        req.remote_kv = False

    def _preempt(self, victim: SimRequest) -> None:
        self._reset_for_recompute(victim)
        victim.preemptions += 1
        self.preemptions += 1
        self._enqueue(victim, front=True)

    def _schedule_pass(self) -> PassOutcome:
        """Build the next iteration into ``_step``: its prefill chunks and decodes (or
        ``grouped``), their count, the decode contexts' sum ``k`` and what their variance
        comes from."""
        group = self._group
        step = self._step
        if group is not None and group.n <= self.budget:
            # Every member decodes; the pass allocates their next iteration's blocks.
            extra = group.allocate_next()
            if extra <= self.free_blocks:
                self.free_blocks -= extra
                group.held += extra
                group.lag = 0
                step.grouped = True
                step.decode = []
                step.n_decode = group.n
                step.k = group.context_sum()
                step.var = (list(group.offsets), group.epoch)
                if not self.waiting:
                    step.prefill = []
                    return NOTHING_NEW
                return self._admit([], self.budget - group.n)
        # Some member would not be scheduled or would need a preemption: step them one by one.
        self._ungroup()
        return self._schedule_running()

    def _schedule_running(self) -> PassOutcome:
        bs = self.block_size
        budget = self.budget
        prefill: list[PrefillChunk] = []
        decode: list[SimRequest] = []
        # The decode contexts, gathered here once: the iteration time needs their sum, the
        # FPM their variance and a planned decode run both.
        ctxs: list[int] = []
        k = 0
        running = self._running
        free = self.free_blocks
        preempted = False
        n_run = len(running)
        i = 0
        # This loop runs once per iteration over the whole batch: attributes are read once
        # into locals and ``free_blocks`` is kept in a local (hence no ``req.context``).
        while i < n_run and budget > 0:
            req = running[i]
            computed = req.computed
            prompt = req.prompt_len
            if computed < prompt:
                n = prompt - computed
                if n > budget:
                    n = budget
                need = -(-(computed + n) // bs)
            else:
                n = 0
                ctx = prompt + req.generated - req.gen_base
                need = -(-ctx // bs)
            extra = need - req.blocks
            if extra:  # a decode needs a new block only every block_size tokens
                if extra > free:
                    self.free_blocks = free
                    preempted = True
                    self_preempted = self._make_room(req, extra)
                    free = self.free_blocks
                    n_run = len(running)
                    if self_preempted:
                        break
                free -= extra
                req.blocks = need
            if n:
                prefill.append(PrefillChunk(req, n, computed))
                budget -= n
            else:
                decode.append(req)
                ctxs.append(ctx)
                k += ctx
                budget -= 1
            i += 1
        self.free_blocks = free
        step = self._step
        step.grouped = False
        step.decode = decode
        step.n_decode = len(decode)
        step.k = k
        step.var = (ctxs, 0)
        if preempted:
            step.prefill = prefill
            return PREEMPTED
        return self._admit(prefill, budget)

    def _admit(self, prefill: list[PrefillChunk], budget: int) -> PassOutcome:
        """Admit waiting requests into the pass (FCFS while budget, seats and KV allow)."""
        bs = self.block_size
        running = self._running
        free = self.free_blocks
        waiting = self.waiting
        prefix = self._prefix
        admitted = False
        while waiting and budget > 0 and len(running) < self.max_seqs:
            req = waiting[0]
            computed = req.computed
            hit = 0
            if computed == 0 and prefix is not None:
                # new, or resumed after a preemption: vLLM looks both up
                hit = prefix.hit(req)
                computed = hit
            n = min(req.prompt_len - computed, budget)
            need = -(-(computed + n) // bs)
            if need > free:
                break
            if self._no_evict:
                whole = -(-(req.isl + req.osl) // bs)
                if self._reserved + whole > self.total_blocks and running:
                    break
                self._reserved += whole
                self._reserved_by[id(req)] = whole
            waiting.popleft()
            self._queue = self._queue.changed(req, -1)
            req.computed = computed
            if hit:
                req.cached_tokens = hit
            free -= need
            req.blocks = need
            running.append(req)
            prefill.append(PrefillChunk(req, n, computed))
            budget -= n
            admitted = True
        self.free_blocks = free
        self._step.prefill = prefill
        return ADMITTED if admitted else NOTHING_NEW

    def _make_room(self, req: SimRequest, extra: int) -> bool:
        """Preempt the most recently admitted running requests (LIFO) until ``extra`` blocks
        are free for ``req``; True when ``req`` itself had to go."""
        running = self._running
        while extra > self.free_blocks:
            victim = running.pop()
            self._preempt(victim)
            if victim is req:
                return True
        return False

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
        run = self._run = DecodeRun.planned(now, durs, k0=step.k, ctx=var_src)
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
        self._record_fpm(
            LastIteration(wall, step.scheduled, step.var, self._queue),
            emit=self.on_fpm is not None,
        )
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

    def _remove_running(self, done: list[SimRequest]) -> None:
        if not done:
            return
        running = self._running
        if len(done) == 1:
            running.remove(done[0])  # identity comparison, in C
        else:
            gone = set(map(id, done))
            running[:] = [r for r in running if id(r) not in gone]

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
        queued = self._queue
        if self.on_fpm is not None:
            var = run.decode_var()
            for j in range(c, c + m):
                sched = Scheduled(0.0, 0.0, 0.0, 0.0, float(b), float(run.k0 + j * b))
                self._record_fpm(LastIteration(durs[j], sched, var, queued), emit=True)
        else:
            j = c + m - 1
            sched = Scheduled(0.0, 0.0, 0.0, 0.0, float(b), float(run.k0 + j * b))
            self.counter_id += m - 1
            self.iterations += m - 1
            var_src = run.ctx if run.var is None else run.var
            self._record_fpm(LastIteration(durs[j], sched, var_src, queued), emit=False)
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
    def _record_fpm(self, last: LastIteration, *, emit: bool) -> None:
        self.counter_id += 1
        self.iterations += 1
        self._last = last
        if emit and self.on_fpm is not None:
            self.on_fpm(self._build_fpm(last))

    def _emit_idle(self) -> None:
        self.counter_id += 1
        last = self._last = LastIteration(0.0, IDLE, 0.0, self._queue)
        if self.on_fpm is not None:
            self.on_fpm(self._build_fpm(last))

    def _build_fpm(self, last: LastIteration) -> ForwardPassMetrics:
        return build_fpm(
            worker_id=self.worker_id, dp_rank=self.dp_rank, counter=self.counter_id, last=last
        )

    def latest_fpm(self) -> ForwardPassMetrics | None:
        """The FPM of the last iteration (or idle heartbeat) this rank finished."""
        last = self._last
        if last is None:
            return None
        if not isinstance(last.var, float):
            # once: it is read again each tick while the rank idles
            last = self._last = last._replace(var=variance_of(last.var))
        return self._build_fpm(last)
