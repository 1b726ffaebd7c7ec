"""Synthetic run directories for tests: rollout files written through ``contracts.records.write_rollouts``.

    from helpers_runs import make_row, write_run
    run = write_run(tmp_path / "run", {0: [make_row(entropy=[1, 2, 3]), ...], 1: [...]})

``make_row`` fills every schema column with values consistent with the response length (taken from the first
per-token list given, or ``length``); override any column by keyword. Per-token lists not given are filled
with defaults (entropy 1.0, log-probs -1.0, ratio 1.0, no clipping, loss_mask True; logp_behavior NaN on
non-seed tokens and -1.0 on seed tokens, null for unseeded rows).
"""

from __future__ import annotations

import math
from pathlib import Path

from contracts import records

_PER_TOKEN = ("logp_old", "logp_behavior", "entropy", "ratio", "clipped_low", "clipped_high", "loss_mask")


def make_row(*, step: int = 0, prompt_id: str = "p0", sample_idx: int = 0, length: int | None = None,
             seed_len: int = 0, run: str = "synthetic", **cols) -> dict:
    """One rollout row; ``length`` or any given per-token list / response_ids fixes the response length."""
    if length is None:
        given = [cols[c] for c in (*_PER_TOKEN, "response_ids") if cols.get(c) is not None]
        if not given:
            raise ValueError("make_row needs length= or a per-token list")
        length = len(given[0])
    seeded = seed_len > 0
    row = {
        "run": run, "step": step, "prompt_id": prompt_id, "sample_idx": sample_idx,
        "variant": "seed" if seeded else "on_policy", "seed_step": step - 1 if seeded else None,
        "seed_len": seed_len, "trunc_rule": "ratio" if seeded else None,
        "trunc_token_id": 5 if seeded else None, "trunc_token_text": "x" if seeded else None,
        "prompt_ids": [1, 4, 5], "response_ids": [6 + (i % 50) for i in range(length)],
        "response_text": "r" * length, "reward": 0.0, "correct": False, "advantage": 0.0,
        "logp_old": [-1.0] * length,
        "logp_behavior": ([-1.0] * seed_len + [math.nan] * (length - seed_len)) if seeded else None,
        "entropy": [1.0] * length, "ratio": [1.0] * length, "clipped_low": [False] * length,
        "clipped_high": [False] * length, "loss_mask": [True] * length, "finish_reason": "stop",
    }
    if "reward" in cols and "correct" not in cols:
        cols["correct"] = cols["reward"] > 0
    row.update(cols)
    for c in _PER_TOKEN:
        if row[c] is not None:
            row[c] = [float(x) if c in ("logp_old", "logp_behavior", "entropy", "ratio") else bool(x) for x in row[c]]
    return row


def write_run(run_dir: str | Path, steps: dict[int, list[dict]]) -> Path:
    """Write ``rollouts/step_NNNNNN.parquet`` for each step (rows get their ``step`` set); returns run_dir."""
    run_dir = Path(run_dir)
    for step, rows in steps.items():
        rows = [{**r, "step": step} for r in rows]
        records.write_rollouts(rows, records.rollout_path(run_dir, step))
    return run_dir
