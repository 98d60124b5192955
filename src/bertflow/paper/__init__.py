"""The paper harness: the grids behind ``bertflow reproduce`` / ``evaluate`` / ``analyze`` and the published numbers,
one module per concept, built on the reusable STS evaluator :mod:`bertflow.evaluation`. Every function takes the STS
data folder explicitly; only the CLI looks for a default one.
"""
