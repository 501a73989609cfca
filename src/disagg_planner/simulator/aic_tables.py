"""What AIConfigurator ships and measured, read offline: the front door of ``aic:`` specs.

Which models an ``aic:`` spec may name (only those whose config ``aiconfigurator-core`` ships
and whose architecture the catalogue has), which GPUs and backends it has tables for, and the
largest arguments it measured (the grid outside which it extrapolates). ``engine_spec.parse``
asks this module while parsing an ``aic:`` spec; the engine model built on the tables is
:mod:`disagg_planner.simulator.aic_engine`. Nothing here imports ``aiconfigurator_core``: it
locates the installed package and reads its files (pandas, its dependency, for the grid).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from disagg_planner.simulator import catalogue
from disagg_planner.simulator.catalogue import GpuSpec, ModelSpec
from disagg_planner.simulator.errors import CatalogueError, EngineSpecError

INSTALL_HINT = "pip install 'disagg-planner[aic]'"
PACKAGE = "aiconfigurator_core"

# The models AIConfigurator ships configs for that the catalogue has the architecture of:
# catalogue name -> (hub id of the shipped config, GEMM quant mode; None: the config's own
# quantisation config says it). Llama 3.1 70B and 3.3 70B share the architecture.
FROM_CATALOGUE: dict[str, tuple[str, str | None]] = {
    "llama-3.1-8b": ("meta-llama/Meta-Llama-3.1-8B", "bfloat16"),
    "llama-3.1-8b-fp8": ("meta-llama/Meta-Llama-3.1-8B", "fp8"),
    "llama-3.3-70b": ("meta-llama/Meta-Llama-3.1-70B", "bfloat16"),
    "llama-3.3-70b-fp8": ("nvidia/Llama-3.1-70B-Instruct-FP8", None),
    "qwen3-32b": ("Qwen/Qwen3-32B", "bfloat16"),
    "qwen3-32b-fp8": ("Qwen/Qwen3-32B-FP8", None),
}
# Hub id -> the catalogue name of its architecture and precision.
_FROM_HUB: dict[str, str] = {
    "meta-llama/Meta-Llama-3.1-8B": "llama-3.1-8b",
    "meta-llama/Meta-Llama-3.1-70B": "llama-3.3-70b",
    "nvidia/Llama-3.1-70B-Instruct-FP8": "llama-3.3-70b-fp8",
    "Qwen/Qwen3-32B": "qwen3-32b",
    "Qwen/Qwen3-32B-FP8": "qwen3-32b-fp8",
}
# Catalogue GPU -> AIConfigurator system name.
SYSTEMS: dict[str, str] = {
    "a100_sxm": "a100_sxm",
    "h100_sxm": "h100_sxm",
    "h200_sxm": "h200_sxm",
    "b200": "b200_sxm",
    "gb200": "gb200",
}


def package_dir() -> Path:
    try:
        found = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):  # a broken install counts as none
        found = None
    if found is None or not found.submodule_search_locations:
        raise EngineSpecError(
            f"the aic engine needs aiconfigurator-core, which is not installed: {INSTALL_HINT}"
        )
    return Path(next(iter(found.submodule_search_locations)))


def supported_models() -> list[str]:
    """The ``MODEL`` names an ``aic:`` spec accepts (hub ids and catalogue names)."""
    return sorted(_FROM_HUB) + sorted(FROM_CATALOGUE)


def resolve_model(name: str, *, spec: str) -> tuple[str, str]:
    """``(hub id of the shipped config, catalogue model name)`` for an ``aic:`` spec's MODEL.

    Refused with a clear error: the extra not installed; a name AIConfigurator would fetch
    from the model hub (anything it does not ship a config for, and local folders); a shipped
    config whose architecture the catalogue lacks.
    """
    package = package_dir()
    key = name.strip()
    hub = {k.lower(): k for k in _FROM_HUB}
    if key.lower() in hub:
        hub_id = hub[key.lower()]
        catalogue_name = _FROM_HUB[hub_id]
    elif key.lower() in FROM_CATALOGUE:
        catalogue_name = key.lower()
        hub_id = FROM_CATALOGUE[catalogue_name][0]
    else:
        shipped = (package / "model_configs" / f"{key.replace('/', '--')}_config.json").exists()
        if shipped:
            why = (
                "aiconfigurator-core ships its config, but the simulator's catalogue lacks "
                "its architecture"
            )
        elif _in_catalogue(key):
            why = "no AIConfigurator config is mapped to this catalogue model (MoE or absent)"
        else:
            why = (
                "aiconfigurator-core ships no config for it and would fetch one from the "
                "model hub, which the planner never does at run time"
            )
        raise EngineSpecError(
            f"engine spec {spec!r}: model {name!r} is refused: {why}; use one of "
            + ", ".join(supported_models())
        )
    config = package / "model_configs" / f"{hub_id.replace('/', '--')}_config.json"
    if not config.exists():
        raise EngineSpecError(
            f"engine spec {spec!r}: the installed aiconfigurator-core does not ship {config.name} "
            f"for {hub_id}; install the pinned version: {INSTALL_HINT}"
        )
    return hub_id, catalogue_name


def _in_catalogue(name: str) -> bool:
    try:
        catalogue.model(name)
    except CatalogueError:
        return False
    return True


def check_supported(
    *, model: ModelSpec, gpu: GpuSpec, backend: str, ep: int, spec_text: str
) -> None:
    """Refuse what the aic engine cannot time: an unknown GPU, no measured tables for the
    backend on it, a MoE model (its expert-parallel mapping is not wired), ``ep``. Takes the
    parsed spec's parts: ``engine_spec.parse`` calls it before the spec exists."""
    text = spec_text
    problems = []
    system = SYSTEMS.get(gpu.name)
    if system is None:
        problems.append(
            f"GPU {gpu.name!r} has no AIConfigurator system; known: {', '.join(SYSTEMS)}"
        )
    elif not _measured_versions(system, backend, "gemm"):
        problems.append(f"AIConfigurator has no {backend} tables for {system}")
    if model.moe is not None or ep != 1:
        problems.append("MoE models and expert parallelism are not supported by the aic engine")
    if model.weight_dtype == "fp8" and gpu.fp8_flops is None:
        problems.append(f"{gpu.name} has no FP8 tensor cores for {model.name}")
    if problems:
        raise EngineSpecError(f"engine spec {text!r}: " + "; ".join(problems))


def _measured_versions(system: str, backend: str, family: str) -> list[Path]:
    root = package_dir() / "systems" / "data" / system / family / backend
    return sorted(p for p in root.glob("*") if p.is_dir()) if root.is_dir() else []


@dataclass(frozen=True)
class MeasuredGrid:
    """The largest arguments AIConfigurator measured for one system and backend (over every
    version of its tables, since it fills gaps from older versions)."""

    gemm_tokens: int  # GEMM rows (tokens of one iteration)
    prefill_batch: int  # context-attention batch
    prefill_sequence: int  # context-attention sequence length (prefix + new tokens)
    decode_batch: int  # generation-attention batch
    decode_sequence: int  # generation-attention KV length

    def notes(
        self, tokens: int, prefill_requests: int, prefill_sequence: float, batch: int, kv: float
    ) -> list[tuple[str, str]]:
        """``(kind, note)`` for each argument beyond the grid (empty: inside)."""
        out = []
        if tokens > self.gemm_tokens:
            out.append(("gemm", f"{tokens} tokens per iteration > measured {self.gemm_tokens}"))
        if prefill_requests > self.prefill_batch:
            out.append(
                (
                    "prefill batch",
                    f"{prefill_requests} prefills in one iteration > measured {self.prefill_batch}",
                )
            )
        if prefill_sequence > self.prefill_sequence:
            out.append(
                (
                    "prefill sequence",
                    f"prefill sequence {prefill_sequence:.0f} > measured {self.prefill_sequence}",
                )
            )
        if batch > self.decode_batch:
            out.append(("decode batch", f"decode batch {batch} > measured {self.decode_batch}"))
        if kv > self.decode_sequence:
            out.append(
                ("decode context", f"decode context {kv:.0f} > measured {self.decode_sequence}")
            )
        return out


def _column_max(files: list[Path], column: str) -> int:
    import pandas as pd  # type: ignore[import-untyped]  # a dependency of aiconfigurator-core

    best = 0
    for f in files:
        best = max(best, int(pd.read_parquet(f, columns=[column])[column].max()))
    return best


def measured_grid(system: str, backend: str) -> MeasuredGrid:
    def files(family: str, name: str) -> list[Path]:
        return [
            v / name for v in _measured_versions(system, backend, family) if (v / name).exists()
        ]

    gemm = files("gemm", "gemm_perf.parquet")
    ctx = files("attention", "context_attention_perf.parquet")
    gen = files("attention", "generation_attention_perf.parquet")
    return MeasuredGrid(
        gemm_tokens=_column_max(gemm, "m"),
        prefill_batch=_column_max(ctx, "batch_size"),
        prefill_sequence=_column_max(ctx, "isl"),
        decode_batch=_column_max(gen, "batch_size"),
        # ``step`` is the KV length the measured decode token attends to
        decode_sequence=_column_max(gen, "step") + 1,
    )


__all__ = [
    "FROM_CATALOGUE",
    "INSTALL_HINT",
    "PACKAGE",
    "SYSTEMS",
    "MeasuredGrid",
    "check_supported",
    "measured_grid",
    "package_dir",
    "resolve_model",
    "supported_models",
]
