"""``planner report --live``: a running planner's diagnostics, rendered on demand by its
metrics server, fetched into a file; a deployment it does not plan is a clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

from disagg_planner.cli.main import main
from disagg_planner.runtime.metrics import HealthState, MetricsServer, PlannerMetrics


def test_a_live_report_is_fetched_and_an_unknown_deployment_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def reports(namespace: str, name: str) -> str | None:
        return "<html>ticks of ns/a</html>" if (namespace, name) == ("ns", "a") else None

    server = MetricsServer(
        PlannerMetrics(), HealthState(), host="127.0.0.1", port=0, reports=reports
    ).start()
    url = f"http://127.0.0.1:{server.port}"
    try:
        fetched = main(
            ["report", "--live", url, "--deployment", "ns/a", "-o", str(tmp_path / "a.html")]
        )
        missing = main(
            ["report", "--live", url, "--deployment", "ns/b", "-o", str(tmp_path / "b.html")]
        )
    finally:
        server.stop()
    err = capsys.readouterr().err
    assert (fetched, (tmp_path / "a.html").read_text(), missing) == (
        0,
        "<html>ticks of ns/a</html>",
        2,
    )
    assert "404 no report of ns/b" in err, err
