"""The wall clock's mapping and waits; ``planner run`` / ``planner operator`` flags."""

from __future__ import annotations

import argparse
import asyncio
import time

import pytest

from disagg_planner.cli import operator_cmd, run_cmd
from disagg_planner.config.schema import PlannerConfig
from disagg_planner.runtime.clock import WallClock


async def test_wall_clock_reads_unix_seconds_and_never_goes_back() -> None:
    clock = WallClock()
    readings = [clock.now() for _ in range(1000)]
    assert readings == sorted(readings)
    assert abs(readings[0] - time.time()) < 1.0


async def test_sleep_until_wakes_at_the_time_or_at_once_when_stopped() -> None:
    clock = WallClock()
    stop = asyncio.Event()
    target = clock.now() + 0.05
    assert await clock.sleep_until(target, stop) is False
    assert clock.now() >= target
    waiter = asyncio.create_task(clock.sleep_until(clock.now() + 60, stop))
    await asyncio.sleep(0.01)
    stop.set()
    assert await asyncio.wait_for(waiter, timeout=2) is True


def help_of(module) -> str:
    parser = argparse.ArgumentParser(prog="planner")
    subparsers = parser.add_subparsers()
    module.register(subparsers)
    return next(iter(subparsers.choices.values())).format_help()


@pytest.mark.parametrize("module", [run_cmd, operator_cmd])
def test_help_documents_every_setting(module) -> None:
    text = help_of(module)
    for name in PlannerConfig.model_fields:
        assert f"--{name.replace('_', '-')}" in text, name


def test_operator_help_documents_its_own_flags() -> None:
    text = help_of(operator_cmd)
    for flag in (
        "--watch-namespace",
        "--all-namespaces",
        "--standalone",
        "--peering",
        "--priority",
        "--status-interval",
    ):
        assert flag in text


def test_operator_scope_flags() -> None:
    parser = argparse.ArgumentParser(prog="planner")
    operator_cmd.register(parser.add_subparsers())
    # No scope parses (the operator then serves its own namespace); two scopes do not.
    assert parser.parse_args(["operator"]).operator_namespaces is None
    with pytest.raises(SystemExit):
        parser.parse_args(["operator", "--watch-namespace", "a", "--all-namespaces"])
    args = parser.parse_args(["operator", "--watch-namespace", "a", "--watch-namespace", "b"])
    assert args.operator_namespaces == ["a", "b"] and args.operator_peering == "planner"
