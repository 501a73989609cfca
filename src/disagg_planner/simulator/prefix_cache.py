"""One engine rank's prefix cache: the prompt blocks it has computed, least recently used
evicted first (vLLM's automatic prefix caching, keyed by Mooncake's ``hash_ids``)."""

from __future__ import annotations

from collections import OrderedDict

from disagg_planner.simulator.request import SimRequest


class PrefixCache:
    """``capacity`` blocks of ``block_tokens`` tokens each, by hash."""

    __slots__ = ("_blocks", "block_tokens", "capacity")

    def __init__(self, *, capacity: int, block_tokens: int) -> None:
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.capacity = capacity
        self.block_tokens = block_tokens

    def hit(self, req: SimRequest) -> int:
        """Prompt tokens of ``req`` already cached (its leading blocks found), refreshing them."""
        if not req.hash_ids:
            return 0
        cache = self._blocks
        hits = 0
        for h in req.hash_ids:
            if h not in cache:
                break
            cache.move_to_end(h)
            hits += 1
        # the hashes cover the prompt only (its last block may be partial), not the tokens a
        # resumed request generated before its preemption
        return min(hits * self.block_tokens, req.isl, req.prompt_len - 1)

    def insert(self, req: SimRequest) -> None:
        """Cache the prompt blocks of ``req`` (its prefill has completed)."""
        if not req.hash_ids:
            return
        cache = self._blocks
        for h in req.hash_ids:
            cache[h] = None
            cache.move_to_end(h)
        while len(cache) > self.capacity:
            cache.popitem(last=False)


__all__ = ["PrefixCache"]
