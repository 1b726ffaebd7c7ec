"""tsanalysis support: problems gained / lost / kept per k against a hand computation, distinct answers and answer
entropy per benchmark kind, the crossover k, the relay folder as a model, the likelihood of one model's correct
samples under another (tiny models), the CLI's Parquet/CSV, the figure and the notebook.

The eval results folder is hand-made with the sample file's own row writer (``contracts.samples.make_row``) and
the embedded tasks' graders: 4 addition problems, n = 4, models base / early / final with correct counts

    base  [1, 2, 0, 4]      early [2, 2, 1, 4]      final [4, 0, 0, 4]

so with n = 4, pass@1 = c/4, pass@2 = 1 − C(4−c, 2)/6 (c = 0, 1, 2: 0, 1/2, 5/6; c >= 3: 1), pass@4 = [c > 0].
"""

from __future__ import annotations

import base64
import json
import math
from fractions import Fraction as F
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from contracts.passk import paired_bootstrap
from contracts.samples import append_row, make_row
from scoring.benchmarks import get_benchmark
from scoring.benchmarks.base import Problem, Verdict
from tsanalysis import cli
from tsanalysis.config import SupportConfig
from tsanalysis.core import support as S
from tsanalysis.errors import UsageError
from tsanalysis.support import graded_row, program_key, support_tables

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

ADD = {"p0": (3, 4), "p1": (5, 7), "p2": (2, 3), "p3": (4, 5)}          # a + b; gold a + b
# responses per model and problem (the final line "= N" is the answer; "??" gives none)
RESPONSES = {
    "base": {"p0": ["= 7", "= 8", "= 8", "= 9"], "p1": ["= 12", "= 12", "= 13", "??"], "p2": ["= 6"] * 4,
             "p3": ["= 9"] * 4},
    "early": {"p0": ["= 7", "= 7", "= 8", "= 9"], "p1": ["= 12", "= 12", "= 11", "= 13"],
              "p2": ["= 5", "= 6", "= 4", "= 3"], "p3": ["= 9"] * 4},
    "final": {"p0": ["= 7"] * 4, "p1": ["= 13"] * 4, "p2": ["= 6"] * 4, "p3": ["= 9"] * 4},
}
CORRECT = {"base": [1, 2, 0, 4], "early": [2, 2, 1, 4], "final": [4, 0, 0, 4]}


def _pass(c: int, k: int, n: int = 4) -> F:
    """pass@k of one problem by counting k-subsets (the definition, not the product form)."""
    return 1 - F(math.comb(n - c, k), math.comb(n, k))


def _write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        for r in rows:
            append_row(f, r)


def _settings(model: str, bench: str, model_path: str | None = None) -> dict:
    return {"model": model, "model_path": model_path, "benchmark": bench, "n": 4, "temperature": 1.0}


def _addition_rows(model: str, model_path: str | None = None) -> list[dict]:
    bench = get_benchmark("addition")
    rows = []
    for pid, (a, b) in ADD.items():
        row = {"id": pid, "prompt": f"{a}+{b}=\n", "answer": str(a + b), "a": a, "b": b}
        p = Problem(id=pid, question=row["prompt"], gold=row["answer"], meta={"task": "addition", "row": row})
        rs = RESPONSES[model][pid]
        rows.append(make_row(p, row["prompt"], rs, [bench.grade(r, p) for r in rs], None, ["stop"] * 4,
                             _settings(model, "addition", model_path)))
    return rows


def _countdown_rows(model: str) -> list[dict]:
    bench = get_benchmark("countdown")
    row = {"id": "c0", "prompt": "Make 20 from 8 3 4\n", "answer": "20", "numbers": [8, 3, 4], "target": 20}
    p = Problem(id="c0", question=row["prompt"], gold="20", meta={"task": "countdown", "row": row})
    rs = (["= (8*3)-4", "= (3*8)-4", "= (8-3)*4", "= 20"] if model == "base" else ["= (4*3)+8"] * 4)
    return [make_row(p, row["prompt"], rs, [bench.grade(r, p) for r in rs], None, ["stop"] * 4,
                     _settings(model, "countdown"))]


def _math_rows(model: str) -> list[dict]:
    # verdicts written by hand (this analysis never grades): three equivalent spellings of 1/2 and a wrong 2
    answers = ["\\frac{1}{2}", "0.5", "\\dfrac{1}{2}", "2"] if model == "base" else ["\\frac{1}{2}"] * 4
    vs = [Verdict(a != "2", "pass" if a != "2" else "wrong_answer", a) for a in answers]
    p = Problem(id="m0", question="What is 1/2?", gold="\\frac{1}{2}")
    return [make_row(p, "What is 1/2?\n", [f"so \\boxed{{{a}}}" for a in answers], vs, [v.correct for v in vs],
                     ["stop"] * 4, _settings(model, "math500"))]


def make_eval_dir(root: Path, *, model_paths: dict[str, str] | None = None) -> Path:
    """<root>/<model>/{addition,countdown,math500}.jsonl as eval.run writes them (countdown and math500: base and
    final only) and a relay folder <root>/../relay (relay samples correct [3, 1, 0, 4])."""
    for m in ("base", "early", "final"):
        _write(root / m / "addition.jsonl", _addition_rows(m, (model_paths or {}).get(m)))
        if m != "early":
            _write(root / m / "countdown.jsonl", _countdown_rows(m))
            _write(root / m / "math500.jsonl", _math_rows(m))
    relay = root.parent / "relay"
    relay.mkdir(exist_ok=True)
    recs = [{"problem_id": pid, "n": 4, "relay_correct_list": [i < c for i in range(4)],
             "relay_verdicts": ["pass" if i < c else "wrong_answer" for i in range(4)]}
            for pid, c in zip(ADD, [3, 1, 0, 4])]
    (relay / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (relay / "relay_settings.json").write_text(json.dumps({"benchmark": "addition", "early": "e", "final": "f",
                                                           "cut": 0.5}))
    return root


@pytest.fixture(scope="module")
def eval_dir(tmp_path_factory) -> Path:
    return make_eval_dir(tmp_path_factory.mktemp("support") / "eval")


@pytest.fixture(scope="module")
def tables(eval_dir) -> dict[str, pd.DataFrame]:
    return support_tables(SupportConfig(eval_dir=eval_dir, models=["base", "early", "final"],
                                        relay=eval_dir.parent / "relay"), log=lambda m: None)


def _row(df: pd.DataFrame, **where) -> pd.Series:
    sel = df
    for k, v in where.items():
        sel = sel[sel[k] == v]
    assert len(sel) == 1, where
    return sel.iloc[0]


# ---- gained / lost / kept --------------------------------------------------------------------------------------
@pytest.mark.parametrize("pair", [("base", "final"), ("base", "early"), ("early", "final"), ("final", "relay")])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_gained_lost_kept_equal_the_hand_computation(tables, pair, k):
    ca = CORRECT.get(pair[0])
    cb = CORRECT.get(pair[1], [3, 1, 0, 4])
    a = [_pass(c, k) for c in ca]
    b = [_pass(c, k) for c in cb]
    want = {"gained": sum(y * (1 - x) for x, y in zip(a, b)), "lost": sum(x * (1 - y) for x, y in zip(a, b)),
            "kept": sum(x * y for x, y in zip(a, b)), "neither": sum((1 - x) * (1 - y) for x, y in zip(a, b))}
    r = _row(tables["support"], benchmark="addition", **{"from": pair[0], "to": pair[1]}, k=k)
    assert r["problems"] == 4
    for name, v in want.items():
        assert r[name] == pytest.approx(float(v), abs=1e-12), name
        assert r[f"{name}_low"] <= r[name] + 1e-12 and r[name] <= r[f"{name}_high"] + 1e-12
    assert r["gained"] + r["lost"] + r["kept"] + r["neither"] == pytest.approx(4.0)
    assert r["net"] == pytest.approx(float(sum(b) - sum(a)))
    assert r["pass_from"] == pytest.approx(float(sum(a)) / 4) and r["pass_to"] == pytest.approx(float(sum(b)) / 4)
    kept, lost, gained = float(want["kept"]), float(want["lost"]), float(want["gained"])
    assert r["retention"] == pytest.approx(kept / (kept + lost))
    assert r["discovery"] == pytest.approx(gained / (gained + kept))


def test_the_hand_numbers_of_base_to_final():
    """The same case written out: base [1, 2, 0, 4] -> final [4, 0, 0, 4] correct of 4."""
    a1, b1 = [.25, .5, 0, 1], [1, 0, 0, 1]
    rows = S.support_rows(np.array([a1, [.5, 5 / 6, 0, 1], [1, 1, 0, 1]]).T,
                          np.array([b1, [1, 0, 0, 1], [1, 0, 0, 1]]).T, [1, 2, 4], n_boot=200)
    got = np.array([[r["gained"], r["lost"], r["kept"], r["neither"]] for r in rows])
    np.testing.assert_allclose(got, [[0.75, 0.5, 1.25, 1.5], [0.5, 5 / 6, 1.5, 7 / 6], [0.0, 1.0, 2.0, 1.0]],
                               atol=1e-12)


def test_intervals_are_paired_bootstraps_over_problems():
    rng = np.random.default_rng(3)
    P = 60
    a = rng.uniform(0, 1, (P, 1))
    b = np.clip(a + rng.normal(0.1, 0.2, (P, 1)), 0, 1)
    r = S.support_rows(a, b, [1])[0]
    d = paired_bootstrap(b[:, 0], a[:, 0])   # gained − lost = b − a problem by problem: the same resamples
    assert (r["net"], r["net_low"], r["net_high"]) == pytest.approx((P * d["diff"], P * d["low"], P * d["high"]))
    assert r["net_low"] < r["net"] < r["net_high"]
    # resampling problems for both models together: the paired interval is narrower than an unpaired one would be
    assert r["net_high"] - r["net_low"] < P * 2 * 1.96 * math.sqrt((a.var() + b.var()) / P)


# ---- crossover -------------------------------------------------------------------------------------------------
def test_crossover_of_base_to_final_is_interpolated_in_log2_k(tables):
    # final − base pass@k: k=1 (0.75 − 0.5)/4 = 1/16, k=2 (0.5 − 5/6)/4 = −1/12: sign change at 3/7 of the way
    r = _row(tables["crossover"], benchmark="addition", **{"from": "base", "to": "final"})
    assert r["crossover_k"] == pytest.approx(2 ** (3 / 7))
    assert r["low"] <= r["crossover_k"] <= r["high"] and r["k_max"] == 4 and r["problems"] == 4
    # base -> early: early leads at every k (it solves p2 once, base never): no crossover inside the grid
    r = _row(tables["crossover"], benchmark="addition", **{"from": "base", "to": "early"})
    assert r["crossover_k"] == math.inf
    # final -> relay: equal pass@1 (both 1/2), so the relay does not lead at the first k: crossover_k = ks[0]
    r = _row(tables["crossover"], benchmark="addition", **{"from": "final", "to": "relay"})
    assert r["crossover_k"] == 1.0


def test_crossover_is_the_premise_demos_function():
    """One home: demo.premise imports the crossover and the countdown identity from here (read from its source:
    importing demo loads the trainer)."""
    import ast

    tree = ast.parse((REPO / "demo" / "premise_stats.py").read_text())
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    imported = {a.name for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "tsanalysis.core.support"
                for a in n.names}
    assert {"crossover_k", "crossover_table", "canonical_solution"} <= imported
    assert not defined & imported


# ---- distinct answers and entropy ------------------------------------------------------------------------------
def test_distinct_answers_and_entropy_of_the_addition_problems(tables):
    pr = tables["problems"]
    base = pr[(pr["benchmark"] == "addition") & (pr["model"] == "base")].set_index("problem_id")
    assert base["distinct_answers"].tolist() == [3, 2, 1, 1]          # {7, 8, 9}, {12, 13} + no answer, {6}, {9}
    assert base["distinct_correct"].tolist() == [1, 1, 0, 1]
    assert base["no_answer"].tolist() == [0, 1, 0, 0]
    h = base["answer_entropy"].to_numpy()
    assert h == pytest.approx([-(2 * .25 * math.log(.25) + .5 * math.log(.5)),
                               -(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3)), 0.0, 0.0])
    div = tables["diversity"]
    r = _row(div, benchmark="addition", model="base", metric="distinct_answers")
    assert r["mean"] == pytest.approx(7 / 4) and r["problems"] == 4
    r = _row(tables["diversity_pairs"], benchmark="addition", metric="distinct_answers",
             **{"from": "base", "to": "final"})
    assert r["diff"] == pytest.approx((4 - 7) / 4) and r["problems"] == 4   # final: one answer everywhere
    assert "relay" not in set(pr["model"])   # a relay folder stores no response texts


def test_countdown_counts_canonical_solutions(tables):
    pr = tables["problems"]
    r = _row(pr, benchmark="countdown", model="base")
    # (8*3)-4 and (3*8)-4 are one solution, (8-3)*4 another; "= 20" parses as an answer but is wrong
    assert (r["correct"], r["distinct_correct"], r["distinct_answers"]) == (3, 2, 3)
    assert r["answer_entropy"] == pytest.approx(-(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25)))
    assert _row(pr, benchmark="countdown", model="final")["distinct_correct"] == 1


def test_math_answers_are_clustered_by_the_graders_equivalence(tables):
    r = _row(tables["problems"], benchmark="math500", model="base")
    # \frac{1}{2}, 0.5 and \dfrac{1}{2} are one answer under math-verify; 2 is another
    assert (r["distinct_answers"], r["distinct_correct"]) == (2, 1)
    assert r["answer_entropy"] == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))


def test_answer_entropy_matches_scipy_and_cluster_labels_are_greedy():
    scipy_stats = pytest.importorskip("scipy.stats")
    labels = [0, 0, 1, 2, 2, 2, None, 3]
    counts = [2, 1, 3, 1]
    assert S.answer_entropy(labels) == pytest.approx(scipy_stats.entropy(counts))
    assert math.isnan(S.answer_entropy([None, None]))
    assert S.answer_entropy([5, 5, 5]) == 0.0
    same_parity = lambda rep, x: rep % 2 == x % 2   # noqa: E731
    assert S.cluster_labels([3, 5, 4, None, 3, 6], same_parity) == [0, 0, 1, None, 0, 1]
    assert S.cluster_labels(["a", "b", "a"]) == [0, 1, 0]
    assert S.distinct([0, 0, 1, None], [True, False, True, True]) == 2


def test_programs_are_one_answer_up_to_comments_and_layout():
    a = program_key("```python\ndef f(a,b):\n    return a+b  # add\n```")
    b = program_key("text\n```python\ndef f(a, b):\n\n    return a + b\n```")
    c = program_key("```python\ndef f(a, b):\n    return b + a\n```")
    broken = program_key("```python\ndef f(a, b)\n    return   a\n```")
    assert a == b != c
    assert broken == "def f(a, b) return a"   # does not parse: its whitespace-collapsed text
    assert program_key("```python\n\n```") is None


def test_ungraded_samples_are_left_out_aligned():
    row = {"problem_id": "x", "responses": ["r0", "r1", "r2"], "answers": ["1", None, "3"],
           "verdicts": ["pass", "grader_error", "wrong_answer"], "correct": [True, False, False]}
    g = graded_row(row)
    assert g["responses"] == ["r0", "r2"] and g["answers"] == ["1", "3"] and g["correct"] == [True, False]
    assert graded_row(dict(row, verdicts=["timeout"] * 3)) is None


# ---- input errors ----------------------------------------------------------------------------------------------
def test_bad_input_is_refused_before_anything_runs(eval_dir, tmp_path):
    with pytest.raises(UsageError, match="no results for nope"):
        support_tables(SupportConfig(eval_dir=eval_dir, models=["base", "nope"]))
    with pytest.raises(UsageError, match="two or more models"):
        support_tables(SupportConfig(eval_dir=eval_dir, models=["base"]))
    with pytest.raises(UsageError, match="no such folder"):
        support_tables(SupportConfig(eval_dir=tmp_path / "missing"))
    with pytest.raises(UsageError, match="not a relay folder"):
        support_tables(SupportConfig(eval_dir=eval_dir, models=["base", "final"], relay=tmp_path))
    with pytest.raises(UsageError, match="--paths names other"):
        support_tables(SupportConfig(eval_dir=eval_dir, models=["base", "final"], paths={"other": "x"}))


# ---- the command -----------------------------------------------------------------------------------------------
def test_cli_writes_parquet_and_csv_and_prints_percentages(eval_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["support", "--eval-dir", str(eval_dir), "--models", "base,early,final", "--relay",
                     str(eval_dir.parent / "relay"), "--benchmarks", "addition,countdown", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "addition: base -> final, 4 problems" in printed and "base %" in printed
    assert "   43.8 " in printed          # base's mean pass@1 on addition, (1/4 + 2/4 + 0 + 1) / 4, in %
    assert "addition: final's pass@k falls to base's at k = 1.35" in printed   # 2 ** (3/7)
    for name in ("passk", "support", "crossover", "problems", "diversity", "diversity_pairs"):
        pq, csv = pd.read_parquet(out / f"{name}.parquet"), pd.read_csv(out / f"{name}.csv")
        assert len(pq) == len(csv) and list(pq.columns) == list(csv.columns)
    sup = pd.read_parquet(out / "support.parquet")
    assert set(sup["benchmark"]) == {"addition", "countdown"} and "gained" in sup and "lost" in sup
    r = _row(sup, benchmark="addition", k=4, **{"from": "base", "to": "final"})
    assert (r["gained"], r["lost"], r["kept"]) == (0.0, 1.0, 2.0)
    s = json.loads((out / "settings.json").read_text())
    assert s["command"] == "support" and s["args"]["models"] == ["base", "early", "final"]
    # bad input: one error line, exit 2, nothing written
    assert cli.main(["support", "--eval-dir", str(eval_dir), "--models", "base,nope", "--out",
                     str(tmp_path / "bad")]) == 2
    assert "error: --models: no results for nope" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_figure_renders_from_the_written_tables(eval_dir, tmp_path):
    from figures.support import load_support, plot_support

    out = tmp_path / "tree" / "support"
    assert cli.main(["support", "--eval-dir", str(eval_dir), "--models", "base,early,final", "--out", str(out)]) == 0
    tables = load_support(tmp_path / "tree")
    fig = plot_support(tables, benchmark="addition")
    assert len(fig.axes) == 3
    path = tmp_path / "support.png"
    fig.savefig(path, dpi=60)
    assert path.read_bytes()[:8] == PNG_MAGIC


# ---- likelihood under tiny models ------------------------------------------------------------------------------
@pytest.mark.slow
def test_likelihood_of_correct_samples_under_each_loadable_model(tmp_path):
    import torch

    from inference.loading import load_policy
    from inference.tiny import save_tiny

    paths = {"base": str(save_tiny(tmp_path / "m-base", "1m", seed=0)),
             "final": str(save_tiny(tmp_path / "m-final", "1m", seed=1)), "early": str(tmp_path / "not-a-model")}
    root = make_eval_dir(tmp_path / "eval", model_paths=paths)
    notes = []
    t = support_tables(SupportConfig(eval_dir=root, models=["base", "early", "final"], benchmarks=["addition"],
                                     likelihood=True, likelihood_samples=2), log=notes.append)
    lk = t["likelihood"]
    assert any("early skipped" in n for n in notes)
    assert set(lk["scored_by"]) == {"base", "final"} and set(lk["samples_of"]) == {"base", "early", "final"}

    def direct(model_dir, prompt, response):   # one sequence at a time, no padding: the batched forward's reference
        model, tok = load_policy(model_dir)
        p = tok(prompt, add_special_tokens=False)["input_ids"]
        r = tok(response, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([p + r])).logits[0]
        lp = torch.log_softmax(logits[len(p) - 1:len(p) + len(r) - 1].float(), -1)
        return float(lp.gather(1, torch.tensor(r)[:, None]).mean())

    for src in ("base", "final"):
        for scorer in ("base", "final"):
            per = []
            for pid, (a, b) in ADD.items():
                ok = [x for x in RESPONSES[src][pid] if x == f"= {a + b}"][:2]
                if ok:
                    per.append(np.mean([direct(paths[scorer], f"{a}+{b}=\n", x) for x in ok]))
            r = _row(lk, benchmark="addition", samples_of=src, scored_by=scorer)
            assert r["problems"] == len(per) and r["logp_mean"] == pytest.approx(np.mean(per), abs=1e-5)
        other = "final" if src == "base" else "base"
        r_own = _row(lk, benchmark="addition", samples_of=src, scored_by=src)
        r_other = _row(lk, benchmark="addition", samples_of=src, scored_by=other)
        assert math.isnan(r_own["vs_self"])
        assert r_other["vs_self"] == pytest.approx(r_other["logp_mean"] - r_own["logp_mean"], abs=1e-9)
    with pytest.raises(UsageError, match="--paths early="):
        support_tables(SupportConfig(eval_dir=root, models=["base", "early"], likelihood=True,
                                     paths={"early": str(tmp_path / "nothing")}), log=lambda m: None)


# ---- the notebook ----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_notebook_draws_the_figure_from_the_tables(eval_dir, tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    out = tmp_path / "support"
    assert cli.main(["support", "--eval-dir", str(eval_dir), "--models", "base,early,final", "--relay",
                     str(eval_dir.parent / "relay"), "--out", str(out)]) == 0
    nb = nbformat.read(REPO / "notebooks" / "support.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code)
    assert "parameters" in code[0].metadata.get("tags", []) and "THINKING_SEEDS_SUPPORT" in code[0].source
    body = "\n".join(c.source for c in code[1:])
    assert "load_support" in body and "plot_" in body and "for " not in body and "def " not in body
    monkeypatch.setenv("THINKING_SEEDS_SUPPORT", str(out))
    monkeypatch.setenv("THINKING_SEEDS_SUPPORT_BENCHMARK", "addition")
    monkeypatch.setenv("PYTHONPATH", str(REPO))   # the kernel imports this checkout, whatever the venv installed
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(REPO / "notebooks")}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if o.output_type in ("display_data", "execute_result") and "image/png" in o.data]
    assert len(images) == 1 and base64.b64decode(images[0].data["image/png"])[:8] == PNG_MAGIC
    assert str(out) in "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
