"""Dynamo's wire contracts: the frontend metric names, the ForwardPassMetrics schema and the
worker's staged-shutdown metrics (:mod:`.shutdown`).

Producers (the simulator, test exporters) and consumers (the planner's observers) share this
one definition; it imports nothing from the other project packages.
"""
