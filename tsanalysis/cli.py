"""The ``tsanalysis`` command: run analyses → result tables in ``results/analysis/<run>/<command>/``.

    tsanalysis positions  RUN_DIR [--steps a:b] [--bins 10] [--loss-tokens-only] [--out DIR]
    tsanalysis truncation RUN_DIR [--steps a:b] [--top 30] [--out DIR]
    tsanalysis zero-adv   RUN_DIR [--steps a:b] [--out DIR]
    tsanalysis zero-adv   --p 0.1,0.5 --G 8 [--simulate N] [--seed S] [--seed-probs 0.1,0.9] [--out DIR]
    tsanalysis mismatch   RUN_DIR [--steps a:b] [--bins 10] [--width 64] [--thresholds 0.01,0.1,1]
                          [--relative-to seed|response] [--out DIR]
    tsanalysis relay      --early CKPT_A --final CKPT_B --benchmark NAME [--problems FILE] [--n 64] [--cut 0.5]
                          [--max-tokens N] [--temperature 1.0] [--top-p 1.0] [--seed S] [--limit K]
                          [--engine auto|hf|vllm] [--template NAME] [--batch-problems 8] [--out DIR]

Each command prints a short table and the paths it wrote (tables as Parquet and CSV, plus settings.json).
The ``*_tables`` functions below are the same analyses without the printing, for scripts and tests.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from contracts.records import parse_step_range

from . import io
from .core import bins as B
from .core import lemma4 as L4
from .core import truncation as TR
from .core.mismatch import MismatchAccumulator


class UsageError(ValueError):
    """Bad command-line input; printed without a traceback."""


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


# ---- printing and settings -------------------------------------------------------------------------------------
def _fmt(df: pd.DataFrame, cols=None, max_rows: int = 40) -> str:
    d = df if cols is None else df[[c for c in cols if c in df.columns]]
    return d.head(max_rows).to_string(index=False, float_format=lambda x: f"{x:.4g}")


def _settings(args: argparse.Namespace, run_dir=None, selected=None) -> dict:
    a = {k: v for k, v in vars(args).items() if k not in ("func",) and not k.startswith("_")}
    s = {"command": args.command, "args": a}
    if run_dir is not None:
        s["run_dir"] = str(Path(run_dir).resolve())
        s["steps"] = {"range": args.steps, "selected": [st for st, _ in selected]}
    return s


def _out_dir(args, name: str) -> Path:
    return Path(args.out) if args.out else io.default_out(name, args.command)


def _finish(args, tables, run_dir=None) -> Path:
    selected = io.select_steps(run_dir, args._steps) if run_dir is not None else None
    out = _out_dir(args, io.run_name(run_dir) if run_dir is not None else "lemma4")
    paths = io.write_results(out, tables, _settings(args, run_dir, selected))
    print(f"\nwrote {len(paths)} files to {out}/: " + ", ".join(p.name for p in paths))
    return out


# ---- command handlers ------------------------------------------------------------------------------------------
def _cmd_positions(args) -> None:
    t = positions_tables(args.run_dir, steps=args._steps, n_bins=args.bins, loss_tokens_only=args.loss_tokens_only)
    bins = t["bins"]
    seeded = int(t["takeover"]["seeded_responses"].iloc[0]) > 0
    cols = ["series", "bin", "tokens", "entropy_mean", "clip_low_per_1e4", "clip_high_per_1e4"]
    print(_fmt(bins if seeded else bins[bins["series"] == "all"], cols))
    tk = t["takeover"].iloc[0]
    print(f"\nresponses {int(tk['responses'])}, seeded {int(tk['seeded_responses'])}"
          + (f", takeover point (seed_len / final length) mean {tk['takeover_mean']:.3f}" if seeded else ""))
    _finish(args, t, args.run_dir)


def _cmd_truncation(args) -> None:
    t = truncation_tables(args.run_dir, steps=args._steps, top=args.top)
    for rule, df in t["tokens"].groupby("rule"):
        print(f"rule {rule}: {int(df['rule_total'].iloc[0])} cuts; top tokens")
        print(_fmt(df, ["rank", "label", "count", "share", "category"], max_rows=10))
    cats = t["categories"].pivot(index="category", columns="rule", values="share").reindex(list(TR.CATEGORIES))
    print("\ncategory shares\n" + cats.to_string(float_format=lambda x: f"{x:.3f}"))
    _finish(args, t, args.run_dir)


def _cmd_zero_adv(args) -> None:
    if args.run_dir is None and args.p is None:
        raise UsageError("zero-adv needs a RUN_DIR or --p (with --G) for the pure Lemma 4 table")
    tables = {}
    if args.p is not None:
        tables.update(lemma4_tables(args.p, args.G, simulate=args.simulate, seed=args.seed,
                                    seed_probs=args.seed_probs))
        print(_fmt(tables["lemma4"]))
        if "shared_seeds" in tables:
            print("\nshared vs independent seeds\n" + _fmt(tables["shared_seeds"]))
    elif args.seed_probs or args.simulate:
        raise UsageError("--simulate and --seed-probs go with --p")
    if args.run_dir is not None:
        t = zero_adv_tables(args.run_dir, steps=args._steps)
        tables.update(t)
        print(_fmt(t["summary"], ["kind", "groups", "success_mean", "zero_adv_obs", "zero_adv_obs_se",
                                  "groups_pred", "zero_adv_obs_on_pred", "zero_adv_pred", "all_wrong_obs",
                                  "all_wrong_pred"]))
    _finish(args, tables, args.run_dir)


def _cmd_mismatch(args) -> None:
    t = mismatch_tables_for_run(args.run_dir, steps=args._steps, n_bins=args.bins, width=args.width,
                                thresholds=args.thresholds, relative_to=args.relative_to)
    print(_fmt(t["relative"], ["bin", "count", "log_ratio_mean", "kl_k3_mean", "cum_log_ratio_mean",
                               "cum_abs_log_ratio_mean", "cum_kl_k3_mean"]))
    print("\nfirst crossing of the running sums\n" + _fmt(t["crossing"], ["quantity", "threshold", "responses",
                                                                         "frac_crossed", "pos_median",
                                                                         "rel_seed_median"]))
    _finish(args, t, args.run_dir)


def _cmd_relay(args) -> None:
    from . import relay   # imports torch/transformers lazily: only this command needs them

    relay.main_from_args(args)


# ---- argument parsing ------------------------------------------------------------------------------------------
def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _positive_floats(text: str) -> list[float]:
    v = _floats(text)
    if not v or any(not x > 0 for x in v):
        raise argparse.ArgumentTypeError(f"expected positive numbers, got {text!r}")
    return v


def _nonneg_int(text: str) -> int:
    return 0 if text.strip() == "0" else _positive_int(text)


def _probs(text: str) -> list[float]:
    v = _floats(text)
    if not v or any(not 0 <= x <= 1 for x in v):
        raise argparse.ArgumentTypeError(f"probabilities must lie in [0, 1], got {text!r}")
    return v


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def _run_args(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", nargs=None if required else "?",
                   help="run directory written by trainer.train (holds rollouts/step_NNNNNN.parquet)")
    p.add_argument("--steps", default=None, help="half-open step range a:b ('a:', ':b' or a single step)")
    p.add_argument("--out", default=None, help="output folder (default results/analysis/<run>/<command>/)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="tsanalysis", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("positions", help="entropy and clipped tokens per relative-position bin (Figures 3, 4)")
    _run_args(p)
    p.add_argument("--bins", type=_positive_int, default=10, help="number of relative-position bins")
    p.add_argument("--loss-tokens-only", action="store_true", help="entropy over loss_mask tokens only (clipping always is)")
    p.set_defaults(func=_cmd_positions)

    p = sub.add_parser("truncation", help="histogram of the tokens at the truncation points (Figure 5)")
    _run_args(p)
    p.add_argument("--top", type=_positive_int, default=30, help="tokens listed per rule")
    p.set_defaults(func=_cmd_truncation)

    p = sub.add_parser("zero-adv", help="zero-advantage groups: observed vs Lemma 4, or the pure Lemma 4 table")
    _run_args(p, required=False)
    p.add_argument("--p", type=_probs, default=None, help="success probabilities for the pure table, e.g. 0.1,0.5")
    p.add_argument("--G", type=_positive_int, default=8, help="group size for --p (default 8)")
    p.add_argument("--simulate", type=_nonneg_int, default=0, metavar="N", help="also simulate N groups per p")
    p.add_argument("--seed", type=int, default=0, help="random seed of the simulation")
    p.add_argument("--seed-probs", type=_probs, default=None,
                   help="per-seed success probabilities: shared-seed vs independent-seed zero-advantage probability")
    p.set_defaults(func=_cmd_zero_adv)

    p = sub.add_parser("mismatch", help="accumulated behavior/current divergence on seed tokens (Proposition 2)")
    _run_args(p)
    p.add_argument("--bins", type=_positive_int, default=10, help="relative-position bins")
    p.add_argument("--width", type=_positive_int, default=64, help="absolute-position bin width in tokens")
    p.add_argument("--thresholds", type=_positive_floats, default=[0.01, 0.1, 1.0],
                   help="crossing thresholds of the running sums (nats)")
    p.add_argument("--relative-to", choices=("seed", "response"), default="seed",
                   help="relative positions as t/seed_len (default) or t/final length")
    p.set_defaults(func=_cmd_mismatch)

    p = sub.add_parser("relay", help="relay inference: early checkpoint writes a prefix, the final one continues")
    p.add_argument("--early", required=True, help="early checkpoint (a Hugging Face model directory)")
    p.add_argument("--final", required=True, help="final checkpoint")
    p.add_argument("--benchmark", default=None,
                   help="benchmark name from eval.benchmarks: its problems, grader and default template")
    p.add_argument("--problems", default=None,
                   help="problems file (JSONL) read by the --benchmark's loader instead of its default problems")
    p.add_argument("--n", type=_positive_int, default=64, help="samples per problem (relay and final-only each)")
    p.add_argument("--cut", type=float, default=0.5, help="prefix = first floor(cut*len) tokens of the early response")
    p.add_argument("--max-tokens", type=_positive_int, default=None, help="response budget (default: benchmark's)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=_positive_int, default=None, help="only the first K problems")
    p.add_argument("--engine", choices=("auto", "hf", "vllm"), default="auto")
    p.add_argument("--template", default=None, help="prompt template (default: the benchmark's)")
    p.add_argument("--batch-problems", type=_positive_int, default=8,
                   help="problems per generate call (n samples each); part of the sampling seed")
    p.add_argument("--out", default=None, help="output folder (default results/analysis/<final run>/relay/<tag>/)")
    p.set_defaults(func=_cmd_relay)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        args._steps = parse_step_range(getattr(args, "steps", None))
    except ValueError as e:
        ap.error(str(e))
    try:
        args.func(args)
    except (io.RecordsError, UsageError) as e:
        print(f"tsanalysis {args.command}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
