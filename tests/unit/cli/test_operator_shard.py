"""``planner operator --shard KEY=VALUE``: the label a sharded operator serves."""

from __future__ import annotations

import pytest

from disagg_planner.cli.operator_cmd import parse_shard
from disagg_planner.errors import SpecError


@pytest.mark.parametrize(
    ("text", "labels"),
    [
        (None, {}),
        ("", {}),
        ("planner.autoscaling.dev/shard=a", {"planner.autoscaling.dev/shard": "a"}),
    ],
    ids=["none", "empty", "one label"],
)
def test_a_shard_is_one_label(text: str | None, labels: dict[str, str]) -> None:
    assert parse_shard(text) == labels


@pytest.mark.parametrize("text", ["shard", "=a", "shard="])
def test_a_malformed_shard_names_what_was_expected(text: str) -> None:
    with pytest.raises(SpecError, match=f"--shard '{text}': expected KEY=VALUE"):
        parse_shard(text)
