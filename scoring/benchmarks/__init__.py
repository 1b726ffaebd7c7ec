"""The benchmark registry: an explicit table of names to the module attribute holding each ``Benchmark``.

Modules are imported on first use (``get_benchmark``), so importing ``scoring.benchmarks`` is cheap and a benchmark
whose module or dependencies are missing only fails when it is asked for.

| name | module | kind |
|---|---|---|
| aime24, aime25, amc23, math500, minerva, olympiadbench | ``scoring.benchmarks.<name>`` | math |
| livecodebench | ``scoring.benchmarks.livecodebench`` | code |
| humaneval | ``scoring.benchmarks.humaneval`` | code |
| humaneval_plus, mbpp_plus | ``scoring.benchmarks.evalplus_plus`` (EvalPlus's sets) | code |
| addition, countdown | ``scoring.benchmarks.tasks`` (the trainer's embedded tasks) | task |
| minicode | ``scoring.benchmarks.tasks`` (the embedded code task, graded in the sandbox) | code |
"""

from __future__ import annotations

import importlib

from scoring.benchmarks.base import DATA_ENV, Benchmark, Problem, Verdict

__all__ = ["BENCHMARKS", "DATA_ENV", "MATH_BENCHMARKS", "Benchmark", "Problem", "Verdict", "get_benchmark"]

# name -> (module, attribute)
BENCHMARKS: dict[str, tuple[str, str]] = {
    "aime24": ("scoring.benchmarks.aime24", "BENCHMARK"),
    "aime25": ("scoring.benchmarks.aime25", "BENCHMARK"),
    "amc23": ("scoring.benchmarks.amc23", "BENCHMARK"),
    "math500": ("scoring.benchmarks.math500", "BENCHMARK"),
    "minerva": ("scoring.benchmarks.minerva", "BENCHMARK"),
    "olympiadbench": ("scoring.benchmarks.olympiadbench", "BENCHMARK"),
    "livecodebench": ("scoring.benchmarks.livecodebench", "BENCHMARK"),
    "humaneval": ("scoring.benchmarks.humaneval", "BENCHMARK"),
    "humaneval_plus": ("scoring.benchmarks.evalplus_plus", "HUMANEVAL_PLUS"),
    "mbpp_plus": ("scoring.benchmarks.evalplus_plus", "MBPP_PLUS"),
    "addition": ("scoring.benchmarks.tasks", "ADDITION"),
    "countdown": ("scoring.benchmarks.tasks", "COUNTDOWN"),
    "minicode": ("scoring.benchmarks.tasks", "MINICODE"),
}

# the paper's six math benchmarks, in its table order
MATH_BENCHMARKS = ("aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench")


def get_benchmark(name: str) -> Benchmark:
    """The ``Benchmark`` called ``name``; ValueError listing the names for an unknown one."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; choose from: {', '.join(BENCHMARKS)}")
    module, attr = BENCHMARKS[name]
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"benchmark {name!r} needs module {module}, which failed to import: {e}") from e
    bench = getattr(mod, attr)
    assert bench.name == name, f"{module}.{attr} is named {bench.name!r}, registered as {name!r}"
    return bench
