"""docs/beyond.md (demo.beyond, issue #41 item 6): the page is what its committed tables render, and the tables'
statistics are what their counts give; the statistics themselves by hand."""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
import pytest

from contracts.passk import pass_at_k
from demo.beyond import holm, metrics_of, paired_rows, read, render
from demo.common import REPO
from tsanalysis.relay_matrix import gain_table

DOC = REPO / "docs" / "beyond.md"
TABLES = REPO / "docs" / "beyond" / "tables"


def test_holm_by_hand():
    # sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 -> running max 0.02, 0.03, 0.06, 0.06
    assert holm(np.array([0.01, 0.04, 0.03, 0.005])) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm(np.array([0.5, 0.9])) == pytest.approx([1.0, 1.0])


def test_paired_rows_by_hand():
    rows = []
    for method, p1 in (("onpolicy_lora", (0.31, 0.32, 0.31)), ("onpolicy", (0.30, 0.30, 0.33)),
                       ("seeds_mixture", (0.30, 0.30, 0.30)), ("seeds_ratio", (0.30, 0.30, 0.30))):
        rows += [{"method": method, "seed": s, "pass@1": v, "pass@64": 0.8} for s, v in enumerate(p1)]
    p = paired_rows(pd.DataFrame(rows))
    assert metrics_of(pd.DataFrame(rows)) == ("pass@1", "pass@64")
    r = p[(p["a"] == "onpolicy_lora") & (p["metric"] == "pass@1")].iloc[0]
    d = np.array([1.0, 2.0, -2.0])                                   # points
    se = d.std(ddof=1) / np.sqrt(3)                                  # 1.2019
    assert r["per_seed"] == "+1.0 +2.0 -2.0" and r["diff"] == pytest.approx(1 / 3)
    assert r["half"] == pytest.approx(4.302653 * se, rel=1e-6)       # t_{0.975, 2}
    assert r["half_bonferroni"] == pytest.approx(8.860200 * se, rel=1e-6)   # t_{1 - 0.05/8, 2}, m = 4
    assert r["p"] == pytest.approx(0.8075, abs=1e-4)                 # t = 0.277, df 2
    # no difference at all: p = 1, every Holm p = 1
    z = p[p["a"] == "seeds_mixture"]
    assert (z["diff"] == 0).all() and (z["p"] == 1).all() and (p["p_holm"] == 1).all()


def test_the_page_is_what_its_committed_tables_render():
    assert DOC.is_file() and (TABLES / "measured.json").is_file(), "docs/beyond.md and its tables are committed"
    assert render(TABLES) == DOC.read_text()


def _recompute(tdir) -> list[str]:
    """Every statistic of the tables against its counts: each method's pass@k from its per-problem counts, the
    matrix from its per-problem counts (the same seeded bootstrap)."""
    t = read(tdir)
    bad = []
    pp, methods = t["per_problem"], t["methods"]
    for _, r in methods.iterrows():
        d = pp[pp["model"] == f"{r['method']}-seed{r['seed']}"]
        for metric in metrics_of(methods):
            k = int(metric.split("@")[1])
            want = float(pass_at_k(d["n"].to_numpy(), d["correct"].to_numpy(), k).mean())
            if abs(want - r[metric]) > 1e-12:
                bad.append(f"methods.{r['method']}-seed{r['seed']}.{metric}")
    got = t["matrix"].sort_values(["writer", "continuer", "k"]).reset_index(drop=True)
    want = gain_table(t["matrix_problems"]).sort_values(["writer", "continuer", "k"]).reset_index(drop=True)
    for col in ("relay", "alone", "gain", "gain_low", "gain_high"):
        if not np.allclose(got[col], want[col], atol=1e-12):
            bad.append(f"matrix.{col}")
    return bad


def test_the_committed_tables_are_what_their_counts_give(tmp_path):
    assert _recompute(TABLES) == []
    # a changed count is caught: one correct answer moved out of a method's first problem, one relay count changed
    bad = tmp_path / "tables"
    shutil.copytree(TABLES, bad)
    pp = pd.read_csv(bad / "per_problem.csv")
    i = pp.index[(pp["model"] == "onpolicy-seed0") & (pp["correct"] > 0)][0]
    pp.loc[i, "correct"] -= 1
    pp.to_csv(bad / "per_problem.csv", index=False)
    mp = pd.read_csv(bad / "matrix_problems.csv")
    mp.loc[mp.index[mp["relay_correct"] > 0][0], "relay_correct"] -= 1
    mp.to_csv(bad / "matrix_problems.csv", index=False)
    found = _recompute(bad)
    assert "methods.onpolicy-seed0.pass@1" in found and "matrix.relay" in found, found


def test_missing_inputs_are_one_line_and_exit_2(tmp_path, capsys):
    from demo.beyond import main
    assert main(["--out", str(tmp_path / "none"), "--matrix", str(tmp_path), "--sync", str(tmp_path / "s.json"),
                 "--doc", str(tmp_path / "beyond.md")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 'none' / 'tables' / 'methods.csv'}: no such file;") and err.count("\n") == 1
    assert not (tmp_path / "beyond.md").exists()
