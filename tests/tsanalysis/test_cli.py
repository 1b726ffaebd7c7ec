"""The tsanalysis CLI on synthetic run directories (tests/helpers/runs.py): exact tables, errors, streaming; the
CLI writes what the tsanalysis.tables functions return (that nothing imports the CLI: tests/test_layering.py)."""

import json
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import contracts.records
from tests.helpers.runs import make_row, write_run
from tsanalysis import io as tio
from tsanalysis import tables
from tsanalysis.cli import main
from tsanalysis.errors import RelayError, UsageError

T3 = [1.0, 2.0, 3.0]
T5 = [10.0, 20.0, 30.0, 40.0, 50.0]
T10 = [100.0 + i for i in range(10)]


@pytest.fixture
def run(tmp_path):
    """Step 0: two on-policy responses (3 and 5 tokens); step 1: one seeded 10-token response, seed_len 4."""
    return write_run(tmp_path / "runs" / "synth", {
        0: [make_row(prompt_id="a", sample_idx=0, entropy=T3, clipped_high=[0, 0, 1], reward=1.0),
            make_row(prompt_id="a", sample_idx=1, entropy=T5, clipped_low=[1, 0, 0, 0, 0])],
        1: [make_row(prompt_id="b", sample_idx=0, entropy=T10, seed_len=4, trunc_token_text="ĠSo",
                     clipped_high=[1, 1] + [0] * 8, clipped_low=[0] * 9 + [1])],
    })


def _read(out, name):
    a = pd.read_parquet(out / f"{name}.parquet")
    b = pd.read_csv(out / f"{name}.csv")
    assert list(a.columns) == list(b.columns)
    return a, b


def test_positions_writes_the_hand_computed_table(run, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["positions", str(run), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "takeover point" in printed and str(out) in printed
    bins, csv = _read(out, "bins")
    assert list(bins.columns) == ["series", "bin", "pos_lo", "pos_hi", "tokens", "entropy_mean", "entropy_count",
                                  "loss_tokens", "clipped_low", "clipped_high", "clip_low_per_1e4",
                                  "clip_high_per_1e4", "clip_per_1e4"]
    for df in (bins, csv):
        al = df[df["series"] == "all"].set_index("bin")
        assert al["tokens"].tolist() == [3, 1, 2, 2, 2, 1, 3, 1, 2, 1]
        np.testing.assert_allclose(al["entropy_mean"], [37, 101, 61, 52.5, 67, 105, 149 / 3, 107, 79, 109])
        np.testing.assert_allclose(al["clip_low_per_1e4"], [1e4 / 3, 0, 0, 0, 0, 0, 0, 0, 0, 1e4])
        np.testing.assert_allclose(al["clip_high_per_1e4"], [1e4 / 3, 1e4, 0, 0, 0, 0, 1e4 / 3, 0, 0, 0])
        assert al["clipped_high"].tolist() == [1, 1, 0, 0, 0, 0, 1, 0, 0, 0]
        sd = df[df["series"] == "seed"].set_index("bin")
        assert sd["tokens"].tolist() == [1, 1, 1, 1, 0, 0, 0, 0, 0, 0]
        np.testing.assert_allclose(sd["entropy_mean"].iloc[:4], [100, 101, 102, 103])
        assert sd["entropy_mean"].iloc[4:].isna().all()
        np.testing.assert_allclose(sd["clip_high_per_1e4"].iloc[:4], [1e4, 1e4, 0, 0])
        co = df[df["series"] == "continuation"].set_index("bin")
        assert (co["tokens"] + sd["tokens"]).tolist() == al["tokens"].tolist()
        np.testing.assert_allclose(co["entropy_mean"].iloc[[0, 4]], [5.5, 67])
        # seeded responses only (the 10-token one): its continuation is tokens 4..9, one per bin 4..9
        sc = df[df["series"] == "seeded_continuation"].set_index("bin")
        assert sc["tokens"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 1, 1]
        np.testing.assert_allclose(sc["entropy_mean"].iloc[4:], [104, 105, 106, 107, 108, 109])
        np.testing.assert_allclose(sc["clip_low_per_1e4"].iloc[4:], [0, 0, 0, 0, 0, 1e4])
        sa = df[df["series"] == "seeded"].set_index("bin")
        assert sa["tokens"].tolist() == [1] * 10 and (sa["tokens"] == sd["tokens"] + sc["tokens"]).all()
        np.testing.assert_allclose(sa["entropy_mean"], T10)
    tk = pd.read_parquet(out / "takeover.parquet").iloc[0]
    assert (tk["responses"], tk["seeded_responses"], tk["seed_tokens"], tk["continuation_tokens"]) == (3, 1, 4, 14)
    assert tk["takeover_mean"] == pytest.approx(0.4)
    hist = pd.read_parquet(out / "takeover_hist.parquet")
    assert hist["responses"].tolist() == [0, 0, 0, 0, 1, 0, 0, 0, 0, 0]
    s = json.loads((out / "settings.json").read_text())
    assert s["command"] == "positions" and s["args"]["bins"] == 10
    assert s["steps"] == {"range": None, "selected": [0, 1]}
    assert s["run_dir"] == str(run.resolve()) and "version" in s
    assert sorted(s["tables"]) == ["bins", "takeover", "takeover_hist"]


def test_positions_step_range_and_default_out(run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["positions", str(run), "--steps", "0:1", "--bins", "2"]) == 0
    out = tmp_path / "results" / "analysis" / "synth" / "positions"
    bins = pd.read_parquet(out / "bins.parquet")
    al = bins[bins["series"] == "all"]
    assert al["tokens"].tolist() == [2 + 3, 1 + 2]          # step 1 excluded; L=3 -> bins 0,0,1; L=5 -> 0,0,0,1,1
    assert json.loads((out / "settings.json").read_text())["steps"] == {"range": "0:1", "selected": [0]}


def test_positions_streams_and_never_reads_whole_runs(run, tmp_path, monkeypatch):
    def forbidden(*a, **k):
        raise AssertionError("read_rollouts loads a whole run into memory")

    seen = []
    real = contracts.records.iter_file_batches

    def spy(*a, **k):
        seen.append(k.get("batch_size"))
        return real(*a, **k)

    monkeypatch.setattr(contracts.records, "read_rollouts", forbidden)
    monkeypatch.setattr(contracts.records, "iter_file_batches", spy)
    for cmd in ("positions", "truncation", "zero-adv", "mismatch"):
        assert main([cmd, str(run), "--out", str(tmp_path / cmd)]) == 0
    assert seen and all(b == tio.BATCH_ROWS for b in seen)


def test_positions_denominators_loss_mask_and_rows_without_loss_records(tmp_path):
    rows = [make_row(entropy=[1, 2, 3, 4], loss_mask=[0, 1, 1, 1], clipped_high=[1, 1, 0, 0]),
            # a group dropped by dynamic sampling: no loss records (NaN entropy, no loss tokens)
            make_row(entropy=[math.nan] * 4, loss_mask=[0] * 4, sample_idx=1)]
    run = write_run(tmp_path / "r", {0: rows})
    assert main(["positions", str(run), "--bins", "4", "--out", str(tmp_path / "o")]) == 0
    al = pd.read_parquet(tmp_path / "o" / "bins.parquet").query("series == 'all'")
    assert al["tokens"].tolist() == [2, 2, 2, 2]
    assert al["entropy_count"].tolist() == [1, 1, 1, 1] and al["entropy_mean"].tolist() == [1, 2, 3, 4]
    assert al["loss_tokens"].tolist() == [0, 1, 1, 1]
    assert al["clip_high_per_1e4"].tolist()[1:] == [1e4, 0, 0] and np.isnan(al["clip_high_per_1e4"].iloc[0])
    assert main(["positions", str(run), "--bins", "4", "--loss-tokens-only", "--out", str(tmp_path / "o2")]) == 0
    al = pd.read_parquet(tmp_path / "o2" / "bins.parquet").query("series == 'all'")
    assert al["entropy_count"].tolist() == [0, 1, 1, 1]


def test_truncation_command(tmp_path):
    ent = ["ĠSo", "ĠSo", " Let", "Wait"]
    rat = ["3", "+", "\\frac", "\n", "x", "ĠSo"]
    rows = [make_row(length=6, seed_len=2, trunc_rule="entropy", trunc_token_text=t, sample_idx=i)
            for i, t in enumerate(ent)]
    rows += [make_row(length=6, seed_len=3, trunc_rule="ratio", trunc_token_text=t, sample_idx=10 + i)
             for i, t in enumerate(rat)]
    rows += [make_row(length=4, sample_idx=99)]   # on-policy: no cut
    run = write_run(tmp_path / "r", {3: rows[:5], 4: rows[5:]})
    out = tmp_path / "o"
    assert main(["truncation", str(run), "--top", "2", "--out", str(out)]) == 0
    tok, _ = _read(out, "tokens")
    assert tok[tok["rule"] == "entropy"][["token", "count"]].values.tolist() == [["ĠSo", 2], [" Let", 1]]
    assert tok[tok["rule"] == "ratio"]["rule_total"].iloc[0] == 6
    cat, _ = _read(out, "categories")
    c = cat.set_index(["rule", "category"])["count"]
    assert c[("entropy", "discourse")] == 4 and c[("ratio", "latex")] == 1 and c[("ratio", "whitespace")] == 1


def test_truncation_on_policy_run_is_a_clear_error(run, tmp_path, capsys):
    assert main(["truncation", str(run), "--steps", "0:1", "--out", str(tmp_path / "o")]) == 2
    assert "no rows with a trunc_rule" in capsys.readouterr().err


def test_zero_adv_command_on_run_and_pure(run, tmp_path):
    out = tmp_path / "o"
    assert main(["zero-adv", str(run), "--out", str(out)]) == 0
    by, _ = _read(out, "by_step")
    assert by[["step", "kind", "groups", "zero_adv_obs"]].values.tolist() == [[0, "on_policy", 1, 0.0], [1, "seeded", 1, 1.0]]
    pure = tmp_path / "p"
    assert main(["zero-adv", "--p", "0.1,0.5", "--G", "8", "--simulate", "20000", "--seed-probs", "0,1",
                 "--out", str(pure)]) == 0
    t, _ = _read(pure, "lemma4")
    assert t["zero_adv"].tolist() == pytest.approx([0.9 ** 8 + 0.1 ** 8, 2 * 0.5 ** 8])
    assert (np.abs(t["zero_adv_sim"] - t["zero_adv"]) < 4 * np.sqrt(t["zero_adv"] * (1 - t["zero_adv"]) / 20000)).all()
    sh, _ = _read(pure, "shared_seeds")
    assert (sh["shared"].iloc[0], sh["independent"].iloc[0]) == (1.0, pytest.approx(2 * 0.5 ** 8))


def test_zero_adv_needs_a_run_or_p(capsys):
    assert main(["zero-adv"]) == 2
    assert "RUN_DIR or --p" in capsys.readouterr().err


def test_mismatch_command(tmp_path):
    row = make_row(length=5, seed_len=3, logp_old=[-1, -1, -2, -1, -1], logp_behavior=[-1, -2, -1, math.nan, math.nan])
    run = write_run(tmp_path / "r", {0: [row, make_row(length=4)]})
    out = tmp_path / "o"
    assert main(["mismatch", str(run), "--bins", "3", "--width", "2", "--thresholds", "0.5,1.5", "--out", str(out)]) == 0
    rel, _ = _read(out, "relative")
    np.testing.assert_allclose(rel["cum_abs_log_ratio_mean"], [0, 1, 2])
    np.testing.assert_allclose(rel["cum_kl_k3_mean"], [0, math.e - 2, math.e - 2 + 1 / math.e])
    cr, _ = _read(out, "crossing")
    assert cr.set_index(["quantity", "threshold"]).loc[("cum_abs_log_ratio", 1.5), "pos_median"] == 2
    assert main(["mismatch", str(write_run(tmp_path / "r2", {0: [make_row(length=3)]}))]) == 2   # no seeded rows


# ---- malformed and missing run directories -----------------------------------------------------------------------
def test_missing_directory_and_missing_rollouts(tmp_path, capsys):
    assert main(["positions", str(tmp_path / "nope")]) == 2
    assert f"'{tmp_path / 'nope'}' does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["positions", str(tmp_path / "empty")]) == 2
    assert "no rollouts/ folder" in capsys.readouterr().err
    (tmp_path / "empty" / "rollouts").mkdir()
    assert main(["positions", str(tmp_path / "empty")]) == 2
    assert "no step_NNNNNN.parquet files" in capsys.readouterr().err


def test_parquet_missing_a_column_names_file_and_column(run, capsys):
    path = contracts.records.rollout_path(run, 1)
    table = pq.read_table(path).drop(["clipped_high"])
    pq.write_table(table, path)
    assert main(["positions", str(run)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "missing column 'clipped_high'" in err
    # a command that does not need the column still works
    assert main(["zero-adv", str(run), "--out", str(run / "za")]) == 0


def test_wrong_type_unreadable_file_misaligned_lists_and_empty_range(run, tmp_path, capsys):
    path = contracts.records.rollout_path(run, 1)
    t = pq.read_table(path)
    pq.write_table(t.set_column(t.schema.get_field_index("entropy"), "entropy", pa.array(["x"])), path)
    assert main(["positions", str(run)]) == 2
    assert "column 'entropy' has type string" in capsys.readouterr().err
    path.write_bytes(b"not parquet")
    assert main(["positions", str(run)]) == 2
    assert f"{path}: not a readable Parquet file" in capsys.readouterr().err
    bad = write_run(tmp_path / "bad", {0: [make_row(entropy=[1, 2, 3], clipped_low=[0, 0])]})
    assert main(["positions", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "step_000000.parquet" in err and "'clipped_low' has 2 values in row 0" in err
    assert main(["positions", str(bad), "--steps", "5:9"]) == 2
    assert "no rollout files in steps [5, 9)" in capsys.readouterr().err


@pytest.mark.slow   # over 1.5 s of sandboxed processes or a subprocess
def test_python_dash_m_entry_point(run, tmp_path):
    r = subprocess.run([sys.executable, "-m", "tsanalysis", "zero-adv", "--p", "0.5", "--G", "2",
                        "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "0.5" in r.stdout and (tmp_path / "o" / "lemma4.csv").exists()
    r = subprocess.run([sys.executable, "-m", "tsanalysis", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "positions" in r.stdout and "relay" in r.stdout


# ---- the CLI is a shell over the library ----------------------------------------------------------------------------
def test_cli_writes_what_the_library_functions_return(run, tmp_path):
    for cmd, t in (("positions", tables.positions_tables(run)), ("truncation", tables.truncation_tables(run)),
                   ("zero-adv", tables.zero_adv_tables(run)), ("mismatch", tables.mismatch_tables_for_run(run))):
        assert main([cmd, str(run), "--out", str(tmp_path / cmd)]) == 0
        for name, df in t.items():
            pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / cmd / f"{name}.parquet"), df, check_dtype=False)
    assert issubclass(RelayError, UsageError) and issubclass(UsageError, ValueError)
