"""The API client the planner builds (connectors/kubernetes/api.py): no retries of urllib3's
own under the connector's, and a connection pool as large as the threads that share it."""

from __future__ import annotations

from kubernetes import client as k8s_client

from disagg_planner.connectors.kubernetes import API_WORKER_THREADS, planner_api_client


def test_the_client_pool_holds_a_connection_per_worker_thread_and_urllib3_never_retries() -> None:
    client = planner_api_client(k8s_client.Configuration())
    try:
        pool_kw = client.rest_client.pool_manager.connection_pool_kw
        retries = pool_kw["retries"]
        assert (pool_kw["maxsize"], retries.total, retries.redirect) == (
            API_WORKER_THREADS,
            False,
            0,
        )
    finally:
        client.close()
