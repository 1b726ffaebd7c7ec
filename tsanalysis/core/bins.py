"""Per-position binning of per-token quantities (docs/method.md "Per-position bins"; paper Figures 3 and 4).

A token at index t (0-based) of a response of length L has relative position t/L and falls in bin
``floor(n_bins * t / L)`` (integer arithmetic, so bin edges are exact: with L = 10 and ten bins every token gets
its own bin). For seeded responses the paper normalises by the FINAL length (seed + continuation), so the
takeover point seed_len/L lands wherever the cut was; callers pass the full per-token arrays (or a ``lengths``
override) and a mask that picks the seed or continuation tokens.

Tokens whose value is not finite (NaN) are skipped and not counted: ``count`` is the number of values that
entered the mean. Clipping is binned as a 0/1 value, so ``1e4 * mean`` is "clipped tokens per 10^4 tokens".

Shapes: N responses, T_i tokens of response i, K bins.
"""

from __future__ import annotations

from typing import Hashable, Sequence

import numpy as np
import pandas as pd

__all__ = [
    "flatten", "relative_bin_index", "position_bins", "absolute_bins", "PositionBinner", "AbsoluteBinner",
    "per_1e4", "seed_token_mask", "seeded_position_keys",
]


def flatten(values: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """List of 1-D arrays → (flat values [sum T_i], offsets [N+1]) with ``flat[offsets[i]:offsets[i+1]]`` = values[i]."""
    lens = np.fromiter((len(v) for v in values), dtype=np.int64, count=len(values))
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    flat = np.concatenate([np.asarray(v, dtype=np.float64).ravel() for v in values]) if len(values) else np.zeros(0)
    return flat.astype(np.float64, copy=False), offsets


def _token_index(offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For flat tokens: (index t within its response [sum T], response id [sum T])."""
    lens = np.diff(offsets)
    resp = np.repeat(np.arange(lens.size), lens)
    t = np.arange(offsets[-1] - offsets[0], dtype=np.int64) - (offsets[:-1] - offsets[0])[resp]
    return t, resp


def relative_bin_index(offsets: np.ndarray, *, n_bins: int, lengths: np.ndarray | None = None) -> np.ndarray:
    """Bin of every flat token: ``floor(n_bins * t / L_i)`` where L_i = lengths[i] (default: the array length).

    ``lengths`` normalises by a length other than the array's own (e.g. the final length of a seeded response
    when only its seed tokens are passed); it must be at least the array length.
    """
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    offsets = np.asarray(offsets, dtype=np.int64)
    t, resp = _token_index(offsets)
    own = np.diff(offsets)
    L = own if lengths is None else np.asarray(lengths, dtype=np.int64)
    if L.shape != own.shape:
        raise ValueError(f"lengths has {L.shape[0]} entries for {own.shape[0]} responses")
    if np.any(L < own):
        bad = int(np.argmax(L < own))
        raise ValueError(f"normalising length {int(L[bad])} of response {bad} is shorter than its {int(own[bad])} values")
    return (n_bins * t) // L[resp] if t.size else t


def seeded_position_keys(offsets: np.ndarray, seed_len: np.ndarray, *, n_bins: int) -> np.ndarray:
    """One key per flat token: its relative-position bin (normalised by the full length) plus ``n_bins`` times
    its region: 0 = continuation token of a seeded response, 1 = seed token (t < seed_len), 2 = token of an
    unseeded response (seed_len 0). Keys lie in [0, 3 * n_bins)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    t, resp = _token_index(offsets)
    if not t.size:
        return t
    lens = np.diff(offsets)[resp]
    s = np.asarray(seed_len, dtype=np.int64)[resp]
    region = np.where(s == 0, 2, (t < s).astype(np.int64))
    return (n_bins * t) // lens + n_bins * region


def _masked(flat: np.ndarray, idx: np.ndarray, mask) -> tuple[np.ndarray, np.ndarray]:
    keep = np.isfinite(flat)
    if mask is not None:
        keep &= np.asarray(mask, dtype=bool)
    return flat[keep], idx[keep]


def _table(sums: np.ndarray, counts: np.ndarray) -> pd.DataFrame:
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return pd.DataFrame({"bin": np.arange(sums.size, dtype=np.int64), "mean": mean,
                         "count": counts.astype(np.int64), "sum": sums})


def position_bins(values: Sequence[np.ndarray], *, n_bins: int = 10, lengths=None, mask=None) -> pd.DataFrame:
    """Mean of a per-token quantity per relative-position bin.

    values: one 1-D array per response, in token order ([T_i] each). lengths: optional normalising length per
    response (>= len(values[i])). mask: optional list of boolean arrays aligned with ``values`` selecting tokens.
    Returns columns ``bin`` (0..n_bins-1, all present), ``mean`` (NaN where count is 0), ``count``, ``sum``.
    """
    flat, offsets = flatten(values)
    m = None if mask is None else flatten([np.asarray(x, dtype=bool) for x in mask])[0].astype(bool)
    if m is not None and m.shape != flat.shape:
        raise ValueError("mask arrays must have the same lengths as the value arrays")
    idx = relative_bin_index(offsets, n_bins=n_bins, lengths=lengths)
    v, i = _masked(flat, idx, m)
    return _table(np.bincount(i, weights=v, minlength=n_bins), np.bincount(i, minlength=n_bins))


def absolute_bins(values: Sequence[np.ndarray], *, width: int = 64, mask=None) -> pd.DataFrame:
    """Mean per absolute-position bin ``t // width``; columns bin, pos_lo, pos_hi (exclusive), mean, count, sum."""
    b = AbsoluteBinner(width=width)
    b.add(values, mask=mask)
    return b.table().drop(columns="key")


def per_1e4(sums, counts) -> np.ndarray:
    """Events per 10^4 tokens, NaN where there are no tokens."""
    sums = np.asarray(sums, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, 1e4 * sums / np.maximum(counts, 1), np.nan)


class PositionBinner:
    """Streaming version of :func:`position_bins`: accumulates sums and counts per (key, bin).

    ``key`` names a series (e.g. ``("entropy", "seed")``); feed chunks with :meth:`add` (lists of arrays) or
    :meth:`add_flat` (flat values + offsets, as read from Arrow list columns) and call :meth:`table` at the
    end. Memory is O(keys × bins) whatever the number of tokens.
    """

    def __init__(self, *, n_bins: int = 10):
        if n_bins < 1:
            raise ValueError(f"n_bins must be >= 1, got {n_bins}")
        self.n_bins = n_bins
        self._sums: dict[Hashable, np.ndarray] = {}
        self._counts: dict[Hashable, np.ndarray] = {}

    def add(self, values: Sequence[np.ndarray], *, key: Hashable = "all", lengths=None, mask=None) -> None:
        flat, offsets = flatten(values)
        m = None if mask is None else flatten([np.asarray(x, dtype=bool) for x in mask])[0].astype(bool)
        self.add_flat(flat, offsets, key=key, lengths=lengths, mask=m)

    def add_flat(self, flat, offsets, *, key: Hashable = "all", lengths=None, mask=None) -> None:
        """flat [sum T_i] values, offsets [N+1]; mask [sum T_i] bool or None; lengths [N] or None."""
        flat = np.asarray(flat, dtype=np.float64)
        offsets = np.asarray(offsets, dtype=np.int64)
        assert flat.shape[0] == offsets[-1] - offsets[0], "flat values and offsets disagree"
        if mask is not None and np.shape(mask) != flat.shape:
            raise ValueError(f"mask has shape {np.shape(mask)}, values {flat.shape}")
        idx = relative_bin_index(offsets, n_bins=self.n_bins, lengths=lengths)
        v, i = _masked(flat, idx, mask)
        self._accumulate(key, np.bincount(i, weights=v, minlength=self.n_bins), np.bincount(i, minlength=self.n_bins))

    def _accumulate(self, key, sums, counts) -> None:
        if key not in self._sums:
            self._sums[key] = np.zeros(self.n_bins)
            self._counts[key] = np.zeros(self.n_bins, dtype=np.int64)
        self._sums[key] += sums
        self._counts[key] += counts

    def keys(self) -> list:
        return list(self._sums)

    def table(self, key: Hashable | None = None) -> pd.DataFrame:
        """One key's table (columns bin, mean, count, sum), or all keys stacked with a ``key`` column."""
        if key is not None:
            if key not in self._sums:  # a series that never received a token: all bins empty
                return _table(np.zeros(self.n_bins), np.zeros(self.n_bins, dtype=np.int64))
            return _table(self._sums[key], self._counts[key])
        frames = [_table(self._sums[k], self._counts[k]).assign(key=[k] * self.n_bins) for k in self._sums]
        cols = ["key", "bin", "mean", "count", "sum"]
        return pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)


class AbsoluteBinner(PositionBinner):
    """Streaming means per absolute-position bin ``t // width`` (t = 0-based token index); the bin count grows."""

    def __init__(self, *, width: int = 64):
        if width < 1:
            raise ValueError(f"width must be >= 1, got {width}")
        self.width = width
        self.n_bins = 0
        self._sums, self._counts = {}, {}

    def add_flat(self, flat, offsets, *, key: Hashable = "all", lengths=None, mask=None) -> None:
        flat = np.asarray(flat, dtype=np.float64)
        offsets = np.asarray(offsets, dtype=np.int64)
        assert flat.shape[0] == offsets[-1] - offsets[0], "flat values and offsets disagree"
        if mask is not None and np.shape(mask) != flat.shape:
            raise ValueError(f"mask has shape {np.shape(mask)}, values {flat.shape}")
        t, _ = _token_index(offsets)
        v, i = _masked(flat, t // self.width, mask)
        size = max(self.n_bins, int(i.max()) + 1 if i.size else 0)
        if size > self.n_bins:
            for k in self._sums:
                self._sums[k] = np.pad(self._sums[k], (0, size - self.n_bins))
                self._counts[k] = np.pad(self._counts[k], (0, size - self.n_bins))
            self.n_bins = size
        self._accumulate(key, np.bincount(i, weights=v, minlength=size), np.bincount(i, minlength=size))

    def table(self, key: Hashable | None = None) -> pd.DataFrame:
        out = super().table(key)
        out.insert(out.columns.get_loc("bin") + 1, "pos_lo", out["bin"].to_numpy() * self.width)
        out.insert(out.columns.get_loc("pos_lo") + 1, "pos_hi", (out["bin"].to_numpy() + 1) * self.width)
        return out


def seed_token_mask(offsets, seed_lens) -> np.ndarray:
    """Flat boolean mask [sum T_i]: True on the first seed_lens[i] tokens of response i (the seed)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    seed_lens = np.asarray(seed_lens, dtype=np.int64)
    t, resp = _token_index(offsets)
    return t < seed_lens[resp] if t.size else np.zeros(0, dtype=bool)
