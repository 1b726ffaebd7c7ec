"""The power study's endpoints (issue #40 item 2), fixed before its runs and computed from the premise tables.

With 3 training seeds the premise tables cannot tell Thinking Seeds from on-policy (its pass@64 edge at matched pass@1
is +3.4 ± 14.6). The power study trains on-policy, Thinking Seeds (ratio, state+action), Thinking Seeds (state), the
current-state restart (FR3E-like, arXiv 2507.07017: the same cut, no staleness, the "old states" control) and LUFFY
with at least 8 training seeds each (``python -m demo.premise --seeds 8 --methods POWER_METHODS --extend-to 100
--endpoints``) and reads three endpoints, each a difference paired by training seed:

- **E1, pass@1 at the budget** (the final checkpoint): each method − on-policy;
- **E2, pass@K at matched pass@1**: each method's pass@K where its pass@1 first reaches on-policy's final pass@1
  (same seed; ``matched_pass1.csv``, the runs that miss it continued by ``--extend-to``) − on-policy's there; seeds
  that never reach it are counted and left out;
- **E3, does the age of the state matter?** pass@K at the budget of each Thinking Seeds row − the current-state
  restart's.

The family is every comparison of the three (4 + 4 + 2 = 10). Each gets its mean difference over seeds, a 95 %
Student t interval (uncorrected) and the two-sided paired t-test p-value (``scipy.stats``); Holm's step-down over the
family (Holm 1979) adjusts the p-values, and the corrected interval of a comparison is the t interval at the level
Holm tests it at (α / (m − rank + 1) for the rank of its p-value), so it excludes 0 exactly when Holm rejects it,
given that every comparison of smaller p was rejected before it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.stats import t as student_t

from contracts.commands import points
from demo.premise_stats import holm

POWER_METHODS = "onpolicy,seeds_ratio,seeds_state,restart_fr3e,luffy"
ALPHA = 0.05
COLUMNS = ["endpoint", "method", "against", "seeds", "missing", "diff", "sd", "low", "high", "p", "p_holm",
           "holm_level", "low_holm", "high_holm", "rejected"]


@dataclass(frozen=True)
class Endpoint:
    key: str
    title: str
    pairs: tuple[tuple[str, str], ...]   # (method, against)


def endpoints() -> tuple[Endpoint, ...]:
    vs_on = tuple((m, "onpolicy") for m in ("seeds_ratio", "seeds_state", "restart_fr3e", "luffy"))
    return (Endpoint("E1", "pass@1 at the budget", vs_on),
            Endpoint("E2", "pass@K at matched pass@1", vs_on),
            Endpoint("E3", "pass@K at the budget, Thinking Seeds − current-state restart",
                     (("seeds_ratio", "restart_fr3e"), ("seeds_state", "restart_fr3e"))))


def _paired(methods: pd.DataFrame, col: str, a: str, b: str) -> tuple[np.ndarray, int]:
    """Per seed ``col`` of method a − method b over the seeds both have; (diffs, seeds of a that b lacks)."""
    x = methods[methods["method"] == a].set_index("seed")[col]
    y = methods[methods["method"] == b].set_index("seed")[col]
    both = x.index.intersection(y.index)
    return (x[both] - y[both]).to_numpy(float), int(len(x.index.difference(y.index)))


def _matched(matched: pd.DataFrame, a: str) -> tuple[np.ndarray, int]:
    d = matched[matched["method"] == a]
    hit = d[d["reached"].astype(bool) & d["diff"].notna()]
    return hit["diff"].to_numpy(float), int(len(d) - len(hit))


def _interval(v: np.ndarray, level: float) -> tuple[float, float]:
    if len(v) < 2:
        return math.nan, math.nan
    hw = float(student_t.ppf(1 - (1 - level) / 2, len(v) - 1)) * float(np.std(v, ddof=1)) / math.sqrt(len(v))
    return float(v.mean()) - hw, float(v.mean()) + hw


def _p_value(v: np.ndarray) -> float:
    if len(v) < 2:
        return math.nan
    sd = float(np.std(v, ddof=1))
    if sd == 0.0:
        return 1.0 if float(v.mean()) == 0.0 else 0.0
    t = float(v.mean()) / (sd / math.sqrt(len(v)))
    return float(2 * student_t.sf(abs(t), len(v) - 1))


def endpoint_table(methods: pd.DataFrame, matched: pd.DataFrame, K: int) -> pd.DataFrame:
    """One row per comparison of the family (``endpoints``) from the premise tables ``methods.csv`` and
    ``matched_pass1.csv`` (at k = K); the columns ``COLUMNS``. A comparison without two paired seeds has NaN
    statistics and takes no part in Holm's step-down."""
    rows = []
    for e in endpoints():
        for a, b in e.pairs:
            if e.key == "E1":
                v, missing = _paired(methods, "pass@1", a, b)
            elif e.key == "E2":
                v, missing = _matched(matched[matched["k"] == K], a)
            else:
                v, missing = _paired(methods, f"pass@{K}", a, b)
            low, high = _interval(v, 1 - ALPHA)
            rows.append({"endpoint": e.key, "method": a, "against": b, "seeds": len(v), "missing": missing,
                         "diff": float(v.mean()) if len(v) else math.nan,
                         "sd": float(np.std(v, ddof=1)) if len(v) > 1 else math.nan, "low": low, "high": high,
                         "p": _p_value(v), "_v": v})
    out = pd.DataFrame(rows)
    ok = out["p"].notna().to_numpy()
    m = int(ok.sum())
    out["p_holm"] = math.nan
    out["holm_level"] = math.nan
    if m:
        out.loc[ok, "p_holm"] = holm(out.loc[ok, "p"].to_numpy(float))
        rank = out.loc[ok, "p"].rank(method="first").to_numpy(int)   # 1 = the smallest p
        out.loc[ok, "holm_level"] = 1 - ALPHA / (m - rank + 1)
    ivs = [_interval(v, lvl) if not math.isnan(lvl) else (math.nan, math.nan)
           for v, lvl in zip(out["_v"], out["holm_level"])]
    out["low_holm"] = [x[0] for x in ivs]
    out["high_holm"] = [x[1] for x in ivs]
    out["rejected"] = out["p_holm"] < ALPHA
    return out.drop(columns="_v")[COLUMNS]


def render_endpoints(table: pd.DataFrame, K: int, paper: dict[str, str]) -> list[str]:
    """The page's endpoints section: what was fixed before the runs, then every comparison with its uncorrected
    and Holm-corrected interval (points) and p-values."""
    def pts(x: float) -> str:
        return points(x, missing="–")

    titles = {e.key: e.title.replace("pass@K", f"pass@{K}") for e in endpoints()}
    m = int(table["p"].notna().sum())
    lines = ["## Endpoints (fixed before the runs)", "",
             f"Written into `demo/endpoints.py` before any run of this page (issue #40 item 2): E1 {titles['E1']}, "
             f"E2 {titles['E2']} (on-policy's final pass@1, same seed), E3 {titles['E3']}; each a difference paired "
             f"by training seed, in points. The family is the {m} comparisons below: 95 % Student t intervals "
             "uncorrected, and corrected by Holm's step-down (the interval at the level Holm tests the comparison "
             "at, so it excludes 0 exactly when Holm rejects it). Seeds left out: E2's runs that never reached "
             "on-policy's pass@1.", "",
             "| endpoint | comparison | seeds (left out) | difference | 95 % interval | p | Holm p | "
             "Holm interval | Holm rejects |", "|---|---|---:|---:|---|---:|---:|---|---|"]
    for _, r in table.iterrows():
        p = "–" if math.isnan(r["p"]) else f"{r['p']:.3f}"
        ph = "–" if math.isnan(r["p_holm"]) else f"{r['p_holm']:.3f}"
        lines.append(f"| {r['endpoint']} {titles[r['endpoint']]} | {paper.get(r['method'], r['method'])} − "
                     f"{paper.get(r['against'], r['against'])} | {r['seeds']} ({r['missing']}) | {pts(r['diff'])} | "
                     f"[{pts(r['low'])}, {pts(r['high'])}] | {p} | {ph} | [{pts(r['low_holm'])}, "
                     f"{pts(r['high_holm'])}] | {'**yes**' if r['rejected'] else 'no'} |")
    return lines + [""]
