"""Tokens at the truncation points (docs/method.md "Truncation tokens"; paper §6.2).

Entropy-based truncation cuts at sentence-initial discourse words ("So", "Since", "Let", "Therefore"); the
length-ratio rule cuts at heterogeneous tokens, numbers, operators and LaTeX commands. ``categorize_token``
puts a token text into one of :data:`CATEGORIES`, in this order of precedence:

- ``whitespace``: nothing but spaces/newlines/tabs (also the byte-level markers Ġ Ċ ĉ and SentencePiece's ▁);
- ``latex``: starts with a backslash (``\\frac``, ``\\cdot``, ``\\boxed``, ``\\(``) or is only ``$`` signs;
- ``discourse``: one of :data:`DISCOURSE_WORDS`, case-insensitive, after stripping leading space markers and
  trailing punctuation (``" So,"`` counts);
- ``digit``: digits, optionally with inner ``.``/``,`` (``3``, ``12``, ``3.5``);
- ``operator``: only characters of :data:`OPERATOR_CHARS` (``+ - * / = ^ < > ≤ ≥ ≠ × ÷ ± · % | ! ~ ≈``…);
- ``other``: everything else (letters, other words, brackets, punctuation).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Iterable, Mapping

import numpy as np
import pandas as pd

__all__ = ["CATEGORIES", "DISCOURSE_WORDS", "OPERATOR_CHARS", "categorize_token", "token_label",
           "truncation_histogram", "truncation_histogram_from_counts", "category_shares",
           "category_shares_from_counts"]

CATEGORIES = ("discourse", "digit", "operator", "latex", "whitespace", "other")
DISCOURSE_WORDS = frozenset({
    "so", "let", "therefore", "thus", "wait", "but", "now", "first", "then", "hence", "we", "the", "since",
    "because", "next", "alternatively", "hmm",
    # beyond the paper's examples: other sentence-initial connectives common in reasoning traces
    "however", "also", "finally", "okay", "note", "similarly", "instead", "actually", "lastly", "recall",
    "suppose", "consider",
})
OPERATOR_CHARS = frozenset("+-*/=^<>≤≥≠×÷±∓·%|!~≈∑∏√")
# byte-level BPE (GPT-2/Qwen) and SentencePiece markers for whitespace
_MARKERS = str.maketrans({"Ġ": " ", "Ċ": "\n", "ĉ": "\t", "▁": " "})
_DIGIT_RE = re.compile(r"^[0-9]+(?:[.,][0-9]+)*$")
_TRAILING_PUNCT = ",.:;!?"


def _normalise(text: str) -> str:
    return text.translate(_MARKERS)


def categorize_token(text: str | None) -> str:
    """Category of a token text (see the module docstring); None or '' → ``other``."""
    if not text:
        return "other"
    norm = _normalise(text)
    core = norm.strip()
    if not core:
        return "whitespace"
    if core.startswith("\\") or set(core) == {"$"}:
        return "latex"
    if core.rstrip(_TRAILING_PUNCT).lower() in DISCOURSE_WORDS:
        return "discourse"
    if _DIGIT_RE.match(core):
        return "digit"
    if all(ch in OPERATOR_CHARS for ch in core):
        return "operator"
    return "other"


def token_label(text: str | None) -> str:
    """A printable label: markers decoded, spaces shown as ␣, newlines and tabs escaped (\\n, \\t)."""
    if text is None:
        return "<none>"
    return _normalise(text).replace("\n", "\\n").replace("\t", "\\t").replace(" ", "␣")


def truncation_histogram_from_counts(counts: Mapping[tuple[str, str], int], *, top: int = 30) -> pd.DataFrame:
    """Top tokens per rule from ``{(rule, token_text): count}``.

    Columns: rule, rank (1 = most frequent), token (exact text), label (printable), count, share (count / all
    cuts of that rule, not only the top ones), category, rule_total. Ties are broken by token text so the order
    is deterministic.
    """
    if top < 1:
        raise ValueError(f"top must be >= 1, got {top}")
    rows = []
    totals: Counter = Counter()
    for (rule, _), c in counts.items():
        totals[rule] += c
    for rule in sorted(totals):
        items = sorted(((tok, c) for (r, tok), c in counts.items() if r == rule), key=lambda x: (-x[1], x[0]))
        for rank, (tok, c) in enumerate(items[:top], start=1):
            rows.append({"rule": rule, "rank": rank, "token": tok, "label": token_label(tok), "count": int(c),
                         "share": c / totals[rule], "category": categorize_token(tok),
                         "rule_total": int(totals[rule])})
    cols = ["rule", "rank", "token", "label", "count", "share", "category", "rule_total"]
    return pd.DataFrame(rows, columns=cols)


def category_shares_from_counts(counts: Mapping[tuple[str, str], int]) -> pd.DataFrame:
    """Share of each category among all cuts of each rule; all categories listed (count 0 included).

    Columns: rule, category, count, share, rule_total.
    """
    agg: Counter = Counter()
    totals: Counter = Counter()
    for (rule, tok), c in counts.items():
        agg[(rule, categorize_token(tok))] += c
        totals[rule] += c
    rows = [{"rule": rule, "category": cat, "count": int(agg[(rule, cat)]),
             "share": agg[(rule, cat)] / totals[rule], "rule_total": int(totals[rule])}
            for rule in sorted(totals) for cat in CATEGORIES]
    return pd.DataFrame(rows, columns=["rule", "category", "count", "share", "rule_total"])


def _count(token_texts: Iterable, rules: Iterable) -> Counter:
    token_texts, rules = list(token_texts), list(rules)
    if len(token_texts) != len(rules):
        raise ValueError(f"{len(token_texts)} token texts but {len(rules)} rules")
    return Counter((str(r), "" if t is None else str(t)) for t, r in zip(token_texts, rules)
                   if r is not None and not (isinstance(r, float) and np.isnan(r)))


def truncation_histogram(token_texts, rules, *, top: int = 30) -> pd.DataFrame:
    """Top-``top`` cut tokens per truncation rule (one entry per seeded response; rule None is skipped)."""
    return truncation_histogram_from_counts(_count(token_texts, rules), top=top)


def category_shares(token_texts, rules) -> pd.DataFrame:
    """Category shares per rule for the same inputs as :func:`truncation_histogram`."""
    return category_shares_from_counts(_count(token_texts, rules))
