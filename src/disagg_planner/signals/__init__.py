"""Dynamo's wire contracts: the frontend metric names and the ForwardPassMetrics schema.

Producers (the simulator, test exporters) and consumers (the planner's observers) share this
one definition; it imports nothing from the other project packages.
"""
