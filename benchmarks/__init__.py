"""The benchmarks behind docs/: each runs as `python -m benchmarks.<name>` (or `benchmarks.quality.<name>`), prints
its tables and writes its record. Imports go one way: `fastformer` <- `harness` <- the benchmarks."""
