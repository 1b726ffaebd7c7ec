"""Per-position binning (``tsanalysis positions``) over a large synthetic run vs a bare numpy pass in memory.

The run directory is synthesised in the real rollout schema (``contracts.records.ROLLOUT_SCHEMA``), written with
pyarrow directly (list columns built from flat numpy buffers and offsets, no Python lists), ``rows_per_file``
responses per step file, zstd like the trainer. Lengths are uniform in [L/2, 3L/2), half the rows are seeded
(seed_len = round(0.5 * length)), entropies are exponential, ~0.2 % of loss tokens are clipped. ``response_text``
and ``prompt_ids`` are short placeholders (the positions analysis never reads them; real text would only add disk).

Sides (fresh interpreters, alternated):

- ``tsanalysis``: ``tsanalysis.tables.positions_tables(run_dir)`` — streams the files in record batches and bins
  entropy, clipping and token counts for the all / seed / continuation series. Also reports the child's peak RSS
  (``resource.getrusage(RUSAGE_SELF).ru_maxrss``, interpreter and imports included).
- ``numpy bare``: the same sums and counts (3 series x {tokens, entropy, loss tokens, clipped low, clipped high})
  from the same columns already in memory as numpy arrays (loading is not timed), one ``bincount`` per quantity
  over a combined (seed?, bin) key, file by file.

A third side, ``parquet decode only``, streams the same columns and batches without binning: decoding is a floor
under the streaming side that the in-memory pass never pays.

Targets: tsanalysis within 3x of the bare pass; peak RSS under 2 GB while streaming.
"""

from __future__ import annotations

import math
import shutil
import time
from pathlib import Path

import numpy as np

from perf.common import BenchResult, Check, Side, alternate, call_in_subprocess, ratio

NAME = "binning"
TARGET_RATIO = 3.0
TARGET_RSS_MB = 2048.0
N_BINS = 10


# ---------------------------------------------------------------------------------------------- synthesis
def _list(offsets: np.ndarray, values: np.ndarray, typ, mask: np.ndarray | None = None):
    import pyarrow as pa
    arr = pa.array(values, type=typ)
    if mask is None:
        return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), arr)
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), arr, mask=pa.array(mask))


def write_synthetic_run(run_dir: str | Path, *, tokens: int, mean_len: int = 1024, rows_per_file: int = 512,
                        seed: int = 0) -> dict:
    """Write about ``tokens`` response tokens as rollouts/step_NNNNNN.parquet files; returns counts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from contracts.records import ROLLOUT_SCHEMA, rollout_path

    rng = np.random.default_rng(seed)
    run_dir = Path(run_dir)
    written, step, rows_total = 0, 0, 0
    t0 = time.perf_counter()
    while written < tokens:
        n = rows_per_file
        lens = rng.integers(max(1, mean_len // 2), max(2, mean_len * 3 // 2), size=n)
        if written + lens.sum() > tokens:   # last file: just enough rows
            n = max(1, int(np.searchsorted(np.cumsum(lens), tokens - written)) + 1)
            lens = lens[:n]
        T = int(lens.sum())
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        seeded = np.arange(n) % 2 == 1
        seed_len = np.where(seeded, np.floor(lens * 0.5 + 0.5), 0).astype(np.int32)
        resp = np.repeat(np.arange(n), lens)
        t = np.arange(T) - offsets[:-1][resp]
        is_seed_tok = t < seed_len[resp]
        entropy = rng.exponential(1.0, T).astype(np.float32)
        logp = (-rng.exponential(1.0, T)).astype(np.float32)
        behavior = np.where(is_seed_tok, logp, np.float32(np.nan)).astype(np.float32)
        ratio_ = np.exp(rng.normal(0, 0.05, T)).astype(np.float32)
        loss_mask = rng.random(T) < 0.98
        clipped_low = loss_mask & (rng.random(T) < 0.001)
        clipped_high = loss_mask & ~clipped_low & (rng.random(T) < 0.002)
        f32, i32, b = pa.float32(), pa.int32(), pa.bool_()
        cols = {
            "run": pa.array(["synthetic"] * n), "step": pa.array(np.full(n, step, dtype=np.int64)),
            "prompt_id": pa.array([f"p{step}-{i // 8}" for i in range(n)]),
            "sample_idx": pa.array((np.arange(n) % 8).astype(np.int32)),
            "variant": pa.array(np.where(seeded, "seed", "on_policy").tolist()),
            "seed_step": pa.array(np.where(seeded, max(step - 1, 0), 0).astype(np.int64), mask=~seeded),
            "seed_len": pa.array(seed_len),
            "trunc_rule": pa.array(["ratio" if s else None for s in seeded], type=pa.string()),
            "trunc_token_id": pa.array(np.full(n, 5, dtype=np.int32), mask=~seeded),
            "trunc_token_text": pa.array(["x" if s else None for s in seeded], type=pa.string()),
            "prompt_ids": _list(np.arange(n + 1) * 3, np.tile(np.array([1, 4, 5], dtype=np.int32), n), i32),
            "response_ids": _list(offsets, rng.integers(4, 100, T, dtype=np.int32), i32),
            "response_text": pa.array(["(synthetic)"] * n),
            "reward": pa.array(rng.integers(0, 2, n).astype(np.float32)),
            "correct": pa.array(correct := rng.random(n) < 0.5),
            "verdict": pa.array(np.where(correct, "pass", "wrong_answer").tolist()),
            "advantage": pa.array(rng.normal(0, 1, n).astype(np.float32)),
            "logp_old": _list(offsets, logp, f32),
            "logp_behavior": _list(offsets, behavior, f32, mask=~seeded),
            "entropy": _list(offsets, entropy, f32),
            "ratio": _list(offsets, ratio_, f32),
            "clipped_low": _list(offsets, clipped_low, b), "clipped_high": _list(offsets, clipped_high, b),
            "loss_mask": _list(offsets, loss_mask, b),
            "finish_reason": pa.array(["stop"] * n),
            "source_len": pa.nulls(n, pa.int32()), "source_correct": pa.nulls(n, pa.bool_()),
        }
        table = pa.Table.from_arrays([cols[f.name] for f in ROLLOUT_SCHEMA], schema=ROLLOUT_SCHEMA)
        path = rollout_path(run_dir, step)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path, compression="zstd")
        written += T
        rows_total += n
        step += 1
    size = sum(p.stat().st_size for p in (run_dir / "rollouts").iterdir())
    return {"tokens": written, "rows": rows_total, "files": step, "bytes": size,
            "write_s": time.perf_counter() - t0}


# ---------------------------------------------------------------------------------------------- sides (children)
def _peak_rss_mb() -> float:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0   # Linux: KiB


def tsanalysis_side(*, run_dir: str) -> dict:
    from tsanalysis.tables import positions_tables
    t0 = time.perf_counter()
    tables = positions_tables(run_dir, n_bins=N_BINS)
    wall = time.perf_counter() - t0
    bins = tables["bins"]
    allrows = bins[bins.series == "all"]
    return {"wall_s": wall, "peak_rss_mb": _peak_rss_mb(), "tokens": int(allrows["tokens"].sum()),
            "entropy_sum": float((allrows["entropy_mean"] * allrows["entropy_count"]).sum()),
            "clipped": int(allrows["clipped_low"].sum() + allrows["clipped_high"].sum())}


def decode_side(*, run_dir: str) -> dict:
    """Only the Parquet decode the streaming side does (same columns, same record batches): its floor."""
    from tsanalysis import io
    cols = ["entropy", "clipped_low", "clipped_high", "loss_mask", "seed_len"]
    t0 = time.perf_counter()
    n = 0
    for _, _, batch in io.iter_batches(run_dir, columns=cols):
        n += batch.num_rows
    return {"wall_s": time.perf_counter() - t0, "peak_rss_mb": _peak_rss_mb(), "rows": n}


def _load_arrays(run_dir: str) -> list[tuple]:
    """Per file: entropy f32, clipped_low, clipped_high, loss_mask (bool), offsets, seed_len (in memory)."""
    import pyarrow.parquet as pq

    from contracts.records import list_steps
    out = []
    for _, path in list_steps(run_dir):
        t = pq.read_table(path, columns=["entropy", "clipped_low", "clipped_high", "loss_mask", "seed_len"])
        ent = t.column("entropy").combine_chunks()
        offsets = ent.offsets.to_numpy().astype(np.int64)
        flat = [t.column(c).combine_chunks().flatten().to_numpy(zero_copy_only=False)
                for c in ("entropy", "clipped_low", "clipped_high", "loss_mask")]
        out.append((*flat, offsets - offsets[0], t.column("seed_len").to_numpy().astype(np.int64)))
    return out


def bare_pass(arrays: list[tuple], n_bins: int = N_BINS) -> dict:
    """Sums and counts per (series, bin): 2*n_bins keys (continuation bins, then seed bins); all = their sum."""
    K = 2 * n_bins
    acc = {k: np.zeros(K) for k in ("tokens", "ent_sum", "ent_cnt", "loss", "lo", "hi")}
    for ent, lo, hi, loss, offsets, seed_len in arrays:
        lens = np.diff(offsets)
        resp = np.repeat(np.arange(lens.size), lens)
        t = np.arange(offsets[-1]) - offsets[:-1][resp]
        key = (n_bins * t) // lens[resp] + n_bins * (t < seed_len[resp])
        fin = np.isfinite(ent)
        acc["tokens"] += np.bincount(key, minlength=K)
        acc["ent_sum"] += np.bincount(key[fin], weights=ent[fin], minlength=K)
        acc["ent_cnt"] += np.bincount(key[fin], minlength=K)
        lk = key[loss]
        acc["loss"] += np.bincount(lk, minlength=K)
        acc["lo"] += np.bincount(lk, weights=lo[loss], minlength=K)
        acc["hi"] += np.bincount(lk, weights=hi[loss], minlength=K)
    return acc


def bare_side(*, run_dir: str) -> dict:
    arrays = _load_arrays(run_dir)   # not timed: the bare pass reads from memory
    rss_loaded = _peak_rss_mb()
    t0 = time.perf_counter()
    acc = bare_pass(arrays)
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "peak_rss_mb": _peak_rss_mb(), "rss_after_load_mb": rss_loaded,
            "tokens": int(acc["tokens"].sum()), "entropy_sum": float(acc["ent_sum"].sum()),
            "clipped": int(acc["lo"].sum() + acc["hi"].sum())}


# ---------------------------------------------------------------------------------------------- parent
def run(ctx) -> BenchResult:
    tokens = int(1e6) if ctx.quick and ctx.tokens >= 1e8 else int(ctx.tokens)
    mean_len = 256 if tokens < 1e7 else 1024
    rows_per_file = 128 if tokens < 1e7 else 512
    params = {"tokens": tokens, "mean_len": mean_len, "rows_per_file": rows_per_file, "n_bins": N_BINS}
    res = BenchResult(NAME, "tsanalysis positions (streaming Parquet) vs a bare numpy bincount pass over the same "
                      f"arrays in memory, seconds; targets <= {TARGET_RATIO:g}x and peak RSS < 2 GB", params=params)
    run_dir = Path(ctx.tmp) / f"bench_binning_{tokens}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    try:
        ctx.log(f"  writing {tokens:.3g} tokens of synthetic rollouts to {run_dir} ...")
        res.info.update({f"synth_{k}": v for k, v in write_synthetic_run(run_dir, tokens=tokens, mean_len=mean_len,
                                                                           rows_per_file=rows_per_file).items()})
        outs: dict[str, list[dict]] = {"tsanalysis": [], "numpy bare": [], "parquet decode only": []}

        def side(name, target):
            def f():
                o = call_in_subprocess(target, {"run_dir": str(run_dir)}, threads=ctx.threads)
                outs[name].append(o)
                return o["wall_s"]
            return f

        res.sides = alternate({"tsanalysis": side("tsanalysis", "perf.bench_binning:tsanalysis_side"),
                               "numpy bare": side("numpy bare", "perf.bench_binning:bare_side"),
                               "parquet decode only": side("parquet decode only",
                                                           "perf.bench_binning:decode_side")},
                              units="s", repeats=ctx.repeats, warmup=0, log=ctx.log)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    ts, bare, decode = res.sides
    rss = [o["peak_rss_mb"] for o in outs["tsanalysis"]]
    res.sides.append(Side("tsanalysis peak RSS", "MiB", rss))
    res.sides.append(Side("numpy bare peak RSS", "MiB", [o["peak_rss_mb"] for o in outs["numpy bare"]]))
    res.checks.append(Check("tsanalysis / bare numpy seconds", ratio(ts.median, bare.median), "<=", TARGET_RATIO,
                            "median tsanalysis / median bare"))
    res.checks.append(Check("tsanalysis peak RSS (MiB)", max(rss), "<=", TARGET_RSS_MB,
                            "max ru_maxrss of the streaming child"))
    a, b = outs["tsanalysis"][0], outs["numpy bare"][0]
    agree = a["tokens"] == b["tokens"] == res.info["synth_tokens"] and a["clipped"] == b["clipped"] and math.isclose(
        a["entropy_sum"], b["entropy_sum"], rel_tol=1e-6)
    res.info.update({"tokens_per_s_tsanalysis": tokens / ts.median, "tokens_per_s_bare": tokens / bare.median,
                     "results_agree": agree,
                     "floor_ratio_decode_plus_bare": ratio(decode.median + bare.median, bare.median)})
    return res
