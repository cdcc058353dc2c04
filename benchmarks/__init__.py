"""The benchmarks behind docs/: each runs as `python -m benchmarks.<name>` (or `benchmarks.quality.<name>`).

Imports go one way: `fastformer` <- `harness` (timing, peak memory, stored script runs, markdown, the doc header)
<- the experiment specs (`specs`, `quality.specs`: data only) <- the runners and report renderers.
"""
