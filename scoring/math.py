"""Math answer extraction and grading with math-verify (pure: no file IO, no process management).

``extract_answer`` reads the model's final answer the way a person would: the text after the last ``</think>``
when there is one, then its last ``\\boxed{...}`` / ``\\fbox{...}`` (brace matching, escaped braces
skipped), then a "the answer is X" / "Final Answer: X" phrase. There is deliberately no "last number in the
text" fallback: it credits numbers the model never committed to (intermediate results), and every prompt
template we use asks for a box.

Truncation: when the last ``\\boxed{`` of the final segment is never closed (the response was cut at max_tokens
inside its final box), the answer is what follows that ``\\boxed{`` and ``grade_math`` marks it wrong
(``detail="truncated: ..."``). An earlier, complete box is never credited instead: the model withdrew it by
starting another. (Qwen2.5-Math's extractor reads the cut-off box the same way.)

Plain-number golds (``27``, ``025``, ``0.10``, ``4.5e33``, ``1e-5``: the whole gold is one decimal number, maybe
in e-notation) are read as numbers by ``gold_number``, not by the LaTeX parser, which reads ``4.5e33`` as
4.5·e·33 with e Euler's number. Math-Verify's README says the same: parse plain-number golds as expressions, not
LaTeX (its ``ExprExtractionConfig`` reads ``4.5e33`` as 4.5, so we read the number ourselves). An answer that is
itself one e-notation number (``\\boxed{4.5e33}``), or holds one against a plain-number gold (``x = 4.5e33``), is
read the same way; ``\\boxed{e-5}`` stays e − 5.
Such a gold is compared with math-verify's float rounding (6 decimals), raised for golds below 0.1 so that six
digits after the leading one still count (``3.9e-10`` is not ``3.89e-10``): see ``numeric_rounding``.

``grade_math`` compares the extracted answer with the gold using math-verify (Kydlíček et al., HF Math-Verify),
gold first — ``verify(parse(gold), parse(pred))`` is not symmetric. Gold and answer boxes are parsed as a whole
(LaTeX only, first match: ``_parse_boxed``), never as a number found inside a box the parser cannot read. On top
of it:

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

__all__ = ["MATH_MEMORY_MB", "extract_answer", "extract_boxed", "extract_final", "final_segment", "grade_math",
           "normalize_gold", "gold_number", "gold_parses", "numeric_rounding", "parse_gold", "split_top_level",
           "strip_unit", "math_equal_mv"]

# The address space (RLIMIT_AS, MiB) of a math grading worker (scoring.grading's math pools, ``scoring.pool``'s
# ``memory_mb``): a worker grading ordinary answers maps ~70 MB; an answer whose parse or simplification explodes
# gets a MemoryError in its worker instead of the machine's memory, and the trainer lives on.
MATH_MEMORY_MB = 4096

# math-verify warns once per process that its timeout is disabled; we bound time ourselves (see pool.py).
logging.getLogger("math_verify").setLevel(logging.ERROR)

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_ANSWER_PHRASE_RE = re.compile(r"final answer is|the answer is|final answer\s*:|answer\s*:", re.IGNORECASE)
_SENTENCE_END_RE = re.compile(r"\.\s|\.$|\n|$")
# one decimal number, optionally in e-notation: 27, +2, 025, 0.10, .5, 4.5e33, 1e-5, 1.70E+4
_PLAIN_NUMBER_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_E_NUMBER_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)[eE][+-]?\d+")


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


def _box_at(text: str, m: re.Match) -> tuple[str | None, bool]:
    """The box starting at match ``m``: (content, closed). ``\\boxed 5`` gives its token; a ``\\boxed{`` never
    closed gives the rest of the text and closed=False; ``\\boxed`` followed by neither gives (None, True)."""
    i = m.end()
    while i < len(text) and text[i] == " ":
        i += 1
    if i < len(text) and text[i] == "{":
        end = _match_brace(text, i)
        if end is None:
            return text[i + 1:].strip(), False
        return text[i + 1:end].strip(), True
    if i > m.end():  # "\boxed 5": the token up to whitespace or "$"
        tok = re.match(r"[^\s$]+", text[i:])
        if tok:
            return tok.group(0), True
    return None, True


def extract_boxed(text: str) -> list[str]:
    """Contents of every complete ``\\boxed{...}`` / ``\\fbox{...}`` (and ``\\boxed 5``) in order of appearance.

    An unclosed box (a response cut at max_tokens) is skipped here; ``extract_final`` reports it.
    """
    out = []
    for m in _BOX_RE.finditer(text):
        content, closed = _box_at(text, m)
        if content is not None and closed:
            out.append(content)
    return out


def extract_final(response: str) -> tuple[str | None, bool]:
    """(final answer, truncated). The answer is the last box of the final segment, else an "answer is" phrase,
    else None. When the last ``\\boxed{`` of the final segment is never closed, truncated is True and the
    answer is the text after it (maybe ""): earlier boxes do not count."""
    seg = final_segment(response)
    marks = list(_BOX_RE.finditer(seg))
    if marks:
        content, closed = _box_at(seg, marks[-1])
        if not closed:
            return content, True
        boxes = extract_boxed(seg)
        if boxes:
            return boxes[-1], False
    phrases = list(_ANSWER_PHRASE_RE.finditer(seg))
    if phrases:   # the last phrase wins: "Final Answer: The final answer is X." reads X
        rest = seg[phrases[-1].end():]
        ans = rest[:_SENTENCE_END_RE.search(rest).start()].strip().strip("$").strip()
        return (ans or None), False
    return None, False


def extract_answer(response: str) -> str | None:
    """The final answer of a response (``extract_final`` without the truncation flag): last box of the final
    segment — the cut-off content when that box is unclosed — else an "answer is" phrase, else None."""
    return extract_final(response)[0]


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


# a capital E with a subscript, not part of a name and not already in \mathrm{E}, \mathcal{E}, \text{E} ...
_SUBSCRIPTED_E_RE = re.compile(r"(?<![A-Za-z\\])(?<!\\mathrm\{)(?<!\\mathcal\{)(?<!\\mathit\{)(?<!\\mathbf\{)"
                               r"(?<!\\text\{)(?<!\\operatorname\{)E(?=\s*_)")


def _symbols(latex: str) -> str:
    """Symbols math-verify's LaTeX parser rejects, respelled on both sides: astronomy's solar subscript
    (``L_{\\odot}``, Minerva) becomes ``L_{sun}``; a subscripted capital E (``E_{1}``, ``E_{0}^{2}``: energies,
    fields), which the parser cannot read at all, becomes ``\\mathcal{E}_{1}`` (``\\mathrm{E}`` breaks inside a
    ``\\frac``)."""
    latex = re.sub(r"\\odot(?![A-Za-z])", "sun", latex)
    return _SUBSCRIPTED_E_RE.sub(r"\\mathcal{E}", latex)


def _canon(latex: str) -> str:
    """String form for answers math-verify cannot parse: no spaces, \\left/\\right, braces around one-character
    sub/superscripts, or \\text{ and } between list items."""
    s = re.sub(r"\\text\s*\{\s*and\s*\}", ",", latex)
    s = re.sub(r"\\left|\\right|\s+", "", s)
    return re.sub(r"([_^])\{(\w)\}", r"\1\2", s)


def _parse_boxed(latex: str, timeout):
    """math-verify's parse of ``latex`` put in a box, read as a whole or not at all: ``LatexExtractionConfig``
    only, ``extraction_mode="first_match"``. math-verify's default (LaTeX and plain expressions, any match) goes on,
    when the box does not parse, to any other match in the text — a number anywhere in it included — so a box it
    cannot read is read as a fragment of itself: Minerva 261's gold became 2, Minerva 268's 2/3, OlympiadBench
    1965's 0, and ``\\boxed{2}`` was accepted for them. Math-Verify's README: a gold known to be LaTeX is parsed
    with ``LatexExtractionConfig`` alone; our answers are box contents already, so the same holds for them."""
    from math_verify import LatexExtractionConfig, parse
    return parse(f"\\boxed{{{_symbols(latex)}}}", extraction_config=[LatexExtractionConfig()],
                 extraction_mode="first_match", parsing_timeout=timeout)


def _is_sympy(parsed) -> bool:
    from sympy import Basic, MatrixBase
    return bool(parsed) and isinstance(parsed[0], (Basic, MatrixBase))


def gold_number(gold):
    """A plain-number gold as a sympy number, else None. ``"25"``/``"025"``/``"+2"`` give Integer(25)/…/(2);
    ``"0.10"``, ``"4.5e33"``, ``"1e-5"`` give Float (15 significant digits; the e-notation read as the number it
    denotes, 4.5·10^33, not 4.5·e·33)."""
    s = normalize_gold(gold).replace(" ", "")
    if not _PLAIN_NUMBER_RE.fullmatch(s):
        return None
    import sympy
    body = s.lstrip("+")
    if re.fullmatch(r"-?\d+", body):
        return sympy.Integer(int(body))
    return sympy.Float(body, 15)


def _e_number(answer: str):
    """An answer that is one e-notation number (``4.5e33``, ``1E-5``) as a sympy Float, else None."""
    s = answer.replace(" ", "")
    return gold_number(s) if _E_NUMBER_RE.fullmatch(s) else None


# an e-notation number standing alone inside a longer answer ("x = 4.5e33", "4.5e33 erg"): not part of a name,
# a sub/superscript or a command, and not followed by a letter, "^" or "{"
_E_TOKEN_RE = re.compile(r"(?<![A-Za-z\\_^{.\d])(\d+(?:\.\d*)?|\.\d+)[eE]([+-]?\d+)(?![\w^{.])")


def _respell_e_notation(answer: str) -> str:
    """``x = 4.5e33`` -> ``x = 4.5\\times10^{33}``: used only against a plain-number gold, where a reader takes
    e-notation as a power of ten."""
    return _E_TOKEN_RE.sub(lambda m: f"{m.group(1)}\\times10^{{{int(m.group(2))}}}", answer)


def numeric_rounding(value) -> int:
    """math-verify's ``float_rounding`` for a numeric gold: its default 6 decimals, raised for |gold| < 0.1 to
    ``5 - floor(log10|gold|)`` so that six digits after the leading one count (3.89e-10: 15 decimals)."""
    import math
    v = abs(float(value))
    if v == 0 or v >= 0.1:
        return 6
    return max(6, 5 - math.floor(math.log10(v)))


def parse_gold(gold, *, timeout: int | None = None) -> list:
    """The gold as math-verify's ``parse`` would return it (``[sympy object, string]``, or ``[]``/strings when
    unparsed), except that a plain-number gold is ``[gold_number(gold), gold]``."""
    g = normalize_gold(gold)
    num = gold_number(g)
    if num is not None:
        return [num, g]
    return _parse_boxed(g, timeout)


def gold_parses(gold) -> bool:
    """Whether the (normalised) gold becomes a sympy object (a number or math-verify's parse) rather than a bare
    string."""
    return _is_sympy(parse_gold(gold))


def math_equal_mv(gold: str, answer: str, *, timeout: int | None = None) -> bool:
    """math-verify equivalence of two LaTeX answers, gold first. A plain-number gold is read by
    ``gold_number`` and compared at ``numeric_rounding`` decimals; a gold math-verify cannot parse is compared
    as a canonical string (``_canon``). ``timeout``: math-verify's own SIGALRM bound (main thread only); None
    disables it."""
    from math_verify import verify
    num = gold_number(gold)
    g = [num, gold] if num is not None else _parse_boxed(gold, timeout)
    e = _e_number(answer)
    if e is not None:
        p = [e, answer]
    else:
        p = _parse_boxed(_respell_e_notation(answer) if num is not None else answer, timeout)
    rounding = numeric_rounding(num) if num is not None else 6
    if bool(g) and bool(p) and verify(g, p, float_rounding=rounding, timeout_seconds=timeout):
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
    """Grade one response against a gold answer (see the module docstring). Verdict: pass | wrong_answer |
    no_answer; a response whose final box was cut off is wrong_answer with ``detail`` starting "truncated"."""
    answer, truncated = extract_final(response)
    if truncated:
        return Verdict(False, "wrong_answer", answer, "truncated: the last \\boxed{ is never closed")
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
            if len(boxes) >= len(gold_parts):   # "\\boxed{69} and \\boxed{84}"
                candidates.append([strip_unit(b, unit) for b in boxes[-len(gold_parts):]])
            ok = any(_parts_match(gold_parts, c, timeout) for c in candidates)
    return Verdict(ok, "pass" if ok else "wrong_answer", answer)
