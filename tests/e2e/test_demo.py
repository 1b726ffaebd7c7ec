"""demo/: ``python -m demo --quick`` end to end, once, then every output it promises is checked.

The quick demo (tiny:1m, a few RL steps per method, a small held-out eval) runs in a subprocess exactly as a
user would start it; the tests read what it wrote: one finished run per method, the eval leaderboard, relay
pass@k, the analysis tables and the PNGs, and the Figure 4 notebook executed against that folder.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from demo.addition import FULL, METHODS, QUICK, prepare_out
from demo.common import DemoError, run_config, run_finished

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FIGURES = ["fig2_relay", "fig3_positions", "fig4_seeded_positions", "fig5_truncation_tokens", "lemma4_zero_adv",
           "mismatch"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def quick(tmp_path_factory) -> tuple[Path, str]:
    """(output folder, what the demo printed). THINKING_SEEDS_DEMO_QUICK=DIR reuses a finished quick demo instead
    (its summary.md stands in for the printed output) when iterating on these tests."""
    reuse = os.environ.get("THINKING_SEEDS_DEMO_QUICK")
    if reuse:
        return Path(reuse), (Path(reuse) / "summary.md").read_text()
    out = tmp_path_factory.mktemp("demo") / "demo-quick"
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "demo", "--quick", "--out", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, f"demo failed (rc {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return out, proc.stdout


def test_every_method_has_a_finished_run(quick):
    out, _ = quick
    for spec in METHODS:
        run = out / "runs" / spec.name
        lines = [line for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        assert len(lines) == QUICK.total_steps, f"{spec.name}: {len(lines)} metrics lines"
        assert [json.loads(line)["step"] for line in lines] == list(range(QUICK.total_steps))
        assert len(list((run / "rollouts").glob("step_*.parquet"))) == QUICK.total_steps
        assert (run / "checkpoints" / f"step_{QUICK.total_steps - 1:06d}" / "model.safetensors").is_file()
    # the on-policy run also keeps the early checkpoint relay starts from
    assert (out / "runs" / "onpolicy" / "checkpoints" / f"step_{QUICK.early_every - 1:06d}").is_dir()


def test_runs_share_the_warmup_and_the_budget(quick):
    import yaml

    out, _ = quick
    cfgs = {s.name: yaml.safe_load((out / "runs" / s.name / "config.yaml").read_text()) for s in METHODS}
    for key in ("model", "train_file", "total_steps", "prompts_per_step", "samples_per_prompt",
                "max_response_tokens", "lr", "seed"):
        assert len({json.dumps(c[key]) for c in cfgs.values()}) == 1, f"runs differ in {key}"
    assert Path(cfgs["onpolicy"]["model"]).resolve() == (out / "warmup").resolve()
    assert {c["algorithm"] for c in cfgs.values()} == {"dapo", "seeds", "luffy", "m2po"}
    assert cfgs["onpolicy_minibatch"]["mini_batches_per_step"] > 1
    assert cfgs["seeds_fig4"]["seed_ratio"] == 0.7 and cfgs["seeds_entropy"]["seed_rule"] == "entropy"
    assert cfgs["seeds_state"]["seed_loss"] == "state"
    # the RL pool holds none of the held-out test prompts
    from scoring.benchmarks import get_benchmark
    held = {p.question for p in get_benchmark(QUICK.task).load()}
    pool = [json.loads(line)["prompt"] for line in open(cfgs["onpolicy"]["train_file"])]
    assert pool and not held & set(pool)


def test_leaderboard_has_a_row_per_method(quick):
    out, stdout = quick
    rows = list(csv.DictReader(open(out / "eval" / "leaderboard.csv")))
    scored = {r["model"]: r for r in rows if r["benchmark"] == QUICK.task}
    assert set(scored) == {"warmup"} | {s.name for s in METHODS}
    for name, r in scored.items():
        assert 0.0 <= float(r["avg"]) <= 1.0, name
        assert float(r["ci_low"]) <= float(r["avg"]) <= float(r["ci_high"]), name
        assert int(r["problems"]) == QUICK.eval_limit and int(r["n"]) == QUICK.eval_n, name
        assert 0.0 <= float(r["pass@1"]) <= float(r[f"pass@{QUICK.eval_n}"]) <= 1.0, name
    md = (out / "eval" / "leaderboard.md").read_text()
    assert all(f"| {name} |" in md for name in scored)
    for name in scored:   # the printed leaderboard names every method
        assert f"| {name} |" in stdout
    samples = out / "eval" / "onpolicy" / f"{QUICK.task}.jsonl"
    assert sum(1 for _ in open(samples)) == QUICK.eval_limit


def test_figures_are_pngs(quick):
    out, stdout = quick
    for name in FIGURES:
        png = out / "figures" / f"{name}.png"
        assert png.is_file(), f"missing {png}"
        data = png.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 5000, name
        assert str(png) in stdout   # the demo printed the path


def test_relay_has_pass_at_k_for_k_up_to_n(quick):
    import pandas as pd

    out, _ = quick
    (folder,) = list((out / "analysis" / "relay").iterdir())
    passk = pd.read_csv(folder / "relay_passk.csv")
    ks = [1, 2, 4] if QUICK.relay_n == 4 else None
    assert passk["k"].tolist() == ks
    assert (passk["problems"] == QUICK.relay_limit).all()
    for col in ("early", "relay", "final"):
        assert passk[col].between(0, 1).all() and passk[col].is_monotonic_increasing
    assert json.loads((folder / "settings.json").read_text())["command"] == "relay"


def test_analysis_tables_exist_for_every_run(quick):
    out, _ = quick
    for spec in METHODS:
        for command in ("positions", "zero-adv"):
            assert (out / "analysis" / spec.name / command / "settings.json").is_file(), (spec.name, command)
    for name in ("seeds_ratio", "seeds_entropy", "seeds_state", "seeds_fig4"):
        assert (out / "analysis" / name / "truncation" / "tokens.csv").is_file(), name


def test_summary_lists_stages_and_the_rerun_would_skip_every_run(quick):
    out, stdout = quick
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["timings"]) == ["data + warm-up", "train", "eval", "relay", "analyses + figures"]
    assert all(t["wall_s"] >= 0 for t in summary["timings"].values())
    assert "Stage timings" in stdout
    warm = out / "warmup"
    for spec in METHODS:   # what run_demo checks before training: every run counts as finished
        cfg = run_config(spec, QUICK, out=out, seed=0, model=warm, train_file=out / "data" / "addition_train.jsonl")
        assert run_finished(cfg), spec.name
    # a full demo will not mix into the quick folder
    with pytest.raises(DemoError, match=r"other settings \(name: recorded 'quick', now 'full'; .*total_steps: "
                                        r"recorded 8, now 40; .*\); rerun with --fresh"):
        prepare_out(out, FULL, fresh=False, log=lambda m: None)


def test_fresh_refuses_a_folder_the_demo_did_not_write(tmp_path):
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(DemoError, match="not written by the demo"):
        prepare_out(tmp_path, QUICK, fresh=True, log=lambda m: None)
    assert (tmp_path / "precious.txt").is_file()


@pytest.mark.parametrize("notebook", ["fig2_relay", "fig3_entropy_clip_positions", "fig4_seeded_positions",
                                      "fig5_truncation_tokens", "lemma4_zero_advantage"])
def test_every_notebook_runs_on_the_demo_output(quick, monkeypatch, notebook):
    import base64

    import nbformat
    from nbclient import NotebookClient

    out, _ = quick
    monkeypatch.setenv("THINKING_SEEDS_RESULTS", str(out))
    nb = nbformat.read(REPO / "notebooks" / f"{notebook}.ipynb", as_version=4)
    NotebookClient(nb, timeout=180, kernel_name="python3",
                   resources={"metadata": {"path": str(REPO / "notebooks")}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if o.output_type in ("display_data", "execute_result") and "image/png" in o.data]
    assert len(images) >= 1, f"{notebook} showed no figure"
    assert all(base64.b64decode(im.data["image/png"])[:8] == PNG_MAGIC for im in images)
    if notebook == "fig4_seeded_positions":
        printed = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
        assert "seeds_fig4" in printed   # the loader chose the demo's Figure 4 run


def test_t_interval_by_hand():
    from demo.miniature import t_interval

    mean, hw = t_interval([0.2, 0.3, 0.4])   # s = 0.1, t_{0.975, 2} = 4.303 (4.30265 to 5 decimals)
    assert mean == pytest.approx(0.3) and hw == pytest.approx(4.30265 * 0.1 / 3 ** 0.5, rel=1e-5)
    assert t_interval([0.5]) == (0.5, None)


def test_miniature_page_rewrite_keeps_the_hand_written_reading(tmp_path, capsys):
    from demo.miniature import NOTES_HEADING, main as miniature_main
    doc, out = tmp_path / "miniature.md", tmp_path / "nothing-run-yet"
    assert miniature_main(["--seeds", "3", "--write-only", "--out", str(out), "--doc", str(doc)]) == 0
    first = doc.read_text()
    assert "| On-policy (DAPO) | not run | 0/3 |" in first
    # a new page starts from the committed page's reading; this one is replaced by our own
    assert first.count(NOTES_HEADING) == 1
    doc.write_text(first.split(NOTES_HEADING)[0] + f"{NOTES_HEADING}\n\nwhat the numbers say\n")
    assert miniature_main(["--seeds", "3", "--write-only", "--out", str(out), "--doc", str(doc)]) == 0
    again = doc.read_text()
    assert again.count(NOTES_HEADING) == 1 and again.rstrip().endswith("what the numbers say")
    assert "| On-policy (DAPO) | not run | 0/3 |" in again


def test_the_miniature_page_goes_under_its_run_folder_unless_the_committed_page_is_asked_for(tmp_path, capsys):
    # a README command (`--tables minicode`) used to rewrite the committed docs/miniature.md with "not run" rows
    from demo.miniature import NOTES_HEADING, main as miniature_main
    committed = REPO / "docs" / "miniature.md"
    before = committed.read_bytes()
    out = tmp_path / "mini"
    assert miniature_main(["--seeds", "3", "--write-only", "--out", str(out)]) == 0
    assert committed.read_bytes() == before
    page = (out / "miniature.md").read_text()
    assert "| On-policy (DAPO) | not run | 0/3 |" in page
    # the committed page's reading comes along, its numbers now marked as not matching these (empty) tables
    assert page.count(NOTES_HEADING) == 1 and "numbers below not matching the tables" in page
    assert "--doc docs/miniature.md updates it" in capsys.readouterr().out
