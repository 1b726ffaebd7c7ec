"""Restart values of the seeds (issue #26 item 2): lift against the fresh group, rescue, zero advantage vs Lemma 4.

The pure definitions (``contracts.seed_lift``, ``tsanalysis.core.seed_lift``, ``lemma4.shared_seed_zero_adv_prob``)
against hand computations; a tiny seeded run whose ``seeds/*`` metrics are recomputed from the rollout records it
wrote; ``tsanalysis seeds`` on that run, on a synthetic run and on bad run directories.
"""

import json
import math

import numpy as np
import pandas as pd
import pytest

from contracts.records import read_rollouts
from contracts.seed_lift import SUMMARY_KEYS, prompt_values, seed_lifts, step_summary
from tests.helpers.runs import make_row, write_run
from inference.tiny import build_tokenizer
from scoring.verdict import Verdict
from trainer import checkpoint as ckpt
from trainer.config import load_config
from trainer.fsdp import Dist
from trainer.train import train
from tsanalysis.cli import main as tsanalysis_main
from tsanalysis.core import lemma4 as L4
from tsanalysis.core import seed_lift as SL
from tsanalysis.tables import seeds_tables

nan = math.nan
# four prompts of G = 4 seeds: continuation verdicts y and the verdicts s of the responses the seeds were cut from
GROUPS = {"A": ([1, 0, 1, 0], [0, 0, 0, 0]),        # all-wrong fresh group, rescued: lift 0.5
          "B": ([1, 1, 1, 1], [1, 0, 1, 1]),        # lift 1 - 0.75 = 0.25
          "C": ([0, 0, 0, nan], [0, 0, 0, 0]),      # one continuation ungraded; all wrong, not rescued: lift 0
          "D": ([0, 1, 0, 1], [nan] * 4)}           # no graded fresh response: no lift
GROUP = [k for k, (y, _) in GROUPS.items() for _ in y]
Y = [x for y, _ in GROUPS.values() for x in y]
S = [x for _, s in GROUPS.values() for x in s]


# ---- the pure definitions --------------------------------------------------------------------------------------------
def test_prompt_values_by_hand():
    v = prompt_values(GROUP, Y, S)
    assert v["group"].tolist() == ["A", "B", "C", "D"]
    assert v["n_seeded"].tolist() == [4, 4, 3, 4] and v["n_fresh"].tolist() == [4, 4, 4, 0]
    assert v["value_seeded"].tolist() == [0.5, 1.0, 0.0, 0.5]
    assert v["value_fresh"][:3].tolist() == [0.0, 0.75, 0.0] and math.isnan(v["value_fresh"][3])
    assert v["lift"][:3].tolist() == [0.5, 0.25, 0.0] and math.isnan(v["lift"][3])
    assert v["all_wrong_fresh"].tolist() == [True, False, True, False]
    assert v["rescued"].tolist() == [True, False, False, False]
    assert v["zero_adv_seeded"].tolist() == [False, True, True, False]
    assert v["zero_adv_fresh"].tolist() == [True, False, True, False]   # D: no graded fresh verdict, not counted


def test_seed_lifts_subtract_the_prompts_fresh_value():
    lift = seed_lifts(GROUP, Y, S)
    assert lift[:11].tolist() == [1, 0, 1, 0, 0.25, 0.25, 0.25, 0.25, 0, 0, 0]
    assert np.isnan(lift[11:]).all()   # C's ungraded continuation and all of D


def test_step_summary_by_hand():
    s = step_summary(GROUP, Y, S)
    # lifts 0.5, 0.25, 0 over A, B, C: mean 0.25, unbiased std sqrt((0.0625 + 0 + 0.0625) / 2) = 0.25
    assert s == {"lift_prompts": 3, "lift_mean": 0.25, "lift_std": 0.25, "value_seeded": 0.5, "value_fresh": 0.25,
                 "all_wrong_fresh": 2, "rescued": 1, "rescued_share": 0.5, "zero_adv_share": 0.5,
                 "zero_adv_fresh_share": pytest.approx(2 / 3)}
    # no all-wrong fresh group: no rescued share (a share of nothing), the count says so
    s = step_summary(["B"] * 4, GROUPS["B"][0], GROUPS["B"][1])
    assert "rescued_share" not in s and s["all_wrong_fresh"] == 0 and s["lift_std"] == 0.0


def test_shared_seed_zero_adv_prob_by_hand():
    # rho = 1/3 at p = 1/2 is p_h ~ Beta(1, 1) (uniform): E[p^2] + E[(1-p)^2] = 2/3, E[p^3] + E[(1-p)^3] = 1/2
    assert L4.shared_seed_zero_adv_prob(0.5, 1 / 3, 2) == pytest.approx(2 / 3)
    assert L4.shared_seed_zero_adv_prob(0.5, 1 / 3, 3) == pytest.approx(1 / 2)
    # rho = 0: independent seeds, D(p) = 0.3^4 + 0.7^4; rho = 1: the seed decides, every group is zero-advantage
    assert L4.shared_seed_zero_adv_prob(0.3, 0.0, 4) == pytest.approx(0.3 ** 4 + 0.7 ** 4)
    assert L4.shared_seed_zero_adv_prob(0.3, 1.0, 4) == 1.0 and L4.shared_seed_zero_adv_prob(0.0, 0.3, 4) == 1.0
    # Jensen (Lemma 4's remark): sharing never lowers it, and more correlation raises it
    p = np.linspace(0.05, 0.95, 7)
    vals = [L4.shared_seed_zero_adv_prob(p, r, 8) for r in (0.0, 0.1, 0.5)]
    assert np.all(vals[0] <= vals[1] + 1e-12) and np.all(vals[1] < vals[2])


def _seeds(groups: dict, step=1, age=1) -> pd.DataFrame:
    rows = []
    for pid, (y, s) in groups.items():
        for i, (yi, si) in enumerate(zip(y, s)):
            rows.append({"step": step, "prompt_id": pid, "sample_idx": i, "seed_step": step - age, "seed_len": 2 + i,
                         "source_len": 8, "trunc_rule": "ratio", "trunc_token_text": " So" if i % 2 else "3",
                         "correct": yi, "source_correct": si})
    return SL.seed_table(pd.DataFrame(rows))


def test_pair_correlation_by_hand():
    # s = [1, 0, 0, 0], y = [1, 0, 0, 1]: centred (0.75, -0.25, -0.25, -0.25) and (0.5, -0.5, -0.5, 0.5):
    # sum of products 0.5, sums of squares 0.75 and 1 -> 0.5 / sqrt(0.75)
    assert SL.pair_correlation(_seeds({"a": ([1, 0, 0, 1], [1, 0, 0, 0])})) == pytest.approx(0.5 / math.sqrt(0.75))
    # a perfectly tied pair and a perfectly anti-tied one cancel when pooled
    assert SL.pair_correlation(_seeds({"a": ([1, 0], [1, 0]), "b": ([0, 1], [1, 0])})) == 0.0
    assert math.isnan(SL.pair_correlation(_seeds({"a": ([1, 1], [0, 1])})))   # y never varies


def test_seed_table_and_bins_by_hand():
    seeds = _seeds(GROUPS)
    assert seeds["lift"].iloc[:4].tolist() == [1, 0, 1, 0] and seeds["value_fresh"].iloc[4] == 0.75
    assert seeds["age"].unique().tolist() == [1] and seeds["cut_frac"].iloc[:4].tolist() == [0.25, 0.375, 0.5, 0.625]
    assert seeds["category"].iloc[:2].tolist() == ["digit", "discourse"]
    by_cat = SL.lift_bins(seeds, ["category"], n_boot=200).set_index("category")
    # digit (sample 0, 2): A 1, 1; B .25, .25; C 0, 0 -> 2.5 / 6; discourse (1, 3): A 0, 0; B .25, .25; C 0 -> .5 / 5
    assert by_cat.loc["digit", "lift_mean"] == pytest.approx(2.5 / 6) and by_cat.loc["digit", "seeds"] == 6
    assert by_cat.loc["discourse", "lift_mean"] == pytest.approx(0.5 / 5) and by_cat.loc["discourse", "groups"] == 3
    for _, r in by_cat.iterrows():
        assert r["lift_low"] <= r["lift_mean"] <= r["lift_high"]
    one = SL.lift_bins(_seeds({"a": ([1, 0], [0, 0])}), ["age"], n_boot=200).iloc[0]
    assert (one["lift_mean"], one["lift_low"], one["lift_high"]) == (0.5, 0.5, 0.5)   # one group: no spread
    assert SL.depth_bin([0, 3, 7, 8], [8, 8, 8, 8], 4).tolist() == [0, 1, 3, 3]


def test_zero_adv_comparison_uses_lemma4_leave_group_out():
    # prompt a seeded at three steps, G = 2: y = (1, 0), (1, 1), (0, 0). Leave-group-out pools (n 4): c = 2, 1, 3 ->
    # D-hat = (C(2,2) + C(2,2)) / 6 = 1/3, (C(1,2) + C(3,2)) / 6 = 1/2, 1/2: mean 4/9; observed 2/3.
    parts = [_seeds({"a": (y, s)}, step=st) for st, (y, s) in
             enumerate([([1, 0], [1, 0]), ([1, 1], [0, 1]), ([0, 0], [0, 0])], start=1)]
    seeds = pd.concat(parts, ignore_index=True)
    seeds["group"] = seeds.groupby(["step", "prompt_id", "rep"]).ngroup()
    z = SL.zero_adv_comparison(seeds).set_index("kind")
    assert z.loc["seeded", "zero_adv_obs"] == pytest.approx(2 / 3)
    assert z.loc["seeded", "zero_adv_pred"] == pytest.approx(4 / 9)
    rho = SL.pair_correlation(seeds)
    shared = np.mean([L4.shared_seed_zero_adv_prob(p, rho, 2) for p in (2 / 4, 1 / 4, 3 / 4)])
    assert z.loc["seeded", "pair_corr"] == pytest.approx(rho) and z.loc["seeded", "zero_adv_pred_shared"] == \
        pytest.approx(shared)
    # fresh groups s = (1, 0), (0, 1), (0, 0): observed 1/3; pools c = 1, 1, 2 -> 1/2, 1/2, 1/3: mean 4/9
    assert z.loc["fresh", "zero_adv_obs"] == pytest.approx(1 / 3) and z.loc["fresh", "zero_adv_pred"] == \
        pytest.approx(4 / 9)
    assert math.isnan(z.loc["fresh", "zero_adv_pred_shared"])


# ---- a synthetic run through tsanalysis seeds ------------------------------------------------------------------------
def _synthetic_run(path, *, with_source=True):
    rows = [make_row(prompt_id="q", sample_idx=g, length=8) for g in range(4)]   # a refresh step: no seeds
    steps = {0: rows, 1: []}
    for pid, (y, s) in GROUPS.items():
        for g, (yi, si) in enumerate(zip(y, s)):
            extra = {"source_len": 8, "source_correct": None if math.isnan(si) else bool(si)} if with_source else {}
            steps[1].append(make_row(prompt_id=pid, sample_idx=g, length=8, seed_len=4, reward=float(yi == 1),
                                     verdict="timeout" if math.isnan(yi) else ("pass" if yi else "wrong_answer"),
                                     seed_step=0, **extra))
    return write_run(path, steps)


def test_seeds_tables_on_a_synthetic_run(tmp_path):
    t = seeds_tables(_synthetic_run(tmp_path / "run"), n_boot=200)
    s = t["summary"].iloc[0]
    assert (s["seeds"], s["groups"], s["lift_groups"], s["all_wrong_fresh"], s["rescued"]) == (16, 4, 3, 2, 1)
    assert (s["lift_mean"], s["lift_std"], s["rescued_share"]) == (0.25, 0.25, 0.5)
    assert s["zero_adv_seeded"] == 0.5 and s["zero_adv_fresh"] == pytest.approx(2 / 3)
    assert t["by_depth"]["depth_lo"].tolist() == [0.4] and t["by_age"]["age"].tolist() == [1]
    # per seed over the 11 with a lift: (1 + 0 + 1 + 0) + 4 * 0.25 + 0 = 3 -> 3 / 11
    assert t["by_age"]["lift_mean"].iloc[0] == pytest.approx(3 / 11) and t["by_age"]["seeds"].iloc[0] == 11
    assert set(t["by_source"]["source"]) == {"correct", "wrong"}
    assert len(t["seeds"]) == 16


# ---- a tiny seeded run: the metrics are the records' ----------------------------------------------------------------
def _mod3(task, responses, examples, **kw):
    """An inline grader (no worker pool) with verdicts of every kind of group: correct when sum(ord) % 3 == 0."""
    return [Verdict(sum(map(ord, t)) % 3 == 0, "pass" if sum(map(ord, t)) % 3 == 0 else "wrong_answer")
            for t in responses]


def _train_seeded(out, **extra):
    """The four-step seeded run (T = 4: a refresh step, then three seeded) with the inline grader; returns the run
    folder, its metrics and how many responses the grader saw."""
    seen = []

    def grader(task, responses, examples, **kw):
        seen.extend(responses)
        return _mod3(task, responses, examples, **kw)

    mp = pytest.MonkeyPatch()
    import trainer.rollout as rollout
    mp.setattr(rollout, "grade_task_batch", grader)
    try:
        over = {"output_dir": str(out), "run_name": "r", "model": "tiny:1m",
                "task": "addition", "task_kwargs": json.dumps({"min_digits": 1, "max_digits": 1}),
                "num_train_examples": 8, "prompts_per_step": 4, "samples_per_prompt": 4, "max_response_tokens": 8,
                "micro_batch_size": 64, "total_steps": 4, "seed_refresh_interval": 4, "algorithm": "seeds",
                "dynamic_sampling": False, "progress": False, "save_every": 0, "lr": 1e-3, **extra}
        run_dir = train(load_config(None, [f"{k}={v}" for k, v in over.items()]), Dist())
    finally:
        mp.undo()
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return run_dir, metrics, len(seen)


@pytest.fixture(scope="module")
def seeded_run(tmp_path_factory):
    run_dir, metrics, graded = _train_seeded(tmp_path_factory.mktemp("lift"))
    assert graded == 16 + 3 * (16 + 16)   # the refresh step's 16 rows; each seeded step its 16 rows and 16 sources
    return run_dir, metrics


@pytest.mark.slow   # a four-step training run
def test_seeded_steps_log_lift_metrics_that_the_records_reproduce(seeded_run):
    run_dir, metrics = seeded_run
    assert "seeds/lift_mean" not in metrics[0]   # the refresh step trains on fresh responses: no seeds
    rows = read_rollouts(run_dir).to_pandas()
    assert rows.loc[rows["step"] == 0, "source_len"].isna().all()
    rescued_any = False
    for m in metrics[1:]:
        for k in ("lift_mean", "lift_std", "value_seeded", "value_fresh", "zero_adv_share", "zero_adv_fresh_share"):
            assert math.isfinite(m[f"seeds/{k}"]), (m["step"], k)
        assert m["seeds/lift_prompts"] == 4 and ("seeds/rescued_share" in m) == (m["seeds/all_wrong_fresh"] > 0)
        rescued_any |= m["seeds/all_wrong_fresh"] > 0
        seeded = rows[(rows["step"] == m["step"]) & (rows["variant"] == "seed")]
        assert len(seeded) == 16 and (seeded["source_len"] >= seeded["seed_len"]).all()
        assert seeded["source_correct"].notna().all()
        # recompute from the records: a group is (prompt, rep); each prompt of this run appears once per step here
        group = (seeded["prompt_id"] + "#" + seeded.groupby(["prompt_id", "sample_idx"]).cumcount().astype(str))
        want = step_summary(group.to_numpy(), seeded["correct"].astype(float).to_numpy(),
                            seeded["source_correct"].astype(float).to_numpy())
        got = {k.removeprefix("seeds/"): v for k, v in m.items() if k.removeprefix("seeds/") in want}
        assert got == pytest.approx(want)
        # and by hand for the mean: V_seeded - V_fresh averaged over the step's four prompts
        by = seeded.groupby(group.to_numpy())
        hand = float((by["correct"].mean() - by["source_correct"].mean().astype(float)).mean())
        assert m["seeds/lift_mean"] == pytest.approx(hand)
    assert rescued_any, "no all-wrong fresh group in the run: the rescue share went untested"
    # each row's source is the cached response its seed was cut from (row i of step j <- cache[j][i], in the seed
    # buffer the last checkpoint holds): its length, its first seed_len tokens, and the grader's verdict on it whole
    cache = ckpt.load_trainer_state(ckpt.checkpoint_dir(run_dir, 3))["rollouts"]["seed_buffer"]["cache"]
    tok = build_tokenizer()
    for j in (1, 2, 3):
        seeded = rows[(rows["step"] == j) & (rows["variant"] == "seed")]
        for r, c in zip(seeded.itertuples(), cache[j]):
            ids = list(c["response_ids"])
            assert r.source_len == len(ids) and list(r.response_ids[: r.seed_len]) == ids[: r.seed_len]
            assert r.source_correct == _mod3("", [tok.decode(ids, skip_special_tokens=True)], [{}])[0].correct


@pytest.mark.slow   # a second four-step run
def test_seed_grade_sources_false_skips_the_source_grading_and_the_lift(tmp_path, capsys):
    run_dir, metrics, graded = _train_seeded(tmp_path, seed_grade_sources="false")
    assert graded == 4 * 16   # the trained rows only: no source graded whole
    for m in metrics[1:]:
        logged = {k for k in SUMMARY_KEYS if f"seeds/{k}" in m}   # the lift summary's keys this step logged
        assert logged == {"lift_prompts", "zero_adv_share"} and m["seeds/lift_prompts"] == 0
        assert 0.0 <= m["seeds/zero_adv_share"] <= 1.0 and m["seeds/cont_tokens"] > 0
    rows = read_rollouts(run_dir).to_pandas()
    seeded = rows[rows["variant"] == "seed"]
    assert len(seeded) == 3 * 16 and seeded["source_correct"].isna().all() and seeded["source_len"].notna().all()
    # no fresh value to compare with: `tsanalysis seeds` says so in one line
    capsys.readouterr()   # the training run's own lines
    assert tsanalysis_main(["seeds", str(run_dir), "--out", str(tmp_path / "an")]) == 2
    assert "seed_grade_sources=false" in _one_error_line(capsys) and not (tmp_path / "an").exists()


@pytest.mark.slow   # uses the four-step run
def test_tsanalysis_seeds_writes_its_tables_for_the_run(seeded_run, tmp_path, capsys):
    run_dir, metrics = seeded_run
    out = tmp_path / "an"
    assert tsanalysis_main(["seeds", str(run_dir), "--out", str(out), "--bins", "4"]) == 0
    printed = capsys.readouterr().out
    assert "lift by cut depth" in printed and "zero-advantage groups" in printed and "rescued" in printed
    names = {"summary", "by_step", "by_depth", "by_depth_tokens", "by_age", "by_token", "by_source", "zero_adv",
             "seeds"}
    for n in names:
        assert (out / f"{n}.parquet").is_file() and (out / f"{n}.csv").is_file()
    settings = json.loads((out / "settings.json").read_text())
    assert settings["command"] == "seeds" and set(settings["tables"]) == names
    by_step = pd.read_parquet(out / "by_step.parquet").set_index("step")
    for m in metrics[1:]:   # the command's per-step lift is the trainer's metric
        assert by_step.loc[m["step"], "lift_mean"] == pytest.approx(m["seeds/lift_mean"])
        assert by_step.loc[m["step"], "lift_std"] == pytest.approx(m["seeds/lift_std"])
        assert by_step.loc[m["step"], "rescued"] == m["seeds/rescued"]
        assert by_step.loc[m["step"], "zero_adv_seeded"] == pytest.approx(m["seeds/zero_adv_share"])
    assert sorted(pd.read_parquet(out / "by_age.parquet")["age"]) == [1, 2, 3]


# ---- bad input: one line, exit 2 -------------------------------------------------------------------------------------
def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    return lines[0]


def test_tsanalysis_seeds_on_bad_run_dirs_is_one_line_and_exit_2(tmp_path, capsys):
    assert tsanalysis_main(["seeds", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in _one_error_line(capsys)
    # records written before seeded rows carried their source's verdict: readable, but no fresh value to compare
    old = _synthetic_run(tmp_path / "old", with_source=False)
    import pyarrow.parquet as pq
    for p in (old / "rollouts").iterdir():   # drop the new columns, as an older trainer wrote the files
        t = pq.read_table(p)
        pq.write_table(t.drop(["source_len", "source_correct"]), p)
    assert read_rollouts(old).num_rows == 20   # old files still read
    assert tsanalysis_main(["seeds", str(old), "--out", str(tmp_path / "o")]) == 2
    assert "source_len" in _one_error_line(capsys)
    # an on-policy run has no seeds
    on = write_run(tmp_path / "on", {0: [make_row(length=4)]})
    assert tsanalysis_main(["seeds", str(on), "--out", str(tmp_path / "o")]) == 2
    assert "no seeded rows" in _one_error_line(capsys)
    assert not (tmp_path / "o").exists()


# ---- lift by source age (seed_source=mixture: seeds from past policies) ---------------------------------------------
def _mixed_seeds() -> pd.DataFrame:
    """T = 4. Step 5 (cycle of refresh 4): prompt A written by step 4 (source age 0), B by step 0 (source age 4);
    step 6: prompt C by step 0 (source age 4). G = 2 each."""
    rows = []
    for step, pid, writer, y, s in ((5, "A", 4, [1, 1], [0, 1]), (5, "B", 0, [0, 1], [1, 1]),
                                    (6, "C", 0, [1, 0], [0, 0])):
        for i, (yi, si) in enumerate(zip(y, s)):
            rows.append({"step": step, "prompt_id": pid, "sample_idx": i, "seed_step": writer, "seed_len": 2,
                         "source_len": 8, "trunc_rule": "ratio", "trunc_token_text": "3", "correct": yi,
                         "source_correct": si})
    return SL.seed_table(pd.DataFrame(rows))


def test_source_age_by_hand():
    # (step - step mod T) - seed_step: the cycle's refresh step minus the writer's
    assert SL.source_age([5, 5, 6, 8, 11], [4, 0, 0, 8, 4], refresh_interval=4).tolist() == [0, 4, 4, 0, 4]
    assert SL.source_age([3, 7], [2, 2], refresh_interval=1).tolist() == [1, 5]   # T = 1: every step refreshes


def test_lift_by_source_by_hand():
    # A: V_fresh 0.5, lifts 0.5, 0.5. B: V_fresh 1, lifts -1, 0. C: V_fresh 0, lifts 1, 0.
    t = SL.lift_by_source(_mixed_seeds(), refresh_interval=4, n_boot=200).set_index("source_age")
    assert t.index.tolist() == [0, 4]
    assert (t.loc[0, "seeds"], t.loc[0, "groups"], t.loc[0, "writers"]) == (2, 1, 1)
    assert (t.loc[0, "lift_mean"], t.loc[0, "value_seeded"], t.loc[0, "age_mean"]) == (0.5, 1.0, 1.0)
    assert (t.loc[4, "seeds"], t.loc[4, "groups"], t.loc[4, "writers"]) == (4, 2, 1)
    assert t.loc[4, "lift_mean"] == 0.0 and t.loc[4, "value_seeded"] == 0.5 and t.loc[4, "value_fresh"] == 0.5
    assert t.loc[4, "age_mean"] == 5.5   # steps 5, 5, 6, 6 minus writer 0
    assert t.loc[4, "lift_low"] <= 0.0 <= t.loc[4, "lift_high"]
    # T = 2: step 5's cycle began at 4 and step 6's at 6: C's source age is 6
    t2 = SL.lift_by_source(_mixed_seeds(), refresh_interval=2, n_boot=200).set_index("source_age")
    assert t2.index.tolist() == [0, 4, 6] and t2.loc[6, "lift_mean"] == 0.5 and t2.loc[4, "lift_mean"] == -0.5


def test_tsanalysis_seeds_by_source(tmp_path, capsys):
    run = _synthetic_run(tmp_path / "run")   # seeds at step 1 written by step 0
    out = tmp_path / "an"
    assert tsanalysis_main(["seeds", str(run), "--by", "source", "--refresh-interval", "1", "--out", str(out)]) == 0
    assert "lift by source age" in capsys.readouterr().out
    t = pd.read_parquet(out / "by_source_age.parquet")
    # T = 1: the refresh of step 1's cycle is step 1, the writer step 0: source age 1; the 11 seeds with a lift
    assert t["source_age"].tolist() == [1] and t["seeds"].tolist() == [11]
    assert t["lift_mean"].iloc[0] == pytest.approx(3 / 11)
    # without --refresh-interval the run's config.yaml names T; a synthetic run has none: one line, exit 2
    assert tsanalysis_main(["seeds", str(run), "--by", "source", "--out", str(tmp_path / "o")]) == 2
    assert "pass --refresh-interval T" in _one_error_line(capsys)
    (run / "config.yaml").write_text("seed_refresh_interval: 4\n")
    assert tsanalysis_main(["seeds", str(run), "--by", "source", "--out", str(tmp_path / "o2")]) == 0
    assert pd.read_parquet(tmp_path / "o2" / "by_source_age.parquet")["source_age"].tolist() == [0]


def test_cluster_bootstrap_resamples_whole_groups_and_its_p_value_can_fail():
    rng = np.random.default_rng(1)
    noise = rng.normal(0.0, 1.0, 400)
    noise -= noise.mean()                                   # centred: the mean is 0 to rounding
    groups = np.repeat(np.arange(40), 10)
    flat = SL.cluster_bootstrap(noise, groups)
    assert flat["low"] < 0 < flat["high"] and flat["p"] > 0.5 and flat["lift"] == pytest.approx(0.0, abs=1e-12)
    # the same values, each group sharing one shift: a cluster interval is wider than the seeds-as-independent one
    shifted = noise + np.repeat(rng.normal(0.0, 2.0, 40), 10)
    clustered = SL.cluster_bootstrap(shifted, groups)
    alone = SL.cluster_bootstrap(shifted, np.arange(400))
    assert clustered["high"] - clustered["low"] > 1.8 * (alone["high"] - alone["low"])
    assert SL.cluster_bootstrap(noise + 1.0, groups)["p"] == 0.0
