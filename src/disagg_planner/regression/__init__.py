"""Online regression of per-iteration engine wall time on ForwardPassMetrics, and the TTFT/ITL
estimators built on it for load-based scaling.

It imports nothing else of the package (an import-linter contract).
"""
