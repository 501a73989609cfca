"""Keeping CPython's cyclic garbage collector off a simulation's objects.

A replay holds hundreds of thousands of long-lived objects (the trace's requests, the finished
records, the engines' queues) and allocates millions of short-lived ones, almost none of them
in reference cycles (they are freed by reference counting). The collector nevertheless walks
every tracked object in each full collection, which it starts whenever the long-lived set has
grown by a quarter, and in each young collection walks whatever a slice of simulation left
alive. :func:`advance` runs a slice with the collector off and then moves everything alive
into the collector's permanent generation (``gc.freeze``), so that no later collection walks
it again; :class:`FrozenHeap` puts those objects back (``gc.unfreeze``) when the simulation
is over.

They go back into the oldest generation, which only a full collection walks, and CPython starts
one only when the objects that *survived* young collections outnumber a quarter of the old ones:
objects coming back from the permanent generation are not counted. A simulation that is thrown
away is such garbage, and it is cyclic (each engine holds its cluster, to report to it), so
reference counting does not free it: a search that runs thousands of short simulations (the
oracle's, the best static deployment's) piled up every one of them (21.7 GB on the Mooncake
conversation trace at 8x load). Every :data:`COLLECT_EVERY` simulations, the outermost span's
end therefore runs a full collection itself; what it frees is the bulk of its cost.

The simulated results do not depend on it (nothing in the simulator uses finalizers or weak
references); ``benchmarks/simulator_speed.py`` measures what it saves.
"""

from __future__ import annotations

import gc
from types import TracebackType
from typing import Any, Protocol


class _Advancing(Protocol):
    def run_until(self, t_s: float, *, stop_when_idle: bool = ...) -> Any: ...


# Outermost spans between two full collections (see the module doc): the garbage of at most
# this many simulations is alive at once.
COLLECT_EVERY = 4


class FrozenHeap:
    """The span of a simulation whose objects the collector leaves alone (nestable: the
    outermost span puts them back, and every :data:`COLLECT_EVERY` outermost spans collects
    the cycles they left)."""

    _depth = 0
    _spans = 0  # outermost spans ended since the last full collection

    def __init__(self) -> None:
        self._enabled = gc.isenabled()

    def __enter__(self) -> FrozenHeap:
        FrozenHeap._depth += 1
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        FrozenHeap._depth -= 1
        if FrozenHeap._depth == 0:
            gc.unfreeze()
            FrozenHeap._spans += 1
            if FrozenHeap._spans >= COLLECT_EVERY:
                FrozenHeap._spans = 0
                gc.collect()
        if self._enabled:
            gc.enable()

    def advance(self, cluster: _Advancing, t_s: float, *, stop_when_idle: bool = False) -> None:
        """``cluster.run_until(t_s)`` with the collector off, then freeze what is alive."""
        gc.disable()
        try:
            cluster.run_until(t_s, stop_when_idle=stop_when_idle)
        finally:
            gc.freeze()
            if self._enabled:
                gc.enable()
