"""Table 2's path: code RL from the published data format (KlearReasoner-CodeSub-15K) to rewards from the sandbox.

Fixture rows (tests/fixtures/klear/, written by make_rows.py) follow the published layout for every data_source
whose test format trainer/data.py reads; each is one of four tiny problems, and for each problem a correct, a wrong,
a crashing and a hanging program are graded through the trainer's reward path (parallel worker processes).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scoring import rewards
from scoring.templates import SYSTEM_PROMPT, render_prompt
from scoring.verdict import GRADER_ERROR
from trainer.config import load_config
from trainer.data import DataError, load_examples

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures" / "klear"
CODE = ["task=code", "answer_key=reward_model.ground_truth", "template=lcb"]

PROGRAMS = {
    "max_stdin": {"correct": "n=int(input())\nprint(max(map(int,input().split())))",
                  "wrong": "n=int(input())\nprint(min(map(int,input().split())))",
                  "crash": "n=int(input())\nraise ValueError('boom')", "hang": "while True:\n    pass"},
    "max_fn": {"correct": "def max_of(xs):\n    return max(xs)", "wrong": "def max_of(xs):\n    return min(xs)",
               "crash": "def max_of(xs):\n    return xs[100]", "hang": "def max_of(xs):\n    while True:\n        pass"},
    "max_method": {"correct": "class Solution:\n    def maxOf(self, nums):\n        return max(nums)",
                   "wrong": "class Solution:\n    def maxOf(self, nums):\n        return nums[0]",
                   "crash": "class Solution:\n    def maxOf(self, nums):\n        return 1/0",
                   "hang": "class Solution:\n    def maxOf(self, nums):\n        while True:\n            pass"},
    "reverse": {"correct": ("class Solution:\n    def reverseList(self, head):\n        prev = None\n        while head:\n"
                            "            head.next, prev, head = prev, head, head.next\n        return prev"),
                "wrong": "class Solution:\n    def reverseList(self, head):\n        return head",
                "crash": "class Solution:\n    def reverseList(self, head):\n        return head.val.x",
                "hang": "class Solution:\n    def reverseList(self, head):\n        while True:\n            pass"},
}
WANT = {"correct": ("pass", 1.0), "wrong": ("wrong_answer", 0.0), "crash": ("runtime_error", 0.0),
        "hang": ("time_limit", 0.0)}


def problem_of(row_hash: str) -> str:
    if row_hash.endswith("stdin"):
        return "max_stdin"
    if row_hash in ("lcb-functional", "leetcode-check"):
        return "max_method"
    return "reverse" if row_hash == "leetcode-listnode" else "max_fn"


def load(path=FIX / "rows.jsonl", extra=()):
    return load_examples(load_config(None, [*CODE, f"train_file={path}", *extra]))


def test_published_rows_load_for_every_data_source_and_render_as_livecodebench():
    exs = load()
    assert len(exs) == 14
    assert {e["data_source"] for e in exs} == {
        "coder1_longcot", "coder1", "livecodebench_longcot", "livecodebench", "taco", "taco_longcot", "apps_longcot",
        "code_contests", "primeintellect", "primeintellect_longcot", "codeforces_longcot", "leetcode",
        "leetcode_longcot"}
    kinds = {e["hash"]: (e["testtype"], e.get("fn_name"), e.get("test_match")) for e in exs}
    assert kinds["taco-call"] == ("functional", "max_of", "taco")
    assert kinds["lcb-functional"] == ("functional", "maxOf", "lcb")
    assert kinds["coder1-assert-list"][0] == "assert" and kinds["coder1-stdin"][0] == "stdin"
    by = {e["hash"]: e for e in exs}
    # call-based tests become one JSON argument per line; list-valued stdin tests are joined lines
    assert by["taco-call"]["tests"][0] == {"input": "[1, 5, 2]", "output": "[5]"}
    assert by["code-contests-stdin"]["tests"][0] == {"input": "3\n1 5 2", "output": "5"}
    # the prompt is LiveCodeBench's user turn: the repeated system sentence removed, the starter code shown
    p = by["coder1-stdin"]["prompt"]
    assert p.startswith("### Question:\nYou are given N") and "You are an expert" not in p
    assert "Read the inputs from stdin" in p
    assert "class Solution:\n    def maxOf(self, nums: List[int]) -> int:" in by["lcb-functional"]["prompt"]
    text = render_prompt("lcb", p, None)
    assert text.startswith(SYSTEM_PROMPT) and "\\boxed" not in text


@pytest.mark.slow   # 56 sandboxed programs, 14 of them hanging to the 1 s limit
def test_reward_of_correct_wrong_crashing_and_hanging_programs_in_the_published_format():
    exs = load()
    for e in exs:
        e["time_limit_s"] = 1   # the hanging programs: 1 s per test instead of LiveCodeBench's 6
    responses, examples, labels = [], [], []
    for e in exs:
        for kind, prog in PROGRAMS[problem_of(e["hash"])].items():
            responses.append(f"<think>draft</think>\nHere:\n```python\n{prog}\n```")
            examples.append(e)
            labels.append((e["hash"], kind))
    verdicts = rewards.grade_code_batch(responses, examples, workers=2)
    got = {lab: (v.verdict, rewards.reward_of(v)) for lab, v in zip(labels, verdicts)}
    want = {lab: WANT[lab[1]] for lab in labels}
    # LeetCode-style scripts: a failed assertion is a wrong answer, the crash a runtime error
    assert got == want


def test_parallel_grading_agrees_with_serial_and_grades_repeats_once():
    exs = load()[:3]
    ok, bad = PROGRAMS["max_stdin"]["correct"], PROGRAMS["max_stdin"]["wrong"]
    responses = [f"```python\n{p}\n```" for p in (ok, bad, ok, ok, bad, ok)]
    examples = [exs[i % 3] for i in range(6)]
    serial = rewards.grade_code_batch(responses, examples, workers=1)
    parallel = rewards.grade_code_batch(responses, examples, workers=2)
    assert [v.verdict for v in serial] == [v.verdict for v in parallel] == \
        ["pass", "wrong_answer", "pass", "pass", "wrong_answer", "pass"]
    assert rewards.grade_task_batch("code", responses, examples)[1].verdict == "wrong_answer"


def test_infrastructure_failures_are_ungraded_never_wrong(monkeypatch):
    from scoring import code
    from scoring.sandbox import SandboxError
    ex = load()[0]
    prog = f"```python\n{PROGRAMS['max_stdin']['correct']}\n```"

    def broken(*a, **k):
        raise SandboxError("cannot spawn unshare")
    monkeypatch.setattr(code, "run_harness", broken)
    [v] = rewards.grade_code_batch([prog], [ex], workers=1)
    assert (v.verdict, v.correct) == (GRADER_ERROR, False) and "cannot spawn" in v.detail
    # in the worker pool: a grader that raises is grader_error too (a malformed example here)
    [v] = rewards.grade_code_batch([prog], [dict(ex, testtype="bogus")], workers=2)
    assert v.verdict == GRADER_ERROR and "testtype" in v.detail


def _write(tmp_path, rows) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_bad_rows_fail_with_file_line_and_field(tmp_path):
    good = json.loads((FIX / "rows.jsonl").read_text().splitlines()[0])
    cases = [
        (dict(good, reward_model={"ground_truth": "{not json", "style": "rule"}),
         "reward_model.ground_truth is not valid JSON"),
        (dict(good, data_source="brainfuck"), "data_source 'brainfuck' has no known test format"),
        ({k: v for k, v in good.items() if k != "data_source"}, "no field 'data_source'"),
        (dict(good, data_source="livecodebench", reward_model={"ground_truth": json.dumps(
            [{"input": "1", "output": "1", "testtype": "functional", "metadata": {}}]), "style": "rule"}),
         "reward_model.ground_truth[0].metadata.func_name is missing"),
        (dict(good, data_source="taco", reward_model={"ground_truth": json.dumps({"inputs": ["1"], "outputs": []}),
                                                      "style": "rule"}), "1 inputs but 0 outputs"),
        (dict(good, ability="math"), "field 'ability' is 'math'"),
    ]
    for bad, msg in cases:
        path = _write(tmp_path, [good, bad])
        with pytest.raises(DataError) as e:
            load(path)
        assert str(e.value).startswith(f"{path}:2: ") and msg in str(e.value), str(e.value)


def test_unsupported_test_formats_are_named_or_left_out_when_asked(tmp_path):
    with pytest.raises(DataError, match=r"unsupported.jsonl:1: data_source 'kodcode_longcot' cannot be graded here: "
                                        r"its tests are a pytest file"):
        load(FIX / "unsupported.jsonl")
    rows = [json.loads(x) for x in (FIX / "rows.jsonl").read_text().splitlines()[:2]]
    rows += [json.loads(x) for x in (FIX / "unsupported.jsonl").read_text().splitlines()]
    exs = load(_write(tmp_path, rows), ["skip_unsupported_code_rows=true"])
    assert [e["hash"] for e in exs] == ["coder1-stdin", "lcb-stdin"]


def test_dry_run_checks_template_task_data_and_reward(capsys, monkeypatch):
    from trainer.train import main
    preset = str(REPO / "trainer" / "configs" / "qwen3_4b_code_seeds_state.yaml")
    assert main(["--config", preset, "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "OK   reward: 'code' grades a known-right answer pass" in err and "config OK" in err
    assert "published columns hold prompt and reward_model.ground_truth" in err
    for over, msg in [("template=qwen-boxed", "FAIL template: template 'qwen-boxed' with task 'code': puts the math "
                                              "instruction"),
                      ("answer_key=tests", "FAIL data: 'Kwai-Klear/KlearReasoner-CodeSub-15K' has no column 'tests'"),
                      (f"train_file={FIX / 'unsupported.jsonl'}", "unsupported.jsonl:1: data_source 'kodcode_longcot'")]:
        assert main(["--config", preset, "--dry-run", over]) == 2
        err = capsys.readouterr().err
        assert msg in err and "config NOT OK" in err, err
    # local published-format data: every row read, data_sources counted
    assert main(["--config", preset, "--dry-run", f"train_file={FIX / 'rows.jsonl'}"]) == 0
    assert "OK   data: 14 rows" in capsys.readouterr().err

    def no_sandbox(*a, **k):
        raise ImportError("No module named 'scoring.sandbox.runner'")
    import trainer.preflight
    monkeypatch.setattr(trainer.preflight, "grade_code_batch", no_sandbox)   # where the dry run looks it up
    assert main(["--config", preset, "--dry-run"]) == 2
    assert "FAIL reward: the 'code' reward cannot be built: ImportError" in capsys.readouterr().err


def test_a_code_launch_stops_where_the_sandbox_is_not_fully_isolated_unless_allowed(tmp_path, capsys, monkeypatch):
    """Fail closed: without the sandbox's namespaces (the probe's verdict replaced here) the preflight's reward check
    fails for a code task, and a launch stops with one error line and exit 2 before anything is built;
    allow_unisolated=true grades (warned), and the check says the sandbox is not fully isolated."""
    import dataclasses

    from scoring.sandbox import ALLOW_UNISOLATED_ENV, host
    from trainer.preflight import check_reward
    from trainer.train import main
    monkeypatch.setattr(host, "_ISOLATION", dataclasses.replace(host.isolation(), namespaces=False,
                                                                reason="test: no unshare"))
    monkeypatch.delenv(ALLOW_UNISOLATED_ENV, raising=False)
    refusal = ("task 'minicode': code grading needs the full sandbox, which this machine does not give (test: no "
               "unshare); run as root with util-linux's unshare, or pass --allow-unisolated (allow_unisolated=true")
    check = check_reward(load_config(None, ["task=minicode", "template=raw"]))
    assert check.status == "fail" and check.detail.startswith(refusal), check
    preset = str(REPO / "trainer" / "configs" / "mini_code_onpolicy.yaml")
    assert main(["--config", preset, f"output_dir={tmp_path}"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and errors[0].startswith(f"error: reward: {refusal}"), errors
    assert not any(tmp_path.iterdir())   # nothing written
    with pytest.warns(RuntimeWarning, match="NOT fully isolated"):
        check = check_reward(load_config(None, ["task=minicode", "template=raw", "allow_unisolated=true"]))
    assert check.status == "ok" and "sandbox NOT fully isolated: test: no unshare" in check.detail, check


@pytest.mark.slow   # 24 sandboxed programs
def test_minicode_rows_carry_tests_their_solutions_pass():
    from scoring.tasks import get_task
    rows = get_task("minicode").make_examples(12, seed=3)
    assert {r["testtype"] for r in rows} == {"stdin", "functional"}
    vs = rewards.grade_task_batch("minicode", [r["solution"] for r in rows], rows)
    assert [v.verdict for v in vs] == ["pass"] * 12
    # the other kind's program, or another operation's, fails
    swapped = [rows[(i + 1) % 12]["solution"] for i in range(12)]
    assert not any(v.correct for v in rewards.grade_task_batch("minicode", swapped, rows))


@pytest.mark.slow   # an eval run, graded in the sandbox
def test_minicode_is_a_benchmark_graded_in_the_sandbox(tmp_path):
    from scoring.benchmarks import get_benchmark
    from eval.config import EvalConfig
    from eval.run import run_eval
    from inference.tiny import build_model, build_tokenizer, save_pretrained_atomic
    bench = get_benchmark("minicode")
    problems = bench.load()
    assert bench.kind == "code" and len(problems) == 200
    row = problems[0].meta["row"]
    assert bench.grade(row["solution"], problems[0]).verdict == "pass"
    assert bench.grade("print(1)", problems[0]).verdict == "wrong_answer"
    tok = build_tokenizer()
    save_pretrained_atomic(build_model("1m", tok, seed=0), tok, tmp_path / "tiny")
    res = run_eval(EvalConfig(models=[str(tmp_path / "tiny")], benchmarks=["minicode"], out=str(tmp_path / "eval"),
                              n=2, limit=3, seed=0, engine="hf", progress=False, max_tokens=16))
    [rep] = res["reports"]
    assert rep["benchmark"] == "minicode" and rep["problems"] == 3


@pytest.mark.slow   # a warm-up and RL steps, every reward a sandbox run
def test_mini_code_preset_trains_with_rewards_from_the_sandbox(tmp_path):
    """Two RL steps of the miniature code preset after a short warm-up: every reward is the verdict of a program run
    in the sandbox (none ungraded), recorded per response."""
    from contracts.records import read_rollouts
    from trainer.fsdp import Dist
    from trainer.train import train
    cfg = load_config(REPO / "trainer" / "configs" / "mini_code_seeds_state.yaml",
                      [f"output_dir={tmp_path}", "sft_steps=20", "total_steps=2", "prompts_per_step=4",
                       "samples_per_prompt=4", "seed_refresh_interval=2", "progress=false", "max_sampling_rounds=1"])
    run = train(cfg, Dist())
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2 and all(m["reward/ungraded"] == 0 for m in metrics)
    table = read_rollouts(run).to_pydict()
    rows = {k: [v for v, st in zip(vals, table["step"]) if st == 1] for k, vals in table.items()}
    verdicts = set(rows["verdict"])
    assert verdicts <= {"pass", "wrong_answer", "runtime_error", "time_limit", "no_answer"}, verdicts
    assert all((r == 1.0) == (v == "pass") for r, v in zip(rows["reward"], rows["verdict"]))
    assert set(rows["variant"]) == {"seed"}   # step 1 continues seeds cut from step 0's rollouts



@pytest.mark.slow   # a short warm-up, 3 RL steps and two held-out evaluations, every reward a sandbox run
def test_code_table_pipeline_scores_rl_on_problems_training_never_saw(tmp_path):
    """The miniature code table's pipeline (demo.addition, the on-policy row, seed 0) at a few steps: the RL pool and
    the warm-up's traces leave out every prompt of the held-out minicode split, the warm-up and the RL checkpoint are
    scored on that split by ``eval.run`` with the table's settings, every reward and verdict is a graded sandbox
    run, and the paired bootstrap the table reports is the difference of the two averages over the same problems.

    What the table's numbers say (RL raising the held-out pass rate) is a measurement of the sweep, not a test: it
    depends on where the loss-stopped warm-up lands, which moves with the CPU's float kernels. Replayed here at 30
    steps (commit 2226b63), an AVX-512 Xeon went 52.5 % -> 60.5 % (paired interval [+4.3, +11.8]) and an AVX2 EPYC,
    whose warm-up stopped at step 173 instead of 195, 65.7 % -> 55.7 % ([-16.8, -3.3]); docs/miniature.md gives the
    table's three seeds and the machine they ran on."""
    from dataclasses import replace

    from contracts.passk import paired_bootstrap
    from demo.addition import CODE, CODE_METHODS, final_checkpoint, heldout_prompts, make_data, warmup
    from demo.common import run_config
    from eval.config import EvalConfig
    from eval.run import run_eval
    from trainer.fsdp import Dist
    from trainer.train import train

    budget = replace(CODE, warmup_max_steps=40, warmup_pool=1000, total_steps=3, prompts_per_step=8,
                     eval_limit=24, eval_n=2)

    def held_out(model: Path, name: str) -> tuple[float, dict]:
        res = run_eval(EvalConfig(models=[str(model)], benchmarks=[budget.task], names=[name],
                                  out=str(tmp_path / "eval"), n=budget.eval_n, limit=budget.eval_limit, seed=0,
                                  engine="hf", progress=False), log=lambda m: None)
        [rep] = res["reports"]
        assert rep["problems"] == budget.eval_limit and not rep.get("ungraded")
        [path] = (tmp_path / "eval" / name).glob("*.jsonl")
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        assert all(len(r["correct"]) == budget.eval_n for r in rows)
        return rep["avg"], {r["problem_id"]: sum(r["correct"]) / len(r["correct"]) for r in rows}

    held = heldout_prompts(budget.task)
    assert len(held) == 131   # the split's distinct prompts (docs/miniature.md)
    train_file = make_data(tmp_path, budget, log=lambda m: None)
    pool = [json.loads(x)["prompt"] for x in train_file.read_text().splitlines() if x.strip()]
    assert len(pool) > 100 and not held & set(pool)
    warm, summary = warmup(tmp_path, budget, log=lambda m: None)
    assert summary["task"] == "minicode" and summary["threads"] == 1 and 0 < summary["steps"] <= 40
    before, b = held_out(warm, "warmup")
    [spec] = [s for s in CODE_METHODS if s.name == "code_onpolicy"]
    cfg = run_config(spec, budget, out=tmp_path, seed=0, model=warm, train_file=train_file)
    run = train(cfg, Dist())
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == budget.total_steps and all(m["reward/ungraded"] == 0 for m in metrics)
    after, a = held_out(final_checkpoint(cfg), "rl")
    assert sorted(a) == sorted(b) and len(a) == budget.eval_limit   # the same problems, paired
    assert abs(before - sum(b.values()) / len(b)) < 1e-9 and abs(after - sum(a.values()) / len(a)) < 1e-9
    gain = paired_bootstrap([a[k] for k in sorted(a)], [b[k] for k in sorted(a)])
    assert abs(gain["diff"] - (after - before)) < 1e-9 and gain["low"] <= gain["diff"] <= gain["high"]
