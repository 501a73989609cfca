"""A fleet replay's file (``--fleet FILE``: the pool and its members, checked with an error
naming the field), its static shares, and its result (:mod:`disagg_planner.replay.fleet`
runs it, :mod:`disagg_planner.replay.fleet_page` draws it)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from disagg_planner.core.fleet import PoolLimits
from disagg_planner.errors import SpecError
from disagg_planner.replay.runner import ReplayResult


class _PoolSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_total_gpus: int = Field(ge=1, description="The pool's ceiling, all members together.")
    min_total_gpus: int = Field(0, ge=0, description="The pool does not shrink below this.")
    stabilization_seconds: float = Field(
        300.0, ge=0, description="How long a lower share must last before a grant is withdrawn."
    )


class FleetMemberSpec(BaseModel):
    """One member: the words of ``planner replay``'s flags."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$")
    trace: str | None = None
    workload: str | None = None
    trace_format: str | None = None
    scale_load: float = Field(1.0, gt=0)
    speedup: float = Field(1.0, gt=0)
    duration: float | None = Field(None, gt=0)
    profile: str | None = None
    engine: str | None = None
    ttft: float | None = Field(None, gt=0)
    itl: float | None = Field(None, gt=0)
    priority: int = 0
    floor_gpus: int = Field(ge=0)
    ceiling_gpus: int | None = Field(None, ge=0)
    seed: int = 0
    config: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_workload(self) -> FleetMemberSpec:
        if (self.trace is None) == (self.workload is None):
            raise ValueError("give exactly one of trace or workload")
        return self


class FleetSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pool: _PoolSpec
    members: list[FleetMemberSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> FleetSpec:
        names = [m.name for m in self.members]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"member names must be unique: {', '.join(twice)} repeated")
        floors = sum(m.floor_gpus for m in self.members)
        if floors > self.pool.max_total_gpus:
            raise ValueError(
                f"the members' floor_gpus add up to {floors}, above pool.max_total_gpus "
                f"({self.pool.max_total_gpus})"
            )
        return self

    @property
    def limits(self) -> PoolLimits:
        # a member's held GPUs here are its simulated cluster's, draining replicas counted
        return PoolLimits(
            self.pool.max_total_gpus,
            self.pool.min_total_gpus,
            self.pool.stabilization_seconds,
            trim_idle=True,
        )


def load_fleet(path: str | Path) -> FleetSpec:
    """The fleet file, validated; a :class:`SpecError` naming the file, field and value."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SpecError(f"--fleet {path}: cannot read it: {exc}") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"--fleet {path}: not YAML: {exc}") from None
    if not isinstance(data, dict):
        raise SpecError(f"--fleet {path}: expected a mapping with pool: and members:")
    try:
        return FleetSpec.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(
                f"[{p}]" if isinstance(p, int) else str(p) for p in err["loc"]
            ).replace(".[", "[")
            value = err.get("input")
            shown = "" if isinstance(value, dict) else f" = {value!r}"
            problems.append(f"{where or 'fleet'}{shown}: {err['msg']}")
        raise SpecError(f"--fleet {path}: " + "; ".join(problems)) from None


def static_shares(spec: FleetSpec) -> dict[str, int]:
    """The pool cut in proportion to the members' floors (whole GPUs, largest remainders;
    every member at least its floor). Equal cuts when no member has a floor."""
    total = spec.pool.max_total_gpus
    weights = {m.name: m.floor_gpus for m in spec.members}
    if sum(weights.values()) == 0:
        weights = dict.fromkeys(weights, 1)
    weight_sum = sum(weights.values())
    exact = {n: total * w / weight_sum for n, w in weights.items()}
    out = {n: math.floor(x) for n, x in exact.items()}
    for n in sorted(exact, key=lambda n: (-(exact[n] - out[n]), n))[: total - sum(out.values())]:
        out[n] += 1
    return out


@dataclass
class FleetResult:
    split: str
    results: dict[str, ReplayResult]
    fleet: dict[str, Any]
    pool_series: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    grants: list[dict[str, Any]] = field(default_factory=list)
