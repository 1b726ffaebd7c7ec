"""tsanalysis scaling: ScaleRL's sigmoid R(C) = R0 + (A − R0) / (1 + (C_mid/C)^B) (arXiv:2510.13786) fitted to a run's
score against compute. Known curves come back (exactly without noise, within the noise with it), the bootstrap over
problems covers the true asymptote, too few points and curves that have not bent are refused, and the command runs
end to end on a hand-made eval.run folder with the runs' metrics.jsonl and on a points table, with the figure.

The synthetic runs: ``method-seedS`` trains with 1e5 generated + 2e4 prefilled tokens and 3 s per step, so the
checkpoint after N steps has spent C = 1.2e5 N tokens (3 N wall seconds); checkpoints at N = 2, 4, 8, ... 128 and
the warm-up at step 0. Problem j's success probability at compute C is R0_j + (A_j − R0_j) s(C) with one
C_mid and B for all problems, so the mean over problems is the sigmoid at the means of R0_j and A_j.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from contracts.samples import append_row, make_row
from scoring.benchmarks.base import Problem
from scoring.verdict import Verdict
from tsanalysis import cli
from tsanalysis.config import ScalingConfig
from tsanalysis.core import scaling as SC
from tsanalysis.errors import UsageError
from tsanalysis.scaling import checkpoint_step, run_compute, run_identity, scaling_tables

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

TRUE = {"A": 0.72, "C_mid": 1.2e6, "B": 1.5, "R0": 0.15}
STEPS = (2, 4, 8, 16, 32, 64, 128)
TOKENS_PER_STEP = 1e5 + 2e4       # generated + prefilled
WALL_PER_STEP = 3.0


def _compute(steps) -> np.ndarray:
    return TOKENS_PER_STEP * np.asarray(steps, dtype=np.float64)


# ---- the curve and the fit -------------------------------------------------------------------------------------
def test_the_curve_is_scalerls_formula():
    c = np.array([0.0, 1e5, 1.2e6, 1e8])
    r = SC.curve(c, **TRUE)
    assert r[0] == TRUE["R0"]                                   # C = 0: no training
    assert r[2] == pytest.approx((TRUE["A"] + TRUE["R0"]) / 2)  # C = C_mid: half the rise
    assert r[1] == pytest.approx(0.15 + 0.57 / (1 + 12 ** 1.5), abs=1e-15)
    assert r[3] == pytest.approx(0.15 + 0.57 / (1 + (1.2e6 / 1e8) ** 1.5), abs=1e-15)


@pytest.mark.parametrize("r0_fixed", [True, False])
def test_noise_free_points_give_back_A_C_mid_B_exactly(r0_fixed):
    c = _compute(STEPS)
    fit = SC.fit_curve(c, SC.curve(c, **TRUE), r0=TRUE["R0"] if r0_fixed else None)
    assert fit.A == pytest.approx(TRUE["A"], abs=1e-6) and fit.B == pytest.approx(TRUE["B"], abs=1e-6)
    assert fit.C_mid == pytest.approx(TRUE["C_mid"], rel=1e-6) and fit.R0 == pytest.approx(TRUE["R0"], abs=1e-6)
    assert fit.rmse < 1e-9 and fit.identified and fit.r0_fixed is r0_fixed and fit.points == 7


def test_noisy_points_give_back_the_parameters_within_the_noise():
    rng = np.random.default_rng(3)
    c = np.geomspace(1e5, 1e8, 12)
    fit = SC.fit_curve(c, SC.curve(c, **TRUE) + rng.normal(0, 0.01, c.size), r0=TRUE["R0"])
    assert fit.identified and 0.005 < fit.rmse < 0.015
    assert abs(fit.A - 0.72) < 0.03 and abs(math.log(fit.C_mid / 1.2e6)) < 0.25 and abs(fit.B - 1.5) < 0.4


def test_four_points_are_refused():
    c = _compute(STEPS[:4])
    with pytest.raises(SC.FitRefused, match="4 points with compute > 0; a fit needs at least 5"):
        SC.fit_curve(c, SC.curve(c, **TRUE), r0=0.15)


@pytest.mark.parametrize("shape", ["flat", "line in log C", "line in C"])
def test_a_curve_without_a_bend_has_no_identified_asymptote(shape):
    c = _compute(STEPS)
    x = np.log(c / c[0])
    y = {"flat": np.full(c.size, 0.3), "line in log C": 0.2 + 0.08 * x, "line in C": 0.2 + 0.5 * c / c[-1]}[shape]
    fit = SC.fit_curve(c, y, r0=0.2 if shape != "flat" else 0.3)
    assert not fit.identified and fit.reason.startswith("asymptote not identified")
    if shape != "flat":
        assert SC.NOT_IDENTIFIED in fit.reason   # "the run has not bent yet"


def test_a_run_stopped_before_its_midpoint_is_not_identified():
    c = _compute(STEPS)   # up to 1.5e7 tokens, the midpoint at 1e9
    fit = SC.fit_curve(c, SC.curve(c, A=0.9, C_mid=1e9, B=0.8, R0=0.1), r0=0.1)
    assert not fit.identified and SC.NOT_IDENTIFIED in fit.reason


# ---- per-problem scores: the bootstrap over problems ---------------------------------------------------------------
def _problem_probs(P: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """Per-problem R0_j and A_j: means TRUE's R0 and A in the population (uniform, symmetric around them)."""
    return (TRUE["R0"] + rng.uniform(-0.1, 0.1, P), TRUE["A"] + rng.uniform(-0.25, 0.25, P))


def _correct(steps, P: int, n: int, seed: int) -> dict[int, np.ndarray]:
    """{step: correct counts [P]} of a run: binomial draws at each problem's success probability."""
    rng = np.random.default_rng(seed)
    r0, a = _problem_probs(P, np.random.default_rng(100))   # the problems are the same in every run
    out = {}
    for st in steps:
        p = r0 if st == 0 else SC.curve(_compute([st]), A=a, C_mid=TRUE["C_mid"], B=TRUE["B"], R0=r0)
        out[st] = rng.binomial(n, p)
    return out


def test_the_bootstrap_over_problems_covers_the_true_asymptote(tmp_path):
    root = _eval_folder(tmp_path, seeds=(0,), P=60, n=8)
    t = scaling_tables(ScalingConfig(run=[str(tmp_path / "runs" / "onpolicy-seed0")], eval_dir=str(root),
                                     checkpoints={"warmup": "0"}, n_boot=300, k=1), log=lambda m: None)
    r = t["fits"].iloc[0]
    assert (r["metric"], r["status"], r["r0_fixed"], r["points"]) == ("pass@1", "ok", True, 7)
    assert r["A_low"] <= TRUE["A"] <= r["A_high"] and r["A_high"] - r["A_low"] < 0.2
    assert r["C_mid_low"] <= TRUE["C_mid"] <= r["C_mid_high"]
    assert r["boot_fits"] + r["boot_failed"] == 300 and r["interval"] == "problems (300 resamples)"


# ---- runs and their eval folder ------------------------------------------------------------------------------------
def _write_metrics(run: Path, steps: int) -> None:
    run.mkdir(parents=True, exist_ok=True)
    lines = [{"step": -1, "val/countdown/avg@4": 0.1}]   # val_before_train's line: not a training step
    lines += [{"step": s, "tokens/generated": 100_000, "tokens/prefilled": 20_000, "time/step_s": WALL_PER_STEP}
              for s in range(steps)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def _write_model(root: Path, model: str, correct: np.ndarray, n: int) -> None:
    (root / model).mkdir(parents=True, exist_ok=True)
    with open(root / model / "countdown.jsonl", "w", encoding="utf-8") as f:
        for j, c in enumerate(correct):
            p = Problem(id=f"p{j:03d}", question="q", gold="1")
            vs = [Verdict(i < c, "pass" if i < c else "wrong_answer", "1") for i in range(n)]
            append_row(f, make_row(p, "q", ["= 1"] * n, vs, None, ["stop"] * n,
                                   {"model": model, "benchmark": "countdown", "n": n}))


def _eval_folder(tmp_path: Path, *, seeds=(0, 1, 2), P: int = 30, n: int = 4, steps=STEPS) -> Path:
    """runs/onpolicy-seedS/metrics.jsonl and eval/{warmup, onpolicy-seedS-stepNNN}/countdown.jsonl."""
    root = tmp_path / "eval"
    for s in seeds:
        counts = _correct((0, *steps), P, n, seed=s)
        _write_metrics(tmp_path / "runs" / f"onpolicy-seed{s}", max(steps))
        for st in steps:
            _write_model(root, f"onpolicy-seed{s}-step{st:03d}", counts[st], n)
        if s == seeds[0]:
            _write_model(root, "warmup", counts[0], n)
    return root


def test_checkpoint_names_steps_and_compute(tmp_path):
    assert checkpoint_step("onpolicy-seed0", "onpolicy-seed0-step010") == 10
    assert checkpoint_step("onpolicy-seed0", "onpolicy-seed0_step7") == 7
    assert checkpoint_step("onpolicy-seed1", "onpolicy-seed10") is None
    assert checkpoint_step("onpolicy-seed1", "onpolicy-seed10-step010") is None
    assert checkpoint_step("onpolicy-seed0", "onpolicy-seed0") is None
    assert run_identity("runs/onpolicy-seed2") == ("onpolicy", 2) and run_identity("runs/mine") == ("mine", 0)
    _write_metrics(tmp_path / "r", 10)
    # the checkpoint after N steps has seen steps 0..N-1; the step -1 validation line is no step
    assert run_compute(tmp_path / "r", [0, 2, 10], "tokens") == {0: 0.0, 2: 240_000.0, 10: 1_200_000.0}
    assert run_compute(tmp_path / "r", [4], "wall") == {4: 12.0}
    with pytest.raises(UsageError, match="metrics.jsonl has steps 0..9 but a checkpoint is after 11 steps"):
        run_compute(tmp_path / "r", [11], "tokens")
    (tmp_path / "r" / "metrics.jsonl").write_text('{"step": 0, "time/step_s": 1.0}\n')
    with pytest.raises(UsageError, match="compute columns missing: metrics.jsonl has no tokens/generated"):
        run_compute(tmp_path / "r", [1], "tokens")


def _cli(tmp_path, *extra) -> list[str]:
    runs = ",".join(str(tmp_path / "runs" / f"onpolicy-seed{s}") for s in (0, 1, 2))
    return ["scaling", "--run", runs, "--eval-dir", str(tmp_path / "eval"), "--checkpoints", "warmup=0",
            "--n-boot", "20", *extra]


def test_cli_on_runs_and_their_eval_folder(tmp_path, capsys):
    _eval_folder(tmp_path)
    out = tmp_path / "out"
    assert cli.main(_cli(tmp_path, "--out", str(out))) == 0
    printed = capsys.readouterr().out
    assert "countdown: pass@1 against generated + prefilled tokens" in printed and "countdown: pass@4" in printed
    assert "R0 fixed to the step-0 (warm-up) score" in printed and "problems (20 resamples)" in printed
    fits = pd.read_parquet(out / "fits.parquet")
    assert len(fits) == 8 and list(fits["fit"]).count("pooled") == 2   # 3 seeds + pooled, pass@1 and pass@4
    pooled = fits[(fits["fit"] == "pooled") & (fits["metric"] == "pass@1")].iloc[0]
    assert pooled["points"] == 21 and pooled["seeds"] == 3 and pooled["status"] == "ok"
    assert abs(pooled["A"] - TRUE["A"]) < 0.06 and abs(math.log(pooled["C_mid"] / TRUE["C_mid"])) < 0.5
    assert pooled["A_low"] < pooled["A"] < pooled["A_high"]
    pts = pd.read_csv(out / "points.csv")
    p = pts[(pts["model"] == "onpolicy-seed1-step008") & (pts["metric"] == "pass@1")].iloc[0]
    assert (p["method"], p["seed"], p["step"], p["compute"]) == ("onpolicy", 1, 8, 8 * TOKENS_PER_STEP)
    assert p["score"] == pytest.approx(_correct((0, *STEPS), 30, 4, seed=1)[8].mean() / 4)
    # R0 is the warm-up's pass@1, and pass@4 has the warm-up's pass@4
    w = pts[(pts["model"] == "warmup") & (pts["metric"] == "pass@1")]
    assert len(w) == 3 and pooled["r0"] == pytest.approx(w["score"].iloc[0])
    s = json.loads((out / "settings.json").read_text())
    assert s["command"] == "scaling" and s["r0"] == "fixed to the step-0 score" and s["tables"] == ["fits", "points"]
    # wall seconds: the same fit at 3 s per step (C_mid scales with the unit, A does not)
    assert cli.main(_cli(tmp_path, "--compute", "wall", "--k", "1", "--out", str(tmp_path / "wall"))) == 0
    wall = pd.read_parquet(tmp_path / "wall" / "fits.parquet")
    w = wall[wall["fit"] == "pooled"].iloc[0]
    assert w["A"] == pytest.approx(pooled["A"], abs=1e-6)
    assert w["C_mid"] == pytest.approx(pooled["C_mid"] * WALL_PER_STEP / TOKENS_PER_STEP, rel=1e-5)
    assert set(wall["metric"]) == {"pass@1"}


def test_cli_refuses_four_checkpoints_and_missing_compute_with_one_line(tmp_path, capsys):
    _eval_folder(tmp_path, seeds=(0,), steps=(2, 4, 8, 16))
    run = str(tmp_path / "runs" / "onpolicy-seed0")
    args = ["scaling", "--run", run, "--eval-dir", str(tmp_path / "eval"), "--checkpoints", "warmup=0",
            "--out", str(tmp_path / "bad")]
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: scaling: no usable fit: countdown onpolicy seed 0 pass@1: 4 points with compute > "
                          "0; a fit needs at least 5: score checkpoints at more compute") and len(err.splitlines()) == 1
    assert not (tmp_path / "bad").exists()
    (tmp_path / "runs" / "onpolicy-seed0" / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "time/step_s": 1.0}) + "\n" for s in range(16)))
    assert cli.main(args) == 2
    assert "compute columns missing: metrics.jsonl has no tokens/generated (--compute tokens); use --compute wall" \
        in capsys.readouterr().err
    assert cli.main(["scaling", "--run", run]) == 2
    assert "scaling needs --run RUN_DIR and --eval-dir DIR" in capsys.readouterr().err


# ---- a points table ----------------------------------------------------------------------------------------------
def _points_csv(path: Path, *, curve=TRUE, seeds=(0, 1, 2), noise=0.0, wall=True) -> Path:
    """demo.premise's training_curve.csv columns; two methods: on-policy (TRUE) and one with half the C_mid."""
    rng = np.random.default_rng(7)
    rows = []
    for method, cm in (("onpolicy", curve["C_mid"]), ("seeds", curve["C_mid"] / 2)):
        for s in seeds:
            for st in (0, *STEPS):
                c = _compute([st])
                p1 = float(SC.curve(c, curve["A"], cm, curve["B"], curve["R0"])[0]) + (noise * rng.normal()
                                                                                       if st else 0.0)
                rows.append({"method": method, "seed": s, "step": st, "pass@1": p1, "pass@k": min(1.0, 1.3 * p1),
                             "k": 8, "tokens_generated": 100_000 * st, "tokens_prefilled": 20_000 * st,
                             "tokens_trained": 0, **({"train_wall_s": WALL_PER_STEP * st} if wall else {}),
                             "past_budget": False})
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_cli_on_a_points_table(tmp_path, capsys):
    csv = _points_csv(tmp_path / "training_curve.csv")
    out = tmp_path / "out"
    assert cli.main(["scaling", "--points", str(csv), "--n-boot", "30", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "pass@1 against generated + prefilled tokens" in printed and "pass@8" in printed
    assert "unavailable (a points table has no per-problem scores" in printed and "seeds (30 resamples)" in printed
    fits = pd.read_parquet(out / "fits.parquet")
    assert len(fits) == 16   # 2 methods x (3 seeds + pooled) x (pass@1, pass@8)
    for method, cm in (("onpolicy", TRUE["C_mid"]), ("seeds", TRUE["C_mid"] / 2)):
        d = fits[(fits["method"] == method) & (fits["metric"] == "pass@1")]
        assert np.allclose(d["A"], TRUE["A"], atol=1e-6) and np.allclose(d["B"], TRUE["B"], atol=1e-6)
        assert np.allclose(d["C_mid"], cm, rtol=1e-6) and (d["status"] == "ok").all()
        one = d[d["fit"] == "seed"].iloc[0]
        assert math.isnan(one["A_low"]) and one["interval"].startswith("unavailable")
        pooled = d[d["fit"] == "pooled"].iloc[0]
        assert pooled["interval"] == "seeds (30 resamples)"
        # identical seeds: every seed resample is the same curve
        assert pooled["A_low"] == pytest.approx(TRUE["A"], abs=1e-6) == pooled["A_high"]
    assert json.loads((out / "settings.json").read_text())["source"] == str(csv.resolve())
    # two seeds: no interval at all; --k other than the table's; no wall column
    _points_csv(csv, seeds=(0, 1), wall=False)
    assert cli.main(["scaling", "--points", str(csv), "--out", str(tmp_path / "two")]) == 0
    assert (pd.read_parquet(tmp_path / "two" / "fits.parquet")["boot_fits"] == 0).all()
    capsys.readouterr()
    assert cli.main(["scaling", "--points", str(csv), "--k", "4"]) == 2
    assert "--k 4: --points" in capsys.readouterr().err
    assert cli.main(["scaling", "--points", str(csv), "--compute", "wall"]) == 2
    assert capsys.readouterr().err.strip() == (f"error: --points {csv}: compute columns missing: no train_wall_s "
                                               f"(--compute wall); use --compute tokens or a table with train_wall_s")


def test_a_points_table_of_a_straight_line_is_not_identified(tmp_path, capsys):
    csv = tmp_path / "line.csv"
    rows = [{"method": "m", "seed": 0, "step": st, "pass@1": 0.2 + 0.05 * math.log2(st) if st else 0.2,
             "tokens_generated": 1000 * st, "tokens_prefilled": 0} for st in (0, *STEPS)]
    pd.DataFrame(rows).to_csv(csv, index=False)
    assert cli.main(["scaling", "--points", str(csv), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: scaling: no usable fit: m seed 0 pass@1: asymptote not identified: the run has not "
                          "bent yet") and len(err.splitlines()) == 1


# ---- the figure and the notebook -----------------------------------------------------------------------------------
def test_figure_from_the_written_tables(tmp_path):
    from figures.scaling import load_scaling, plot_scaling

    out = tmp_path / "tree" / "scaling"
    assert cli.main(["scaling", "--points", str(_points_csv(tmp_path / "c.csv")), "--n-boot", "5",
                     "--out", str(out)]) == 0
    tables = load_scaling(tmp_path / "tree")
    fig = plot_scaling(tables)
    assert len(fig.axes) == 2
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    dashed = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    assert sorted(round(float(ln.get_ydata()[0]), 6) for ln in dashed) == [72.0, 72.0]   # A of both methods, in %
    path = tmp_path / "scaling.png"
    fig.savefig(path, dpi=50)
    assert path.read_bytes()[:8] == PNG_MAGIC


@pytest.mark.slow   # executes the notebook in a kernel
def test_the_notebook_draws_the_figure_from_the_tables(tmp_path, capsys, monkeypatch):
    import nbformat

    from figures.notebook import main as notebook_main

    out = tmp_path / "results" / "analysis" / "curve" / "scaling"
    assert cli.main(["scaling", "--points", str(_points_csv(tmp_path / "c.csv")), "--n-boot", "5",
                     "--out", str(out)]) == 0
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    capsys.readouterr()
    assert notebook_main(["scaling", str(tmp_path / "results"), "--out", str(tmp_path / "nb")]) == 0
    assert (tmp_path / "nb" / "scaling.png").read_bytes()[:8] == PNG_MAGIC
    nb = nbformat.read(tmp_path / "nb" / "scaling.ipynb", as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert str(out) in "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
