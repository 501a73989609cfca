"""The guard chain both the throughput tick and the fast check run over a proposal.

::

    proposed -> floors -> kept floors (burst memory, breached cuts) -> stabilised
             -> observed margin -> step cap -> GPU budget

Each stage's replicas are kept (``stages``) and each guard that changed something says so
(``notes``). The fast check runs the same chain with ``up_only`` (it never removes what the
tick planned) and without the stabilisation and the step cap (what it orders is the
observed need, at once). No I/O, no clock: the stabilisation is passed in as a function.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from disagg_planner.core.budget import BudgetResult, apply_floors, apply_gpu_budget, cap_change
from disagg_planner.core.memory import StabilisationMemory
from disagg_planner.core.rules import RuleValue, scale_down_allowed

# (proposed, current) -> (stabilised, notes)
Stabiliser = Callable[[Mapping[str, int], Mapping[str, int]], tuple[dict[str, int], list[str]]]


@dataclass(frozen=True)
class GuardLimits:
    """The configured limits the chain applies."""

    roles: tuple[str, ...]
    floors: Mapping[str, int]
    gpus: Mapping[str, int]
    max_gpus: int
    min_gpus: int
    max_step: int | None = None  # per-tick change cap (None: none)


@dataclass(frozen=True)
class Guarded:
    """The chain's outcome: each stage's replicas, the budget's result, the guards' notes."""

    stages: dict[str, dict[str, int]]
    budget: BudgetResult
    notes: list[str] = field(default_factory=list)


def guard_chain(
    proposed: Mapping[str, int],
    *,
    current: Mapping[str, int],
    limits: GuardLimits,
    kept: Mapping[str, Mapping[str, RuleValue]] | None = None,
    stabilise: Stabiliser | None = None,
    margin: Mapping[str, RuleValue] | None = None,
    up_only: bool = False,
) -> Guarded:
    """Run the chain (module doc). ``kept`` holds, per stage name, the floor each role is
    kept at (a rule: its value, 0 for none, and its sentence); ``margin`` per role a rule whose
    value 0 refuses that role's scale-down
    (:func:`disagg_planner.core.feedback.scale_down_margin`)."""
    roles = limits.roles
    stages: dict[str, dict[str, int]] = {"proposed": {r: proposed[r] for r in roles}}
    stages["floors"] = apply_floors(stages["proposed"], limits.floors)
    notes: list[str] = []
    last = stages["floors"]
    for name, floors in (kept or {}).items():
        out = {}
        for role in roles:
            floor = floors.get(role)
            out[role] = max(last[role], int(floor.value)) if floor is not None else last[role]
            if floor is not None and out[role] > last[role]:
                notes.append(floor.reason or f"{role}: kept at {out[role]} ({name})")
        stages[name] = last = out
    if up_only:
        stages["up_only"] = last = {r: max(n, current[r]) for r, n in last.items()}
    if stabilise is not None:
        last, stabilise_notes = stabilise(last, current)
        stages["stabilised"] = last
        notes += stabilise_notes
    if margin is not None:
        out = dict(last)
        for role, rule in margin.items():
            if out[role] < current[role] and not rule.value:
                out[role] = current[role]
                notes.append(rule.reason)
        stages["margin"] = last = out
    if limits.max_step is not None:
        stages["step_cap"] = last = cap_change(
            last, current, max_step=limits.max_step, floors=limits.floors
        )
    budget = apply_gpu_budget(
        last,
        gpus_per_replica=limits.gpus,
        floors=limits.floors,
        max_gpus=limits.max_gpus,
        min_gpus=limits.min_gpus,
        order=roles,
        current=current,
    )
    final = dict(current) if (up_only and budget.hold) else budget.replicas
    if up_only:
        final = {r: max(current[r], n) for r, n in final.items()}
    stages["budget"] = final
    return Guarded(stages, budget, notes)


def stabilise(
    proposed: Mapping[str, int],
    current: Mapping[str, int],
    *,
    now_s: float,
    memory: StabilisationMemory,
    window_s: float,
    last_scale_up_s: Mapping[str, float],
    time_to_ready_s: Callable[[str], float],
    windows: Mapping[str, RuleValue] | None = None,
) -> tuple[dict[str, int], list[str]]:
    """Up fast, down slowly. Scale-down stabilisation (the HPA's): a role goes down only to
    the highest need remembered over the last ``window_s`` (``memory``: the caller
    remembers the need, without the backlog term, before), so a dip shorter than the time
    it takes to bring replicas back does not cost a round trip; never within one
    time-to-ready of its last scale-up (:func:`disagg_planner.core.rules.scale_down_allowed`);
    and not below the replicas found at the first tick for one window after it. ``windows``
    per role a shorter span its need is remembered for, with its sentence
    (:func:`disagg_planner.core.feedback.margin_window`; ``window_s`` when absent)."""
    if memory.found is None:
        memory.found = (now_s, dict(current))
    found_s, found = memory.found
    found_holds = window_s > 0 and now_s - found_s <= window_s
    out: dict[str, int] = {}
    notes: list[str] = []
    for role, want in proposed.items():
        if want >= current[role]:
            out[role] = want
            continue
        allowed = scale_down_allowed(
            now_s=now_s,
            last_scale_up_s=last_scale_up_s.get(role),
            time_to_ready_s=time_to_ready_s(role),
        )
        if not allowed.value:
            out[role] = current[role]
            notes.append(f"{role}: {allowed.reason}")
            continue
        span = (windows or {}).get(role)
        span_s = span.value if span is not None else window_s
        recent = memory.recent(role, since_s=now_s - span_s)
        at_start = found.get(role, 0) if found_holds else 0
        out[role] = min(current[role], max(want, recent, at_start))
        if out[role] > max(want, recent):
            held = "kept at" if out[role] == current[role] else "down to"
            notes.append(
                f"{role}: {held} {out[role]}, not {want}: the replicas found when the planner "
                f"started ({found_s:.0f} s) count as a need for {window_s:.0f} s (scale-down "
                "stabilisation)"
            )
        elif out[role] > want:
            notes.append(
                f"{role}: down to {out[role]}, not {want}: the highest need of the last "
                f"{span_s:.0f} s (scale-down stabilisation)"
            )
        if span is not None and span.reason and out[role] < current[role]:
            notes.append(span.reason)
    return out, notes
