"""The analyses behind the ``tsanalysis`` commands, as functions that return tables (no printing, no writing).

    positions_tables(run_dir, steps=None, n_bins=10, loss_tokens_only=False)   # Figures 3 and 4
    truncation_tables(run_dir, steps=None, top=30)                             # Figure 5
    zero_adv_tables(run_dir, steps=None)                                       # Lemma 4, observed vs predicted
    lemma4_tables(p, G, simulate=0, seed=0, seed_probs=None)                   # Lemma 4, pure
    mismatch_tables_for_run(run_dir, steps=None, n_bins=10, width=64, ...)     # Proposition 2
    seeds_tables(run_dir, steps=None, n_bins=5, width=64, n_boot=2000)          # restart values of the seeds

Each returns ``{table name: DataFrame}``, the tables ``tsanalysis.io.write_results`` writes (the CLI writes
them with its settings; ``figures.make_all`` caches them the same way). Runs are streamed file by file in record
batches through ``tsanalysis.io`` (memory O(bins + one batch)); the estimators are ``tsanalysis.core``'s. A bad
run directory or rollout file raises ``tsanalysis.io.RecordsError`` naming the file and column.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import numpy as np
import pandas as pd

from scoring.verdict import UNGRADED_VERDICTS

from . import io
from .core import bins as B
from .core import lemma4 as L4
from .core import truncation as TR
from .core import seed_lift as SL
from .core.mismatch import MismatchAccumulator

__all__ = ["SERIES", "positions_tables", "truncation_tables", "zero_adv_tables", "lemma4_tables",
           "mismatch_tables_for_run", "seeds_tables"]

SERIES = ("all", "seed", "continuation", "seeded", "seeded_continuation")


# ---- positions (Figures 3 and 4) -------------------------------------------------------------------------------
def positions_tables(run_dir, *, steps=None, n_bins: int = 10, loss_tokens_only: bool = False) -> dict[str, pd.DataFrame]:
    """Per-position entropy and clipping, streamed over the run (memory O(bins + responses)).

    Series: ``all`` tokens, ``seed`` tokens (t < seed_len) and ``continuation`` tokens (t >= seed_len, which
    includes every token of unseeded responses), so seed + continuation = all; ``seeded`` and
    ``seeded_continuation`` restrict all and continuation to seeded responses (seed_len > 0), so that in a
    Thinking Seeds run the refresh steps' unseeded responses do not dilute Figure 4 (seed + seeded_continuation
    = seeded). Positions are normalised by the final response length (seed + continuation), as in Figure 4.

    Denominators: ``tokens`` counts every response token; the entropy mean is over tokens with a finite entropy
    (the trainer writes NaN for rows that never reached the loss, e.g. groups dropped by dynamic sampling;
    ``loss_tokens_only`` restricts it further to loss_mask tokens); clipping rates are per 10^4 tokens that
    entered the policy loss (loss_mask), since a clip can only be active there (``loss_tokens`` column).
    """
    cols = ["entropy", "clipped_low", "clipped_high", "loss_mask", "seed_len"]
    K = n_bins
    # One pass per record batch: every token gets a single key, bin + K * region (B.seeded_position_keys), so
    # each quantity is one bincount over 3K keys and every series is a sum of regions (measured 3.5x faster than binning each series
    # and quantity separately; the bin index is computed once per batch).
    acc = {q: np.zeros(3 * K, dtype=np.float64 if q == "entropy_sum" else np.int64)
           for q in ("tokens", "entropy_sum", "entropy_count", "loss_tokens", "clipped_low", "clipped_high")}
    takeover: list[np.ndarray] = []   # [2, rows] blocks
    responses = seed_tokens = cont_tokens = 0
    for _, path, batch in io.iter_batches(run_dir, columns=cols, steps=steps):
        lens = io.token_lengths(batch, ["entropy", "clipped_low", "clipped_high", "loss_mask"], path)
        seed_len = io.scalar_column(batch, "seed_len", fill=0).astype(np.int64)
        if np.any(seed_len > lens) or np.any(seed_len < 0):
            row = int(np.flatnonzero((seed_len > lens) | (seed_len < 0))[0])
            raise io.RecordsError(f"{path}: row {row} has seed_len {seed_len[row]} outside [0, {lens[row]}] "
                                  f"(its response length)")
        ent, offsets = io.list_column(batch, "entropy", dtype=np.float32)
        lo = io.list_column(batch, "clipped_low", dtype=bool, fill=False)[0]
        hi = io.list_column(batch, "clipped_high", dtype=bool, fill=False)[0]
        loss = io.list_column(batch, "loss_mask", dtype=bool, fill=False)[0]
        key = B.seeded_position_keys(offsets, seed_len, n_bins=K)
        acc["tokens"] += np.bincount(key, minlength=3 * K)
        counted = np.isfinite(ent)
        if loss_tokens_only:
            counted &= loss
        acc["entropy_sum"] += np.bincount(key[counted], weights=ent[counted], minlength=3 * K)
        acc["entropy_count"] += np.bincount(key[counted], minlength=3 * K)
        acc["loss_tokens"] += np.bincount(key[loss], minlength=3 * K)
        acc["clipped_low"] += np.bincount(key[lo & loss], minlength=3 * K)
        acc["clipped_high"] += np.bincount(key[hi & loss], minlength=3 * K)
        responses += len(lens)
        seed_tokens += int(seed_len.sum())
        cont_tokens += int((lens - seed_len).sum())
        s = seed_len > 0
        takeover.append(np.stack([seed_len[s], lens[s]]))   # [2, seeded rows]: seed length, final length
    k = np.arange(n_bins)
    regions = {"all": (0, 1, 2), "seed": (1,), "continuation": (0, 2), "seeded": (0, 1), "seeded_continuation": (0,)}
    frames = []
    for series in SERIES:
        q = {name: sum(a[r * K:(r + 1) * K] for r in regions[series]) for name, a in acc.items()}
        with np.errstate(invalid="ignore", divide="ignore"):
            ent_mean = np.where(q["entropy_count"] > 0, q["entropy_sum"] / np.maximum(q["entropy_count"], 1), np.nan)
        frames.append(pd.DataFrame({
            "series": series, "bin": k, "pos_lo": k / n_bins, "pos_hi": (k + 1) / n_bins,
            "tokens": q["tokens"], "entropy_mean": ent_mean,
            "entropy_count": q["entropy_count"], "loss_tokens": q["loss_tokens"],
            "clipped_low": q["clipped_low"], "clipped_high": q["clipped_high"],
            "clip_low_per_1e4": B.per_1e4(q["clipped_low"], q["loss_tokens"]),
            "clip_high_per_1e4": B.per_1e4(q["clipped_high"], q["loss_tokens"]),
            "clip_per_1e4": B.per_1e4(q["clipped_low"] + q["clipped_high"], q["loss_tokens"]),
        }))
    sl, fl = np.concatenate(takeover, axis=1) if takeover else np.zeros((2, 0), dtype=np.int64)
    tk = sl / np.maximum(fl, 1)   # takeover point: seed_len / final length
    have = tk.size > 0
    summary = pd.DataFrame([{
        "responses": responses, "seeded_responses": int(tk.size), "seed_tokens": seed_tokens,
        "continuation_tokens": cont_tokens,
        "takeover_mean": float(tk.mean()) if have else np.nan,
        "takeover_median": float(np.median(tk)) if have else np.nan,
        "takeover_std": float(tk.std()) if have else np.nan,
        "takeover_min": float(tk.min()) if have else np.nan, "takeover_max": float(tk.max()) if have else np.nan,
    }])
    # where the cut falls, as a fraction of the final length (the same bins; seed_len == L goes to the last bin)
    hist_idx = np.minimum((n_bins * sl) // np.maximum(fl, 1), n_bins - 1)
    hist = pd.DataFrame({"bin": k, "pos_lo": k / n_bins, "pos_hi": (k + 1) / n_bins,
                         "responses": np.bincount(hist_idx, minlength=n_bins)})
    return {"bins": pd.concat(frames, ignore_index=True), "takeover": summary, "takeover_hist": hist}


# ---- truncation tokens (Figure 5) ------------------------------------------------------------------------------
def truncation_tables(run_dir, *, steps=None, top: int = 30) -> dict[str, pd.DataFrame]:
    """Counts of the tokens at the cut, per truncation rule (one per row with a trunc_rule)."""
    counts: Counter = Counter()
    for _, _, batch in io.iter_batches(run_dir, columns=["trunc_rule", "trunc_token_text"], steps=steps):
        rules = io.scalar_column(batch, "trunc_rule")
        texts = io.scalar_column(batch, "trunc_token_text")
        for r, t in zip(rules, texts):
            if r is not None and r == r:   # skip null rules (NaN/None)
                counts[(str(r), "" if t is None else str(t))] += 1
    if not counts:
        raise io.RecordsError(f"'{run_dir}': no rows with a trunc_rule in the selected steps "
                              f"(truncation points exist only in Thinking Seeds runs)")
    return {"tokens": TR.truncation_histogram_from_counts(counts, top=top),
            "categories": TR.category_shares_from_counts(counts)}


# ---- zero-advantage groups (Lemma 4) ---------------------------------------------------------------------------
def zero_adv_tables(run_dir, *, steps=None) -> dict[str, pd.DataFrame]:
    """Observed vs predicted zero-advantage groups per step and kind, and over all selected steps."""
    cols = ["step", "prompt_id", "sample_idx", "correct", "reward", "variant"]
    groups, current, parts = [], None, []

    def flush():
        if parts:
            df = pd.concat(parts, ignore_index=True)
            groups.append(L4.group_table(df["step"], df["prompt_id"], df["correct"], df["reward"], df["variant"],
                                         sample_idx=df["sample_idx"]))
            parts.clear()

    for _, path, batch in io.iter_batches(run_dir, columns=cols, steps=steps):
        if path != current:   # groups never span files (one file per step): group file by file
            flush()
            current = path
        parts.append(pd.DataFrame({c: io.scalar_column(batch, c) for c in cols}))
    flush()
    g = pd.concat(groups, ignore_index=True)
    if g.empty:
        raise io.RecordsError(f"'{run_dir}': the selected rollout files hold no rows")
    return {"groups": g, "by_step": L4.zero_adv_from_groups(g, by_step=True),
            "summary": L4.zero_adv_from_groups(g, by_step=False)}


def lemma4_tables(p: Sequence[float], G: int, *, simulate: int = 0, seed: int = 0,
                  seed_probs: Sequence[float] | None = None) -> dict[str, pd.DataFrame]:
    """The pure Lemma 4 table for the given p (plus a Monte Carlo check and shared-vs-independent seeds)."""
    out = {"lemma4": L4.lemma4_table(p, G)}
    if simulate:
        sim = L4.simulate_zero_adv(p, G, n_groups=simulate, seed=seed)
        out["lemma4"] = out["lemma4"].merge(sim.drop(columns=["G", "zero_adv_exact", "all_wrong_exact"]), on="p")
    if seed_probs:
        r = L4.shared_vs_independent(np.asarray(seed_probs), G)
        out["shared_seeds"] = pd.DataFrame([{"G": G, "seed_probs": ",".join(f"{x:g}" for x in seed_probs),
                                             **{k: float(v) for k, v in r.items()}}])
    return out


# ---- seed-token mismatch (Proposition 2) -----------------------------------------------------------------------
def mismatch_tables_for_run(run_dir, *, steps=None, n_bins: int = 10, width: int = 64,
                            thresholds: Sequence[float] = (0.01, 0.1, 1.0),
                            relative_to: str = "seed") -> dict[str, pd.DataFrame]:
    """Accumulated logp_old − logp_behavior over the seed tokens of every seeded row, streamed."""
    acc = MismatchAccumulator(n_bins=n_bins, width=width, thresholds=thresholds, relative_to=relative_to)
    for _, path, batch in io.iter_batches(run_dir, columns=["seed_len", "logp_old", "logp_behavior"], steps=steps):
        seed_len = io.scalar_column(batch, "seed_len", fill=0).astype(np.int64)
        rows = np.flatnonzero(seed_len > 0)
        if rows.size == 0:
            continue
        sub = batch.take(rows)
        seed_len = seed_len[rows]
        lens = io.token_lengths(sub, ["logp_old", "logp_behavior"], path)
        if np.any(seed_len > lens):
            r = int(np.flatnonzero(seed_len > lens)[0])
            raise io.RecordsError(f"{path}: a seeded row has seed_len {seed_len[r]} but {lens[r]} log-probs")
        old, offsets = io.list_column(sub, "logp_old")
        beh, _ = io.list_column(sub, "logp_behavior")
        m = B.seed_token_mask(offsets, seed_len)
        seed_offsets = np.concatenate([[0], np.cumsum(seed_len)])
        acc.add_flat((old - beh)[m], seed_offsets, final_lens=lens)
    if acc.responses == 0 and acc.skipped == 0:
        raise io.RecordsError(f"'{run_dir}': no seeded rows (seed_len > 0) in the selected steps")
    return acc.tables()


# ---- restart values of the seeds (issue #26: lift, rescue, zero advantage) --------------------------------------
def seeds_tables(run_dir, *, steps=None, n_bins: int = 5, width: int = 64, n_boot: int = 2000,
                 seed: int = 0) -> dict[str, pd.DataFrame]:
    """The seeded rows' restart values against their prompts' fresh groups (``tsanalysis.core.seed_lift``):
    ``summary`` (lift, rescue, zero advantage over the selected steps), ``by_step``, lift by cut depth
    (``by_depth``: fraction of the source response, ``n_bins`` bins; ``by_depth_tokens``: seed_len in bins of
    ``width`` tokens), by seed age (``by_age``), by token type at the cut (``by_token``, per rule), by the source's
    verdict (``by_source``), the zero-advantage comparison with Lemma 4 (``zero_adv``) and one row per seed
    (``seeds``). Runs written before the trainer recorded ``source_len`` / ``source_correct`` have no fresh value:
    a RecordsError naming the column."""
    cols = ["step", "prompt_id", "sample_idx", "variant", "seed_step", "seed_len", "source_len", "trunc_rule",
            "trunc_token_text", "correct", "verdict", "source_correct"]
    for _, path in io.select_steps(run_dir, steps):   # before any reading: old records say what they lack
        if lacking := io.missing_columns(path, ("source_len", "source_correct")):
            raise io.RecordsError(f"{path}: no column {' or '.join(repr(c) for c in lacking)}: the run was written "
                                  f"before seeded rows recorded their source response's verdict; `tsanalysis seeds` "
                                  f"needs a run of this version (train it again)")
    parts = []
    for _, path, batch in io.iter_batches(run_dir, columns=cols, steps=steps):
        variant = io.scalar_column(batch, "variant")
        rows = np.flatnonzero(variant == "seed")
        if rows.size == 0:
            continue
        sub = batch.take(rows)
        d = pd.DataFrame({c: io.scalar_column(sub, c) for c in cols if c not in ("correct", "source_correct")})
        graded = ~np.isin(d["verdict"].to_numpy(object), list(UNGRADED_VERDICTS))
        d["correct"] = np.where(graded, io.scalar_column(sub, "correct").astype(float), np.nan)
        if d["seed_step"].isna().any() or d["source_len"].isna().any():
            raise io.RecordsError(f"{path}: a seed row without seed_step or source_len (both are set on every seed "
                                  f"row the trainer writes)")
        src = io.scalar_column(sub, "source_correct")
        d["source_correct"] = np.array([np.nan if x is None else float(x) for x in src], dtype=float)
        parts.append(d)
    if not parts:
        raise io.RecordsError(f"'{run_dir}': no seeded rows (variant 'seed') in the selected steps "
                              f"(seeded steps exist only in Thinking Seeds runs, after the first refresh)")
    rows = pd.concat(parts, ignore_index=True)
    if rows["source_correct"].isna().all():
        raise io.RecordsError(f"'{run_dir}': no seed row's source response was graded (the run was trained with "
                              f"seed_grade_sources=false, or every source was ungraded), so there is no fresh value "
                              f"to compare the continuations with; train with seed_grade_sources=true")
    seeds = SL.seed_table(rows.drop(columns=["variant", "verdict"]))
    seeds["depth_bin"] = SL.depth_bin(seeds["seed_len"], seeds["source_len"], n_bins)
    seeds["depth_lo"], seeds["depth_hi"] = seeds["depth_bin"] / n_bins, (seeds["depth_bin"] + 1) / n_bins
    seeds["tokens_lo"] = (seeds["seed_len"] // width) * width
    seeds["source"] = seeds["source_correct"].map({1.0: "correct", 0.0: "wrong"}).fillna("ungraded")
    kw = {"n_boot": n_boot, "seed": seed}
    by_step = pd.concat([SL.lift_summary(g, **kw).assign(step=s) for s, g in seeds.groupby("step")],
                        ignore_index=True)
    return {"summary": SL.lift_summary(seeds, **kw),
            "by_step": by_step[["step", *[c for c in by_step.columns if c != "step"]]],
            "by_depth": SL.lift_bins(seeds, ["depth_bin", "depth_lo", "depth_hi"], **kw),
            "by_depth_tokens": SL.lift_bins(seeds, ["tokens_lo"], **kw).assign(width=width),
            "by_age": SL.lift_bins(seeds, ["age"], **kw),
            "by_token": SL.lift_bins(seeds, ["trunc_rule", "category"], **kw),
            "by_source": SL.lift_bins(seeds, ["source"], **kw),
            "zero_adv": SL.zero_adv_comparison(seeds),
            "seeds": seeds}
