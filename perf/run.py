"""Run the benchmarks: a table per benchmark on the console, JSON + Markdown under ``--out``.

    python -m perf.run [--only NAME[,NAME]] [--repeats N] [--out results/bench] [--tokens 1e8] [--quick]

Every target is a ratio of two sides measured side by side (alternating A B A B), so that the load of a shared
machine hits both; each side is reported as min / median / max and the ratio uses medians. Files written:
``<out>/<name>.json`` and ``<out>/<name>.md`` per benchmark, ``<out>/results.json`` and ``<out>/summary.md`` for
the run (machine, load, every check with PASS/MISS). See docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

from perf import (bench_binning, bench_dynamic_sampling, bench_engines, bench_gpu, bench_graders,
                        bench_logprob_memory, bench_lora_sync, bench_padding, bench_sampler_vs_generate,
                        bench_scaling, bench_seeds_overhead, bench_trainer_vs_trl)
from perf.common import (THREADS, BenchResult, Context, load_snapshot, machine_info, markdown_table,
                               result_markdown, result_text)

# name -> module with run(ctx) -> BenchResult; the order is the run order (seeds_overhead needs the newest sampler)
BENCHMARKS = {
    "trainer_vs_trl": bench_trainer_vs_trl,
    "sampler_vs_generate": bench_sampler_vs_generate,
    "binning": bench_binning,
    "graders": bench_graders,
    "scaling": bench_scaling,
    "seeds_overhead": bench_seeds_overhead,
    "engines": bench_engines,
    "gpu": bench_gpu,
    "logprob_memory": bench_logprob_memory,
    "padding": bench_padding,
    "dynamic_sampling": bench_dynamic_sampling,
    "lora_sync": bench_lora_sync,
}


def run_one(name: str, ctx: Context) -> BenchResult:
    """One benchmark with load snapshots around it; a failure becomes a result with the error (others go on)."""
    before = load_snapshot()
    t0 = time.perf_counter()
    try:
        res = BENCHMARKS[name].run(ctx)
    except Exception:
        res = BenchResult(name, "FAILED", skipped="error: " + traceback.format_exc(limit=8)[-3000:])
    res.elapsed_s = time.perf_counter() - t0
    res.load = {"before": before, "after": load_snapshot()}
    return res


def write_results(results: list[BenchResult], out: Path, machine: dict, argv: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for r in results:
        (out / f"{r.name}.json").write_text(json.dumps(r.to_dict(), indent=1, default=str) + "\n")
        (out / f"{r.name}.md").write_text(result_markdown(r))
    payload = {"command": "python -m perf.run " + " ".join(argv), "machine": machine,
               "results": [r.to_dict() for r in results]}
    (out / "results.json").write_text(json.dumps(payload, indent=1, default=str) + "\n")
    checks = [{"benchmark": r.name, "check": c.name, "value": c.value, "target": f"{c.op} {c.target:g}",
               "result": "PASS" if c.passed else "MISS"} for r in results for c in r.checks]
    skipped = [{"benchmark": r.name, "reason": _last_line(r.skipped)} for r in results if r.skipped]
    lines = ["# Benchmark results", "", f"Command: `{payload['command']}`", "",
             f"Machine: {machine['cpu_model']}, {machine['usable_cores']} usable cores, {machine['mem_gib']} GiB, "
             f"GPU: {machine['gpu'] or 'none'}; torch threads per side: {machine['threads']}; versions: "
             + ", ".join(f"{k} {v}" for k, v in machine["versions"].items()), "",
             "## Checks", "", markdown_table(checks) if checks else "(none)\n"]
    if skipped:
        lines += ["## Skipped", "", markdown_table(skipped)]
    lines += ["## Details", ""] + [result_markdown(r) for r in results]
    (out / "summary.md").write_text("\n".join(lines))


def _last_line(text: str) -> str:
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return lines[-1] if lines else ""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m perf.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", action="append", default=[],
                   help=f"benchmark(s) to run, comma-separated or repeated; choices: {', '.join(BENCHMARKS)}")
    p.add_argument("--skip", action="append", default=[], help="benchmark(s) to leave out")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds per side (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first, where a benchmark has none of its own")
    p.add_argument("--out", default="results/bench", help="folder for JSON and Markdown results")
    p.add_argument("--tokens", type=float, default=1e8, help="binning: tokens of synthetic rollouts (default 1e8)")
    p.add_argument("--threads", type=int, default=THREADS, help=f"torch threads per side (default {THREADS})")
    p.add_argument("--quick", action="store_true", help="tiny sizes and 1e6 binning tokens (a smoke test; the "
                   "numbers mean nothing)")
    p.add_argument("--in-process", action="store_true", help="run trainer sides in this interpreter, not fresh ones")
    p.add_argument("--tmp", default=None, help="scratch folder for synthetic runs (default: the system temp dir)")
    a = p.parse_args(argv)
    names = [n.strip() for x in a.only for n in x.split(",") if n.strip()] or list(BENCHMARKS)
    skip = {n.strip() for x in a.skip for n in x.split(",") if n.strip()}
    unknown = sorted((set(names) | skip) - set(BENCHMARKS))
    if unknown:
        p.error(f"unknown benchmark(s) {unknown}; choose from {', '.join(BENCHMARKS)}")
    if a.repeats < 1:
        p.error("--repeats must be >= 1")
    names = [n for n in BENCHMARKS if n in names and n not in skip]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    ctx = Context(repeats=a.repeats, warmup=a.warmup, quick=a.quick, tokens=int(a.tokens), threads=a.threads,
                  isolate=not a.in_process, tmp=Path(a.tmp or tempfile.gettempdir()), out=out)
    machine = machine_info()
    machine["threads"] = a.threads
    print(f"machine: {machine['cpu_model']}, {machine['usable_cores']} cores, load {load_snapshot()['uptime']}",
          flush=True)
    results = []
    for name in names:
        print(f"\n>> {name}", flush=True)
        res = run_one(name, ctx)
        results.append(res)
        print(result_text(res), flush=True)
        write_results(results, out, machine, argv)   # after each benchmark: a long run leaves partial results
    n_miss = sum(not c.passed for r in results for c in r.checks)
    print(f"\nwrote {out}/summary.md and {out}/results.json; {n_miss} target(s) missed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
