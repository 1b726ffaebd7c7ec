"""The regime search for the mechanism (issue #40 item 1, ``demo.mechanism``): its statistics on hand-made data
whose answers are known, its one-line refusals, and the committed page against the tables beside it."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pandas as pd
import pytest

from contracts.passk import paired_bootstrap, pass_at_k
from demo.premise_stats import holm
from demo.common import REPO, figure_dir
from demo.mechanism import (NOTES_HEADING, NOTES_SOURCES, POINTS, lift_by_depth, main, point_budget,
                            point_row, render)
from demo.page_numbers import split, stale, unused

DOC = REPO / "docs" / "mechanism.md"
TABLES = figure_dir(DOC) / "tables"


def _seeds(n_groups: int = 60, per: int = 4) -> pd.DataFrame:
    """Seeds at two depths. Shallow cuts (10 % of the source): the continuation is right with probability 0.75
    whatever its source, against fresh groups at 0.25 (lift +0.5, carry 0). Deep cuts (90 %): the continuation is
    its source's verdict, and the fresh value is the source's mean (lift 0, carry 1)."""
    rng = np.random.default_rng(0)
    rows = []
    for g in range(n_groups):
        deep = g % 2 == 1
        src = rng.integers(0, 2, per).astype(float)
        for i in range(per):
            y = src[i] if deep else float(i != 0)          # shallow: 3 of 4 right, whatever the source
            fresh = src.mean() if deep else 0.25
            rows.append({"group": g, "seed_len": 9 if deep else 1, "source_len": 10, "source_correct": src[i],
                         "correct": y, "lift": y - fresh})
    return pd.DataFrame(rows)


def test_lift_by_depth_finds_the_lift_where_the_continuation_decides_and_the_carry_where_the_prefix_does():
    t = lift_by_depth(_seeds()).set_index("depth_bin")
    assert list(t.index) == [0, 4] and t.loc[0, "seeds"] == t.loc[4, "seeds"] == 120
    assert t.loc[0, "lift"] == pytest.approx(0.5) and t.loc[0, "low"] == pytest.approx(0.5)   # no spread at all
    assert t.loc[4, "lift"] == pytest.approx(0.0, abs=1e-12) and t.loc[4, "p"] == 1.0
    assert t.loc[0, "p"] == 0.0 and t.loc[0, "p_holm"] == 0.0 and t.loc[4, "p_holm"] == 1.0
    assert t.loc[4, "carry"] == 1.0 and t.loc[4, "value_after_right"] == 1.0 and t.loc[4, "value_after_wrong"] == 0.0
    assert t.loc[0, "carry"] == pytest.approx(t.loc[0, "value_after_right"] - t.loc[0, "value_after_wrong"])
    assert abs(t.loc[0, "carry"]) < 0.3   # shallow cuts: the source's verdict hardly moves the continuation's


def test_holm_is_the_step_down_rule():
    assert holm(np.array([0.01, 0.04, 0.03, 0.5])).tolist() == pytest.approx([0.04, 0.09, 0.09, 0.5])


def _counts(c_warm, c_early, c_final, c_relay, n=64):
    ids = [f"p{i:03d}" for i in range(len(c_warm))]
    pp = pd.concat([pd.DataFrame({"model": m, "problem_id": ids, "n": n, "correct": c})
                    for m, c in (("warmup", c_warm), ("early", c_early), ("final", c_final))], ignore_index=True)
    relay = pd.DataFrame({"problem_id": ids, "n": n, "early_correct": c_early, "relay_correct": c_relay,
                          "final_correct": c_final})
    return pp, relay


def test_point_row_reads_each_criterion_from_the_counts():
    P = 40
    warm = np.full(P, 8)                                   # every problem sometimes solved: pass@64 ~ 1
    final = np.where(np.arange(P) % 2 == 0, 40, 0)          # sharper: pass@1 up, half the problems lost
    lift = lift_by_depth(_seeds())
    pp, relay = _counts(warm, warm, final, warm)            # the relay is the early checkpoint, count for count
    row = point_row("4n", pp, relay, lift, wall_s=600.0)
    assert row["K"] == 64 and row["numbers"] == 4 and row["max_response_tokens"] == 56
    assert row["warmup_pass1"] == pytest.approx(8 / 64) and row["final_pass1"] == pytest.approx(20 / 64)
    assert row["final_passK"] == pytest.approx(0.5) and row["passK_diff"] == pytest.approx(
        0.5 - pass_at_k(64, 8, 64).item())
    assert row["narrowed"] and row["passK_high"] < 0 < row["pass1_low"]
    assert row["relay_early_diff"] == 0.0 and not row["relay_beyond_early"]
    assert row["relay_final_diff"] == pytest.approx(row["early_passK"] - row["final_passK"])
    assert row["lift_bins"] == 1 and row["lift_bins_holm"] == 1 and row["seed_lift_at_depth"]
    assert row["fits"] and not row["meets_all"]             # the relay adds nothing beyond early
    assert np.isnan(row["carry_at_relay_cut"])               # no seed was cut near the relay's 0.5
    half = _seeds().assign(seed_len=lambda d: d["seed_len"].where(d["seed_len"] == 1, 5))   # deep seeds at 0.5
    assert point_row("4n", pp, relay, lift_by_depth(half), wall_s=600.0)["carry_at_relay_cut"] == 1.0
    # a relay that solves problems the early checkpoint does not: the fourth criterion holds, and all four
    better = np.where(np.arange(P) % 4 == 0, 0, warm)
    pp2, relay2 = _counts(warm, better, final, warm)
    row2 = point_row("4n", pp2, relay2, lift, wall_s=600.0)
    want = paired_bootstrap(pass_at_k(64, warm, 64), pass_at_k(64, better, 64))
    assert row2["relay_early_diff"] == pytest.approx(want["diff"]) and row2["relay_early_low"] == want["low"]
    assert row2["relay_beyond_early"] and row2["meets_all"]
    assert not point_row("4n", pp2, relay2, lift, wall_s=5000.0)["meets_all"]   # too slow for the demo


@pytest.mark.parametrize("argv, says", [
    (["--points", "3n,bogus"], "unknown point 'bogus'"),
    (["--write-only"], "--write-only needs --doc"),
    (["--write-only", "--doc", "{tmp}/nowhere/mechanism.md"], "grid.csv is missing"),
    (["--premise", "{tmp}", "--points", "3n"], "not a demo.premise output folder"),
    (["--add", "--points", "3n-search"], "--add needs --doc"),
    (["--add", "--points", "3n-search", "--doc", "{tmp}/nowhere/mechanism.md"], "nothing to add to"),
])
def test_bad_input_is_one_line_and_exit_2_before_anything_runs(argv, says, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(["--out", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert not (tmp_path / "out").exists()


def test_every_point_is_a_countdown_the_generator_can_make():
    from demo.mechanism import point_budget
    from scoring.tasks import countdown

    for name in POINTS:
        b = point_budget(name)
        rows = countdown.make_examples(20, seed=3, **b.difficulty)
        longest = max(len(r["solution"]) for r in rows)
        assert longest + 1 <= b.max_response_tokens, (name, longest)   # a reference trace and its EOS fit


def test_relay_small_k_reads_pass_at_k_from_the_counts_and_holm_adjusts_the_family():
    from demo.mechanism import relay_small_k
    rng = np.random.default_rng(2)
    early = rng.integers(0, 65, 120)
    rows = []
    for name, shift in (("same", 0), ("worse", -16)):   # the relay 16 of 64 samples below early on every problem
        relay = np.clip(early + shift, 0, 64)
        rows.append(pd.DataFrame({"point": name, "problem_id": [f"p{i:03d}" for i in range(120)], "n": 64,
                                  "early_correct": early, "relay_correct": relay, "final_correct": early}))
    t = relay_small_k(pd.concat(rows, ignore_index=True), ["same", "worse"])
    assert list(zip(t["point"], t["k"])) == [("same", 1), ("same", 8), ("worse", 1), ("worse", 8)]
    one = t[(t["point"] == "worse") & (t["k"] == 1)].iloc[0]
    want = (np.clip(early - 16, 0, 64) - early).mean() / 64          # pass@1 is c / n
    assert one["re_diff"] == pytest.approx(want) and one["re_high"] < 0 and one["re_p_holm"] < 0.05
    assert one["early"] == pytest.approx(early.mean() / 64)
    same = t[t["point"] == "same"]
    assert (same["re_diff"] == 0).all() and (same["re_p_holm"] == 1).all()
    assert np.allclose(t["re_p_holm"], holm(t["re_p"].to_numpy()))
    assert np.allclose(t["rf_diff"], t["re_diff"])                   # final == early here


def test_the_seeded_relay_pairs_the_same_early_samples_and_refuses_others(tmp_path):
    from demo.mechanism import RELAY_SEEDED, SEEDED_RELAY, read_seeded_relay, seeded_relay_table
    from demo.premise import RELAY_TAG
    d = tmp_path / "point"
    assert read_seeded_relay(d) is None                       # a folder without it (a --premise folder)
    rng = np.random.default_rng(3)
    ids = [f"p{i:03d}" for i in range(80)]
    early, on = rng.integers(0, 65, 80), rng.integers(0, 57, 80)
    for tag, relay, final in ((RELAY_TAG, on, on), (SEEDED_RELAY, on + 8, on + 4)):   # seeded: 8 of 64 more
        f = d / "analysis" / "relay" / tag / "relay_problems.csv"
        f.parent.mkdir(parents=True)
        pd.DataFrame({"problem_id": ids, "n": 64, "early_correct": early, "relay_correct": relay,
                      "final_correct": final}).sample(frac=1, random_state=0).to_csv(f, index=False)
    rs = read_seeded_relay(d)
    assert list(rs.columns) == ["problem_id", "n", "early_correct", "relay_onpolicy", "relay_seeded", "seeded_final"]
    rs = rs.assign(point="x")
    t = seeded_relay_table(rs, ["x", "absent"], (1, 8, 64))
    assert list(t["k"]) == [1, 8, 64] and set(t["point"]) == {"x"}
    one = t.iloc[0]
    assert one["diff"] == pytest.approx(8 / 64) and one["low"] == pytest.approx(8 / 64) and one["p_holm"] < 0.05
    assert one["seeded_final"] == pytest.approx((on + 4).mean() / 64)
    assert np.allclose(t["p_holm"], holm(t["p"].to_numpy()))
    # other early samples (another seed or settings): not a paired comparison, one line naming the folder
    f = d / "analysis" / "relay" / SEEDED_RELAY / "relay_problems.csv"
    bad = pd.read_csv(f)
    bad.loc[0, "early_correct"] = (bad.loc[0, "early_correct"] + 1) % 65
    bad.to_csv(f, index=False)
    from demo.common import DemoError
    with pytest.raises(DemoError, match="its early samples are not the on-policy relay's"):
        read_seeded_relay(d)
    assert RELAY_SEEDED == "relay_seeded"


def test_add_keeps_the_committed_points_and_their_provenance(tmp_path, monkeypatch):
    """``--add``: a point run in a later session joins the committed grid; the other points' rows, lift, counts and
    provenance stay as committed (a table written before the grid had a ``search`` column reads it as 0)."""
    import json
    import shutil

    import demo.mechanism as mech

    if not (TABLES / "grid.csv").is_file():
        pytest.skip("docs/mechanism.md has no committed tables yet")
    old = tmp_path / "old"
    shutil.copytree(TABLES, old)
    committed = pd.read_csv(old / "grid.csv")
    # a new point (probe): hand-made counts (its folder's reader is replaced; read_point is tested on real folders by
    # the premise tests' folder layout)
    rng = np.random.default_rng(1)
    warm, final = rng.integers(0, 65, 50), rng.integers(0, 65, 50)
    pp = pd.concat([pd.DataFrame({"model": m, "problem_id": [f"p{i:03d}" for i in range(50)], "n": 64, "correct": c})
                    for m, c in (("warmup", warm), ("early", warm), ("final", final))], ignore_index=True)
    relay = pd.DataFrame({"problem_id": [f"p{i:03d}" for i in range(50)], "n": 64, "early_correct": warm,
                          "relay_correct": final, "final_correct": final})
    lift = lift_by_depth(_seeds(), n_bins=5, n_boot=200)
    settings = asdict(point_budget("3n-search"))   # a search point's budget under a new name
    monkeypatch.setattr(mech, "read_point", lambda name, d: (pp, relay, lift, 700.0, settings))
    new = tmp_path / "new"
    tables = mech.collect({"probe": tmp_path / "point"}, new, command="python -m demo.mechanism --add", keep=old)
    grid = tables["grid"]
    assert list(grid["point"]) == [*committed["point"], "probe"]
    assert list(grid.columns) == mech.GRID_COLUMNS
    kept = grid[grid["point"] != "probe"].reset_index(drop=True)
    assert list(grid["search"])[-1] == 3
    pd.testing.assert_frame_equal(kept, committed, check_dtype=False)   # the committed rows, untouched
    # a table written before the grid had a search column reads it as 0
    (old / "grid.csv").write_text(committed.drop(columns="search").to_csv(index=False))
    before = mech.collect({"probe": tmp_path / "point"}, tmp_path / "before", command="x", keep=old)["grid"]
    assert list(before["search"]) == [0] * len(committed) + [3]
    for k in ("lift_by_depth", "per_problem", "relay_problems"):
        was = pd.read_csv(old / f"{k}.csv", dtype={"problem_id": str})
        got = pd.read_csv(new / f"{k}.csv", dtype={"problem_id": str})
        assert len(got) == len(was) + len(tables[k][tables[k]["point"] == "probe"]) > len(was)
        assert set(got["point"]) == {*was["point"], "probe"}
    rec, was = json.loads((new / "page.json").read_text()), json.loads((old / "page.json").read_text())
    assert {p: rec["measured"][p] for p in was["measured"]} == was["measured"]
    assert rec["commands"] == [*dict.fromkeys(was.get("commands", [was["command"]])), "python -m demo.mechanism --add"]
    assert "probe" in render(new) and "search traces (0–3 failed attempts)" in render(new)
    # adding the same point again replaces it rather than doubling it
    again = mech.collect({"probe": tmp_path / "point"}, tmp_path / "again", command="x", keep=new)
    assert list(again["grid"]["point"]) == list(grid["point"])


def test_the_committed_page_is_what_its_tables_render_and_their_numbers_recompute():
    if not (TABLES / "grid.csv").is_file():
        pytest.skip("docs/mechanism.md has no committed tables yet")
    page = DOC.read_text()
    assert page.startswith(render(TABLES).rstrip("\n"))
    generated, notes = split(page, NOTES_HEADING)
    assert notes.startswith(NOTES_HEADING) and not stale(generated, notes, NOTES_SOURCES)   # every number accounted
    assert not unused(notes, NOTES_SOURCES)
    grid = pd.read_csv(TABLES / "grid.csv")
    lift = pd.read_csv(TABLES / "lift_by_depth.csv")
    pp = pd.read_csv(TABLES / "per_problem.csv", dtype={"problem_id": str})
    relay = pd.read_csv(TABLES / "relay_problems.csv", dtype={"problem_id": str})
    for _, g in grid.iterrows():
        name = g["point"]
        lt = lift[lift["point"] == name].drop(columns="point")
        assert np.allclose(holm(lt["p"].to_numpy()), lt["p_holm"].to_numpy())
        row = point_row(name, pp[pp["point"] == name].drop(columns="point"),
                        relay[relay["point"] == name].drop(columns="point"), lt, g["wall_s"],
                        {**asdict(point_budget(name)), "warmup_steps": int(g["warmup_steps"])})
        for k, v in row.items():
            if isinstance(v, (bool, np.bool_)):
                assert bool(g[k]) == v, (name, k)
            elif isinstance(v, str):
                assert g[k] == v, (name, k)
            else:
                assert g[k] == pytest.approx(v, abs=1e-12), (name, k)
