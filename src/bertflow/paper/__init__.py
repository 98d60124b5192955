"""The paper harness: the grids behind ``bertflow reproduce`` / ``evaluate`` / ``analyze`` and the published numbers.

Built on the reusable STS evaluator :mod:`bertflow.evaluation`. One module per concept:
:mod:`~bertflow.paper.regimes` (what a calibrator is fitted on), :mod:`~bertflow.paper.grid` (pooling x calibrator
x regime cells on one encoder), :mod:`~bertflow.paper.perset` (every set scored alone, fitted on its own sentences)
with :mod:`~bertflow.paper.lodo` (leave-one-dataset-out selection), :mod:`~bertflow.paper.results` (JSON) and
:mod:`~bertflow.paper.render` (Markdown), :mod:`~bertflow.paper.analyze` with :mod:`~bertflow.paper.measures` and
:mod:`~bertflow.paper.plots` (``bertflow analyze``), and :mod:`~bertflow.paper.published` (the papers' numbers, stored
in ``published.json``).
Every function takes the STS data folder explicitly; only the CLI looks for a default one.
"""
