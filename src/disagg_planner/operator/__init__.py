"""``planner operator``: a kopf operator, one planner loop per ``PlannerPolicy`` object.

The custom resource is ours: group ``planner.autoscaling.dev``, version ``v1alpha1``, kind
``PlannerPolicy`` (plural ``plannerpolicies``, short name ``plp``), namespaced. Its ``spec``
is the planner config (same keys as a config file) plus ``targetRef`` naming a
DynamoGraphDeployment in the same namespace; its ``status`` shows the last decision, the
reasons, observed and predicted load, and the conditions Ready, Scaling and Degraded.

- :mod:`disagg_planner.operator.crd`: the CRD, generated from ``PlannerConfig``
  (``python -m disagg_planner.operator.crd`` writes ``deploy/crds``);
- :mod:`disagg_planner.operator.conditions`: the ``status.conditions`` schema both CRDs carry;
- :mod:`disagg_planner.operator.policy`: spec -> config (precedence, targetRef);
- :mod:`disagg_planner.operator.status`: conditions and the status writer;
- :mod:`disagg_planner.operator.app`: kopf handlers, settings (peering) and :func:`run_operator`.
"""
