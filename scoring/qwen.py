"""A second math grader in the style of Qwen2.5-Math's evaluation (``math_equal`` in its ``grader.py``).

Used as a cross-check of math-verify, not as the score: the runner reports, per benchmark, how often the two
graders disagree and writes the disagreeing rows to ``<benchmark>.disagreements.jsonl``. Written from scratch,
concise, following Qwen's recipe:

1. ``strip_string``: normalise LaTeX spelling (``\\dfrac``, ``\\left``, ``^\\circ``, ``\\%``, ``\\text{}`` units,
   spaces, ``\\frac12``, a leading ``x =``, trailing ``.0``) and compare strings;
2. numbers: equal within relative tolerance 1e-4, also as percentages (gold, gold/100, gold*100 — Qwen's
   ``include_percentage``);
3. tuples / intervals / comma lists: same brackets, same length, element-wise equal, in order;
4. equations ``a = b``: equal when (a - b) of one equals ±(a - b) of the other; ``x = 5`` against ``5`` compares
   the right-hand side;
5. symbolic: parse both (latex2sympy, then sympy's ``parse_expr``) and test ``a == b``, ``simplify(a - b) == 0``
   or numeric closeness.

Pure (no IO). sympy's ``simplify`` can hang on hostile input: run it under ``scoring.pool``.
"""

from __future__ import annotations

import math
import re

from scoring.math import extract_answer, normalize_gold, split_top_level, strip_unit

__all__ = ["strip_string", "math_equal", "grade_qwen", "disagreements"]


def _fix_fracs(s: str) -> str:
    # \frac12 -> \frac{1}{2}, \frac1{2} -> \frac{1}{2}
    s = re.sub(r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac\s*(\d)\s*\{", r"\\frac{\1}{", s)
    return re.sub(r"\\frac\s*\{([^{}]*)\}\s*(\d)", r"\\frac{\1}{\2}", s)


def strip_string(s: str) -> str:
    """Qwen/Hendrycks-style normalisation of an answer string."""
    s = str(s).strip().replace("\n", "").rstrip(".")
    s = s.replace("\\!", "").replace("\\,", "").replace("\\;", "").replace("\\ ", "")
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = s.replace("\\left", "").replace("\\right", "")
    s = re.sub(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|°", "", s)
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    # a trailing unit in text form: "5 \text{ cm}" -> "5"; otherwise unwrap \text{...}
    s = re.sub(r"(?<=[\d}])\s*\\(?:text|mbox|mathrm)\s*\{\s*~?[A-Za-z /^]+\}\s*$", "", s)
    s = re.sub(r"\\(?:text|textbf|mbox|mathrm)\s*\{([^{}]*)\}", r"\1", s)
    s = s.replace("\\dots", "").replace("\\ldots", "")
    s = re.sub(r"\\sqrt\s*(\w)", r"\\sqrt{\1}", s)
    s = _fix_fracs(s)
    s = s.replace(" ", "")
    if re.fullmatch(r"[A-Za-z](_\{?\w+\}?)?=[^=]+", s):   # "x=5" -> "5" (short variable name)
        s = s.split("=", 1)[1]
    s = re.sub(r"(\d)\.0+(?!\d)", r"\1", s)                   # 27.0 -> 27
    s = re.sub(r"^\.(\d)", r"0.\1", s)
    m = re.fullmatch(r"(-?\d+)/(\d+)", s)                      # 3/4 -> \frac{3}{4}
    if m:
        s = f"\\frac{{{m.group(1)}}}{{{m.group(2)}}}"
    return s


def _to_float(s: str) -> float | None:
    t = s.replace(",", "") if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s) else s
    try:
        return float(t)
    except ValueError:
        m = re.fullmatch(r"\\frac\{(-?\d+)\}\{(\d+)\}", t)
        return int(m.group(1)) / int(m.group(2)) if m and int(m.group(2)) else None


def _sympy(s: str):
    from latex2sympy2_extended import latex2sympy
    try:
        return latex2sympy(s)
    except Exception:
        from sympy.parsing.sympy_parser import parse_expr
        try:
            return parse_expr(s.replace("^", "**"))
        except Exception:
            return None


def _symbolic_equal(a: str, b: str) -> bool:
    import sympy
    x, y = _sympy(a), _sympy(b)
    if x is None or y is None:
        return False
    try:
        if x == y:
            return True
        if isinstance(x, sympy.Expr) and isinstance(y, sympy.Expr):
            if sympy.simplify(x - y) == 0:
                return True
            fx, fy = complex(sympy.N(x)), complex(sympy.N(y))
            return abs(fx - fy) <= 1e-4 * max(1.0, abs(fy))
    except Exception:
        return False
    return False


def math_equal(pred: str, ref: str, *, include_percentage: bool = True, rel_tol: float = 1e-4) -> bool:
    """Qwen-style equivalence of an extracted answer and a reference answer (both LaTeX strings)."""
    p, r = strip_string(pred), strip_string(ref)
    if p == r or p.lower() == r.lower():
        return True
    fp, fr = _to_float(p), _to_float(r)
    if fp is not None and fr is not None:
        refs = [fr, fr / 100, fr * 100] if include_percentage else [fr]
        return any(math.isclose(fp, x, rel_tol=rel_tol) for x in refs)
    # tuples, intervals, comma lists: element-wise, in order
    pp, rp = split_top_level(p), split_top_level(r)
    bracketed = (len(p) > 1 and len(r) > 1 and p[0] in "([" and r[0] in "([" and p[-1] in ")]" and r[-1] in ")]"
                 and len(split_top_level(p[1:-1])) > 1)
    if bracketed:
        if (p[0], p[-1]) != (r[0], r[-1]) and not (p[0] == "(" and r[0] == "("):
            return False
        pp, rp = split_top_level(p[1:-1]), split_top_level(r[1:-1])
    if len(pp) > 1 or len(rp) > 1:
        return len(pp) == len(rp) and all(math_equal(a, b, include_percentage=include_percentage, rel_tol=rel_tol)
                                          for a, b in zip(pp, rp))
    if p.count("=") == 1 and r.count("=") == 1:
        (pl, pr), (rl, rr) = p.split("="), r.split("=")
        return _symbolic_equal(f"{pl}-({pr})", f"{rl}-({rr})") or _symbolic_equal(f"{pl}-({pr})", f"{rr}-({rl})")
    if p.count("=") == 1 and r.count("=") == 0 and len(p.split("=")[0]) <= 2:
        return math_equal(p.split("=")[1], r, include_percentage=include_percentage, rel_tol=rel_tol)
    return _symbolic_equal(p, r)


def grade_qwen(response: str, gold, *, unit: str | None = None) -> bool:
    """Qwen-style verdict of a whole response: extract the answer (same extraction as math-verify's grader) and
    compare with ``math_equal``. Multi-answer golds are compared as ordered lists (Qwen does not reorder)."""
    answer = extract_answer(response)
    if answer is None:
        return False
    try:
        return math_equal(strip_unit(answer, unit), strip_unit(normalize_gold(gold), unit))
    except (RecursionError, ValueError, TypeError, AttributeError):
        return False


def disagreements(rows: list[dict]) -> tuple[float, list[dict]]:
    """Per-sample disagreement between math-verify (``correct``) and the Qwen-style grader (``correct_qwen``).

    ``rows``: sample-file lines (each with ``problem_id``, ``gold``, ``responses``, ``answers``, ``correct``,
    ``correct_qwen``). Returns (fraction of samples on which the graders disagree, one row per disagreeing sample:
    problem_id, sample index, gold, extracted answer, both verdicts, the response).
    """
    total, out = 0, []
    for row in rows:
        for i, (mv, qw) in enumerate(zip(row["correct"], row["correct_qwen"])):
            total += 1
            if bool(mv) != bool(qw):
                out.append({"problem_id": row["problem_id"], "sample": i, "gold": row["gold"],
                            "answer": row["answers"][i], "math_verify": bool(mv), "qwen": bool(qw),
                            "response": row["responses"][i]})
    return (len(out) / total if total else 0.0), out
