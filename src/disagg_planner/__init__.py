"""Planner: an SLO-driven autoscaler for disaggregated LLM inference (DynamoGraphDeployments).

One import package; its subpackages are the layers, and ``pyproject.toml``'s import-linter
contracts enforce the rule between them (``docs/architecture.md``):

- numeric libraries, importing no other part of the package: ``predictors`` (load forecasting,
  trace readers), ``regression`` (online regression on ForwardPassMetrics), ``profiles`` (the
  profile library: NPZ profiles, capacity under an SLA, engine resize timings, and the bundled
  profiles as package data), ``signals`` (Dynamo's metric names and FPM schema);
- ``simulator``: the discrete-event serving cluster; imports only the numeric libraries;
- ``core``: the pure decision core (observations and a time in, effects with reasons out);
- ``connectors``: actuation (Kubernetes, virtual/etcd, elastic EP), with their own settings;
- the shells and the application: ``config``, ``observe``, ``runtime`` (the live loop and the
  observation builder replay shares), ``operator``, ``replay``, ``report``, ``cli``.

The command is ``planner`` (:mod:`disagg_planner.cli.main`); ``python -m disagg_planner`` runs it.
"""

__version__ = "0.1.0"
