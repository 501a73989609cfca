"""``planner operator`` with no namespace flag serves its own namespace, or says in one line
what to add (it used to print 80 lines of usage)."""

from __future__ import annotations

from pathlib import Path

import pytest

from disagg_planner.cli.main import main
from disagg_planner.cli.operator_cmd import SERVICE_ACCOUNT_NAMESPACE, own_namespace


@pytest.mark.skipif(SERVICE_ACCOUNT_NAMESPACE.exists(), reason="runs inside a pod")
def test_outside_a_pod_it_says_in_one_line_what_to_add(capsys: pytest.CaptureFixture[str]):
    assert main(["operator"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "--watch-namespace NS" in err[0] and "--all-namespaces" in err[0]


def test_its_own_namespace_is_the_service_accounts(tmp_path: Path):
    path = tmp_path / "namespace"
    assert own_namespace(path) is None
    path.write_text("inference\n")
    assert own_namespace(path) == "inference"
    path.write_text("  \n")
    assert own_namespace(path) is None
