"""GPU budget and replica guards: pure functions over replica counts.

Order of application in a throughput tick (each a named stage, as in the HPA's chain of
propose -> stabilise -> rate-limit -> clamp): floors (min endpoints), the per-tick change cap,
then the GPU budget.

:func:`apply_gpu_budget` is the one GPU-budget rule of the planner: the throughput loop, the
load loop and the elastic-EP policy all call it, so one configuration gives one cap. Budgets
count ``replicas x gpus_per_replica`` summed over the roles this planner scales (plus, for a
caller that sizes only some of them, the GPUs the others hold); ``-1`` disables a bound.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class BudgetResult:
    """Replicas after the budget stage; ``limited_by`` says which bound acted, if any.

    ``reconcile``: the allocation the roles already hold is itself outside the budget and is
    brought back inside (rather than only a proposal being cut).
    """

    replicas: dict[str, int]
    limited_by: str | None = None  # "max_gpu_budget" | "min_gpu_budget" | "min_footprint"
    message: str = ""
    reconcile: bool = False

    @property
    def hold(self) -> bool:
        """Even the floors do not fit under the ceiling: the caller changes nothing."""
        return self.limited_by == "min_footprint"


def gpus_of(replicas: Mapping[str, int], gpus_per_replica: Mapping[str, int]) -> int:
    return sum(n * gpus_per_replica[role] for role, n in replicas.items())


def apply_floors(replicas: Mapping[str, int], floors: Mapping[str, int]) -> dict[str, int]:
    """Never fewer replicas than a role's min endpoint."""
    return {role: max(n, floors[role]) for role, n in replicas.items()}


def cap_change(
    desired: Mapping[str, int],
    current: Mapping[str, int],
    *,
    max_step: int,
    floors: Mapping[str, int],
) -> dict[str, int]:
    """Limit each role's change to ``max_step`` replicas per tick.

    A role below its floor is still lifted to the floor in one step: recovering the minimum
    the user asked for is not a scaling decision to rate-limit.
    """
    out: dict[str, int] = {}
    for role, want in desired.items():
        now = current[role]
        bounded = min(max(want, now - max_step), now + max_step)
        out[role] = max(bounded, floors[role]) if want >= floors[role] else bounded
    return out


def apply_gpu_budget(
    replicas: Mapping[str, int],
    *,
    gpus_per_replica: Mapping[str, int],
    floors: Mapping[str, int],
    max_gpus: int,
    min_gpus: int,
    order: tuple[str, ...],
    current: Mapping[str, int] | None = None,
    other_gpus: int = 0,
) -> BudgetResult:
    """Fit the wanted ``replicas`` between ``min_gpus`` and ``max_gpus`` (-1: no bound).

    Counted: ``replicas x gpus_per_replica`` of the roles in ``order`` plus ``other_gpus``,
    what the planner's roles that this call does not size hold (never changed here).

    The budget caps and never makes a scaling decision of its own: with ``current`` (the
    replicas the roles have now) no role is moved against the direction it asked for, so a
    budget never takes a replica from one role to give it to another. A wanted shrink is kept
    and a wanted growth is cut; only an allocation already outside the budget is moved back
    (``reconcile``). Without ``current`` every role is taken to hold its floor.

    - Over the ceiling: every role keeps what it has and still wants (never less than its
      floor), and the GPUs left under the ceiling go to the growth asked for, the same share
      of each role's ask; roles earlier in ``order`` take their share rounded down first and
      the last role takes what remains, never more than it asked for (Dynamo's split:
      prefill first, decode the rest). The result never exceeds the ceiling. When what the
      roles keep is already over it, every role gives back the same share of what it holds
      above its floor. When even the floors do not fit, the replicas are returned unchanged
      with ``limited_by="min_footprint"`` (:attr:`BudgetResult.hold`) so the caller holds
      instead of acting on an impossible budget.
    - Under the floor: a wanted shrink stops at the floor (each shrinking role keeps the same
      share of what it asked to give up, rounded up); when even the current replicas are
      below it, the roles grow by the same factor (rounded up) to reach it. Neither crosses
      the ceiling: if it would, the floor gives way.
    """

    count = _Count(gpus_per_replica, order, other_gpus)
    total = count.gpus(replicas)
    if max_gpus != -1 and total > max_gpus:
        return _under_ceiling(count, replicas, current, floors, max_gpus)
    if min_gpus != -1 and total < min_gpus:
        return _over_floor(count, replicas, current, floors, max_gpus, min_gpus)
    return BudgetResult(dict(replicas))


@dataclass(frozen=True)
class _Count:
    """How the budget counts: GPUs per replica of the roles sized, in their sharing order,
    plus the GPUs of the roles that are not."""

    gpus_per_replica: Mapping[str, int]
    order: tuple[str, ...]
    other_gpus: int

    def gpus(self, counts: Mapping[str, int]) -> int:
        return gpus_of(counts, self.gpus_per_replica) + self.other_gpus


def _under_ceiling(
    count: _Count,
    replicas: Mapping[str, int],
    current: Mapping[str, int] | None,
    floors: Mapping[str, int],
    max_gpus: int,
) -> BudgetResult:
    """``replicas`` (over ``max_gpus``) cut to it, or a hold (see :func:`apply_gpu_budget`)."""
    footprint = count.gpus(floors)
    if footprint > max_gpus:
        others = " and the other roles" if count.other_gpus else ""
        return BudgetResult(
            dict(replicas),
            "min_footprint",
            f"the minimum endpoints{others} need {footprint} GPUs, above max_gpu_budget {max_gpus}",
        )
    kept = {
        r: floors[r] if current is None else max(floors[r], min(n, current[r]))
        for r, n in replicas.items()
    }
    if count.gpus(kept) > max_gpus:
        held = {r: n - floors[r] for r, n in kept.items()}
        return BudgetResult(
            _spread(count, floors, held, max_gpus - footprint),
            "max_gpu_budget",
            f"{count.gpus(kept)} GPUs held, max_gpu_budget is {max_gpus}; reconciling",
            reconcile=True,
        )
    asks = {r: max(0, n - kept[r]) for r, n in replicas.items()}
    return BudgetResult(
        _spread(count, kept, asks, max_gpus - count.gpus(kept)),
        "max_gpu_budget",
        f"{count.gpus(replicas)} GPUs wanted, max_gpu_budget is {max_gpus}",
    )


def _over_floor(
    count: _Count,
    replicas: Mapping[str, int],
    current: Mapping[str, int] | None,
    floors: Mapping[str, int],
    max_gpus: int,
    min_gpus: int,
) -> BudgetResult:
    """``replicas`` (under ``min_gpus``) raised to it where the ceiling allows."""
    total = count.gpus(replicas)
    upper = (
        dict(replicas) if current is None else {r: max(n, current[r]) for r, n in replicas.items()}
    )
    reconcile = count.gpus(upper) < min_gpus
    if reconcile:
        out = _grow(count, replicas, floors, min_gpus - count.other_gpus)
    else:
        gave_up = {r: upper[r] - n for r, n in replicas.items()}
        out = _spread(count, replicas, gave_up, min_gpus - total, round_up=True)
    if max_gpus != -1 and count.gpus(out) > max_gpus:
        return BudgetResult(
            dict(replicas), None, "raising to min_gpu_budget would cross max_gpu_budget"
        )
    return BudgetResult(
        out,
        "min_gpu_budget",
        f"{total} GPUs wanted, min_gpu_budget is {min_gpus}",
        reconcile=reconcile,
    )


def _spread(
    count: _Count,
    base: Mapping[str, int],
    room: Mapping[str, int],
    amount: int,
    *,
    round_up: bool = False,
) -> dict[str, int]:
    """``base`` plus the same share of each role's ``room`` (replicas), the shares coming to
    ``amount`` GPUs: at most that many rounding down (a ceiling), at least rounding up (a
    floor). Roles earlier in the order take their share first; the last takes the rest,
    never more than its room. Integer arithmetic: a share is exact, not a float's guess."""
    gpus_per_replica, order = count.gpus_per_replica, count.order
    wanted = sum(room[r] * gpus_per_replica[r] for r in order)
    out = dict(base)
    left = amount
    for i, role in enumerate(order):
        gpu = gpus_per_replica[role]
        if i == len(order) - 1:
            n = -(-max(left, 0) // gpu) if round_up else left // gpu
        else:
            part = room[role] * amount
            n = -(-part // wanted) if round_up else part // wanted
        n = max(0, min(room[role], n))
        out[role] = base[role] + n
        left -= n * gpu
    return out


def _grow(
    count: _Count, replicas: Mapping[str, int], floors: Mapping[str, int], target: int
) -> dict[str, int]:
    """Every role grown by the same factor (rounded up) until the roles hold ``target``
    GPUs, the last role taking what remains; from nothing, an even split."""
    gpus_per_replica, order = count.gpus_per_replica, count.order
    own = gpus_of(replicas, gpus_per_replica)
    scale = target / max(own, 1)
    out: dict[str, int] = {}
    remaining = target
    for i, role in enumerate(order):
        gpu = gpus_per_replica[role]
        if i == len(order) - 1:
            n = math.ceil(max(remaining, 0) / gpu)
        else:
            base = replicas[role] if own > 0 else target / len(order) / gpu
            n = math.ceil(base * scale) if own > 0 else math.floor(base)
        out[role] = max(floors[role], n)
        remaining -= out[role] * gpu
    return out
