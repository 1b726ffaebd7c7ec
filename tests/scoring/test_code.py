"""Code grading (LiveCodeBench semantics), the LiveCodeBench loader on hand-written fixtures in the official format,
and HumanEval / EvalPlus end to end in the sandbox."""

import ast
import base64
import functools
import gzip
import json
import os
import pickle
import zlib
from collections import Counter
from pathlib import Path

import pytest

from scoring.benchmarks import evalplus_plus as ep, humaneval as he
from scoring.benchmarks import livecodebench as lcb
from scoring.code import CodeTest, extract_code, grade_code, stdout_matches
from scoring.sandbox import isolation, run_many, run_program
from scoring.templates import SYSTEM_PROMPT, render_prompt
from tests.helpers.lcb_solutions import LCB_SOLUTIONS

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lcb"
HUMANEVAL = Path(__file__).resolve().parents[3] / "shared" / "data" / "code" / "humaneval" / "HumanEval.jsonl.gz"
MALICIOUS_CANARY = "/tmp/thinking_seeds_lcb_malicious_pickle_ran"   # what the fixture's payload touches


# ------------------------------------------------------------------------------------------- extraction

def test_extract_code_takes_the_last_python_block():
    r = "text\n```python\nprint(1)\n```\nmore\n```py\nprint(2)\n```\n```bash\nrm -rf /\n```\nend"
    assert extract_code(r) == "print(2)\n"
    assert extract_code("```\nx = 1\n```") == "x = 1\n"
    assert extract_code("```Python3\nx = 3\n```") == "x = 3\n"
    assert extract_code("no fences at all\nprint(3)") == "no fences at all\nprint(3)"
    # code written while thinking is a draft: only the text after </think> counts
    assert extract_code("<think>```python\ndraft()\n```</think>\n```python\nfinal()\n```") == "final()\n"
    assert extract_code("```python\nunclosed()\n") == "```python\nunclosed()\n"


# ------------------------------------------------------------------------------------------- comparison

@pytest.mark.parametrize("out, gold, ok", [
    ("6\n3\n", "6\n3", True),
    ("  6  \r\n3\n\n\n", "6\n3\n", True),          # each line stripped, trailing blank lines dropped
    ("\n6\n3", "6\n3", True),                      # LiveCodeBench strips the whole output first
    ("6\n\n3", "6\n3", False),                     # interior blank lines count
    ("2.5", "2.500000", True),                     # tokens compared as decimals
    ("1e3 7", "1000 7.0", True),
    ("0.3333333", "0.333333", False),              # exact decimal equality: LiveCodeBench has no epsilon
    ("Yes", "yes", False),
    ("1 2", "1 2 3", False),
    ("nan", "nan", True),                          # equal as strings before any number parsing
    ("6 3", "6\n3", False),
])
def test_stdout_comparison_matches_livecodebench(out, gold, ok):
    assert stdout_matches(out, gold)[0] is ok


def test_optional_float_tolerance():
    assert not stdout_matches("0.3333333", "0.333333")[0]
    assert stdout_matches("0.3333333", "0.333333", abs_tol=1e-6)[0]
    assert stdout_matches("100.0001", "100", rel_tol=1e-5)[0]
    assert not stdout_matches("100.01", "100", rel_tol=1e-5)[0]


def test_grade_code_stdin_reports_the_first_failing_test():
    tests = [CodeTest("1 2\n", "3\n"), CodeTest("5 5\n", "10\n"), CodeTest("0 0\n", "0\n")]
    assert grade_code("a, b = map(int, input().split())\nprint(a + b)", tests, kind="stdin").verdict == "pass"
    v = grade_code("a, b = map(int, input().split())\nprint(a + b if a != 5 else 11)", tests, kind="stdin")
    assert (v.correct, v.verdict) == (False, "wrong_answer") and v.detail.startswith("test 2/3: wrong_answer")
    v = grade_code("a, b = map(int, input().split())\nprint(a + b if b else a // b)", tests, kind="stdin")
    assert v.verdict == "runtime_error" and v.detail.startswith("test 3/3: runtime_error")
    assert grade_code("while True: pass", tests, kind="stdin", timeout_s=0.5).verdict == "time_limit"
    assert grade_code("x = bytearray(2 ** 40)", tests, kind="stdin", memory_mb=256).verdict == "memory_limit"
    assert grade_code("   \n", tests, kind="stdin").verdict == "no_answer"


def test_grade_code_functional_semantics():
    tests = [{"input": "[1, 2]\n3", "output": "[1, 2, 3]"}]
    tup = "class Solution:\n    def f(self, xs, y):\n        return tuple(xs) + (y,)\n"
    assert grade_code(tup, tests, kind="functional", fn_name="f").correct   # tuple -> list, as LiveCodeBench
    nested = "class Solution:\n    def f(self, xs, y):\n        return [tuple(xs)]\n"
    assert not grade_code(nested, [{"input": "[1, 2]\n3", "output": "[[1, 2]]"}], kind="functional",
                          fn_name="f").correct                            # a nested tuple is not a list
    as_float = "def g(x):\n    return x * 1.0\n"
    assert grade_code(as_float, [{"input": "2", "output": "2"}], kind="functional", fn_name="g").correct  # 2.0 == 2
    # LeetCode starter code uses List[int] without importing typing: LiveCodeBench's import prelude provides it
    starter = "class Solution:\n    def h(self, nums: List[int]) -> int:\n        return len(nums)\n"
    assert grade_code(starter, [{"input": "[4, 5]", "output": "2"}], kind="functional", fn_name="h").correct
    assert grade_code(starter, [{"input": "[4, 5]", "output": "2"}], kind="functional", fn_name="h",
                      prelude="").verdict == "runtime_error"
    big = "1" + "0" * 6000   # 10**6000: more digits than Python's default str<->int limit of 4300
    assert grade_code("def p(n):\n    return 10 ** n\n", [{"input": "6000", "output": big}], kind="functional",
                      fn_name="p").correct
    assert grade_code("def p(n):\n    return 10 ** n + 1\n", [{"input": "6000", "output": big}],
                      kind="functional", fn_name="p").verdict == "wrong_answer"


# ------------------------------------------------------------------------------------------- LiveCodeBench

def test_release_and_date_filters_count_problems():
    def ids(**kw):
        return [p.id for p in lcb.load(**kw)]
    # default v6: test6.jsonl within 2025-02-01..2025-05-01, the January row left out (tests/scoring/test_lcb_v6.py)
    assert ids(path=FIXTURES) == ["abc395_a", "abc396_b", "3488"]
    assert len(ids(path=FIXTURES, release="release_v6")) == 6
    assert ids(path=FIXTURES, release="release_v1") == ["cf1850_a"]
    assert ids(path=FIXTURES, release="v5") == ["3301"]
    assert len(ids(path=FIXTURES, release="v5_v6")) == 5
    # one file + a release tag: the same window drops the January problem
    assert ids(path=FIXTURES / "test6.jsonl") == ["abc395_a", "abc396_b", "3488"]
    assert len(ids(path=FIXTURES / "test6.jsonl", release=None)) == 4
    assert ids(path=FIXTURES, release="release_v6", start_date="2025-03-01") == ["abc395_a", "abc396_b"]
    assert ids(path=FIXTURES, release="release_v6", start_date="2024-01-01", end_date="2025-03-01") == \
        ["3301", "abc395_a", "3488", "abc390_a"]                                      # inclusive ends
    ps = lcb.load(FIXTURES)
    assert lcb.selection_summary(ps) == ("livecodebench release=v6: 3 problems (2025-02-15..2025-03-08); 1 row of "
                                         "test6.jsonl dated outside the release's window left out")
    assert lcb.RELEASES["v6"][1:] == (lcb.date(2025, 2, 1), lcb.date(2025, 5, 1))
    with pytest.raises(ValueError, match="unknown LiveCodeBench release"):
        lcb.load(FIXTURES, release="v7")
    with pytest.raises(FileNotFoundError, match="missing"):
        lcb.load(FIXTURES.parent, release="v1")


def test_problem_fields_prompt_and_private_tests():
    ps = {p.id: p for p in lcb.load(FIXTURES, release="release_v6")}
    p = ps["3488"]
    assert p.gold["kind"] == "functional" and p.gold["fn_name"] == "pairIndices"
    assert (p.meta["n_tests"], p.meta["platform"], p.meta["contest_date"]) == (3, "leetcode", "2025-02-15T00:00:00")
    assert [t["output"] for t in lcb.tests_of(p)] == ["[0, 1]", "[1, 2]", "[1, 3]"]     # public, then private
    assert p.question.startswith("### Question:\nGiven nums and target")
    assert "### Format: You will use the following starter code" in p.question
    assert "```python\nclass Solution:\n    def pairIndices" in p.question
    assert p.question.endswith("### Answer: (use the provided format with backticks)\n\n")
    s = ps["abc395_a"]
    assert s.gold["kind"] == "stdin" and "Read the inputs from stdin" in s.question and "# YOUR CODE HERE" in s.question
    assert [t["input"] for t in lcb.tests_of(s)] == ["3\n1 2 3\n", "2\n5 -7\n", "5\n1 1 1 1 1\n"]
    assert lcb.tests_of(ps["cf1850_a"])[1]["output"] == "-5\n-5\n"                        # plain-JSON private tests
    text = render_prompt("lcb", s.question)
    assert text.startswith(SYSTEM_PROMPT) and text.endswith(s.question)


def test_private_tests_decode_without_pickle_code():
    tests = [{"input": "1\n", "output": "2\n", "testtype": "stdin"}]
    raw = base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()
    assert lcb.decode_private_tests(raw) == tests
    assert lcb.decode_private_tests(json.dumps(tests)) == tests
    not_str = base64.b64encode(zlib.compress(pickle.dumps(tests))).decode()   # a pickled list, not a str
    with pytest.raises(ValueError, match="holds a list"):
        lcb.decode_private_tests(not_str)
    with pytest.raises(ValueError, match="neither JSON nor"):
        lcb.decode_private_tests("%%% not base64 %%%")


def test_malicious_pickle_is_refused_and_never_runs():
    if os.path.exists(MALICIOUS_CANARY):
        os.remove(MALICIOUS_CANARY)
    with pytest.raises(ValueError, match=r"malicious.jsonl:1 \(evil_1\).*refusing to load posix.system"):
        lcb.load(FIXTURES / "malicious.jsonl", release=None)
    assert not os.path.exists(MALICIOUS_CANARY)
    # the payload is real: a plain pickle.loads runs os.system (tried inside the sandbox, where it is harmless)
    if not isolation().full:
        pytest.skip(f"not running the payload without full sandbox isolation: {isolation().reason}")
    raw = json.loads((FIXTURES / "malicious.jsonl").read_text())["private_test_cases"]
    r = run_program(f"import base64, pickle, zlib, os\n"
                    f"pickle.loads(zlib.decompress(base64.b64decode({raw!r})))\n"
                    f"print(os.path.exists({MALICIOUS_CANARY!r}))\n")
    assert r.stdout == "True\n"
    assert not os.path.exists(MALICIOUS_CANARY)


def test_malformed_problem_files_name_file_and_line(tmp_path):
    good = (FIXTURES / "test6.jsonl").read_text().splitlines()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good[0] + "\n{not json\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: malformed JSON line"):
        lcb.load(bad, release=None)
    row = json.loads(good[0])
    del row["metadata"]
    bad.write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: missing field\(s\) \['metadata'\]"):
        lcb.load(bad, release=None)
    gz = tmp_path / "HumanEval.jsonl.gz"
    with gzip.open(gz, "wt") as f:
        f.write('{"task_id": "x"}\n')
    with pytest.raises(ValueError, match=r"HumanEval.jsonl.gz:1: missing string field"):
        he.load(gz)



def test_livecodebench_grading_end_to_end():
    ps = lcb.load(FIXTURES, release="release_v6")
    jobs = [functools.partial(lcb.grade, LCB_SOLUTIONS[p.id][k], p) for p in ps for k in (0, 1)]
    verdicts = run_many(jobs, workers=4)
    got = {(p.id, k): verdicts[2 * i + k] for i, p in enumerate(ps) for k in (0, 1)}
    assert all(got[(p.id, 0)].correct for p in ps), {k: v for k, v in got.items() if k[1] == 0}
    assert not any(got[(p.id, 1)].correct for p in ps)
    assert got[("abc396_b", 1)].detail.startswith("test 2/3: wrong_answer: line 1: '1.3333' != '1.333333'")
    assert got[("3488", 1)].detail.startswith("test 2/3: wrong_answer: returned [0, 1], expected [1, 2]")
    assert got[("cf1850_a", 1)].detail.startswith("test 2/3")
    assert lcb.BENCHMARK.name == "livecodebench" and lcb.BENCHMARK.kind == "code"
    assert lcb.BENCHMARK.generation["n"] == 32


# ------------------------------------------------------------------------------------------- HumanEval

@pytest.fixture(scope="module")
def humaneval():
    assert HUMANEVAL.is_file(), f"HumanEval data expected at {HUMANEVAL} (the repo sits next to shared/)"
    return he.load(HUMANEVAL)


def _flip_first_comparison(problem) -> str | None:
    """The canonical solution with the first comparison of its entry function reversed (< to >=, == to !=, ...)."""
    flip = {ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt, ast.Eq: ast.NotEq,
            ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
    fn = problem.gold["entry_point"]
    tree = ast.parse(problem.gold["prompt"] + problem.meta["canonical_solution"])
    target = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == fn)
    for node in ast.walk(target):
        if isinstance(node, ast.Compare):
            node.ops[0] = flip[type(node.ops[0])]()
            return "```python\n" + ast.unparse(tree) + "\n```"
    return None


@pytest.mark.slow
def test_humaneval_canonical_pass_and_mutants_fail(humaneval):
    assert len(humaneval) == 164
    ps = humaneval
    canonical = run_many([functools.partial(he.grade, p.meta["canonical_solution"], p) for p in ps], workers=4)
    assert sum(v.correct for v in canonical) == 164, [(p.id, v) for p, v in zip(ps, canonical) if not v.correct]
    none = run_many([functools.partial(he.grade, "    return None\n", p) for p in ps], workers=4)
    assert sum(not v.correct for v in none) == 164
    assert Counter(v.verdict for v in none) == {"wrong_answer": 159, "runtime_error": 5}
    flipped = [(p, _flip_first_comparison(p)) for p in ps]
    flipped = [(p, src) for p, src in flipped if src is not None]
    verdicts = run_many([functools.partial(he.grade, src, p) for p, src in flipped], workers=4)
    assert len(flipped) == 119   # canonical solutions with a comparison to flip
    assert [p.id for (p, _), v in zip(flipped, verdicts) if v.correct] == ["HumanEval/127"]   # 118 of 119 fail


def test_humaneval_completion_styles(humaneval):
    p = next(q for q in humaneval if q.id == "HumanEval/0")
    body = p.meta["canonical_solution"]
    full = p.gold["prompt"] + body
    styles = {
        "raw continuation": body,
        "echoes the prompt": full,
        "chat answer with the whole function": f"Here you go:\n```python\n{full}```\nThis works because...",
        "function without the imports": "```python\ndef has_close_elements(numbers, threshold):\n"
                                        "    return any(abs(a - b) < threshold for i, a in enumerate(numbers)\n"
                                        "               for j, b in enumerate(numbers) if i != j)\n```",
        "prose after the code": body + "\n\nThe function compares every pair of numbers.",
        "own asserts that would fail": body + "\n\nassert has_close_elements([1.0], 0.5) is True\nprint('demo')\n",
    }
    for name, response in styles.items():
        assert he.grade(response, p).correct, name
    assert not he.grade("```python\ndef has_close_elements(numbers, threshold):\n    return True\n```", p).correct
    assert he.BENCHMARK.name == "humaneval" and ep.HUMANEVAL_PLUS.name == "humaneval_plus"
    assert ep.MBPP_PLUS.name == "mbpp_plus"


def test_humaneval_data_location(monkeypatch, tmp_path, shared_data):
    monkeypatch.setenv("THINKING_SEEDS_DATA", str(shared_data))
    assert len(he.load()) == 164
    monkeypatch.setenv("THINKING_SEEDS_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="code/humaneval/HumanEval.jsonl.gz"):
        he.load()
    monkeypatch.delenv("THINKING_SEEDS_DATA")
    with pytest.raises(FileNotFoundError, match="THINKING_SEEDS_DATA is not set"):
        he.load()
    with pytest.raises(FileNotFoundError, match="THINKING_SEEDS_DATA is not set"):
        lcb.load()


def test_eval_run_refuses_a_code_benchmark_without_full_isolation_unless_allowed(monkeypatch, tmp_path, shared_data,
                                                                                   capsys):
    """Fail closed: on a machine without the sandbox's namespaces (the probe's verdict replaced here) ``eval.run``
    on HumanEval stops with one line and exit 2, nothing written; with --allow-unisolated it grades, warned."""
    import dataclasses

    from eval import run
    from scoring.sandbox import ALLOW_UNISOLATED_ENV, host
    monkeypatch.setattr(host, "_ISOLATION", dataclasses.replace(isolation(), namespaces=False,
                                                                reason="test: no unshare"))
    monkeypatch.delenv(ALLOW_UNISOLATED_ENV, raising=False)
    monkeypatch.setenv("THINKING_SEEDS_DATA", str(shared_data))
    samples = tmp_path / "samples.jsonl"
    samples.write_text(json.dumps({"problem_id": "HumanEval/0", "responses": ["    return False\n"]}) + "\n")
    out = tmp_path / "out"
    args = ["--model", "m", "--benchmarks", "humaneval", "--samples", str(samples), "--limit", "1", "--out", str(out),
            "--no-progress"]
    with pytest.raises(SystemExit) as exc:
        run.main(args)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: code grading needs the full sandbox, which this machine does not give (test: no "
                          "unshare); run as root with util-linux's unshare, or pass --allow-unisolated")
    assert not out.exists()
    with pytest.warns(RuntimeWarning, match=r"NOT fully isolated \(test: no unshare\)"):
        assert run.main(args + ["--allow-unisolated"]) == 0
    [row] = [json.loads(line) for line in (out / "m" / "humaneval.jsonl").read_text().splitlines()]
    assert row["problem_id"] == "HumanEval/0"


# ------------------------------------------------------------------------------------------- EvalPlus
# HumanEval+ / MBPP+ go through the evalplus package now: tests/scoring/test_evalplus.py (records in EvalPlus's format).
