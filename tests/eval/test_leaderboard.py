"""The leaderboard's model order, baseline and Table 1 "average" column on hand-built results folders.

Two models x two benchmarks x three problems, n = 4 samples each (correct counts below). Every number is derived
by hand, the interval bounds too: with three problems a bootstrap resample is one of few, and each bound below
is a value whose probability mass straddles the 2.5 % / 97.5 % quantile by a wide margin (derivations inline).

    zeta-base  aime24 [4, 2, 0] -> [1, .5, 0], avg@4 .5      aime25 [1, 1, 1] -> .25 each, avg@4 .25
    alpha-new  aime24 [4, 4, 0] -> [1, 1, 0],  avg@4 2/3     aime25 [2, 2, 2] -> .5 each,  avg@4 .5
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest

from contracts.passk import N_BOOT, SEED, bootstrap_ci, paired_stratified_bootstrap, stratified_bootstrap_ci
from eval.leaderboard import build_leaderboard, main, write_leaderboard

COUNTS = {"zeta-base": {"aime24": [4, 2, 0], "aime25": [1, 1, 1]},
          "alpha-new": {"aime24": [4, 4, 0], "aime25": [2, 2, 2]}}


def _row(pid: str, c: int, bench: str, model: str, n: int = 4) -> dict:
    correct = [True] * c + [False] * (n - c)
    return {"problem_id": pid, "correct": correct, "verdicts": ["pass" if x else "wrong_answer" for x in correct],
            "settings": {"model": model, "benchmark": bench, "benchmark_version": f"{bench}-1"}}


def _results(root: Path, counts=COUNTS, times=None) -> Path:
    """Results folders written as ``eval.run`` writes them; ``times``: each model's files' modification time."""
    for i, (model, benches) in enumerate(counts.items()):
        for bench, cs in benches.items():
            path = root / model / f"{bench}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(_row(f"{bench}-{j}", c, bench, model)) + "\n" for j, c in enumerate(cs)))
            t = (times or {}).get(model, 1_700_000_000 + 100 * i)   # in dict order unless told
            os.utime(path, (t, t))
    return root


def test_average_interval_and_paired_difference_are_the_hand_values(tmp_path):
    board = build_leaderboard(_results(tmp_path), models=["zeta-base", "alpha-new"])
    assert board["models"] == ["zeta-base", "alpha-new"] and board["baseline"] == "zeta-base"
    avg = board["average"]
    assert avg["benchmarks"] == ["aime24", "aime25"] and avg["chosen"] == "shared"
    z, a = avg["models"]["zeta-base"], avg["models"]["alpha-new"]
    # zeta: (.5 + .25) / 2. aime25 is constant; an aime24 resample of {1, .5, 0} has mean 0 (or 1) with chance
    # 1/27 = 3.7 % > 2.5 %, so the bounds are (0 + .25) / 2 and (1 + .25) / 2
    assert (z["avg"], z["low"], z["high"], z["problems"]) == (pytest.approx(0.375), 0.125, 0.625, [3, 3])
    # alpha: (2/3 + .5) / 2 = 7/12. aime24 {1, 1, 0}: all 0 with chance 1/27 (3.7 %), all 1 with 8/27
    assert (a["avg"], a["low"], a["high"]) == (pytest.approx(7 / 12), 0.25, 0.75)
    # alpha - zeta, paired by problem: aime24 [0, .5, 0], aime25 [.25, .25, .25]; (1/6 + 1/4) / 2 = 5/24.
    # A resample is k/12 + 1/8 (k = resampled .5's ~ Bin(3, 1/3)): k = 0 has 8/27, k = 3 has 1/27 (3.7 %)
    [d] = [p for p in board["paired"] if p["benchmark"] == "average"]
    assert (d["model"], d["baseline"], d["problems"], d["problems_by_benchmark"]) == ("alpha-new", "zeta-base", 6,
                                                                                      [3, 3])
    assert (d["diff"], d["low"], d["high"], d["p_value"]) == (pytest.approx(5 / 24), 0.125, 0.375, 0.0)
    # the per-benchmark paired rows are still there, before the average's
    assert [p["benchmark"] for p in board["paired"]] == ["aime24", "aime25", "average"]

    md = write_leaderboard(board, tmp_path)
    assert ("average: unweighted mean of avg@n over aime24, aime25 (every benchmark all the models have; --average "
            "chooses); 95% CI: bootstrap over problems within each benchmark") in md
    assert md.index("| zeta-base |") < md.index("| alpha-new |")   # the order given, not alphabetical
    assert "| zeta-base | 50.0 [0.0, 100.0] (P=3, n=4) | 25.0 [25.0, 25.0] (P=3, n=4) | 37.5 [12.5, 62.5] |" in md
    assert "| alpha-new | 66.7 [" in md and "| 58.3 [25.0, 75.0] |" in md
    assert "## paired bootstrap vs zeta-base" in md and "| alpha-new | average | 6 | +20.8 | [+12.5, +37.5] | 0.000 |" in md
    rows = {(r["model"], r["benchmark"]): r for r in csv.DictReader(open(tmp_path / "leaderboard.csv"))}
    r = rows[("alpha-new", "average")]
    assert (r["version"], r["problems"], float(r["avg"]), float(r["ci_low"]), float(r["ci_high"])) == \
        ("aime24+aime25", "6", pytest.approx(7 / 12), 0.25, 0.75)
    assert (r["baseline"], float(r["diff"]), float(r["diff_low"]), float(r["diff_high"])) == \
        ("zeta-base", pytest.approx(5 / 24), 0.125, 0.375)
    assert rows[("zeta-base", "average")]["baseline"] == ""           # the baseline is not compared with itself
    assert float(rows[("alpha-new", "aime25")]["diff"]) == pytest.approx(0.25)
    saved = json.loads((tmp_path / "leaderboard.json").read_text())
    assert saved["baseline"] == "zeta-base" and saved["average"]["models"]["zeta-base"]["high"] == 0.625
    assert saved["paired"][-1]["benchmark"] == "average"


def test_the_stratified_bootstrap_is_the_per_benchmark_loop():
    """The vectorised estimator equals a loop that resamples each benchmark in turn from the same seeded stream,
    and with one benchmark it is ``bootstrap_ci`` itself (the average of one benchmark is that benchmark's cell)."""
    groups = [np.array([1.0, 0.5, 0.0, 0.25]), np.array([0.25, 0.75]), np.array([0.0, 1.0, 1.0])]
    rng = np.random.default_rng(SEED)
    boots = np.zeros(N_BOOT)
    for g in groups:
        for i, row in enumerate(rng.integers(0, g.size, size=(N_BOOT, g.size))):
            boots[i] += g[row].mean() / len(groups)
    est, low, high = stratified_bootstrap_ci(groups)
    assert est == pytest.approx((0.4375 + 0.5 + 2 / 3) / 3)
    assert (low, high) == tuple(pytest.approx(q) for q in np.quantile(boots, [0.025, 0.975]))
    assert stratified_bootstrap_ci([groups[0]]) == bootstrap_ci(groups[0])
    # a constant difference has a zero-width interval and p = 0
    d = paired_stratified_bootstrap([[1.0, 1.0], [0.5]], [[0.5, 0.5], [0.25]])
    assert (d["diff"], d["low"], d["high"], d["p_value"]) == (pytest.approx(0.375), 0.375, 0.375, 0.0)
    with pytest.raises(ValueError, match="benchmark 0 has shapes"):
        paired_stratified_bootstrap([[1.0, 0.0]], [[1.0]])


def test_baseline_is_the_first_model_given_not_the_alphabetical_first(tmp_path, capsys):
    root = _results(tmp_path / "res")
    # no --models: the oldest results first (zeta-base's files are older), so zeta-base is the baseline
    board = build_leaderboard(root)
    assert board["models"] == ["zeta-base", "alpha-new"] and board["baseline"] == "zeta-base"
    # the other order flips the sign: the same resamples, negated
    board = build_leaderboard(root, models=["alpha-new", "zeta-base"])
    [d] = [p for p in board["paired"] if p["benchmark"] == "average"]
    assert (d["model"], d["baseline"]) == ("zeta-base", "alpha-new")
    assert (d["diff"], d["low"], d["high"]) == (pytest.approx(-5 / 24), -0.375, -0.125)
    # alpha-new's files rewritten before zeta-base's: the write-time order follows
    _results(root, times={"zeta-base": 1_800_000_000, "alpha-new": 1_700_000_000})
    assert build_leaderboard(root)["baseline"] == "alpha-new"
    # the CLI: --models orders, the first is the baseline; --baseline overrides it
    assert main([str(root), "--models", "zeta-base,alpha-new"]) == 0
    assert "## paired bootstrap vs zeta-base" in (root / "leaderboard.md").read_text()
    assert main([str(root), "--models", "zeta-base,alpha-new", "--baseline", "alpha-new"]) == 0
    assert "| zeta-base | average | 6 | -20.8 | [-37.5, -12.5] | 0.000 |" in (root / "leaderboard.md").read_text()
    capsys.readouterr()


def test_explicit_average_list_and_a_model_missing_one(tmp_path):
    counts = dict(COUNTS, gamma={"aime24": [0, 0, 4]})
    root = _results(tmp_path, counts)
    board = build_leaderboard(root)
    assert board["average"]["benchmarks"] == ["aime24"]   # the only one all three have
    # the average of one benchmark is that benchmark's own cell: same estimate, same interval
    cell = next(e for e in board["entries"] if (e["model"], e["benchmark"]) == ("zeta-base", "aime24"))
    z = board["average"]["models"]["zeta-base"]
    assert (z["avg"], z["low"], z["high"]) == (cell["avg"], cell["ci_low"], cell["ci_high"])
    board = build_leaderboard(root, average=["aime24", "aime25"])
    assert board["average"]["chosen"] == "given"
    assert board["average"]["models"]["gamma"] == {"avg": None, "missing": ["aime25"]}
    assert board["average"]["models"]["zeta-base"]["avg"] == pytest.approx(0.375)
    assert [p["model"] for p in board["paired"] if p["benchmark"] == "average"] == ["alpha-new"]   # not gamma
    md = write_leaderboard(board, root)
    assert "| gamma | 33.3 [0.0, 100.0] (P=3, n=4) |  | n/a (no aime25) |" in md
    assert "(as given by --average)" in md


def test_unknown_names_are_one_line_and_exit_2(tmp_path, capsys):
    root = _results(tmp_path)
    for argv, line in (
            (["--average", "aime24,nope"], f"error: --average aime24,nope: no model under {root} has scored 'nope'; "
                                            f"choose from: aime24, aime25"),
            (["--average", "aime24,aime24"], "error: --average aime24,aime24: names a benchmark twice; choose from: "
                                              "aime24, aime25"),
            (["--models", "zeta-base,omega"], f"error: --models zeta-base,omega: no results of 'omega' under {root}; "
                                               f"choose from: alpha-new, zeta-base"),
            (["--models", "zeta-base", "--baseline", "alpha-new"],
             "error: --baseline 'alpha-new' is not among the models given with --models (zeta-base); choose one of: "
             "zeta-base")):
        assert main([str(root), *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.strip() == line and len(err.strip().splitlines()) == 1
    assert not (root / "leaderboard.md").exists() and not (root / "leaderboard.json").exists()
