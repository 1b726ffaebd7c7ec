"""Grader throughput: math answers per second and sandboxed test executions per second; sandbox overhead.

- Math: ``scoring.grading.grade_math_many`` (extraction + math-verify, one worker process per core, the pool
  started and warmed before timing) on a fixed corpus of responses: integers, fractions vs decimals, radicals,
  intervals, polynomials, tuples, wrong answers and unboxed responses, each behind ~1 kB of reasoning text.
  For context the same items graded one by one in this process (``math_item``, one core).
- Code: ``scoring.sandbox.run_many`` (a thread per core) of ``run_cases`` calls, each running a small stdin program
  on ``cases`` test inputs with every isolation layer on (namespaces, jail, a uid per call, seccomp, rlimits).
  Reported as test executions per second.
- Overhead: one ``run_program("pass")`` (a whole sandbox call: unshare, runner, jail, one case) vs one bare
  ``subprocess.run([sys.executable, "-c", "pass"])``; target <= 2x. ``python -I -S -c pass`` (no site
  import, what the sandbox's runner starts with) is shown for context. Each sample is the mean of ``calls``
  calls; sides alternate.
"""

from __future__ import annotations

import subprocess
import sys
import time

from perf.common import BenchResult, Check, alternate, ratio

NAME = "graders"
TARGET_OVERHEAD = 2.0

_REASONING = ("Let us work through the problem step by step. First we set up the equation and simplify both "
              "sides, keeping track of every term; then we substitute the values we found and check the edge "
              "cases carefully before committing to a final result. ") * 4

# (final answer as the model writes it, gold) templates; ``i`` varies the numbers so no two items are equal
# (math-verify and sympy cache parses, and a corpus of a few repeated strings would measure the cache)
_MATH_TEMPLATES = [
    (r"The answer is $\boxed{{{a}}}$.", "{a}"),
    (r"So $x = \boxed{{\frac{{{a}}}{{{b}}}}}$.", "{a}/{b}"),
    (r"Therefore the length is $\boxed{{{a}\sqrt{{3}}}}$.", r"\sqrt{{{a2x3}}}"),
    (r"The solution set is $\boxed{{({a}, {b}]}}$.", "({a},{b}]"),
    (r"Expanding, we get $\boxed{{x^2+{a2}x+{asq}}}$.", "(x+{a})^2"),
    (r"The angle is $\boxed{{\frac{{\pi}}{{{a}}}}}$.", r"\pi/{a}"),
    (r"The pair is $\boxed{{({a}, -{b})}}$.", "({a},-{b})"),
    (r"The answer is $\boxed{{{a}}}$.", "{b}"),
    (r"Hence $\boxed{{\dfrac{{{a}}}{{{b}}}}}$.", r"\frac{{{a}}}{{{b}}}"),
    (r"The value is $\boxed{{{dec}}}$.", r"\frac{{{a}}}{{4}}"),
    (r"Final Answer: {a}", "{a}"),
    (r"I am not sure, maybe {a} or {b}.", "{a}"),
    (r"The probability is $\boxed{{\frac{{{a}}}{{{b}}}}}$.", r"\frac{{{b}}}{{{a}}}"),
    (r"We obtain $\boxed{{e^{{{a}}}}}$.", "e^{a}"),
    (r"The roots are $\boxed{{{a}, {b}}}$.", "{a},{b}"),
    (r"Total: $\boxed{{{a}000}}$ dollars.", "{a}000"),
]


def math_items(n: int) -> list[tuple]:
    """``n`` distinct (response, gold, multiple_answer, unit) items; about 80 % correct by construction."""
    items = []
    for i in range(n):
        resp, gold = _MATH_TEMPLATES[i % len(_MATH_TEMPLATES)]
        a, b = 2 + i, 3 + 2 * i
        v = dict(a=a, b=b, a2=2 * a, asq=a * a, a2x3=3 * a * a, dec=f"{a / 4:g}")
        items.append((_REASONING + resp.format(**v), gold.format(**v), False, None))
    return items


_PROGRAM = "import sys\nnums = list(map(int, sys.stdin.read().split()))\nprint(sum(x * x for x in nums))\n"


def params_for(ctx) -> dict:
    if ctx.quick:
        return {"math_items": 16, "code_calls": 2, "cases_per_call": 2, "overhead_calls": 2}
    return {"math_items": 320, "code_calls": 16, "cases_per_call": 4, "overhead_calls": 10}


def run(ctx) -> BenchResult:
    from scoring.grading import grade_math_many
    from scoring.pool import WorkerPool, default_workers, math_item
    from scoring.sandbox import isolation, run_cases, run_many, run_program

    p = params_for(ctx)
    workers = default_workers()
    p["workers"] = workers
    res = BenchResult(NAME, "math grading answers/s, sandboxed test executions/s, and sandbox overhead per call "
                      f"vs a bare `python -c pass`; target overhead <= {TARGET_OVERHEAD:g}x", params=p)
    iso = isolation()
    res.info["sandbox_isolation_full"] = iso.full
    res.info["sandbox_isolation_reason"] = iso.reason or "all layers on"

    # --- math
    items = math_items(p["math_items"])
    with WorkerPool(math_item, workers=workers, timeout=10.0) as pool:
        grade_math_many(items[: 2 * workers], pool=pool)   # start and warm the workers (not timed)
        verdicts = []

        def pooled():
            dt, (v, _) = _timed(lambda: grade_math_many(items, pool=pool))
            verdicts[:] = v
            return len(items) / dt

        def inproc():
            dt, _ = _timed(lambda: [math_item(*it) for it in items])
            return len(items) / dt

        math_sides = alternate({f"math pool ({workers} workers)": pooled, "math in-process (1 core)": inproc},
                               units="answers/s", repeats=ctx.repeats, warmup=ctx.warmup, log=ctx.log)
    res.info["math_correct_frac"] = sum(v.correct for v in verdicts) / max(len(verdicts), 1)

    # --- code throughput
    jobs_cases = [[f"{i} {j} {i + j}" for j in range(p["cases_per_call"])] for i in range(p["code_calls"])]

    def code_many():
        jobs = [lambda c=c: run_cases(_PROGRAM, c, timeout_s=6.0) for c in jobs_cases]
        dt, out = _timed(lambda: run_many(jobs, workers=workers))
        assert all(r.status == "ok" for rs in out for r in rs), [r.status for rs in out for r in rs]
        return sum(len(c) for c in jobs_cases) / dt

    # --- per-call overhead
    n = p["overhead_calls"]

    def sandbox_pass():
        dt, out = _timed(lambda: [run_program("pass") for _ in range(n)])
        assert all(r.status == "ok" for r in out)
        return dt / n

    def bare_pass():
        dt, _ = _timed(lambda: [subprocess.run([sys.executable, "-c", "pass"], check=True) for _ in range(n)])
        return dt / n

    def bare_is_pass():
        dt, _ = _timed(lambda: [subprocess.run([sys.executable, "-I", "-S", "-c", "pass"], check=True)
                                for _ in range(n)])
        return dt / n

    code_sides = alternate({"sandbox executions": code_many}, units="executions/s", repeats=ctx.repeats,
                           warmup=ctx.warmup, log=ctx.log)
    over = alternate({"sandbox run_program(pass)": sandbox_pass, "bare python -c pass": bare_pass,
                      "bare python -I -S -c pass": bare_is_pass},
                     units="s/call", repeats=ctx.repeats, warmup=ctx.warmup, log=ctx.log)
    res.sides = [*math_sides, *code_sides, *over]
    res.checks.append(Check("sandbox / bare python -c pass per call", ratio(over[0].median, over[1].median), "<=",
                            TARGET_OVERHEAD, "median seconds per call"))
    res.info["sandbox_vs_python_-I_-S"] = ratio(over[0].median, over[2].median)
    res.info["math_pool_speedup_vs_1_core"] = ratio(math_sides[0].median, math_sides[1].median)
    res.info["sandbox_executions_per_call"] = p["cases_per_call"]
    return res


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out
