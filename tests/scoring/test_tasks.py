"""scoring.tasks: deterministic generators, solver traces, rewards (right and hand-built wrong answers)."""

import json
from collections import Counter

import pytest

from scoring.tasks import HELDOUT_SEED, TASKS, TRAIN_SEED, WARMUP_SEED, addition, countdown, get_task, minicode
from scoring.tasks import make as make_cli


def test_registry_is_a_plain_dict():
    assert TASKS == {"addition": addition, "countdown": countdown, "minicode": minicode}
    assert get_task("countdown") is countdown
    with pytest.raises(ValueError, match="choose one of: addition, countdown, minicode"):
        get_task("sudoku")


@pytest.mark.parametrize("name", sorted(TASKS))
def test_deterministic_in_seed(name):
    task = TASKS[name]
    a, b, c = (task.make_examples(50, seed=s) for s in (7, 7, 8))
    assert a == b
    assert [r["prompt"] for r in a] != [r["prompt"] for r in c]
    assert len({r["id"] for r in a + c}) == 100
    for row in a:
        assert {"id", "prompt", "answer", "solution"} <= set(row)
        assert row["prompt"].endswith("\n") and set(row["prompt"] + row["solution"]) <= set(
            "\n" + "".join(map(chr, range(32, 127)))
        )  # the char tokenizer's alphabet: no <unk>
    assert task.make_examples(0, seed=0) == []


def _one_row_per_program_shape(rows: list[dict]) -> list[dict]:
    """minicode: the first row of each (kind, operation, function name); its reward is a sandbox run (~70 ms), and
    the rows of one shape differ only in the constant and the tests, which every row's tests check through the
    batch grader (tests/trainer/test_code_rl.py::test_minicode_rows_carry_tests_their_solutions_pass)."""
    first = {}
    for r in rows:
        first.setdefault((r["testtype"], r["prompt"].split()[-2], r.get("fn_name")), r)
    return list(first.values())


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "minicode" else n
                                  for n in sorted(TASKS)])   # minicode's reward is a sandbox run per row
def test_solver_trace_gets_full_reward(name):
    task = TASKS[name]
    rows = task.make_examples(400, seed=0)
    if name == "minicode":
        rows = _one_row_per_program_shape(rows)
        assert len(rows) == 6 + 6 * 4   # stdin per operation; functional per operation and function name
    assert [task.reward(r["solution"], r) for r in rows] == [1.0] * len(rows)
    # decoded responses may carry a trailing newline or spaces
    assert all(task.reward(r["solution"] + "\n  \n", r) == 1.0 for r in rows[:20 if name != "minicode" else 4])


# ------------------------------------------------------------------------------------------- addition


def test_addition_trace_format():
    assert addition.format_prompt(347, 85) == "347+85\n"
    assert addition.solve(347, 85) == "7+5+0=12\n4+8+1=13\n3+0+1=4\n= 432"
    assert addition.solve(99, 1) == "9+1+0=10\n9+0+1=10\n= 100"
    assert addition.solve(0, 0) == "0+0+0=0\n= 0"


def test_addition_difficulty():
    rows = addition.make_examples(300, seed=1, min_digits=3, max_digits=3)
    assert all(100 <= r["a"] <= 999 and 100 <= r["b"] <= 999 for r in rows)
    assert all(r["answer"] == str(r["a"] + r["b"]) for r in rows)
    lengths = Counter(len(str(r["a"])) for r in addition.make_examples(600, seed=1, min_digits=1, max_digits=3))
    assert set(lengths) == {1, 2, 3} and min(lengths.values()) > 150  # digits uniform over the range
    with pytest.raises(ValueError, match="min_digits <= max_digits"):
        addition.make_examples(1, seed=0, min_digits=3, max_digits=2)


@pytest.mark.parametrize(
    "response, expected",
    [
        ("7+5+0=12\n4+8+1=13\n3+0+1=4\n= 432", 1.0),
        ("= 432", 1.0),  # only the final answer is graded
        ("7+5+0=13\n= 432", 1.0),  # ... a wrong scratchpad line does not matter
        ("  =432  \n", 1.0),
        ("7+5+0=12\n4+8+1=13\n3+0+1=4\n= 431", 0.0),  # wrong digit
        ("7+5+0=12\n4+8+1=13\n3+0+1=4\n= 4320", 0.0),  # wrong final
        ("= 432\n3+0+1=4", 0.0),  # text after the final line
        ("= 432\n= 431", 0.0),  # the last answer line counts
        ("7+5+0=12\n4+8+1=13\n3+0+1=4", 0.0),  # cut before the final line
        ("= -432", 0.0),
        ("= 432.0", 0.0),
        ("Answer: 432", 0.0),
        ("qwe=+\n==", 0.0),
        ("", 0.0),
    ],
)
def test_addition_reward(response, expected):
    example = {"prompt": "347+85\n", "answer": "432"}
    assert addition.reward(response, example) == expected


# ------------------------------------------------------------------------------------------- countdown

EX = {"prompt": "Make 20 from 8 3 4\n", "answer": "20", "numbers": [8, 3, 4], "target": 20}


def test_countdown_solver():
    sols = countdown.solve([8, 3, 4])
    assert sols[20] == {
        "(8*3)-4": ("8*3=24", "24-4=20"),
        "(8-3)*4": ("8-3=5", "5*4=20"),
        "(4*3)+8": ("4*3=12", "12+8=20"),
    }
    assert sols[15] == {
        "8+(4+3)": ("4+3=7", "8+7=15"),
        "(8+4)+3": ("8+4=12", "12+3=15"),
        "(8+3)+4": ("8+3=11", "11+4=15"),
    }
    assert 96 in sols and 13 not in sols  # 8*3*4 ; 13 is not reachable from 8 3 4 with every number once
    assert min(sols) >= 0  # no negative intermediate or final values


def test_countdown_examples_are_solvable_and_in_range():
    rows = countdown.make_examples(
        300, seed=2, min_numbers=3, max_numbers=4, max_number=15, min_target=20, max_target=60
    )
    counts = Counter(len(r["numbers"]) for r in rows)
    assert set(counts) == {3, 4}
    for r in rows:
        assert 20 <= r["target"] <= 60 and all(1 <= x <= 15 for x in r["numbers"])
        assert r["prompt"] == f"Make {r['target']} from {' '.join(map(str, r['numbers']))}\n"
        assert r["n_solutions"] == len(countdown.solve(r["numbers"])[r["target"]]) >= 1
    multi = [r for r in rows if r["n_solutions"] > 1]
    assert len(multi) > 100  # several valid solution paths are common
    with pytest.raises(ValueError, match="widen the target range"):
        countdown.make_examples(1, seed=0, min_numbers=3, max_numbers=3, max_number=2, min_target=500, max_target=600)


def test_countdown_any_valid_path_gets_reward():
    rows = countdown.make_examples(100, seed=3)
    checked = 0
    for r in rows:
        paths = countdown.solve(r["numbers"])[r["target"]]
        if len(paths) < 2:
            continue
        responses = ["\n".join(steps + (f"= {expr}",)) for expr, steps in sorted(paths.items())]
        assert len(set(responses)) == len(paths)
        assert all(countdown.reward(resp, r) == 1.0 for resp in responses)
        checked += 1
    assert checked > 30


@pytest.mark.parametrize(
    "response, expected",
    [
        ("8*3=24\n24-4=20\n= (8*3)-4", 1.0),
        ("8-3=5\n5*4=20\n= (8-3)*4", 1.0),  # another valid path
        ("4*3=12\n12+8=20\n= 8+4*3", 1.0),  # precedence, no parentheses needed
        ("= 8*3-4", 1.0),  # steps are optional
        ("8 * 3 = 24\n\n24 - 4 = 20\n=(8 * 3) - 4\n", 1.0),  # spaces and blank lines are ignored
        ("8*3=24\n24-4=20\n= ((8*3)-4)+8-8", 0.0),  # 8 used three times
        ("8*3=24\n24-4=20\n= 8*3-4+3-3", 0.0),  # 3 reused
        ("8*3=24\n24*3=72\n= (8*3)-4", 0.0),  # a step reuses 3
        ("24-4=20\n= (8*3)-4", 0.0),  # a step uses a number that is not available
        ("8*3=25\n25-5=20\n= (8*3)-4", 0.0),  # wrong arithmetic in a step
        ("8*3=24\n24-4=20", 0.0),  # no final expression
        ("8*3=24\n24-4=20\n= 20", 0.0),  # final line is not an expression over the numbers
        ("= 8*3", 0.0),  # 4 unused
        ("= (8+3)*4", 0.0),  # valid arithmetic, not the target (44)
        ("= 8*(3-4)+28", 0.0),  # negative intermediate; 28 not given
        ("= 3-8+25", 0.0),  # negative intermediate
        ("= 8/3*4", 0.0),  # inexact division
        ("= (8*3-4", 0.0),  # unbalanced
        ("= (8*3)-4)", 0.0),
        ("= 8*3-4 answer", 0.0),
        ("= " + "(" * 5000 + "8", 0.0),  # pathological nesting must not raise
        ("hello world", 0.0),
        ("", 0.0),
    ],
)
def test_countdown_reward(response, expected):
    assert countdown.reward(response, EX) == expected


def test_countdown_duplicate_numbers_may_each_be_used():
    ex = {"numbers": [5, 5, 2], "target": 50}
    assert countdown.reward("5*5=25\n25*2=50\n= (5*5)*2", ex) == 1.0
    assert countdown.reward("5*5=25\n25*5=125\n= 5*5*2", ex) == 0.0  # the step uses a third 5


SEARCH_EX = {**EX, "search": 3}


@pytest.mark.parametrize(
    "response, plain, search",
    [
        ("8+3=11\n11+4=15\nno\n8*3=24\n24-4=20\n= (8*3)-4", 0.0, 1.0),  # a detour, then the path
        ("8+3=11\nno\n8*3=24\n24-4=20\n= (8*3)-4", 0.0, 1.0),          # a detour may stop part-way
        ("no\nno\n= (8*3)-4", 0.0, 1.0),                                  # backtracking alone costs nothing
        ("8+3=11\n11+4=15\nno\n11+4=15\n= (8*3)-4", 0.0, 0.0),        # a detour's results are gone after no
        ("8+3=11\n11+4=15\nno\n8*3=24\n24-4=20\n= 15+(8*3)-4", 0.0, 0.0),  # ... and not in the expression
        ("8+3=11\nno\n8+3=12\n= (8*3)-4", 0.0, 0.0),                     # a wrong step after no
        ("8+3=11\n11+4=15\nno\n= (8+3)+4", 0.0, 0.0),                    # the last attempt misses (15)
        ("8*3=24\n24-4=20\nno", 0.0, 0.0),                               # no final expression
        ("8*3=24\nNo\n24-4=20\n= (8*3)-4", 0.0, 0.0),                    # only the exact line backtracks
        ("8*3=24\n24-4=20\n= (8*3)-4", 1.0, 1.0),                        # the plain format stays right
    ],
)
def test_countdown_search_reward(response, plain, search):
    """``no`` gives the given numbers back in a search row only; the final expression is checked as always."""
    assert (countdown.reward(response, EX), countdown.reward(response, SEARCH_EX)) == (plain, search)


def test_countdown_search_traces():
    kw = dict(min_numbers=3, max_numbers=3, max_number=10, min_target=1, max_target=30)
    plain = countdown.make_examples(300, seed=5, **kw)
    rows = countdown.make_examples(300, seed=5, search=3, **kw)
    assert rows == countdown.make_examples(300, seed=5, search=3, **kw)
    # the same problems as search = 0: only the solution (and the row's search field) differs
    keep = ("id", "prompt", "answer", "numbers", "target", "n_solutions")
    assert [{k: r[k] for k in keep} for r in rows] == [{k: r[k] for k in keep} for r in plain]
    detours = Counter()
    for r, p in zip(rows, plain):
        assert r["search"] == 3 and "search" not in p
        assert countdown.reward(r["solution"], r) == 1.0
        lines = r["solution"].split("\n")
        k = lines.count("no")
        detours[k] += 1
        assert lines[len(lines) - len(p["solution"].split("\n")):] == p["solution"].split("\n")
        attempts = "\n".join(lines).split("\nno\n")[:k] if k else []
        assert len(set(attempts)) == k                       # distinct detours
        for a in attempts:                                   # each one a whole path that misses the target
            steps = a.split("\n")
            assert len(steps) == 2 and int(steps[-1].split("=")[1]) != r["target"]
        if k:
            assert countdown.reward(r["solution"], p) == 0.0  # a plain row refuses the backtracking line
    # k ~ Uniform{0..3}: each count near a quarter of 300
    assert set(detours) == {0, 1, 2, 3} and all(50 <= detours[k] <= 100 for k in range(4)), detours
    with pytest.raises(ValueError, match="search must be >= 0"):
        countdown.make_examples(1, seed=0, search=-1)


def test_expression_evaluator():
    assert countdown.evaluate_expression("(8*3)-4") == (20, [8, 3, 4])
    assert countdown.evaluate_expression("12/4/3") == (1, [12, 4, 3])  # left-associative
    assert countdown.evaluate_expression("2+3*4") == (14, [2, 3, 4])
    for bad in ["8/0", "8-9", "", "8+", "(8", "8 8", "a+1"]:
        with pytest.raises(ValueError):
            countdown.evaluate_expression(bad)


# ------------------------------------------------------------------------------------------- make CLI


def test_make_cli_writes_jsonl(tmp_path, capsys):
    out = tmp_path / "sub" / "add.jsonl"
    make_cli.main(
        ["--task", "addition", "--n", "20", "--seed", "5", "--min-digits", "2", "--max-digits", "3", "--out", str(out)]
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == addition.make_examples(20, seed=5, min_digits=2, max_digits=3)
    assert out.read_text() == "".join(json.dumps(r) + "\n" for r in rows)   # compact lines, as before the one writer
    assert sorted(p.name for p in out.parent.iterdir()) == ["add.jsonl"]     # no temporary file left
    assert "wrote 20 addition examples" in capsys.readouterr().out

    out = tmp_path / "cd.jsonl"
    make_cli.main(["--task", "countdown", "--n", "5", "--max-numbers", "3", "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == countdown.make_examples(5, seed=0, max_numbers=3)


def test_the_seeds_of_the_data_pools_have_one_home():
    from scoring.benchmarks.tasks import ADDITION
    assert (HELDOUT_SEED, WARMUP_SEED, TRAIN_SEED) == (10_000, 7919, 1)
    held = ADDITION.load()
    assert [p.id for p in held[:2]] == ["addition-s10000-000000", "addition-s10000-000001"]
    assert [p.question for p in held] == [r["prompt"] for r in addition.make_examples(200, seed=HELDOUT_SEED)]
    assert ADDITION.version == "addition-1-seed10000-n200"


def test_make_cli_rejects_options_of_other_tasks(tmp_path):
    base = ["--task", "addition", "--n", "5", "--out", str(tmp_path / "x.jsonl")]
    with pytest.raises(SystemExit, match="--max-numbers do not apply to task 'addition'"):
        make_cli.main(base + ["--max-numbers", "3"])
    with pytest.raises(SystemExit, match="min_digits <= max_digits"):
        make_cli.main(base + ["--min-digits", "4", "--max-digits", "2"])
    assert not list(tmp_path.iterdir())


def test_tasks_import_no_torch():
    """Rewards run in worker processes and graders: the task package stays standard-library only."""
    import subprocess
    import sys

    code = (
        "import sys, scoring.tasks, scoring.tasks.make; "
        "print(sorted({'torch', 'numpy', 'transformers'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
