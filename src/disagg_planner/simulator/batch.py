"""What one engine rank runs next: vLLM v1 continuous batching over a paged KV cache.

Each iteration (``_schedule_pass``), as vLLM v1 does:

1. one token budget (``max_num_batched_tokens``) shared by decodes and prefill chunks;
2. running requests first, in admission order: a decode takes one token, an unfinished
   prefill takes ``min(remaining prompt, remaining budget)`` (chunked prefill);
3. a running request whose KV blocks cannot be allocated preempts the most recently admitted
   running request (LIFO) and retries; preempted requests lose their KV and are recomputed
   (prompt plus generated tokens) when readmitted at the head of the waiting queue;
4. only if nothing was preempted, waiting requests are admitted in FCFS order while budget,
   ``max_num_seqs`` and KV blocks allow; prefix-cache hits (Mooncake ``hash_ids``) skip
   compute but still hold blocks (TensorRT-LLM's default capacity scheduler admits only what
   fits with its whole output, and so never preempts);
5. a prefill that completes samples its first token in the same pass (the commit, in
   :mod:`~disagg_planner.simulator.scheduler`).

:class:`RankBatch` holds a rank's requests and KV blocks and builds the next iteration into
its :class:`~disagg_planner.simulator.iteration.Step`; the engine rank
(:class:`~disagg_planner.simulator.scheduler.EngineCore`) runs it in time and accounts it.
While every running request decodes in lockstep they are kept as one
:class:`~disagg_planner.simulator.decode_group.DecodeGroup`, so that a pass costs the same
whatever the batch size.
"""

from __future__ import annotations

from collections import deque
from typing import Literal

from disagg_planner.simulator.decode_group import DecodeGroup
from disagg_planner.simulator.engine_model import EngineModel
from disagg_planner.simulator.iteration import (
    ADMITTED,
    EMPTY_QUEUE,
    NOTHING_NEW,
    PREEMPTED,
    PassOutcome,
    PrefillChunk,
    Queued,
    QueueTotals,
    Step,
)
from disagg_planner.simulator.prefix_cache import PrefixCache
from disagg_planner.simulator.request import SimRequest

Role = Literal["prefill", "decode", "agg"]


class RankBatch:
    """The requests and KV blocks of one data-parallel rank, and the pass that picks what
    its next iteration runs."""

    def __init__(self, *, model: EngineModel, role: Role, prefix_block_tokens: int) -> None:
        spec = model.spec
        self.model = model
        self.role: Role = role
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
        # The waiting queue's totals (routing reads them), and their snapshot for the next
        # FPM, taken once per change at most (None: changed since the last one).
        self._queue = QueueTotals()
        self._queued: Queued | None = EMPTY_QUEUE
        self._running: list[SimRequest] = []
        # Set while every running request decodes in lockstep (see the module doc); its
        # members are the first ``n`` of ``_running``, the rest are just admitted.
        self._group: DecodeGroup | None = None
        # The single iteration the last pass built.
        self._step = Step()
        self.preemptions = 0
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
        self._queue.add(req, 1)
        self._queued = None
        if front:
            self.waiting.appendleft(req)
        else:
            self.waiting.append(req)

    def _queue_now(self) -> Queued:
        """The waiting queue's totals now, as an FPM keeps them."""
        queued = self._queued
        if queued is None:
            queued = self._queued = self._queue.snapshot()
        return queued

    def _clear_queue(self) -> None:
        self.waiting.clear()
        self._queue = QueueTotals()
        self._queued = EMPTY_QUEUE

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
            self._queue.add(req, -1)
            self._queued = None
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

    def _remove_running(self, done: list[SimRequest]) -> None:
        if not done:
            return
        running = self._running
        if len(done) == 1:
            running.remove(done[0])  # identity comparison, in C
        else:
            gone = set(map(id, done))
            running[:] = [r for r in running if id(r) not in gone]


__all__ = ["RankBatch", "Role"]
