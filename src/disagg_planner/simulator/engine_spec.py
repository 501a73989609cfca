"""Engine specs: which model on which GPU with which parallelism and scheduler limits.

Grammar (the string form is what the command line and configs use)::

    sim:MODEL@GPU[:OPTION]...
    aic:MODEL@GPU[:BACKEND][:OPTION]...

    OPTION := tpN | dpN | epN | KEY=VALUE
    KEY    := max_num_batched_tokens (mnbt) | max_num_seqs (seqs) | block_size (block)
            | gpu_memory_utilization (mem) | max_model_len | kv_cache_dtype (kv)
            | prefix_caching (on|off) | backend (vllm|sglang|trtllm) | speed
            | version (engine_version) | nextn (num_speculative_tokens)
            | accept (accept_length)

Examples: ``sim:llama-3.1-8b-fp8@h200_sxm:tp1``, ``sim:deepseek-r1@gb200:tp1:dp16:ep16``,
``sim:llama-3.3-70b-fp8@h100_sxm:tp4:mnbt=4096``.

Defaults follow vLLM (block size 16, ``gpu_memory_utilization`` 0.9; ``max_num_seqs`` and
``max_num_batched_tokens`` as its OpenAI server sets them per GPU, :func:`vllm_batch_defaults`;
other backends keep Dynamo's mocker's 256 and 8192). MoE models default to wide expert
parallelism (``ep = tp * dp``); dense models cannot set ``ep``.

``aic:`` times the same simulated engine with AIConfigurator's measured kernel tables instead
of the calibrated roofline (:mod:`disagg_planner.simulator.aic_engine`; the optional extra
``pip install 'disagg-planner[aic]'``). Its ``MODEL`` is a model AIConfigurator ships a
config for, by its model-hub id or by the catalogue name of the same architecture
(``aic:meta-llama/Meta-Llama-3.1-8B@h200_sxm``, ``aic:llama-3.1-8b-fp8@h200_sxm:trtllm:tp1``);
a bare ``vllm``/``sglang``/``trtllm`` option names the backend whose tables are used.

``version=X.Y[.Z]`` (``sim:`` vLLM engines only) names the vLLM release the engine runs; left
out, the release AIConfigurator's measured tables come from (:data:`CURRENT_VLLM`). Two things
depend on it: releases before :data:`V1_DEFAULT_VLLM` ran the V0 engine, whose per-step CPU
work is exposed between GPU steps (the fitted ``legacy_layer_overhead_us``), and releases
before :data:`P2P_SKIPPED_VLLM` run the tensor-parallel peer-to-peer check at start-up
(:mod:`disagg_planner.simulator.startup`).

``nextn=N:accept=A`` (``sim:`` only) runs speculative decoding (MTP or EAGLE): each decode
iteration verifies ``N`` draft tokens per sequence and emits ``A`` tokens on average,
``1 <= A <= N + 1`` (a request of ``osl`` tokens decodes in ``1 + ceil((osl - 1) / A)``
iterations); its cost is in :mod:`disagg_planner.simulator.engine_model`.

``speed=X`` (either timing) runs the engine at ``X`` times the speed its timing model gives:
every step, prefill and decode, takes ``1 / X`` as long (``speed=0.5``: half as fast). It
only changes the simulated engine; the profile a planner sizes from is chosen without it
(:func:`disagg_planner.simulator.profiling.bundled_path` ignores it), so a replay with
``speed != 1`` measures how a planner copes with a profile that is wrong by that factor.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

from disagg_planner.simulator import aic_tables, catalogue
from disagg_planner.simulator.catalogue import GpuSpec, ModelSpec
from disagg_planner.simulator.errors import CatalogueError, EngineSpecError

PREFIX = "sim:"
AIC_PREFIX = "aic:"
TIMINGS = ("sim", "aic")
BACKENDS = ("vllm", "sglang", "trtllm")
_KEY_ALIASES = {
    "mnbt": "max_num_batched_tokens",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "seqs": "max_num_seqs",
    "max_num_seqs": "max_num_seqs",
    "block": "block_size",
    "block_size": "block_size",
    "mem": "gpu_memory_utilization",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "max_model_len": "max_model_len",
    "kv": "kv_cache_dtype",
    "kv_cache_dtype": "kv_cache_dtype",
    "prefix_caching": "prefix_caching",
    "backend": "backend",
    "speed": "speed",
    "version": "engine_version",
    "engine_version": "engine_version",
    "nextn": "num_speculative_tokens",
    "num_speculative_tokens": "num_speculative_tokens",
    "accept": "accept_length",
    "accept_length": "accept_length",
}
# vLLM's and SGLang's speculative configs allow a handful of draft tokens; Dynamo's planner
# setting takes 1-16 (config/schema.py), and so does this.
MAX_SPECULATIVE_TOKENS = 16
_VERSION = re.compile(r"^\d+(\.\d+){0,2}$")
# The vLLM release the engine model's default is fitted to: AIConfigurator's measured vLLM
# tables (aiconfigurator-core 0.12.0) are of vLLM 0.24.0, and so is the ITL it was validated
# against (CALIBRATION.md).
CURRENT_VLLM = (0, 24, 0)
# vLLM 0.8.0 made the V1 engine the default; earlier releases ran V0 unless told otherwise.
V1_DEFAULT_VLLM = (0, 8, 0)
# VLLM_SKIP_P2P_CHECK defaults to 1 (the driver's answer is trusted, no ~60 s probe): vLLM
# start-up logs of October 2025 (vllm#27521, 0.11.x) print "Skipping P2P check" with no flag
# set, and vllm#50775 calls 1 "the default"; 0.6.x still needed the flag (vllm#8257, vllm#8911
# added it as opt-in). The earliest release evidenced is taken.
P2P_SKIPPED_VLLM = (0, 11, 0)
_PAR = re.compile(r"^(tp|dp|ep)(\d+)$")


@dataclass(frozen=True)
class EngineSpec:
    """One engine (one replica): ``tp * dp`` GPUs serving ``model``.

    Each of the ``dp`` data-parallel ranks schedules its own requests over ``tp`` GPUs; with
    ``ep > 1`` the MoE experts are spread over all ``tp * dp`` GPUs.
    """

    model: ModelSpec
    gpu: GpuSpec
    tp: int = 1
    dp: int = 1
    ep: int = 1
    # 0: the backend's default on this GPU (batch_defaults)
    max_num_batched_tokens: int = 0
    max_num_seqs: int = 0
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    prefix_caching: bool = True
    backend: str = "vllm"
    # Which engine model times it: "sim" (the calibrated roofline) or "aic" (AIConfigurator's
    # tables for ``aic_model``, the model-hub id of a config it ships).
    timing: str = "sim"
    aic_model: str | None = None
    # Multiple of the timing model's speed the simulated engine runs at: each step takes
    # 1 / speed as long (the module doc); 1.0 is the model itself.
    speed: float = 1.0
    # The vLLM release ("X.Y[.Z]"; "" is CURRENT_VLLM): see the module doc.
    engine_version: str = ""
    # Speculative decoding: draft tokens verified per step (0: none) and the mean tokens a
    # sequence emits per decode iteration (the accept length, 1 + accepted drafts).
    num_speculative_tokens: int = 0
    accept_length: float = 0.0

    def __post_init__(self) -> None:
        seqs, tokens = batch_defaults(self.gpu, self.backend)
        if self.max_num_seqs == 0:
            object.__setattr__(self, "max_num_seqs", seqs)
        if self.max_num_batched_tokens == 0:
            object.__setattr__(self, "max_num_batched_tokens", tokens)
        problems = []
        for name in ("tp", "dp", "ep", "max_num_batched_tokens", "max_num_seqs", "block_size"):
            if getattr(self, name) < 1:
                problems.append(f"{name}={getattr(self, name)} must be >= 1")
        if not 0.05 <= self.gpu_memory_utilization <= 1.0:
            problems.append(
                f"gpu_memory_utilization={self.gpu_memory_utilization} must be in [0.05, 1]"
            )
        if self.model.heads % self.tp:
            problems.append(f"tp={self.tp} must divide the {self.model.heads} attention heads")
        if self.model.moe is None and self.ep != 1:
            problems.append(f"ep={self.ep} needs an MoE model; {self.model.name} is dense")
        if self.model.moe is not None and self.ep not in (1, self.tp * self.dp):
            problems.append(f"ep={self.ep} must be 1 or tp*dp={self.tp * self.dp}")
        if self.backend not in BACKENDS:
            problems.append(f"backend={self.backend!r} must be one of {', '.join(BACKENDS)}")
        if self.max_model_len is not None and self.max_model_len < 2:
            problems.append(f"max_model_len={self.max_model_len} must be >= 2")
        if self.timing not in TIMINGS:
            problems.append(f"timing={self.timing!r} must be one of {', '.join(TIMINGS)}")
        if not (math.isfinite(self.speed) and self.speed > 0):
            problems.append(f"speed={self.speed!r} must be a finite number > 0")
        if self.engine_version:
            if not _VERSION.match(self.engine_version):
                problems.append(
                    f"version={self.engine_version!r} must be a vLLM release X.Y[.Z], e.g. 0.24.0"
                )
            if self.backend != "vllm" or self.timing != "sim":
                problems.append(
                    f"version={self.engine_version} names a vLLM release: only a sim: vLLM "
                    "engine takes it (aic: tables are of their own release)"
                )
        n, a = self.num_speculative_tokens, self.accept_length
        if not 0 <= n <= MAX_SPECULATIVE_TOKENS:
            problems.append(f"nextn={n} must be in [0, {MAX_SPECULATIVE_TOKENS}]")
        elif n and not (math.isfinite(a) and 1.0 <= a <= n + 1):
            problems.append(
                f"accept={a:g} must be in [1, nextn + 1 = {n + 1}] (tokens a sequence emits "
                "per decode step: the verified one plus the accepted drafts)"
            )
        elif not n and a:
            problems.append(f"accept={a:g} needs nextn (the draft tokens per step)")
        if n and self.timing != "sim":
            problems.append("nextn: speculative decoding is modelled by the sim: engine only")
        if (self.timing == "aic") != (self.aic_model is not None):
            problems.append("an aic engine needs its aic_model, and only an aic engine has one")
        if problems:
            raise EngineSpecError(f"engine spec {self}: " + "; ".join(problems))

    @property
    def vllm_version(self) -> tuple[int, ...]:
        """The vLLM release as (major, minor, patch), the default release when none is named
        (``0.11`` is ``(0, 11, 0)``, so that it compares equal to ``0.11.0``)."""
        if not self.engine_version:
            return CURRENT_VLLM
        parts = [int(part) for part in self.engine_version.split(".")]
        return tuple(parts + [0] * (3 - len(parts)))

    @property
    def legacy_engine(self) -> bool:
        """Whether the engine is vLLM's V0 engine (a release before V1 was the default)."""
        return self.backend == "vllm" and self.vllm_version < V1_DEFAULT_VLLM

    @property
    def runs_p2p_check(self) -> bool:
        """Whether start-up runs vLLM's tensor-parallel peer-to-peer check (TP > 1 on a
        release that does not skip it by default)."""
        return self.tp > 1 and self.backend == "vllm" and self.vllm_version < P2P_SKIPPED_VLLM

    def decode_iterations(self, osl: int) -> int:
        """Iterations a request of ``osl`` output tokens takes to generate them: the first
        token comes with its prefill, the rest ``accept_length`` per decode iteration."""
        if not self.num_speculative_tokens or osl <= 1:
            return osl
        return 1 + math.ceil((osl - 1) / self.accept_length)

    @property
    def gpus(self) -> int:
        """GPUs one replica occupies."""
        return self.tp * self.dp

    def with_dp(self, dp: int) -> EngineSpec:
        """The same engine resized to ``dp`` ranks (elastic EP keeps EP = TP * DP)."""
        ep = self.tp * dp if self.ep > 1 else 1
        return dataclasses.replace(self, dp=dp, ep=ep)

    def __str__(self) -> str:
        if self.timing == "aic":
            parts = [f"{AIC_PREFIX}{self.model.name}@{self.gpu.name}", self.backend, f"tp{self.tp}"]
        else:
            parts = [f"{PREFIX}{self.model.name}@{self.gpu.name}", f"tp{self.tp}"]
        if self.dp != 1:
            parts.append(f"dp{self.dp}")
        if self.ep != 1:
            parts.append(f"ep{self.ep}")
        defaults = _DEFAULTS
        seqs, tokens = batch_defaults(self.gpu, self.backend)
        if self.max_num_batched_tokens != tokens:
            parts.append(f"max_num_batched_tokens={self.max_num_batched_tokens}")
        if self.max_num_seqs != seqs:
            parts.append(f"max_num_seqs={self.max_num_seqs}")
        if self.block_size != defaults.block_size:
            parts.append(f"block_size={self.block_size}")
        if self.gpu_memory_utilization != defaults.gpu_memory_utilization:
            parts.append(f"gpu_memory_utilization={self.gpu_memory_utilization:g}")
        if self.max_model_len is not None:
            parts.append(f"max_model_len={self.max_model_len}")
        if not self.prefix_caching:
            parts.append("prefix_caching=off")
        if self.backend != "vllm" and self.timing == "sim":
            parts.append(f"backend={self.backend}")
        if self.engine_version:
            parts.append(f"version={self.engine_version}")
        if self.num_speculative_tokens:
            parts.append(f"nextn={self.num_speculative_tokens}")
            parts.append(f"accept={self.accept_length!r}")
        if self.speed != 1.0:
            # short where that is exact ("2", not "2.0"); else every digit, so that it parses back
            short = f"{self.speed:g}"
            parts.append(f"speed={short if float(short) == self.speed else repr(self.speed)}")
        return ":".join(parts)


@dataclass(frozen=True)
class _Defaults:
    block_size: int = 16
    gpu_memory_utilization: float = 0.9


_DEFAULTS = _Defaults()

# vLLM's EngineArgs.get_batch_defaults (v1 engine): GPUs with at least 70 GiB, other than the
# A100, get max_num_seqs 1024 and, for the OpenAI server, max_num_batched_tokens 8192; other
# GPUs 256 and 2048 (engine-calibration.md 6.2).
VLLM_LARGE_GPU_MIN_BYTES = 70 * 2**30
VLLM_LARGE_GPU = (1024, 8192)
VLLM_OTHER_GPU = (256, 2048)
# Dynamo's mocker, for the backends whose own defaults are not modelled
MOCKER_DEFAULTS = (256, 8192)


def batch_defaults(gpu: GpuSpec, backend: str = "vllm") -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) an engine of ``backend`` on ``gpu`` gets when
    neither is set."""
    if backend != "vllm":
        return MOCKER_DEFAULTS
    if gpu.memory_bytes >= VLLM_LARGE_GPU_MIN_BYTES and not gpu.name.startswith("a100"):
        return VLLM_LARGE_GPU
    return VLLM_OTHER_GPU


def _int(text: str, key: str, spec: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise EngineSpecError(f"engine spec {spec!r}: {key}={text!r} is not an integer") from None
    return value


def _float(text: str, key: str, spec: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise EngineSpecError(f"engine spec {spec!r}: {key}={text!r} is not a number") from None
    return value


def parse(text: str) -> EngineSpec:
    """Parse ``sim:MODEL@GPU[:OPTION]...`` or ``aic:MODEL@GPU[:BACKEND][:OPTION]...`` (see
    the module doc) into an :class:`EngineSpec`."""
    spec = text.strip()
    lowered = spec.lower()
    timing = "aic" if lowered.startswith(AIC_PREFIX) else "sim"
    if timing == "sim" and not lowered.startswith(PREFIX):
        raise EngineSpecError(
            f"engine spec {text!r}: expected 'sim:MODEL@GPU[:tpN][:dpN][:epN][:key=value]' "
            "or 'aic:MODEL@GPU[:vllm|sglang|trtllm][:tpN]'"
        )
    body = spec[len(PREFIX) :]
    head, *options = body.split(":")
    if "@" not in head:
        raise EngineSpecError(f"engine spec {text!r}: expected MODEL@GPU before the options")
    model_name, gpu_name = (s.strip() for s in head.split("@", 1))
    if not model_name or not gpu_name:
        raise EngineSpecError(f"engine spec {text!r}: empty model or GPU name")
    fields: dict[str, object] = {}
    if timing == "aic":
        # The optional extra's front door: it says how to install it and never reaches the
        # network (see its module doc).
        aic_model, model_name = aic_tables.resolve_model(model_name, spec=text)
        fields.update(timing="aic", aic_model=aic_model)
    try:
        model = catalogue.model(model_name)
        gpu = catalogue.gpu(gpu_name)
    except CatalogueError as exc:
        raise EngineSpecError(f"engine spec {text!r}: {exc}") from None
    kv_dtype: str | None = None
    for option in options:
        option = option.strip()
        if not option:
            continue
        par = _PAR.match(option.lower())
        if par:
            fields[par.group(1)] = int(par.group(2))
            continue
        if timing == "aic" and option.lower() in BACKENDS:
            fields["backend"] = option.lower()
            continue
        if "=" not in option:
            backend = f"a backend ({'|'.join(BACKENDS)}), " if timing == "aic" else ""
            raise EngineSpecError(
                f"engine spec {text!r}: option {option!r} is neither {backend}tpN/dpN/epN "
                "nor key=value"
            )
        raw_key, value = (s.strip() for s in option.split("=", 1))
        key = _KEY_ALIASES.get(raw_key.lower())
        if key is None:
            raise EngineSpecError(
                f"engine spec {text!r}: unknown option {raw_key!r}; known: "
                + ", ".join(sorted(set(_KEY_ALIASES)))
            )
        if key in ("max_num_batched_tokens", "max_num_seqs", "block_size", "max_model_len"):
            fields[key] = _int(value, key, text)
            if key in ("max_num_batched_tokens", "max_num_seqs") and int(value) < 1:
                # 0 is the field's "backend default" marker, not a value to accept
                raise EngineSpecError(f"engine spec {text!r}: {key}={value} must be >= 1")
        elif key == "gpu_memory_utilization":
            fields[key] = _float(value, key, text)
        elif key == "speed":
            speed = _float(value, key, text)
            if not (math.isfinite(speed) and speed > 0):
                raise EngineSpecError(
                    f"engine spec {text!r}: speed={value!r} must be a finite number > 0 "
                    "(the multiple of the engine's own speed: 0.5 is half as fast)"
                )
            fields[key] = speed
        elif key == "num_speculative_tokens":
            fields[key] = _int(value, key, text)
        elif key == "accept_length":
            fields[key] = _float(value, key, text)
        elif key == "prefix_caching":
            if value.lower() not in ("on", "off", "true", "false", "1", "0"):
                raise EngineSpecError(f"engine spec {text!r}: prefix_caching={value!r}: use on|off")
            fields[key] = value.lower() in ("on", "true", "1")
        elif key == "kv_cache_dtype":
            if value.lower() not in catalogue.DTYPE_BYTES:
                raise EngineSpecError(
                    f"engine spec {text!r}: kv_cache_dtype={value!r}: use one of "
                    + ", ".join(sorted(catalogue.DTYPE_BYTES))
                )
            kv_dtype = value.lower()
        else:
            fields[key] = value.lower()
    if kv_dtype is not None:
        model = dataclasses.replace(model, kv_dtype=kv_dtype)
    if model.moe is not None and "ep" not in fields:
        fields["ep"] = int(str(fields.get("tp", 1))) * int(str(fields.get("dp", 1)))
    parsed = EngineSpec(model=model, gpu=gpu, **fields)  # type: ignore[arg-type]
    if timing == "aic":
        aic_tables.check_supported(
            model=parsed.model, gpu=parsed.gpu, backend=parsed.backend, ep=parsed.ep, spec_text=text
        )
    return parsed


def coerce(spec: EngineSpec | str) -> EngineSpec:
    """Accept a parsed spec or its string form."""
    return spec if isinstance(spec, EngineSpec) else parse(spec)
