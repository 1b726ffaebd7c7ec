"""Synthetic run directories for tests: rollout files written through ``contracts.records.write_rollouts``, and the
four synthetic runs (and relay results) the figures and notebooks are drawn from (``synthetic_runs``,
``synthetic_relay``).

    from tests.helpers.runs import make_row, write_run
    run = write_run(tmp_path / "run", {0: [make_row(entropy=[1, 2, 3]), ...], 1: [...]})

``make_row`` fills every schema column with values consistent with the response length (taken from the first
per-token list given, or ``length``); override any column by keyword. Per-token lists not given are filled
with defaults (entropy 1.0, log-probs -1.0, ratio 1.0, no clipping, loss_mask True; logp_behavior NaN on
non-seed tokens and -1.0 on seed tokens, null for unseeded rows).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from contracts import records
from tsanalysis import io as tio
from tsanalysis.relay import pass_k_table

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


ENTROPY_CUTS = (["ĠSo", "ĠLet", "ĠTherefore", "ĠSince", "ĠWait", "ĠBut", "ĠThus", "Ġ3", "Ġ="],
                [30, 18, 14, 10, 8, 6, 5, 3, 2])


RATIO_CUTS = (["Ġ3", "Ġ+", "\\frac", "Ġthe", "12", "=", "Ġx", "$", "ĠSo", "Ċ", "(", "\\cdot"],
              [14, 12, 11, 10, 9, 9, 8, 6, 5, 5, 4, 4])


CONFIGS = {
    "onpolicy": {"algorithm": "dapo", "mini_batches_per_step": 1},
    "minibatch": {"algorithm": "dapo", "mini_batches_per_step": 4},
    "seeds-entropy": {"algorithm": "seeds", "mini_batches_per_step": 1, "seed_rule": "entropy",
                      "seed_loss": "state+action", "seed_ratio": 0.7, "seed_refresh_interval": 4},
    "seeds-ratio": {"algorithm": "seeds", "mini_batches_per_step": 1, "seed_rule": "ratio",
                    "seed_loss": "state+action", "seed_ratio": 0.7, "seed_refresh_interval": 4},
}


def _synthetic_rows(kind: str, step: int, rng: np.random.Generator, *, prompts: int = 6, G: int = 8) -> list[dict]:
    rows = []
    config = CONFIGS[kind]
    seeded = config["algorithm"] == "seeds" and step % 4 != 0   # refresh steps are plain on-policy
    for q in range(prompts):
        p = [0.05, 0.2, 0.4, 0.6, 0.85, 1.0][q % 6]
        rewards = (rng.random(G) < p).astype(float)
        adv = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
        for i in range(G):
            L = int(rng.integers(30, 90))
            u = np.arange(L) / L
            noise = rng.normal(0.0, 0.08, L)
            seed_len = 0
            extra = {}
            if kind == "onpolicy":
                ent = 1.6 - 1.1 * u + noise
                clip_p = 0.004 + 0.004 * u
            elif kind == "minibatch":
                ent = 0.5 + 0.9 * u + noise
                clip_p = 0.004 + 0.02 * u
            else:
                ent = 1.3 - 0.7 * u + noise
                clip_p = np.full(L, 0.003)
                if seeded:
                    seed_len = int(round(L * (0.7 if kind == "seeds-ratio" else rng.uniform(0.5, 0.85))))
                    t = np.arange(L)
                    cont = t >= seed_len
                    ent = np.where(cont, 0.5 + 1.1 * np.exp(-(t - seed_len) / (0.08 * L)), 1.2 - 0.6 * u) + noise
                    clip_p = np.where(cont, 0.002, 0.03)
                    tokens, weights = ENTROPY_CUTS if kind == "seeds-entropy" else RATIO_CUTS
                    w = np.asarray(weights, float)
                    tok = tokens[int(rng.choice(len(tokens), p=w / w.sum()))]
                    logp_old = -1.0 + rng.normal(0.0, 0.3, L)
                    drift = rng.normal(0.03, 0.06, seed_len)   # log π_old − log π_b on seed tokens
                    extra = {"trunc_rule": config["seed_rule"], "trunc_token_text": tok, "trunc_token_id": 7,
                             "logp_old": logp_old.tolist(),
                             "logp_behavior": (logp_old[:seed_len] - drift).tolist() + [math.nan] * (L - seed_len)}
            clipped = rng.random(L) < clip_p
            rows.append(make_row(
                prompt_id=f"q{q}", sample_idx=i, seed_len=seed_len, entropy=np.clip(ent, 0.01, None).tolist(),
                reward=float(rewards[i]), advantage=float(adv[i]),
                clipped_high=(clipped & (adv[i] > 0)).tolist(), clipped_low=(clipped & (adv[i] < 0)).tolist(),
                run=kind, **extra))
    return rows


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def synthetic_runs(root: Path, *, steps: int = 4, kinds=tuple(CONFIGS)) -> dict[str, Path]:
    """Write the synthetic runs (rollouts + config.yaml) under root/<kind>/; returns {kind: run_dir}."""
    out = {}
    for k, kind in enumerate(kinds):
        rng = np.random.default_rng(100 + k)
        run = write_run(root / kind, {s: _synthetic_rows(kind, s, rng) for s in range(steps)})
        (run / "config.yaml").write_text(yaml.safe_dump({"run_name": kind, **CONFIGS[kind]}))
        out[kind] = run
    return out


def synthetic_relay(root: Path, benchmarks=("aime24", "amc23"), *, n: int = 32) -> list[Path]:
    """relay_passk/relay_problems result folders as `tsanalysis relay` writes them (counts drawn at random)."""
    out = []
    for b, bench in enumerate(benchmarks):
        rng = np.random.default_rng(7 + b)
        P = 40
        p_final = rng.beta(0.4, 1.5, P)
        p_relay = np.clip(p_final + rng.normal(0.02, 0.05, P), 0, 1)
        counts = {name: rng.binomial(n, pr) for name, pr in (("early", p_final * 0.8), ("relay", p_relay),
                                                              ("final", p_final))}
        problems = pd.DataFrame({"problem_id": [f"{bench}-{i}" for i in range(P)], "n": n,
                                 **{f"{k}_correct": v for k, v in counts.items()}})
        passk = pass_k_table(problems["n"], counts["early"], counts["relay"], counts["final"], n_boot=300, seed=0)
        folder = root / "seeds-ratio" / "relay" / f"{bench}-cut0.5"
        settings = {"command": "relay", "args": {"benchmark": bench, "cut": 0.5, "n": n,
                                                 "early": str(root / "seeds-ratio" / "checkpoints" / "step_000002"),
                                                 "final": str(root / "seeds-ratio" / "checkpoints" / "step_000004")}}
        tio.write_results(folder, {"relay_problems": problems, "relay_passk": passk}, settings)
        out.append(folder)
    return out
