"""Actuation: how a scaling decision reaches a deployment (Kubernetes DGD/DGDSA, the virtual
decision-id protocol over etcd, elastic EP resizes).

Connectors may import the plain types of :mod:`disagg_planner.core.types` and the errors of
:mod:`disagg_planner.errors` only: never the config (each connector takes its own frozen
settings, built by :mod:`disagg_planner.runtime.connector_settings`), the decision core or
the application above them.
"""
