"""A second engine model: AIConfigurator's measured kernel tables (``aic:`` engine specs).

``aiconfigurator-core`` (the optional extra ``pip install 'disagg-planner[aic]'``) ships
NVIDIA's per-operation latencies (GEMMs, attention, all-reduce) measured on H100/H200/B200/
GB200/A100 under vLLM, SGLang and TensorRT-LLM, and composes them into step latencies. This
module puts those latencies behind the interface of :class:`EngineModel`, so the simulated
scheduler, the profiler and the oracle run unchanged on either engine model:

- **Step time**: one iteration of ``P`` prefill tokens (``n`` requests, attending to ``C``
  earlier tokens) and ``B`` decode requests (summed context ``K``) takes
  ``shared(P + B) + n * prefill_attention(P/n, C/n) + decode_attention(B, K/B)``: the
  non-attention part of AIConfigurator's mixed step (its GEMMs, norms, communication depend
  on the tokens only), the attention of each prefill chunk (``predict_prefill_latency`` less
  its non-attention part) and the decode attention of the batch at its mean context.
- **KV capacity**: AIConfigurator's ``estimate_num_gpu_blocks`` (weights, activations, NCCL
  and runtime reserves of the backend's memory model) replaces the roofline's memory model.
- **Extrapolation guard**: AIConfigurator interpolates inside its measured grid and
  extrapolates silently outside it. Each answer outside the grid (batch, sequence length or
  GEMM rows beyond the largest measured) is counted in :attr:`AicEngineModel.extrapolations`
  with a note, logged once per kind, and :meth:`AicEngineModel.outside_grid` says it for any
  point.
- **Cache**: AIConfigurator answers in tens of microseconds; a replay asks millions of
  times, so every answer is cached by its (rounded, see ``_bucket``) arguments.
- **Offline**: only models whose config AIConfigurator ships are accepted (by hub id or by
  the catalogue name of the same architecture); any other name is refused before anything is
  loaded, and the library's model-hub download function is replaced by one that refuses, so
  nothing at run time can reach the network.

Nothing here imports ``aiconfigurator_core`` at module import time: the core package works
without the extra, and an ``aic:`` spec without it says how to install it.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from disagg_planner.simulator import aic_tables
from disagg_planner.simulator.catalogue import Efficiency
from disagg_planner.simulator.engine_model import EngineModel, FloatArray
from disagg_planner.simulator.engine_spec import EngineSpec, coerce
from disagg_planner.simulator.errors import EngineSpecError

log = logging.getLogger(__name__)

_KV_QUANT = {"bf16": "bfloat16", "fp16": "bfloat16", "fp8": "fp8"}


def _refuse_download(hf_id: str, filename: str, **_: object) -> dict[str, Any] | None:
    raise EngineSpecError(
        f"aiconfigurator-core tried to download {filename} of {hf_id!r} from the model hub; "
        "the planner never reaches the network at run time"
    )


_SDK: dict[str, Any] = {}


def _sdk() -> dict[str, Any]:
    """AIConfigurator's modules, imported once, with the hub download disabled and its
    per-table loading chatter (INFO/WARNING logs about fallback rows) kept out of our logs."""
    if not _SDK:
        aic_tables.package_dir()
        from aiconfigurator_core.sdk import memory, perf_database, utils
        from aiconfigurator_core.sdk.engine import EngineHandle

        # Every hub fetch of the library goes through this function (config.json and
        # hf_quant_config.json): replaced, no model name can reach the network.
        utils._download_hf_json = _refuse_download
        logging.getLogger(aic_tables.PACKAGE).setLevel(logging.ERROR)
        _SDK.update(
            EngineHandle=EngineHandle,
            estimate_num_gpu_blocks=memory.estimate_num_gpu_blocks,
            resolve_query_version=perf_database.resolve_query_version,
        )
    return _SDK


@dataclass
class _Answers:
    """AIConfigurator's answers for one compiled engine, in milliseconds, by rounded
    arguments, and what of them lay outside the measured grid. Shared by every engine model
    of the spec in the process: a replay builds many (the oracle's plan, each policy's
    cluster) and the first answers of an engine are the slow ones (table loading)."""

    shared: dict[int, float] = field(default_factory=dict)  # tokens
    prefill_attention: dict[tuple[int, int], float] = field(default_factory=dict)  # new, ctx
    decode_attention: dict[int, dict[int, float]] = field(default_factory=dict)  # batch, ctx
    extrapolations: Counter[str] = field(default_factory=Counter)
    logged: set[str] = field(default_factory=set)

    def clear(self) -> None:
        # In place: engine models hold these very dicts.
        for table in (self.shared, self.prefill_attention, self.decode_attention):
            table.clear()
        self.extrapolations.clear()
        self.logged.clear()


@dataclass(frozen=True)
class _Compiled:
    handle: Any  # aiconfigurator_core.sdk.engine.EngineHandle
    version: str
    kv_blocks: int
    grid: aic_tables.MeasuredGrid
    answers: _Answers


def forget_answers() -> None:
    """Drop every cached answer and extrapolation count (the compiled engines stay): what
    the calibration does before each point, so that its flag is the point's own."""
    for compiled in _COMPILED.values():
        compiled.answers.clear()


_COMPILED: dict[tuple[object, ...], _Compiled] = {}


def _compiled(spec: EngineSpec) -> _Compiled:
    """The compiled AIConfigurator engine of ``spec`` (1-5 s the first time; shared by every
    engine model of the same spec in the process)."""
    assert spec.aic_model is not None
    system = aic_tables.SYSTEMS[spec.gpu.name]
    from_catalogue = aic_tables.FROM_CATALOGUE
    gemm_quant = from_catalogue[spec.model.name][1] if spec.model.name in from_catalogue else None
    kv_quant = _KV_QUANT.get(spec.model.kv_dtype)
    key = (
        spec.aic_model,
        system,
        spec.backend,
        spec.tp,
        gemm_quant,
        kv_quant,
        spec.block_size,
        spec.max_num_batched_tokens,
        spec.max_num_seqs,
        spec.gpu_memory_utilization,
    )
    found = _COMPILED.get(key)
    if found is not None:
        return found
    sdk = _sdk()
    quant = {"gemm_quant_mode": gemm_quant, "kvcache_quant_mode": kv_quant}
    try:
        version = str(sdk["resolve_query_version"](system, spec.backend, "current"))
        handle = sdk["EngineHandle"].compile(
            spec.aic_model, system, spec.backend, backend_version=version, tp_size=spec.tp, **quant
        )
        blocks = int(
            sdk["estimate_num_gpu_blocks"](
                spec.aic_model,
                system,
                spec.backend,
                version,
                scheduler_block_size=spec.block_size,
                max_num_tokens=spec.max_num_batched_tokens,
                max_batch_size=spec.max_num_seqs,
                # vLLM and SGLang size the pool from total memory, TRT-LLM from what is free
                memory_fraction_kind="of_free" if spec.backend == "trtllm" else "of_total",
                memory_fraction_value=spec.gpu_memory_utilization,
                tp_size=spec.tp,
                **quant,
            )
        )
    except EngineSpecError:
        raise
    except Exception as exc:  # the library's own errors (unsupported shape, no table, ...)
        raise EngineSpecError(f"engine spec {spec}: AIConfigurator refused it: {exc}") from exc
    if blocks < 1:
        raise EngineSpecError(
            f"engine spec {spec}: AIConfigurator's memory model leaves no KV cache "
            f"({blocks} blocks); use more GPUs (tp) or a smaller precision"
        )
    grid = aic_tables.measured_grid(system, spec.backend)
    found = _COMPILED[key] = _Compiled(handle, version, blocks, grid, _Answers())
    return found


def _bucket(x: float) -> int:
    """``x`` as a cache key of a length: :func:`_bucket_int` of its nearest integer."""
    return _bucket_int(round(x))


def _bucket_int(n: int) -> int:
    """``n`` rounded (half up) to 64 steps per power of two above 128 (<= 0.8% off), kept
    as it is (at least 1) below: so that a replay's continuum of lengths hits a bounded
    cache."""
    if n <= 128:
        return max(n, 1)
    shift = n.bit_length() - 7
    return ((n + (1 << (shift - 1))) >> shift) << shift


def _bucket_end(n: int) -> int:
    """The largest ``m >= n`` with ``_bucket_int(m) == _bucket_int(n)`` and the same step."""
    if n <= 128:
        return n if n >= 1 else 0
    shift = n.bit_length() - 7
    centre = ((n + (1 << (shift - 1))) >> shift) << shift
    return min(centre + (1 << (shift - 1)) - 1, (1 << n.bit_length()) - 1)


class AicEngineModel(EngineModel):
    """:class:`EngineModel` with AIConfigurator's step times and KV capacity (see the module
    doc). Built by ``engines.engine_for(spec)`` for a spec parsed from ``aic:...``."""

    def __init__(self, spec: EngineSpec | str, *, efficiency: Efficiency | None = None) -> None:
        spec = coerce(spec)
        if spec.timing != "aic":
            raise EngineSpecError(f"engine spec {spec}: not an aic: spec")
        super().__init__(spec, efficiency=efficiency)
        compiled = _compiled(spec)
        self._handle = compiled.handle
        self.backend_version = compiled.version
        self.grid = compiled.grid
        self.kv_blocks = compiled.kv_blocks
        self.max_kv_tokens = self.kv_blocks * spec.block_size
        limit = spec.max_model_len or spec.model.max_context
        self.max_model_len = min(limit, self.max_kv_tokens)
        self._answers = compiled.answers
        self._shared_ms = compiled.answers.shared
        self._prefill_attn_ms = compiled.answers.prefill_attention
        self._decode_attn_ms = compiled.answers.decode_attention

    @property
    def extrapolations(self) -> Counter[str]:
        """Answers outside the measured grid, by kind (gemm, prefill batch, prefill sequence,
        decode batch, decode context): how many distinct answers this spec's engine models
        gave in this process so far."""
        return self._answers.extrapolations

    # -- extrapolation guard ---------------------------------------------------------------
    def outside_grid(
        self,
        prefill_tokens: int,
        prefill_context_tokens: int,
        decode_requests: int,
        decode_kv_tokens: float,
        *,
        prefill_requests: int | None = None,
    ) -> list[str]:
        """Why this iteration lies outside AIConfigurator's measured grid (empty: inside)."""
        n = (1 if prefill_tokens > 0 else 0) if prefill_requests is None else prefill_requests
        sequence = (prefill_tokens + prefill_context_tokens) / n if n else 0.0
        mean_kv = decode_kv_tokens / decode_requests if decode_requests else 0.0
        notes = self.grid.notes(
            prefill_tokens + decode_requests, n, sequence, decode_requests, mean_kv
        )
        return [note for _, note in notes]

    def _flag(self, notes: list[tuple[str, str]]) -> None:
        for kind, note in notes:
            if kind not in self._answers.logged:
                self._answers.logged.add(kind)
                log.warning(
                    "%s: %s: AIConfigurator extrapolates outside its measured grid "
                    "(further answers of this kind are counted in extrapolations)",
                    self.spec,
                    note,
                )
            self._answers.extrapolations[kind] += 1

    # -- AIConfigurator's pieces, cached -----------------------------------------------------
    def _shared(self, tokens: int) -> float:
        """Non-attention milliseconds of an iteration of ``tokens`` tokens."""
        ms = self._shared_ms.get(tokens)
        if ms is None:
            if tokens == 0:
                ms = 0.0
            else:
                ms = float(self._handle.mixed_step_breakdown(tokens, 0, tokens, 1)[1])
                self._flag(self.grid.notes(tokens, 0, 0, 0, 0))
            self._shared_ms[tokens] = ms
        return ms

    def _prefill_attn(self, new: float, context: float) -> float:
        """Attention milliseconds of one prefill chunk of ``new`` tokens after ``context``."""
        n_q = _bucket(new)
        c_q = _bucket(context) if context >= 0.5 else 0
        key = (n_q, c_q)
        ms = self._prefill_attn_ms.get(key)
        if ms is None:
            whole = self._handle.predict_prefill_latency(1, n_q + c_q, c_q)
            ms = max(0.0, float(whole) - self._shared(n_q))
            self._flag(self.grid.notes(0, 1, n_q + c_q, 0, 0))
            self._prefill_attn_ms[key] = ms
        # Between buckets the attention of a chunk grows about in proportion to its tokens.
        return ms * (new / n_q)

    def _decode_attn(self, batch: int, kv_tokens: float) -> float:
        """Decode-attention milliseconds of ``batch`` requests holding ``kv_tokens`` in all,
        at the whole tokens of their mean context (integer arithmetic, so that a decode run,
        whose mean grows by exactly one token per step, is timed in segments of equal
        buckets by :meth:`decode_run_s`)."""
        s_q = _bucket_int(int(kv_tokens) // batch)
        by_context = self._decode_attn_ms.get(batch)
        if by_context is None:
            by_context = self._decode_attn_ms[batch] = {}
        ms = by_context.get(s_q)
        if ms is None:
            ms = by_context[s_q] = self._ask_decode_attn(batch, s_q)
        return ms

    def _ask_decode_attn(self, batch: int, context: int) -> float:
        # osl=1: AIConfigurator times the decode token at KV length isl + osl // 2 + 1
        ms = float(self._handle.mixed_step_breakdown(0, batch, max(context - 1, 1), 1)[3])
        self._flag(self.grid.notes(0, 0, 0, batch, context))
        return ms

    # -- the EngineModel timing hooks (its public methods apply the spec's speed) -----------
    def _iteration_s(
        self,
        prefill_tokens: int,
        prefill_context_tokens: int,
        decode_requests: int,
        decode_kv_tokens: int | float | FloatArray,
        *,
        prefill_requests: int | None,
        prefill_attention_pairs: float | None,
    ) -> float | FloatArray:
        """Seconds of one iteration (same arguments as :meth:`EngineModel.iteration_time_s`).

        Several prefills in one iteration are timed as ``n`` equal chunks; with
        ``prefill_attention_pairs`` given, their common context is the one that gives the
        same number of attention pairs.
        """
        p = int(prefill_tokens)
        b = int(decode_requests)
        if p < 0 or b < 0 or prefill_context_tokens < 0:
            raise ValueError(
                f"iteration_time_s: negative input (prefill_tokens={p}, "
                f"prefill_context_tokens={prefill_context_tokens}, decode_requests={b})"
            )
        n = (1 if p > 0 else 0) if prefill_requests is None else int(prefill_requests)
        ms = self._shared(p + b)
        if p > 0 and n > 0:
            chunk = p / n
            context = prefill_context_tokens / n
            if prefill_attention_pairs is not None:
                context = max(0.0, prefill_attention_pairs / p - (chunk + 1.0) / 2.0)
            ms += n * self._prefill_attn(chunk, context)
        if b == 0:
            if isinstance(decode_kv_tokens, np.ndarray):
                return np.full(decode_kv_tokens.shape, ms / 1000.0)
            return ms / 1000.0
        if isinstance(decode_kv_tokens, np.ndarray):
            # One formula for every path: (base + attention) / 1000, as decode_run_s.
            attn = [self._decode_attn(b, float(kv)) for kv in decode_kv_tokens.ravel()]
            total = [(ms + a) / 1000.0 for a in attn]
            return np.asarray(total, dtype=np.float64).reshape(decode_kv_tokens.shape)
        return (ms + self._decode_attn(b, float(decode_kv_tokens))) / 1000.0

    def _decode_run_s(self, batch: int, kv_tokens: int, steps: int) -> list[float]:
        """Seconds of each of ``steps`` decode-only iterations whose summed context starts
        at ``kv_tokens`` and grows by ``batch`` per step (as
        :meth:`EngineModel.decode_run_s`)."""
        base = self._shared(batch)
        by_context = self._decode_attn_ms.get(batch)
        if by_context is None:
            by_context = self._decode_attn_ms[batch] = {}
        out: list[float] = []
        # The mean context of step i is first + i whole tokens: walk it in segments whose
        # bucket is the same, one lookup and one float per segment.
        first = kv_tokens // batch
        last = first + steps - 1
        n = first
        while n <= last:
            end = min(_bucket_end(n), last)
            key = _bucket_int(n)
            ms = by_context.get(key)
            if ms is None:
                ms = by_context[key] = self._ask_decode_attn(batch, key)
            out.extend([(base + ms) / 1000.0] * (end - n + 1))
            n = end + 1
        return out


__all__ = ["AicEngineModel", "forget_answers"]
