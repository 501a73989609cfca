"""Actuation: how a scaling decision reaches a deployment (Kubernetes DGD/DGDSA, the virtual
decision-id protocol over etcd, elastic EP resizes, the simulated cluster).

Connectors may import the plain types of ``planner`` only, never its decision core or shell.
"""
