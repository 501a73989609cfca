"""GPU budget and replica guards: pure functions over replica counts.

Order of application in a throughput tick (each a named stage, as in the HPA's chain of
propose -> stabilise -> rate-limit -> clamp): floors (min endpoints), the per-tick change cap,
then the GPU budget. Budgets count ``replicas x gpus_per_replica`` summed over the roles this
planner scales; ``-1`` disables a bound.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class BudgetResult:
    """Replicas after the budget stage; ``limited_by`` says which bound acted, if any."""

    replicas: dict[str, int]
    limited_by: str | None = None  # "max_gpu_budget" | "min_gpu_budget" | "min_footprint"
    message: str = ""


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
) -> BudgetResult:
    """Fit ``replicas`` between ``min_gpus`` and ``max_gpus`` (either may be -1: no bound).

    Over the ceiling every role shrinks by the same factor; roles earlier in ``order`` get
    their proportional share first and the last role takes what remains (Dynamo's split:
    prefill first, decode the rest). The result never exceeds the ceiling; when even the
    floors do not fit, the replicas are returned unchanged with ``limited_by="min_footprint"``
    so the caller holds instead of scaling the deployment to zero.

    Under the floor the roles grow by the same factor (rounded up) as long as that does not
    cross the ceiling.
    """
    total = gpus_of(replicas, gpus_per_replica)
    floor_footprint = gpus_of(floors, gpus_per_replica)
    if max_gpus != -1 and total > max_gpus:
        if floor_footprint > max_gpus:
            return BudgetResult(
                dict(replicas),
                "min_footprint",
                f"the minimum endpoints need {floor_footprint} GPUs, above max_gpu_budget "
                f"{max_gpus}",
            )
        scale = max_gpus / total
        out: dict[str, int] = {}
        remaining = max_gpus
        for i, role in enumerate(order):
            gpu = gpus_per_replica[role]
            reserved = sum(floors[r] * gpus_per_replica[r] for r in order[i + 1 :])
            most = (remaining - reserved) // gpu
            # the last role takes what the others left, but never more than it asked for
            share = replicas[role] if i == len(order) - 1 else math.floor(replicas[role] * scale)
            n = min(most, share)
            out[role] = max(floors[role], n)
            remaining -= out[role] * gpu
        return BudgetResult(
            out, "max_gpu_budget", f"{total} GPUs wanted, max_gpu_budget is {max_gpus}"
        )
    if min_gpus != -1 and total < min_gpus:
        scale = min_gpus / max(total, 1)
        out = {}
        remaining = min_gpus
        for i, role in enumerate(order):
            gpu = gpus_per_replica[role]
            if i == len(order) - 1:
                n = math.ceil(max(remaining, 0) / gpu)
            else:
                base = replicas[role] if total > 0 else min_gpus / len(order) / gpu
                n = math.ceil(base * scale) if total > 0 else math.floor(base)
            out[role] = max(floors[role], n)
            remaining -= out[role] * gpu
        if max_gpus != -1 and gpus_of(out, gpus_per_replica) > max_gpus:
            return BudgetResult(
                dict(replicas), None, "raising to min_gpu_budget would cross max_gpu_budget"
            )
        return BudgetResult(
            out, "min_gpu_budget", f"{total} GPUs wanted, min_gpu_budget is {min_gpus}"
        )
    return BudgetResult(dict(replicas))
