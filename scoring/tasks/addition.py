"""Multi-digit addition with a step-by-step carry trace; verifiable reward on the final answer.

Format (one character per token with the tiny char tokenizer)::

    prompt    "347+85\\n"
    solution  "7+5+0=12\\n4+8+1=13\\n3+0+1=4\\n= 432"
    answer    "432"

The trace goes digit by digit from the right. Line k reads ``x+y+c=s``: the k-th digits (from the right) of
the two operands, a missing digit written as 0, plus the carry ``c`` coming in from the previous column (0 on
the first line); ``s`` is their sum, so its last digit is the k-th digit of the answer and its tens digit the
carry into the next line. When the last column carries, the final line of the trace has a two-digit sum and
the answer is one digit longer. The response ends with the line ``= N``.

Reward: 1.0 iff the last non-blank line of the response is ``= N`` (spaces around ``=`` and ``N``
ignored; ``N`` a run of decimal digits) and int(N) equals the gold answer; anything else, including a
response cut before its final line or text after it, is 0.0. Only the final answer is graded, the carry
lines are the model's scratchpad.

Difficulty: each operand independently gets a number of digits drawn uniformly from
[``min_digits``, ``max_digits``], then a uniform value with exactly that many digits (0..9 for one digit).
"""

from __future__ import annotations

import random
import re

NAME = "addition"
DIFFICULTY = {"min_digits": 1, "max_digits": 3}  # defaults of make_examples' keyword arguments

_FINAL = re.compile(r"=\s*(\d+)")


def format_prompt(a: int, b: int) -> str:
    return f"{a}+{b}\n"


def solve(a: int, b: int) -> str:
    """The carry trace for a + b (non-negative integers), ending with the ``= N`` line."""
    assert a >= 0 and b >= 0, (a, b)
    xs, ys = str(a)[::-1], str(b)[::-1]
    lines, carry = [], 0
    for k in range(max(len(xs), len(ys))):
        x = int(xs[k]) if k < len(xs) else 0
        y = int(ys[k]) if k < len(ys) else 0
        s = x + y + carry
        lines.append(f"{x}+{y}+{carry}={s}")
        carry = s // 10
    lines.append(f"= {a + b}")
    return "\n".join(lines)


def _draw(rng: random.Random, digits: int) -> int:
    lo = 0 if digits == 1 else 10 ** (digits - 1)
    return rng.randint(lo, 10**digits - 1)


def make_examples(n: int, *, seed: int, min_digits: int = 1, max_digits: int = 3) -> list[dict]:
    """``n`` addition problems, a deterministic function of ``(n, seed, min_digits, max_digits)``.

    Rows: ``id``, ``prompt``, ``answer``, ``solution`` (the carry trace), ``a``, ``b``.
    """
    if not 1 <= min_digits <= max_digits:
        raise ValueError(f"need 1 <= min_digits <= max_digits, got min_digits={min_digits}, max_digits={max_digits}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a = _draw(rng, rng.randint(min_digits, max_digits))
        b = _draw(rng, rng.randint(min_digits, max_digits))
        rows.append(
            {
                "id": f"addition-s{seed}-{i:06d}",
                "prompt": format_prompt(a, b),
                "answer": str(a + b),
                "solution": solve(a, b),
                "a": a,
                "b": b,
            }
        )
    return rows


def parse_answer(response: str) -> int | None:
    """The integer on the response's last non-blank line if that line is ``= N``, else None."""
    lines = [line.strip() for line in response.splitlines() if line.strip()]
    if not lines:
        return None
    m = _FINAL.fullmatch(lines[-1])
    return int(m.group(1)) if m else None


def reward(response: str, example: dict) -> float:
    """1.0 iff the response's final ``= N`` line holds the gold sum ``example["answer"]``."""
    got = parse_answer(response)
    return 1.0 if got is not None and got == int(example["answer"]) else 0.0
