"""Math answer extraction and grading with math-verify (pure: no file IO, no process management).

``extract_answer`` reads the model's final answer the way a person would: the text after the last ``</think>``
when there is one, then its last complete ``\\boxed{...}`` / ``\\fbox{...}`` (brace matching, escaped braces
skipped), then a "the answer is X" / "Final Answer: X" phrase. There is deliberately no "last number in the
text" fallback: it credits numbers the model never committed to (intermediate results), and every prompt
template we use asks for a box.

``grade_math`` compares the extracted answer with the gold using math-verify (Kydlíček et al., HF Math-Verify),
gold first — ``verify(parse(gold), parse(pred))`` is not symmetric. On top of it:

- units: ``unit="km/h"`` strips that unit (and ``\\text{...}`` / ``\\mathrm{...}`` spellings, plurals, ``\\%``,
  ``^\\circ``) from both gold and answer before comparing (OlympiadBench gives the unit separately);
- several answers (``multiple_answer=True``, OlympiadBench's ``is_multiple_answer``): math-verify's own set
  comparison is tried first; if it fails, gold and answer are split at top-level commas and every gold part must
  match a distinct answer part (order-insensitive, same count). Several boxes in the final answer count as parts.

math-verify bounds its own time with SIGALRM, which only works in the main thread. ``timeout=None`` (the default)
disables it: callers that need a bound run grading in ``scoring.pool``, which kills hung workers.
"""

from __future__ import annotations

import logging
import re

from scoring.verdict import Verdict

__all__ = ["extract_answer", "extract_boxed", "final_segment", "grade_math", "normalize_gold", "gold_parses",
           "split_top_level", "strip_unit", "math_equal_mv"]

# math-verify warns once per process that its timeout is disabled; we bound time ourselves (see pool.py).
logging.getLogger("math_verify").setLevel(logging.ERROR)

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_ANSWER_PHRASE_RE = re.compile(r"final answer is|the answer is|final answer\s*:|answer\s*:", re.IGNORECASE)
_SENTENCE_END_RE = re.compile(r"\.\s|\.$|\n|$")


def final_segment(response: str) -> str:
    """The part of a response after the last ``</think>``; the whole response when there is none."""
    cut = response.rfind("</think>")
    return response if cut < 0 else response[cut + len("</think>"):]


def _match_brace(text: str, open_idx: int) -> int | None:
    """Index of the ``}`` closing the ``{`` at ``open_idx``; escaped braces (``\\{``) do not count."""
    depth, i = 0, open_idx
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def extract_boxed(text: str) -> list[str]:
    """Contents of every complete ``\\boxed{...}`` / ``\\fbox{...}`` (and ``\\boxed 5``) in order of appearance.

    An unclosed box (a response cut at max_tokens) is skipped.
    """
    out = []
    for m in _BOX_RE.finditer(text):
        i = m.end()
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            end = _match_brace(text, i)
            if end is not None:
                out.append(text[i + 1:end].strip())
        elif i > m.end():  # "\boxed 5": the token up to whitespace or "$"
            tok = re.match(r"[^\s$]+", text[i:])
            if tok:
                out.append(tok.group(0))
    return out


def extract_answer(response: str) -> str | None:
    """The final answer of a response: last box of the final segment, else an "answer is" phrase, else None."""
    seg = final_segment(response)
    boxes = extract_boxed(seg)
    if boxes:
        return boxes[-1]
    phrases = list(_ANSWER_PHRASE_RE.finditer(seg))
    if phrases:   # the last phrase wins: "Final Answer: The final answer is X." reads X
        rest = seg[phrases[-1].end():]
        ans = rest[:_SENTENCE_END_RE.search(rest).start()].strip().strip("$").strip()
        return ans or None
    return None


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split at ``sep`` outside any (), [], {} — "(1,2),(3,4)" gives ["(1,2)", "(3,4)"]. Escapes are skipped."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            # \{ \} are set braces: they nest like brackets; \left( etc. fall through to the next char.
            if text[i + 1:i + 2] in ("{", "}"):
                depth += 1 if text[i + 1] == "{" else -1
            i += 2
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def normalize_gold(gold) -> str:
    """A gold answer as a LaTeX string: floats without a spurious ".0" (AMC's 27.0), ``$`` delimiters and a
    trailing full stop removed (OlympiadBench), surrounding whitespace stripped."""
    if isinstance(gold, float):
        gold = str(int(gold)) if gold.is_integer() else repr(gold)
    gold = str(gold).strip()
    gold = re.sub(r"(?<!\\)\$", "", gold).strip()
    return gold[:-1].strip() if gold.endswith(".") and not gold.endswith("\\.") else gold


def _unit_variants(unit: str) -> list[str]:
    u = re.sub(r"(?<!\\)\$", "", unit).strip()
    variants = {u}
    if re.fullmatch(r"[A-Za-z ]+", u) and not u.endswith("s"):
        variants.add(u + "s")   # "minute" also strips "minutes"
    if u in ("%", "\\%"):
        variants |= {"%", "\\%"}
    if u in ("^{\\circ}", "^\\circ", "\\circ", "°"):
        variants |= {"^{\\circ}", "^\\circ", "\\circ", "°"}
    return sorted(variants, key=len, reverse=True)


def strip_unit(text: str, unit: str | None) -> str:
    """Remove ``unit`` from an answer: wrapped in ``\\text{}``/``\\mathrm{}``/``\\mbox{}`` or bare at the end."""
    if not unit:
        return text
    out = text
    for u in _unit_variants(unit):
        # \text{ km/h}, \mathrm{~cm^2}, \text { minutes } ...
        out = re.sub(r"\\(?:text|mathrm|textrm|mbox|rm)\s*\{\s*~?\s*" + re.escape(u) + r"\s*\}", "", out)
        word = r"(?<![A-Za-z\\])" if u[:1].isalpha() else ""   # "min" must not eat the end of "\min"
        out = re.sub(r"\s*~?\s*" + word + re.escape(u) + r"\s*$", "", out.strip())
    return out.strip() or text


def _symbols(latex: str) -> str:
    """Symbols math-verify's LaTeX parser rejects, respelled on both sides: astronomy's solar subscript
    (``L_{\\odot}``, Minerva) becomes ``L_{sun}``."""
    return re.sub(r"\\odot(?![A-Za-z])", "sun", latex)


def _canon(latex: str) -> str:
    """String form for answers math-verify cannot parse: no spaces, \\left/\\right, braces around one-character
    sub/superscripts, or \\text{ and } between list items."""
    s = re.sub(r"\\text\s*\{\s*and\s*\}", ",", latex)
    s = re.sub(r"\\left|\\right|\s+", "", s)
    return re.sub(r"([_^])\{(\w)\}", r"\1\2", s)


def _parse_boxed(latex: str, timeout):
    from math_verify import parse
    return parse(f"\\boxed{{{_symbols(latex)}}}", parsing_timeout=timeout)


def _is_sympy(parsed) -> bool:
    from sympy import Basic, MatrixBase
    return bool(parsed) and isinstance(parsed[0], (Basic, MatrixBase))


def gold_parses(gold) -> bool:
    """Whether math-verify turns the (normalised) gold into a sympy object rather than a bare string."""
    return _is_sympy(_parse_boxed(normalize_gold(gold), None))


def math_equal_mv(gold: str, answer: str, *, timeout: int | None = None) -> bool:
    """math-verify equivalence of two LaTeX answers, gold first. A gold math-verify cannot parse is compared
    as a canonical string (``_canon``). ``timeout``: math-verify's own SIGALRM bound (main thread only); None
    disables it."""
    from math_verify import verify
    g = _parse_boxed(gold, timeout)
    p = _parse_boxed(answer, timeout)
    if bool(g) and bool(p) and verify(g, p, timeout_seconds=timeout):
        return True
    return not _is_sympy(g) and _canon(gold) == _canon(answer) != ""


def _parts_match(gold_parts: list[str], ans_parts: list[str], timeout) -> bool:
    """Every gold part matches a distinct answer part (greedy is enough: parts of one answer are distinct)."""
    if len(gold_parts) != len(ans_parts):
        return False
    left = list(ans_parts)
    for g in gold_parts:
        hit = next((i for i, a in enumerate(left) if math_equal_mv(g, a, timeout=timeout)), None)
        if hit is None:
            return False
        left.pop(hit)
    return True


def grade_math(response: str, gold, *, multiple_answer: bool = False, unit: str | None = None,
               timeout: int | None = None) -> Verdict:
    """Grade one response against a gold answer (see the module docstring). Verdict: pass | wrong_answer | no_answer."""
    answer = extract_answer(response)
    if answer is None:
        return Verdict(False, "no_answer", None)
    g = strip_unit(normalize_gold(gold), unit)
    a = strip_unit(answer, unit)
    ok = math_equal_mv(g, a, timeout=timeout)
    if not ok and multiple_answer:
        gold_parts = split_top_level(g)
        if len(gold_parts) > 1:
            boxes = extract_boxed(final_segment(response))
            candidates = [split_top_level(a)]
            if len(boxes) >= len(gold_parts):   # "\boxed{69} and \boxed{84}"
                candidates.append([strip_unit(b, unit) for b in boxes[-len(gold_parts):]])
            ok = any(_parts_match(gold_parts, c, timeout) for c in candidates)
    return Verdict(ok, "pass" if ok else "wrong_answer", answer)
