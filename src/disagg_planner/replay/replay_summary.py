"""``summary.json``, typed: one policy's score in one replay, and the one place its keys are
spelled.

The runner scores the run (:meth:`disagg_planner.replay.runner.PolicyRun.result`); the
session adds the references it is compared with and how it was set up
(:func:`disagg_planner.replay.session.run`), the fleet replay its share of the pool; the
writer adds the planner's config. Every reader (the reports, the comparison page, the
terminal table, ``benchmarks/``) reads it back with :meth:`ReplaySummary.read`, which names
the file and the field of anything missing or of the wrong type.

Names: a target is ``*_target_ms`` here (``SloTargets.ttft_target_ms``), an observed latency
``*_ms`` (``ReplaySummary.ttft_ms``, the percentiles of the requests' TTFTs). The JSON keys
are those ``summary.json`` has always had (``slo.ttft_ms`` is the target there), so that
files written before read the same; :meth:`ReplaySummary.to_json` writes them in the order
they were always written, so one run's file is byte for byte what it was.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.errors import SpecError

SUMMARY_FILE = "summary.json"
# Scored against this share of requests meeting both SLOs when the config sets no target
# (dynamo-default's has none): the planner's own default ``ttft_attainment_target``.
DEFAULT_ATTAINMENT_TARGET: float = PlannerConfig.model_fields["ttft_attainment_target"].default


class _Fields:
    """The fields of one JSON object of a summary, each checked as it is read: an error names
    the file and the field's dotted path."""

    def __init__(self, data: Any, *, source: str, path: str = "") -> None:
        if not isinstance(data, Mapping):
            where = f"field {path!r}" if path else "the top level"
            raise SpecError(f"{source}: {where}: expected an object, got {data!r}")
        self.data = data
        self.source = source
        self.path = path

    def _name(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str) -> Any:
        if key not in self.data:
            raise SpecError(f"{self.source}: missing field {self._name(key)!r}")
        return self.data[key]

    def _bad(self, key: str, expected: str, value: Any) -> SpecError:
        return SpecError(
            f"{self.source}: field {self._name(key)!r}: expected {expected}, got {value!r}"
        )

    def number(self, key: str) -> float:
        value = self.raw(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._bad(key, "a number", value)
        return value

    def number_or_none(self, key: str) -> float | None:
        return None if self.raw(key) is None else self.number(key)

    def count(self, key: str) -> int:
        value = self.raw(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._bad(key, "a whole number", value)
        return value

    def count_or_none(self, key: str) -> int | None:
        return None if self.raw(key) is None else self.count(key)

    def text(self, key: str) -> str:
        value = self.raw(key)
        if not isinstance(value, str):
            raise self._bad(key, "a string", value)
        return value

    def flag(self, key: str) -> bool:
        value = self.raw(key)
        if not isinstance(value, bool):
            raise self._bad(key, "true or false", value)
        return value

    def obj(self, key: str) -> _Fields:
        return _Fields(self.raw(key), source=self.source, path=self._name(key))

    def counts(self, key: str) -> dict[str, int]:
        sub = self.obj(key)
        return {k: sub.count(k) for k in sub.data}

    def numbers(self, key: str) -> dict[str, float]:
        sub = self.obj(key)
        return {k: sub.number(k) for k in sub.data}

    def items(self, key: str) -> list[_Fields]:
        value = self.raw(key)
        if not isinstance(value, list):
            raise self._bad(key, "a list", value)
        return [
            _Fields(v, source=self.source, path=f"{self._name(key)}[{i}]")
            for i, v in enumerate(value)
        ]


@dataclass(frozen=True)
class Attainment:
    """The share of every submitted request meeting the TTFT target, the ITL target, and
    both (``slo_attainment``)."""

    ttft: float
    itl: float
    both: float

    def to_json(self) -> dict[str, Any]:
        return {"ttft": self.ttft, "itl": self.itl, "both": self.both}

    @classmethod
    def from_fields(cls, f: _Fields) -> Attainment:
        return cls(f.number("ttft"), f.number("itl"), f.number("both"))


@dataclass(frozen=True)
class Percentiles:
    """Observed latencies of the completed requests, in ms (None: no request had one)."""

    p50: float | None
    p90: float | None
    p95: float | None
    p99: float | None

    def to_json(self) -> dict[str, Any]:
        return {"p50": self.p50, "p90": self.p90, "p95": self.p95, "p99": self.p99}

    @classmethod
    def from_fields(cls, f: _Fields) -> Percentiles:
        p = f.number_or_none
        return cls(p("p50"), p("p90"), p("p95"), p("p99"))


@dataclass(frozen=True)
class DrainFigures:
    """What removing replicas did to the requests on them (``drain``)."""

    grace_s: float | None  # None: drains are not bounded
    cancelled: int
    migrated: int

    def to_json(self) -> dict[str, Any]:
        return {"grace_s": self.grace_s, "cancelled": self.cancelled, "migrated": self.migrated}

    @classmethod
    def from_fields(cls, f: _Fields) -> DrainFigures:
        return cls(f.number_or_none("grace_s"), f.count("cancelled"), f.count("migrated"))


@dataclass(frozen=True)
class ElasticResize:
    """One resize of the elastic-EP engine's DP size."""

    from_dp: int
    to_dp: int
    mode: str
    requested_s: float
    followers_ready_s: float | None
    start_s: float
    pause_start_s: float
    end_s: float
    pause_s: float
    arrived_in_pause: int

    def to_json(self) -> dict[str, Any]:
        return {
            "from_dp": self.from_dp,
            "to_dp": self.to_dp,
            "mode": self.mode,
            "requested_s": self.requested_s,
            "followers_ready_s": self.followers_ready_s,
            "start_s": self.start_s,
            "pause_start_s": self.pause_start_s,
            "end_s": self.end_s,
            "pause_s": self.pause_s,
            "arrived_in_pause": self.arrived_in_pause,
        }

    @classmethod
    def from_fields(cls, f: _Fields) -> ElasticResize:
        return cls(
            from_dp=f.count("from_dp"),
            to_dp=f.count("to_dp"),
            mode=f.text("mode"),
            requested_s=f.number("requested_s"),
            followers_ready_s=f.number_or_none("followers_ready_s"),
            start_s=f.number("start_s"),
            pause_start_s=f.number("pause_start_s"),
            end_s=f.number("end_s"),
            pause_s=f.number("pause_s"),
            arrived_in_pause=f.count("arrived_in_pause"),
        )


@dataclass(frozen=True)
class ElasticFigures:
    """The elastic-EP role's DP sizes and resizes (``elastic_ep``; an elastic replay only)."""

    role: str
    dp_initial: int | None
    dp_final: int | None
    dp_min: int | None
    dp_max: int | None
    dp_mean: float | None
    resizes: tuple[ElasticResize, ...]
    paused_s: float
    aborted_at_shrink: int  # requests a shrink aborted on its removed ranks: failed

    def to_json(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "dp_initial": self.dp_initial,
            "dp_final": self.dp_final,
            "dp_min": self.dp_min,
            "dp_max": self.dp_max,
            "dp_mean": self.dp_mean,
            "resizes": [r.to_json() for r in self.resizes],
            "paused_s": self.paused_s,
            "aborted_at_shrink": self.aborted_at_shrink,
        }

    @classmethod
    def from_fields(cls, f: _Fields) -> ElasticFigures:
        return cls(
            role=f.text("role"),
            dp_initial=f.count_or_none("dp_initial"),
            dp_final=f.count_or_none("dp_final"),
            dp_min=f.count_or_none("dp_min"),
            dp_max=f.count_or_none("dp_max"),
            dp_mean=f.number_or_none("dp_mean"),
            resizes=tuple(ElasticResize.from_fields(r) for r in f.items("resizes")),
            paused_s=f.number("paused_s"),
            aborted_at_shrink=f.count("aborted_at_shrink"),
        )


@dataclass(frozen=True)
class BestStaticFigures:
    """The cheapest fixed deployment meeting the searches' target, and its own run."""

    replicas: dict[str, int]
    gpu_hours: float
    attainment_both: float  # JSON: slo_attainment (both targets)
    meets_target: bool  # over every request
    qualifies: bool  # over the requests some deployment can serve

    def to_json(self) -> dict[str, Any]:
        return {
            "replicas": self.replicas,
            "gpu_hours": self.gpu_hours,
            "slo_attainment": self.attainment_both,
            "meets_target": self.meets_target,
            "qualifies": self.qualifies,
        }

    @classmethod
    def from_fields(cls, f: _Fields) -> BestStaticFigures:
        return cls(
            replicas=f.counts("replicas"),
            gpu_hours=f.number("gpu_hours"),
            attainment_both=f.number("slo_attainment"),
            meets_target=f.flag("meets_target"),
            qualifies=f.flag("qualifies"),
        )


@dataclass(frozen=True)
class ReferenceFigures:
    """The run compared with the references of its replay
    (:mod:`disagg_planner.replay.bounds`); top-level keys of ``summary.json``."""

    # JSON slo_target: the share of requests meeting both targets the oracle and best-static
    # searches hold (not the policy's own attainment target: SloTargets.attainment_target)
    search_attainment_target: float
    unservable_requests: int
    oracle_plan: str  # "windows" or "best-static"
    oracle_gpu_hours: float
    oracle_attainment_both: float  # JSON: oracle_slo_attainment
    gpu_hours_ratio_to_oracle: float | None
    best_static: BestStaticFigures
    gpu_hours_ratio_to_best_static: float | None
    fluid_bound_gpu_hours: float | None  # None without a profile
    gpu_hours_ratio_to_fluid_bound: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "slo_target": self.search_attainment_target,
            "unservable_requests": self.unservable_requests,
            "oracle_plan": self.oracle_plan,
            "oracle_gpu_hours": self.oracle_gpu_hours,
            "oracle_slo_attainment": self.oracle_attainment_both,
            "gpu_hours_ratio_to_oracle": self.gpu_hours_ratio_to_oracle,
            "best_static": self.best_static.to_json(),
            "gpu_hours_ratio_to_best_static": self.gpu_hours_ratio_to_best_static,
            "fluid_bound_gpu_hours": self.fluid_bound_gpu_hours,
            "gpu_hours_ratio_to_fluid_bound": self.gpu_hours_ratio_to_fluid_bound,
        }

    @classmethod
    def from_fields(cls, f: _Fields) -> ReferenceFigures:
        return cls(
            search_attainment_target=f.number("slo_target"),
            unservable_requests=f.count("unservable_requests"),
            oracle_plan=f.text("oracle_plan"),
            oracle_gpu_hours=f.number("oracle_gpu_hours"),
            oracle_attainment_both=f.number("oracle_slo_attainment"),
            gpu_hours_ratio_to_oracle=f.number_or_none("gpu_hours_ratio_to_oracle"),
            best_static=BestStaticFigures.from_fields(f.obj("best_static")),
            gpu_hours_ratio_to_best_static=f.number_or_none("gpu_hours_ratio_to_best_static"),
            fluid_bound_gpu_hours=f.number_or_none("fluid_bound_gpu_hours"),
            gpu_hours_ratio_to_fluid_bound=f.number_or_none("gpu_hours_ratio_to_fluid_bound"),
        )


@dataclass(frozen=True)
class SloTargets:
    """The targets the run was scored against (JSON ``slo``: ``ttft_ms``, ``itl_ms``,
    ``attainment_target``)."""

    ttft_target_ms: float
    itl_target_ms: float
    attainment_target: float  # the share of requests meeting both that passes

    def to_json(self) -> dict[str, Any]:
        return {
            "ttft_ms": self.ttft_target_ms,
            "itl_ms": self.itl_target_ms,
            "attainment_target": self.attainment_target,
        }

    @classmethod
    def of(cls, config: PlannerConfig) -> SloTargets:
        """The targets a replay under ``config`` is scored against, so that a report of any
        policy, baselines included, can say whether it met them."""
        target = config.ttft_attainment_target
        return cls(
            ttft_target_ms=config.ttft_ms,
            itl_target_ms=config.itl_ms,
            attainment_target=DEFAULT_ATTAINMENT_TARGET if target is None else target,
        )

    @classmethod
    def from_fields(cls, f: _Fields) -> SloTargets:
        return cls(f.number("ttft_ms"), f.number("itl_ms"), f.number("attainment_target"))

    def met_by(self, attainment: Attainment) -> bool:
        """Whether ``attainment`` of both targets reaches the attainment target."""
        return attainment.both >= self.attainment_target


@dataclass(frozen=True)
class RunSetup:
    """How the run was set up; what :func:`disagg_planner.replay.session.run` and the fleet
    replay add to the runner's score."""

    startup_delay_s: float | None  # None: the start-up phase model
    # what the start-up model is (simulator/startup.py describe); the fleet replay omits it
    startup: dict[str, Any] | None
    initial_replicas: dict[str, int]
    engine: str | None  # the simulated engine; the fleet replay omits it
    slo: SloTargets | None  # None: a summary written before it said

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"startup_delay_s": self.startup_delay_s}
        if self.startup is not None:
            out["startup"] = self.startup
        out["initial_replicas"] = self.initial_replicas
        if self.engine is not None:
            out["engine"] = self.engine
        if self.slo is not None:
            out["slo"] = self.slo.to_json()
        return out

    @classmethod
    def from_fields(cls, f: _Fields) -> RunSetup:
        return cls(
            startup_delay_s=f.number_or_none("startup_delay_s"),
            startup=dict(f.obj("startup").data) if f.has("startup") else None,
            initial_replicas=f.counts("initial_replicas"),
            engine=f.text("engine") if f.has("engine") else None,
            slo=SloTargets.from_fields(f.obj("slo")) if f.has("slo") else None,
        )


@dataclass(frozen=True)
class FleetShare:
    """A fleet member's place in the pool (``fleet``; a fleet replay only)."""

    split: str
    priority: int
    floor_gpus: int
    static_share_gpus: int
    capped_by_grant: int

    def to_json(self) -> dict[str, Any]:
        return {
            "split": self.split,
            "priority": self.priority,
            "floor_gpus": self.floor_gpus,
            "static_share_gpus": self.static_share_gpus,
            "capped_by_grant": self.capped_by_grant,
        }

    @classmethod
    def from_fields(cls, f: _Fields) -> FleetShare:
        return cls(
            split=f.text("split"),
            priority=f.count("priority"),
            floor_gpus=f.count("floor_gpus"),
            static_share_gpus=f.count("static_share_gpus"),
            capped_by_grant=f.count("capped_by_grant"),
        )


@dataclass(frozen=True)
class ReplaySummary:
    """One policy's ``summary.json``. The runner fills the score; ``references``, ``setup``,
    ``fleet`` and ``config`` are None until what adds them has (and then absent from the
    JSON)."""

    policy: str
    requests: int  # submitted
    completed: int
    failed: int  # failed or never finished: they miss both targets
    slo_attainment: Attainment
    ttft_ms: Percentiles  # observed
    itl_ms: Percentiles  # observed
    unfinished: int
    gpu_hours: float
    gpu_hours_by_role: dict[str, float]
    replica_hours: dict[str, float]
    metered_span_s: float
    last_arrival_s: float
    scale_actions: dict[str, int]
    drain: DrainFigures
    rejected: int  # answered 503 in an elastic-EP resize's pause
    elastic_ep: ElasticFigures | None
    flaps: dict[str, int]
    flap_window_s: float
    max_replicas: dict[str, int]
    duration_s: float
    wall_s: float
    references: ReferenceFigures | None = None
    setup: RunSetup | None = None
    fleet: FleetShare | None = None
    config: dict[str, Any] | None = None  # the planner's config (PlannerConfig, as JSON)

    def to_json(self) -> dict[str, Any]:
        """The JSON object, its keys in the order ``summary.json`` has always had."""
        out: dict[str, Any] = {
            "policy": self.policy,
            "requests": self.requests,
            "completed": self.completed,
            "failed": self.failed,
            "slo_attainment": self.slo_attainment.to_json(),
            "ttft_ms": self.ttft_ms.to_json(),
            "itl_ms": self.itl_ms.to_json(),
            "unfinished": self.unfinished,
            "gpu_hours": self.gpu_hours,
            "gpu_hours_by_role": self.gpu_hours_by_role,
            "replica_hours": self.replica_hours,
            "metered_span_s": self.metered_span_s,
            "last_arrival_s": self.last_arrival_s,
            "scale_actions": self.scale_actions,
            "drain": self.drain.to_json(),
            "rejected": self.rejected,
        }
        if self.elastic_ep is not None:
            out["elastic_ep"] = self.elastic_ep.to_json()
        out |= {
            "flaps": self.flaps,
            "flap_window_s": self.flap_window_s,
            "max_replicas": self.max_replicas,
            "duration_s": self.duration_s,
            "wall_s": self.wall_s,
        }
        if self.references is not None:
            out |= self.references.to_json()
        if self.setup is not None:
            out |= self.setup.to_json()
        if self.fleet is not None:
            out["fleet"] = self.fleet.to_json()
        if self.config is not None:
            out["config"] = self.config
        return out

    @classmethod
    def from_json(cls, data: Any, *, source: str = SUMMARY_FILE) -> ReplaySummary:
        """The summary :meth:`to_json` wrote; a :class:`SpecError` naming ``source`` and the
        field that is missing or not what it should be."""
        f = _Fields(data, source=source)
        return cls(
            policy=f.text("policy"),
            requests=f.count("requests"),
            completed=f.count("completed"),
            failed=f.count("failed"),
            slo_attainment=Attainment.from_fields(f.obj("slo_attainment")),
            ttft_ms=Percentiles.from_fields(f.obj("ttft_ms")),
            itl_ms=Percentiles.from_fields(f.obj("itl_ms")),
            unfinished=f.count("unfinished"),
            gpu_hours=f.number("gpu_hours"),
            gpu_hours_by_role=f.numbers("gpu_hours_by_role"),
            replica_hours=f.numbers("replica_hours"),
            metered_span_s=f.number("metered_span_s"),
            last_arrival_s=f.number("last_arrival_s"),
            scale_actions=f.counts("scale_actions"),
            drain=DrainFigures.from_fields(f.obj("drain")),
            rejected=f.count("rejected"),
            elastic_ep=ElasticFigures.from_fields(f.obj("elastic_ep"))
            if f.has("elastic_ep")
            else None,
            flaps=f.counts("flaps"),
            flap_window_s=f.number("flap_window_s"),
            max_replicas=f.counts("max_replicas"),
            duration_s=f.number("duration_s"),
            wall_s=f.number("wall_s"),
            # the references' keys come together: slo_target says they are there
            references=ReferenceFigures.from_fields(f) if f.has("slo_target") else None,
            setup=RunSetup.from_fields(f) if f.has("initial_replicas") else None,
            fleet=FleetShare.from_fields(f.obj("fleet")) if f.has("fleet") else None,
            config=dict(f.obj("config").data) if f.has("config") else None,
        )

    def write(self, path: Path) -> None:
        """``path`` (a ``summary.json``)."""
        # default=str: a config value JSON has no type for is written as its text
        path.write_text(json.dumps(self.to_json(), indent=2, default=str) + "\n")

    @classmethod
    def read(cls, path: Path) -> ReplaySummary:
        """The summary in ``path``; a :class:`SpecError` naming it when it is not one."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise SpecError(f"{path}: cannot read it ({exc.strerror or exc})") from exc
        except json.JSONDecodeError as exc:
            raise SpecError(f"{path}: not JSON ({exc})") from exc
        return cls.from_json(data, source=str(path))

    @property
    def slo(self) -> SloTargets | None:
        """The targets it was scored against (None before the session said)."""
        return None if self.setup is None else self.setup.slo

    @property
    def meets_target(self) -> bool | None:
        """Whether it met the SLO attainment target (None where it says no target)."""
        slo = self.slo
        return None if slo is None else slo.met_by(self.slo_attainment)
