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

Speed: when a pass schedules only decodes, admits nothing and preempts nothing, the next
iterations are identical except that every context grows by one token, until a request
finishes, a request arrives or KV runs out. The engine then plans that whole run at once
(``_plan_bulk``): iteration times come from one vectorised call, and a later arrival
truncates the run at the iteration in progress (``interrupt``). Results are the same as
stepping one iteration at a time.

Speed, too: while every running request is decoding and each iteration schedules them all
(the steady state of a decode engine), they advance in lockstep, one token per iteration.
The engine then keeps them as a ``_DecodeGroup``: per request only what differs (its context
and the iteration at which it finishes, relative to a shared iteration count), per group the
sums an iteration needs (summed context, KV blocks held). An iteration, an admission or a
planned run then costs the same whatever the batch size; a request's own fields are written
back when it leaves the group, and when someone reads ``running``.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Literal, Protocol

import numpy as np

from disagg_planner.signals.fpm import (
    FPM_VERSION,
    ForwardPassMetrics,
    QueuedRequestMetrics,
    ScheduledRequestMetrics,
)
from disagg_planner.simulator.engine_model import EngineModel
from disagg_planner.simulator.metrics import Histogram, array_sum
from disagg_planner.simulator.request import SimRequest

Role = Literal["prefill", "decode", "agg"]
FpmCallback = Callable[[ForwardPassMetrics], None]
# The decode contexts' variance of an iteration, or what to compute it from when an FPM is
# built: (values, offset), the contexts being ``value + offset``.
VarSource = float | tuple[list[int], int]
_MAX_BULK = 4096
_EPS = 1e-9


class EngineSink(Protocol):
    """What an engine needs from its cluster."""

    def schedule(self, time_s: float, engine: EngineCore, token: int) -> None:
        """Call ``engine.on_event(token, time_s)`` at ``time_s``."""

    def on_first_token(self, req: SimRequest, time_s: float) -> None: ...

    def on_leave(self, engine: EngineCore, req: SimRequest, time_s: float) -> None:
        """``req`` is done on this engine (prefill finished on a prefill engine, or the
        request finished on a decode/agg engine)."""


def _var(values: list[int]) -> float:
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return sum((v - mean) ** 2 for v in values) / n


def _var_of(src: VarSource) -> float:
    if isinstance(src, float):
        return src
    values, offset = src
    return _var([v + offset for v in values] if offset else values)


class _DecodeGroup:
    """The running requests of a rank while all of them decode in lockstep.

    ``epoch`` counts the group's iterations. Member ``i`` has context ``a_i + epoch`` (its
    ``group_offset`` is ``a_i``) and generates its last token at epoch ``group_finish``; every
    member's previous token came at ``last_s``. KV blocks: after a pass has allocated the next
    iteration each member holds ``ceil(context / bs)`` blocks (``lag`` 0); after an iteration
    ends, ``ceil((context - 1) / bs)`` (``lag`` 1), as the stepped scheduler leaves them.
    ``blocks_at`` counts them from a histogram of ``a_i mod bs``, in ``bs`` steps at most.
    ``offsets`` lists the ``a_i`` in running order (the FPM's variance is computed from it).
    """

    __slots__ = (
        "bs",
        "epoch",
        "finish_heap",
        "held",
        "lag",
        "last_s",
        "n",
        "offsets",
        "q_sum",
        "residues",
        "seq",
        "sum_offsets",
    )

    def __init__(self, bs: int, last_s: float) -> None:
        self.bs = bs
        self.epoch = 0
        self.lag = 0
        self.last_s = last_s
        self.n = 0
        self.offsets: list[int] = []
        self.sum_offsets = 0
        self.q_sum = 0  # sum of a_i // bs
        self.held = 0  # KV blocks the members hold: blocks_at(epoch - lag), kept up to date
        self.residues = [0] * bs  # members by a_i % bs
        # (finish epoch, join order, request): members finishing at one epoch leave in
        # running order, as the stepped scheduler releases them.
        self.finish_heap: list[tuple[int, int, SimRequest]] = []
        self.seq = 0

    def join(self, req: SimRequest, context: int, left: int) -> None:
        """Add a decoding request at the end of the batch: ``context`` KV tokens now,
        ``left`` tokens still to generate; it holds ``ceil((context - lag) / bs)`` blocks."""
        a = context - self.epoch
        self.held += req.blocks
        req.group_offset = a
        req.group_finish = self.epoch + left
        self.offsets.append(a)
        self.sum_offsets += a
        q, r = divmod(a, self.bs)
        self.q_sum += q
        self.residues[r] += 1
        self.n += 1
        self.seq += 1
        heapq.heappush(self.finish_heap, (req.group_finish, self.seq, req))

    def remove(self, req: SimRequest, index: int) -> None:
        """Forget member ``req`` at ``index`` of the batch (popped off the heap, its fields
        written back)."""
        a = req.group_offset
        self.held -= req.blocks
        del self.offsets[index]
        self.sum_offsets -= a
        q, r = divmod(a, self.bs)
        self.q_sum -= q
        self.residues[r] -= 1
        self.n -= 1

    def context_sum(self) -> int:
        return self.sum_offsets + self.n * self.epoch

    def blocks_at(self, x: int) -> int:
        """``sum_i ceil((a_i + x) / bs)``: with ``a_i = q_i bs + r_i`` and ``x = X bs + y``
        each term is ``q_i + X + ceil((r_i + y) / bs)``, which is 0, 1 or 2 extra."""
        bs = self.bs
        big_x, y = divmod(x, bs)
        total = self.q_sum + self.n * big_x
        if y == 0:
            return total + self.n - self.residues[0]
        return total + self.n + sum(self.residues[bs + 1 - y :])

    def allocate_next(self) -> int:
        """Blocks the next iteration needs beyond those held: a member needs one more when
        its context ``a_i + epoch`` is one past a block boundary, ``a_i = 1 - epoch`` mod bs."""
        if self.lag == 0:
            return 0
        return self.residues[(1 - self.epoch) % self.bs]

    def first_finish(self) -> int:
        return self.finish_heap[0][0]

    def pop_finished(self) -> list[SimRequest]:
        """Members whose last token was this epoch's, in running order."""
        heap = self.finish_heap
        done = []
        while heap and heap[0][0] <= self.epoch:
            done.append(heapq.heappop(heap)[2])
        return done

    def write_back(self, req: SimRequest) -> None:
        """Give member ``req`` its own fields as the stepped scheduler would have them."""
        context = req.group_offset + self.epoch
        req.generated = req.target - (req.group_finish - self.epoch)
        req.last_token_s = self.last_s
        req.blocks = -(-(context - self.lag) // self.bs)


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
        self._running: list[SimRequest] = []
        # Set while every running request decodes in lockstep (see the module doc); its
        # members are the first ``n`` of ``_running``, the rest are just admitted.
        self._group: _DecodeGroup | None = None
        self.busy = False
        self.paused = False
        self._token = 0
        # The iteration in progress: a single step ...
        self._step_prefill: list[tuple[SimRequest, int, int]] = []
        self._step_decode: list[SimRequest] = []
        self._step_n_decode = 0
        self._step_grouped = False  # its decodes are the group's members
        self._step_end = 0.0
        self._step_dur = 0.0
        self._step_desc: tuple[float, ...] = ()
        self._step_var: VarSource = 0.0
        self._step_k = 0
        # ... or a planned run of decode-only iterations.
        # Plain lists: a run is a few iterations long, and bisect on a list beats numpy's
        # per-call overhead.
        self._bulk_ends: list[float] | None = None
        self._bulk_durs: list[float] = []
        self._bulk_start = 0.0
        self._bulk_done = 0
        self._bulk_k0 = 0
        self._bulk_ctx: VarSource = 0.0
        self._bulk_var: float | None = None
        # Waiting-queue aggregates for the FPM's queued section.
        self._q = [0, 0, 0, 0, 0, 0]  # n_pf, sum_pf, sumsq_pf, n_dc, sum_dc, sumsq_dc
        # Latest FPM, built lazily.
        self.counter_id = 0
        self._last_fpm: tuple[float, tuple[float, ...], VarSource, tuple[int, ...]] | None = None
        self._was_active = False
        # Counters (tests and reports).
        self.iterations = 0
        self.requests_received = 0
        self.prefill_tokens_computed = 0
        self.tokens_generated = 0
        self.preemptions = 0
        self.busy_time_s = 0.0
        self._prefix: OrderedDict[int, None] | None = None
        self._prefix_block_tokens = prefix_block_tokens
        if spec.prefix_caching and role != "decode":
            self._prefix = OrderedDict()
            self._prefix_capacity = max(1, model.max_kv_tokens // prefix_block_tokens)

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
        q = self._q
        return float(q[1] + q[4] + (self.total_blocks - self.free_blocks) * self.block_size)

    # -- waiting queue with aggregates ---------------------------------------------------------
    def _q_add(self, req: SimRequest, sign: int) -> None:
        # (slot, value): preempted requests with output count as queued decodes.
        if req.preemptions and req.generated:
            slot, value = 3, req.prompt_len
        else:
            slot, value = 0, req.prompt_len - req.computed
        q = self._q
        q[slot] += sign
        q[slot + 1] += sign * value
        q[slot + 2] += sign * value * value

    def _enqueue(self, req: SimRequest, *, front: bool = False) -> None:
        self._q_add(req, 1)
        if front:
            self.waiting.appendleft(req)
        else:
            self.waiting.append(req)

    def _queued(self) -> tuple[int, ...]:
        """The waiting queue's aggregates now; ``_queue_section`` turns them into the FPM's
        figures when one is built (most never are)."""
        return tuple(self._q)

    @staticmethod
    def _queue_section(q: tuple[int, ...]) -> tuple[float, ...]:
        n_pf, s_pf, ss_pf, n_dc, s_dc, ss_dc = q
        var_pf = ss_pf / n_pf - (s_pf / n_pf) ** 2 if n_pf > 1 else 0.0
        var_dc = ss_dc / n_dc - (s_dc / n_dc) ** 2 if n_dc > 1 else 0.0
        return (n_pf, s_pf, max(0.0, var_pf), n_dc, s_dc, max(0.0, var_dc))

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
        elif self._bulk_ends is not None:
            self.interrupt(now)

    def interrupt(self, now: float) -> None:
        """New work arrived during a planned decode run: end it after the iteration in
        progress so that the next pass sees the new request."""
        ends = self._bulk_ends
        if ends is None:
            return
        j = bisect_left(ends, now)
        j = max(j, self._bulk_done)
        if j + 1 < len(ends):
            self._bulk_ends = ends[: j + 1]
            self._bulk_durs = self._bulk_durs[: j + 1]
            self._token += 1
            self.sink.schedule(ends[j], self, self._token)

    def sync(self, now: float) -> None:
        """Account the iterations of a planned run that ended by ``now`` (tokens, ITL,
        KV blocks, FPM), so that state read at ``now`` is exact."""
        ends = self._bulk_ends
        if ends is None:
            return
        done = bisect_right(ends, now)
        if self._bulk_done < done < len(ends):
            self._commit_bulk(done - self._bulk_done, final=False)

    def on_event(self, token: int, now: float) -> None:
        if token != self._token:
            return  # superseded by a truncation
        if self._bulk_ends is not None:
            self._commit_bulk(len(self._bulk_ends) - self._bulk_done, final=True)
            self._bulk_ends = None
            self._bulk_durs = []
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
            self._bulk_ends = None
            self._bulk_durs = []
            self._step_prefill = []
            self._step_decode = []
        out = list(self._running) + list(self.waiting)
        self._running = []
        self.waiting.clear()
        self._q = [0, 0, 0, 0, 0, 0]
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

    def _try_group(self, ctxs: list[int], now: float) -> _DecodeGroup | None:
        """Form the group from a pass that scheduled every running request as a decode,
        if their previous tokens all came at ``now`` (no starved request)."""
        running = self._running
        for req in running:
            if req.last_token_s != now:
                return None
        group = _DecodeGroup(self.block_size, now)
        for req, ctx in zip(running, ctxs, strict=True):
            group.join(req, ctx, req.target - req.generated)
        self._group = group
        return group

    def _leave_group(self, group: _DecodeGroup, done: list[SimRequest]) -> None:
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

    def _prefix_hit(self, req: SimRequest) -> int:
        cache = self._prefix
        if cache is None or not req.hash_ids:
            return 0
        hits = 0
        for h in req.hash_ids:
            if h not in cache:
                break
            cache.move_to_end(h)
            hits += 1
        # the hashes cover the prompt only (its last block may be partial), not the tokens a
        # resumed request generated before its preemption
        return min(hits * self._prefix_block_tokens, req.isl, req.prompt_len - 1)

    def _prefix_insert(self, req: SimRequest) -> None:
        cache = self._prefix
        if cache is None or not req.hash_ids:
            return
        for h in req.hash_ids:
            cache[h] = None
            cache.move_to_end(h)
        while len(cache) > self._prefix_capacity:
            cache.popitem(last=False)

    def _schedule_pass(self) -> tuple[bool, bool]:
        """Build the next iteration into ``_step_prefill`` and ``_step_decode`` (or
        ``_step_grouped``), with ``_step_n_decode``, the decode contexts' sum ``_step_k`` and
        what their variance comes from; returns (preempted, admitted)."""
        group = self._group
        if group is not None and group.n <= self.budget:
            # Every member decodes; the pass allocates their next iteration's blocks.
            extra = group.allocate_next()
            if extra <= self.free_blocks:
                self.free_blocks -= extra
                group.held += extra
                group.lag = 0
                self._step_grouped = True
                self._step_decode = []
                self._step_n_decode = group.n
                self._step_k = group.context_sum()
                self._step_var = (list(group.offsets), group.epoch)
                if not self.waiting:
                    self._step_prefill = []
                    return False, False
                return self._admit([], self.budget - group.n)
        # Some member would not be scheduled or would need a preemption: step them one by one.
        self._ungroup()
        return self._schedule_running()

    def _schedule_running(self) -> tuple[bool, bool]:
        bs = self.block_size
        budget = self.budget
        prefill: list[tuple[SimRequest, int, int]] = []
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
                prefill.append((req, n, computed))
                budget -= n
            else:
                decode.append(req)
                ctxs.append(ctx)
                k += ctx
                budget -= 1
            i += 1
        self.free_blocks = free
        self._step_grouped = False
        self._step_decode = decode
        self._step_n_decode = len(decode)
        self._step_k = k
        self._step_var = (ctxs, 0)
        if preempted:
            self._step_prefill = prefill
            return True, False
        return self._admit(prefill, budget)

    def _admit(self, prefill: list[tuple[SimRequest, int, int]], budget: int) -> tuple[bool, bool]:
        """Admit waiting requests into the pass (FCFS while budget, seats and KV allow)."""
        bs = self.block_size
        running = self._running
        free = self.free_blocks
        waiting = self.waiting
        admitted = False
        while waiting and budget > 0 and len(running) < self.max_seqs:
            req = waiting[0]
            computed = req.computed
            hit = 0
            if computed == 0:  # new, or resumed after a preemption: vLLM looks both up
                hit = self._prefix_hit(req)
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
            self._q_add(req, -1)
            req.computed = computed
            if hit:
                req.cached_tokens = hit
            free -= need
            req.blocks = need
            running.append(req)
            prefill.append((req, n, computed))
            budget -= n
            admitted = True
        self.free_blocks = free
        self._step_prefill = prefill
        return False, admitted

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
        preempted, admitted = self._schedule_pass()
        prefill = self._step_prefill
        n_decode = self._step_n_decode
        if not prefill and not n_decode:
            # Nothing fits (cannot happen with the cluster's admission checks); stay idle
            # rather than spin.
            return
        self._was_active = True
        self.busy = True
        if (
            self.bulk_decode
            and not prefill
            and not preempted
            and not admitted
            and n_decode == len(self._running)
        ):
            self._plan_bulk(now)
            return
        p = c = 0
        pairs = 0.0
        for _req, n, ctx in prefill:
            p += n
            c += ctx
            pairs += n * (ctx + (n + 1) / 2.0)
        k = self._step_k
        dur = self.model.iteration_time_s(
            p, c, n_decode, k, prefill_requests=len(prefill), prefill_attention_pairs=pairs
        )
        # The decode variance is left to the FPM (``_step_var``): most are never built.
        # Counts stay ints (``_build_fpm`` converts).
        self._step_desc = (
            len(prefill),
            p,
            _var([n for _, n, _ in prefill]) if len(prefill) > 1 else 0.0,
            c,
            n_decode,
            k,
        )
        self._step_dur = dur
        self._step_end = now + dur
        self._token += 1
        self.sink.schedule(self._step_end, self, self._token)

    def _plan_bulk(self, now: float) -> None:
        group = self._group
        if group is None:
            assert not isinstance(self._step_var, float)
            group = self._try_group(self._step_var[0], now)
        if group is None:
            self._plan_bulk_stepped(now)
            return
        b = group.n
        bs = self.block_size
        k = max(min(group.first_finish() - group.epoch, _MAX_BULK), 1)
        free = self.free_blocks
        # Step ``s`` of the run needs ceil((c + s - 1) / bs) blocks per member and the pass
        # allocated ceil(c / bs), so k steps need at most ceil((k - 1) / bs) more each: when
        # that fits, KV does not cut the run and the exact count is not needed.
        if b * -(-(k - 1) // bs) > free:
            held = group.blocks_at(group.epoch)

            def extra_blocks(steps: int) -> int:
                return group.blocks_at(group.epoch + steps - 1) - held

            k = self._fit_run(k, extra_blocks, free)
        self._start_bulk(now, b, k, self._step_k, self._step_var)

    def _plan_bulk_stepped(self, now: float) -> None:
        """A planned run of requests whose previous tokens came at different times."""
        running = self._running
        b = len(running)
        bs = self.block_size
        # The pass just scheduled every running request as a decode, in order.
        assert not isinstance(self._step_var, float)
        ctx0 = self._step_var[0]
        k = min(min([r.target - r.generated for r in running]), _MAX_BULK)
        k = max(k, 1)
        free = self.free_blocks
        if b * -(-(k - 1) // bs) > free:  # the bound of ``_plan_bulk``
            ctx_arr = np.asarray(ctx0, dtype=np.int64)
            held = int(((ctx_arr + (bs - 1)) // bs).sum())  # == sum of r.blocks

            def extra_blocks(steps: int) -> int:
                return int(((ctx_arr + (steps - 1 + bs - 1)) // bs).sum()) - held

            k = self._fit_run(k, extra_blocks, free)
        self._start_bulk(now, b, k, self._step_k, self._step_var)

    @staticmethod
    def _fit_run(k: int, extra_blocks: Callable[[int], int], free: int) -> int:
        """The longest run of at most ``k`` steps whose KV blocks fit in ``free``."""
        if extra_blocks(k) <= free:
            return k
        lo, hi = 1, k  # extra_blocks(1) == 0: step 1 is already allocated
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if extra_blocks(mid) <= free:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _start_bulk(self, now: float, b: int, k: int, k0: int, var_src: VarSource) -> None:
        durs = self.model.decode_run_s(b, k0, k)
        # ``now + cumsum(durs)``: numpy's cumsum adds in order, as this loop does.
        ends = []
        elapsed = 0.0
        for d in durs:
            elapsed += d
            ends.append(now + elapsed)
        self._bulk_durs = durs
        self._bulk_ends = ends
        self._bulk_start = now
        self._bulk_done = 0
        self._bulk_k0 = k0
        self._bulk_ctx = var_src
        self._bulk_var = None
        self._token += 1
        self.sink.schedule(ends[-1], self, self._token)

    # -- commits ----------------------------------------------------------------------------------
    def _commit_step(self, now: float) -> None:
        prefill = self._step_prefill
        visible = self.role != "prefill"
        group = self._group if self._step_grouped else None
        # Inter-token gaps in the order tokens are emitted (the histogram's float sum depends
        # on it), and the requests that finish, in the order they leave.
        gaps: list[float] = []
        done: list[SimRequest] = []
        joining: list[SimRequest] = []
        unfinished = False
        tokens = 0
        for req, n, _ctx in prefill:
            req.computed += n
            tokens += n
            if req.computed >= req.prompt_len:
                req.generated += 1
                if self._prefix is not None and req.gen_base == 0:
                    self._prefix_insert(req)
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
            for req in self._step_decode:
                # A scheduled decode has had its first token (its prefill emitted it).
                gen = req.generated + 1
                req.generated = gen
                gaps.append(now - req.last_token_s)
                req.last_token_s = now
                if gen >= req.target:
                    done.append(req)
            itl.observe_seq(gaps)
            n_decode = len(self._step_decode)
        self.tokens_generated += n_decode
        wall = self._step_dur
        self.busy_time_s += wall
        self._record_fpm(
            wall, self._step_desc, self._step_var, self._queued(), emit=self.on_fpm is not None
        )
        self._step_prefill = []
        self._step_decode = []
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

    def _commit_bulk(self, m: int, *, final: bool) -> None:
        ends, durs = self._bulk_ends, self._bulk_durs
        assert ends is not None
        c = self._bulk_done
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
            done = self._commit_bulk_stepped(m, c, last_end, final)
        self.tokens_generated += m * b
        self.busy_time_s += seg_s
        queued = self._queued()
        if self.on_fpm is not None:
            var = self._bulk_decode_var()
            for j in range(c, c + m):
                sched = (0.0, 0.0, 0.0, 0.0, float(b), float(self._bulk_k0 + j * b))
                self._record_fpm(durs[j], sched, var, queued, emit=True)
        else:
            j = c + m - 1
            sched = (0.0, 0.0, 0.0, 0.0, float(b), float(self._bulk_k0 + j * b))
            self.counter_id += m - 1
            self.iterations += m - 1
            var_src = self._bulk_ctx if self._bulk_var is None else self._bulk_var
            self._record_fpm(durs[j], sched, var_src, queued, emit=False)
        self._bulk_done = c + m
        if final:
            if group is not None:
                self._leave_group(group, done)
            else:
                self._remove_running(done)
            self._hand_back(done, last_end)

    def _commit_bulk_stepped(
        self, m: int, c: int, last_end: float, final: bool
    ) -> list[SimRequest]:
        """Per-request accounting of ``m`` iterations of a run (no decode group)."""
        ends, durs = self._bulk_ends, self._bulk_durs
        assert ends is not None
        seg_start = ends[c - 1] if c else self._bulk_start
        first_end = ends[c]
        itl = self.itl
        bs = self.block_size
        # Blocks for the next iteration (partial commit) or the last one run (final).
        shift = 1 if final else 0
        free = self.free_blocks
        done: list[SimRequest] = []
        for req in self._running:
            last = req.last_token_s
            if last - seg_start > _EPS or seg_start - last > _EPS:
                # This request's previous token came earlier than the run's start (it was
                # starved or just admitted): its first gap is longer than the iteration.
                itl.observe(durs[c], -1)
                itl.observe(first_end - last)
            gen = req.generated + m
            req.generated = gen
            req.last_token_s = last_end
            need = -(-(req.prompt_len + gen - req.gen_base - shift) // bs)
            blocks = req.blocks
            if need > blocks:
                free -= need - blocks
                req.blocks = need
            if gen >= req.target:
                done.append(req)
        self.free_blocks = free
        return done

    # -- forward-pass metrics ------------------------------------------------------------------
    # An FPM's scheduled section is kept as six figures plus the decode contexts' variance,
    # or what to compute it from (``VarSource``) until an FPM is actually built: a replay
    # reads only the latest FPM of each rank once per tick, so most variances are never needed.
    def _bulk_decode_var(self) -> float:
        """Variance of a planned run's decode contexts (every step adds one token to each,
        so it is the same for the whole run); computed once per run."""
        if self._bulk_var is None:
            self._bulk_var = _var_of(self._bulk_ctx)
        return self._bulk_var

    def _record_fpm(
        self,
        wall: float,
        sched: tuple[float, ...],
        var_src: VarSource,
        queued: tuple[int, ...],
        *,
        emit: bool,
    ) -> None:
        self.counter_id += 1
        self.iterations += 1
        self._last_fpm = (wall, sched, var_src, queued)
        if emit and self.on_fpm is not None:
            self.on_fpm(self._build_fpm(wall, sched, var_src, queued, self.counter_id))

    def _emit_idle(self) -> None:
        self.counter_id += 1
        zero = (0.0,) * 6
        self._last_fpm = (0.0, zero, 0.0, self._queued())
        if self.on_fpm is not None:
            self.on_fpm(self._build_fpm(0.0, zero, 0.0, self._queued(), self.counter_id))

    def _build_fpm(
        self,
        wall: float,
        sched: tuple[float, ...],
        var_src: VarSource,
        q: tuple[int, ...],
        counter: int,
    ) -> ForwardPassMetrics:
        queued = self._queue_section(q)
        return ForwardPassMetrics(
            version=FPM_VERSION,
            worker_id=self.worker_id,
            dp_rank=self.dp_rank,
            counter_id=counter,
            wall_time=wall,
            scheduled_requests=ScheduledRequestMetrics(
                num_prefill_requests=int(sched[0]),
                sum_prefill_tokens=int(sched[1]),
                var_prefill_length=float(sched[2]),
                sum_prefill_kv_tokens=int(sched[3]),
                num_decode_requests=int(sched[4]),
                sum_decode_kv_tokens=int(sched[5]),
                var_decode_kv_tokens=float(_var_of(var_src)),
            ),
            queued_requests=QueuedRequestMetrics(
                num_prefill_requests=int(queued[0]),
                sum_prefill_tokens=int(queued[1]),
                var_prefill_length=float(queued[2]),
                num_decode_requests=int(queued[3]),
                sum_decode_kv_tokens=int(queued[4]),
                var_decode_kv_tokens=float(queued[5]),
            ),
        )

    def latest_fpm(self) -> ForwardPassMetrics | None:
        """The FPM of the last iteration (or idle heartbeat) this rank finished."""
        if self._last_fpm is None:
            return None
        wall, sched, var_src, queued = self._last_fpm
        if not isinstance(var_src, float):
            var_src = _var_of(var_src)  # once: it is read again each tick while the rank idles
            self._last_fpm = (wall, sched, var_src, queued)
        return self._build_fpm(wall, sched, var_src, queued, self.counter_id)
