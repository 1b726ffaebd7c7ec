"""Performance benchmarks: ours vs reference implementations, measured side by side (``python -m perf.run``).

One module per benchmark (``bench_<name>.py``, each with ``run(ctx) -> BenchResult``), the explicit registry in
``perf/run.py``, the timing harness in ``perf/common.py``. Results and how to read them:
docs/performance.md.
"""
