"""The fleet arbiter (``core.fleet.arbitrate``): one named row per rule (grant and reason in
one assert), property tests over random needs and orderings that the pool's budget holds at
every tick, and a noise replay (queue noise every 15 s, as in llm-d #1427) that withdraws no
grant only to grant it back within the stabilisation window."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disagg_planner.core.fleet import (
    ArbiterMemory,
    Arbitration,
    FleetError,
    GrantReason,
    MemberProposal,
    PoolLimits,
    Urgency,
    arbitrate,
    member_urgency,
)

R = GrantReason
WINDOW = 300.0


def member(
    name: str,
    need: int,
    *,
    held: int | None = None,
    floor: int = 0,
    priority: int = 0,
    urgency: Urgency = Urgency.COMFORT,
    ceiling: int | None = None,
) -> MemberProposal:
    return MemberProposal(
        name=name,
        priority=priority,
        floor_gpus=floor,
        need_gpus=need,
        held_gpus=need if held is None else held,
        urgency=urgency,
        ceiling_gpus=ceiling,
    )


@dataclass(frozen=True)
class Row:
    """``ticks``: (time, proposals) in order, through one memory; the last tick's grant of
    ``who`` is expected to be ``(gpus, reason)``."""

    name: str
    ticks: tuple[tuple[float, tuple[MemberProposal, ...]], ...]
    who: str
    expect: tuple[int, GrantReason]
    max_total: int = 10
    min_total: int = 0
    trim_idle: bool = False


def run(row: Row) -> Arbitration:
    pool = PoolLimits(row.max_total, row.min_total, WINDOW, trim_idle=row.trim_idle)
    memory = ArbiterMemory()
    result = None
    for t, proposals in row.ticks:
        result = arbitrate(proposals, pool, memory, t)
        memory = result.memory
    assert result is not None
    return result


ROWS = [
    Row(
        "every need fits: each member gets its need",
        ((0, (member("a", 4, floor=2), member("b", 3, floor=2))),),
        "a",
        (4, R.NEED_MET),
    ),
    Row(
        "floors first: a low priority's need within its floor is served before a high "
        "priority's need above its own",
        ((0, (member("low", 4, floor=4), member("high", 20, floor=2, priority=10, held=2))),),
        "low",
        (4, R.WITHIN_FLOOR),
    ),
    Row(
        "floors first: the high priority gets what the others' floors leave",
        ((0, (member("low", 4, floor=4), member("high", 20, floor=2, priority=10, held=2))),),
        "high",
        (6, R.POOL_FULL),
    ),
    Row(
        "priority: the higher priority's need is served in full before a lower one's",
        ((0, (member("hi", 8, floor=1, priority=10, held=1), member("lo", 8, floor=1, held=1))),),
        "lo",
        (2, R.HIGHER_PRIORITY_FIRST),
    ),
    Row(
        "urgency: at one priority an observed SLO breach is served before a forecast shortfall",
        (
            (
                0,
                (
                    member("breach", 7, held=0, urgency=Urgency.SLO_BREACH),
                    member("forecast", 7, held=0, urgency=Urgency.FORECAST_SHORTFALL),
                ),
            ),
        ),
        "forecast",
        (3, R.HIGHER_PRIORITY_FIRST),
    ),
    Row(
        "equal priorities share in proportion to need",
        ((0, (member("a", 12, held=0), member("b", 3, held=0))),),
        "a",
        (8, R.SHARED_IN_PROPORTION),  # 10 x 12/15 and 10 x 3/15
    ),
    Row(
        "a member's ceiling caps its grant even with the pool free",
        ((0, (member("a", 9, held=2, ceiling=5),)),),
        "a",
        (5, R.CAPPED_AT_CEILING),
    ),
    Row(
        "an idle floor is not lent before the window: the borrower waits",
        (
            (0, (member("owner", 6, floor=6), member("borrower", 4, floor=2))),
            (60, (member("owner", 2, floor=6), member("borrower", 8, held=4, floor=2))),
        ),
        "borrower",
        (4, R.POOL_FULL),
    ),
    Row(
        "an idle floor that lasted the window is lent",
        (
            (0, (member("owner", 6, floor=6), member("borrower", 4, floor=2))),
            (60, (member("owner", 2, floor=6), member("borrower", 8, held=4, floor=2))),
            (400, (member("owner", 2, floor=6), member("borrower", 8, held=4, floor=2))),
        ),
        "borrower",
        (8, R.NEED_MET),
    ),
    Row(
        "a higher priority's idle floor is not lent to a lower priority",
        (
            (0, (member("hi", 6, floor=6, priority=10), member("lo", 4, floor=2))),
            (400, (member("hi", 2, floor=6, priority=10), member("lo", 8, held=4, floor=2))),
        ),
        "lo",
        (4, R.POOL_FULL),
    ),
    Row(
        "a lower priority's idle floor is lent to a higher priority",
        (
            (0, (member("hi", 4, floor=2, priority=10), member("lo", 6, floor=6))),
            (400, (member("hi", 8, held=4, floor=2, priority=10), member("lo", 2, floor=6))),
        ),
        "hi",
        (8, R.NEED_MET),
    ),
    Row(
        "the owner reclaims its lent floor at once: the borrower's grant drops below what it "
        "holds (a scale-down, drained)",
        (
            (0, (member("owner", 2, floor=6), member("borrower", 8, floor=2))),
            (15, (member("owner", 6, held=2, floor=6), member("borrower", 8, floor=2))),
        ),
        "borrower",
        (4, R.RECLAIMED),
    ),
    Row(
        "the owner's grant waits while the borrower drains what was reclaimed",
        (
            (0, (member("owner", 2, floor=6), member("borrower", 8, floor=2))),
            (15, (member("owner", 6, held=2, floor=6), member("borrower", 8, floor=2))),
        ),
        "owner",
        (2, R.WAITING_FOR_ROOM),
    ),
    Row(
        "once the borrower has drained the owner has its floor back",
        (
            (0, (member("owner", 2, floor=6), member("borrower", 8, floor=2))),
            (15, (member("owner", 6, held=2, floor=6), member("borrower", 8, floor=2))),
            (30, (member("owner", 6, held=2, floor=6), member("borrower", 8, held=4, floor=2))),
        ),
        "owner",
        (6, R.FLOOR_RECLAIMED),
    ),
    Row(
        "a higher priority's need above floors does not withdraw a grant before the window",
        (
            (0, (member("hi", 2, floor=2, priority=10), member("lo", 8, floor=2))),
            (60, (member("hi", 6, held=2, floor=2, priority=10), member("lo", 8, floor=2))),
        ),
        "lo",
        (8, R.KEPT_FOR_WINDOW),
    ),
    Row(
        "a higher priority's need that lasted the window withdraws the lower's grant",
        (
            (0, (member("hi", 2, floor=2, priority=10), member("lo", 8, floor=2))),
            (60, (member("hi", 6, held=2, floor=2, priority=10), member("lo", 8, floor=2))),
            (365, (member("hi", 6, held=2, floor=2, priority=10), member("lo", 8, floor=2))),
        ),
        "lo",
        (4, R.WITHDRAWN),
    ),
    Row(
        "a withdrawn grant is not raised above the floor again within the window",
        (
            (0, (member("hi", 2, floor=2, priority=10), member("lo", 8, floor=2))),
            (60, (member("hi", 6, held=2, floor=2, priority=10), member("lo", 8, floor=2))),
            (365, (member("hi", 6, held=2, floor=2, priority=10), member("lo", 8, floor=2))),
            (380, (member("hi", 2, floor=2, priority=10), member("lo", 8, held=4, floor=2))),
        ),
        "lo",
        (4, R.REGRANT_HELD),
    ),
    Row(
        "a pool found over its ceiling is cut back to the shares at once",
        ((0, (member("a", 8, floor=2, priority=10), member("b", 8, floor=2))),),
        "b",
        (2, R.POOL_OVER_CEILING),
    ),
    Row(
        "the idle part of a grant (neither held nor needed) is trimmed at once",
        (
            (0, (member("a", 8),)),
            (15, (member("a", 3, held=3),)),
        ),
        "a",
        (3, R.IDLE_TRIMMED),
        trim_idle=True,
    ),
    Row(
        "where held GPUs leave terminating replicas out (trim_idle off) the idle part is kept "
        "for the window",
        (
            (0, (member("a", 8),)),
            (15, (member("a", 3, held=3),)),
        ),
        "a",
        (8, R.KEPT_FOR_WINDOW),
    ),
    Row(
        "a trimmed idle grant is room another member gets at once",
        (
            (0, (member("a", 8), member("b", 2))),
            (15, (member("a", 4, held=4), member("b", 6, held=2))),
        ),
        "b",
        (6, R.NEED_MET),
        trim_idle=True,
    ),
    Row(
        "a grant above a need that fell is kept for the window (no flip on a dip)",
        (
            (0, (member("a", 8),)),
            (15, (member("a", 3, held=8),)),
        ),
        "a",
        (8, R.KEPT_FOR_WINDOW),
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_arbitration_rule(row: Row) -> None:
    grant = run(row).grants[row.who]
    assert (grant.gpus, grant.reason) == row.expect, grant.message


# member_urgency at t = 1000 s with a 60 s throughput interval: (need, held, when its fast
# check last scaled up) -> the urgency, whose reason begins with its name
BREACH, SHORT, COMFORT = Urgency.SLO_BREACH, Urgency.FORECAST_SHORTFALL, Urgency.COMFORT
URGENCY_ROWS = [
    ("a fast-check scale-up 30 s ago is an observed breach", (8, 8, 970.0), BREACH),
    ("an observed breach outranks a shortfall of the same member", (12, 8, 999.0), BREACH),
    ("a scale-up one full interval ago no longer counts", (12, 8, 940.0), SHORT),
    ("no fast-check scale-up: a need above what it holds", (12, 8, None), SHORT),
    ("a need within what it holds is comfort", (8, 8, None), COMFORT),
    ("a need below what it holds is comfort", (4, 8, 900.0), COMFORT),
]
REASON_START = {BREACH: "observed SLO breach", SHORT: "forecast shortfall", COMFORT: "comfort"}


@pytest.mark.parametrize(("name", "seen", "expect"), URGENCY_ROWS, ids=[r[0] for r in URGENCY_ROWS])
def test_member_urgency(name: str, seen: tuple[int, int, float | None], expect: Urgency) -> None:
    need, held, scaled_at = seen
    urgency, reason = member_urgency(
        need, held, now_s=1000.0, fast_scale_up_s=scaled_at, window_s=60.0
    )
    assert (urgency, reason.split(":")[0]) == (expect, REASON_START[expect]), reason


def test_an_observed_breach_within_the_last_interval_outranks_a_forecast_shortfall() -> None:
    """Two members of one priority, each 8 GPUs short, in a pool with room for one: the one
    whose fast check scaled up within its interval is served first; once that interval has
    passed, both are forecast shortfalls and share in proportion."""

    def proposals(now_s: float) -> list[MemberProposal]:
        out = []
        for name, scaled_at in (("breach", 990.0), ("forecast", None)):
            urgency, _ = member_urgency(
                10, 2, now_s=now_s, fast_scale_up_s=scaled_at, window_s=60.0
            )
            out.append(replace(member(name, 10, held=2, floor=2), urgency=urgency))
        return out

    pool = PoolLimits(12, stabilization_s=WINDOW)
    grants = arbitrate(proposals(1000.0), pool, ArbiterMemory(), 1000.0).grants
    assert (grants["breach"].gpus, grants["breach"].reason) == (10, R.NEED_MET)
    assert (grants["forecast"].gpus, grants["forecast"].reason) == (2, R.HIGHER_PRIORITY_FIRST)
    later = arbitrate(proposals(1050.0), pool, ArbiterMemory(), 1050.0).grants
    assert {n: (g.gpus, g.reason) for n, g in later.items()} == {
        "breach": (6, R.SHARED_IN_PROPORTION),
        "forecast": (6, R.SHARED_IN_PROPORTION),
    }


def test_min_total_keeps_the_lowest_priority_shrinking_first() -> None:
    """``min_total_gpus``: of the 8 GPUs held, the pool may give back 2: the lowest priority
    shrinks first (to 2, not to its need of 1); the other keeps what it holds."""
    row = Row(
        "min total",
        ((0, (member("hi", 2, held=4, priority=10), member("lo", 1, held=4))),),
        "lo",
        (4, R.KEPT_FOR_WINDOW),
        min_total=6,
    )
    result = run(row)
    keeps = {name: g.keep_gpus for name, g in result.grants.items()}
    assert keeps == {"lo": 2, "hi": 4}


@pytest.mark.parametrize(
    ("proposals", "pool", "message"),
    [
        (
            (member("a", 1, floor=6), member("b", 1, floor=6)),
            PoolLimits(10),
            "floors add up to 12 GPUs, above max_total_gpus (10)",
        ),
        ((member("a", 1), member("a", 2)), PoolLimits(10), "member 'a' appears twice"),
        ((member("a", -1),), PoolLimits(10), "member 'a': need_gpus = -1"),
        ((member("a", 1, floor=4, ceiling=2),), PoolLimits(10), "ceiling_gpus = 2 is below"),
    ],
    ids=["floors over the pool", "duplicate", "negative need", "ceiling below floor"],
)
def test_bad_input_names_the_field(
    proposals: tuple[MemberProposal, ...], pool: PoolLimits, message: str
) -> None:
    with pytest.raises(FleetError, match=message.replace("(", r"\(").replace(")", r"\)")):
        arbitrate(proposals, pool, ArbiterMemory(), 0.0)


def test_bad_pool_names_the_field() -> None:
    with pytest.raises(FleetError, match="min_total_gpus = 12"):
        PoolLimits(10, 12)


def test_memory_round_trips_and_a_bad_entry_starts_afresh() -> None:
    row = ROWS[-1]
    memory = run(row).memory
    assert ArbiterMemory.from_dict(memory.to_dict()) == memory
    broken = ArbiterMemory.from_dict({"a": {"grant": "x"}, **memory.to_dict()})
    assert broken == memory
    assert ArbiterMemory.from_dict({"z": {"history": []}}).members == {}


# --- properties ------------------------------------------------------------------------


@st.composite
def fleets(draw: st.DrawFn) -> tuple[int, list[tuple[str, int, int, int | None]]]:
    max_total = draw(st.integers(1, 40))
    n = draw(st.integers(1, 5))
    members = []
    left = max_total
    for i in range(n):
        floor = draw(st.integers(0, left))
        left -= floor
        ceiling = draw(st.one_of(st.none(), st.integers(floor, floor + 20)))
        members.append((f"m{i}", floor, draw(st.integers(0, 3)), ceiling))
    return max_total, members


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(
    fleet=fleets(),
    steps=st.lists(
        st.tuples(
            st.lists(st.integers(0, 30), min_size=5, max_size=5),
            st.lists(st.sampled_from(list(Urgency)), min_size=5, max_size=5),
            st.integers(0, 1000),
            st.sampled_from([5.0, 15.0, 60.0, 400.0]),
        ),
        min_size=1,
        max_size=25,
    ),
)
def test_the_budget_holds_at_every_tick(
    fleet: tuple[int, list[tuple[str, int, int, int | None]]],
    steps: list[tuple[list[int], list[Urgency], int, float]],
) -> None:
    """Members that move towards their grants (growing only within it, shrinking when
    reclaimed, a random part of the way: starting and draining replicas still count) never
    make the pool hold more than its ceiling, whatever the needs and whatever the order in
    which the proposals arrive; and the order changes no grant."""
    max_total, members = fleet
    pool = PoolLimits(max_total, stabilization_s=WINDOW)
    memory = ArbiterMemory()
    held = {name: min(floor, max_total) for name, floor, _, _ in members}
    held_total = sum(held.values())
    assert held_total <= max_total
    now = 0.0
    for needs, urgencies, seed, dt in steps:
        proposals = [
            member(name, needs[i], held=held[name], floor=floor, priority=prio, ceiling=ceiling)
            for i, (name, floor, prio, ceiling) in enumerate(members)
        ]
        proposals = [replace(p, urgency=urgencies[i]) for i, p in enumerate(proposals)]
        shuffled = list(proposals)
        random.Random(seed).shuffle(shuffled)
        result = arbitrate(proposals, pool, memory, now)
        assert arbitrate(shuffled, pool, memory, now) == result
        assert result.occupied <= max_total
        assert result.total_granted <= max_total
        memory = result.memory
        rng = random.Random(seed + 1)
        for p in proposals:
            g = result.grants[p.name]
            assert g.gpus >= min(p.floor_gpus, p.claim) or g.reason in (
                R.WAITING_FOR_ROOM,
                R.POOL_OVER_CEILING,
            ), g
            target = min(p.need_gpus, g.gpus)
            # move part of the way: what has started counts, what drains still counts
            held[p.name] += round((target - held[p.name]) * rng.random())
        assert sum(max(result.grants[n].gpus, h) for n, h in held.items()) <= max_total
        now += dt


# --- noise replay (llm-d #1427) ---------------------------------------------------------


@pytest.mark.parametrize(
    ("trim_idle", "own_window_s"),
    [(False, None), (True, None), (True, 120.0)],
    ids=["idle kept", "idle trimmed", "idle trimmed, members scaling down after 120 s"],
)
def test_queue_noise_withdraws_no_grant_to_grant_it_back_within_the_window(
    trim_idle: bool, own_window_s: float | None
) -> None:
    """Two members of one priority share a full pool; every 15 s each one's need jumps by
    queue noise (+-2 GPUs around its level), and a third, high-priority member's need
    wanders too. Over two hours no member's grant is cut below what it holds and raised
    again within the window, and grants change far less often than the needs. Members
    scale up to their need within their grant; with ``own_window_s`` they also scale down
    to the highest need of that window (their planner's own stabilisation), which the idle
    trim then follows."""
    rng = random.Random(1427)
    pool = PoolLimits(24, stabilization_s=WINDOW, trim_idle=trim_idle)
    memory = ArbiterMemory()
    held = {"a": 8, "b": 8, "hi": 4}
    levels = {"a": 10, "b": 10, "hi": 4}
    withdrawn_at: dict[str, float] = {}
    changes = need_changes = 0
    last_grant: dict[str, int] = {}
    last_need: dict[str, int] = {}
    recent: list[tuple[float, dict[str, int]]] = []
    for tick in range(480):
        now = tick * 15.0
        needs = {n: max(0, level + rng.randint(-2, 2)) for n, level in levels.items()}
        recent = [(t, n) for t, n in recent if own_window_s and t > now - own_window_s]
        recent.append((now, needs))
        proposals = [
            member("a", needs["a"], held=held["a"], floor=4),
            member("b", needs["b"], held=held["b"], floor=4),
            member("hi", needs["hi"], held=held["hi"], floor=4, priority=10),
        ]
        result = arbitrate(proposals, pool, memory, now)
        memory = result.memory
        assert result.occupied <= pool.max_total_gpus
        for name, g in result.grants.items():
            regranted = name in last_grant and g.gpus > max(last_grant[name], g.floor_gpus)
            if name in withdrawn_at and regranted:
                assert now - withdrawn_at[name] >= WINDOW, (now, g)
            if g.gpus < held[name]:
                withdrawn_at[name] = now
            changes += name in last_grant and last_grant[name] != g.gpus
            need_changes += name in last_need and last_need[name] != needs[name]
            last_grant[name], last_need[name] = g.gpus, needs[name]
            held[name] = min(needs[name], g.gpus) if g.gpus < held[name] else held[name]
            held[name] = max(held[name], min(needs[name], g.gpus))
            if own_window_s is not None:
                held[name] = min(held[name], max(n[name] for _, n in recent))
    assert need_changes > 1000
    assert changes < need_changes / 10, (changes, need_changes)
