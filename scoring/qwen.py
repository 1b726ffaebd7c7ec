"""A second math grader that reads responses the way Qwen2.5-Math's evaluation harness does — a cross-check of the
math-verify grader (``scoring.math``), not the score.

The runner reports, per benchmark, how often the two graders disagree and writes the disagreeing samples to
``<benchmark>.disagreements.jsonl``, each with both readings (``disagreements``). A second opinion is only worth
having when it is a different reading, so nothing here comes from ``scoring.math``: its own extraction, its own
string normalisation, its own equality, following the recipe of Qwen2.5-Math's ``evaluation/parser.py``
(``extract_answer``, ``strip_string``) and ``evaluation/grader.py`` (``math_equal``). Written from scratch:

1. ``extract_answer_qwen``: the whole response (Qwen does not look for ``</think>``); a Minerva-style
   "final answer is $X$. I hope" span; else the text after the last ``boxed`` with brace matching — a box cut off
   by the token limit gives everything after it, not an earlier box; else the text after the last "he answer is"
   / "final answer is"; else (``use_last_number``, Qwen's default) the last number in the response. Then
   newlines, a leading ``:`` and a trailing ``.`` or ``/`` go, and ``strip_string`` is applied twice (Qwen's
   ``extract_answer`` and its ``run_execute`` each apply it).
2. ``strip_string``: Hendrycks/Qwen normalisation — ``\\dfrac``, ``\\left``, ``\\{``, trailing ``\\text{unit}``,
   unit words after numbers, ``^\\circ``, ``$``, ``\\text{}``, ``x=``, ``\\%``, ``.0`` tails, a short ``k =``
   prefix, ``\\sqrt2``, spaces, ``\\frac12``, ``a/b``.
3. ``math_equal``: equal strings; multiple-choice letters; numbers (commas dropped, trailing ``%`` is /100) equal
   within relative tolerance 1e-4, also against gold/100 and gold*100 (``include_percentage``); brackets
   dropped when only one side has them; ``(a, b)`` vs ``[c, d]`` element-wise (bracket kind ignored, as Qwen's);
   matrices element-wise; equations ``l = r`` as ``l - r`` up to sign; ``x = v`` vs ``v``; and last a symbolic
   test: parse with sympy's ``parse_expr``, then ``latex2sympy`` (latex2sympy2_extended; Qwen vendors its own
   latex2sympy2), and compare ``a == b``, ``simplify(a - b) == 0``, ``|lhs - rhs|`` of equations, numeric closeness,
   matrices rounded to 3 decimals.

Known differences from Qwen2.5-Math's harness: ``docs/graders.md`` ("Math").
``tests/fixtures/math/qwen_reference.jsonl`` holds verdicts of Qwen's own code on 2347 cases; ``tests/scoring/test_math_crosscheck.py`` counts the agreement (2308).

Pure (no IO). sympy's ``simplify`` can hang on hostile input: run it under ``scoring.pool``.
"""

from __future__ import annotations

import math
import re

__all__ = ["extract_answer_qwen", "strip_string", "normalize_gold_qwen", "math_equal", "grade_qwen", "qwen_reading",
           "disagreements"]

# Unit words dropped when they follow a number ("45 minutes", "12 cm"). Qwen strips ~190 MathQA words anywhere in
# the string, single letters included (a, c, d, g, h, l, m, o, s, t), which also mangles answers such as "a+b";
# this list keeps the physical and everyday units and drops them only where they follow a number (or a closing
# brace) after a space, as Qwen's word-boundary rule does ("6 m" -> "6", "6m" stays).
_UNIT_WORDS = (
    "degrees", "degree", "deg", "radians", "radian", "percent", "dollars", "dollar", "cents", "cent", "rupees",
    "rupee", "rs", "units", "unit", "square units", "sq units", "inches", "inch", "feet", "foot", "ft", "yards",
    "yard", "miles", "mile", "mph", "kmph", "kmh", "km", "cm", "mm", "meters", "meter", "metres", "metre", "m",
    "kg", "grams", "gram", "g", "mg", "lb", "lbs", "pounds", "ounces", "oz", "liters", "liter", "litres", "litre",
    "ml", "gallons", "gallon", "hours", "hour", "hrs", "hr", "minutes", "minute", "mins", "min", "seconds",
    "second", "secs", "sec", "s", "days", "day", "weeks", "week", "months", "month", "years", "year", "yrs", "yr",
    "acres", "acre", "hectares", "hectare", "sq", "square", "cubic", "cu", "ways", "way", "people", "persons",
    "students", "times",
)
_UNIT_RE = re.compile(r"(?<=[\d}])(?:\s|~|\\[,;! ])+(?:" + "|".join(
    re.escape(u).replace(r"\ ", r"\s+") for u in sorted(_UNIT_WORDS, key=len, reverse=True)) + r")\b\.?")
_WORD_NUMBERS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split())}
_WORD_NUMBERS.update({"thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80,
                      "ninety": 90, "hundred": 100, "thousand": 1000, "million": 1000000})
_LAST_NUMBER_RE = re.compile(r"-?\d*\.?\d+")


# ---- extraction -----------------------------------------------------------------------------------------------

def _after_box(tail: str) -> str:
    """Qwen's reading of the text after the last ``boxed``: brace-matched content (every brace counts, escaped or
    not; an unclosed box gives everything), or for ``boxed 5`` the text up to the next ``$``."""
    if not tail:
        return ""
    if tail[0] != "{":
        return tail.split("$")[0].strip()
    depth, out = 1, []
    for ch in tail[1:]:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                break
        out.append(ch)
    return "".join(out)


def extract_answer_qwen(response: str, *, use_last_number: bool = True, skip_unit: bool = False) -> str:
    """The answer as Qwen2.5-Math's harness reads it, normalised (``strip_string`` twice). "" when none.

    ``use_last_number``: fall back to the last number of the response (Qwen's default). ``skip_unit``: keep unit
    words (Qwen does so for Minerva)."""
    text = response.replace("\u043a\u0438", "")
    if "final answer is $" in text and "$. I hope" in text:
        pred = text.split("final answer is $", 1)[1].split("$. I hope", 1)[0].strip()
    elif "boxed" in text:
        pred = _after_box(text.split("boxed")[-1])
    elif "he answer is" in text:
        pred = text.split("he answer is")[-1].strip()
    elif "final answer is" in text:
        pred = text.split("final answer is")[-1].strip()
    elif use_last_number:
        nums = _LAST_NUMBER_RE.findall(text.replace(",", ""))
        pred = nums[-1] if nums else ""
    else:
        pred = ""
    pred = re.sub(r"\n\s*", "", pred)
    if pred.startswith(":"):
        pred = pred[1:]
    if pred.endswith(".") or pred.endswith("/"):
        pred = pred[:-1]
    return strip_string(strip_string(pred, skip_unit=skip_unit), skip_unit=skip_unit)


# ---- normalisation --------------------------------------------------------------------------------------------

def _fix_fracs(s: str) -> str:
    # \frac12 -> \frac{1}{2}, \frac1b -> \frac{1}{b}, \frac1{72} -> \frac{1}{72}
    parts = s.split("\\frac")
    out = parts[0]
    for p in parts[1:]:
        out += "\\frac"
        if p.startswith("{") or len(p) < 2:
            if not p.startswith("{") and len(p) < 2:
                return s
            out += p
        elif p[1] == "{":
            out += "{" + p[0] + "}" + p[1:]
        else:
            out += "{" + p[0] + "}{" + p[1] + "}" + p[2:]
    return out


def _fix_slash(s: str) -> str:
    # "3/4" -> \frac{3}{4} (integers only, or a side holding sqrt)
    parts = s.split("/")
    if len(parts) != 2:
        return s
    a, b = parts
    ok_a = "sqrt" in a or re.fullmatch(r"-?\d+", a)
    ok_b = "sqrt" in b or re.fullmatch(r"-?\d+", b)
    if ok_a and ok_b and (("sqrt" in a) or str(int(a)) == a) and (("sqrt" in b) or str(int(b)) == b):
        return "\\frac{" + a + "}{" + b + "}"
    return s


def _word_number(s: str) -> str:
    words = s.strip().lower().replace("-", " ").split()
    if not words or any(w not in _WORD_NUMBERS for w in words):
        return s
    total, cur = 0, 0
    for w in words:
        v = _WORD_NUMBERS[w]
        if v in (100, 1000, 1000000):
            cur = max(cur, 1) * v
            if v > 100:
                total, cur = total + cur, 0
        else:
            cur += v
    return str(total + cur)


def strip_string(s, skip_unit: bool = False) -> str:
    """Qwen/Hendrycks-style normalisation of an answer string (see the module docstring)."""
    s = str(s).strip().replace("\n", "").rstrip(".")
    s = s.replace("\\!", "")
    s = re.sub(r"\\begin\{array\}\{.*?\}", r"\\begin{pmatrix}", s)
    s = s.replace("\\end{array}", "\\end{pmatrix}").replace("bmatrix", "pmatrix")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\neq", "\\ne").replace("\\leq", "\\le").replace("\\geq", "\\ge")
    s = s.replace("\\left", "").replace("\\right", "").replace("\\{", "{").replace("\\}", "}")
    t = re.sub(r"\\text\{.*?\}$", "", s).strip()   # a trailing \text{unit}
    if t:
        s = t
    if not skip_unit:
        for _ in range(2):
            t = _UNIT_RE.sub("", s).strip()
            if t:
                s = t
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "").replace("$", "").replace("\\(", "").replace("\\)", "")
    s = _word_number(s)
    s = re.sub(r"\\text\{(.*?)\}", r"\1", s)
    for key in ("x=", "y=", "z=", "x\\in", "y\\in", "z\\in", "x\\to", "y\\to", "z\\to"):
        s = s.replace(key, "")
    s = s.replace("\\emptyset", "{}").replace("(-\\infty,\\infty)", "\\mathbb{R}")
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    s = s.replace("infinity", "\\infty")
    if "\\infty" not in s:
        s = s.replace("inf", "\\infty")
    s = s.replace("and", "").replace("\\mathbf", "")
    s = re.sub(r"\\mbox\{.*?\}", "", s)
    if "j" in s and "i" not in s:
        s = s.replace("j", "i")
    s = re.sub(r"(\d+)\.0*([^\d])", r"\1\2", s)     # 27.0 -> 27, 2.00x -> 2x
    s = re.sub(r"(\d+)\.0*$", r"\1", s)
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    if len(s.split("=")) == 2 and len(s.split("=")[0]) <= 2:   # "k = 5" -> "5"
        s = s.split("=")[1]
    s = re.sub(r"\\sqrt(\w+)", r"\\sqrt{\1}", s)
    s = s.replace(" ", "")
    s = _fix_fracs(s)
    return _fix_slash(s)


def normalize_gold_qwen(gold, *, skip_unit: bool = False) -> str:
    """A gold answer as Qwen's harness holds it: ``str`` (AMC's float 27.0 -> "27.0"), ``$`` stripped from both
    ends, then ``strip_string``."""
    return strip_string(str(gold).strip().strip("$"), skip_unit=skip_unit)


# ---- equality -------------------------------------------------------------------------------------------------

def _digits(s: str) -> float | None:
    s = s.replace(",", "")
    try:
        return float(s)
    except ValueError:
        if s.endswith("%"):
            s = s[:-1].rstrip("\\")
            try:
                return float(s) / 100
            except ValueError:
                return None
    return None


def _close(a: float, b: float, rel_tol: float) -> bool:
    return math.isclose(b, a, rel_tol=rel_tol)


def _choice(pred: str) -> str:
    letters = re.findall(r"\b(A|B|C|D|E)\b", pred.strip("\n").rstrip(".").rstrip("/").strip(" ").lstrip(":").upper())
    return (letters[-1] if letters else pred.strip().strip(".")).rstrip(".").rstrip("/")


def _to_pmatrix(s: str) -> str:
    rows = re.findall(r"\{.*,.*\}", s.strip())
    return ", ".join("\\begin{pmatrix}" + m.strip("{}").replace(",", "\\") + "\\end{pmatrix}" for m in rows)


def _matrix_rows(s: str) -> list[list[str]]:
    body = s[len("\\begin{pmatrix}"):-len("\\end{pmatrix}")]
    return [[c for c in line.strip().split("&")] for line in body.split("\\\\") if line.strip()]


def _is_matrix(s: str) -> bool:
    return (s.startswith("\\begin{pmatrix}") or s.startswith("\\begin{bmatrix}")) and \
        (s.endswith("\\end{pmatrix}") or s.endswith("\\end{bmatrix}"))


def math_equal(pred, ref, *, include_percentage: bool = True, rel_tol: float = 1e-4) -> bool:
    """Qwen-style equivalence of a normalised answer and a normalised reference (see the module docstring)."""
    if pred is None or ref is None:
        return False
    pred, ref = str(pred), str(ref)
    if pred.strip().lower() == ref.strip().lower():
        return True
    if ref in ("A", "B", "C", "D", "E") and _choice(pred) == ref:
        return True
    fp, fr = _digits(pred), _digits(ref)
    if fp is not None and fr is not None:
        refs = [fr / 100, fr, fr * 100] if include_percentage else [fr]
        return any(_close(fp, x, rel_tol) for x in refs)
    if not pred:
        return False
    pred, ref = pred.strip(), ref.strip()
    if "pmatrix" in pred and "pmatrix" not in ref:
        ref = _to_pmatrix(ref)
    # brackets on one side only, then every (){} dropped: "(1,2)" vs "1,2"
    p, r = pred, ref
    if (pred.startswith("[") and pred.endswith("]") and not ref.startswith("(")) or \
            (pred.startswith("(") and pred.endswith(")") and not ref.startswith("[")):
        p, r = p.strip("[]()"), r.strip("[]()")
    for ch in "{}()":
        p, r = p.replace(ch, ""), r.replace(ch, "")
    if p.lower() == r.lower():
        return True
    # (a, b) vs [c, d]: element-wise, in order (the kind of bracket is not compared)
    if re.match(r"(\(|\[).+(\)|\])", pred) and re.match(r"(\(|\[).+(\)|\])", ref):
        pp, rp = pred[1:-1].split(","), ref[1:-1].split(",")
        if len(pp) == len(rp) and all(math_equal(a, b, include_percentage=include_percentage, rel_tol=rel_tol)
                                      for a, b in zip(pp, rp)):
            return True
    if _is_matrix(pred) and _is_matrix(ref):
        pr, rr = _matrix_rows(pred), _matrix_rows(ref)
        if len(pr) == len(rr) and all(len(a) == len(b) and all(
                math_equal(x, y, include_percentage=include_percentage, rel_tol=rel_tol) for x, y in zip(a, b))
                for a, b in zip(pr, rr)):
            return True
    if pred.count("=") == 1 and ref.count("=") == 1:
        pl, pr_ = (x.strip() for x in pred.split("="))
        rl, rr_ = (x.strip() for x in ref.split("="))
        d_pred, d_ref = f"{pl} - ({pr_})", f"{rl} - ({rr_})"
        if _symbolic_equal(d_pred, d_ref, rel_tol) or _symbolic_equal(f"-({d_pred})", d_ref, rel_tol):
            return True
    elif pred.count("=") == 1 and len(pred.split("=")[0].strip()) <= 2 and "=" not in ref:
        if math_equal(pred.split("=")[1], ref, include_percentage=include_percentage, rel_tol=rel_tol):
            return True
    elif ref.count("=") == 1 and len(ref.split("=")[0].strip()) <= 2 and "=" not in pred:
        if math_equal(pred, ref.split("=")[1], include_percentage=include_percentage, rel_tol=rel_tol):
            return True
    return _symbolic_equal(pred, ref, rel_tol)


# parse_expr evaluates its input as Python: only plain arithmetic over names that are not Python builtins reaches it
_SAFE_EXPR_RE = re.compile(r"[\w\s.+\-*/^()=,!]*")
_SAFE_BUILTINS = {"abs", "min", "max", "pow", "round", "sum", "float", "int", "complex", "True", "False", "None"}


def _safe_for_parse_expr(s: str) -> bool:
    import builtins
    if not _SAFE_EXPR_RE.fullmatch(s) or "__" in s or re.search(r"\.\s*[A-Za-z_]", s) or "lambda" in s:
        return False
    return not any(n in vars(builtins) and n not in _SAFE_BUILTINS for n in re.findall(r"[A-Za-z_]\w*", s))


def _top_level_commas(s: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(s):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(s[start:i])
            start = i + 1
    return parts + [s[start:]]


def _parse_sym(s: str):
    """sympy's ``parse_expr`` (Python syntax: ``2*x+1``, ``1e-5``; only for plain arithmetic, see
    ``_safe_for_parse_expr``), then latex2sympy; the string itself when neither reads it. Like Qwen, each is
    tried on ``s`` with ``\\\\`` made ``\\`` first, then on ``s``. A top-level comma list becomes a Python list
    of its parsed parts (ordered, as Qwen's latex2sympy2 gives; latex2sympy2_extended would make an unordered
    set), or stays a string when a part holds ``=`` or does not parse."""
    parts = _top_level_commas(s)
    if len(parts) > 1:
        if any("=" in p or not p.strip() for p in parts):
            return s
        parsed = [_parse_sym(p) for p in parts]
        return s if any(isinstance(p, str) for p in parsed) else parsed
    from sympy.parsing.sympy_parser import parse_expr
    from latex2sympy2_extended import latex2sympy
    for f in (parse_expr, latex2sympy):
        for t in (s.replace("\\\\", "\\"), s):
            if f is parse_expr and not _safe_for_parse_expr(t):
                continue
            try:
                return f(t)
            except Exception:
                continue
    return s


def _symbolic_equal(a: str, b: str, rel_tol: float = 1e-4) -> bool:
    from sympy import N, simplify
    x, y = _parse_sym(a), _parse_sym(b)
    try:
        if str(x) == str(y) or x == y:
            return True
    except Exception:
        pass
    try:
        if x.equals(y) or simplify(x - y) == 0:
            return True
    except Exception:
        pass
    try:
        if (abs(x.lhs - x.rhs)).equals(abs(y.lhs - y.rhs)):
            return True
    except Exception:
        pass
    try:
        if _close(float(N(x)), float(N(y)), rel_tol):
            return True
    except Exception:
        pass
    try:
        if x.shape == y.shape and x.applyfunc(lambda v: round(v, 3)).equals(y.applyfunc(lambda v: round(v, 3))):
            return True
    except Exception:
        pass
    return False


# ---- a whole response -----------------------------------------------------------------------------------------

def _unit_spellings(unit: str | None) -> list[str]:
    if not unit:
        return []
    u = unit.replace("$", "").strip()
    return [u] if u else []


def qwen_reading(response: str, gold, *, unit: str | None = None, skip_unit: bool = False,
                 use_last_number: bool = True) -> tuple[str, str]:
    """(answer, gold) as the cross-check reads them: both normalised, the given ``unit`` (OlympiadBench's field)
    dropped from the end of the answer."""
    answer = extract_answer_qwen(response, use_last_number=use_last_number, skip_unit=skip_unit)
    for u in _unit_spellings(unit):
        t = strip_string(u, skip_unit=True)
        if t and answer.endswith(t) and answer != t:
            answer = answer[: -len(t)].rstrip("~").rstrip()
    return answer, normalize_gold_qwen(gold, skip_unit=skip_unit)


def grade_qwen(response: str, gold, *, unit: str | None = None, skip_unit: bool = False,
               use_last_number: bool = True) -> bool:
    """The cross-check's verdict on a whole response: Qwen-style extraction, normalisation and ``math_equal``.
    Multi-answer golds are compared as Qwen does (as one string; no reordering). ``skip_unit``: keep unit words
    (Qwen's setting for Minerva)."""
    answer, ref = qwen_reading(response, gold, unit=unit, skip_unit=skip_unit, use_last_number=use_last_number)
    try:
        return math_equal(answer, ref)
    except (RecursionError, ValueError, TypeError, AttributeError, OverflowError):
        return False


def disagreements(rows: list[dict]) -> tuple[float, list[dict]]:
    """Per-sample disagreement between math-verify (``correct``) and the Qwen-style grader (``correct_qwen``).

    ``rows``: sample-file lines (each with ``problem_id``, ``gold``, ``responses``, ``answers``, ``correct``,
    ``correct_qwen``). Returns (fraction of samples on which the graders disagree, one row per disagreeing sample:
    problem_id, sample index, gold, math-verify's extracted answer, the cross-check's reading of the answer and of
    the gold (``qwen_answer``, ``qwen_gold``, after ``strip_string``), both verdicts, the response) — enough to
    read which grader is right without rerunning anything.
    """
    total, out = 0, []
    for row in rows:
        for i, (mv, qw) in enumerate(zip(row["correct"], row["correct_qwen"])):
            total += 1
            if bool(mv) != bool(qw):
                response = row["responses"][i]
                q_answer, q_gold = qwen_reading(response, row["gold"])
                out.append({"problem_id": row["problem_id"], "sample": i, "gold": row["gold"],
                            "answer": row["answers"][i], "qwen_answer": q_answer, "qwen_gold": q_gold,
                            "math_verify": bool(mv), "qwen": bool(qw), "response": response})
    return (len(out) / total if total else 0.0), out
