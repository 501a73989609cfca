"""The list of API calls the RBAC is checked against (api_calls.py) is the one the code
documents: the call tables in the docstrings of ``disagg_planner.connectors.kubernetes`` and
``disagg_planner.operator.app``, parsed here."""

from __future__ import annotations

import re

import disagg_planner.connectors.kubernetes
import disagg_planner.observe.fpm_discovery
import disagg_planner.operator.app
from tests.unit.deploy.api_calls import (
    CONNECTOR_CALLS,
    DISCOVERY_CALLS,
    POLICY_CALLS,
    SCANNING_CALLS,
    Call,
    expected_calls,
    peering_calls,
)


def table_rows(doc: str) -> list[list[str]]:
    """The body rows of the first reStructuredText simple table in ``doc``; continuation
    lines (empty first column) are joined to their row."""
    lines = doc.splitlines()
    borders = [i for i, line in enumerate(lines) if re.fullmatch(r"\s*=+( +=+)+\s*", line)]
    assert len(borders) >= 3, "expected a simple table (top, header and bottom borders)"
    spans = [m.span() for m in re.finditer(r"=+", lines[borders[0]])]
    rows: list[list[str]] = []
    for line in lines[borders[1] + 1 : borders[2]]:
        cells = [
            line[a : (b if i < len(spans) - 1 else None)].strip() for i, (a, b) in enumerate(spans)
        ]
        if cells[0]:
            rows.append(cells)
        elif rows:
            rows[-1] = [f"{old} {new}".strip() for old, new in zip(rows[-1], cells, strict=True)]
    return rows


def calls_of(rows: list[list[str]]) -> dict[Call, str]:
    """(verb, group, resource) -> the row's remaining text (its note)."""
    out: dict[Call, str] = {}
    for verbs, group, resource, *rest in rows:
        group_name = "" if group.startswith('""') else group.split()[0]
        name, _, note = resource.partition(" ")
        for verb in (v.strip() for v in verbs.split(",")):
            out[(verb, group_name, name)] = " ".join([note, *rest]).strip()
    return out


def test_the_connector_documents_exactly_its_calls():
    documented = calls_of(table_rows(disagg_planner.connectors.kubernetes.__doc__ or ""))
    assert set(documented) == CONNECTOR_CALLS


def test_fpm_discovery_documents_exactly_its_calls():
    documented = calls_of(table_rows(disagg_planner.observe.fpm_discovery.__doc__ or ""))
    assert set(documented) == DISCOVERY_CALLS


def test_the_operator_documents_the_policy_peering_and_scanning_calls():
    documented = calls_of(table_rows(disagg_planner.operator.app.__doc__ or ""))
    namespaced_peering = peering_calls(cluster_wide=False)
    namespaces = {c for c in SCANNING_CALLS if c[2] == "namespaces"}
    assert set(documented) == POLICY_CALLS | namespaced_peering | namespaces
    # the cluster-wide peering resource and the namespace list's condition are in the notes
    for call in namespaced_peering:
        assert "clusterkopfpeerings with -A" in documented[call]
        assert "none with --standalone" in documented[call]
    for call in namespaces:
        assert "globs" in documented[call]


def test_the_only_call_beyond_the_documented_ones_is_kopfs_crd_watch_with_globs():
    """kopf's resource observer lists and watches CRDs whenever scanning is on, which the
    operator turns on for namespace globs only (build_settings); the docstring does not
    list it, the chart grants it in that mode."""
    documented = (
        set(calls_of(table_rows(disagg_planner.connectors.kubernetes.__doc__ or "")))
        | set(calls_of(table_rows(disagg_planner.observe.fpm_discovery.__doc__ or "")))
        | set(calls_of(table_rows(disagg_planner.operator.app.__doc__ or "")))
    )
    everything = expected_calls(cluster_wide=False, peering=True, globs=True) | peering_calls(
        cluster_wide=True
    )
    assert everything - documented == {
        ("list", "apiextensions.k8s.io", "customresourcedefinitions"),
        ("watch", "apiextensions.k8s.io", "customresourcedefinitions"),
        ("list", "kopf.dev", "clusterkopfpeerings"),  # documented as the -A alternative
        ("watch", "kopf.dev", "clusterkopfpeerings"),
        ("patch", "kopf.dev", "clusterkopfpeerings"),
    }
    assert documented <= everything


def test_expected_calls_by_mode():
    base = CONNECTOR_CALLS | DISCOVERY_CALLS | POLICY_CALLS
    assert expected_calls(cluster_wide=False, peering=False, globs=False) == base
    assert expected_calls(cluster_wide=True, peering=True, globs=True) == base | peering_calls(
        cluster_wide=True
    )  # cluster-wide needs no namespace scan
    assert ("watch", "", "namespaces") in expected_calls(
        cluster_wide=False, peering=False, globs=True
    )
