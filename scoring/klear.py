"""KlearReasoner's code reward, the verifier the KlearReasoner-CodeSub-15K rows were written for
(``code_reward=klear``).

Reference: Klear-Reasoner (Su et al., 2025, arXiv:2508.07629) and its verl fork, Kwai-Klear/KlearReasoner at commit
3422f6d; every ``file:line`` below is under its ``verl/utils/reward_score/``. Its DAPO reward manager calls
``dapo_wi_rllm_compute_score`` (``verl/workers/reward_manager/dapo.py:50``), which picks a verifier by the row's
``data_source`` (``__init__.py:76-98``): ``code_r1_compute.py`` for ``coder1`` rows (KlearReasoner's own, after
Code-R1), ``rllm_code_reward.py`` with ``code_utils/`` for the rllm sources. The project's default reward (``lcb``,
``scoring.rewards.grade_program``: LiveCodeBench's harness, 1 when every test passes, else 0) differs in what it pays
and in how it runs the tests; this module is the other one. docs/graders.md has the rules side by side.

**Scores** (``KLEAR_SCORES``, ``reward_config.py:4-8``): +1 a passed test, -1 a failed one, -1 no program, -0.5 and
-2.0 for a missing ``</think>`` / ``<think>``. A response's reward lies in [-2, 1]; it is not the project's [0, 1].

**Format**, checked before any test runs, in this order:

1. ``*_longcot`` rows only (``coder1``: ``"coder1_longcot" in data_source``, ``__init__.py:79``; rllm: the names
   ending in ``_longcot``, ``__init__.py:90-98``): no ``</think>`` in the response -> -0.5
   (``code_r1_compute.py:165-168``, ``rllm_code_reward.py:445-448``); else no ``<think>`` -> -2.0 (``:170-173``,
   ``:450-452``). ``prompt_opens_think=True`` counts the ``<think>`` a chat template writes at the end of the prompt
   (Qwen3-*-Thinking-2507's does, so its responses never contain one); KlearReasoner's model opened its own.
2. The program: ``coder1``: the last ```` ```python ```` block after the first ``</think>`` (the pattern of
   ``code_r1_compute.py:20``: tag exactly ``python``, nothing before the thinking ends); rllm: the last fenced block
   of any tag anywhere in the response (``rllm_code_reward.py:37``). None, or an empty one -> -1 (``coder1``:
   ``code_r1_compute.py:59-61``; rllm's ``format_error_reward`` -0.5 at ``:371`` is replaced by -1 at ``:472``,
   since the output is not correct).

**Tests**:

- ``coder1`` stdin rows (``{inputs, outputs}``): at most ``max_test_cases`` tests (the row's, else 16:
  ``code_r1_compute.py:15, :67``), each in its own process as a ``__main__`` script with a real stdin and no
  prelude, with the row's ``timeout`` per test (else 35 s: ``:66``, ``code_r1_reward/firejail_exec.py:10``). A test
  passes when the program exits 0 and ``stdout.strip() == expected.strip()`` (``:136``): exact text, no number
  tolerance. Every selected test runs; the score is the mean of +1/-1 (``:161``), i.e. ``2 * passed / run - 1``
  (3 of 4 tests: 0.5, not 0.75).
- ``coder1`` functional rows: test code appended to the solution (with the LeetCode helpers) as one script, passing
  when it exits 0 within the row's timeout; a string is one script, one +1/-1 (``:79-88``); a list is sampled like
  the stdin tests, one script each, mean of +1/-1 (``:93-105``).
- rllm sources: +1 only when every test passes, else -1 (``rllm_code_reward.py:472``).
  ``livecodebench``: LiveCodeBench's harness (``scoring.code``), every test, 7 s each (``:243``).
  ``taco``/``apps``/``code_contests``/``primeintellect``: at most 32 tests, those with the shortest inputs
  (``:100, :107``: an ascending sort, whatever its comment says; for call-based tests the input's length is its
  number of arguments, so the first 32 in order), 7 s each (``:72``), stopping at the first failure; stdin programs
  run as scripts after a prelude of imports and their output is compared by ``taco_output_matches``; call-based
  programs are called and compared as TACO does (``scoring.code``, ``match="taco"``). ``codeforces``: the same
  selection and time, output compared exactly after strip (``code_utils/codeforces.py:533-536``). For both, an exit
  status other than 0 does not fail a test whose output is right (``code_utils/taco.py:403``: ``exec_code = 999``
  whatever the return code). ``leetcode``: solution + test code as one script, 30 s
  (``code_utils/firejail_exec.py:16``).

**Sampling** (``coder1``): KlearReasoner draws with Python's unseeded ``random.sample`` on every call
(``code_r1_compute.py:36, :94``), so two responses to one prompt (and one response graded twice) can meet different
tests. Here the draw is seeded by the sha256 of the row's tests (``sample_indices``): a row is always graded on the
same subset, so a reward is a function of (row, response) and a group's responses are compared on the same tests.

A row's own ``timeout`` (``row_limits``) replaces the per-test time above for every source, and its
``max_test_cases`` the 16 of ``coder1`` and the 32 of the TACO family and ``codeforces``; KlearReasoner reads them only
for ``coder1`` rows, and the rllm formats have no place for them. The time and memory
limits are the sandbox's (``scoring.sandbox``; memory ``CODE_LIMITS.memory_mb`` of address space, where
KlearReasoner's firejail gives 1 GiB to coder1 programs and 2 GiB to TACO's). A sandbox that cannot run is
``grader_error`` (ungraded), where KlearReasoner's manager scores a crashed or timed-out grading -1 (``dapo.py``).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from dataclasses import dataclass
from typing import Callable, Sequence

from scoring.code import (LCB_IMPORT_PRELUDE, LEETCODE_PRELUDE, CodeTest, grade_assert_script, grade_code,
                          program_packages, short_repr, verdict_of_status)
from scoring.limits import CODE_LIMITS
from scoring.sandbox import CASE_GRACE_S, DEFAULT_MAX_OUTPUT, SETUP_GRACE_S, RunResult, SandboxError, run_cases
from scoring.verdict import GRADER_ERROR, Verdict

__all__ = ["KLEAR_SCORES", "KlearScores", "RLLM_SOURCES", "RowLimits", "extract_code_klear", "grade_klear_example",
           "grade_klear_program", "klear_format", "klear_source", "klear_time_bound", "row_limits", "sample_indices",
           "taco_output_matches", "tests_key"]


@dataclass(frozen=True)
class KlearScores:
    correct: float = 1.0          # ScoringConfig.correct_score (reward_config.py:4): a passed test / problem
    incorrect: float = -1.0       # incorrect_score (:5): a failed test / problem
    format_error: float = -1.0    # format_error_score (:6): no program in the response
    no_think_open: float = -2.0   # wo_bos_think (:7): a *_longcot response without <think>
    no_think_close: float = -0.5  # wo_eos_think (:8): a *_longcot response without </think>


KLEAR_SCORES = KlearScores()

# the rllm data sources KlearReasoner grades and the sandbox can run (__init__.py:89-90; kodcode, humanevalplus and
# ifeval are refused at load time by trainer.data)
RLLM_SOURCES = ("livecodebench", "taco", "apps", "code_contests", "primeintellect", "codeforces", "leetcode")
_TACO_FAMILY = ("taco", "apps", "code_contests", "primeintellect")   # graded by code_utils/taco.py's run_test

_CODER1_CODE = re.compile(r"</think>.*```python\n(.*?)\n```", re.DOTALL)   # code_r1_compute.py:20
_RLLM_CODE = re.compile(r"```(?:\w+)?\n(.*?)```", re.DOTALL)                # rllm_code_reward.py:37


def klear_source(data_source: str) -> tuple[str, bool]:
    """(verifier, longcot) of a row: ``coder1`` or an rllm source, and whether the think-block penalties apply
    (``__init__.py:76-98``: ``coder1`` exactly, else ``coder1_longcot`` anywhere in the name; an rllm name, with or
    without the ``_longcot`` suffix)."""
    ds = str(data_source)
    if ds == "coder1":
        return "coder1", False
    if "coder1_longcot" in ds:
        return "coder1", True
    base = ds[:-len("_longcot")] if ds.endswith("_longcot") else ds
    if base in RLLM_SOURCES:
        return base, base != ds
    raise ValueError(f"data_source '{ds}' has no KlearReasoner code verifier here (known: coder1, coder1_longcot*, "
                     f"{', '.join(RLLM_SOURCES)}, each optionally with _longcot)")


@dataclass(frozen=True)
class RowLimits:
    timeout_s: float | None       # the row's per-test seconds; None: the reward's default
    max_test_cases: int | None    # the row's cap on the tests graded; None: the reward's default


def _ground_truth_object(example: dict) -> dict | None:
    raw = example.get("answer")
    if raw is None and isinstance(example.get("reward_model"), dict):
        raw = example["reward_model"].get("ground_truth")
    if isinstance(raw, dict):
        return raw
    # only a ground truth naming a limit is parsed (a row's tests can be megabytes; this runs once per response)
    if isinstance(raw, str) and ('"timeout"' in raw or '"max_test_cases"' in raw):
        try:
            gt = json.loads(raw)
        except json.JSONDecodeError:
            return None
        return gt if isinstance(gt, dict) else None
    return None


def row_limits(example: dict) -> RowLimits:
    """The row's own per-test time limit and test cap: the normalized fields ``time_limit_s`` / ``max_test_cases``
    when set, else ``timeout`` / ``max_test_cases`` of a ground truth that is a JSON object (``coder1`` rows may
    carry them: ``code_r1_compute.py:66-67``). ValueError for a value that is not a positive number / integer."""
    t, m = example.get("time_limit_s"), example.get("max_test_cases")
    if t is None or m is None:
        gt = _ground_truth_object(example) or {}
        t = gt.get("timeout") if t is None else t
        m = gt.get("max_test_cases") if m is None else m
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0):
        raise ValueError(f"the row's timeout must be a positive number of seconds, got {t!r}")
    if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
        raise ValueError(f"the row's max_test_cases must be a positive integer, got {m!r}")
    return RowLimits(None if t is None else float(t), m)


def tests_key(items: Sequence) -> str:
    """What identifies a row's tests for sampling: its normalized tests (``{input, output}`` / ``CodeTest``) or test
    scripts, as JSON."""
    def one(t):
        if isinstance(t, str):
            return t
        return [t.input, t.output] if isinstance(t, CodeTest) else [str(t["input"]), str(t["output"])]
    return json.dumps([one(t) for t in items])


def sample_indices(n: int, k: int, key: str) -> list[int]:
    """At most ``k`` of ``range(n)``, increasing, drawn without replacement by ``random.Random`` seeded with the
    first 8 bytes of sha256(``key``): the same row always gives the same tests, on every machine and run."""
    if n <= k:
        return list(range(n))
    seed = int.from_bytes(hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()[:8], "big")
    return sorted(random.Random(seed).sample(range(n), k))


def _shortest_indices(tests: Sequence[CodeTest], k: int, kind: str) -> list[int]:
    # rllm_code_reward.py:100/:107: the k shortest inputs (a stable ascending sort by len(input)); a call-based
    # input's len() is its number of arguments, one per line here
    size = (lambda t: t.input.count("\n") + 1) if kind == "functional" else (lambda t: len(t.input))
    return sorted(sorted(range(len(tests)), key=lambda i: size(tests[i]))[:k])


def extract_code_klear(response: str, verifier: str) -> str | None:
    """The program KlearReasoner grades (module docstring, Format 2)."""
    if verifier == "coder1":
        m = _CODER1_CODE.search(response)
        return m.group(1) if m else None
    blocks = _RLLM_CODE.findall(response)
    return blocks[-1].strip() if blocks else None


def klear_format(response: str, data_source: str, *, prompt_opens_think: bool = False) -> Verdict | str:
    """The response's format check (module docstring, Format): the penalty's ``Verdict`` (``no_answer``, its
    ``score`` the penalty), or the program to run."""
    verifier, longcot = klear_source(data_source)
    s = KLEAR_SCORES
    if longcot:
        if "</think>" not in response:
            return Verdict(False, "no_answer", None, "no </think> in the response (KlearReasoner's wo_eos_think)",
                           s.no_think_close)
        if "<think>" not in response and not prompt_opens_think:
            return Verdict(False, "no_answer", None, "no <think> in the response (KlearReasoner's wo_bos_think)",
                           s.no_think_open)
    program = extract_code_klear(response, verifier)
    if not program:
        where = "a ```python block after </think>" if verifier == "coder1" else "a fenced code block"
        return Verdict(False, "no_answer", None, f"no program: the response has no {where}", s.format_error)
    return program


def _close(a: float, b: float) -> bool:
    # numpy.isclose(a, b) at its defaults: |a - b| <= 1e-8 + 1e-5 * |b| (b the expected); NaN is close to nothing and
    # an infinity only to itself
    if a == b:
        return True
    if math.isnan(a) or math.isnan(b) or math.isinf(a) or math.isinf(b):
        return False
    return abs(a - b) <= 1e-8 + 1e-5 * abs(b)


def _float(s: str) -> float | None:
    try:
        return float(s)
    except ValueError:
        return None


def taco_output_matches(got: str, expected: str) -> bool:
    """TACO's stdout comparison as KlearReasoner runs it (``code_utils/taco.py:606-652``,
    ``stripped_string_compare``): equal after strip; or both whole outputs numbers within ``numpy.isclose``; or,
    with blank lines dropped and every line stripped, as many lines, each with as many whitespace-separated tokens,
    every token equal or both numbers within ``numpy.isclose`` (rtol 1e-5, atol 1e-8). Not reproduced: there a pair
    of differing tokens that are not both numbers is let through (its ``except`` only ``pass``-es, ``:650``), and
    ``compare_std_results`` (``:476-604``) adds set- and character-level fallbacks; both pass wrong answers."""
    g, w = got.strip(), expected.strip()
    if g == w:
        return True
    fg, fw = _float(g), _float(w)
    if fg is not None and fw is not None:
        return _close(fg, fw)
    g_lines = [line.strip() for line in g.split("\n") if line.strip()]
    w_lines = [line.strip() for line in w.split("\n") if line.strip()]
    if len(g_lines) != len(w_lines):
        return False
    for gl, wl in zip(g_lines, w_lines):
        gt, wt = gl.split(), wl.split()
        if len(gt) != len(wt):
            return False
        for a, b in zip(gt, wt):
            if a != b:
                fa, fb = _float(a), _float(b)
                if fa is None or fb is None or not _close(fa, fb):
                    return False
    return True


def _exact_matches(got: str, expected: str) -> bool:
    return got.strip() == expected.strip()   # code_r1_compute.py:136, code_utils/codeforces.py:533-536


# ---- running the tests ----------------------------------------------------------------------------------------
Outcome = tuple[str, str]   # (verdict of one test: pass | wrong_answer | runtime_error | ..., why it failed)


def _tests(example: dict) -> list[CodeTest]:
    return [t if isinstance(t, CodeTest) else CodeTest(str(t["input"]), str(t["output"])) for t in example["tests"]]


def _run_stdin(program: str, tests: Sequence[CodeTest], *, prelude: str, timeout_s: float,
               judge: Callable[[RunResult, str], Outcome], stop_at_first_failure: bool) -> list[Outcome]:
    """Each test in its own process (``scoring.sandbox.run_cases``), judged as it finishes."""
    outcomes: dict[int, Outcome] = {}

    def on_case(i: int, r: RunResult) -> bool:
        outcomes[i] = judge(r, tests[i].output)
        return outcomes[i][0] == "pass" or not stop_at_first_failure

    longest = max(len(t.output.encode()) for t in tests)
    packages, _ = program_packages(program)
    run_cases(program, [t.input for t in tests], mode="stdin", on_case=on_case, timeout_s=timeout_s,
              memory_mb=CODE_LIMITS.memory_mb, prelude=prelude,
              max_output_bytes=max(DEFAULT_MAX_OUTPUT, 2 * longest + 4096), packages=packages)
    return [outcomes[i] for i in sorted(outcomes)]


def _why(r: RunResult) -> str:
    tail = r.stderr.strip().splitlines()[-1:] if r.stderr.strip() else []
    return r.detail + (f"; {tail[0][:200]}" if tail else "")


def _strict_judge(r: RunResult, expected: str) -> Outcome:
    # coder1: a test passes when the program exits 0 and prints the expected text (code_r1_compute.py:136)
    if r.status != "ok":
        return verdict_of_status(r.status), _why(r)
    if _exact_matches(r.stdout, expected):
        return "pass", ""
    return "wrong_answer", f"{short_repr(r.stdout.strip())} != {short_repr(expected.strip())}"


def _output_judge(matches: Callable[[str, str], bool]) -> Callable[[RunResult, str], Outcome]:
    # TACO / Codeforces (rllm): the output is compared whatever the exit status, unless the test ran out of time
    # or printed past the limit (code_utils/taco.py:403-408)
    def judge(r: RunResult, expected: str) -> Outcome:
        if r.status in ("time_limit", "output_limit"):
            return verdict_of_status(r.status), _why(r)
        if matches(r.stdout, expected):
            return "pass", ""
        name = "wrong_answer" if r.status == "ok" else verdict_of_status(r.status)
        return name, f"{short_repr(r.stdout.strip())} != {short_repr(expected.strip())}"
    return judge


def _mean_verdict(outcomes: list[Outcome]) -> Verdict:
    """coder1's score: the mean of +1 / -1 over the tests run (code_r1_compute.py:161)."""
    s, n = KLEAR_SCORES, len(outcomes)
    passed = sum(1 for name, _ in outcomes if name == "pass")
    score = (passed * s.correct + (n - passed) * s.incorrect) / n
    if passed == n:
        return Verdict(True, "pass", None, f"{n}/{n} tests", score)
    i = next(i for i, (name, _) in enumerate(outcomes) if name != "pass")
    name, why = outcomes[i]
    return Verdict(False, name, None, f"{passed}/{n} tests passed; test {i + 1}/{n}: {name}: {why}", score)


def _all_or_nothing(outcomes: list[Outcome], n: int) -> Verdict:
    s = KLEAR_SCORES
    for i, (name, why) in enumerate(outcomes):
        if name != "pass":
            return Verdict(False, name, None, f"test {i + 1}/{n}: {name}: {why}", s.incorrect)
    assert len(outcomes) == n, f"{len(outcomes)} outcomes for {n} tests"
    return Verdict(True, "pass", None, f"{n}/{n} tests", s.correct)


def _scored(v: Verdict) -> Verdict:
    return Verdict(v.correct, v.verdict, v.answer, v.detail, KLEAR_SCORES.correct if v.correct else
                   KLEAR_SCORES.incorrect)


def _scripts(program: str, scripts: Sequence[str], timeout_s: float) -> list[Outcome]:
    out = []
    for script in scripts:
        v = grade_assert_script(program, script, prelude=LEETCODE_PRELUDE, timeout_s=timeout_s,
                                memory_mb=CODE_LIMITS.memory_mb)
        why = v.detail[len(v.verdict) + 2:] if v.detail.startswith(f"{v.verdict}: ") else v.detail
        out.append((v.verdict, why))
    return out


def _grade_coder1(program: str, example: dict, lim: RowLimits) -> Verdict:
    t = lim.timeout_s or CODE_LIMITS.klear_coder1_test_s
    k = lim.max_test_cases or CODE_LIMITS.klear_coder1_max_tests
    kind = example.get("testtype", "stdin")
    if kind == "assert":
        scripts = list(example["test_scripts"])
        chosen = [scripts[i] for i in sample_indices(len(scripts), k, tests_key(scripts))]
        return _mean_verdict(_scripts(program, chosen, t))
    if kind != "stdin":
        raise ValueError(f"a coder1 row's tests are stdin or test code, got testtype {kind!r}")
    tests = _tests(example)
    chosen = [tests[i] for i in sample_indices(len(tests), k, tests_key(tests))]
    return _mean_verdict(_run_stdin(program, chosen, prelude="", timeout_s=t, judge=_strict_judge,
                                    stop_at_first_failure=False))


def _grade_rllm(program: str, example: dict, verifier: str, lim: RowLimits) -> Verdict:
    kind = example.get("testtype", "stdin")
    if verifier == "leetcode":
        scripts = list(example["test_scripts"])
        return _all_or_nothing(_scripts(program, scripts, lim.timeout_s or CODE_LIMITS.klear_leetcode_script_s),
                               len(scripts))
    t = lim.timeout_s or CODE_LIMITS.klear_rllm_test_s
    tests = _tests(example)
    if verifier == "livecodebench":
        return _scored(grade_code(program, tests, kind=kind, fn_name=example.get("fn_name"), timeout_s=t,
                                  memory_mb=CODE_LIMITS.memory_mb, harness="lcb", match="lcb"))
    chosen = [tests[i] for i in _shortest_indices(tests, lim.max_test_cases or CODE_LIMITS.klear_rllm_max_tests, kind)]
    if kind == "functional":
        return _scored(grade_code(program, chosen, kind="functional", fn_name=example.get("fn_name"), timeout_s=t,
                                  memory_mb=CODE_LIMITS.memory_mb, harness="script", match="taco"))
    matches = taco_output_matches if verifier in _TACO_FAMILY else _exact_matches
    outcomes = _run_stdin(program, chosen, prelude=LCB_IMPORT_PRELUDE, timeout_s=t, judge=_output_judge(matches),
                          stop_at_first_failure=True)
    return _all_or_nothing(outcomes, len(chosen))


def grade_klear_program(program: str, example: dict) -> Verdict:
    """KlearReasoner's verdict and ``score`` for an extracted ``program`` on ``example`` (the normalized tests of
    ``scoring.rewards`` plus the row's ``data_source``). A sandbox that cannot run is ``grader_error``."""
    verifier, _ = klear_source(example["data_source"])
    lim = row_limits(example)
    try:
        if verifier == "coder1":
            return _grade_coder1(program, example, lim)
        return _grade_rllm(program, example, verifier, lim)
    except SandboxError as e:
        return Verdict(False, GRADER_ERROR, None, f"sandbox: {e}"[:2000])


def grade_klear_example(response: str, example: dict, *, prompt_opens_think: bool = False) -> Verdict:
    """KlearReasoner's code reward of ``response``: the format check, then the tests (module docstring)."""
    got = klear_format(response, example["data_source"], prompt_opens_think=prompt_opens_think)
    return got if isinstance(got, Verdict) else grade_klear_program(got, example)


def klear_time_bound(example: dict) -> float:
    """Seconds the sandbox may take on one response to ``example`` under this reward (set-up and per-test graces
    included): the worker pool's hard timeout sits above it."""
    verifier, _ = klear_source(example["data_source"])
    lim = row_limits(example)
    kind = example.get("testtype", "stdin")
    n = len(example["test_scripts"]) if kind == "assert" else len(example["tests"])
    if verifier == "coder1":
        t = lim.timeout_s or CODE_LIMITS.klear_coder1_test_s
        n = min(n, lim.max_test_cases or CODE_LIMITS.klear_coder1_max_tests)
    elif verifier == "leetcode":
        t = lim.timeout_s or CODE_LIMITS.klear_leetcode_script_s
    else:
        t = lim.timeout_s or CODE_LIMITS.klear_rllm_test_s
        if verifier == "livecodebench":
            return SETUP_GRACE_S + (t + 1) * n + 5 + CASE_GRACE_S
        n = min(n, lim.max_test_cases or CODE_LIMITS.klear_rllm_max_tests)
    if kind == "assert":
        return n * (SETUP_GRACE_S + t + CASE_GRACE_S)
    return SETUP_GRACE_S + n * (t + CASE_GRACE_S)
