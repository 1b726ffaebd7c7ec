"""Timing harness shared by the benchmarks: side-by-side alternation, summaries, checks, results as JSON/Markdown.

Every target is a RATIO of two things measured on the same machine at the same time, because absolute times on a
shared 2-core machine move with the load. ``alternate`` runs the sides A B A B ... (after ``warmup`` untimed
rounds), so a load spike hits both; each side's samples are summarised as min / median / max and a ratio is the
ratio of medians. ``machine_info`` and ``load`` (the 1-minute load average before and after) go into every result.

A side can run in a fresh interpreter (``call_in_subprocess``): nothing it imports, allocates or spins up (thread
pools, accelerate state, a trained model) leaks into the other side, and its own clock is read inside the child,
so interpreter start-up is not timed.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
THREADS = 2   # the development machines have 2 cores; every CPU benchmark pins torch to this many threads


# ---------------------------------------------------------------------------------------------- context
@dataclass
class Context:
    """What every benchmark's ``run(ctx)`` gets from ``perf.run``."""
    repeats: int = 3                  # timed rounds per side (A B A B ...)
    warmup: int = 1                   # untimed rounds first (where the benchmark has no warm-up of its own)
    quick: bool = False               # tiny sizes, for the smoke test (numbers are meaningless)
    tokens: int = 10**8               # binning: tokens of synthetic rollout records
    threads: int = THREADS            # torch threads on each side
    isolate: bool = True              # run trainer sides in fresh interpreters
    tmp: Path = field(default_factory=lambda: Path(tempfile.gettempdir()))
    out: Path | None = None           # results folder (plots go there)
    log: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------- results
@dataclass
class Side:
    """Samples of one side of a comparison (seconds, tokens/s, ...; ``unit`` says which)."""
    name: str
    unit: str
    samples: list[float] = field(default_factory=list)

    @property
    def min(self) -> float:
        return min(self.samples) if self.samples else math.nan

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else math.nan

    @property
    def max(self) -> float:
        return max(self.samples) if self.samples else math.nan

    def to_dict(self) -> dict:
        return {"name": self.name, "unit": self.unit, "n": len(self.samples), "min": self.min,
                "median": self.median, "max": self.max, "samples": list(self.samples)}


@dataclass
class Check:
    """One target: ``value op target`` (op is ``<=`` or ``>=``), e.g. ours/TRL median seconds <= 0.7."""
    name: str
    value: float
    op: str
    target: float
    detail: str = ""   # how the value was formed ("median ours / median TRL")

    @property
    def passed(self) -> bool:
        if not math.isfinite(self.value):
            return False
        return self.value <= self.target if self.op == "<=" else self.value >= self.target

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


@dataclass
class BenchResult:
    name: str
    description: str
    params: dict = field(default_factory=dict)
    sides: list[Side] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    tables: dict[str, list[dict]] = field(default_factory=dict)   # extra tables (scaling, per-size rows)
    info: dict = field(default_factory=dict)                      # derived numbers (roofline share, token counts)
    load: dict = field(default_factory=dict)                      # load average before/after, uptime strings
    skipped: str | None = None                                    # why the benchmark did not run (no GPU, ...)
    elapsed_s: float = 0.0
    files: list[str] = field(default_factory=list)                # plots and other artefacts written

    def side(self, name: str) -> Side:
        return next(s for s in self.sides if s.name == name)

    def to_dict(self) -> dict:
        return {"name": self.name, "description": self.description, "params": self.params,
                "sides": [s.to_dict() for s in self.sides], "checks": [c.to_dict() for c in self.checks],
                "tables": self.tables, "info": self.info, "load": self.load, "skipped": self.skipped,
                "elapsed_s": self.elapsed_s, "files": self.files}


def ratio(a: float, b: float) -> float:
    return a / b if b and math.isfinite(a) and math.isfinite(b) else math.nan


# ---------------------------------------------------------------------------------------------- timing
def alternate(fns: dict[str, Callable[[], float | list[float]]], *, units: dict[str, str] | str, repeats: int,
              warmup: int = 0, log: Callable[[str], None] | None = None) -> list[Side]:
    """Run the sides A B A B ...: ``warmup`` untimed rounds, then ``repeats`` timed rounds.

    Each function returns one sample or a list of samples (a run of several steps). Returns one ``Side`` per
    function, in the order given.
    """
    names = list(fns)
    sides = {n: Side(n, units if isinstance(units, str) else units[n]) for n in names}
    for r in range(warmup + repeats):
        for n in names:
            got = fns[n]()
            vals = list(got) if isinstance(got, (list, tuple)) else [got]
            if r >= warmup:
                sides[n].samples.extend(float(v) for v in vals)
            if log:
                tag = "warmup" if r < warmup else f"repeat {r - warmup + 1}/{repeats}"
                log(f"  {n:>14} {tag}: " + ", ".join(f"{v:.4g}" for v in vals) + f" {sides[n].unit}  "
                    f"[load {os.getloadavg()[0]:.2f}]")
    return [sides[n] for n in names]


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def load_snapshot() -> dict:
    """The load averages and the `uptime` line (contention is why targets are ratios)."""
    try:
        up = subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        up = ""
    return {"loadavg": list(os.getloadavg()), "uptime": up, "time": time.strftime("%Y-%m-%d %H:%M:%S")}


def machine_info() -> dict:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_gib = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    versions = {"python": platform.python_version()}
    for mod in ("torch", "transformers", "trl", "numpy", "pyarrow", "vllm"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:
            pass
    cuda = None
    try:
        import torch
        if torch.cuda.is_available():
            cuda = torch.cuda.get_device_name(0)
    except Exception:
        pass
    return {"cpu_model": model, "cores": os.cpu_count(), "usable_cores": usable, "threads": THREADS,
            "mem_gib": mem_gib, "gpu": cuda, "platform": platform.platform(), "versions": versions}


class PeakRSS:
    """Peak resident memory of this process over a block, in bytes above the resident memory at its start.

    Linux keeps one high-water mark per process (``VmHWM``); writing ``5`` to ``/proc/self/clear_refs`` lowers it
    to the current resident size, so the block's own peak is measured rather than whatever the imports or the
    model's construction reached before it (``ru_maxrss`` never goes down, and a block whose peak stays under an
    earlier one reads as 0). Where the mark cannot be reset the block is measured against ``ru_maxrss`` and
    ``reset`` is False.

    The kernel folds freed memory into the mark lazily (when pages are unmapped, from per-CPU counters), and one CI
    machine read a freed 100 MiB block as 0 from the mark alone; so a thread also samples ``VmRSS`` every
    ``sample_s`` seconds and the peak is the larger of the two readings (``sampled`` is the sampler's own).
    """

    def __init__(self, sample_s: float = 0.002):
        self.sample_s = sample_s

    def __enter__(self) -> "PeakRSS":
        import threading
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.reset = True
        except OSError:
            self.reset = False
        self.base = _status_bytes("VmRSS") if self.reset else _maxrss_bytes()
        self._top = _status_bytes("VmRSS")
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, name="PeakRSS", daemon=True)
        self._sampler.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.sample_s):
            self._top = max(self._top, _status_bytes("VmRSS"))

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._sampler.join()
        mark = _status_bytes("VmHWM") if self.reset else _maxrss_bytes()
        self.sampled = max(0, self._top - self.base)
        self.peak = max(0, mark - self.base, self.sampled)


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"/proc/self/status has no {field}")


def _maxrss_bytes() -> int:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # Linux: KiB


def set_threads(n: int = THREADS) -> None:
    import torch
    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:   # already set in this process
        pass


# ---------------------------------------------------------------------------------------------- subprocess
def child_env(threads: int = THREADS) -> dict:
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false",
                "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
                "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1", "PYTHONWARNINGS": "ignore", "WANDB_DISABLED": "true",
                "TQDM_DISABLE": "1"})
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def call_in_subprocess(target: str, kwargs: dict | None = None, *, threads: int = THREADS,
                       timeout: float = 1800, extra_env: dict | None = None, launcher: list[str] | None = None) -> Any:
    """Run ``module:function(**kwargs)`` in a fresh interpreter and return its JSON result.

    The child pins torch to ``threads`` threads; its stderr is passed through on failure. ``launcher`` replaces
    the interpreter command, e.g. ``[python, "-m", "torch.distributed.run", "--nproc_per_node", "2"]`` (then rank 0
    writes the result).
    """
    with tempfile.TemporaryDirectory(prefix="bench_call_") as tmp:
        out = Path(tmp) / "out.json"
        cmd = [*(launcher or [sys.executable]), "-m", "perf.common", "--call", target,
               "--kwargs", json.dumps(kwargs or {}), "--out", str(out), "--threads", str(threads)]
        env = child_env(threads)
        env.update(extra_env or {})
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"benchmark child {target} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        return json.loads(out.read_text())


def _child_main(argv: list[str]) -> int:
    import argparse
    import importlib
    p = argparse.ArgumentParser()
    p.add_argument("--call", required=True)
    p.add_argument("--kwargs", default="{}")
    p.add_argument("--out", required=True)
    p.add_argument("--threads", type=int, default=THREADS)
    a = p.parse_args(argv)
    set_threads(a.threads)
    mod, fn = a.call.split(":")
    result = getattr(importlib.import_module(mod), fn)(**json.loads(a.kwargs))
    if os.environ.get("RANK", "0") == "0":   # under torchrun only rank 0 answers
        Path(a.out).write_text(json.dumps(result))
    return 0


# ---------------------------------------------------------------------------------------------- roofline
def matmul_flops(n: int = 1024, *, repeats: int = 5, threads: int = THREADS) -> float:
    """Achievable fp32 FLOP/s of this machine: the best of ``repeats`` n x n @ n x n matmuls (2 n^3 FLOPs)."""
    import torch
    set_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b   # warm-up (thread pool, page faults)
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


# ---------------------------------------------------------------------------------------------- formatting
def fmt(x: Any, digits: int = 4) -> str:
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if not math.isfinite(x):
            return str(x)
        if x != 0 and (abs(x) >= 1e6 or abs(x) < 1e-3):
            return f"{x:.3e}"
        return f"{x:.{digits}g}"
    return str(x)


def markdown_table(rows: list[dict], columns: list[str] | None = None) -> str:
    if not rows:
        return "(no rows)\n"
    cols = columns or list(dict.fromkeys(k for r in rows for k in r))
    out = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for r in rows:
        out.append("| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |")
    return "\n".join(out) + "\n"


def result_markdown(res: BenchResult) -> str:
    lines = [f"### {res.name}", "", res.description, ""]
    if res.skipped:
        lines += [f"**Skipped:** {res.skipped}", ""]
        return "\n".join(lines)
    if res.params:
        lines += ["Parameters: " + ", ".join(f"`{k}={v}`" for k, v in res.params.items()), ""]
    if res.sides:
        lines.append(markdown_table([{"side": s.name, "unit": s.unit, "n": len(s.samples), "min": s.min,
                                      "median": s.median, "max": s.max} for s in res.sides]))
    if res.checks:
        lines.append(markdown_table([{"check": c.name, "value": c.value, "target": f"{c.op} {c.target:g}",
                                      "result": "PASS" if c.passed else "MISS", "how": c.detail}
                                     for c in res.checks]))
    for name, rows in res.tables.items():
        lines += [f"**{name}**", "", markdown_table(rows)]
    if res.info:
        lines += ["Derived: " + ", ".join(f"{k} = {fmt(v)}" for k, v in res.info.items()), ""]
    if res.load:
        before, after = res.load.get("before", {}), res.load.get("after", {})
        lines += [f"Load average (1/5/15 min) before: {before.get('loadavg')}, after: {after.get('loadavg')}; "
                  f"elapsed {res.elapsed_s:.1f} s", ""]
    return "\n".join(lines)


def result_text(res: BenchResult) -> str:
    """The console table: each side's min/median/max, then each check with PASS/MISS."""
    lines = [f"== {res.name}: {res.description}"]
    if res.skipped:
        return "\n".join(lines + [f"   SKIPPED: {res.skipped}"])
    if res.sides:
        lines.append(f"   {'side':<34}{'unit':<14}{'n':>4}{'min':>12}{'median':>12}{'max':>12}")
        for s in res.sides:
            lines.append(f"   {s.name:<34}{s.unit:<14}{len(s.samples):>4}{fmt(s.min):>12}{fmt(s.median):>12}"
                         f"{fmt(s.max):>12}")
    for c in res.checks:
        lines.append(f"   {c.name:<52} {fmt(c.value):>10}  target {c.op} {c.target:g}  "
                     f"{'PASS' if c.passed else 'MISS'}   ({c.detail})")
    for name, rows in res.tables.items():
        lines.append(f"   -- {name}")
        cols = list(dict.fromkeys(k for r in rows for k in r))
        lines.append("   " + "".join(f"{c:>16}" for c in cols))
        for r in rows:
            lines.append("   " + "".join(f"{fmt(r.get(c, '')):>16}" for c in cols))
    for k, v in res.info.items():
        lines.append(f"   {k}: {fmt(v)}")
    la = res.load.get("before", {}).get("loadavg"), res.load.get("after", {}).get("loadavg")
    lines.append(f"   load before {la[0]} after {la[1]}; {res.elapsed_s:.1f} s")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
