"""The running requests of one engine rank while they decode in lockstep.

In the steady state of a decode engine every running request decodes and each iteration
schedules them all: they advance together, one token per iteration. The engine
(:class:`~disagg_planner.simulator.scheduler.EngineCore`) then keeps them as a
:class:`DecodeGroup`: per request only what differs (its context and the iteration at which
it finishes, relative to a shared iteration count), per group the sums an iteration needs
(summed context, KV blocks held). An iteration, an admission or a planned run then costs the
same whatever the batch size; a request's own fields are written back when it leaves the
group, and when someone reads the engine's ``running``.
"""

from __future__ import annotations

import heapq

from disagg_planner.simulator.request import SimRequest


class DecodeGroup:
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


__all__ = ["DecodeGroup"]
