"""GPU and model catalogue: typed views of ``catalogue.yaml``.

``gpu("h200")`` and ``model("llama-3.1-8b-fp8")`` look entries up by canonical name or alias
(case-insensitive). A model name may end in a precision suffix (``-fp8``, ``-bf16``,
``-fp4``/``-nvfp4``): the suffix sets the weight precision and, for FP8, also the KV-cache
precision, because FP8 checkpoints (NVIDIA ModelOpt, e.g. ``nvidia/Llama-3.1-8B-Instruct-FP8``)
ship FP8 KV-cache scales that vLLM uses.

Derived shapes (parameter counts, KV bytes per token, FLOPs per token) are computed from the
architecture, never typed in; tests check them against the published parameter counts.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

from disagg_planner.simulator.errors import CatalogueError

DTYPE_BYTES: dict[str, float] = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp4": 0.5}
_SUFFIXES: dict[str, str] = {
    "-fp8": "fp8",
    "-bf16": "bf16",
    "-fp16": "fp16",
    "-nvfp4": "fp4",
    "-fp4": "fp4",
}


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator. FLOPS are dense per GPU; bandwidths in bytes per second."""

    name: str
    bf16_flops: float
    fp8_flops: float | None
    fp4_flops: float | None
    memory_bytes: float
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float
    scale_out_bytes_per_s: float
    nvlink_domain: int
    tdp_w: float
    source: str

    def peak_flops(self, dtype: str) -> float:
        """Dense peak of the tensor cores at ``dtype``; falls back to BF16 where the GPU has
        no faster path (FP8 weights on an A100 run as W8A16)."""
        if dtype == "fp4" and self.fp4_flops:
            return self.fp4_flops
        if dtype in ("fp4", "fp8") and self.fp8_flops:
            return self.fp8_flops
        return self.bf16_flops


@dataclass(frozen=True)
class MlaDims:
    """Multi-head latent attention dimensions (DeepSeek-V2/V3)."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class MoeDims:
    """Mixture-of-experts layout: which layers are MoE and how big each expert is."""

    routed_experts: int
    shared_experts: int
    top_k: int
    expert_ffn: int
    first_dense_layers: int


@dataclass(frozen=True)
class ModelSpec:
    """A model architecture at one weight and KV-cache precision."""

    name: str  # canonical, with the precision suffix when one was given
    base: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    tied_embeddings: bool
    published_params: float
    published_active_params: float | None
    weight_dtype: str
    kv_dtype: str
    max_context: int
    mla: MlaDims | None
    moe: MoeDims | None
    source: str

    # -- parameter counts (derived from the shapes) ------------------------------------------
    @property
    def attention_params_per_layer(self) -> int:
        h = self.hidden
        if self.mla is not None:
            m = self.mla
            q = h * m.q_lora_rank + m.q_lora_rank * self.heads * (
                m.qk_nope_head_dim + m.qk_rope_head_dim
            )
            kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * self.heads * (
                m.qk_nope_head_dim + m.v_head_dim
            )
            o = self.heads * m.v_head_dim * h
            return q + kv + o
        q = h * self.heads * self.head_dim
        kv = 2 * h * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * h
        return q + kv + o

    @property
    def expert_params(self) -> int:
        """One (gated) expert: gate, up and down projections."""
        assert self.moe is not None
        return 3 * self.hidden * self.moe.expert_ffn

    @property
    def moe_layers(self) -> int:
        return 0 if self.moe is None else self.layers - self.moe.first_dense_layers

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    @property
    def dense_mlp_params(self) -> int:
        return 3 * self.hidden * self.ffn

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    @property
    def routed_expert_params_total(self) -> int:
        if self.moe is None:
            return 0
        return self.moe_layers * self.moe.routed_experts * self.expert_params

    @property
    def non_expert_params(self) -> int:
        """Everything but the routed experts: attention, dense MLPs, shared experts,
        router, embeddings and LM head. Replicated across data-parallel ranks."""
        total = self.layers * self.attention_params_per_layer
        total += self.dense_layers * self.dense_mlp_params
        if self.moe is not None:
            total += self.moe_layers * (
                self.moe.shared_experts * self.expert_params + self.hidden * self.moe.routed_experts
            )
        return total + self.embedding_params + self.lm_head_params

    @property
    def total_params(self) -> int:
        return self.non_expert_params + self.routed_expert_params_total

    @property
    def active_linear_params(self) -> int:
        """Weights one token multiplies through (no embedding lookup, no LM head)."""
        total = self.layers * self.attention_params_per_layer
        total += self.dense_layers * self.dense_mlp_params
        if self.moe is not None:
            total += self.moe_layers * (
                (self.moe.shared_experts + self.moe.top_k) * self.expert_params
                + self.hidden * self.moe.routed_experts
            )
        return total

    @property
    def active_params(self) -> int:
        return self.active_linear_params + self.embedding_params + self.lm_head_params

    # -- attention and KV cache ------------------------------------------------------------------
    @property
    def kv_bytes_per_token(self) -> float:
        """Bytes of KV cache one token occupies over all layers (unsharded)."""
        b = DTYPE_BYTES[self.kv_dtype]
        if self.mla is not None:
            return self.layers * (self.mla.kv_lora_rank + self.mla.qk_rope_head_dim) * b
        return self.layers * 2 * self.kv_heads * self.head_dim * b

    def attention_flops_per_pair(self, *, decode: bool) -> float:
        """FLOPs of one (query token, key token) pair over all layers: QK^T plus AV.

        MLA decodes with the absorbed form (scores against the 512+64 latent, values from the
        512 latent) and prefills with the expanded form (192-dim keys, 128-dim values).
        """
        if self.mla is not None:
            m = self.mla
            if decode:
                per_head = 2 * (m.kv_lora_rank + m.qk_rope_head_dim) + 2 * m.kv_lora_rank
            else:
                per_head = 2 * (m.qk_nope_head_dim + m.qk_rope_head_dim) + 2 * m.v_head_dim
            return float(self.layers * self.heads * per_head)
        return float(self.layers * self.heads * 4 * self.head_dim)

    @property
    def is_moe(self) -> bool:
        return self.moe is not None


@dataclass(frozen=True)
class BackendEfficiency:
    """One backend's per-phase efficiency factors (``engine_fit.yaml``, see CALIBRATION.md).

    ``gemm_prefill`` / ``gemm_decode``: fraction of the dense peak (per weight dtype) the GEMMs
    of prefill tokens / of decode tokens reach end to end; ``attention``: fraction of the BF16
    peak the prefill attention kernels reach; ``kv_read``: fraction of the HBM peak the KV-cache
    reads (decode attention, prefill context) reach; overheads per iteration and per request;
    ``fp8_layer_overhead_s``: per layer of an FP8 (W8A8) model, the activation-quantisation
    kernels in front of its GEMMs; ``legacy_layer_overhead_s``: per layer, the CPU work a V0
    engine (``EngineSpec.legacy_engine``) exposes between GPU steps.
    """

    gemm_prefill: dict[str, float]
    gemm_decode: dict[str, float]
    attention: float
    kv_read: float
    step_overhead_s: float
    request_overhead_s: float
    fp8_layer_overhead_s: float
    legacy_layer_overhead_s: float


@dataclass(frozen=True)
class Efficiency:
    """The simulator's efficiency factors: fitted ones from ``engine_fit.yaml`` (written by
    ``python -m disagg_planner.simulator.fit --write``), priors from ``catalogue.yaml``."""

    backends: dict[str, BackendEfficiency]
    gemm_half_tokens: float
    activation_hidden_passes: float
    activation_ffn_passes: float
    hbm: dict[str, float]
    layer_overhead_s: float
    allreduce_latency_s: float
    alltoall_latency_s: float
    link_efficiency: float
    ttft_overhead_s: float
    activation_reserve_bytes: float

    def hbm_for(self, gpu_name: str) -> float:
        return self.hbm.get(gpu_name, self.hbm["default"])

    def backend(self, name: str) -> BackendEfficiency:
        if name not in self.backends:
            raise CatalogueError(
                f"{_FIT}: no efficiency factors for backend {name!r}; "
                f"known: {', '.join(sorted(self.backends))}"
            )
        return self.backends[name]


_CATALOGUE = "disagg_planner/simulator/catalogue.yaml"
_FIT = "disagg_planner/simulator/engine_fit.yaml"


def _package_yaml(path: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """The package data file ``path`` (a mapping with at least ``keys`` at the top)."""
    text = (
        resources.files(__package__ or "disagg_planner.simulator")
        .joinpath(path.rsplit("/", 1)[-1])
        .read_text(encoding="utf-8")
    )
    data = yaml.safe_load(text)
    if not isinstance(data, dict) or not set(keys) <= data.keys():
        raise CatalogueError(f"{path}: expected top-level keys {', '.join(keys)}")
    return data


@functools.cache
def _raw() -> dict[str, Any]:
    return _package_yaml(_CATALOGUE, ("gpus", "models", "efficiency"))


def _index(section: str) -> dict[str, str]:
    index: dict[str, str] = {}
    for name, entry in _raw()[section].items():
        index[name.lower()] = name
        for alias in entry.get("aliases", []) or []:
            index[str(alias).lower()] = name
    return index


def _field(section: str, name: str, entry: dict[str, Any], key: str) -> Any:
    if key not in entry:
        raise CatalogueError(f"{_CATALOGUE}: {section}.{name} lacks field {key!r}")
    return entry[key]


def gpu_names() -> list[str]:
    return sorted(_raw()["gpus"])


def model_names() -> list[str]:
    return sorted(_raw()["models"])


@functools.cache
def gpu(name: str) -> GpuSpec:
    """The GPU called ``name`` (canonical name or alias, any case)."""
    canonical = _index("gpus").get(name.strip().lower())
    if canonical is None:
        raise CatalogueError(f"unknown GPU {name!r}; known: {', '.join(gpu_names())}")
    e = _raw()["gpus"][canonical]

    def tf(key: str) -> float | None:
        value = e.get(key)
        return None if value is None else float(value) * 1e12

    bf16 = tf("bf16_tflops")
    if bf16 is None:
        raise CatalogueError(f"{_CATALOGUE}: gpus.{canonical}.bf16_tflops is required")
    return GpuSpec(
        name=canonical,
        bf16_flops=bf16,
        fp8_flops=tf("fp8_tflops"),
        fp4_flops=tf("fp4_tflops"),
        memory_bytes=float(_field("gpus", canonical, e, "memory_gb")) * 1e9,
        hbm_bytes_per_s=float(_field("gpus", canonical, e, "hbm_tbps")) * 1e12,
        nvlink_bytes_per_s=float(_field("gpus", canonical, e, "nvlink_gbps")) * 1e9,
        scale_out_bytes_per_s=float(_field("gpus", canonical, e, "scale_out_gbps")) * 1e9,
        nvlink_domain=int(_field("gpus", canonical, e, "nvlink_domain")),
        tdp_w=float(_field("gpus", canonical, e, "tdp_w")),
        source=str(_field("gpus", canonical, e, "source")),
    )


def split_precision(name: str) -> tuple[str, str | None]:
    """``"llama-3.1-8b-fp8"`` -> ``("llama-3.1-8b", "fp8")``; no suffix gives None."""
    lowered = name.strip().lower()
    for suffix, dtype in _SUFFIXES.items():
        if lowered.endswith(suffix):
            return lowered[: -len(suffix)], dtype
    return lowered, None


@functools.cache
def model(name: str) -> ModelSpec:
    """The model called ``name``, optionally with a precision suffix (see module doc)."""
    index = _index("models")
    lowered = name.strip().lower()
    base, precision = split_precision(lowered)
    # An alias may itself carry the suffix (nvidia/Llama-3.1-8B-Instruct-FP8).
    canonical = index.get(lowered) or index.get(base)
    if canonical is None:
        raise CatalogueError(
            f"unknown model {name!r}; known: {', '.join(model_names())} "
            "(optionally with a -fp8/-bf16/-fp4 suffix)"
        )
    e = _raw()["models"][canonical]
    native = str(_field("models", canonical, e, "dtype"))
    weight_dtype = precision or native
    if weight_dtype not in DTYPE_BYTES:
        raise CatalogueError(
            f"models.{canonical}.dtype {weight_dtype!r}: expected one of {sorted(DTYPE_BYTES)}"
        )
    # FP8 checkpoints carry FP8 KV scales; natively-FP8 MLA models keep a BF16 latent cache.
    kv_dtype = "fp8" if precision == "fp8" else "bf16"
    mla = MlaDims(**e["mla"]) if e.get("mla") else None
    moe = MoeDims(**e["moe"]) if e.get("moe") else None
    display = canonical if precision is None else f"{canonical}-{precision}"
    active = e.get("active_params_b")
    return ModelSpec(
        name=display,
        base=canonical,
        layers=int(_field("models", canonical, e, "layers")),
        hidden=int(_field("models", canonical, e, "hidden")),
        heads=int(_field("models", canonical, e, "heads")),
        kv_heads=int(_field("models", canonical, e, "kv_heads")),
        head_dim=int(_field("models", canonical, e, "head_dim")),
        ffn=int(_field("models", canonical, e, "ffn")),
        vocab=int(_field("models", canonical, e, "vocab")),
        tied_embeddings=bool(e.get("tied_embeddings", False)),
        published_params=float(_field("models", canonical, e, "params_b")) * 1e9,
        published_active_params=None if active is None else float(active) * 1e9,
        weight_dtype=weight_dtype,
        kv_dtype=kv_dtype,
        max_context=int(_field("models", canonical, e, "max_context")),
        mla=mla,
        moe=moe,
        source=str(_field("models", canonical, e, "source")),
    )


_trial_fit: dict[str, Any] | None = None


def efficiency() -> Efficiency:
    """The efficiency factors: the fitted ones of ``engine_fit.yaml`` and the priors (or,
    inside ``trial_fit``, the fitting tool's trial values)."""
    if _trial_fit is not None:
        return efficiency_from(_trial_fit)
    return _fitted_efficiency()


@functools.cache
def _fitted_efficiency() -> Efficiency:
    return efficiency_from(fit_data())


@contextlib.contextmanager
def trial_fit(fit: dict[str, Any]) -> Iterator[None]:
    """Every engine model made inside this block uses ``fit`` (the layout of
    ``engine_fit.yaml``) instead of the file: how the fitting tool tries parameter values."""
    global _trial_fit
    previous, _trial_fit = _trial_fit, fit
    try:
        yield
    finally:
        _trial_fit = previous


@functools.cache
def fit_data() -> dict[str, Any]:
    """``engine_fit.yaml`` as written by the fitting tool (``disagg_planner.simulator.fit``)."""
    return _package_yaml(_FIT, ("hbm", "backends", "allreduce_latency_us"))


def _backend(name: str, raw: dict[str, Any], entries: dict[str, Any]) -> BackendEfficiency:
    if "same_as" in raw:
        other = str(raw["same_as"])
        if other not in entries or "same_as" in entries[other]:
            raise CatalogueError(
                f"{_FIT}: backends.{name}.same_as={other!r} names no fitted backend"
            )
        raw = entries[other]
    us = 1e-6
    try:
        return BackendEfficiency(
            gemm_prefill={**{k: float(v) for k, v in raw["gemm_prefill"].items()}},
            gemm_decode={**{k: float(v) for k, v in raw["gemm_decode"].items()}},
            attention=float(raw["attention"]),
            kv_read=float(raw["kv_read"]),
            step_overhead_s=float(raw["step_overhead_us"]) * us,
            request_overhead_s=float(raw["request_overhead_us"]) * us,
            fp8_layer_overhead_s=float(raw["fp8_layer_overhead_us"]) * us,
            legacy_layer_overhead_s=float(raw["legacy_layer_overhead_us"]) * us,
        )
    except KeyError as exc:
        raise CatalogueError(f"{_FIT}: backends.{name} lacks field {exc.args[0]!r}") from None


def efficiency_from(fit: dict[str, Any]) -> Efficiency:
    """Efficiency factors with the fitted part taken from ``fit`` (the fitting tool passes
    trial values here; everything else reads ``engine_fit.yaml`` through ``efficiency()``)."""
    e = _raw()["efficiency"]
    us = 1e-6
    entries = fit["backends"]
    backends = {name: _backend(name, raw, entries) for name, raw in entries.items()}
    for b in backends.values():
        for table in (b.gemm_prefill, b.gemm_decode):
            table.setdefault("fp16", table["bf16"])
    return Efficiency(
        backends=backends,
        gemm_half_tokens=float(e["gemm_half_tokens"]),
        activation_hidden_passes=float(e["activation_hidden_passes"]),
        activation_ffn_passes=float(e["activation_ffn_passes"]),
        hbm={str(k): float(v) for k, v in fit["hbm"].items()},
        layer_overhead_s=float(e["layer_overhead_us"]) * us,
        allreduce_latency_s=float(fit["allreduce_latency_us"]) * us,
        alltoall_latency_s=float(e["alltoall_latency_us"]) * us,
        link_efficiency=float(e["link_efficiency"]),
        ttft_overhead_s=float(e["ttft_overhead_ms"]) * 1e-3,
        activation_reserve_bytes=float(e["activation_reserve_gb"]) * 1e9,
    )
