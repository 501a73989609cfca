"""Profile library: reads pre-deployment performance profiles (Dynamo's NPZ/JSON layout) and
answers how much prefill and decode capacity one GPU gives under a TTFT or ITL target.

It imports nothing from the other project packages.
"""
