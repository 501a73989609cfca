"""Forecasting library: load predictors (constant, ARIMA, Kalman, Prophet, automatic choice)
and the request-trace readers that feed them.

It imports nothing from the other project packages, so it can be tested and reused alone.
"""
