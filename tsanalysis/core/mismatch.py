"""Behavior-policy mismatch accumulated along seed tokens (beyond the paper; its Proposition 2).

In the state+action variant, seed token t of a seeded response enters the loss with the ratio
r_t = π_θ(o_t|s_t) / π_b(o_t|s_t), where π_b wrote the seed. Proposition 2 bounds what a token-level ratio
leaves uncorrected at position t by the divergence accumulated over the preceding tokens (the context was also
written by π_b). We measure, per seeded response, on its seed tokens t < seed_len, with
d_t = logp_old_t − logp_behavior_t = log(π_old/π_b)(o_t|s_t) (the log-ratio at the first update of the step):

- ``log_ratio``      d_t; its running sum ``cum_log_ratio`` = log ∏_{j≤t} π_old/π_b is the log of the
                     sequence-level importance weight of the prefix (its second moment grows quickly with t);
- ``abs_log_ratio``  |d_t|; running sum ``cum_abs_log_ratio`` (monotone; no cancellation between tokens);
- ``kl_k3``          (r−1) − log r with r = e^{d_t} (≥ 0), the "k3" estimator of KL(π_b(·|s_t) ‖ π_old(·|s_t))
                     from a token sampled by π_b (unbiased for that per-state KL); its running sum
                     ``cum_kl_k3`` estimates Σ_{j≤t} KL_j, which by the chain rule is the KL between the
                     behavior and current distributions of the prefix o_{≤t} — the accumulated divergence of
                     Proposition 2.

Running sums are inclusive (position t includes token t). Positions are binned relatively
(``floor(n_bins·t/L)`` with L the seed length by default, or the final response length) and absolutely
(``t // width``). Crossing: the first position t where a monotone running sum reaches a threshold.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from .bins import AbsoluteBinner, PositionBinner, flatten

__all__ = ["QUANTITIES", "CROSSING_QUANTITIES", "seed_divergence", "MismatchAccumulator", "mismatch_tables"]

QUANTITIES = ("log_ratio", "abs_log_ratio", "kl_k3", "cum_log_ratio", "cum_abs_log_ratio", "cum_kl_k3")
CROSSING_QUANTITIES = ("cum_abs_log_ratio", "cum_kl_k3")   # monotone running sums


def _segment_cumsum(x: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Inclusive cumulative sum restarted at each segment start ([sum T] → [sum T])."""
    if x.size == 0:
        return x.copy()
    c = np.cumsum(x)
    lens = np.diff(offsets)
    start_prev = np.concatenate([[0.0], c])[offsets[:-1] - offsets[0]]   # running total before each segment
    return c - np.repeat(start_prev, lens)


def seed_divergence(d_flat: np.ndarray, offsets: np.ndarray) -> dict[str, np.ndarray]:
    """All :data:`QUANTITIES` on flat seed tokens: d_flat [sum S_i] log-ratios, offsets [N+1]."""
    d = np.asarray(d_flat, dtype=np.float64)
    k3 = np.clip(np.expm1(d) - d, 0.0, None)   # (r − 1) − log r ≥ 0; clip rounding below 0
    out = {"log_ratio": d, "abs_log_ratio": np.abs(d), "kl_k3": k3}
    out["cum_log_ratio"] = _segment_cumsum(d, offsets)
    out["cum_abs_log_ratio"] = _segment_cumsum(np.abs(d), offsets)
    out["cum_kl_k3"] = _segment_cumsum(k3, offsets)
    return out


class MismatchAccumulator:
    """Streams seeded responses; memory O(bins + responses × thresholds).

    ``relative_to``: "seed" (t / seed_len) or "response" (t / final length, as in Figure 4).
    """

    def __init__(self, *, n_bins: int = 10, width: int = 64, thresholds: Sequence[float] = (0.01, 0.1, 1.0),
                 relative_to: str = "seed"):
        if relative_to not in ("seed", "response"):
            raise ValueError(f"relative_to must be 'seed' or 'response', got {relative_to!r}")
        if any(t <= 0 for t in thresholds):
            raise ValueError("thresholds must be positive")
        self.n_bins, self.width, self.relative_to = n_bins, width, relative_to
        self.thresholds = tuple(float(t) for t in thresholds)
        self.rel = PositionBinner(n_bins=n_bins)
        self.abs = AbsoluteBinner(width=width)
        self.responses = 0
        self.skipped = 0
        self.seed_tokens = 0
        self._seed_lens: list[np.ndarray] = []
        self._totals: dict[str, list[np.ndarray]] = {q: [] for q in QUANTITIES if q.startswith("cum_")}
        self._first: dict[tuple[str, float], list[np.ndarray]] = {
            (q, t): [] for q in CROSSING_QUANTITIES for t in self.thresholds}

    def add(self, logp_old: Sequence[np.ndarray], logp_behavior: Sequence[np.ndarray], seed_lens,
            final_lens=None) -> None:
        """Lists of per-response arrays (at least seed_len entries each; only the first seed_len are used)."""
        seed_lens = np.asarray(seed_lens, dtype=np.int64)
        d = [np.asarray(a[:s], dtype=np.float64) - np.asarray(b[:s], dtype=np.float64)
             for a, b, s in zip(logp_old, logp_behavior, seed_lens)]
        if any(len(x) != s for x, s in zip(d, seed_lens)):
            raise ValueError("a response has fewer log-prob values than its seed_len")
        flat, offsets = flatten(d)
        self.add_flat(flat, offsets, final_lens=final_lens)

    def add_flat(self, d_flat, offsets, *, final_lens=None) -> None:
        """d_flat [sum S_i]: logp_old − logp_behavior on seed tokens; offsets [N+1]; final_lens [N] or None."""
        d_flat = np.asarray(d_flat, dtype=np.float64)
        offsets = np.asarray(offsets, dtype=np.int64)
        lens = np.diff(offsets)
        resp = np.repeat(np.arange(lens.size), lens)
        bad = np.zeros(lens.size, dtype=bool)
        bad[resp[~np.isfinite(d_flat)]] = True
        bad |= lens == 0                                      # no seed tokens: nothing to measure
        self.skipped += int(np.count_nonzero(bad & (lens > 0)))
        if bad.any():                                          # drop those responses entirely
            keep_tok = ~bad[resp]
            d_flat = d_flat[keep_tok]
            lens = lens[~bad]
            offsets = np.concatenate([[0], np.cumsum(lens)])
            resp = np.repeat(np.arange(lens.size), lens)
            if final_lens is not None:
                final_lens = np.asarray(final_lens, dtype=np.int64)[~bad]
        if lens.size == 0:
            return
        q = seed_divergence(d_flat, offsets)
        norm = lens if self.relative_to == "seed" else np.asarray(final_lens, dtype=np.int64)
        if self.relative_to == "response" and final_lens is None:
            raise ValueError("relative_to='response' needs final_lens")
        for name, v in q.items():
            self.rel.add_flat(v, offsets, key=name, lengths=norm)
            self.abs.add_flat(v, offsets, key=name)
        self.responses += int(lens.size)
        self.seed_tokens += int(lens.sum())
        self._seed_lens.append(lens)
        ends = offsets[1:] - 1
        for name in self._totals:
            self._totals[name].append(q[name][ends])
        for (name, thr), store in self._first.items():
            below = np.bincount(resp, weights=(q[name] < thr).astype(np.float64), minlength=lens.size)
            first = below.astype(np.int64)           # monotone sums: first crossing index = tokens below
            first[first >= lens] = -1                # never crossed within the seed
            store.append(first)

    # ---- results -------------------------------------------------------------------------------------------
    def _wide(self, binner, extra: pd.DataFrame) -> pd.DataFrame:
        out = extra.copy()
        for name in QUANTITIES:
            t = binner.table(name)
            if "count" not in out:
                out["count"] = t["count"].to_numpy()
            out[f"{name}_mean"] = t["mean"].to_numpy()
        return out

    def relative_table(self) -> pd.DataFrame:
        k = np.arange(self.n_bins)
        base = pd.DataFrame({"bin": k, "pos_lo": k / self.n_bins, "pos_hi": (k + 1) / self.n_bins})
        return self._wide(self.rel, base)

    def absolute_table(self) -> pd.DataFrame:
        k = np.arange(self.abs.n_bins)
        base = pd.DataFrame({"bin": k, "pos_lo": k * self.width, "pos_hi": (k + 1) * self.width})
        return self._wide(self.abs, base)

    def crossing_table(self) -> pd.DataFrame:
        rel, ab = self.relative_table(), self.absolute_table()
        seed_lens = np.concatenate(self._seed_lens) if self._seed_lens else np.zeros(0, dtype=np.int64)
        rows = []
        for (name, thr), store in self._first.items():
            first = np.concatenate(store) if store else np.zeros(0, dtype=np.int64)
            hit = first >= 0
            pos = first[hit].astype(np.float64)
            relpos = pos / seed_lens[hit] if hit.any() else pos
            rel_hit = np.flatnonzero(rel[f"{name}_mean"].to_numpy() >= thr)
            abs_hit = np.flatnonzero(ab[f"{name}_mean"].to_numpy() >= thr)
            rows.append({
                "quantity": name, "threshold": thr, "responses": int(first.size), "crossed": int(hit.sum()),
                "frac_crossed": float(hit.mean()) if first.size else np.nan,
                "pos_mean": float(pos.mean()) if pos.size else np.nan,
                "pos_median": float(np.median(pos)) if pos.size else np.nan,
                "rel_seed_mean": float(relpos.mean()) if pos.size else np.nan,
                "rel_seed_median": float(np.median(relpos)) if pos.size else np.nan,
                "mean_curve_rel_bin": float(rel_hit[0]) if rel_hit.size else np.nan,
                "mean_curve_abs_pos": float(ab["pos_lo"].to_numpy()[abs_hit[0]]) if abs_hit.size else np.nan,
            })
        return pd.DataFrame(rows)

    def summary_table(self) -> pd.DataFrame:
        seed_lens = np.concatenate(self._seed_lens) if self._seed_lens else np.zeros(0)
        row = {"responses": self.responses, "skipped_nonfinite": self.skipped, "seed_tokens": self.seed_tokens,
               "seed_len_mean": float(seed_lens.mean()) if seed_lens.size else np.nan}
        for name, store in self._totals.items():   # value at the last seed token, averaged over responses
            v = np.concatenate(store) if store else np.zeros(0)
            row[f"{name}_end_mean"] = float(v.mean()) if v.size else np.nan
            row[f"{name}_end_median"] = float(np.median(v)) if v.size else np.nan
        return pd.DataFrame([row])

    def tables(self) -> dict[str, pd.DataFrame]:
        return {"relative": self.relative_table(), "absolute": self.absolute_table(),
                "crossing": self.crossing_table(), "summary": self.summary_table()}


def mismatch_tables(logp_old, logp_behavior, seed_lens, final_lens=None, *, n_bins: int = 10, width: int = 64,
                    thresholds: Sequence[float] = (0.01, 0.1, 1.0), relative_to: str = "seed") -> dict[str, pd.DataFrame]:
    """In-memory version of :class:`MismatchAccumulator` (same tables: relative, absolute, crossing, summary)."""
    acc = MismatchAccumulator(n_bins=n_bins, width=width, thresholds=thresholds, relative_to=relative_to)
    acc.add(logp_old, logp_behavior, seed_lens, final_lens)
    return acc.tables()
