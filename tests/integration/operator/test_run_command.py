"""``planner run`` as a process: kubeconfig to kmock, the canned Prometheus, a real profile;
it scales the DGD, serves its gauges and /readyz, and exits 0 on SIGTERM after writing its
last report."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.integration.conftest import free_port
from tests.integration.connectors.conftest import NS
from tests.integration.operator.conftest import INTERVAL_S, OperatorCluster, eventually

REPO = Path(__file__).resolve().parents[3]


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


async def test_planner_run_scales_serves_metrics_and_stops_on_sigterm(
    operator_cluster: OperatorCluster, kmock: Any, prometheus: Any, profile_dir: Path, tmp_path
) -> None:
    cluster = operator_cluster
    cluster.add_graph("graph")
    kubeconfig = tmp_path / "kubeconfig.json"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "kmock",
                "clusters": [{"name": "kmock", "cluster": {"server": str(kmock.url).rstrip("/")}}],
                "users": [{"name": "kmock", "user": {"token": "test"}}],
                "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock"}}],
            }
        )
    )
    port = free_port()
    reports = tmp_path / "reports"
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("PLANNER_", "PROMETHEUS_", "DYN_"))
    }
    # this checkout's package (src layout) and tests, whatever is installed
    pythonpath = os.pathsep.join((str(REPO / "src"), str(REPO)))
    env.update(KUBECONFIG=str(kubeconfig), PYTHONPATH=pythonpath)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "disagg_planner",
        "run",
        "--environment=kubernetes",
        "--dgd-name=graph",
        f"--kubernetes-namespace={NS}",
        f"--profile-results-dir={profile_dir}",
        f"--metric-pulling-prometheus-endpoint={prometheus.url}",
        "--load-predictor=constant",
        f"--throughput-adjustment-interval-seconds={INTERVAL_S}",
        "--max-gpu-budget=-1",
        f"--metric-reporting-prometheus-port={port}",
        f"--report-output-dir={reports}",
        cwd=tmp_path,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await eventually(
            lambda: cluster.graph_replicas("graph") != {"prefill": 1, "decode": 1} or None,
            what="the DGD to be scaled",
            timeout_s=30,
        )
        ready = await eventually(
            lambda: r if (r := http_get(f"http://127.0.0.1:{port}/readyz"))[0] == 200 else None,
            what="/readyz",
        )
        assert ready[1].strip() == "ok"
        _, metrics = http_get(f"http://127.0.0.1:{port}/metrics")
        prefill = cluster.graph_replicas("graph")["prefill"]
        assert (
            f'dynamo_planner_predicted_num_prefill_replicas{{dgd="graph",namespace="{NS}"}} '
            f"{float(prefill)}" in metrics
        )
        assert http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200
        # the diagnostics, rendered on demand from the rolling window (issue 36)
        url = f"http://127.0.0.1:{port}/report/{NS}/graph"
        page = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=60).read())
        assert b"Replicas per role" in page
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), timeout=20)
        assert process.stderr is not None
        log = (await process.stderr.read()).decode()
    assert code == 0, log
    assert "received SIGTERM; stopping" in log
    assert "planner stopped after" in log
    # nothing is rendered when the loop stops (each stop cost a render of every tick kept)
    assert not list(reports.rglob("*.html"))
