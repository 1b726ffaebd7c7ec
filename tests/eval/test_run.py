"""The eval runner, sample files, metrics and leaderboard: pass@k against brute force, hand-computed leaderboard
numbers, resume after a crash, clear errors for malformed inputs, the lm-eval conversion, the task benchmarks,
and a tiny-model end-to-end run."""

from __future__ import annotations

import csv
import importlib.util
import itertools
import json
from math import comb
from pathlib import Path

import pytest

from contracts.config import ConfigError
from eval import run
from scoring.benchmarks import get_benchmark
from eval.config import EvalConfig
from eval.inputs import model_name
from eval.report import format_report
from inference.tiny import save_tiny
from eval.leaderboard import build_leaderboard, lm_eval_entries, render_markdown, write_leaderboard
from contracts.passk import k_grid
from contracts.samples import read_samples, repair
from eval.metrics import compare, summarize

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
MATH500 = DATA / "math" / "math500" / "test.jsonl"
needs_data = pytest.mark.skipif(not MATH500.is_file(), reason=f"benchmark data not found at {DATA}")


# ---- metrics ---------------------------------------------------------------------------------------------------

def test_pass_at_k_matches_subset_enumeration():
    for n in range(1, 7):
        for c in range(n + 1):
            samples = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(range(n), k))
                brute = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
                s = summarize([n], [c], ks=[k])
                assert s["pass"][k][0] == pytest.approx(brute, abs=1e-12), (n, c, k)
                assert brute == pytest.approx(1 - comb(n - c, k) / comb(n, k))


def test_summarize_hand_numbers_and_refusal():
    # three problems, n=4, correct 0, 2, 4
    s = summarize([4, 4, 4], [0, 2, 4])
    assert s["avg"] == pytest.approx(0.5)
    assert sorted(s["pass"]) == [1, 2, 4]
    assert s["pass"][1][0] == pytest.approx(0.5)
    assert s["pass"][2][0] == pytest.approx((0 + (1 - 1 / 6) + 1) / 3)   # C(2,2)/C(4,2) = 1/6
    assert s["pass"][4][0] == pytest.approx(2 / 3)
    lo, hi = s["avg_ci"]
    assert 0 <= lo < 0.5 < hi <= 1
    assert summarize([4, 4, 4], [0, 2, 4])["avg_ci"] == (lo, hi)       # fixed seed: reproducible
    with pytest.raises(ValueError, match="pass@5 needs at least 5 samples"):
        summarize([4, 4], [1, 2], ks=[5])
    assert k_grid(32) == [1, 2, 4, 8, 16, 32] and k_grid(6) == [1, 2, 4, 6]


def test_paired_comparison():
    a = [{"problem_id": str(i), "correct": [True, bool(i % 2)]} for i in range(10)]
    b = [{"problem_id": str(i), "correct": [False, bool(i % 2)]} for i in range(10)]
    r = compare(a, b)
    assert r["problems"] == 10 and r["diff"] == pytest.approx(0.5) and r["low"] == r["high"] == pytest.approx(0.5)
    same = compare(a, a)
    assert same["diff"] == 0 and same["p_value"] == 1.0
    with pytest.raises(ValueError, match="share no problems"):
        compare(a, [{"problem_id": "x", "correct": [True]}])


# ---- leaderboard from hand-built sample files ----------------------------------------------------------------

def _line(pid, correct, bench="math500", model="m"):
    return {"problem_id": pid, "prompt": "q", "gold": "1", "responses": ["r"] * len(correct),
            "answers": ["1"] * len(correct), "verdicts": ["pass" if c else "wrong_answer" for c in correct],
            "correct": correct, "finish_reasons": ["stop"] * len(correct),
            "settings": {"model": model, "benchmark": bench, "benchmark_version": f"{bench}-1"}}


def _write(path: Path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_leaderboard_numbers(tmp_path):
    _write(tmp_path / "a" / "math500.jsonl", [_line("p1", [False] * 4), _line("p2", [True, False, True, False]),
                                              _line("p3", [True] * 4)])
    _write(tmp_path / "a" / "aime24.jsonl", [_line("q1", [True, False], "aime24"),
                                             _line("q2", [False, False], "aime24")])
    _write(tmp_path / "b" / "math500.jsonl", [_line("p1", [True] * 4), _line("p2", [True] * 4),
                                              _line("p3", [True] * 4)])
    board = build_leaderboard(tmp_path)
    e = {(x["model"], x["benchmark"]): x for x in board["entries"]}
    a = e[("a", "math500")]
    assert (a["problems"], a["n"], a["avg"]) == (3, 4, pytest.approx(0.5))
    assert a["pass"] == {1: pytest.approx(0.5), 2: pytest.approx(11 / 18), 4: pytest.approx(2 / 3)}
    assert e[("a", "aime24")]["avg"] == pytest.approx(0.25)
    assert e[("a", "aime24")]["pass"] == {1: pytest.approx(0.25), 2: pytest.approx(0.5)}
    # the average is over the benchmarks every model has (math500; b has no aime24), the same list for both
    assert board["average"]["benchmarks"] == ["math500"] and board["average"]["chosen"] == "shared"
    assert board["average"]["models"]["a"]["avg"] == pytest.approx(0.5)
    assert board["average"]["models"]["b"]["avg"] == pytest.approx(1.0)
    assert board["benchmarks"] == ["aime24", "math500"]          # registry order
    p, pa = board["paired"]
    assert (p["model"], p["baseline"], p["benchmark"], p["problems"]) == ("b", "a", "math500", 3)
    assert p["diff"] == pytest.approx(0.5) and (pa["benchmark"], pa["diff"]) == ("average", pytest.approx(0.5))
    md = write_leaderboard(board, tmp_path)
    assert "| a | 25.0 [0.0, 50.0] (P=2, n=2) | 50.0 [" in md and "(P=3, n=4) | 50.0 [0.0, 100.0] |" in md
    assert "| a | math500 | 3 | 4 | 50.0 | 61.1 | 66.7 |" in md and "| a | aime24 | 2 | 2 | 25.0 | 50.0 |  |" in md
    assert "| b |  | 100.0 [100.0, 100.0] (P=3, n=4) | 100.0 [100.0, 100.0] |" in md
    rows = list(csv.DictReader(open(tmp_path / "leaderboard.csv")))
    r = next(x for x in rows if x["model"] == "a" and x["benchmark"] == "math500")
    assert float(r["avg"]) == pytest.approx(0.5) and float(r["pass@2"]) == pytest.approx(11 / 18)
    assert r["problems"] == "3" and r["pass@4"] != ""
    assert (tmp_path / "leaderboard.md").read_text() == md
    # the CLI rebuilds the same files
    from eval.leaderboard import main as lb_main
    assert lb_main([str(tmp_path)]) == 0
    assert (tmp_path / "leaderboard.md").read_text() == md


def test_lm_eval_results_become_leaderboard_rows(tmp_path):
    results = {  # the shape of lm_eval.simple_evaluate's output (log_samples=False)
        "results": {
            "gsm8k": {"alias": "gsm8k", "exact_match,strict-match": 0.25, "exact_match_stderr,strict-match": 0.05,
                      "exact_match,flexible-extract": 0.3, "exact_match_stderr,flexible-extract": 0.05},
            "arc_easy": {"alias": "arc_easy", "acc,none": 0.6, "acc_stderr,none": 0.01, "acc_norm,none": 0.55,
                         "acc_norm_stderr,none": 0.02},
            "broken": {"alias": "broken", "acc,none": 0.1, "acc_stderr,none": "N/A"},
        },
        "n-samples": {"gsm8k": {"original": 1319, "effective": 100}, "arc_easy": {"original": 2376,
                                                                                   "effective": 2376}},
    }
    rows = {r["benchmark"]: r for r in lm_eval_entries("m", results)}
    g = rows["lm:gsm8k"]
    assert (g["version"], g["avg"], g["problems"]) == ("exact_match,strict-match", 0.25, 100)
    assert (g["ci_low"], g["ci_high"]) == (pytest.approx(0.25 - 1.96 * 0.05), pytest.approx(0.25 + 1.96 * 0.05))
    assert (rows["lm:arc_easy"]["version"], rows["lm:arc_easy"]["avg"]) == ("acc_norm,none", 0.55)
    assert rows["lm:broken"]["ci_low"] is None and rows["lm:broken"]["problems"] is None
    # written beside sample files, it lands as columns of the same leaderboard (not in the average)
    _write(tmp_path / "m" / "math500.jsonl", [_line("p1", [True, False])])
    (tmp_path / "m" / "lm_eval.json").write_text(json.dumps(results))
    board = build_leaderboard(tmp_path)
    assert board["benchmarks"] == ["math500", "lm:arc_easy", "lm:broken", "lm:gsm8k"]
    assert board["average"]["benchmarks"] == ["math500"] and board["average"]["models"]["m"]["avg"] == 0.5
    assert "25.0 [15.2, 34.8] (P=100) |" in render_markdown(board)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None or importlib.util.find_spec("accelerate") is None,
                    reason="lm-eval not installed (pip install 'thinking-seeds[lmeval]')")
def test_lm_eval_bridge_end_to_end(tmp_path, tiny_model, monkeypatch):
    """A local YAML task on a local JSONL file, offline, through lm_eval.simple_evaluate (hf backend)."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "data.jsonl").write_text("".join(json.dumps({"prompt": f"{i}+1\n", "answer": str(i + 1)}) + "\n"
                                              for i in range(3)))
    (tasks / "tiny_add.yaml").write_text(
        "task: tiny_add\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {tasks / 'data.jsonl'}\ntest_split: test\noutput_type: generate_until\n"
        "doc_to_text: \"{{prompt}}\"\ndoc_to_target: \"{{answer}}\"\n"
        "generation_kwargs:\n  until: [\"\\n\\n\"]\n  max_gen_toks: 4\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n"
        "metadata:\n  version: 1.0\n")
    from eval.lm_eval_bridge import run_lm_eval
    out = tmp_path / "out" / "tiny"
    run_lm_eval(str(tiny_model), ["tiny_add"], out, include_path=str(tasks), engine="hf", batch_size=4)
    [row] = lm_eval_entries("tiny", json.loads((out / "lm_eval.json").read_text()))
    assert (row["benchmark"], row["version"], row["problems"]) == ("lm:tiny_add", "exact_match,none", 3)
    assert 0.0 <= row["avg"] <= 1.0


# ---- the --samples grading path: resume, errors, disagreements ---------------------------------------------------

# Extra responses (the 4th sample) of the samples file, by MATH-500 row: where the primary grader (math-verify) and
# the Qwen-style cross-check read the same response differently, in both directions.
EXTRA = {
    0: r"<think>\boxed{1}</think> so \boxed{200}",                       # both read 200: wrong, no disagreement
    3: r"<think>first guess \boxed{5}</think> So the answer is $9$.",    # gold 9: math-verify reads after </think>
                                                                        # (9, right), Qwen the last box (5, wrong)
    5: r"\boxed{0.42}",                                                 # gold 42: Qwen also accepts gold/100
    8: r"about \boxed{10.8167}",                                        # gold 3\sqrt{13} = 10.81665: Qwen's 1e-4
}                                                                       # tolerance accepts it, math-verify does not
# the rows of math500.disagreements.jsonl they give (problem id, sample, gold, math-verify's answer, verdicts)
DISAGREEMENTS = [("test/number_theory/572.json", 3, "9", "9", True, False),
                 ("test/prealgebra/1622.json", 3, "42", "0.42", False, True),
                 ("test/algebra/2036.json", 3, "3\\sqrt{13}", "10.8167", False, True)]
SAMPLES = 10 * 3 + len(EXTRA)


@pytest.fixture(scope="module")
def samples_file(tmp_path_factory):
    if not MATH500.is_file():
        pytest.skip(f"benchmark data not found at {DATA}")
    rows = [json.loads(line) for line in MATH500.read_text().splitlines()[:10]]
    path = tmp_path_factory.mktemp("samples") / "completions.jsonl"
    with open(path, "w") as f:
        for i, r in enumerate(rows):
            responses = [r["solution"], r"The answer is \boxed{0}.", "I am not sure."] + ([EXTRA[i]] if i in EXTRA else [])
            f.write(json.dumps({"problem_id": r["unique_id"], "responses": responses}) + "\n")
    return path


def _grade(samples, out, *extra):
    return run.main(["--model", "ref", "--benchmarks", "math500", "--problems", str(MATH500), "--samples",
                     str(samples), "--out", str(out), "--no-progress", "--workers", "2", *extra])


@pytest.mark.slow
@needs_data
def test_samples_resume_after_crash_equals_uninterrupted(samples_file, tmp_path):
    full = tmp_path / "full"
    assert _grade(samples_file, full) == 0
    ref = (full / "ref" / "math500.jsonl").read_bytes()
    lines = ref.splitlines(keepends=True)
    assert len(lines) == 10
    row0 = json.loads(lines[0])
    assert row0["correct"][:3] == [True, False, False] and row0["verdicts"][2] == "no_answer"
    assert row0["answers"][:2] == [r"\left( 3, \frac{\pi}{2} \right)", "0"]
    assert row0["settings"]["samples_file"] == "completions.jsonl" and "correct_qwen" in row0
    # crashes: mid-line, between an object and its newline, and after a complete line
    for cut in (lines[:4] + [lines[4][: len(lines[4]) // 2]], lines[:6] + [lines[6].rstrip(b"\n")], lines[:3]):
        part = tmp_path / "part" / "ref" / "math500.jsonl"
        part.parent.mkdir(parents=True, exist_ok=True)
        part.write_bytes(b"".join(cut))
        assert _grade(samples_file, tmp_path / "part") == 0
        assert part.read_bytes() == ref
    # re-running a complete file changes nothing
    assert _grade(samples_file, full) == 0
    assert (full / "ref" / "math500.jsonl").read_bytes() == ref


@needs_data
def test_disagreements_file_and_rate(samples_file, tmp_path, capsys):
    assert _grade(samples_file, tmp_path) == 0
    rows = read_samples(tmp_path / "ref" / "math500.jsonl")
    assert sum(len(r["correct"]) for r in rows) == SAMPLES == 34
    by_id = {r["problem_id"]: r for r in rows}
    for pid, sample, _, _, mv, qw in DISAGREEMENTS:
        assert (by_id[pid]["correct"][sample], by_id[pid]["correct_qwen"][sample]) == (mv, qw)
    # every other sample: the two graders agree (the solutions right, "0", no answer and the 200 wrong)
    agree = [(r["problem_id"], i) for r in rows for i, (a, b) in enumerate(zip(r["correct"], r["correct_qwen"]))
             if a == b]
    assert len(agree) == SAMPLES - len(DISAGREEMENTS)
    dis = read_samples(tmp_path / "ref" / "math500.disagreements.jsonl")
    keys = ("problem_id", "sample", "gold", "answer", "math_verify", "qwen")
    assert [tuple(d[k] for k in keys) for d in dis] == DISAGREEMENTS
    assert [d["response"] for d in dis] == [EXTRA[3], EXTRA[5], EXTRA[8]]
    out = capsys.readouterr().out
    assert "math500: avg@n 32.5% [" in out and "over 10 problems; grading timeouts this run: 0" in out
    assert "math-verify vs Qwen-style disagreement 8.8% (3 samples)" in out          # 3 / 34 = 8.82 %
    # a rerun rewrites the file from the sample file: the same rows, not appended twice
    assert _grade(samples_file, tmp_path) == 0
    assert read_samples(tmp_path / "ref" / "math500.disagreements.jsonl") == dis


@needs_data
def test_run_eval_returns_the_reports_main_prints(samples_file, tmp_path, capsys):
    lines = []
    result = run.run_eval(EvalConfig(models=["ref"], benchmarks=["math500"], problems=str(MATH500),
                                     samples=str(samples_file), out=str(tmp_path), workers=2, progress=False),
                          log=lines.append)
    [r] = result["reports"]
    assert (r["model"], r["benchmark"], r["kind"], r["path"]) == ("ref", "math500", "math",
                                                                    tmp_path / "ref" / "math500.jsonl")
    # per problem c/n: 1/4 (rows 0, 5, 8: solution only), 2/4 (row 3), 1/3 (the other six)
    assert (r["problems"], r["n_min"], r["n_max"]) == (10, 3, 4)
    assert r["avg"] == pytest.approx((3 * 0.25 + 0.5 + 6 / 3) / 10)
    assert r["avg_ci"][0] <= r["avg"] <= r["avg_ci"][1]
    assert (r["grading_timeouts"], r["disagreements"]) == (0, 3)
    assert r["disagreement_rate"] == pytest.approx(3 / 34)
    assert lines == [format_report(r)]
    assert not capsys.readouterr().out                                # the library prints nothing itself
    [e] = [e for e in result["leaderboard"]["entries"] if e["benchmark"] == "math500"]
    assert e["avg"] == pytest.approx(r["avg"]) and (tmp_path / "leaderboard.md").read_text() == result["leaderboard_md"]
    # the command prints the same report line, then the same leaderboard
    assert _grade(samples_file, tmp_path) == 0
    assert capsys.readouterr().out == (format_report(r) + "\n" + result["leaderboard_md"] + "\n"
                                       + f"wrote: {tmp_path / 'ref' / 'math500.jsonl'}; {tmp_path / 'leaderboard.md'} "
                                         f"(.csv, .json)\n")
    with pytest.raises(ConfigError, match="exactly one benchmark"):
        run.run_eval(EvalConfig(models=["ref"], benchmarks=["math500", "aime24"], samples=str(samples_file),
                                out=str(tmp_path)))


@needs_data
def test_disagreement_rows_are_written(tmp_path):
    problems = tmp_path / "p.jsonl"
    problems.write_text(json.dumps({"problem": "q", "solution": "", "answer": "200", "subject": "x", "level": 1,
                                    "unique_id": "u1"}) + "\n")
    samples = tmp_path / "s.jsonl"
    samples.write_text(json.dumps({"problem_id": "u1", "responses": [r"\boxed{2}", r"\boxed{200}"]}) + "\n")
    assert run.main(["--model", "m", "--benchmarks", "math500", "--problems", str(problems), "--samples",
                     str(samples), "--out", str(tmp_path / "out"), "--no-progress", "--workers", "1"]) == 0
    [d] = read_samples(tmp_path / "out" / "m" / "math500.disagreements.jsonl")
    assert (d["problem_id"], d["sample"], d["answer"], d["math_verify"], d["qwen"]) == ("u1", 0, "2", False, True)


def test_a_lone_surrogate_in_a_samples_file_is_refused_with_its_line_on_every_run(tmp_path, capsys):
    # "\ud800" in the JSON (half of a UTF-16 pair, what a tool that cuts text in UTF-16 units writes) is no
    # character: the result files (UTF-8) cannot hold it. The run graded, then crashed at its first write
    # (UnicodeEncodeError, exit 1), and again on every rerun; now it is an input error, before anything is written.
    problems = tmp_path / "p.jsonl"
    problems.write_text("".join(json.dumps({"problem": "q", "solution": "", "answer": "200", "subject": "x",
                                            "level": 1, "unique_id": u}) + "\n" for u in ("u1", "u2")))
    samples = tmp_path / "s.jsonl"
    samples.write_text(json.dumps({"problem_id": "u1", "responses": [r"\boxed{200}"]}) + "\n" +
                       json.dumps({"problem_id": "u2", "responses": [r"\boxed{200}", "odd \ud800 \\boxed{200}"]}) +
                       "\n")
    assert "\\ud800" in samples.read_text()   # (json.dumps escapes it: the file itself is plain ASCII)
    args = ["--model", "m", "--benchmarks", "math500", "--problems", str(problems), "--samples", str(samples),
            "--out", str(tmp_path / "out"), "--no-progress", "--workers", "1"]
    for _ in range(2):   # the same on the rerun
        with pytest.raises(SystemExit) as exc:
            run.main(args)
        assert exc.value.code == 2
        assert capsys.readouterr().err.splitlines() == [
            f"error: {samples}:2: response 2 holds a lone surrogate '\\ud800' at character 5 (half of a UTF-16 "
            f"pair, not a character: the results are written as UTF-8, which cannot hold it); replace it, e.g. with "
            f"'\\ufffd', the replacement character, and run again"]
    assert not (tmp_path / "out" / "m").exists()


@needs_data
def test_bad_inputs_name_file_and_line(samples_file, tmp_path):
    bad = tmp_path / "bad.jsonl"
    good = samples_file.read_text().splitlines()
    bad.write_text("\n".join(good[:2] + ['{"problem_id": "x", "responses": [']) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:3: malformed JSON"):
        _grade(bad, tmp_path / "o1")
    bad.write_text("\n".join(good[:1] + ['{"problem_id": "test/nope.json", "responses": ["a"]}']) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: unknown problem_id 'test/nope.json'"):
        _grade(bad, tmp_path / "o2")
    bad.write_text("\n".join(good[:1] + good[:1]) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: problem_id .* appears twice"):
        _grade(bad, tmp_path / "o3")
    probs = tmp_path / "probs.jsonl"
    probs.write_text(MATH500.read_text().splitlines()[0] + "\n{not json}\n")
    with pytest.raises(ValueError, match=r"probs\.jsonl:2: malformed JSON"):
        run.main(["--model", "ref", "--benchmarks", "math500", "--problems", str(probs), "--samples",
                  str(samples_file), "--out", str(tmp_path / "o4")])
    # a corrupt line that is not the last one is not a crash artefact: refuse
    out = tmp_path / "o5" / "ref" / "math500.jsonl"
    _write(out, [_line("a", [True]), _line("b", [True])])
    out.write_text("{garbage\n" + out.read_text())
    with pytest.raises(ValueError, match=r"math500\.jsonl:1: malformed sample line"):
        _grade(samples_file, tmp_path / "o5")


@needs_data
def test_settings_mismatch_is_refused_before_work(samples_file, tmp_path):
    assert _grade(samples_file, tmp_path, "--limit", "2") == 0
    other = tmp_path / "completions2.jsonl"
    other.write_text(samples_file.read_text())
    with pytest.raises(ValueError, match="other settings .*samples_file.*new --out directory, or delete the file"):
        _grade(other, tmp_path)


def test_cli_argument_errors(tmp_path):
    with pytest.raises(SystemExit, match="unknown benchmark 'gsm9k'"):
        run.main(["--model", "m", "--benchmarks", "gsm9k", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="exactly one benchmark"):
        run.main(["--model", "m", "--benchmarks", "aime24,aime25", "--samples", "x", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="nothing to do"):
        run.main(["--model", "m", "--out", str(tmp_path)])
    assert model_name("Qwen/Qwen2.5-Math-7B") == "Qwen__Qwen2.5-Math-7B"
    step = tmp_path / "runs" / "exp1" / "checkpoints" / "step_000100"
    step.mkdir(parents=True)
    assert model_name(str(step)) == "exp1-step_000100"


def test_repair_cuts_only_a_partial_last_line(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"a": 1}\n{"a": 2}\n{"a": ')
    assert repair(p) == [{"a": 1}, {"a": 2}]
    assert p.read_text() == '{"a": 1}\n{"a": 2}\n'
    assert repair(tmp_path / "missing.jsonl") == []


# ---- task benchmarks and a tiny model end to end ---------------------------------------------------------------

def test_task_benchmarks(tmp_path):
    add = get_benchmark("addition")
    ps = add.load()
    assert len(ps) == 200 and ps[0].id == "addition-s10000-000000" and add.load()[7] == ps[7]
    assert (add.kind, add.default_template, add.generation) == (
        "task", "raw", {"n": 8, "temperature": 1.0, "top_p": 1.0, "max_tokens": 64})
    row = ps[0].meta["row"]
    v = add.grade(row["solution"], ps[0])
    assert (v.correct, v.verdict, v.answer) == (True, "pass", row["answer"])
    assert add.grade("= 1", ps[0]).verdict == "wrong_answer" and add.grade("??", ps[0]).verdict == "no_answer"
    cd = get_benchmark("countdown")
    c0 = cd.load()[0]
    assert cd.grade(c0.meta["row"]["solution"], c0).correct and not cd.grade("= 1+1", c0).correct
    f = tmp_path / "add.jsonl"
    # a blank line between the rows: the error names the file's line (3), not the row's index (2)
    f.write_text(json.dumps({"id": "a1", "prompt": "1+2\n", "answer": "3"}) + "\n\n" + json.dumps({"id": "a2"}) + "\n")
    with pytest.raises(ValueError, match=r"add\.jsonl:3: .*missing \['prompt', 'answer'\]"):
        add.load(f)


@pytest.mark.parametrize("name,good", [("math500", {"unique_id": "x", "problem": "1+1?", "answer": "2"}),
                                       ("aime24", {"id": 1, "problem": "1+1?", "answer": "2"}),
                                       ("minerva", {"idx": 0, "problem": "1+1?", "solution": "\\boxed{2}"}),
                                       ("olympiadbench", {"id": 1, "question": "1+1?", "final_answer": ["2"]})])
def test_math_benchmark_field_errors_name_the_file_line(tmp_path, name, good):
    bad = {k: v for k, v in good.items() if k not in ("answer", "solution", "final_answer")}
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join([json.dumps(good), "", "", json.dumps(bad)]) + "\n")
    with pytest.raises(ValueError, match=r"p\.jsonl:4: row has none of the fields"):
        get_benchmark(name).load(f)
    f.write_text(json.dumps(good) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"p\.jsonl:2: malformed JSON line"):
        get_benchmark(name).load(f)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny") / "tiny-1m", "1m")


@pytest.mark.slow
def test_tiny_model_end_to_end(tiny_model, tmp_path):
    args = ["--model", str(tiny_model), "--benchmarks", "addition", "--n", "2", "--limit", "4", "--max-tokens", "16",
            "--out", str(tmp_path), "--no-progress", "--engine", "hf"]
    assert run.main(args) == 0
    path = tmp_path / "tiny-1m" / "addition.jsonl"
    rows = read_samples(path)
    assert [r["problem_id"] for r in rows] == [f"addition-s10000-{i:06d}" for i in range(4)]
    for r in rows:
        assert len(r["responses"]) == len(r["correct"]) == len(r["verdicts"]) == len(r["finish_reasons"]) == 2
        assert set(r["finish_reasons"]) <= {"stop", "length"}
        assert r["prompt"].endswith("\n") and "+" in r["prompt"]
        assert all(len(x) <= 16 for x in r["responses"])   # char-level tokenizer: at most 16 characters
        s = r["settings"]
        assert (s["n"], s["max_tokens"], s["template"], s["temperature"]) == (2, 16, "raw", 1.0)
    before = path.read_bytes()
    assert run.main(args) == 0                        # resumes: everything is done, nothing is appended
    assert path.read_bytes() == before
    assert "tiny-1m" in (tmp_path / "leaderboard.md").read_text()
    # the library call returns the scores of the file (a task benchmark: no math-only fields)
    result = run.run_eval(EvalConfig(models=[str(tiny_model)], benchmarks=["addition"], n=2, limit=4, max_tokens=16,
                                     out=str(tmp_path), engine="hf", progress=False), log=lambda m: None)
    [r] = result["reports"]
    correct = [c for row in rows for c in row["correct"]]
    assert (r["model"], r["benchmark"], r["problems"], r["n_min"], r["n_max"]) == ("tiny-1m", "addition", 4, 2, 2)
    assert r["avg"] == pytest.approx(sum(correct) / len(correct))
    assert (r["grading_timeouts"], r["disagreement_rate"], r["disagreements"]) == (None, None, None)
    assert path.read_bytes() == before
    with pytest.raises(ValueError, match="other settings"):
        run.main(args[:-2] + ["--engine", "hf", "--seed", "1"])
    # two models in one command: the leaderboard's baseline is the first given, not the alphabetically first
    two = run.run_eval(EvalConfig(models=[str(tiny_model), str(tiny_model)], names=["zeta", "alpha"],
                                  benchmarks=["addition"], n=2, limit=4, max_tokens=16, out=str(tmp_path / "two"),
                                  engine="hf", progress=False), log=lambda m: None)
    assert two["leaderboard"]["baseline"] == "zeta"
    assert [(p["model"], p["baseline"]) for p in two["leaderboard"]["paired"] if p["benchmark"] == "addition"] == \
        [("alpha", "zeta")]


# ---- grader failures are never scores -------------------------------------------------------------------------

def _dying_grade(response, problem):
    """A math grader whose worker process dies on responses containing DIE (a segfault, an OOM kill...)."""
    import os
    if "DIE" in response:
        os._exit(9)
    from scoring.benchmarks.mathbench import grade_problem
    return grade_problem(response, problem)


@pytest.mark.slow   # three grading pools, each starting its workers, and six worker deaths
@needs_data
def test_a_killed_grading_worker_is_a_grader_error_not_a_score(samples_file, tmp_path, monkeypatch, capsys):
    import dataclasses
    real = run.get_benchmark
    monkeypatch.setattr(run, "get_benchmark", lambda name: dataclasses.replace(real(name), grade=_dying_grade))
    rows = [json.loads(line) for line in samples_file.read_text().splitlines()[:3]]
    s = tmp_path / "s.jsonl"
    s.write_text("".join(json.dumps({"problem_id": r["problem_id"],
                                     "responses": r["responses"][:2] + ["DIE " + r["responses"][0]]}) + "\n"
                         for r in rows))
    out = tmp_path / "out"
    slack = ("--grade-timeout", "120")   # a loaded machine must not add grader timeouts to the count
    assert _grade(s, out, *slack) == run.EXIT_UNGRADED == 3
    printed, err = capsys.readouterr()
    assert "NOT GRADED: 3 samples" in printed and "3 samples could not be graded" in err, (printed, err)
    assert not (out / "leaderboard.md").exists()                      # refused
    got = read_samples(out / "ref" / "math500.jsonl")
    assert [r["verdicts"][2] for r in got] == ["grader_error"] * 3
    result = run.run_eval(EvalConfig(models=["ref"], benchmarks=["math500"], problems=str(MATH500), samples=str(s),
                                     out=str(out), workers=2, progress=False, grade_timeout=120), log=lambda m: None)
    [rep] = result["reports"]
    assert (rep["ungraded"], rep["ungraded_problems"], result["ungraded"], result["leaderboard"]) == (3, 0, 3, None)
    assert rep["avg"] == pytest.approx(0.5)            # 3 graded x (solution right, "0" wrong): the 3 ungraded left out
    # the worker is fixed: the same command grades those samples again (resume), scores them, writes the board
    monkeypatch.setattr(run, "get_benchmark", real)
    assert _grade(s, out, *slack) == 0
    got = read_samples(out / "ref" / "math500.jsonl")
    assert [r["verdicts"][2] for r in got] == ["pass"] * 3 and [r["correct"] for r in got] == [[True, False, True]] * 3
    assert (out / "leaderboard.md").is_file()


def test_pool_verdict_for_a_dead_worker_is_grader_error():
    from scoring.grading import grade_math_many
    verdicts, counts = grade_math_many([("DIE \\boxed{1}", "1", False, None)], pool=_DeadPool(), timeout=5)
    assert (verdicts[0].verdict, verdicts[0].correct, counts) == ("grader_error", False, {"timeout": 0, "error": 1})


class _DeadPool:
    def map(self, items, **_):
        from scoring.pool import PoolResult
        return [PoolResult("error", None, "worker died (exit code -9)") for _ in items]


LCB = Path(__file__).resolve().parents[1] / "fixtures" / "lcb"


def _lcb_samples(path: Path, skip=("cf1850_a",)) -> Path:
    from tests.helpers.lcb_solutions import LCB_SOLUTIONS
    path.write_text("".join(json.dumps({"problem_id": k, "responses": [v[0], v[1]]}) + "\n"
                            for k, v in LCB_SOLUTIONS.items() if k not in skip))
    return path


def _lcb(samples, out, *extra):
    return run.main(["--model", "m", "--benchmarks", "livecodebench", "--problems", str(LCB), "--samples",
                     str(samples), "--out", str(out), "--no-progress", *extra])


def _grade_without_runner(response, problem):
    """LiveCodeBench's grade in a grading worker whose sandbox runner is missing (code is graded in worker
    processes: a monkeypatch of this process would not reach them)."""
    from scoring.benchmarks.livecodebench import BENCHMARK
    from scoring.sandbox import host
    host.isolation()   # probed with the runner there: the grade itself is what cannot start
    child, host.CHILD = host.CHILD, "/nonexistent/runner.py"
    try:
        return BENCHMARK.grade(response, problem)
    finally:
        host.CHILD = child


@pytest.mark.slow   # the grading workers import this module (torch, transformers) to find the grade: ~4 s each
def test_a_sandbox_that_cannot_start_is_a_grader_error(tmp_path, monkeypatch, capsys):
    import dataclasses
    s = _lcb_samples(tmp_path / "s.jsonl")
    real = run.get_benchmark
    monkeypatch.setattr(run, "get_benchmark", lambda name: dataclasses.replace(real(name), grade=_grade_without_runner))
    assert _lcb(s, tmp_path / "out", "--lcb-release", "v5_v6") == 3
    rows = read_samples(tmp_path / "out" / "m" / "livecodebench.jsonl")
    assert len(rows) == 5 and {v for r in rows for v in r["verdicts"]} == {"grader_error"}
    assert "NOT GRADED: 10 samples (grader errors / grader timeouts; excluded from the score, 5 problems left with " \
           "none" in capsys.readouterr().out
    monkeypatch.undo()
    assert _lcb(s, tmp_path / "out", "--lcb-release", "v5_v6") == 0   # graded again on resume
    rows = read_samples(tmp_path / "out" / "m" / "livecodebench.jsonl")
    assert [r["correct"] for r in rows] == [[True, False]] * 5


def test_lcb_release_flags_are_recorded_and_printed(tmp_path, capsys):
    s = _lcb_samples(tmp_path / "s.jsonl", skip=("cf1850_a", "abc396_b"))
    assert _lcb(s, tmp_path / "out", "--lcb-release", "v5_v6", "--lcb-end-date", "2025-03-01") == 0
    printed = capsys.readouterr().out
    assert printed.startswith("livecodebench release=v5_v6 dates=..2025-03-01: 4 problems (2024-11-02..2025-03-01)\n")
    rows = read_samples(tmp_path / "out" / "m" / "livecodebench.jsonl")
    assert [r["problem_id"] for r in rows] == ["3301", "abc395_a", "3488", "abc390_a"]
    data = rows[0]["settings"]["data"]
    assert (data["release"], data["start_date"], data["end_date"], data["problems"]) == ("v5_v6", None,
                                                                                         "2025-03-01", 4)
    assert data["selection"] == "livecodebench release=v5_v6 dates=..2025-03-01: 4 problems (2024-11-02..2025-03-01)"
    assert sorted(data["files"]) == ["test5.jsonl", "test6.jsonl"] and data["path"] == str(LCB.resolve())
    assert len(data["files"]["test6.jsonl"]["sha256"]) == 64 and len(data["sha256"]) == 64
    assert all(r["settings"]["data"] == data for r in rows)
    # the same results folder with another selection: refused, nothing appended
    before = (tmp_path / "out" / "m" / "livecodebench.jsonl").read_bytes()
    _lcb_samples(s, skip=("cf1850_a", "abc396_b", "3301", "abc390_a"))   # same file name, v6 problems only
    with pytest.raises(SystemExit, match="written from other data .*release v5_v6.*this run: .*release v6"):
        _lcb(s, tmp_path / "out", "--lcb-release", "v6", "--lcb-end-date", "2025-03-01")
    assert (tmp_path / "out" / "m" / "livecodebench.jsonl").read_bytes() == before


# ---- bad input: a message naming the file and line, exit 2, nothing written ------------------------------------

def test_bad_lcb_flags(tmp_path):
    s = _lcb_samples(tmp_path / "s.jsonl")
    with pytest.raises(SystemExit, match="--lcb-release 'v9' is not a release"):
        _lcb(s, tmp_path / "o", "--lcb-release", "v9")
    with pytest.raises(SystemExit, match="start_date must be YYYY-MM-DD, got '2025/01/01'"):
        _lcb(s, tmp_path / "o", "--lcb-start-date", "2025/01/01")
    with pytest.raises(SystemExit, match="select LiveCodeBench problems; add livecodebench"):
        run.main(["--model", "m", "--benchmarks", "addition", "--lcb-release", "v6", "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()


def test_missing_model_is_found_before_anything_is_written(tmp_path, monkeypatch):
    out = tmp_path / "out"
    for model, why in ((str(tmp_path / "no-such-model"), "no such model folder"),
                       (str(tmp_path), "holds no config.json"),
                       ("./runs/x/checkpoints/step_1", "no such model folder")):
        with pytest.raises(SystemExit, match=why):
            run.main(["--model", model, "--benchmarks", "addition", "--out", str(out), "--no-progress"])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SystemExit, match="HF_HUB_OFFLINE=1 but the hub id is not in the local cache"):
        run.main(["--model", "nobody/not-a-cached-model", "--benchmarks", "addition", "--out", str(out)])
    assert not out.exists()


def test_duplicate_ids_and_bad_lines_in_problem_files(tmp_path):
    import gzip
    line = {"task_id": "HumanEval/0", "prompt": "def f():\n", "entry_point": "f", "test": "def check(c):\n    pass\n"}
    gz = tmp_path / "HumanEval.jsonl.gz"
    with gzip.open(gz, "wt") as f:
        f.write(json.dumps(line) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(SystemExit, match=r"humaneval: .*HumanEval\.jsonl\.gz:2: duplicate task_id 'HumanEval/0' "
                                         r"\(first on line 1\)"):
        run.main(["--model", "m", "--benchmarks", "humaneval", "--problems", str(gz), "--samples", str(gz),
                  "--out", str(tmp_path / "o")])
    add = tmp_path / "add.jsonl"
    add.write_text(json.dumps({"id": "a", "prompt": "1+2\n", "answer": "3"}) + "\n"
                   + json.dumps({"id": "a", "prompt": "2+2\n", "answer": "4"}) + "\n")
    samples = tmp_path / "s.jsonl"
    samples.write_text(json.dumps({"problem_id": "a", "responses": ["3"]}) + "\n")
    with pytest.raises(SystemExit, match=r"addition: duplicate problem ids \['a'\] in .*add\.jsonl"):
        run.main(["--model", "m", "--benchmarks", "addition", "--problems", str(add), "--samples", str(samples),
                  "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match=r"--samples .*nope\.jsonl: no such file"):
        run.main(["--model", "m", "--benchmarks", "addition", "--samples", str(tmp_path / "nope.jsonl"),
                  "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match="--limit must be >= 1"):
        run.main(["--model", "m", "--benchmarks", "addition", "--limit", "0", "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_the_command_prints_a_message_not_a_traceback(tmp_path):
    import subprocess
    import sys
    bad = tmp_path / "test6.jsonl"
    good = (LCB / "test6.jsonl").read_text().splitlines()
    bad.write_text(good[0] + "\n{broken\n")
    samples = tmp_path / "s.jsonl"
    samples.write_text('{"problem_id": "abc395_a", "responses": ["x"]}\n')
    r = subprocess.run([sys.executable, "-m", "eval.run", "--model", "m", "--benchmarks", "livecodebench",
                        "--problems", str(bad), "--samples", str(samples), "--lcb-release", "all",
                        "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=300,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip() == f"error: livecodebench: {bad}:2: malformed JSON line (Expecting property name " \
                               f"enclosed in double quotes at column 2)"
    assert not (tmp_path / "o").exists()


def test_lm_eval_sampling_flags_pass_through_or_are_refused(tmp_path):
    from eval.lm_eval_bridge import gen_kwargs, run_lm_eval
    assert gen_kwargs() is None
    assert gen_kwargs(temperature=0.6, top_p=0.95, max_tokens=512) == {"temperature": 0.6, "do_sample": True,
                                                                       "top_p": 0.95, "max_gen_toks": 512}
    assert gen_kwargs(temperature=0.0) == {"temperature": 0.0, "do_sample": False}
    with pytest.raises(ValueError, match="each task sets its own repeats"):
        run_lm_eval("m", ["t"], tmp_path, n=4)
    with pytest.raises(SystemExit, match="--n cannot be passed to lm-eval tasks"):
        run.main(["--model", "m", "--lm-eval-tasks", "gsm8k", "--n", "4", "--out", str(tmp_path / "o")])


@pytest.mark.slow
def test_data_parallel_engines_write_what_one_engine_writes(tiny_model, tmp_path):
    """--data-parallel-size 2: two HF engine processes share the chunks (4 chunks of 2 problems, sampling at
    temperature 1); the result file is byte for byte the one engine's, and a resumed run appends nothing."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # each of the 2 engine processes gets cores // 2 threads: the same kernels
    try:
        common = ["--model", str(tiny_model), "--benchmarks", "addition", "--n", "4", "--limit", "8",
                  "--max-tokens", "16", "--temperature", "1.0", "--chunk-sequences", "8", "--no-progress",
                  "--engine", "hf"]
        assert run.main(common + ["--out", str(tmp_path / "one")]) == 0
        assert run.main(common + ["--out", str(tmp_path / "two"), "--data-parallel-size", "2"]) == 0
    finally:
        torch.set_num_threads(threads)
    one = (tmp_path / "one" / "tiny-1m" / "addition.jsonl").read_bytes()
    two = tmp_path / "two" / "tiny-1m" / "addition.jsonl"
    rows = read_samples(two)
    assert len(rows) == 8 and len({x for r in rows for x in r["responses"]}) > 8
    assert two.read_bytes() == one
    assert run.main(common + ["--out", str(tmp_path / "two"), "--data-parallel-size", "2"]) == 0
    assert two.read_bytes() == one


def test_data_parallel_size_is_checked_before_anything_runs(tiny_model, tmp_path):
    with pytest.raises(ConfigError, match="--data-parallel-size and --tensor-parallel-size must be >= 1"):
        run.run_eval(EvalConfig(models=[str(tiny_model)], benchmarks=["addition"], out=str(tmp_path),
                                data_parallel_size=0, progress=False))
    with pytest.raises(ConfigError, match="--samples generates nothing"):
        run.run_eval(EvalConfig(models=["m"], benchmarks=["addition"], out=str(tmp_path),
                                samples=str(tiny_model / "config.json"), data_parallel_size=2, progress=False))
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_an_engine_process_that_cannot_start_or_dies_is_named(tmp_path):
    from eval.parallel import EngineSpec, EngineWorkerError, Job, ParallelGenerator, gpu_groups
    from inference.tiny import build_model, build_tokenizer, save_pretrained_atomic
    tok = build_tokenizer()
    save_pretrained_atomic(build_model("1m", tok, seed=0), tok, tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").write_bytes(b"not weights")   # the tokenizer loads, the model cannot
    with pytest.raises(EngineWorkerError, match=r"engine [01] could not start"):
        ParallelGenerator(EngineSpec(model=str(tmp_path / "m"), engine="hf"), 2)
    save_pretrained_atomic(build_model("1m", tok, seed=0), tok, tmp_path / "ok")
    gen = ParallelGenerator(EngineSpec(model=str(tmp_path / "ok"), engine="hf"), 2)
    try:
        ids = tok("1+2=", add_special_tokens=False)["input_ids"]
        jobs = [Job(key=k, prompts=[ids] * 2, max_new_tokens=4, temperature=1.0, top_p=1.0, seed=k) for k in range(3)]
        got = list(gen.run(jobs))
        assert [k for k, _ in got] == [0, 1, 2] and all(len(r) == 2 and len(r[0][0]) <= 4 for _, r in got)
        for p in gen.procs:
            p.kill()
        with pytest.raises(EngineWorkerError, match=r"engine \d died \(exit code -9\)"):
            list(gen.run(jobs))
    finally:
        gen.close()
    assert gpu_groups(2, 2, ["0", "1", "2", "3", "4"]) == [["0", "1"], ["2", "3"]]
    assert gpu_groups(3, 1, []) is None
    with pytest.raises(ValueError, match="needs 4 GPUs, but 3 are visible"):
        gpu_groups(2, 2, ["0", "1", "2"])
