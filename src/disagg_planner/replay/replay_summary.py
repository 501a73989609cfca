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
import types
from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, TypeVar, Union, cast, get_args, get_origin, get_type_hints

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


# --- the JSON of the records below, from their fields -------------------------------------------
# A field is written under its own name, or its metadata's "json" name; an optional one
# (metadata _OPTIONAL) is left out while None (a block what adds it has not added); a flat one
# (_FLAT: a record, or None) puts its keys at this level, and is there when its first key is.
# Records are written in their fields' order, the order summary.json has always had.

_T = TypeVar("_T")


_OPTIONAL = {"optional": True}
_FLAT = {"optional": True, "flat": True}


def _json_name(f: Field[Any]) -> str:
    return str(f.metadata.get("json", f.name))


def _to_json(record: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(record):
        value = getattr(record, f.name)
        if value is None and f.metadata.get("optional"):
            continue
        if is_dataclass(value):
            value = _to_json(value)
        elif isinstance(value, tuple):
            value = [_to_json(v) for v in value]
        if f.metadata.get("flat"):
            out |= value
        else:
            out[_json_name(f)] = value
    return out


def _from_json(kind: type[_T], data: _Fields) -> _T:
    hints = get_type_hints(kind)
    values: dict[str, Any] = {}
    for f in fields(cast(Any, kind)):
        name, hint = _json_name(f), hints[f.name]
        if f.metadata.get("flat"):
            inner = _not_none(hint)
            present = data.has(_json_name(fields(inner)[0]))
            values[f.name] = _from_json(inner, data) if present else None
        elif f.metadata.get("optional") and not data.has(name):
            values[f.name] = None
        else:
            values[f.name] = _read(data, name, hint)
    return kind(**values)


def _not_none(hint: Any) -> Any:
    """``X`` of ``X | None``."""
    return next(a for a in get_args(hint) if a is not type(None))


def _read(data: _Fields, name: str, hint: Any) -> Any:
    if get_origin(hint) in (Union, types.UnionType):
        if data.raw(name) is None:
            return None
        hint = _not_none(hint)
    readers = {float: data.number, int: data.count, str: data.text, bool: data.flag}
    if hint in readers:
        return readers[hint](name)
    if get_origin(hint) is dict:
        values = get_args(hint)[1]
        if values is int:
            return data.counts(name)
        if values is float:
            return data.numbers(name)
        return dict(data.obj(name).data)  # a free-form object (the config, the start-up model)
    if get_origin(hint) is tuple:
        item = get_args(hint)[0]
        return tuple(_from_json(item, x) for x in data.items(name))
    if is_dataclass(hint):
        return _from_json(cast(type, hint), data.obj(name))
    raise TypeError(f"summary.json has no reader for {hint!r} ({name})")


@dataclass(frozen=True)
class Attainment:
    """The share of every submitted request meeting the TTFT target, the ITL target, and
    both (``slo_attainment``)."""

    ttft: float
    itl: float
    both: float


@dataclass(frozen=True)
class Percentiles:
    """Observed latencies of the completed requests, in ms (None: no request had one)."""

    p50: float | None
    p90: float | None
    p95: float | None
    p99: float | None


@dataclass(frozen=True)
class DrainFigures:
    """What removing replicas did to the requests on them (``drain``)."""

    grace_s: float | None  # None: drains are not bounded
    cancelled: int
    migrated: int
    # With Dynamo's staged worker shutdown simulated (replay --worker-shutdown-budget): its
    # total budget, and how each removed worker's serving ended (kv_quiescent: every
    # request done and its KV read; worker_budget: the deadline cancelled the rest; killed:
    # the pod's grace ended first; in_progress: still shutting down at the end)
    worker_budget_s: float | None = field(default=None, metadata=_OPTIONAL)
    ended_by: dict[str, int] | None = field(default=None, metadata=_OPTIONAL)


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


@dataclass(frozen=True)
class BestStaticFigures:
    """The cheapest fixed deployment meeting the searches' target, and its own run."""

    replicas: dict[str, int]
    gpu_hours: float
    attainment_both: float = field(metadata={"json": "slo_attainment"})  # both targets
    meets_target: bool  # over every request
    qualifies: bool  # over the requests some deployment can serve


@dataclass(frozen=True)
class ReferenceFigures:
    """The run compared with the references of its replay
    (:mod:`disagg_planner.replay.bounds`); top-level keys of ``summary.json``."""

    # the share of requests meeting both targets the oracle and best-static searches hold
    # (not the policy's own attainment target: SloTargets.attainment_target)
    search_attainment_target: float = field(metadata={"json": "slo_target"})
    unservable_requests: int
    oracle_plan: str  # "windows" or "best-static"
    oracle_gpu_hours: float
    oracle_attainment_both: float = field(metadata={"json": "oracle_slo_attainment"})
    gpu_hours_ratio_to_oracle: float | None
    best_static: BestStaticFigures
    gpu_hours_ratio_to_best_static: float | None
    fluid_bound_gpu_hours: float | None  # None: no profile
    gpu_hours_ratio_to_fluid_bound: float | None


@dataclass(frozen=True)
class SloTargets:
    """The targets the run was scored against (JSON ``slo``: ``ttft_ms``, ``itl_ms``,
    ``attainment_target``)."""

    ttft_target_ms: float = field(metadata={"json": "ttft_ms"})
    itl_target_ms: float = field(metadata={"json": "itl_ms"})
    attainment_target: float  # the share of both that passes

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

    def met_by(self, attainment: Attainment) -> bool:
        """Whether ``attainment`` of both targets reaches the attainment target."""
        return attainment.both >= self.attainment_target


@dataclass(frozen=True, kw_only=True)
class RunSetup:
    """How the run was set up; what :func:`disagg_planner.replay.session.run` and the fleet
    replay add to the runner's score."""

    startup_delay_s: float | None  # None: the start-up phase model
    # what the start-up model is (simulator/startup.py describe); the fleet replay omits it
    startup: dict[str, Any] | None = field(default=None, metadata=_OPTIONAL)
    initial_replicas: dict[str, int]
    # the simulated engine; the fleet replay omits it
    engine: str | None = field(default=None, metadata=_OPTIONAL)
    # None: a summary written before it said
    slo: SloTargets | None = field(default=None, metadata=_OPTIONAL)


@dataclass(frozen=True)
class FleetShare:
    """A fleet member's place in the pool (``fleet``; a fleet replay only)."""

    split: str
    priority: int
    floor_gpus: int
    static_share_gpus: int
    capped_by_grant: int


@dataclass(frozen=True, kw_only=True)
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
    elastic_ep: ElasticFigures | None = field(default=None, metadata=_OPTIONAL)
    flaps: dict[str, int]
    flap_window_s: float
    max_replicas: dict[str, int]
    duration_s: float
    wall_s: float
    references: ReferenceFigures | None = field(default=None, metadata=_FLAT)
    setup: RunSetup | None = field(default=None, metadata=_FLAT)
    fleet: FleetShare | None = field(default=None, metadata=_OPTIONAL)
    # the planner's config (PlannerConfig, as JSON)
    config: dict[str, Any] | None = field(default=None, metadata=_OPTIONAL)

    def to_json(self) -> dict[str, Any]:
        """The JSON object, its keys in the order ``summary.json`` has always had."""
        return _to_json(self)

    @classmethod
    def from_json(cls, data: Any, *, source: str = SUMMARY_FILE) -> ReplaySummary:
        """The summary :meth:`to_json` wrote; a :class:`SpecError` naming ``source`` and the
        field that is missing or not what it should be."""
        return _from_json(cls, _Fields(data, source=source))

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
