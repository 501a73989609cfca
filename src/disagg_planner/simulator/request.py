"""The simulator's view of one request: its trace fields and its progress.

``SimRequest`` is mutable internal state (one object follows a request through the frontend,
the prefill engine, the KV transfer and the decode engine). ``RequestRecord`` is the frozen
outcome handed to users once the request has finished or failed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class RequestLike(Protocol):
    """What the simulator needs from a trace request
    (``disagg_planner.predictors.traces.TraceRequest``)."""

    @property
    def arrival_s(self) -> float: ...

    @property
    def input_length(self) -> int: ...

    @property
    def output_length(self) -> int: ...

    @property
    def hash_ids(self) -> tuple[int, ...] | None: ...


@dataclass(frozen=True)
class RequestRecord:
    """Outcome of one request, as a client would measure it.

    Times are simulation seconds; ``ttft_ms`` is first token minus arrival, ``itl_ms`` the
    mean gap between the remaining tokens ``(finish - first_token) / (osl - 1)`` (None for a
    single-token answer or a failed request). ``ok`` is False when the request was rejected
    (longer than the engine's context or KV cache) or timed out in the frontend queue.
    """

    request_id: int
    arrival_s: float
    isl: int
    osl: int
    first_token_s: float | None
    finish_s: float
    ttft_ms: float | None
    itl_ms: float | None
    ok: bool
    prefill_worker: str | None = None
    decode_worker: str | None = None
    cached_tokens: int = 0
    preemptions: int = 0
    error: str | None = None

    @property
    def e2e_ms(self) -> float:
        return (self.finish_s - self.arrival_s) * 1000.0

    @classmethod
    def served(cls, req: SimRequest, finish_s: float) -> RequestRecord:
        """The record of ``req``, which got its last token at ``finish_s``.

        Built with one ``__dict__`` store: a frozen dataclass's ``__init__`` sets each of
        the 14 fields through ``object.__setattr__``, a cost a replay pays per request."""
        first = req.first_token_s
        assert first is not None
        itl = (finish_s - first) * 1000.0 / (req.osl - 1) if req.osl > 1 else None
        record = object.__new__(cls)
        object.__setattr__(
            record,
            "__dict__",
            {
                "request_id": req.rid,
                "arrival_s": req.arrival_s,
                "isl": req.isl,
                "osl": req.osl,
                "first_token_s": first,
                "finish_s": finish_s,
                "ttft_ms": (first - req.arrival_s) * 1000.0,
                "itl_ms": itl,
                "ok": True,
                "prefill_worker": req.prefill_worker,
                "decode_worker": req.decode_worker,
                "cached_tokens": req.cached_tokens,
                "preemptions": req.preemptions,
                "error": None,
            },
        )
        return record


class SimRequest:
    """Mutable progress of one request inside the simulator.

    Token bookkeeping on the engine currently holding the request:

    - ``prompt_len``: tokens whose KV must exist before decoding (the ISL, or ISL plus the
      tokens generated so far after a preemption, which vLLM recomputes);
    - ``computed``: of those, how many are in the KV cache (prefix hits, earlier chunks, or the
      KV transferred from a prefill engine);
    - ``generated``: output tokens the client has received (across engines);
    - ``gen_base``: ``generated`` when the current prefill began, so that while decoding the
      KV holds ``prompt_len + generated - gen_base`` tokens.
    """

    __slots__ = (
        "arrival_s",
        "blocks",
        "cached_tokens",
        "computed",
        "decode_worker",
        "dispatch_s",
        "first_token_s",
        "gen_base",
        "generated",
        "group_finish",
        "group_offset",
        "hash_ids",
        "isl",
        "last_token_s",
        "osl",
        "preemptions",
        "prefill_worker",
        "prompt_len",
        "remote_kv",
        "rid",
        "target",
    )

    def __init__(
        self,
        *,
        rid: int,
        arrival_s: float,
        isl: int,
        osl: int,
        hash_ids: tuple[int, ...] | None = None,
    ) -> None:
        self.rid = rid
        self.arrival_s = arrival_s
        self.isl = isl
        self.osl = osl
        self.hash_ids = hash_ids
        self.dispatch_s = arrival_s
        self.first_token_s: float | None = None
        self.last_token_s = arrival_s
        self.generated = 0
        self.prompt_len = isl
        self.computed = 0
        self.gen_base = 0
        self.blocks = 0
        self.cached_tokens = 0
        self.target = osl
        self.preemptions = 0
        self.remote_kv = False
        self.prefill_worker: str | None = None
        self.decode_worker: str | None = None
        # Set by the engine while the request decodes in lockstep with its batch
        # (``decode_group.DecodeGroup``): context minus the group's iteration count, and the
        # iteration count at which the request has generated its last token.
        self.group_offset = 0
        self.group_finish = 0

    @property
    def context(self) -> int:
        """KV tokens needed by the next decode step (prompt plus generated on this engine)."""
        return self.prompt_len + self.generated - self.gen_base

    def __repr__(self) -> str:
        return (
            f"SimRequest(rid={self.rid}, isl={self.isl}, osl={self.osl}, "
            f"computed={self.computed}/{self.prompt_len}, generated={self.generated})"
        )
