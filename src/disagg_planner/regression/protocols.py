"""The shape of one engine iteration report, as the regression library reads it.

``regression`` imports nothing from the other project packages, so it reads
ForwardPassMetrics structurally: ``disagg_planner.signals.fpm.ForwardPassMetrics`` satisfies
:class:`IterationReport`, and so does any object with the same attributes (a simulator's
record, a test double). Token counts are in tokens, ``wall_time`` in seconds.
"""

from __future__ import annotations

from typing import Protocol

EngineKey = tuple[str, int]
"""``(worker_id, dp_rank)``: one scheduler, i.e. one data-parallel rank of one worker."""


class WorkCounts(Protocol):
    """Requests and tokens of one kind of work: scheduled in the reported iteration, or
    waiting in the engine at its end."""

    @property
    def num_prefill_requests(self) -> int: ...
    @property
    def sum_prefill_tokens(self) -> int: ...
    @property
    def num_decode_requests(self) -> int: ...
    @property
    def sum_decode_kv_tokens(self) -> int: ...


class IterationReport(Protocol):
    """One scheduler iteration of one engine (``wall_time == 0`` is an idle heartbeat)."""

    @property
    def worker_id(self) -> str: ...
    @property
    def dp_rank(self) -> int: ...
    @property
    def counter_id(self) -> int: ...
    @property
    def wall_time(self) -> float: ...
    @property
    def scheduled_requests(self) -> WorkCounts: ...
    @property
    def queued_requests(self) -> WorkCounts: ...
