"""Wall time of one scheduler iteration of one engine rank: a calibrated roofline.

Model (per data-parallel rank, whose ``tp`` GPUs work in lockstep; all quantities per GPU):

- Tokens this iteration ``T = P + B`` (``P`` fresh prefill tokens, ``B`` decode requests).
- **GEMMs**: ``F_lin = 2 * N_active * T / tp`` FLOPs (``N_active``: weights one token multiplies
  through; MoE counts the shared plus top-k routed experts) against the weight bytes read once
  per iteration (dense weights; for MoE only the experts some token of the global batch
  ``T * dp`` routes to: ``E/ep_group * (1 - (1 - k/E)^(T*dp))`` experts per layer per GPU).
  Time ``max((F_prefill / e_prefill + F_decode / e_decode) / (peak * k(T)), bytes / (HBM *
  e_hbm))``: the FLOPs of prefill-chunk tokens and of sampling rows (decodes, and each
  prefilling request's last token) each at their own end-to-end efficiency (per weight dtype
  and backend), ``k(T) = T / (T + T_half)`` the tokens-per-GEMM
  knee of Vidur's profiles, ``e_hbm`` the weight-stream efficiency of the GPU.
- **Attention**: prefill ``pairs = sum_i n_i * (c_i + (n_i + 1) / 2)`` (new tokens ``n_i``
  attending to ``c_i`` earlier tokens plus causally to themselves), decode one pair per KV
  token; FLOPs ``pairs * flops_per_pair / tp`` at the BF16 peak times ``e_attn``, against the
  KV bytes read and written at ``HBM * e_kv`` (the backend's KV-read efficiency). Time is
  again the larger of the two.
- **Communication**: TP all-reduce twice per layer (ring: ``2 (tp-1)/tp * T * hidden * 2 B``
  over NVLink, plus a fixed latency); EP dispatch + combine per MoE layer
  (``T * top_k * hidden * (1 + 2) B * (g-1)/g``) over NVLink inside an NVLink domain,
  otherwise over the scale-out network.
- **Elementwise kernels**: ``T * L * 2 B * (a_h * hidden + a_f * ffn / tp)`` activation bytes
  through HBM, added (these kernels do not overlap the GEMMs).
- **Speculative decoding** (the spec's ``nextn=N:accept=A``): each decode iteration verifies
  ``N + 1`` tokens per sequence (GEMM rows, communication and attention FLOPs ``x (N + 1)``;
  the KV is read once) and first drafts them in ``N`` passes of a one-layer draft (EAGLE's
  head, one MTP module), each one decoder layer's weights, KV and overhead; the scheduler
  gives a request ``1 + ceil((osl - 1) / A)`` iterations (``EngineSpec.decode_iterations``).
- **Overhead**: ``step + layer * L + request * (B + prefill requests)`` (scheduling, sampling,
  kernel launches under CUDA graphs); ``step`` and ``request`` per backend; ``layer`` adds,
  per backend, the activation-quantisation kernels of an FP8 model and, on vLLM's V0 engine
  (a release before 0.8, the spec's ``version``), the CPU work it exposes between steps.

The fitted factors live in ``engine_fit.yaml`` (each with the training points it was fitted
to; ``python -m disagg_planner.simulator.fit`` refits them), the priors in ``catalogue.yaml``;
``CALIBRATION.md`` has the training and validation tables.
Every function accepts numpy arrays for ``decode_kv_tokens`` so that a run of decode
iterations whose KV grows by ``B`` tokens per step is timed in one vectorised call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import overload

import numpy as np
import numpy.typing as npt

from disagg_planner.simulator import catalogue
from disagg_planner.simulator.catalogue import DTYPE_BYTES, Efficiency
from disagg_planner.simulator.engine_spec import EngineSpec, coerce
from disagg_planner.simulator.errors import EngineSpecError

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class EngineCapabilities:
    """What an engine advertises (Dynamo's ModelRuntimeConfig / WorkerInfo fields)."""

    gpus: int
    dp: int
    total_kv_blocks: int  # per data-parallel rank
    kv_cache_block_size: int
    max_kv_tokens: int  # per data-parallel rank
    max_num_seqs: int
    max_num_batched_tokens: int
    context_length: int


class EngineModel:
    """Timing and memory model of one ``sim:`` engine spec; stateless and cheap to call.

    Build engines with :func:`disagg_planner.simulator.engines.engine_for`, which picks this
    model or AIConfigurator's by the spec's timing."""

    def __init__(self, spec: EngineSpec | str, *, efficiency: Efficiency | None = None) -> None:
        self.spec = coerce(spec)
        if self.spec.timing == "aic" and type(self) is EngineModel:
            # The roofline would time it silently: an aic: spec is built by the factory.
            raise EngineSpecError(
                f"engine spec {self.spec}: an aic: spec is timed by AIConfigurator's tables; "
                "build its engine with disagg_planner.simulator.engines.engine_for"
            )
        self.eff = efficiency or catalogue.efficiency()
        s, m, g, e = self.spec, self.spec.model, self.spec.gpu, self.eff
        wbytes = DTYPE_BYTES[m.weight_dtype]
        tp, dp = s.tp, s.dp
        self._tp = tp
        self._dp = dp
        self._layers = m.layers
        # GEMM FLOPs per token per GPU, split into the part every token runs (attention
        # projections, dense MLPs, shared experts) and the routed experts.
        routed_active = 0.0
        if m.moe is not None:
            routed_active = float(m.moe_layers * m.moe.top_k * m.expert_params)
        self._flops_dense_per_token = 2.0 * (m.active_linear_params - routed_active) / tp
        self._flops_routed_per_token = 2.0 * routed_active / tp
        self._flops_lm_head_per_logit = 2.0 * (m.vocab * m.hidden) / tp
        be = e.backend(s.backend)
        self.backend_eff = be
        peak = g.peak_flops(m.weight_dtype)
        # Seconds per GEMM FLOP of a prefill token and of a decode token at full tiles.
        self._s_per_flop_prefill = 1.0 / (peak * be.gemm_prefill[m.weight_dtype])
        self._s_per_flop_decode = 1.0 / (peak * be.gemm_decode[m.weight_dtype])
        self._attn_peak = g.bf16_flops * be.attention
        self._hbm = g.hbm_bytes_per_s * e.hbm_for(g.name)  # weights and activations
        self._kv_hbm = g.hbm_bytes_per_s * be.kv_read  # KV-cache reads and writes
        self._request_overhead = be.request_overhead_s
        self._half = e.gemm_half_tokens
        # Weight bytes streamed per iteration per GPU (the embedding table is only gathered).
        dense_weights = m.non_expert_params - m.embedding_params
        self._dense_weight_bytes = dense_weights * wbytes / tp
        if m.moe is not None:
            self._experts = m.moe.routed_experts
            self._top_k = m.moe.top_k
            self._expert_bytes_per_gpu_layer = (
                m.moe.routed_experts * m.expert_params * wbytes / (tp * dp)
            )
        else:
            self._experts = 0
            self._top_k = 0
            self._expert_bytes_per_gpu_layer = 0.0
        self._moe_layers = m.moe_layers
        # Elementwise kernels (norms, residual adds, rotary, activation) stream activations
        # through HBM: hidden-sized tensors are replicated on TP ranks, ffn-sized ones split.
        if m.moe is not None:
            ffn_width = (m.moe.top_k + m.moe.shared_experts) * m.moe.expert_ffn
        else:
            ffn_width = m.ffn
        self._act_bytes_per_token = (
            m.layers
            * 2.0
            * (e.activation_hidden_passes * m.hidden + e.activation_ffn_passes * ffn_width / tp)
        )
        # KV cache: GQA heads are split over TP (replicated when tp > kv_heads); the MLA latent
        # is replicated on every TP rank.
        kv_shards = 1 if m.mla is not None else min(tp, m.kv_heads)
        self.kv_bytes_per_token = m.kv_bytes_per_token  # whole model, all layers
        self._kv_bytes_per_token_gpu = m.kv_bytes_per_token / kv_shards
        self._attn_prefill_flops_pair = m.attention_flops_per_pair(decode=False) / tp
        self._attn_decode_flops_pair = m.attention_flops_per_pair(decode=True) / tp
        # Communication.
        link = g.nvlink_bytes_per_s if tp <= g.nvlink_domain else g.scale_out_bytes_per_s
        self._ar_bytes_per_token = (2.0 * (tp - 1) / tp) * m.hidden * 2.0 if tp > 1 else 0.0
        self._ar_bw = link * e.link_efficiency
        self._ar_count = 2 * m.layers if tp > 1 else 0
        group = tp * dp
        self._ep_active = m.moe is not None and group > 1
        if self._ep_active and m.moe is not None:
            ep_link = g.nvlink_bytes_per_s if group <= g.nvlink_domain else g.scale_out_bytes_per_s
            self._ep_bytes_per_token = m.moe.top_k * m.hidden * 3.0 * (group - 1) / group
            self._ep_bw = ep_link * e.link_efficiency
        else:
            self._ep_bytes_per_token = 0.0
            self._ep_bw = 1.0
        per_layer = e.layer_overhead_s
        if m.weight_dtype == "fp8":
            per_layer += be.fp8_layer_overhead_s
        if s.legacy_engine:
            per_layer += be.legacy_layer_overhead_s
        self._fixed_overhead = be.step_overhead_s + per_layer * m.layers
        # Speculative decoding: rows verified per decoding sequence, and the draft passes'
        # cost per decode iteration: n passes of one decoder layer (weights or FLOPs, KV read,
        # per-layer overhead) over the batch.
        self._verify = s.num_speculative_tokens + 1
        self._draft_passes = s.num_speculative_tokens
        self._draft_layer_weight_s = self._dense_weight_bytes / m.layers / self._hbm
        self._draft_layer_flops = self._flops_dense_per_token / m.layers
        self._draft_layer_overhead = per_layer
        # Memory for the KV cache.
        weights_resident = (m.non_expert_params * wbytes / tp) + (
            m.routed_expert_params_total * wbytes / (tp * dp)
        )
        self.weight_bytes_per_gpu = weights_resident
        if s.backend == "trtllm":
            # TensorRT-LLM's kv_cache_free_gpu_mem_fraction: a share of the memory left
            # after the weights and activations (vLLM and SGLang: of the whole GPU).
            free = g.memory_bytes - weights_resident - e.activation_reserve_bytes
            free *= s.gpu_memory_utilization
        else:
            free = g.memory_bytes * s.gpu_memory_utilization - weights_resident
            free -= e.activation_reserve_bytes
        tokens = int(free // self._kv_bytes_per_token_gpu) if free > 0 else 0
        self.kv_blocks = tokens // s.block_size
        if self.kv_blocks < 1:
            budget = g.memory_bytes * s.gpu_memory_utilization / 1e9
            raise EngineSpecError(
                f"engine spec {s}: {weights_resident / 1e9:.1f} GB of weights per GPU plus "
                f"{e.activation_reserve_bytes / 1e9:.1f} GB reserve leave no room for a KV cache "
                f"in {budget:.1f} GB ({g.name} x gpu_memory_utilization "
                f"{s.gpu_memory_utilization}); use more GPUs (tp/dp) or a smaller precision"
            )
        self.max_kv_tokens = self.kv_blocks * s.block_size
        limit = s.max_model_len or m.max_context
        self.max_model_len = min(limit, self.max_kv_tokens)
        self._decode_base: dict[int, float] = {}  # decode_run_s's, by batch size
        # Every step time is multiplied by this (the spec's speed multiple, engine_spec's doc):
        # applied in the two public timing methods, whatever model times the step.
        self._step_scale = 1.0 / s.speed

    # ------------------------------------------------------------------------------------------
    @property
    def capabilities(self) -> EngineCapabilities:
        s = self.spec
        return EngineCapabilities(
            gpus=s.gpus,
            dp=s.dp,
            total_kv_blocks=self.kv_blocks,
            kv_cache_block_size=s.block_size,
            max_kv_tokens=self.max_kv_tokens,
            max_num_seqs=s.max_num_seqs,
            max_num_batched_tokens=s.max_num_batched_tokens,
            context_length=self.max_model_len,
        )

    def _gemm_eff(self, tokens: float) -> float:
        return tokens / (tokens + self._half)

    @overload
    def iteration_time_s(
        self,
        prefill_tokens: int,
        prefill_context_tokens: int,
        decode_requests: int,
        decode_kv_tokens: int | float,
        *,
        prefill_requests: int | None = ...,
        prefill_attention_pairs: float | None = ...,
    ) -> float: ...

    @overload
    def iteration_time_s(
        self,
        prefill_tokens: int,
        prefill_context_tokens: int,
        decode_requests: int,
        decode_kv_tokens: FloatArray,
        *,
        prefill_requests: int | None = ...,
        prefill_attention_pairs: float | None = ...,
    ) -> FloatArray: ...

    def iteration_time_s(
        self,
        prefill_tokens: int,
        prefill_context_tokens: int,
        decode_requests: int,
        decode_kv_tokens: int | float | FloatArray,
        *,
        prefill_requests: int | None = None,
        prefill_attention_pairs: float | None = None,
    ) -> float | FloatArray:
        """Seconds one iteration of one data-parallel rank takes.

        ``prefill_tokens``: fresh prompt tokens computed this iteration (all prefill requests);
        ``prefill_context_tokens``: earlier tokens those prefills attend to (prefix-cache hits
        and previous chunks); ``decode_requests``: requests generating one token each;
        ``decode_kv_tokens``: their summed context (may be an array, giving an array).
        ``prefill_requests`` defaults to 1 when there are prefill tokens;
        ``prefill_attention_pairs`` defaults to the single-request value
        ``P * (C + (P + 1) / 2)``; the engine scheduler passes the exact per-request sum.
        """
        seconds = self._iteration_s(
            prefill_tokens,
            prefill_context_tokens,
            decode_requests,
            decode_kv_tokens,
            prefill_requests=prefill_requests,
            prefill_attention_pairs=prefill_attention_pairs,
        )
        # the spec's speed multiple (1.0 leaves the model's floats untouched)
        return seconds if self._step_scale == 1.0 else seconds * self._step_scale

    def decode_run_s(self, batch: int, kv_tokens: int, steps: int) -> list[float]:
        """Seconds of each of ``steps`` decode-only iterations of ``batch`` requests whose
        summed context is ``kv_tokens`` at the first and grows by ``batch`` per step: the
        same floats as ``iteration_time_s(0, 0, batch, kv_tokens + batch * arange(steps))``."""
        durs = self._decode_run_s(batch, kv_tokens, steps)
        scale = self._step_scale
        return durs if scale == 1.0 else [d * scale for d in durs]

    # -- the timing model; a subclass with other timings overrides these two -----------------
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
        """:meth:`iteration_time_s` at the timing model's own speed."""
        p = int(prefill_tokens)
        b = int(decode_requests)
        if p < 0 or b < 0 or prefill_context_tokens < 0:
            raise ValueError(
                f"iteration_time_s: negative input (prefill_tokens={p}, "
                f"prefill_context_tokens={prefill_context_tokens}, decode_requests={b})"
            )
        n_prefill = (1 if p > 0 else 0) if prefill_requests is None else int(prefill_requests)
        base = self._base_s(p, prefill_context_tokens, b, n_prefill, prefill_attention_pairs)
        if b == 0:
            if isinstance(decode_kv_tokens, np.ndarray):
                return np.full(decode_kv_tokens.shape, base)
            return base
        kv = decode_kv_tokens
        attn_flops_d = kv * self._attn_decode_flops_pair * self._verify / self._attn_peak
        attn_bytes_d = kv * (self._kv_bytes_per_token_gpu / self._kv_hbm)
        if self._draft_passes:
            base += self._draft_fixed_s(b)
            attn_bytes_d = attn_bytes_d * (1.0 + self._draft_passes / self._layers)
        if isinstance(kv, np.ndarray):
            return base + np.maximum(attn_flops_d, attn_bytes_d)
        return base + max(float(attn_flops_d), float(attn_bytes_d))

    def _draft_fixed_s(self, b: int) -> float:
        """The draft passes of one decode iteration of ``b`` sequences, but their KV reads
        (one layer's share of the decode attention each, added by the callers)."""
        flops = self._draft_layer_flops * b * self._s_per_flop_decode / self._gemm_eff(b)
        weights = self._draft_layer_weight_s
        return self._draft_passes * (max(flops, weights) + self._draft_layer_overhead)

    def _decode_run_s(self, batch: int, kv_tokens: int, steps: int) -> list[float]:
        """:meth:`decode_run_s` at the timing model's own speed.

        A planned decode run is usually a few steps long (the next request finishes soon),
        where a Python loop beats numpy's per-call overhead, and the part that does not
        depend on the context is the same for every run of the batch size: it is cached.
        """
        base = self._decode_base.get(batch)
        if base is None:
            base = self._base_s(0, 0, batch, 0, None)
            if self._draft_passes:
                base += self._draft_fixed_s(batch)
            self._decode_base[batch] = base
        flops_pair = self._verify * self._attn_decode_flops_pair
        peak = self._attn_peak
        bytes_per_s = self._kv_bytes_per_token_gpu / self._kv_hbm
        if self._draft_passes:
            bytes_per_s *= 1.0 + self._draft_passes / self._layers
        if steps > 64:
            kv = kv_tokens + batch * np.arange(steps, dtype=np.float64)
            durs = base + np.maximum(kv * flops_pair / peak, kv * bytes_per_s)
            out: list[float] = durs.tolist()
            return out
        out = []
        for i in range(steps):
            kv_f = float(kv_tokens + batch * i)  # exact: far below 2**53
            t_flops = kv_f * flops_pair / peak
            t_bytes = kv_f * bytes_per_s
            # max(), without a call: the loop runs once per planned iteration
            out.append(base + (t_flops if t_flops >= t_bytes else t_bytes))
        return out

    def _base_s(
        self,
        p: int,
        prefill_context_tokens: int,
        b: int,
        n_prefill: int,
        prefill_attention_pairs: float | None,
    ) -> float:
        """Everything of an iteration but the decode attention, which grows with the KV (and
        but the draft passes of speculative decoding)."""
        bt = b * self._verify  # GEMM rows of the decodes: each verifies its drafts too
        tokens = p + bt
        # GEMMs: the dense part of every token ...
        t_gemm = 0.0
        if tokens > 0:
            dense = self._flops_dense_per_token
            head = self._flops_lm_head_per_logit
            # Seconds per FLOP of this batch's token mix: a prefill chunk's tokens at the prefill
            # efficiency, but the one row per request that samples a token (a decode, or the
            # last prompt token, e.g. the one a decode engine recomputes for transferred KV)
            # at the decode efficiency.
            s_prefill = self._s_per_flop_prefill
            s_decode = self._s_per_flop_decode
            rows = n_prefill if n_prefill < p else p
            chunk = p - rows
            t_full = dense * chunk * s_prefill + (dense + head) * (bt + rows) * s_decode
            # divided by _gemm_eff(tokens), inline (this runs once per simulated iteration)
            t_flops = t_full * (tokens + self._half) / tokens
            weight_bytes = self._dense_weight_bytes
            if self._moe_layers:
                global_tokens = tokens * self._dp
                touched = 1.0 - (1.0 - self._top_k / self._experts) ** global_tokens
                weight_bytes += self._moe_layers * self._expert_bytes_per_gpu_layer * touched
                per_expert = global_tokens * self._top_k / self._experts
                routed = self._flops_routed_per_token * (chunk * s_prefill + (bt + rows) * s_decode)
                t_flops += routed / self._gemm_eff(per_expert)
            t_weights = weight_bytes / self._hbm
            t_gemm = t_flops if t_flops >= t_weights else t_weights  # max(), without a call
            t_gemm += tokens * self._act_bytes_per_token / self._hbm
        # Attention: prefill (compute-bound) and decode (KV-read bound) kernels.
        if p > 0:
            pairs = (
                float(prefill_attention_pairs)
                if prefill_attention_pairs is not None
                else p * (prefill_context_tokens + (p + 1) / 2.0)
            )
            attn_flops = pairs * self._attn_prefill_flops_pair
            kv_bytes = (prefill_context_tokens + p) * self._kv_bytes_per_token_gpu
            t_attn_flops = attn_flops / self._attn_peak
            t_attn_bytes = kv_bytes / self._kv_hbm
            t_prefill_attn = t_attn_flops if t_attn_flops >= t_attn_bytes else t_attn_bytes
        else:
            t_prefill_attn = 0.0
        overhead = self._fixed_overhead + self._request_overhead * (b + n_prefill)
        comm = 0.0
        if tokens > 0:
            if self._ar_count:
                comm += self._ar_count * (
                    self.eff.allreduce_latency_s + tokens * self._ar_bytes_per_token / self._ar_bw
                )
            if self._ep_active:
                comm += (
                    2 * self._moe_layers * self.eff.alltoall_latency_s
                    + self._moe_layers * tokens * self._ep_bytes_per_token / self._ep_bw
                )
        return t_gemm + t_prefill_attn + overhead + comm

    # -- convenience views used by profiling and the oracle ----------------------------------------
    def prefill_time_s(self, isl: int, *, cached_tokens: int = 0) -> float:
        """One request's prefill alone on an idle engine, chunked by ``max_num_batched_tokens``
        (engine time only; the frontend adds its own latency)."""
        if isl < 1:
            raise ValueError(f"prefill_time_s: isl={isl} must be >= 1")
        chunk = self.spec.max_num_batched_tokens
        done = min(cached_tokens, isl - 1)
        total = 0.0
        while done < isl:
            n = min(chunk, isl - done)
            total += self.iteration_time_s(n, done, 0, 0)
            done += n
        return total

    def decode_step_time_s(self, batch: int, context_tokens: float) -> float:
        """One decode iteration of ``batch`` requests each holding ``context_tokens`` of KV."""
        return float(self.iteration_time_s(0, 0, batch, batch * context_tokens))

    def max_decode_batch(self, context_tokens: float) -> int:
        """Largest decode batch the KV cache and ``max_num_seqs`` allow at that context."""
        if context_tokens <= 0:
            return self.spec.max_num_seqs
        blocks_each = math.ceil(context_tokens / self.spec.block_size)
        return max(0, min(self.spec.max_num_seqs, self.kv_blocks // blocks_each))
