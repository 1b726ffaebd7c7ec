"""figures/: plotting functions on tables computed by tsanalysis from synthetic runs, the loaders, make_all.

The synthetic runs (tests/helpers/runs.py, the real rollout schema) have known shapes: entropy falls along the
response in the on-policy run and rises with mini-batching; the seeded runs cut at ~70 % with seed tokens
clipped more often than continuation tokens; the entropy-rule run cuts at discourse words, the ratio-rule run at
digits, operators and LaTeX. Every test checks that what is drawn equals the table values.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from matplotlib.figure import Figure

from figures import (load, plot_mismatch, plot_positions, plot_relay_passk, plot_seeded_positions,
                     plot_truncation_tokens, plot_zero_adv)
from figures.make_all import main as make_all_main
from figures.make_all import make_all
from tests.helpers.runs import make_row, write_run
from tsanalysis.tables import lemma4_tables, mismatch_tables_for_run, positions_tables, truncation_tables, zero_adv_tables
from tests.helpers.runs import PNG_MAGIC, synthetic_relay, synthetic_runs

FIG_NAMES = ("fig2_relay", "fig3_positions", "fig4_seeded_positions", "fig5_truncation_tokens", "lemma4_zero_adv",
             "mismatch")


# ---- fixtures --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Shared by the module's tests, READ-ONLY: a test that writes into a run (results, relay folders, mtimes)
    works on a copy (``_copy_runs``); ``_runs_untouched`` checks it after every test that uses it."""
    return synthetic_runs(tmp_path_factory.mktemp("figruns") / "runs")


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


@pytest.fixture(autouse=True)
def _runs_untouched(request):
    """The shared synthetic runs are the same after the test as before (files, sizes, mtimes)."""
    if "runs" not in request.fixturenames:
        yield
        return
    root = request.getfixturevalue("runs")["onpolicy"].parent
    before = _tree(root)
    yield
    assert _tree(root) == before, "a test changed the shared `runs` fixture; copy it first (_copy_runs)"


def _copy_runs(runs: dict[str, Path], dest: Path) -> dict[str, Path]:
    """A private copy of the shared runs (mtimes preserved), for tests that write into them."""
    root = Path(shutil.copytree(runs["onpolicy"].parent, dest))
    return {kind: root / run.name for kind, run in runs.items()}


@pytest.fixture(scope="module")
def tables(runs) -> dict:
    return {
        "pos_on": positions_tables(runs["onpolicy"]), "pos_mb": positions_tables(runs["minibatch"]),
        "pos_seed": positions_tables(runs["seeds-entropy"]),
        "trunc_ent": truncation_tables(runs["seeds-entropy"]), "trunc_rat": truncation_tables(runs["seeds-ratio"]),
        "zero": zero_adv_tables(runs["seeds-entropy"]), "mismatch": mismatch_tables_for_run(runs["seeds-ratio"]),
    }


def _nan_eq(a, b):
    np.testing.assert_allclose(np.asarray(a, float), np.asarray(b, float), rtol=1e-12, atol=1e-12, equal_nan=True)


def _line(ax, label):
    hits = [ln for ln in ax.lines if ln.get_label() == label]
    assert len(hits) == 1, f"expected one line labelled {label!r}, got {[ln.get_label() for ln in ax.lines]}"
    return hits[0]


def _render(fig: Figure, path: Path) -> None:
    fig.savefig(path, dpi=60)
    assert path.read_bytes()[:8] == PNG_MAGIC


# ---- the synthetic runs have the intended shapes (so the figures show something) -------------------------------
def test_synthetic_runs_have_the_intended_shapes(tables):
    on = tables["pos_on"]["bins"].query("series == 'all'")["entropy_mean"].to_numpy()
    mb = tables["pos_mb"]["bins"].query("series == 'all'")["entropy_mean"].to_numpy()
    assert on[0] > on[-1] + 0.5 and mb[-1] > mb[0] + 0.5
    tk = tables["pos_seed"]["takeover"].iloc[0]
    assert 0.6 < tk["takeover_mean"] < 0.75 and tk["seeded_responses"] == 3 * 6 * 8
    assert set(tables["trunc_ent"]["tokens"]["rule"]) == {"entropy"}
    assert set(tables["zero"]["by_step"]["kind"]) == {"on_policy", "seeded"}


# ---- one test per plotting function ----------------------------------------------------------------------------
def test_plot_positions_draws_entropy_and_stacked_clip_rates(tables, tmp_path):
    on, mb = tables["pos_on"]["bins"], tables["pos_mb"]["bins"]
    fig = plot_positions({"(a) on-policy": on, "(b) mini-batching": mb})
    assert isinstance(fig, Figure) and len(fig.axes) == 4
    for row, bins in enumerate((on, mb)):
        d = bins[bins["series"] == "all"].sort_values("bin")
        ax_e, ax_c = fig.axes[2 * row], fig.axes[2 * row + 1]
        _nan_eq(ax_e.lines[0].get_ydata(), d["entropy_mean"])
        _nan_eq(ax_e.lines[0].get_xdata(), (d["pos_lo"] + d["pos_hi"]) / 2)
        heights = np.array([p.get_height() for p in ax_c.patches])
        bottoms = np.array([p.get_y() for p in ax_c.patches])
        assert len(heights) == 2 * len(d)   # low bars then high bars
        _nan_eq(heights[:len(d)], d["clip_low_per_1e4"])
        _nan_eq(heights[len(d):], d["clip_high_per_1e4"])
        _nan_eq(bottoms[len(d):], d["clip_low_per_1e4"])   # high stacked on low: top = clip_per_1e4
        _nan_eq(bottoms[len(d):] + heights[len(d):], d["clip_per_1e4"])
        assert "entropy" in ax_e.get_ylabel() and "10⁴" in ax_c.get_ylabel()
        assert ax_e.get_xlabel().startswith("relative position")
    assert [sf._suptitle.get_text() for sf in fig.subfigs] == ["(a) on-policy", "(b) mini-batching"]
    assert [ax.get_title(loc="left") for ax in fig.axes] == ["entropy", "clipping"] * 2
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[0] == "mean entropy" and any("low clip" in s for s in labels) and any("high clip" in s for s in labels)
    _render(fig, tmp_path / "f3.png")


def test_plot_seeded_positions_separates_seed_and_continuation(tables, tmp_path):
    bins, takeover = tables["pos_seed"]["bins"], tables["pos_seed"]["takeover"]
    fig = plot_seeded_positions(bins, takeover)
    assert len(fig.axes) == 2
    ax_e, ax_c = fig.axes
    # continuation and the dotted whole-response line are over seeded responses only (no refresh-step rows)
    for series, label, marker in (("seed", "seed tokens", "s"), ("seeded_continuation", "continuation tokens", "o"),
                                  ("seeded", "all tokens of seeded responses", "None")):
        d = bins[bins["series"] == series].sort_values("bin")
        ln = _line(ax_e, label)
        _nan_eq(ln.get_ydata(), d["entropy_mean"])
        assert ln.get_marker() == marker
    assert _line(ax_e, "seed tokens").get_color() != _line(ax_e, "continuation tokens").get_color()
    # bars: seed low, seed high, continuation low, continuation high (10 bins each)
    h = np.array([p.get_height() for p in ax_c.patches[:40]]).reshape(4, 10)   # then the takeover band
    seed = bins[bins["series"] == "seed"].sort_values("bin")
    cont = bins[bins["series"] == "seeded_continuation"].sort_values("bin")
    _nan_eq(h[0], seed["clip_low_per_1e4"])
    _nan_eq(h[1], seed["clip_high_per_1e4"])
    _nan_eq(h[2], cont["clip_low_per_1e4"])
    _nan_eq(h[3], cont["clip_high_per_1e4"])
    # the takeover point: a dashed vertical line at its mean in both panels, a ±1 s.d. band
    m, s = takeover["takeover_mean"].iloc[0], takeover["takeover_std"].iloc[0]
    for ax in (ax_e, ax_c):
        v = [ln for ln in ax.lines if ln.get_linestyle() == "--"]
        assert len(v) == 1 and np.allclose(v[0].get_xdata(), m)
        span = [p for p in ax.patches if p.get_x() == pytest.approx(m - s)]
        assert len(span) == 1 and span[0].get_width() == pytest.approx(2 * s)
    assert any("takeover point" in t.get_text() for t in fig.legends[0].get_texts())
    _render(fig, tmp_path / "f4.png")
    # a table written before the seeded-only series existed: continuation and all, as before
    old = bins[bins["series"].isin(["all", "seed", "continuation"])]
    ln = _line(plot_seeded_positions(old, takeover).axes[0], "continuation tokens")
    _nan_eq(ln.get_ydata(), old[old["series"] == "continuation"].sort_values("bin")["entropy_mean"])
    # without a takeover table: no vertical line
    fig2 = plot_seeded_positions(bins, None)
    assert not [ln for ln in fig2.axes[0].lines if ln.get_linestyle() == "--"]


def _no_clips(bins: pd.DataFrame) -> pd.DataFrame:
    """The table of a run that clipped nothing (one update per batch: every ratio is 1)."""
    out = bins.copy()
    for col in ("clip_low_per_1e4", "clip_high_per_1e4", "clip_per_1e4"):
        out[col] = 0.0
    return out


def _texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def test_a_panel_without_clipped_tokens_says_so_and_the_legend_names_no_clip(tables, tmp_path):
    on, mb = _no_clips(tables["pos_on"]["bins"]), tables["pos_mb"]["bins"]
    fig = plot_positions({"(a) on-policy": on, "(b) mini-batching": mb})
    assert _texts(fig.axes[1]) == ["no clipped tokens"] and _texts(fig.axes[3]) == []   # (b) clips: its bars
    assert any("low clip" in t.get_text() for t in fig.legends[0].get_texts())
    fig = plot_positions(on)   # nothing clipped anywhere: no clip colours in the legend
    assert _texts(fig.axes[1]) == ["no clipped tokens"]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["mean entropy"]
    _render(fig, tmp_path / "f3.png")
    fig = plot_seeded_positions(_no_clips(tables["pos_seed"]["bins"]), tables["pos_seed"]["takeover"])
    assert _texts(fig.axes[1]) == ["no clipped tokens"]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert not any("clip" in x for x in labels) and any("takeover point" in x for x in labels)
    _render(fig, tmp_path / "f4.png")
    fig = plot_seeded_positions(tables["pos_seed"]["bins"], tables["pos_seed"]["takeover"])   # seeds clip
    assert _texts(fig.axes[1]) == [] and any("low clip" in t.get_text() for t in fig.legends[0].get_texts())


def test_plot_truncation_tokens_bars_and_category_shares(tables, tmp_path):
    tok = pd.concat([tables["trunc_rat"]["tokens"], tables["trunc_ent"]["tokens"]], ignore_index=True)
    cat = pd.concat([tables["trunc_rat"]["categories"], tables["trunc_ent"]["categories"]], ignore_index=True)
    fig = plot_truncation_tokens(tok, cat, top=5)
    assert len(fig.axes) == 3
    ax_ent, ax_rat, ax_cat = fig.axes
    assert "entropy" in ax_ent.get_title(loc="left") and "ratio" in ax_rat.get_title(loc="left")
    from figures.style import CATEGORY_COLORS
    from matplotlib.colors import to_hex
    for ax, rule in ((ax_ent, "entropy"), (ax_rat, "ratio")):
        d = tok[tok["rule"] == rule].sort_values("rank").head(5)
        _nan_eq([p.get_width() for p in ax.patches], 100 * d["share"])
        assert [t.get_text() for t in ax.get_yticklabels()] == [s.replace("$", r"\$") for s in d["label"]]
        assert [to_hex(p.get_facecolor()) for p in ax.patches] == [CATEGORY_COLORS[c].lower() for c in d["category"]]
    assert all(t.get_text().startswith("␣") for t in ax_ent.get_yticklabels()[:3])   # Ġ decoded as a space
    # category panel: one stacked bar per rule; segments = category shares, summing to 100 %
    widths = np.array([p.get_width() for p in ax_cat.patches]).reshape(-1, 2)   # [categories, rules]
    for j, rule in enumerate(("entropy", "ratio")):
        want = cat[cat["rule"] == rule].set_index("category").reindex(list(CATEGORY_COLORS))["share"]
        _nan_eq(widths[:, j], 100 * want)
        assert widths[:, j].sum() == pytest.approx(100)
    _render(fig, tmp_path / "f5.png")


def test_plot_truncation_handles_dollar_tokens(tables, tmp_path):
    # '$' alone would start mathtext: the label is escaped and the figure renders
    tok = tables["trunc_rat"]["tokens"]
    assert "$" in set(tok["label"])
    _render(plot_truncation_tokens(tok, tables["trunc_rat"]["categories"], top=30), tmp_path / "dollar.png")


def test_plot_relay_passk_lines_bands_zero_line(tmp_path):
    folders = synthetic_relay(tmp_path)
    passk = {f.name.split("-")[0]: pd.read_parquet(f / "relay_passk.parquet") for f in folders}
    fig = plot_relay_passk(passk)
    assert len(fig.axes) == 1
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    for name, df in passk.items():
        ln = _line(ax, name)
        _nan_eq(ln.get_xdata(), df["k"])
        _nan_eq(ln.get_ydata(), 100 * df["diff"])   # percentage points
    assert len(ax.collections) == 2   # one bootstrap band per benchmark
    band = ax.collections[0].get_paths()[0].vertices[:, 1]
    d0 = next(iter(passk.values()))
    assert band.min() == pytest.approx(100 * d0["diff_low"].min()) and band.max() == pytest.approx(100 * d0["diff_high"].max())
    zero = [ln for ln in ax.lines if np.all(np.asarray(ln.get_ydata()) == 0)]
    assert len(zero) == 1
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(k) for k in d0["k"]]
    assert "relay − final" in ax.get_ylabel() and ax.get_xlabel().startswith("k")
    # a single table also works
    assert len(plot_relay_passk(d0).axes[0].lines) == 2
    _render(fig, tmp_path / "f2.png")


def test_plot_zero_adv_curves_simulation_and_observed(tables, tmp_path):
    lemma4 = pd.concat([lemma4_tables(np.linspace(0, 1, 41), G, simulate=500, seed=1)["lemma4"] for G in (4, 8)],
                       ignore_index=True)
    by_step = tables["zero"]["by_step"]
    fig = plot_zero_adv(lemma4, by_step)
    assert len(fig.axes) == 2
    ax, ax_obs = fig.axes
    for G in (4, 8):
        d = lemma4[lemma4["G"] == G].sort_values("p")
        ln = _line(ax, f"G = {G}")
        _nan_eq(ln.get_xdata(), d["p"])
        _nan_eq(ln.get_ydata(), d["p"] ** G + (1 - d["p"]) ** G)   # D(p) itself
        same = [x for x in ax.lines if x.get_color() == ln.get_color() and x.get_linestyle() == "--"]
        _nan_eq(same[0].get_ydata(), (1 - d["p"]) ** G)
    sims = [x for x in ax.lines if x.get_linestyle() == "None"]
    assert len(sims) == 2 and len(sims[0].get_xdata()) <= 21   # thinned simulated points, one set per G
    sim4 = lemma4[lemma4["G"] == 4].set_index("p")["zero_adv_sim"]
    _nan_eq(sims[0].get_ydata(), sim4.loc[sims[0].get_xdata()])
    for kind, label in (("on_policy", "on-policy groups"), ("seeded", "seeded groups")):
        d = by_step[by_step["kind"] == kind].sort_values("step")
        _nan_eq(_line(ax_obs, f"{label}: observed").get_ydata(), d["zero_adv_obs"])
        _nan_eq(_line(ax_obs, f"{label}: Lemma 4 prediction").get_ydata(), d["zero_adv_pred"])
    assert ax.get_xlabel().startswith("success probability") and "step" in ax_obs.get_xlabel()
    _render(fig, tmp_path / "l4.png")
    # the pure table alone: one panel
    assert len(plot_zero_adv(lemma4).axes) == 1


def test_plot_mismatch_accumulates(tables, tmp_path):
    rel = tables["mismatch"]["relative"]
    fig = plot_mismatch(rel)
    assert len(fig.axes) == 2
    _nan_eq(_line(fig.axes[0], "log π_old/π_b").get_ydata(), rel["log_ratio_mean"])
    cum = _line(fig.axes[1], "Σ log π_old/π_b").get_ydata()
    _nan_eq(cum, rel["cum_log_ratio_mean"])
    assert np.all(np.diff(cum) > 0)   # π_b gave the seed tokens lower log-probs: the sum grows along the seed
    assert "seed length" in fig.axes[0].get_xlabel()
    assert "response" in plot_mismatch(rel, relative_to="response").axes[0].get_xlabel()
    _render(fig, tmp_path / "mm.png")


# ---- loaders ---------------------------------------------------------------------------------------------------
def _cli_results(runs, root: Path) -> Path:
    """Result folders as the tsanalysis CLI writes them (results/analysis/<run>/<command>/)."""
    from tsanalysis.cli import main

    for kind, run in runs.items():
        for cmd in [["positions"], ["zero-adv"]] + ([["truncation"], ["mismatch"]] if "seeds" in kind else []):
            assert main([*cmd, str(run), "--out", str(root / kind / cmd[0])]) == 0
    assert main(["zero-adv", "--p", "0,0.25,0.5,0.75,1", "--G", "8", "--simulate", "200",
                 "--out", str(root / "lemma4" / "zero-adv")]) == 0
    return root


def test_loaders_choose_runs_from_configs(runs, tmp_path, capsys, monkeypatch):
    root = _cli_results(runs, tmp_path / "results")
    capsys.readouterr()
    assert {f.command for f in load.find_results(root)} == {"positions", "zero-adv", "truncation", "mismatch"}
    notes = []
    by_run = load.positions_by_run(root, log=notes.append)
    assert list(by_run) == ["(a) on-policy, no mini-batching [onpolicy]",
                            "(b) on-policy, mini-batching, 4 updates per batch [minibatch]"]
    pd.testing.assert_frame_equal(by_run["(a) on-policy, no mini-batching [onpolicy]"],
                                  pd.read_parquet(root / "onpolicy" / "positions" / "bins.parquet"))
    bins, takeover = load.seeded_positions(root, log=notes.append)
    assert takeover["seeded_responses"].iloc[0] > 0
    assert any("seeds-entropy" in n and "also possible: seeds-ratio" in n for n in notes)   # two candidates
    tok, cat = load.truncation_tokens(root)
    assert sorted(set(tok["rule"])) == ["entropy", "ratio"] and sorted(set(cat["rule"])) == ["entropy", "ratio"]
    lemma4, by_step = load.zero_adv(root)
    assert sorted(lemma4["p"]) == [0, 0.25, 0.5, 0.75, 1] and set(by_step["kind"]) == {"on_policy", "seeded"}
    rel, relative_to = load.mismatch(root)
    assert relative_to == "seed" and len(rel) == 10
    # explicit choices
    mapped = load.positions_by_run(root, {"onpolicy": "minibatch", "custom label": "seeds-ratio"})
    assert list(mapped) == ["(a) on-policy, no mini-batching [minibatch]", "custom label [seeds-ratio]"]
    tok2, _ = load.truncation_tokens(root, {"ratio": "seeds-ratio"})
    assert set(tok2["rule"]) == {"ratio"}
    with pytest.raises(load.MissingResults, match="no cuts of the ratio rule"):
        load.truncation_tokens(root, {"ratio": "seeds-entropy"})
    with pytest.raises(load.MissingResults, match="no positions results for run 'nope'.*minibatch"):
        load.positions_by_run(root, {"onpolicy": "nope"})
    # a relative path is resolved against the repository root when it does not exist in the working directory
    monkeypatch.chdir(tmp_path)
    assert load.resolve_dir("figures") == Path(load.__file__).resolve().parent


def test_loaders_explain_missing_results(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(load.MissingResults, match="tsanalysis relay"):
        load.relay_passk(tmp_path / "empty")
    with pytest.raises(load.MissingResults, match="tsanalysis positions"):
        load.positions_by_run(tmp_path / "empty")
    with pytest.raises(load.MissingResults, match="does not exist"):
        load.seeded_positions(tmp_path / "nowhere")
    with pytest.raises(load.MissingResults, match="tsanalysis zero-adv --p"):
        load.zero_adv(tmp_path / "empty")


# ---- make_all --------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_make_all_on_a_folder_of_runs(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)   # results/analysis/<run> (the CLI default) is looked up relative to the cwd
    runs = _copy_runs(runs, tmp_path / "runs")   # relay folders are added and an mtime is moved below
    root = runs["onpolicy"].parent
    synthetic_relay(root)
    out = tmp_path / "png"
    assert make_all_main([str(root), "--out", str(out), "--results", str(tmp_path / "cache")]) == 0
    printed = capsys.readouterr().out
    for name in FIG_NAMES:
        p = out / f"{name}.png"
        assert p.read_bytes()[:8] == PNG_MAGIC and p.stat().st_size > 20000   # 150 dpi
        assert f"wrote {p}" in printed
    assert "skipped" not in printed
    # the tables were cached in the CLI layout and equal the tsanalysis functions' output
    cached = pd.read_parquet(tmp_path / "cache" / "minibatch" / "positions" / "bins.parquet")
    pd.testing.assert_frame_equal(cached, positions_tables(runs["minibatch"])["bins"])
    s = json.loads((tmp_path / "cache" / "seeds-ratio" / "mismatch" / "settings.json").read_text())
    assert s["command"] == "mismatch" and s["run_dir"] == str(runs["seeds-ratio"].resolve())
    assert not (tmp_path / "cache" / "onpolicy" / "truncation").exists()   # no seeded rows: not applicable
    assert (tmp_path / "cache" / "lemma4" / "zero-adv" / "lemma4.parquet").is_file()
    # second call: everything is reused, nothing recomputed
    report = make_all(root, out=out, results=tmp_path / "cache", log=lambda m: None, dpi=40)
    assert len(report["written"]) == 6 and not report["skipped"] and not report["failed"]
    make_all_main([str(root), "--out", str(out), "--results", str(tmp_path / "cache"), "--dpi", "40"])
    printed = capsys.readouterr().out
    assert "computed in" not in printed and printed.count("up to date") == 12
    # a newer rollout file makes that run's results stale
    f = runs["onpolicy"] / "rollouts" / "step_000000.parquet"
    t = (tmp_path / "cache" / "onpolicy" / "positions" / "settings.json").stat().st_mtime + 10
    os.utime(f, (t, t))
    make_all_main([str(root), "--out", str(out), "--results", str(tmp_path / "cache"), "--dpi", "40"])
    printed = capsys.readouterr().out
    assert "onpolicy positions: computed" in printed and "minibatch positions: up to date" in printed


@pytest.mark.slow
def test_make_all_on_a_single_run_and_explicit_choices(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # one on-policy run: its own analysis folder, Figures 3 and Lemma 4 drawn; the rest skipped, with commands
    run = shutil.copytree(runs["onpolicy"], tmp_path / "runs" / "solo")
    assert make_all_main([str(run), "--dpi", "40"]) == 0
    printed = capsys.readouterr().out
    assert (run / "analysis" / "solo" / "positions" / "bins.parquet").is_file()
    written = sorted(p.name for p in (run / "figures").iterdir())
    assert written == ["fig3_positions.png", "lemma4_zero_adv.png"]
    for name, cmd in (("fig2_relay", "tsanalysis relay"), ("fig4_seeded_positions", "tsanalysis positions"),
                      ("fig5_truncation_tokens", "tsanalysis truncation"), ("mismatch", "tsanalysis mismatch")):
        line = next(s for s in printed.splitlines() if s.startswith(f"skipped {name}:"))
        assert cmd in line
    # explicit choices over a results tree written by the CLI
    root = _cli_results(runs, tmp_path / "results")
    capsys.readouterr()
    out = tmp_path / "explicit"
    assert make_all_main([str(root), "--out", str(out), "--fig3", "onpolicy=onpolicy", "--fig4", "seeds-ratio",
                          "--fig5", "entropy=seeds-entropy", "--dpi", "40"]) == 0
    printed = capsys.readouterr().out
    assert "Figure 3 onpolicy: run 'onpolicy'" in printed
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{n}.png" for n in FIG_NAMES if n != "fig2_relay")
    # a run that is not there: reported as a failure, exit status 1
    assert make_all_main([str(root), "--out", str(out), "--fig4", "nope", "--dpi", "40"]) == 1
    assert "FAILED fig4_seeded_positions: no positions results for run 'nope'" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        make_all_main([str(root), "--fig3", "onpolicy"])   # not role=RUN
    assert make_all_main([str(tmp_path / "missing")]) == 2


@pytest.mark.slow
def test_automatic_choices_follow_the_paper_settings(tmp_path):
    """With the demo's mini configs, make_all picks the paper's pairings without being told."""
    configs = {
        "mini_onpolicy": {"algorithm": "dapo"},
        "mini_onpolicy_minibatch": {"algorithm": "dapo", "mini_batches_per_step": 4},
        "mini_luffy": {"algorithm": "luffy"},
        "mini_seeds_entropy": {"algorithm": "seeds", "seed_rule": "entropy", "seed_ratio": 0.5,
                               "seed_refresh_interval": 8, "seed_loss": "state+action"},
        "mini_seeds_fig4": {"algorithm": "seeds", "seed_rule": "ratio", "seed_ratio": 0.7,
                            "seed_refresh_interval": 16, "seed_loss": "state+action"},
        "mini_seeds_ratio": {"algorithm": "seeds", "seed_rule": "ratio", "seed_ratio": 0.5,
                             "seed_refresh_interval": 8, "seed_loss": "state+action"},
        "mini_seeds_state": {"algorithm": "seeds", "seed_rule": "ratio", "seed_ratio": 0.5,
                             "seed_refresh_interval": 8, "seed_loss": "state"},
    }
    for name, cfg in configs.items():
        seeded = cfg["algorithm"] == "seeds"
        rows = [make_row(prompt_id="q", sample_idx=i, length=6, seed_len=3 if seeded else 0, reward=float(i % 2),
                         **({"trunc_rule": cfg["seed_rule"]} if seeded else {})) for i in range(4)]
        write_run(tmp_path / "runs" / name, {0: rows})
        (tmp_path / "runs" / name / "config.yaml").write_text(yaml.safe_dump({"run_name": name, **cfg}))
    notes: list[str] = []
    report = make_all(tmp_path / "runs", log=notes.append, dpi=40)
    assert not report["failed"] and set(report["skipped"]) == {"fig2_relay"}
    text = "\n".join(notes)
    for line in ("Figure 3 onpolicy: run 'mini_onpolicy'", "Figure 3 minibatch: run 'mini_onpolicy_minibatch'",
                 "Figure 4: run 'mini_seeds_fig4'", "Figure 5 entropy rule: run 'mini_seeds_entropy'",
                 "Figure 5 ratio rule: run 'mini_seeds_ratio'", "mismatch: run 'mini_seeds_fig4'"):
        assert line in text, text
    assert "mini_luffy" not in next(s for s in notes if "Figure 3 onpolicy" in s)
