"""The fleet arbiter: one GPU pool shared by several deployments, each with its own planner.

Pure: :func:`arbitrate` takes each member's proposal (what its planner wants, in GPUs, how
urgently, what it holds now counting starting and terminating replicas), the pool's limits,
the arbiter's memory and the time, and returns a grant per member, each with its reason, and
the new memory. No I/O, no clock; the memory is plain data the shells keep (the replay in
memory, the operator on the pool object, so that it survives a restart).

The rules, in the order they are applied:

1. **Floors first.** A member's floor is its own: the part of its need within its floor
   (``min(need, floor)``, the highest of the stabilisation window, so that a need wavering
   around it does not lend and reclaim every tick) is served before any other need. When
   the member needs less, the idle part of its floor is lent to members of equal or higher
   priority (never to a lower one: a high priority's floor is its burst headroom, which
   must not wait for a lower priority to drain); when it needs it back, it is reclaimed at
   once (a borrower's grant drops below what it holds, and the
   borrower scales down, drained as any scale-down).
2. **Then the needs above floors, in priority then urgency order** (observed SLO breach >
   forecast shortfall > comfort): a higher priority is served in full before a lower one
   gets anything above its floor, a breach before a shortfall of the same priority.
3. **Equal priority and urgency share in proportion to need** when the pool cannot serve
   them all (largest remainders, ties by name: the result does not depend on the order in
   which proposals arrive).
4. **Hysteresis.** A grant above the share just computed is kept until that lower share has
   lasted the stabilisation window (the highest share of the window is kept, as the HPA
   keeps the highest recommendation of its window): a need that has not lasted withdraws
   nothing. Only a floor's owner reclaims at once. A member whose grant was withdrawn (cut
   below what it held, so that it had to scale down) is not raised again above its floor
   claim within the window (the noise that withdrew it would grant it back): no grant is
   withdrawn and re-granted within the window. The window guards what a member holds, not
   what it has let go: where the shell's held GPUs count the replicas still releasing them
   (``PoolLimits.trim_idle``: the replay's do, the operator's do not, a DGD's status leaving
   terminating pods out), the part of a grant the member neither holds (starting, ready or
   draining) nor needs is **trimmed at once** (its own planner scaled down, after its own
   stabilisation; taking it scales nothing down, and it is the room another member may be
   waiting for). Trimming is not a withdrawal: raising it again is no flip.
5. **The budget holds at every moment.** A member occupies the larger of its grant and the
   GPUs it holds (starting, ready and terminating replicas): a grant grows only into what no
   member occupies, so the GPUs a reclaimed borrower is still draining are not granted again
   until they are gone, and ``sum(max(grant, held)) <= max_total_gpus`` after every call
   that began within it.
6. ``min_total_gpus``: the pool does not shrink below it. A member's ``keep_gpus`` is the
   fewest GPUs it may go down to (its shells refuse a scale-down below it); the shrink the
   pool can afford goes to the lowest priorities first.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import IntEnum, StrEnum
from typing import Any

from disagg_planner.core.budget import apply_gpu_budget, gpus_of


class Urgency(IntEnum):
    """How urgently a member needs its GPUs (higher first within one priority)."""

    COMFORT = 0  # no shortfall: the need is what the planner would like to hold
    FORECAST_SHORTFALL = 1  # the forecast needs more than the member holds
    SLO_BREACH = 2  # the SLO is observed at risk now

    @classmethod
    def parse(cls, text: str) -> Urgency:
        try:
            return cls[text.upper().replace("-", "_")]
        except KeyError:
            names = ", ".join(u.name.lower() for u in cls)
            raise ValueError(f"urgency {text!r}: expected one of {names}") from None


def member_urgency(
    need_gpus: int,
    held_gpus: int,
    *,
    now_s: float,
    fast_scale_up_s: float | None,
    window_s: float,
) -> tuple[Urgency, str]:
    """A member's urgency and why (the one definition every shell proposes with): an
    observed SLO breach while its planner's fast check ordered a scale-up less than
    ``window_s`` (its throughput interval) before ``now_s`` (the fast check scales up only on
    what its recent window shows: the SLO at risk, a confirmed breach, or a rising rate whose
    tail already nears its SLO; ``fast_scale_up_s`` on the planner's clock, as ``now_s``);
    else a forecast shortfall when its planner needs more GPUs than it holds; else comfort."""
    if fast_scale_up_s is not None and now_s - fast_scale_up_s < window_s:
        return Urgency.SLO_BREACH, (
            f"observed SLO breach: its fast check scaled up at {fast_scale_up_s:.0f} s, "
            f"{now_s - fast_scale_up_s:.0f} s ago (within its {window_s:g} s interval)"
        )
    if need_gpus > held_gpus:
        return Urgency.FORECAST_SHORTFALL, (
            f"forecast shortfall: its planner needs {need_gpus} GPUs, it holds {held_gpus}"
        )
    return Urgency.COMFORT, (f"comfort: its planner needs {need_gpus} GPUs, it holds {held_gpus}")


class FleetError(ValueError):
    """A pool or member that cannot be arbitrated (names the field and the value)."""


@dataclass(frozen=True)
class PoolLimits:
    """The pool: at most ``max_total_gpus`` held by all members together at any moment;
    ``min_total_gpus`` (0: none) the pool does not shrink below; ``stabilization_s`` the
    window a lower share must last before a grant is withdrawn. ``trim_idle``: the shell's
    ``held_gpus`` count the replicas still releasing their GPUs (draining, terminating), so
    the idle part of a grant can be trimmed at once (rule 4) without granting GPUs that a
    leaving replica still holds; a shell whose count leaves them out keeps the idle part for
    the window instead, which covers their termination."""

    max_total_gpus: int
    min_total_gpus: int = 0
    stabilization_s: float = 300.0
    trim_idle: bool = False

    def __post_init__(self) -> None:
        if self.max_total_gpus < 1:
            raise FleetError(f"max_total_gpus = {self.max_total_gpus}: expected at least 1")
        if not 0 <= self.min_total_gpus <= self.max_total_gpus:
            raise FleetError(
                f"min_total_gpus = {self.min_total_gpus}: expected between 0 and "
                f"max_total_gpus ({self.max_total_gpus})"
            )
        if not (math.isfinite(self.stabilization_s) and self.stabilization_s >= 0):
            raise FleetError(f"stabilization_s = {self.stabilization_s}: expected >= 0")


@dataclass(frozen=True)
class MemberProposal:
    """What one member's planner asks of the pool at one tick (all in GPUs).

    ``held_gpus``: what it holds now, starting and terminating replicas included;
    ``need_gpus``: what its planner wants; ``priority``: higher is served first;
    ``ceiling_gpus``: never granted more (None: the pool's ceiling); ``urgency_reason``:
    why its urgency (:func:`member_urgency`'s sentence, for the shells to show)."""

    name: str
    priority: int
    floor_gpus: int
    need_gpus: int
    held_gpus: int
    urgency: Urgency = Urgency.COMFORT
    ceiling_gpus: int | None = None
    urgency_reason: str = ""

    @property
    def claim(self) -> int:
        """The need within the member's own ceiling."""
        return (
            self.need_gpus if self.ceiling_gpus is None else min(self.need_gpus, self.ceiling_gpus)
        )


class GrantReason(StrEnum):
    NEED_MET = "need_met"
    WITHIN_FLOOR = "within_floor"
    FLOOR_RECLAIMED = "floor_reclaimed"
    CAPPED_AT_CEILING = "capped_at_ceiling"
    SHARED_IN_PROPORTION = "shared_in_proportion"
    HIGHER_PRIORITY_FIRST = "higher_priority_first"
    POOL_FULL = "pool_full"
    KEPT_FOR_WINDOW = "kept_for_window"
    WITHDRAWN = "withdrawn"
    IDLE_TRIMMED = "idle_trimmed"
    RECLAIMED = "reclaimed"
    WAITING_FOR_ROOM = "waiting_for_room"
    REGRANT_HELD = "regrant_held"
    POOL_OVER_CEILING = "pool_over_ceiling"


@dataclass(frozen=True)
class MemberMemory:
    """What the arbiter remembers of a member: its grant, its recent floor claims and shares
    (``(t, floor claim, share)`` within the window) and when a grant was last withdrawn."""

    grant: int
    history: tuple[tuple[float, int, int], ...] = ()
    withdrawn_at_s: float | None = None


@dataclass(frozen=True)
class ArbiterMemory:
    members: Mapping[str, MemberMemory] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON (the operator keeps it on the pool object)."""
        return {
            name: {
                "grant": m.grant,
                "history": [list(h) for h in m.history],
                "withdrawn_at_s": m.withdrawn_at_s,
            }
            for name, m in self.members.items()
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> ArbiterMemory:
        """The memory :meth:`to_dict` wrote; a malformed entry is dropped (that member
        starts afresh: its grant is what it holds), never an error that stops the pool."""
        members: dict[str, MemberMemory] = {}
        for name, entry in (data or {}).items():
            try:
                history = tuple((float(t), int(c), int(s)) for t, c, s in entry["history"])
                withdrawn = entry.get("withdrawn_at_s")
                members[str(name)] = MemberMemory(
                    int(entry["grant"]), history, None if withdrawn is None else float(withdrawn)
                )
            except (KeyError, TypeError, ValueError):
                continue
        return cls(members)


@dataclass(frozen=True)
class Grant:
    """One member's grant: at most ``gpus`` GPUs (and at least ``keep_gpus``: it may not
    shrink below that, for the pool's minimum). ``reason``/``message`` say why."""

    name: str
    gpus: int
    reason: GrantReason
    message: str
    need_gpus: int
    held_gpus: int
    floor_gpus: int
    priority: int
    keep_gpus: int = 0

    @property
    def refused_gpus(self) -> int:
        """What the member asked for and did not get."""
        return max(0, self.need_gpus - self.gpus)

    @property
    def borrowed_gpus(self) -> int:
        """GPUs granted above the member's floor: lent by idle floors or the unassigned
        part of the pool."""
        return max(0, self.gpus - self.floor_gpus)

    @property
    def reclaiming(self) -> bool:
        """The member holds more than its grant: it must scale down."""
        return self.held_gpus > self.gpus


@dataclass(frozen=True)
class Arbitration:
    grants: dict[str, Grant]
    memory: ArbiterMemory

    @property
    def total_granted(self) -> int:
        return sum(g.gpus for g in self.grants.values())

    @property
    def occupied(self) -> int:
        """What the pool holds or has granted: the budget's count."""
        return sum(max(g.gpus, g.held_gpus) for g in self.grants.values())


_SHORT = {
    GrantReason.SHARED_IN_PROPORTION: "equal priorities and urgencies share the pool in "
    "proportion to need",
    GrantReason.HIGHER_PRIORITY_FIRST: "the rest serves higher priorities or urgencies first",
    GrantReason.POOL_FULL: "the rest of the pool is the other members' floors",
}


def validate(proposals: Sequence[MemberProposal], pool: PoolLimits) -> None:
    """Raise :class:`FleetError` naming the member and field that cannot be arbitrated."""
    seen: set[str] = set()
    for p in proposals:
        if p.name in seen:
            raise FleetError(f"member {p.name!r} appears twice")
        seen.add(p.name)
        for field_name in ("floor_gpus", "need_gpus", "held_gpus"):
            value = getattr(p, field_name)
            if value < 0:
                raise FleetError(f"member {p.name!r}: {field_name} = {value}: expected >= 0")
        if p.ceiling_gpus is not None and p.ceiling_gpus < p.floor_gpus:
            raise FleetError(
                f"member {p.name!r}: ceiling_gpus = {p.ceiling_gpus} is below its "
                f"floor_gpus ({p.floor_gpus})"
            )
    floors = sum(p.floor_gpus for p in proposals)
    if floors > pool.max_total_gpus:
        raise FleetError(
            f"the members' floors add up to {floors} GPUs, above max_total_gpus "
            f"({pool.max_total_gpus})"
        )


def _window_max(history: Iterable[tuple[float, int, int]], index: int) -> int:
    return max((int(h[index]) for h in history), default=0)


def _split(amount: int, asks: Mapping[str, int]) -> dict[str, int]:
    """``amount`` shared in proportion to ``asks`` (each at most its ask), whole GPUs by
    largest remainder, ties broken by name."""
    total = sum(asks.values())
    if total <= amount:
        return dict(asks)
    exact = {n: amount * a / total for n, a in asks.items()}
    out = {n: math.floor(x) for n, x in exact.items()}
    left = amount - sum(out.values())
    for n in sorted(asks, key=lambda n: (-(exact[n] - out[n]), n))[:left]:
        out[n] += 1
    return out


def shares(
    proposals: Sequence[MemberProposal], pool: PoolLimits, floor_claims: Mapping[str, int]
) -> tuple[dict[str, int], dict[str, GrantReason]]:
    """Each member's share of the pool now (rules 1-3), and why it is not its whole claim:
    its floor claim first, then the claims above it by priority and urgency."""
    share = dict(floor_claims)
    unassigned = pool.max_total_gpus - sum(p.floor_gpus for p in proposals)
    # a floor's idle part is lent to equal and higher priorities only: a higher priority's
    # floor stays its headroom (its burst never waits for a lower priority to drain)
    idle = {p.name: max(0, p.floor_gpus - floor_claims[p.name]) for p in proposals}
    why: dict[str, GrantReason] = {}
    groups: dict[tuple[int, int], list[MemberProposal]] = {}
    for p in proposals:
        groups.setdefault((p.priority, int(p.urgency)), []).append(p)
    taken_by_higher = 0
    for key in sorted(groups, reverse=True):
        lenders = sorted(
            (q for q in proposals if q.priority <= key[0] and idle[q.name] > 0),
            key=lambda q: (-q.priority, q.name),
        )
        free = max(0, unassigned) + sum(idle[q.name] for q in lenders)
        asks = {p.name: max(0, p.claim - share[p.name]) for p in groups[key]}
        given = _split(free, asks)
        for p in groups[key]:
            share[p.name] += given[p.name]
            if given[p.name] < asks[p.name]:
                if sum(1 for a in asks.values() if a > 0) > 1 and free > 0:
                    why[p.name] = GrantReason.SHARED_IN_PROPORTION
                elif taken_by_higher > 0:
                    why[p.name] = GrantReason.HIGHER_PRIORITY_FIRST
                else:
                    why[p.name] = GrantReason.POOL_FULL
        used = sum(given.values())
        taken_by_higher += used
        # the idle floors only this group may use go first, the unassigned part last
        for q in lenders:
            take = min(idle[q.name], used)
            idle[q.name] -= take
            used -= take
        unassigned -= used
    return share, why


def arbitrate(
    proposals: Sequence[MemberProposal],
    pool: PoolLimits,
    memory: ArbiterMemory,
    now_s: float,
) -> Arbitration:
    """One tick of the arbiter (see the module for its rules)."""
    validate(proposals, pool)
    window = pool.stabilization_s
    props = sorted(proposals, key=lambda p: p.name)
    # a member first seen (or whose memory was lost) is taken to have held what it holds
    # for a window, as the planner's own start rule: a restart withdraws nothing at once
    previous = {
        p.name: memory.members.get(p.name)
        or MemberMemory(p.held_gpus, ((now_s, min(p.held_gpus, p.floor_gpus), p.held_gpus),))
        for p in props
    }

    def recent(name: str) -> tuple[tuple[float, int, int], ...]:
        return tuple(h for h in previous[name].history if h[0] > now_s - window)

    # rule 1: a floor claim is the highest of the window's (lending waits for the window)
    floor_claims = {
        p.name: max(min(p.claim, p.floor_gpus), _window_max(recent(p.name), 1)) for p in props
    }
    floor_claims = {p.name: min(floor_claims[p.name], p.floor_gpus) for p in props}
    share, short = shares(props, pool, floor_claims)
    history = {
        p.name: (*recent(p.name), (now_s, floor_claims[p.name], share[p.name])) for p in props
    }

    grant: dict[str, int] = {}
    reason: dict[str, GrantReason] = {}
    message: dict[str, str] = {}
    withdrawn_at = {p.name: previous[p.name].withdrawn_at_s for p in props}
    over = sum(max(previous[p.name].grant, p.held_gpus) for p in props) > pool.max_total_gpus

    # rule 4, down: keep the window's highest share; a pool over its ceiling (it shrank, or
    # the members started over it) is brought back at once
    for p in props:
        before = previous[p.name].grant
        kept = share[p.name] if over else _window_max(history[p.name], 2)
        if before <= share[p.name]:
            grant[p.name] = before  # raised below, where there is room
        elif over:
            grant[p.name] = share[p.name]
            reason[p.name] = GrantReason.POOL_OVER_CEILING
            message[p.name] = (
                f"the pool holds more than max_total_gpus ({pool.max_total_gpus}); "
                f"cut to its share {share[p.name]} at once"
            )
        elif pool.trim_idle and (idle := max(p.held_gpus, p.claim, share[p.name])) < min(
            kept, before
        ):
            # rule 4, idle: the part of a grant the member neither holds nor needs (its own
            # planner scaled down, after its own stabilisation) is trimmed at once; taking
            # it scales nothing down, and it is the room another member is waiting for
            grant[p.name] = idle
            reason[p.name] = GrantReason.IDLE_TRIMMED
            message[p.name] = (
                f"holds {p.held_gpus} GPUs and needs {p.need_gpus}: the idle part of grant "
                f"{before} trimmed at once -> {idle}"
            )
        elif kept < before:
            grant[p.name] = kept
            reason[p.name] = GrantReason.WITHDRAWN
            message[p.name] = (
                f"share {share[p.name]} GPUs has lasted {window:g} s: grant {before} -> {kept}"
            )
        else:
            grant[p.name] = before
            reason[p.name] = GrantReason.KEPT_FOR_WINDOW
            message[p.name] = (
                f"share {share[p.name]} GPUs below grant {before} for less than {window:g} s: kept"
            )

    # rule 1, reclaim: an owner whose floor claim is not covered takes it back at once from
    # the members above their share, the lowest priority and urgency first
    def occupied() -> int:
        return sum(max(grant[p.name], p.held_gpus) for p in props)

    short_floor = {
        p.name: floor_claims[p.name] - grant[p.name]
        for p in props
        if grant[p.name] < floor_claims[p.name]
    }
    missing = sum(short_floor.values()) - (pool.max_total_gpus - occupied())
    if missing > 0:
        owners = ", ".join(sorted(short_floor))
        for p in sorted(props, key=lambda p: (p.priority, int(p.urgency), p.name)):
            if missing <= 0:
                break
            excess = grant[p.name] - share[p.name]
            if excess <= 0 or p.name in short_floor:
                continue
            taken = min(excess, missing)
            grant[p.name] -= taken
            missing -= taken
            reason[p.name] = GrantReason.RECLAIMED
            message[p.name] = (
                f"{taken} GPUs lent from the floor of {owners} reclaimed: grant "
                f"{grant[p.name] + taken} -> {grant[p.name]}"
            )

    # a withdrawal is a grant cut below what the member holds and still needs: it must scale
    # down against its planner's will (trimming a grant it does not use takes nothing)
    for p in props:
        if grant[p.name] < min(previous[p.name].grant, p.held_gpus, p.need_gpus):
            withdrawn_at[p.name] = now_s

    # rule 4/5, up: raise towards the share into what no member occupies, floors first, then
    # by priority and urgency
    order = sorted(props, key=lambda p: (-p.priority, -int(p.urgency), p.name))
    for stage in ("floor", "share"):
        for p in order:
            target = floor_claims[p.name] if stage == "floor" else share[p.name]
            if grant[p.name] >= target:
                continue
            if stage == "share":
                since = withdrawn_at[p.name]
                if since is not None and now_s - since < window and since != now_s:
                    # the floor stage above raised it to its floor claim where there was room
                    reason[p.name] = GrantReason.REGRANT_HELD
                    message[p.name] = (
                        f"a grant was withdrawn at {since:g} s: not raised above its floor "
                        f"claim within {window:g} s"
                    )
                    continue
                if since == now_s:
                    continue
            room = pool.max_total_gpus - occupied()
            # the member's own held GPUs above its grant are already counted
            room += max(0, p.held_gpus - grant[p.name])
            raised = max(grant[p.name], min(target, grant[p.name] + max(room, 0)))
            if raised < target:
                reason[p.name] = GrantReason.WAITING_FOR_ROOM
                message[p.name] = (
                    f"share {target} GPUs, {raised} free now: the rest is still held by "
                    "other members (kept for their window, or draining)"
                )
            grant[p.name] = raised

    # reasons for the grants nothing above explained
    for p in props:
        if p.name in reason:
            continue
        g = grant[p.name]
        if g >= p.need_gpus:
            reason[p.name] = (
                GrantReason.FLOOR_RECLAIMED
                if previous[p.name].grant < floor_claims[p.name] <= g
                and p.need_gpus <= p.floor_gpus
                else GrantReason.WITHIN_FLOOR
                if p.need_gpus <= p.floor_gpus
                else GrantReason.NEED_MET
            )
            message[p.name] = f"need {p.need_gpus} GPUs granted ({g})"
        elif p.ceiling_gpus is not None and g >= p.ceiling_gpus:
            reason[p.name] = GrantReason.CAPPED_AT_CEILING
            message[p.name] = f"need {p.need_gpus} GPUs, capped at its ceiling {p.ceiling_gpus}"
        else:
            reason[p.name] = short.get(p.name, GrantReason.HIGHER_PRIORITY_FIRST)
            message[p.name] = f"need {p.need_gpus} GPUs, granted {g}: " + _SHORT[reason[p.name]]

    keep = _keep(props, pool)
    grants = {
        p.name: Grant(
            name=p.name,
            gpus=grant[p.name],
            reason=reason[p.name],
            message=message[p.name],
            need_gpus=p.need_gpus,
            held_gpus=p.held_gpus,
            floor_gpus=p.floor_gpus,
            priority=p.priority,
            keep_gpus=min(keep[p.name], grant[p.name]),
        )
        for p in props
    }
    new_memory = ArbiterMemory(
        {
            p.name: replace(
                previous[p.name],
                grant=grant[p.name],
                history=history[p.name],
                withdrawn_at_s=withdrawn_at[p.name],
            )
            for p in props
        }
    )
    return Arbitration(grants, new_memory)


def _keep(props: Sequence[MemberProposal], pool: PoolLimits) -> dict[str, int]:
    """Rule 6: the fewest GPUs each member may go down to so that the pool keeps
    ``min_total_gpus``; the shrink it can afford goes to the lowest priorities first."""
    keep = {p.name: 0 for p in props}
    if pool.min_total_gpus <= 0:
        return keep
    affordable = max(0, sum(p.held_gpus for p in props) - pool.min_total_gpus)
    for p in sorted(props, key=lambda p: (p.priority, int(p.urgency), p.name)):
        shrink = max(0, p.held_gpus - p.need_gpus)
        allowed = min(shrink, affordable)
        affordable -= allowed
        keep[p.name] = p.held_gpus - allowed
    return keep


def fit_to_grant(
    target: Mapping[str, int],
    current: Mapping[str, int],
    *,
    gpus_per_replica: Mapping[str, int],
    floors: Mapping[str, int],
    grant: Grant,
    draining_gpus: int = 0,
) -> dict[str, int]:
    """A member's ``target`` replicas cut so that they and its replicas still draining fit
    its grant, by the planner's own budget rule (a role is never moved against its
    direction unless the member holds more than its grant; when even the floors do not
    fit, nothing grows), and never shrunk below the grant's ``keep_gpus`` (the pool's
    minimum: the roles then keep what they have)."""
    roles = tuple(target)
    result = apply_gpu_budget(
        target,
        gpus_per_replica=gpus_per_replica,
        floors=floors,
        max_gpus=max(grant.gpus - draining_gpus, 0),
        min_gpus=-1,
        order=roles,
        current=current,
    )
    out = {r: min(target[r], current[r]) for r in roles} if result.hold else result.replicas
    if gpus_of(out, gpus_per_replica) < grant.keep_gpus:
        out = {r: max(out[r], current[r]) for r in roles}
    return out
