"""Countdown: reach a target from 3-4 given numbers with + - * and exact /; verifiable reward.

Format::

    prompt    "Make 20 from 8 3 4\\n"
    solution  "8*3=24\\n24-4=20\\n= (8*3)-4"
    answer    "20"
    numbers   [8, 3, 4]      target 20      n_solutions 3   (the others: "(8-3)*4", "(4*3)+8")

A step line is ``x op y=z`` (operands and result non-negative integers, larger operand first in the
solver's traces); the response ends with the line ``= EXPR``, an expression over the given numbers with
``+ - * / ( )`` (the solver parenthesises every compound operand).

A search variant (``search`` = S > 0, after Stream of Search, Gandhi et al. 2024, arXiv 2404.03683) writes traces
that explore and backtrack: before the solving path, a number of failed attempts drawn uniformly in [0, S], each a
whole path (every number used) whose value misses the target, closed by a line ``no``::

    solution  "8+3=11\n11+4=15\nno\n8*3=24\n24-4=20\n= (8*3)-4"

so a cut in the middle of a response leaves the outcome to the continuation. Its rows carry ``search`` (S); the
reward accepts ``no`` lines only in such rows, where each one gives every given number back (the next attempt
starts from them) and the final ``= EXPR`` is checked as always. The problems (numbers, targets, ids) are those of
``search = 0`` with the same seed and difficulty: the failed attempts are drawn from a stream of their own.

Rules (the reward checks all of them; any valid path scores 1.0):
- **every given number is used exactly once** in the final expression (as in TinyZero's Countdown); a number
  given twice may be used twice;
- arithmetic is exact on non-negative integers: every intermediate value of the expression, evaluated with
  the usual precedence and left-associativity, must be a non-negative integer (so ``3-8+10`` is rejected
  and ``/`` must divide exactly, divisor non-zero);
- the expression evaluates to the target;
- each step line before it must be correct arithmetic on available operands: the given numbers and the
  results of earlier steps, each usable once (steps are the model's scratchpad; none are required, but a
  wrong one makes the response wrong); in a search row (``search`` > 0) a ``no`` line makes the given numbers
  the available operands again.
Blank lines and spaces inside lines are ignored; any other line makes the response wrong.

Generator: draws a count in [``min_numbers``, ``max_numbers``] and numbers uniformly in [``min_number``,
``max_number``], enumerates every expression that uses all of them (the solver), and picks a target
uniformly among the reachable values in [``min_target``, ``max_target``] (redrawing the numbers when there
is none), so every example is solvable. ``n_solutions`` counts the distinct expressions (up to operand order
of commutative operations) that reach it; the ``solution`` column is one of them drawn with the seed.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Iterator

NAME = "countdown"
DIFFICULTY = {  # defaults of make_examples' keyword arguments
    "min_numbers": 3, "max_numbers": 4, "min_number": 1, "max_number": 20, "min_target": 10, "max_target": 100,
    "search": 0,
}
BACKTRACK = "no"   # the line that closes a failed attempt in a search trace

_STEP = re.compile(r"(\d+)([-+*/])(\d+)=(\d+)")
_TOKEN = re.compile(r"\d+|[-+*/()]")
_MAX_TRIES = 10_000


def format_prompt(numbers: list[int], target: int) -> str:
    return f"Make {target} from {' '.join(map(str, numbers))}\n"


def _apply(x: int, op: str, y: int) -> int | None:
    """x op y under the task's rules (non-negative integers, exact division); None when not allowed."""
    if op == "+":
        return x + y
    if op == "*":
        return x * y
    if op == "-":
        return x - y if x >= y else None
    if op == "/":
        return x // y if y != 0 and x % y == 0 else None
    raise AssertionError(op)


# --------------------------------------------------------------------------------------------- solver
# An item is (value, expression, is_leaf); a path is the tuple of step strings that built the expression.


def _search(items: tuple, steps: tuple) -> Iterator[tuple[int, str, tuple[str, ...]]]:
    if len(items) == 1:
        yield items[0][0], items[0][1], steps
        return
    for i in range(len(items)):
        for j in range(i + 1, len(items)):
            a, b = items[i], items[j]
            if (a[0], a[1]) < (b[0], b[1]):
                a, b = b, a  # larger value first (ties: a fixed order) so x-y and x/y are the allowed ones
            rest = items[:i] + items[i + 1 : j] + items[j + 1 :]
            ea = a[1] if a[2] else f"({a[1]})"
            eb = b[1] if b[2] else f"({b[1]})"
            for op in "+-*/":
                v = _apply(a[0], op, b[0])
                if v is None:
                    continue
                item = (v, f"{ea}{op}{eb}", False)
                yield from _search(rest + (item,), steps + (f"{a[0]}{op}{b[0]}={v}",))


def solve(numbers: list[int]) -> dict[int, dict[str, tuple[str, ...]]]:
    """Every value reachable using all ``numbers`` exactly once -> {expression: steps}.

    Expressions are canonical (larger operand first, compound operands parenthesised), so two entries for
    one value are two genuinely different solutions (different trees or different operands).
    """
    out: dict[int, dict[str, tuple[str, ...]]] = {}
    leaves = tuple((x, str(x), True) for x in numbers)
    for value, expr, steps in _search(leaves, ()):
        out.setdefault(value, {}).setdefault(expr, steps)
    return out


def make_examples(
    n: int,
    *,
    seed: int,
    min_numbers: int = 3,
    max_numbers: int = 4,
    min_number: int = 1,
    max_number: int = 20,
    min_target: int = 10,
    max_target: int = 100,
    search: int = 0,
) -> list[dict]:
    """``n`` solvable Countdown problems, a deterministic function of the arguments.

    Rows: ``id``, ``prompt``, ``answer`` (the target as a string), ``solution`` (steps then ``= EXPR``; with
    ``search`` > 0, failed attempts before them), ``numbers``, ``target``, ``n_solutions`` and, when ``search`` > 0,
    ``search``.
    """
    if not 2 <= min_numbers <= max_numbers <= 5:  # the exhaustive solver is exponential in the count
        raise ValueError(f"need 2 <= min_numbers <= max_numbers <= 5, got {min_numbers}, {max_numbers}")
    if not 0 <= min_number <= max_number:
        raise ValueError(f"need 0 <= min_number <= max_number, got {min_number}, {max_number}")
    if not 0 <= min_target <= max_target:
        raise ValueError(f"need 0 <= min_target <= max_target, got {min_target}, {max_target}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if search < 0:
        raise ValueError(f"search must be >= 0, got {search}")
    rng = random.Random(seed)
    detours = random.Random(f"countdown-search-{seed}")   # its own stream: the problems are search = 0's
    rows = []
    for i in range(n):
        for _ in range(_MAX_TRIES):
            count = rng.randint(min_numbers, max_numbers)
            numbers = [rng.randint(min_number, max_number) for _ in range(count)]
            solutions = solve(numbers)
            targets = sorted(v for v in solutions if min_target <= v <= max_target)
            if targets:
                break
        else:
            raise ValueError(
                f"no reachable target in [{min_target}, {max_target}] after {_MAX_TRIES} draws of numbers in "
                f"[{min_number}, {max_number}]; widen the target range"
            )
        target = rng.choice(targets)
        paths = solutions[target]
        expr = rng.choice(sorted(paths))
        lines = paths[expr] + (f"= {expr}",)
        if search:
            lines = _failed_attempts(solutions, target, search, detours) + lines
        row = {
            "id": f"countdown-s{seed}-{i:06d}",
            "prompt": format_prompt(numbers, target),
            "answer": str(target),
            "solution": "\n".join(lines),
            "numbers": numbers,
            "target": target,
            "n_solutions": len(paths),
        }
        if search:
            row["search"] = search
        rows.append(row)
    return rows


def _failed_attempts(solutions: dict[int, dict[str, tuple[str, ...]]], target: int, search: int,
                     rng: random.Random) -> tuple[str, ...]:
    """A search trace's detours: k ~ Uniform{0..search} distinct whole paths that miss ``target`` (fewer when the
    numbers have fewer), in random order, each closed by a ``no`` line."""
    misses = sorted({steps for value, exprs in solutions.items() if value != target for steps in exprs.values()})
    k = min(rng.randint(0, search), len(misses))
    return tuple(line for steps in rng.sample(misses, k) for line in (*steps, BACKTRACK))


# --------------------------------------------------------------------------------------------- reward


class _Invalid(Exception):
    pass


def evaluate_expression(expr: str) -> tuple[int, list[int]]:
    """Value and leaf numbers of ``expr`` under the task's rules; raises ValueError when it breaks them."""
    tokens = _TOKEN.findall(expr)
    if "".join(tokens) != expr.replace(" ", "") or not tokens:
        raise ValueError(f"not an arithmetic expression: {expr!r}")
    pos = 0
    leaves: list[int] = []

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise _Invalid("unexpected end")
        pos += 1
        return tokens[pos - 1]

    def factor() -> int:
        tok = take()
        if tok == "(":
            v = sum_()
            if take() != ")":
                raise _Invalid("missing )")
            return v
        if tok.isdigit():
            leaves.append(int(tok))
            return int(tok)
        raise _Invalid(f"unexpected {tok!r}")

    def product() -> int:
        v = factor()
        while peek() in ("*", "/"):
            op = take()
            w = _apply(v, op, factor())
            if w is None:
                raise _Invalid("inexact division")
            v = w
        return v

    def sum_() -> int:
        v = product()
        while peek() in ("+", "-"):
            op = take()
            w = _apply(v, op, product())
            if w is None:
                raise _Invalid("negative intermediate")
            v = w
        return v

    try:
        value = sum_()
    except (_Invalid, RecursionError) as e:
        raise ValueError(f"invalid expression {expr!r}: {e}") from None
    if pos != len(tokens):
        raise ValueError(f"trailing tokens in {expr!r}")
    return value, leaves


def reward(response: str, example: dict) -> float:
    """1.0 iff the steps are valid and the final ``= EXPR`` uses each given number once and hits the target."""
    lines = [line.replace(" ", "") for line in response.splitlines()]
    lines = [line for line in lines if line]
    if not lines or not lines[-1].startswith("="):
        return 0.0
    available = Counter(example["numbers"])
    backtracks = int(example.get("search") or 0) > 0
    for line in lines[:-1]:
        if backtracks and line == BACKTRACK:
            available = Counter(example["numbers"])
            continue
        m = _STEP.fullmatch(line)
        if not m:
            return 0.0
        x, op, y, z = int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
        available[x] -= 1
        available[y] -= 1
        if available[x] < 0 or available[y] < 0 or _apply(x, op, y) != z:
            return 0.0
        available[z] += 1
    try:
        value, leaves = evaluate_expression(lines[-1][1:])
    except ValueError:
        return 0.0
    if Counter(leaves) != Counter(example["numbers"]):
        return 0.0
    return 1.0 if value == int(example["target"]) else 0.0
