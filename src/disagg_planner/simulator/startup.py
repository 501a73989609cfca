"""How long a new replica takes to serve, phase by phase, and which phases hold its GPUs.

A replica that the planner adds goes through five phases before it takes requests:

1. ``scheduling``: the pod waits for the Kubernetes scheduler to bind it to a node with free
   GPUs (no node provisioning is modelled);
2. ``image_pull``: the kubelet pulls the engine image onto that node;
3. ``weight_load``: the engine reads the model's weights (model bytes / storage bandwidth);
4. ``engine_init``: torch.compile, CUDA-graph capture and, with tensor parallelism, the
   peer-to-peer access check;
5. ``first_request``: the first (warm-up) request, which compiles the shapes the capture
   missed; the replica is counted ready after it, as a deployment whose readiness probe
   sends a warm-up request would be.

The medians come from public measurements (below, and in ``CALIBRATION.md``'s start-up
section); each phase of each replica is drawn from one measured spread (seeded, so a replay is
reproducible). ``--startup-delay N`` replaces all of this with one constant phase of N seconds
that holds the GPUs from the start, which is what the simulator did before.

GPUs are charged from ``image_pull`` onwards: a pod holds its GPUs from the moment it is bound
to a node (the scheduler counts them against the node and no other pod can have them), and
the image is pulled after binding, on that node. While the pod is still pending it holds no
GPU, so ``scheduling`` is not charged. (llm-d's "GPU-free overprovisioning" proposal measures
that about 40% of a cold start needs no GPU, which is the waste it removes; a default
deployment still pays for it.)
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass

from disagg_planner.simulator.catalogue import DTYPE_BYTES
from disagg_planner.simulator.engine_spec import EngineSpec
from disagg_planner.simulator.errors import SimulatorInputError

STARTUP_PHASES: tuple[str, ...] = (
    "scheduling",
    "image_pull",
    "weight_load",
    "engine_init",
    "first_request",
)
# The phase of a constant ``--startup-delay``: the whole delay, GPUs held from its start.
CONSTANT_PHASE = "startup"
# The first phase whose time is charged as GPU time (see the module doc).
FIRST_GPU_PHASE = "image_pull"

# -- the public figures (engine-calibration.md sections 4.4 and 6.1) ---------------------------
# llm-d "GPU-free overprovisioning" proposal: a default cold start of 90.65 s, about 40% of it
# before any GPU is used (scheduling and image pull).
NO_GPU_SHARE_S = 0.40 * 90.65
# Assumed, not measured: binding a pod to a node that has free GPUs takes seconds.
SCHEDULING_S = 2.0
IMAGE_PULL_S = NO_GPU_SHARE_S - SCHEDULING_S
# ServerlessLLM (OSDI'24) baseline: LLaMA-2-70B (140 GB in BF16) loads in 84 s.
STORAGE_BYTES_PER_S = 140e9 / 84.0
# vLLM issue 11005, Llama-3-8B on one GPU with -O3: engine start 39.3 s (dynamo 4.6 s,
# compile 14.8 s, CUDA graphs 15 s), the anchor of the engine-initialisation curve.
ENGINE_INIT_ANCHOR_PARAMS = 8.03e9
ENGINE_INIT_ANCHOR_S = 39.3
# vLLM issue 19824, Llama-70B FP8 at TP8: dynamo 15 s + compile 70 s + CUDA graphs 60 s
# = 145 s against the 8B's 34.4 s for the same three steps, so init grows as params^0.662
# (log(145 / 34.4) / log(70.6e9 / 8.03e9)).
ENGINE_INIT_EXPONENT = math.log(145.0 / 34.4) / math.log(70.6e9 / 8.03e9)
# Same issue: the peer-to-peer access check of a tensor-parallel engine, about 60 s; only vLLM
# releases before engine_spec.P2P_SKIPPED_VLLM run it (EngineSpec.runs_p2p_check).
P2P_CHECK_S = 60.0
# Same issue: "the very first request ... takes 30-60 seconds" on the 70B; smaller models
# scale down with the engine-initialisation curve.
FIRST_REQUEST_ANCHOR_PARAMS = 70.6e9
FIRST_REQUEST_ANCHOR_S = 45.0
# Alibaba GenAI cluster trace 2026: 7,531 production model loads, p50 22.7 s, p90 42.0 s,
# p99 51.9 s: the one published spread, used for every phase as multiples of its median. The
# lower half mirrors the upper one on a log scale (not published); draws stop at p1 and p99.
SPREAD_QUANTILES: tuple[tuple[float, float], ...] = (
    (0.0, 22.7 / 51.9),
    (0.01, 22.7 / 51.9),
    (0.10, 22.7 / 42.0),
    (0.50, 1.0),
    (0.90, 42.0 / 22.7),
    (0.99, 51.9 / 22.7),
    (1.0, 51.9 / 22.7),
)
# The quantile of a replica's total start-up that the clairvoyant references order replicas
# ahead by (the oracle knows the load, not how long each start will take).
PLANNING_QUANTILE = 0.99


@dataclass(frozen=True)
class StartupPlan:
    """One replica's start-up: ``phases`` as (name, seconds) in order; GPUs are held from
    ``gpu_hold_offset_s`` after the start."""

    phases: tuple[tuple[str, float], ...]
    gpu_hold_offset_s: float

    @property
    def total_s(self) -> float:
        return sum(d for _, d in self.phases)

    def phase_starts(self, start_s: float) -> list[tuple[str, float]]:
        """(phase, start time) of each phase, for a replica started at ``start_s``."""
        out = []
        t = start_s
        for name, duration in self.phases:
            out.append((name, t))
            t += duration
        return out


def constant_plan(delay_s: float) -> StartupPlan:
    """A constant delay (``--startup-delay``): one phase, GPUs held from its start."""
    if delay_s < 0 or not math.isfinite(delay_s):
        raise SimulatorInputError(f"startup delay {delay_s}: must be finite and >= 0")
    return StartupPlan(phases=((CONSTANT_PHASE, float(delay_s)),), gpu_hold_offset_s=0.0)


def model_bytes(spec: EngineSpec) -> float:
    """Bytes of weights one replica reads from storage (one copy of the model)."""
    return spec.model.total_params * DTYPE_BYTES[spec.model.weight_dtype]


@dataclass(frozen=True)
class PhaseModel:
    """The median seconds of each phase for one engine; :meth:`sample` draws a replica's."""

    medians: tuple[tuple[str, float], ...]

    def sample(self, rng: random.Random) -> StartupPlan:
        phases = tuple((name, median * spread(rng.random())) for name, median in self.medians)
        return _plan(phases)

    def median_plan(self) -> StartupPlan:
        return _plan(self.medians)

    def quantile_total_s(self, q: float, *, draws: int = 4000) -> float:
        """The ``q`` quantile of the total start-up (a fixed-seed sample: deterministic)."""
        rng = random.Random(0)
        totals = sorted(self.sample(rng).total_s for _ in range(draws))
        return totals[min(draws - 1, int(q * draws))]


def _plan(phases: tuple[tuple[str, float], ...]) -> StartupPlan:
    hold = 0.0
    for name, duration in phases:
        if name == FIRST_GPU_PHASE:
            break
        hold += duration
    return StartupPlan(phases=phases, gpu_hold_offset_s=hold)


def spread(u: float) -> float:
    """The multiple of a phase's median at quantile ``u`` of the measured spread."""
    qs = [q for q, _ in SPREAD_QUANTILES]
    k = min(max(bisect.bisect_right(qs, u), 1), len(qs) - 1)
    (q0, m0), (q1, m1) = SPREAD_QUANTILES[k - 1], SPREAD_QUANTILES[k]
    # linear in log(multiple) between the published quantiles
    w = (min(max(u, q0), q1) - q0) / (q1 - q0)
    return math.exp(math.log(m0) + w * (math.log(m1) - math.log(m0)))


def phase_model(spec: EngineSpec) -> PhaseModel:
    """The phase medians of ``spec`` from the public figures in this module."""
    # compile and graph capture trace the per-token path, so an MoE model counts its active
    # parameters (the dense anchors have all parameters active)
    params = spec.model.active_params
    init = ENGINE_INIT_ANCHOR_S * (params / ENGINE_INIT_ANCHOR_PARAMS) ** ENGINE_INIT_EXPONENT
    if spec.runs_p2p_check:
        init += P2P_CHECK_S
    first = FIRST_REQUEST_ANCHOR_S * (params / FIRST_REQUEST_ANCHOR_PARAMS) ** ENGINE_INIT_EXPONENT
    return PhaseModel(
        medians=(
            ("scheduling", SCHEDULING_S),
            ("image_pull", IMAGE_PULL_S),
            ("weight_load", model_bytes(spec) / STORAGE_BYTES_PER_S),
            ("engine_init", init),
            ("first_request", first),
        )
    )


class StartupSampler:
    """Each new replica's :class:`StartupPlan`: the constant delay of its role, or (``None``)
    a draw from the role's :class:`PhaseModel`, seeded by ``seed`` and independent of every
    other random choice of the simulation."""

    def __init__(
        self,
        delays: Mapping[str, float | None],
        specs: Mapping[str, EngineSpec],
        *,
        seed: int,
    ) -> None:
        self._constant = {r: constant_plan(d) for r, d in delays.items() if d is not None}
        self._models = {r: phase_model(specs[r]) for r, d in delays.items() if d is None}
        self._rng = random.Random(f"startup:{seed}")

    def plan(self, role: str) -> StartupPlan:
        constant = self._constant.get(role)
        if constant is not None:
            return constant
        return self._models[role].sample(self._rng)

    def set_spec(self, role: str, spec: EngineSpec) -> None:
        """Replicas started later run ``spec`` (an elastic-EP resize of every replica)."""
        if role in self._models:
            self._models[role] = phase_model(spec)


def planning_lead_s(startup_delay_s: float | None, specs: Mapping[str, EngineSpec]) -> float:
    """How far ahead a clairvoyant plan orders a replica: the constant delay, or the
    :data:`PLANNING_QUANTILE` of the slowest role's phased start-up."""
    if startup_delay_s is not None:
        return float(startup_delay_s)
    return max(phase_model(s).quantile_total_s(PLANNING_QUANTILE) for s in specs.values())


def describe(startup_delay_s: float | None, specs: Mapping[str, EngineSpec]) -> dict[str, object]:
    """What a replay's summary says about its start-up model."""
    if startup_delay_s is not None:
        return {"model": "constant", "delay_s": float(startup_delay_s)}
    out: dict[str, object] = {"model": "phases", "gpu_charged_from": FIRST_GPU_PHASE}
    for role, spec in specs.items():
        model = phase_model(spec)
        out[role] = {
            "median_s": dict(model.medians),
            "median_total_s": model.median_plan().total_s,
            f"p{round(PLANNING_QUANTILE * 100)}_total_s": model.quantile_total_s(PLANNING_QUANTILE),
        }
    return out
