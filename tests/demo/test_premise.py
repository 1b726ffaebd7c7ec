"""demo/premise.py (issue #16): the estimators and the crossover on hand-made numbers, then the whole premise
regime at a toy budget in a temporary folder (warm-up, two methods, eval, relay, tables, figures, page, the
notebook), its numbers checked against brute-force recomputations from the files it wrote, and a rerun that
must skip every finished piece."""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from contracts.passk import pass_at_k, passk_matrix
from demo.common import DemoError
from demo.premise import prepare_out, run_premise
from demo.premise_budget import TOY
from demo.premise_stats import canonical_solution, crossover_k, crossover_table, distinct_correct
from contracts.passk import k_grid

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ---- pure pieces ------------------------------------------------------------------------------------------------
def brute_pass_at_k(correct: list[bool], k: int) -> float:
    """The fraction of all k-subsets of the samples holding at least one correct sample."""
    subsets = list(itertools.combinations(range(len(correct)), k))
    return sum(any(correct[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n,c", [(8, 0), (8, 1), (8, 3), (8, 8), (10, 2), (12, 5)])
def test_unbiased_pass_at_k_equals_the_brute_force_subset_average(n, c):
    correct = [True] * c + [False] * (n - c)
    for k in range(1, n + 1):
        assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(correct, k), abs=1e-12)
    m = passk_matrix(np.array([n, n]), np.array([c, 0]), k_grid(n))
    assert m.shape == (2, len(k_grid(n)))
    assert np.all(np.diff(m[0]) >= -1e-12) and np.all(m[1] == 0)   # monotone in k


def test_passk_grid():
    assert k_grid(64) == [1, 2, 4, 8, 16, 32, 64]
    assert k_grid(12) == [1, 2, 4, 8, 12]


def test_crossover_on_hand_made_curves():
    ks = [1, 2, 4, 8]
    # +10, +5, -5: the sign changes between k = 2 and 4, at 5 / (5 + 5) = half way in log2 k -> 2 ** 1.5
    assert crossover_k(ks, [0.10, 0.05, -0.05, -0.10]) == pytest.approx(2 ** 1.5)
    assert crossover_k(ks, [0.10, 0.0, -0.05, -0.1]) == pytest.approx(2.0)       # exactly zero at a grid point
    assert crossover_k(ks, [0.10, 0.08, 0.06, 0.01]) == math.inf               # never crosses inside the grid
    assert crossover_k(ks, [-0.01, 0.02, 0.03, 0.04]) == 1.0                   # the final model never leads
    assert crossover_k(ks, [0.30, 0.10, -0.10, 0.05]) == pytest.approx(2 ** 1.5)   # the FIRST crossing


def test_crossover_table_point_interval_and_paired_differences():
    rng = np.random.default_rng(0)
    ks = [1, 2, 4, 8]
    P = 300
    warm = np.tile([0.2, 0.35, 0.55, 0.75], (P, 1)) + rng.normal(0, 0.05, (P, 4))
    final = warm + np.array([0.10, 0.05, -0.05, -0.10]) + rng.normal(0, 0.05, (P, 4))
    ct = crossover_table(warm, final, ks)
    assert ct["crossover_k"] == pytest.approx(crossover_k(ks, (final - warm).mean(axis=0)))
    assert 2.0 < ct["low"] <= ct["crossover_k"] <= ct["high"] < 4.0
    assert ct["frac_within_grid"] == 1.0 and ct["frac_final_never_leads"] == 0.0
    for j, row in enumerate(ct["per_k"]):
        assert row["k"] == ks[j]
        assert row["diff"] == pytest.approx((final - warm)[:, j].mean())
        assert row["low"] < row["diff"] < row["high"]
    same = crossover_table(warm, warm, ks)
    assert same["crossover_k"] == 1.0 and same["frac_final_never_leads"] == 1.0


def test_canonical_solution_counts_like_the_solver():
    # operand order of + and * does not make a new solution ...
    assert canonical_solution("8*3=24\n24-4=20\n= (8*3)-4") == canonical_solution("= (3*8)-4")
    assert canonical_solution("= (4*3)+8") == canonical_solution("= 8+(3*4)")
    # ... a different tree does (the solver counts (a+b)+c and a+(b+c) as two expressions)
    assert canonical_solution("= (1+2)+3") != canonical_solution("= 1+(2+3)")
    assert canonical_solution("= (8-3)*4") != canonical_solution("= (8*3)-4")
    assert canonical_solution("= 10-5-2") == canonical_solution("= (10-5)-2")   # left-associative
    for bad in ("", "8*3=24", "= (8*3", "= 8*"):
        assert canonical_solution(bad) is None


def test_distinct_correct_counts_distinct_correct_expressions_only():
    rows = [{"problem_id": "b", "responses": ["= 8+(3*4)", "= (4*3)+8", "= (8-3)*4", "= 1+1"],
             "correct": [True, True, True, False]},
            {"problem_id": "a", "responses": ["= 2+2", "x"], "correct": [False, False]}]
    assert distinct_correct(rows).tolist() == [0, 2]   # sorted by problem id: a, then b


def test_at_first_reach_interpolates_between_the_bracketing_checkpoints():
    from demo.premise_stats import at_first_reach

    steps, p1, pk = [0, 10, 20, 30], [0.20, 0.30, 0.28, 0.40], [0.90, 0.80, 0.82, 0.70]
    hit = at_first_reach(steps, p1, pk, 0.25)   # halfway from step 0 to 10 in pass@1
    assert hit["reached"] and hit["step"] == pytest.approx(5.0) and hit["y"] == pytest.approx(0.85)
    hit = at_first_reach(steps, p1, pk, 0.30)   # reached exactly at step 10: its own values
    assert hit["step"] == pytest.approx(10.0) and hit["y"] == pytest.approx(0.80)
    hit = at_first_reach(steps, p1, pk, 0.34)   # the FIRST crossing: between 20 (0.28) and 30 (0.40)
    assert hit["step"] == pytest.approx(20 + 10 * 0.5) and hit["y"] == pytest.approx(0.76)
    assert at_first_reach(steps, p1, pk, 0.10) == {"reached": True, "step": 0.0, "x": 0.20, "y": 0.90}
    miss = at_first_reach(steps, p1, pk, 0.41)
    assert miss["reached"] is False and np.isnan(miss["y"]) and np.isnan(miss["step"])


def test_matched_rows_by_hand():
    from demo.premise import matched_rows

    def row(method, step, p1, pk, gen):
        return {"method": method, "seed": 0, "step": step, "pass@1": p1, "pass@k": pk, "k": 64,
                "tokens_generated": gen, "tokens_prefilled": 0, "tokens_trained": 0, "train_wall_s": 0.0}

    curve = [row("onpolicy", 0, 0.2, 0.9, 0), row("onpolicy", 10, 0.3, 0.8, 1000), row("onpolicy", 20, 0.4, 0.7, 2000),
             row("seeds_ratio", 0, 0.2, 0.9, 0), row("seeds_ratio", 10, 0.3, 0.9, 500),
             row("seeds_ratio", 20, 0.5, 0.8, 1000),
             row("luffy", 0, 0.2, 0.9, 0), row("luffy", 20, 0.3, 0.95, 3000)]
    got = {r["method"]: r for r in matched_rows(curve, 64)}
    on, sr, lu = got["onpolicy"], got["seeds_ratio"], got["luffy"]
    assert on["reached"] and on["step"] == 20 and on["diff"] == pytest.approx(0.0) and on["target_pass@1"] == 0.4
    # seeds_ratio reaches pass@1 0.4 halfway from step 10 to 20: pass@64 0.85 against on-policy's 0.7
    assert sr["step"] == pytest.approx(15.0) and sr["pass@k"] == pytest.approx(0.85)
    assert sr["diff"] == pytest.approx(0.15)
    # matched compute: C = min(1000, 2000) tokens; seeds_ratio's final 0.8 against on-policy at 1000 tokens, 0.8
    assert sr["compute_tokens"] == 1000 and sr["pass@k_at_compute"] == pytest.approx(0.8)
    assert sr["diff_at_compute"] == pytest.approx(0.0)
    assert sr["pass@1_at_compute"] == pytest.approx(0.5) and sr["diff1_at_compute"] == pytest.approx(0.5 - 0.3)
    # luffy never reaches 0.4 within its checkpoints; at C = 2000 tokens: 0.9 + (2/3)(0.05) against 0.7
    assert lu["reached"] is False and np.isnan(lu["diff"])
    assert lu["pass@k_at_compute"] == pytest.approx(0.9 + 0.05 * 2000 / 3000) and lu["diff_at_compute"] > 0.2
    assert lu["diff1_at_compute"] == pytest.approx(0.2 + 0.1 * 2000 / 3000 - 0.4)


# ---- the toy regime, end to end ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The toy regime through `python -m demo --toy` (the main job, issue #27: the premise stages, Figures 2-5 and
    the summary), in this process at one torch thread, then the premise page written from its tables."""
    import torch

    from demo.__main__ import main as demo_main
    from demo.premise_page import write_page

    before = torch.get_num_threads()
    try:
        root = tmp_path_factory.mktemp("premise")
        out, doc = root / "out", root / "docs" / "premise.md"
        logs: list[str] = []
        assert demo_main(["--toy", "--out", str(out), "--threads", "1"]) == 0
        write_page(out, TOY, doc=doc, log=logs.append)
    finally:
        torch.set_num_threads(before)   # the tests after this module run at the thread count they had
    return out, doc, None, logs


@pytest.mark.slow
def test_the_toy_page_is_recomputed_from_the_tables_written_beside_it(toy, tmp_path):
    """write_page copies the tables folder beside the page (``<page>/tables/``, with page.json): the page's generated
    part is what that folder alone renders, and its statistics are what its per-problem counts give."""
    from tests.helpers.pages import generated_part, recompute, rerender, tamper

    out, doc, _, _ = toy
    tdir = doc.parent / "premise" / "tables"
    assert {"page.json", "per_problem.csv", "relay_problems.csv", "heldout_solutions.csv",
            "warmup_summary.json"} <= {p.name for p in tdir.iterdir()}
    assert rerender(doc) == generated_part(doc.read_text())
    assert recompute(tdir) == []
    assert sum(p.stat().st_size for p in tdir.iterdir()) < 500_000     # kilobytes, to commit
    bad, differs = tamper(doc, tmp_path)                               # and both checks can fail
    assert any(b.startswith("passk_curves.pass") for b in bad) and differs, bad


@pytest.mark.slow
def test_toy_regime_writes_every_table_figure_and_the_page(toy):
    out, doc, res, _ = toy
    for name in ("passk_curves", "passk_diff", "distinct", "methods", "entropy_positions", "relay_passk", "support",
                 "seed_lift_summary", "seed_lift_by_depth", "seed_lift_by_age"):
        assert (out / "tables" / f"{name}.csv").is_file(), name
    assert set(json.loads((out / "tables" / "crossover.json").read_text())) == {"early", "final"}
    for name in ("premise_passk", "premise_entropy", "premise_relay"):
        png = (out / "figures" / f"{name}.png").read_bytes()
        assert png[:8] == PNG_MAGIC and len(png) > 5000
        assert (doc.parent / "premise" / f"{name}.png").is_file()
    page = doc.read_text()
    for section in ("## Does RL narrow the policy?", "**Crossover**", "## Relay (Figure 2)", "## Methods table",
                    "## Along training: pass@1 against pass@8", "## Cost", "## Grid searched",
                    "premise/premise_passk.png", "premise/premise_frontier.png"):
        assert section in page, section


@pytest.mark.slow   # the toy regime
def test_toy_training_curve_scores_every_checkpoint_and_ends_at_the_methods_table(toy):
    from demo.premise_budget import curve_steps, method_list

    out, doc, _, _ = toy
    curve = pd.read_csv(out / "tables" / "training_curve.csv")
    methods = pd.read_csv(out / "tables" / "methods.csv").set_index(["method", "seed"])
    warm = pd.read_csv(out / "tables" / "passk_curves.csv").query("model == 'warmup'").set_index("k")["pass"]
    assert curve_steps(TOY) == [1, 2]
    for method in method_list(TOY):
        g = curve[(curve["method"] == method) & (curve["seed"] == 0)].sort_values("step")
        assert g["step"].tolist() == [0, 1, 2, TOY.total_steps], method
        assert g["pass@1"].iloc[0] == pytest.approx(warm[1])
        assert g["pass@k"].iloc[0] == pytest.approx(warm[TOY.eval_n])
        last, final = g.iloc[-1], methods.loc[(method, 0)]
        assert last["pass@1"] == pytest.approx(final["pass@1"])
        assert last["pass@k"] == pytest.approx(final[f"pass@{TOY.eval_n}"])
        assert last["tokens_generated"] == final["tokens_generated"] and final["tokens_prefilled"] > 0
        assert g["tokens_generated"].is_monotonic_increasing and g["tokens_generated"].iloc[0] == 0
        run = out / "eval" / f"{method}-seed0-step001" / "countdown.jsonl"
        assert run.is_file()   # the intermediate checkpoints were scored as models of their own
    matched = pd.read_csv(out / "tables" / "matched_pass1.csv").set_index("method")
    assert set(matched.index) == set(method_list(TOY))
    on = matched.loc["onpolicy"]
    assert on["target_pass@1"] == pytest.approx(methods.loc[("onpolicy", 0), "pass@1"]) and bool(on["reached"])
    png = (out / "figures" / "premise_frontier.png").read_bytes()
    assert png[:8] == PNG_MAGIC and len(png) > 5000


@pytest.mark.slow   # the toy regime: a warm-up and four short runs
def test_toy_curves_are_the_unbiased_estimator_over_the_eval_files(toy):
    from contracts.samples import read_samples

    out, _, _, _ = toy
    curves = pd.read_csv(out / "tables" / "passk_curves.csv")
    ks = k_grid(TOY.eval_n)
    for model, folder in (("warmup", "warmup"), ("early", "early"), ("final", "onpolicy-seed0")):
        rows = read_samples(out / "eval" / folder / "countdown.jsonl")
        assert len(rows) == TOY.heldout and all(len(r["correct"]) == TOY.eval_n for r in rows)
        d = curves[curves["model"] == model].sort_values("k")
        assert d["k"].tolist() == ks
        brute = [np.mean([brute_pass_at_k(r["correct"], k) for r in rows]) for k in ks]
        assert d["pass"].to_numpy() == pytest.approx(brute, abs=1e-9)
        assert np.all(np.diff(d["pass"].to_numpy()) >= -1e-12)                  # monotone in k
        assert np.all(d["low"] <= d["pass"] + 1e-12) and np.all(d["pass"] <= d["high"] + 1e-12)
    cross = json.loads((out / "tables" / "crossover.json").read_text())
    w = curves[curves["model"] == "warmup"].sort_values("k")["pass"].to_numpy()
    f = curves[curves["model"] == "final"].sort_values("k")["pass"].to_numpy()
    assert cross["final"]["crossover_k"] == crossover_k(ks, f - w)
    methods = pd.read_csv(out / "tables" / "methods.csv")
    assert sorted(zip(methods["method"], methods["seed"])) == [("luffy", 0), ("onpolicy", 0), ("seeds_entropy", 0),
                                                               ("seeds_ratio", 0)]
    on = methods[methods["method"] == "onpolicy"].iloc[0]
    assert on[f"pass@{TOY.eval_n}"] == pytest.approx(f[-1])
    relay = pd.read_csv(out / "tables" / "relay_passk.csv")
    assert relay["k"].tolist() == [1, 2, 4, 8]
    ent = pd.read_csv(out / "tables" / "entropy_positions.csv") if (out / "tables" / "entropy_positions.csv").stat().st_size > 1 else None
    if ent is not None and len(ent):
        assert set(ent["step"]) <= set(range(TOY.total_steps)) and (ent["entropy"] >= 0).all()


@pytest.mark.slow   # the toy regime: a warm-up and four short runs
def test_toy_rerun_skips_finished_work_and_refuses_another_budget(toy):
    out, doc, _, _ = toy
    run_file = out / "runs" / "onpolicy-seed0" / "metrics.jsonl"
    eval_file = out / "eval" / "onpolicy-seed0" / "countdown.jsonl"
    measured = out / "measured.json"
    before = (run_file.stat().st_mtime_ns, eval_file.read_text())
    record = measured.read_text()
    measured.write_text(record.replace('"commit": ', '"commit": "the-first-run", "was": '))   # as another commit
    logs: list[str] = []
    run_premise(TOY, out, doc=doc, log=logs.append)
    assert '"the-first-run"' in measured.read_text()   # nothing trained: the record of the run that did is kept
    measured.write_text(record)
    skipped = {m.split(":")[0] for m in logs if "finished run exists, skipped" in m}
    assert skipped == {"onpolicy-seed0", "seeds_ratio-seed0", "seeds_entropy-seed0", "luffy-seed0"}
    assert not any(": done in " in m for m in logs)                              # nothing was trained again
    assert not any("early phase" in m or "final phase" in m for m in logs)     # the relay is cached too
    assert (run_file.stat().st_mtime_ns, eval_file.read_text()) == before
    with pytest.raises(DemoError, match=r"other settings \(lr: recorded 0\.0001, now 0\.001\); rerun with --fresh"):
        prepare_out(out, replace(TOY, lr=1e-3), fresh=False, log=lambda m: None)


@pytest.mark.slow   # the toy regime, then three of its runs continued two steps
def test_extend_to_continues_copies_of_the_runs_that_miss_on_policys_pass1(toy, tmp_path, monkeypatch):
    import shutil

    import demo.premise as premise
    from demo.common import read_metrics
    from demo.premise_budget import method_list
    from demo.premise_page import write_page

    out0, *_ = toy
    out = tmp_path / "out"
    shutil.copytree(out0, out, copy_function=premise._link_copy)   # the module's folder stays as the others read it
    before = {n: pd.read_csv(out0 / "tables" / f"{n}.csv") for n in ("methods", "training_curve", "matched_pass1")}
    real = premise._pass1
    # on-policy's final pass@1 made unreachable: every other run is continued to the last step, none reaches it
    monkeypatch.setattr(premise, "_pass1", lambda root, name, ks: 1.01 if name == "onpolicy-seed0" else
                        real(root, name, ks))
    data = {k: out / "data" / f"{k}.jsonl" for k in ("heldout", "warmup", "train")}
    rec = premise.extend_runs(out, TOY, data=data, extend_to=5, log=lambda m: None)
    monkeypatch.undo()
    others = [m for m in method_list(TOY) if m != "onpolicy"]
    assert sorted(rec["runs"]) == sorted(f"{m}-seed0" for m in others)
    assert json.loads((out / "extension.json").read_text()) == rec
    for m in others:
        assert rec["runs"][f"{m}-seed0"] == {"method": m, "seed": 0, "target_pass@1": 1.01, "trained_to": 5,
                                             "reached_at": None}
        short, long = read_metrics(out / "runs" / f"{m}-seed0"), read_metrics(out / "runs" / f"{m}-seed0-long")
        assert [x["step"] for x in short] == [0, 1, 2] and [x["step"] for x in long] == [0, 1, 2, 3, 4]
        assert long[:3] == short == read_metrics(out0 / "runs" / f"{m}-seed0")   # the run itself is untouched
        for st in (4, 5):
            assert (out / "runs" / f"{m}-seed0-long" / "checkpoints" / f"step_{st - 1:06d}").is_dir()
            assert (out / "eval" / f"{m}-seed0-step{st:03d}" / "countdown.jsonl").is_file()
    assert not (out / "runs" / "onpolicy-seed0-long").exists()
    # the tables: the continued runs' curves reach step 5; what reads the budget's 3 steps does not move
    t = premise.analyse(out, TOY, log=lambda m: None)
    curve = t["training_curve"]
    for m in others:
        g = curve[curve["method"] == m].sort_values("step")
        assert g["step"].tolist() == [0, 1, 2, 3, 4, 5]
        assert g["past_budget"].tolist() == [False] * 4 + [True] * 2   # the frontier figure leaves these out
        assert g["tokens_generated"].is_monotonic_increasing
    pd.testing.assert_frame_equal(curve[curve["step"] <= TOY.total_steps].reset_index(drop=True),
                                  before["training_curve"], check_dtype=False)
    pd.testing.assert_frame_equal(t["methods"], before["methods"])
    matched, old = t["matched_pass1"].set_index("method"), before["matched_pass1"].set_index("method")
    for col in ("target_pass@1", "final_pass@1", "compute_tokens", "pass@k_at_compute", "diff_at_compute"):
        assert np.allclose(matched[col].astype(float), old.loc[matched.index, col].astype(float), equal_nan=True), col
    # a run that reaches the target past the budget is matched there; one that reached it within the budget is not
    # continued, so its matched step is the same as before
    for m in others:
        row = matched.loc[m]
        if bool(old.loc[m, "reached"]):
            assert row["step"] == pytest.approx(old.loc[m, "step"])
        elif bool(row["reached"]):
            assert TOY.total_steps < row["step"] <= 5
    doc = tmp_path / "docs" / "extended.md"
    page = write_page(out, TOY, doc=doc, log=lambda m: None, title="Extended rows")
    assert page.startswith("# Extended rows\n") and "`--extend-to 5`" in page and "to step 5" in page
    assert "](extended/premise_frontier.png)" in page and (doc.parent / "extended" / "premise_frontier.png").is_file()
    assert not (doc.parent / "premise").exists()   # another page's figures are never overwritten


@pytest.mark.slow
def test_the_notebook_draws_the_four_figures_from_the_tables(toy, monkeypatch):
    import base64

    import nbformat
    from nbclient import NotebookClient

    out, _, _, _ = toy
    nb = nbformat.read(REPO / "notebooks" / "premise.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code)
    assert "parameters" in code[0].metadata.get("tags", []) and "THINKING_SEEDS_PREMISE" in code[0].source
    body = "\n".join(c.source for c in code[1:])
    assert "load_tables" in body and "plot_" in body and "for " not in body and "def " not in body
    monkeypatch.setenv("THINKING_SEEDS_PREMISE", str(out))
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(REPO / "notebooks")}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if o.output_type in ("display_data", "execute_result") and "image/png" in o.data]
    assert len(images) == 4
    assert all(base64.b64decode(i.data["image/png"])[:8] == PNG_MAGIC for i in images)


@pytest.mark.slow
def test_demo_premise_flag_reaches_the_premise_command():
    proc = subprocess.run([sys.executable, "-m", "demo", "--premise", "--help"], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0 and "python -m demo.premise" in proc.stdout and "--budget" in proc.stdout


# ---- python -m demo's main job (issue #27): the reduced regime's outputs and its summary ------------------------
@pytest.mark.slow
def test_main_job_writes_figures_2_to_5_the_paired_table_and_the_summary(toy):
    from demo.reduced import FIGURES, SUMMARY

    out, _, _, _ = toy
    for name in (*FIGURES, "premise_passk", "premise_entropy", "premise_relay", "premise_seed_lift"):
        png = (out / "figures" / f"{name}.png").read_bytes()
        assert png[:8] == PNG_MAGIC and len(png) > 5000, name
    summary = (out / SUMMARY).read_text()
    for section in ("## What to see", "**What the reduction costs**", "## pass@k: warm-up, early, final",
                    "## Relay (Figure 2)", "## Methods (training seed 0)", "## Cost", "figures/fig2_relay.png",
                    "## What RL lost and the relay recovers", "## Restart value of the seeds"):
        assert section in summary, section
    assert "Figures 2-5 (+ Lemma 4, mismatch)" in json.loads((out / "stages.json").read_text())
    h = json.loads((out / "summary.json").read_text())["headline"]
    assert h["K"] == TOY.eval_n and [m["method"] for m in h["methods"]] == ["onpolicy", "seeds_ratio",
                                                                            "seeds_entropy", "luffy"]


@pytest.mark.slow
def test_methods_vs_onpolicy_is_the_paired_bootstrap_over_the_eval_files(toy):
    from contracts.passk import paired_bootstrap
    from contracts.samples import read_samples
    from demo.premise_stats import per_problem

    out, _, _, _ = toy
    ks = k_grid(TOY.eval_n)
    vs = pd.read_csv(out / "tables" / "methods_vs_onpolicy.csv")
    assert sorted(set(vs["method"])) == ["luffy", "seeds_entropy", "seeds_ratio"] and len(vs) == 3 * len(ks)
    on = per_problem(read_samples(out / "eval" / "onpolicy-seed0" / "countdown.jsonl"), ks)[3]
    for method in ("seeds_ratio", "luffy"):
        m = per_problem(read_samples(out / "eval" / f"{method}-seed0" / "countdown.jsonl"), ks)[3]
        for j, k in enumerate(ks):
            row = vs[(vs["method"] == method) & (vs["k"] == k)].iloc[0]
            want = paired_bootstrap(m[:, j], on[:, j])
            assert (row["diff"], row["low"], row["high"]) == pytest.approx((want["diff"], want["low"], want["high"]))


def _tables(out: Path, *, pass64_high: float, relay_gain: bool = False) -> None:
    """Hand-made tables in the premise layout: docs/premise.md's measured numbers for the curves and the relay."""
    t = out / "tables"
    t.mkdir(parents=True)
    curve = {"warmup": (0.185, 0.930), "early": (0.221, 0.895), "final": (0.284, 0.755)}
    pd.DataFrame([{"model": m, "k": k, "pass": v[i], "low": v[i] - 0.02, "high": v[i] + 0.02}
                  for m, v in curve.items() for i, k in enumerate((1, 64))]).to_csv(t / "passk_curves.csv", index=False)
    pd.DataFrame([{"model": "final", "k": 1, "diff": 0.099, "low": 0.062, "high": 0.135, "p_value": 0.0},
                  {"model": "final", "k": 64, "diff": -0.175, "low": -0.235, "high": pass64_high, "p_value": 0.0},
                  {"model": "early", "k": 1, "diff": 0.036, "low": 0.01, "high": 0.06, "p_value": 0.0},
                  {"model": "early", "k": 64, "diff": -0.035, "low": -0.07, "high": 0.0, "p_value": 0.05}]
                 ).to_csv(t / "passk_diff.csv", index=False)
    (t / "crossover.json").write_text(json.dumps({"final": {"crossover_k": 3.9, "low": 2.6, "high": 5.7},
                                                  "early": {"crossover_k": 6.4, "low": 2.9, "high": 37.4}}))
    pd.DataFrame([{"k": 1, "early": 0.214, "relay": 0.211, "final": 0.282, "diff": -0.070, "diff_low": -0.100,
                   "diff_high": -0.039},
                  {"k": 64, "early": 0.905, "relay": 0.905, "final": 0.760, "diff": 0.145, "diff_low": 0.085,
                   "diff_high": 0.205}]).to_csv(t / "relay_passk.csv", index=False)
    # per problem (n = 64): relay and early solve the same 10 of 20 problems at k = 64; with relay_gain the relay
    # also solves the other 10 (10 of 64 correct each: pass@64 = 1)
    early = [0] * 10 + [20] * 10
    relay = ([10] * 10 if relay_gain else [0] * 10) + [20] * 10
    pd.DataFrame({"problem_id": [f"p{i}" for i in range(20)], "n": 64, "early_correct": early, "relay_correct": relay,
                  "final_correct": [3] * 20}).to_csv(t / "relay_problems.csv", index=False)
    pd.DataFrame([{"method": m, "seed": 0, "pass@1": p1, "pass@64": p64, "distinct_correct": dc, "crossover_k": ck}
                  for m, p1, p64, dc, ck in (("onpolicy", 0.284, 0.755, 1.26, 3.9), ("seeds_ratio", 0.275, 0.84, 1.5,
                                                                                    7.1))]).to_csv(t / "methods.csv",
                                                                                                  index=False)
    pd.DataFrame([{"method": "seeds_ratio", "seed": 0, "k": 1, "diff": -0.009, "low": -0.04, "high": 0.02,
                   "p_value": 0.6},
                  {"method": "seeds_ratio", "seed": 0, "k": 64, "diff": 0.085, "low": 0.04, "high": 0.13,
                   "p_value": 0.001}]).to_csv(t / "methods_vs_onpolicy.csv", index=False)
    pd.DataFrame([{"model": "warmup", "distinct_correct": 1.96}]).to_csv(t / "distinct.csv", index=False)
    (out / "warmup").mkdir()
    (out / "warmup" / "warmup_summary.json").write_text(json.dumps({"steps": 400, "loss_last": 0.125}))


def test_the_summary_leads_with_the_tables_numbers_and_says_when_an_effect_is_within_noise(tmp_path):
    from demo.premise_budget import REDUCED
    from demo.reduced import render_summary

    _tables(tmp_path, pass64_high=-0.12)
    s = render_summary(tmp_path, REDUCED, {"skipped": {}}, command="python -m demo")
    lead = s[s.index("## What to see"):s.index("**What the reduction costs**")]
    assert "**On-policy RL narrowed the policy.**" in lead
    assert "pass@1 went 18.5 → 28.4 % (+9.9 [+6.2, +13.5] points) and pass@64 93.0 → 75.5 % (-17.5 [-23.5, -12.0])" \
        in lead
    assert "cross at k = 3.9 [2.6, 5.7]" in lead
    assert "90.5 % against the final checkpoint's 76.0 %, +14.5 [+8.5, +20.5] points — the relay recovers" in lead
    assert "pass@1 -0.9 (within noise), pass@64 +8.5 (higher)" in lead
    # relay - early at k = 64 from relay_problems.csv: the same counts, so exactly 0 and said plainly (issue #40)
    assert ("Against the early checkpoint that wrote the prefixes, the relay is +0.0 [+0.0, +0.0] points at k = 64: "
            "**the relay equals the early checkpoint here.**") in lead
    assert "| Thinking Seeds, ratio 0.5 (state+action) | 27.5 | -0.9 [-4.0, +2.0] within noise | 84.0 | " \
           "+8.5 [+4.0, +13.0] higher |" in s
    assert ("1 training seed per method instead of 3, and the `m2po`, `restart_adaptive`, `restart_pool`, "
            "`seeds_entropy`, `seeds_state` rows left out") in s and "t = 4.30" in s

    gain = tmp_path / "gain"
    _tables(gain, pass64_high=-0.12, relay_gain=True)   # problem a: 0 -> 10 of 64 correct, pass@64 0 -> 1
    lead = render_summary(gain, REDUCED, {"skipped": {}}, command="python -m demo")
    assert "the relay is +50.0 [+" in lead and "points at k = 64: the final policy completes old states better" in lead
    assert "equals the early checkpoint" not in lead

    other = tmp_path / "noise"
    _tables(other, pass64_high=0.01)          # the fall at pass@64 now has an interval reaching above 0
    lead = render_summary(other, REDUCED, {"skipped": {}}, command="python -m demo")
    assert "but the fall at pass@64 is within noise at this size" in lead and "narrowed the policy" not in lead


def test_verdict_reads_an_interval_plainly():
    from demo.reduced import verdict

    assert [verdict(0.01, 0.2), verdict(-0.2, -0.01), verdict(-0.1, 0.1), verdict(0.0, 0.0)] == \
        ["higher", "lower", "within noise", "within noise"]


def test_demo_flags_and_an_addition_folder_get_one_line_exit_2(tmp_path, capsys):
    import torch

    from demo.__main__ import main as demo_main

    for argv, msg in ((["--task", "countdown", "--quick"], "--quick is the addition miniature"),
                      (["--task", "addition", "--toy"], "--toy is the countdown main job"),
                      (["--seeds", "0"], "--seeds must be >= 1")):
        with pytest.raises(SystemExit) as e:
            demo_main(argv)
        assert e.value.code == 2 and msg in capsys.readouterr().err
    old = tmp_path / "demo"
    old.mkdir()
    (old / "demo.json").write_text("{}")
    (old / "summary.md").write_text("an addition demo\n")
    before = torch.get_num_threads()
    try:
        assert demo_main(["--out", str(old), "--threads", "1"]) == 2
    finally:
        torch.set_num_threads(before)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds an addition demo" in err[0] and "--task addition --out" in err[0]
    assert (old / "summary.md").read_text() == "an addition demo\n"      # nothing touched


@pytest.mark.slow
def test_support_and_seed_lift_tables_are_those_of_the_tsanalysis_commands(toy):
    from tsanalysis.config import SupportConfig
    from tsanalysis.support import support_tables
    from tsanalysis.tables import seeds_tables

    out, _, _, _ = toy
    sup = pd.read_csv(out / "tables" / "support.csv")
    pairs = set(zip(sup["from"], sup["to"]))
    assert {("warmup", "early"), ("warmup", "final"), ("final", "relay"), ("early", "relay")} <= pairs
    want = support_tables(SupportConfig(eval_dir=out / "eval", models=["warmup", "early", "onpolicy-seed0", "relay"],
                                        relay=out / "analysis" / "relay" / "countdown-early-to-final-cut0.5"),
                          log=lambda m: None)
    w = want["support"].replace({"from": {"onpolicy-seed0": "final"}, "to": {"onpolicy-seed0": "final"}})
    assert list(zip(sup["from"], sup["to"], sup["k"])) == list(zip(w["from"], w["to"], w["k"]))
    for c in ("gained", "lost", "kept"):
        assert sup[c].to_numpy() == pytest.approx(w[c].to_numpy()), c
    lift = pd.read_csv(out / "tables" / "seed_lift_summary.csv").iloc[0]
    direct = seeds_tables(out / "runs" / "seeds_ratio-seed0")["summary"].iloc[0]
    assert lift["groups"] == direct["groups"] > 0 and lift["seeded_steps"] == direct["seeded_steps"] >= 1
    assert lift["lift_mean"] == pytest.approx(direct["lift_mean"], nan_ok=True)


@pytest.mark.slow   # the toy regime
def test_the_mechanism_grid_reads_a_premise_folder_and_its_page_recomputes(toy, tmp_path, capsys):
    """``python -m demo.mechanism --premise DIR --points 3n --doc PAGE`` (issue #40 item 1) on the toy folder, whose
    task is point 3n's: the grid row is the counts' (narrowing, relay - early), the lift table is the entropy-rule
    run's seeds, the page renders from the tables written beside it, and the hand-written notes survive a rewrite."""
    from demo.mechanism import main, point_row, read_point, render

    out, _, _, _ = toy
    doc = tmp_path / "docs" / "mechanism.md"
    assert main(["--premise", str(out), "--points", "3n", "--doc", str(doc), "--threads", "1"]) == 0
    tdir = tmp_path / "docs" / "mechanism" / "tables"
    assert {p.name for p in tdir.iterdir()} == {"grid.csv", "lift_by_depth.csv", "per_problem.csv",
                                                "relay_problems.csv", "page.json"}
    grid = pd.read_csv(tdir / "grid.csv").iloc[0]
    pp, relay, lift, wall, settings = read_point("3n", out)
    want = point_row("3n", pp, relay, lift, wall, settings)
    assert want["warmup_steps"] == TOY.warmup_steps   # the folder's budget, not the point's
    assert grid["K"] == TOY.eval_n and want["K"] == TOY.eval_n
    for k in ("final_pass1", "warmup_passK", "relay_early_diff", "relay_early_low", "relay_final_diff", "wall_s"):
        assert grid[k] == pytest.approx(want[k]), k
    counts = pd.read_csv(out / "tables" / "relay_problems.csv")
    assert grid["relay_passK"] == pytest.approx(pass_at_k(counts["n"], counts["relay_correct"], TOY.eval_n).mean())
    assert lift["seeds"].sum() > 0 and set(pd.read_csv(tdir / "lift_by_depth.csv")["point"]) == {"3n"}
    page = doc.read_text()
    assert page == render(tdir) and "| 3n | 3 numbers 1..10, target 1..30" in page
    assert f"| {grid['wall_s']:.0f} † |" in page and "† Read from a `demo.premise` folder" in page
    doc.write_text(page + "\n## Reading the grid\n\nhand-written\n")
    assert main(["--write-only", "--doc", str(doc)]) == 0
    assert doc.read_text().endswith("## Reading the grid\n\nhand-written\n")
    # a folder of another task is refused, one line, before anything runs
    other = tmp_path / "other"
    other.mkdir()
    (other / "premise.json").write_text(json.dumps({**json.loads((out / "premise.json").read_text()), "numbers": 4}))
    capsys.readouterr()
    assert main(["--premise", str(other), "--points", "3n", "--doc", str(doc)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "differs from point 3n's in numbers" in err[0]


@pytest.mark.slow   # the toy regime
def test_the_endpoints_section_renders_from_the_committed_tables(toy, tmp_path):
    """``--endpoints`` (issue #40 item 2): the page carries the fixed endpoints, read from its own tables folder,
    and the page.json record makes a re-render give the same page."""
    from demo.endpoints import endpoint_table
    from demo.premise_page import write_page
    from tests.helpers.pages import generated_part, rerender

    out, _, _, _ = toy
    doc = tmp_path / "docs" / "power.md"
    write_page(out, TOY, doc=doc, log=lambda m: None, endpoints=True)
    page = doc.read_text()
    assert "## Endpoints (fixed before the runs)" in page and "| E1 pass@1 at the budget |" in page
    tdir = tmp_path / "docs" / "power" / "tables"
    assert json.loads((tdir / "page.json").read_text())["endpoints"] is True
    assert rerender(doc) == generated_part(page)
    t = endpoint_table(pd.read_csv(tdir / "methods.csv"), pd.read_csv(tdir / "matched_pass1.csv"), TOY.eval_n)
    assert len(t) == 10 and (t["method"] == "seeds_ratio").sum() == 3   # TOY has no FR3E-like row: NaN, said as –


def test_support_section_reads_the_measured_counts():
    """The support rows and the sentence from a table of the counts `python -m demo` measured at k = 64 (warm-up ->
    final lost 50 and gained 2 of 200; final -> relay gained 39 and lost 5)."""
    from demo.premise_page import render_support, support_reading

    cols = ["from", "to", "k", "problems", "gained", "gained_low", "gained_high", "lost", "lost_low", "lost_high",
            "kept", "net", "net_low", "net_high"]
    sup = pd.DataFrame([("warmup", "final", 64, 200, 2.0, 0.0, 5.0, 50.0, 38.0, 62.0, 142.0, -48.0, -60.0, -36.0),
                        ("final", "relay", 64, 200, 39.0, 28.0, 50.0, 5.0, 1.0, 10.0, 139.0, 34.0, 22.0, 46.0),
                        ("warmup", "final", 8, 200, 9.0, 5.0, 13.0, 30.0, 22.0, 38.0, 100.0, -21.0, -30.0, -12.0)],
                       columns=cols)
    rows = render_support(sup, 64)
    assert rows[0].startswith("| at k = 64, of 200 problems |") and len(rows) == 4
    assert rows[2] == "| warmup → final | 2.0 [0.0, 5.0] | 50.0 [38.0, 62.0] | 142.0 | -48.0 [-60.0, -36.0] |"
    assert rows[3] == "| final → relay | 39.0 [28.0, 50.0] | 5.0 [1.0, 10.0] | 139.0 | +34.0 [+22.0, +46.0] |"
    text = support_reading(sup, 64)
    assert "lost 50.0 [38.0, 62.0] problems the warm-up solved and gained 2.0 [0.0, 5.0]" in text
    assert "the relay regained 39.0 [28.0, 50.0] problems" in text


def test_the_exploration_baselines_are_rows_the_premise_can_run(tmp_path, capsys):
    """Issue #25: each new preset makes a valid run of the regime (the budget's sizes over the preset's method);
    a --methods naming an unknown row is one line, exit 2, before anything is written."""
    from demo.premise import main as premise_main
    from demo.premise import rl_config

    want = {"clip_cov": ("clip_cov", "none", "grpo"), "kl_cov": ("kl_cov", "none", "grpo"),
            "passk": ("dapo", "none", "passk"), "w_reinforce": ("dapo", "none", "w_reinforce"),
            "high_entropy": ("dapo", "high_entropy", "grpo")}
    for method, (algorithm, token_mask, advantage) in want.items():
        cfg = rl_config(method, TOY, out=tmp_path, seed=0, model=tmp_path / "warmup",
                        train_file=tmp_path / "train.jsonl")
        assert (cfg.algorithm, cfg.token_mask, cfg.advantage) == (algorithm, token_mask, advantage), method
        assert (cfg.total_steps, cfg.prompts_per_step, cfg.task) == (TOY.total_steps, TOY.prompts_per_step,
                                                                     "countdown")
    out = tmp_path / "bad"
    assert premise_main(["--budget", "toy", "--methods", "onpolicy,bogus", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "methods ['bogus']" in err[0] and not out.exists()


def test_seed_lift_figure_leaves_out_bins_of_few_groups():
    from figures.premise import plot_seed_lift

    def bins(key, values, groups):
        d = pd.DataFrame({key: values, "groups": groups, "lift_mean": [0.0, -0.125, 0.01][:len(values)]})
        return d.assign(lift_low=d["lift_mean"] - 0.01, lift_high=d["lift_mean"] + 0.01)
    depth = bins("depth_lo", [0.4, 0.6, 0.8], [1376, 1, 40]).assign(depth_hi=lambda d: d["depth_lo"] + 0.2)
    age = bins("age", [1, 2], [224, 192])
    fig = plot_seed_lift(depth, age)
    ax_depth, ax_age = fig.axes[:2]
    xs = [x for line in ax_depth.get_lines() if line.get_marker() == "o" for x in line.get_xdata()]
    assert [round(x, 2) for x in xs] == [0.5, 0.9]   # the bin of one group (centre 0.7) is left out
    assert any("1 bin of < 10 groups left out" in t.get_text() for t in ax_depth.texts)
    assert not ax_age.texts and [x for line in ax_age.get_lines() if line.get_marker() == "o"
                                 for x in line.get_xdata()] == [1, 2]
