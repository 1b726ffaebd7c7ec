"""The ``tsanalysis`` command: run analyses → result tables in ``results/analysis/<run>/<command>/``.

    tsanalysis positions  RUN_DIR [--steps a:b] [--bins 10] [--loss-tokens-only] [--out DIR]
    tsanalysis truncation RUN_DIR [--steps a:b] [--top 30] [--out DIR]
    tsanalysis support    --eval-dir DIR [--models A,B,...] [--benchmarks a,b] [--relay DIR] [--likelihood]
                          [--paths A=PATH,...] [--likelihood-samples 8] [--out DIR] [--config FILE]
    tsanalysis zero-adv   RUN_DIR [--steps a:b] [--out DIR]
    tsanalysis zero-adv   --p 0.1,0.5 --G 8 [--simulate N] [--seed S] [--seed-probs 0.1,0.9] [--out DIR]
    tsanalysis mismatch   RUN_DIR [--steps a:b] [--bins 10] [--width 64] [--thresholds 0.01,0.1,1]
                          [--relative-to seed|response] [--out DIR]
    tsanalysis seeds      RUN_DIR [--steps a:b] [--bins 5] [--width 64] [--by source [--refresh-interval T]]
                          [--out DIR]
    tsanalysis relay      --early CKPT_A --final CKPT_B --benchmarks NAME [--problems FILE] [--n 64] [--cut 0.5]
                          [--max-tokens N] [--temperature 1.0] [--top-p 1.0] [--top-k 0] [--seed S] [--limit K]
                          [--engine auto|hf|vllm] [--template NAME] [--batch-problems 8] [--out DIR]
                          [--allow-unisolated] [--config FILE]
    tsanalysis relay      --matrix RUN_DIR [--checkpoints STEP,...] --benchmarks NAME [the relay's sampling flags]
    tsanalysis scaling    --run RUN_DIR,... --eval-dir DIR [--models PREFIX,...] [--checkpoints NAME=STEP,...]
                          [--benchmarks a,b] [--compute tokens|wall] [--k K] [--n-boot N] [--seed S] [--out DIR]
    tsanalysis scaling    --points FILE.csv [--compute tokens|wall] [--k K] [--out DIR] [--config FILE]

Each command prints a short table and the paths it wrote (tables as Parquet and CSV, plus settings.json); the
relay's pass@k, the truncation shares and the seeds' values print as percentages (lifts in points), the files
keep fractions. ``--benchmarks`` is eval.run's flag (one name here: a relay folder holds one benchmark);
``--benchmark`` still works, the old spelling. ``relay``, ``support`` and ``scaling`` each read one validated
config (``tsanalysis.config.RelayConfig``, ``SupportConfig``, ``ScalingConfig``): their flags are generated from its fields (one per field,
the field's help), over an optional ``--config FILE`` (a flat YAML mapping of the fields).
This module is only the command line: the analyses are ``tsanalysis.tables`` (functions returning DataFrames,
for scripts, figures and tests), ``tsanalysis.relay.run_relay(cfg)``, ``tsanalysis.support.support_tables(cfg)`` and
``tsanalysis.scaling.scaling_tables(cfg)``.
Exit status (``contracts.commands``, the grammar every command shares): bad input raises
``tsanalysis.errors.UsageError``, ``tsanalysis.io.RecordsError`` or ``contracts.config.ConfigError``, printed here
as one ``error:`` line without a traceback (exit 2); a failure inside a command is one line, exit 1
(``THINKING_SEEDS_DEBUG=1`` prints the traceback); Ctrl-C exits 130 and SIGTERM 143, with one line (the relay's
JSONL files keep every finished chunk, and the same command resumes from them).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

import pandas as pd

from contracts.commands import EXIT_CODES_HELP, pct, points, run_command
from contracts.config import ConfigError, to_dict
from contracts.records import parse_step_range

from . import io
from .config import (RelayConfig, ScalingConfig, SupportConfig, add_flags, from_flags, validate_relay,
                     validate_scaling, validate_support)
from .core import seed_lift as SL
from .core import truncation as TR
from .errors import UsageError
from .tables import (lemma4_tables, mismatch_tables_for_run, positions_tables, seeds_tables, truncation_tables,
                     zero_adv_tables)


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


def format_passk(pk: pd.DataFrame) -> str:
    """The relay's pass@k table as printed: rates in %, relay - final in points with its paired 95 % interval."""
    shown = pd.DataFrame({
        "k": pk["k"], "problems": pk["problems"],
        **{f"{name} %": pk[name].map(lambda x: pct(x, unit="")) for name in ("early", "relay", "final")},
        "relay-final (points)": pk["diff"].map(points),
        "95% CI": [f"[{points(lo)}, {points(hi)}]" for lo, hi in zip(pk["diff_low"], pk["diff_high"])]})
    return "relay pass@k, % (unbiased estimator, mean over problems)\n" + shown.to_string(index=False)


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
        print(f"rule {rule}: {int(df['rule_total'].iloc[0])} cuts; top tokens (share of the rule's cuts, %)")
        print(_fmt(df.assign(share=df["share"].map(lambda x: pct(x, unit=""))),
                   ["rank", "label", "count", "share", "category"], max_rows=10))
    cats = t["categories"].pivot(index="category", columns="rule", values="share").reindex(list(TR.CATEGORIES))
    print("\ncategory shares, %\n" + cats.to_string(float_format=lambda x: pct(x, unit="")))
    _finish(args, t, args.run_dir)


def format_support(t: dict[str, pd.DataFrame]) -> str:
    """The support tables as printed: pass@k in %, expected problem counts with one decimal, crossover k."""
    out = []
    for (b, a, z), d in t["support"].groupby(["benchmark", "from", "to"], sort=False):
        shown = pd.DataFrame({
            "k": d["k"], f"{a} %": d["pass_from"].map(lambda x: pct(x, unit="")),
            f"{z} %": d["pass_to"].map(lambda x: pct(x, unit="")),
            **{name: [f"{v:.1f} [{lo:.1f}, {hi:.1f}]"
                      for v, lo, hi in zip(d[name], d[f"{name}_low"], d[f"{name}_high"])]
               for name in ("gained", "lost", "kept")},
            "retention %": d["retention"].map(lambda x: pct(x, unit=""))})
        out.append(f"{b}: {a} -> {z}, {int(d['problems'].iloc[0])} problems (expected counts, 95% CI)\n"
                   + shown.to_string(index=False))
    lines = []
    for r in t["crossover"].to_dict("records"):
        where, a, z, x = r["benchmark"], r["from"], r["to"], r["crossover_k"]
        ci = f"95% CI [{r['low']:.3g}, {r['high']:.3g}]; inf: beyond k = {r['k_max']}"
        if x == float("inf"):
            lines.append(f"{where}: {z} stays above {a} up to k = {r['k_max']}: no crossover ({ci})")
        elif x <= 1:
            lines.append(f"{where}: {z} does not lead {a} at k = 1 ({ci})")
        else:
            lines.append(f"{where}: {z}'s pass@k falls to {a}'s at k = {x:.3g} ({ci})")
    if lines:
        out.append("crossover k (interpolated in log2 k)\n" + "\n".join(lines))
    div = t["diversity"]
    if len(div):
        piv = div.pivot_table(index=["benchmark", "model"], columns="metric", values="mean", sort=False)
        out.append("mean per problem (distinct answers; entropy in nats)\n"
                   + piv.to_string(float_format=lambda x: f"{x:.3g}"))
    if "likelihood" in t and len(t["likelihood"]):
        lk = t["likelihood"]
        out.append("mean log-prob per token of correct samples\n"
                   + _fmt(lk, ["benchmark", "samples_of", "scored_by", "problems", "logp_mean", "vs_self"]))
    return "\n\n".join(out)


def _cmd_support(args) -> None:
    from .support import support_tables   # reads eval's files; torch only with --likelihood

    cfg = from_flags(SupportConfig, args)
    validate_support(cfg)
    tables = support_tables(cfg)
    print(format_support(tables))
    out = Path(cfg.out) if cfg.out else io.default_out(io.run_name(cfg.eval_dir), "support")
    settings = {"command": args.command, "args": {"command": args.command, **to_dict(cfg)},
                "eval_dir": str(Path(cfg.eval_dir).resolve())}
    paths = io.write_results(out, tables, settings)
    print(f"\nwrote {len(paths)} files to {out}/: " + ", ".join(p.name for p in paths))


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


def format_seeds(t: dict[str, pd.DataFrame]) -> str:
    """The seeds tables as printed: values and shares in %, lifts in points with their 95 % intervals."""
    s = t["summary"].iloc[0]
    out = [f"{int(s['seeds'])} seeds in {int(s['groups'])} seeded groups over {int(s['seeded_steps'])} steps; "
           f"value from the seeds {pct(s['value_seeded'])} vs fresh {pct(s['value_fresh'])}: lift "
           f"{points(s['lift_mean'])} points [{points(s['lift_low'])}, {points(s['lift_high'])}] "
           f"(std over groups {100 * s['lift_std']:.1f})",
           f"all-wrong fresh groups {int(s['all_wrong_fresh'])}, rescued by their seeds {int(s['rescued'])} "
           f"({pct(s['rescued_share'])} [{pct(s['rescued_low'], unit='')}, {pct(s['rescued_high'], unit='')}])"]

    def shown(df, keys):
        return pd.DataFrame({**{k: df[k] for k in keys}, "seeds": df["seeds"], "groups": df["groups"],
                             "seeded %": df["value_seeded"].map(lambda x: pct(x, unit="")),
                             "fresh %": df["value_fresh"].map(lambda x: pct(x, unit="")),
                             "lift (points)": df["lift_mean"].map(points),
                             "95% CI": [f"[{points(lo)}, {points(hi)}]"
                                        for lo, hi in zip(df["lift_low"], df["lift_high"])]}).to_string(index=False)

    out.append("lift by cut depth (seed_len / source response)\n" + shown(t["by_depth"], ["depth_lo", "depth_hi"]))
    out.append("lift by seed age (steps since the refresh)\n" + shown(t["by_age"], ["age"]))
    out.append("lift by token type at the cut\n" + shown(t["by_token"], ["trunc_rule", "category"]))
    if "by_source_age" in t:   # --by source
        out.append("lift by source age (the cycle's refresh step - the step whose policy wrote the seed)\n"
                   + shown(t["by_source_age"], ["source_age", "writers", "age_mean"]))
    z = t["zero_adv"]
    zs = pd.DataFrame({"kind": z["kind"], "groups": z["groups"],
                       **{f"{c} %": z[c].map(lambda x: pct(x, unit="")) for c in
                          ("zero_adv_obs", "zero_adv_obs_on_pred", "zero_adv_pred", "zero_adv_pred_plugin",
                           "zero_adv_pred_shared")},
                       "groups_pred": z["groups_pred"], "pair_corr": z["pair_corr"].map(lambda x: f"{x:.3g}")})
    out.append("zero-advantage groups: observed vs Lemma 4 (pred: independent seeds, unbiased from the prompt's "
               "other groups; pred_plugin: the same at the pooled rate; pred_shared: one seed per group, plug-in at "
               "the pair correlation)\n" + zs.to_string(index=False))
    return "\n\n".join(out)


def _refresh_interval(args) -> int:
    """--refresh-interval, else the run's own seed_refresh_interval (its config.yaml, written by the trainer)."""
    if args.refresh_interval is not None:
        return args.refresh_interval
    import yaml

    path = Path(args.run_dir) / "config.yaml"
    try:
        return int(yaml.safe_load(path.read_text())["seed_refresh_interval"])
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError) as exc:
        raise UsageError(f"--by source needs the run's refresh interval: {path} gives none ({type(exc).__name__}); "
                         f"pass --refresh-interval T") from None


def _cmd_seeds(args) -> None:
    t = seeds_tables(args.run_dir, steps=args._steps, n_bins=args.bins, width=args.width)
    if args.by == "source":
        t["by_source_age"] = SL.lift_by_source(t["seeds"], refresh_interval=_refresh_interval(args))
    print(format_seeds(t))
    _finish(args, t, args.run_dir)


def _ci(v: float, lo: float, hi: float, fmt: str = ".3g") -> str:
    return f"{v:{fmt}}" if not (lo == lo and hi == hi) else f"{v:{fmt}} [{lo:{fmt}}, {hi:{fmt}}]"


def format_scaling(t: dict[str, pd.DataFrame], compute: str) -> str:
    """The scaling fits as printed: one table per benchmark and score; A, R0 and RMSE in %, C_mid in compute units,
    each with its 95 % interval where there is one; a fit without an identified asymptote prints its reason."""
    from .scaling import COMPUTE_LABEL, NO_BENCHMARK

    fits, out = t["fits"], []
    for (bench, metric), d in fits.groupby(["benchmark", "metric"], sort=False):
        shown = pd.DataFrame({
            "method": d["method"], "seed": [("pooled" if pd.isna(x) else str(x)) for x in d["seed"]],
            "points": d["points"],
            "R0 %": [pct(r, unit="") + ("" if f else " (fit)") for r, f in zip(d["r0"], d["r0_fixed"])],
            "A %": [_ci(100 * a, 100 * lo, 100 * hi, ".1f") for a, lo, hi in zip(d["A"], d["A_low"], d["A_high"])],
            "C_mid": [_ci(c, lo, hi) for c, lo, hi in zip(d["C_mid"], d["C_mid_low"], d["C_mid_high"])],
            "B": [_ci(b, lo, hi, ".2f") for b, lo, hi in zip(d["B"], d["B_low"], d["B_high"])],
            "RMSE %": d["rmse"].map(lambda x: pct(x, digits=2, unit="")), "status": d["status"]})
        where = "" if bench == NO_BENCHMARK else f"{bench}: "
        out.append(f"{where}{metric} against {COMPUTE_LABEL[compute]} (R(C) = R0 + (A - R0) / (1 + (C_mid/C)^B), "
                   f"arXiv:2510.13786)\n" + shown.to_string(index=False))
    notes = [f"{r['method']} {'pooled' if pd.isna(r['seed']) else 'seed ' + str(r['seed'])} {r['metric']}: {r['note']}"
             for r in fits.to_dict("records") if r["status"] != "ok"]
    if notes:
        out.append("\n".join(notes))
    fixed = fits.loc[fits["r0_fixed"], "r0"]
    intervals = sorted(set(fits["interval"]))
    out.append(("R0 fixed to the step-0 (warm-up) score of each fit" if len(fixed) else
                "no step-0 point: R0 fitted") + "; 95 % intervals: " + "; ".join(intervals))
    return "\n\n".join(out)


def _cmd_scaling(args) -> None:
    cfg = from_flags(ScalingConfig, args)
    validate_scaling(cfg)
    from .scaling import scaling_tables   # scipy: only this command needs it

    tables = scaling_tables(cfg, log=_say)
    print(format_scaling(tables, cfg.compute))
    source = cfg.points if cfg.points is not None else (cfg.run[0] if len(cfg.run) == 1 else cfg.eval_dir)
    name = Path(cfg.points).stem if cfg.points is not None else io.run_name(source)
    out = Path(cfg.out) if cfg.out else io.default_out(name, "scaling")
    fits = tables["fits"]
    settings = {"command": args.command, "args": {"command": args.command, **to_dict(cfg)},
                "source": str(Path(source).resolve()), "intervals": sorted(set(fits["interval"])),
                "r0": ("fixed to the step-0 score" if fits["r0_fixed"].all() else
                       "fitted (no step-0 point)" if not fits["r0_fixed"].any() else
                       "fixed to the step-0 score where a fit has one, else fitted")}
    paths = io.write_results(out, tables, settings)
    print(f"\nwrote {len(paths)} files to {out}/: " + ", ".join(p.name for p in paths))


def _say(line: str) -> None:
    """A library's progress line on stdout, its ``warning:`` lines on stderr."""
    print(line, file=sys.stderr if line.startswith("warning:") else sys.stdout, flush=True)


def _cmd_relay(args) -> None:
    cfg = from_flags(RelayConfig, args)
    validate_relay(cfg)   # before the relay's imports: a bad flag answers at once
    if cfg.matrix is not None:   # every ordered pair of a run's checkpoints (tsanalysis.relay_matrix)
        from .relay_matrix import format_matrix, run_relay_matrix

        tables, out_dir, settings = run_relay_matrix(cfg, log=_say)
        print(format_matrix(tables["matrix"]))
        paths = io.write_results(out_dir, tables, settings)
        print(f"\nwrote {len(paths)} files to {out_dir}/: " + ", ".join(p.name for p in paths)
              + " (+ prefixes/, alone/, relay/, matrix_settings.json)")
        return
    from .relay import run_relay   # imports torch/transformers when called: only this command needs them

    tables, out_dir, settings = run_relay(cfg, log=_say)
    print(format_passk(tables["relay_passk"]))
    paths = io.write_results(out_dir, tables, settings)
    print(f"\nwrote {len(paths)} files to {out_dir}/: " + ", ".join(p.name for p in paths)
          + " (+ prefixes.jsonl, results.jsonl, relay_settings.json)")


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
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXIT_CODES_HELP)
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

    p = sub.add_parser("support", help="problems gained / lost / kept per k, crossover k, distinct answers and "
                                       "entropy, cross-model likelihood, over an eval.run results folder")
    add_flags(p, SupportConfig)
    p.set_defaults(func=_cmd_support)

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

    p = sub.add_parser("seeds", help="restart values of the seeds: lift against the fresh group by cut depth, seed "
                                     "age and token type; rescued all-wrong groups; zero advantage vs Lemma 4")
    _run_args(p)
    p.add_argument("--bins", type=_positive_int, default=5, help="cut-depth bins over seed_len / source length")
    p.add_argument("--width", type=_positive_int, default=64, help="cut-depth bin width in seed tokens")
    p.add_argument("--by", choices=("source",), default=None,
                   help="source: also the lift by source age, the cycle's refresh step minus the seed's writer step "
                        "(seed_source=mixture: 0, T, 2T, ...; table by_source_age)")
    p.add_argument("--refresh-interval", type=_positive_int, default=None,
                   help="T for --by source (default: the run's config.yaml seed_refresh_interval)")
    p.set_defaults(func=_cmd_seeds)

    p = sub.add_parser("scaling", help="score against compute of a run's checkpoints fitted with ScaleRL's sigmoid: "
                                       "asymptote A or efficiency (C_mid, B)? (arXiv:2510.13786)")
    add_flags(p, ScalingConfig)
    p.set_defaults(func=_cmd_scaling)

    p = sub.add_parser("relay", help="relay inference: early checkpoint writes a prefix, the final one continues "
                                     "(--matrix RUN_DIR: every ordered pair of a run's checkpoints)",
                       epilog=EXIT_CODES_HELP)
    add_flags(p, RelayConfig)
    p.set_defaults(func=_cmd_relay)
    return ap


def _kept(args) -> str | None:
    """What an interrupted or failed command leaves that the same command continues from (the relay's JSONL)."""
    if args.command != "relay":
        return None
    if getattr(args, "matrix", None) is not None:
        where = getattr(args, "out", None) or "its folder (results/analysis/<run>/relay-matrix/<tag>/)"
        return f"the relay matrix's phase files (prefixes/, alone/, relay/) in {where} keep every finished chunk"
    where = getattr(args, "out", None) or "its folder (results/analysis/<final run>/relay/<tag>/)"
    return f"the relay's prefixes.jsonl and results.jsonl in {where} keep every finished chunk"


def _resume(args) -> str:
    kept = _kept(args)
    return (f"{kept}; the same command resumes from them" if kept else
            "nothing is written before the tables are complete; the same command starts again")


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        args._steps = parse_step_range(getattr(args, "steps", None))
    except ValueError as e:
        ap.error(str(e))
    # bad input: io.RecordsError, UsageError (tsanalysis.errors.RelayError is one), a config file's ConfigError:
    # one line, exit 2
    return run_command(lambda: args.func(args), input_errors=(io.RecordsError, UsageError, ConfigError),
                       resume=lambda: _resume(args), kept=lambda: _kept(args))


if __name__ == "__main__":
    sys.exit(main())
