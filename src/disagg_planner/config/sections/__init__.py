"""The sections of :class:`~disagg_planner.config.schema.PlannerConfig`, one file each.

A section is a pydantic model holding the fields of one ``--help`` group (the ``group`` of
each field's :func:`field_meta`), the rules that check one field alone, and what is derived
from its own fields. ``config/schema.py`` assembles them into ``PlannerConfig`` and adds the
rules that relate fields of several sections.

| file | group | settings |
|---|---|---|
| ``deployment.py`` | deployment | where replicas change: DGD, connectors, Kubernetes API, etcd |
| ``slo.py`` | slo | TTFT/ITL targets, which loops run, their intervals and sizing rules |
| ``budget.py`` | budget | GPU budgets, replica floors, the fleet's GPU pool |
| ``prediction.py`` | prediction | the load predictor and its parameters |
| ``profile.py`` | profile | the performance profile |
| ``prometheus.py`` | prometheus | traffic metrics read from Prometheus |
| ``load.py`` | load | the load-based loop and its ForwardPassMetrics |
| ``elastic_ep.py`` | elastic | elastic expert parallelism (docs/elastic-ep.md) |
| ``reporting.py`` | reporting | the planner's own metrics and its reports |
"""
