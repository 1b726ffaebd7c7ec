"""Tiny programming problems a character-level model can learn to solve, graded by running its program.

The miniature of the paper's code setting (Table 2): the reward is the same as for real code data, the
response's program run on the problem's tests in the sandbox (``scoring.rewards.grade_code_example``:
LiveCodeBench's harness and comparison, 1.0 only when every test passes). Two kinds of problem::

    stdin       prompt    "read mul 7\\n"
                solution  "```python\\na,b=map(int,input().split())\\nprint(a*b+7)\\n```"
                tests     stdin "4 9\\n" -> stdout "43"  (three random pairs)
    functional  prompt    "def g max 5\\n"
                solution  "```python\\ndef g(a,b):\\n    return max(a,b)+5\\n```"
                tests     input "3\\n8" (one JSON argument per line) -> output "13"

The operation word maps to an expression of ``a`` and ``b`` (``OPS``: add a+b, sub a-b, mul a*b, max, min,
mod a%b) and the program adds the constant ``k``; the model has to translate the word, copy the constant and
the function name, and write the input handling of the kind. Tests draw a and b from 1..20 with a != b, so no
two operations agree on all of them, and ``b >= 1`` (``mod``). A program that reads the wrong input, prints the
wrong value, crashes or loops fails (``wrong_answer``, ``runtime_error``, ``time_limit``).

Difficulty: ``max_k`` (constants 0..max_k, default 9), ``n_ops`` (the first n operations of ``OPS``, default all
6), ``functional_percent`` (the share of functional problems,
default 50), ``n_tests`` (default 3).
"""

from __future__ import annotations

import random

NAME = "minicode"
DIFFICULTY = {"max_k": 9, "n_ops": 6, "functional_percent": 50, "n_tests": 3}

OPS = {"add": "a+b", "sub": "a-b", "mul": "a*b", "max": "max(a,b)", "min": "min(a,b)", "mod": "a%b"}
FN_NAMES = ("f", "g", "h", "calc")
KINDS = ("stdin", "functional")


def _value(op: str, a: int, b: int, k: int) -> int:
    return eval(OPS[op], {}, {"a": a, "b": b}) + k   # our own expressions, never model text


def program(kind: str, op: str, k: int, fn_name: str = "f") -> str:
    """The solver program of a problem (what the supervised warm-up teaches)."""
    expr = f"{OPS[op]}+{k}"
    if kind == "stdin":
        return f"a,b=map(int,input().split())\nprint({expr})"
    return f"def {fn_name}(a,b):\n    return {expr}"


def format_prompt(kind: str, op: str, k: int, fn_name: str = "f") -> str:
    return f"read {op} {k}\n" if kind == "stdin" else f"def {fn_name} {op} {k}\n"


def make_examples(n: int, *, seed: int, max_k: int = 9, n_ops: int = 6, functional_percent: int = 50,
                  n_tests: int = 3) -> list[dict]:
    """``n`` problems, a deterministic function of the arguments. Rows: ``id``, ``prompt``, ``answer`` (the
    solver program), ``solution`` (it in a python block), and the normalized test fields of
    ``scoring.rewards`` (``testtype``, ``tests``, ``fn_name``)."""
    if not 0 <= functional_percent <= 100:
        raise ValueError(f"functional_percent must lie in [0, 100], got {functional_percent}")
    if not 1 <= n_ops <= len(OPS):
        raise ValueError(f"n_ops must lie in [1, {len(OPS)}], got {n_ops}")
    ops = list(OPS)[:n_ops]
    if max_k < 0 or n_tests < 1 or n < 0:
        raise ValueError(f"need n >= 0, max_k >= 0 and n_tests >= 1, got n={n}, max_k={max_k}, n_tests={n_tests}")
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        kind = "functional" if rng.random() * 100 < functional_percent else "stdin"
        op, k = rng.choice(ops), rng.randint(0, max_k)
        fn = rng.choice(FN_NAMES) if kind == "functional" else None
        tests = []
        for _ in range(n_tests):
            a, b = rng.sample(range(1, 21), 2)
            out = str(_value(op, a, b, k))
            tests.append({"input": f"{a} {b}\n", "output": out} if kind == "stdin"
                         else {"input": f"{a}\n{b}", "output": out})
        prog = program(kind, op, k, fn or "f")
        row = {"id": f"minicode-s{seed}-{i:06d}", "prompt": format_prompt(kind, op, k, fn or "f"), "answer": prog,
               "solution": f"```python\n{prog}\n```", "testtype": kind, "tests": tests}
        if fn:
            row["fn_name"] = fn
        rows.append(row)
    return rows


def reward(response: str, example: dict) -> float:
    """1.0 iff the response's program passes every test of ``example`` in the sandbox, with ``scoring.code``'s
    harness and default limits (the trainer and ``eval`` grade through ``scoring.rewards.grade_code_example``
    instead, which names a sandbox failure ``grader_error``; here a sandbox failure raises ``SandboxError``;
    scoring.rewards imports this package, so this module does not import it back)."""
    from scoring.code import extract_code, grade_code
    v = grade_code(extract_code(response), example["tests"], kind=example["testtype"], fn_name=example.get("fn_name"))
    return 1.0 if v.correct else 0.0
